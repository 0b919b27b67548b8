// ESLint flat config: typescript-eslint for correctness, @effect/eslint-plugin's dprint for formatting
// (2 spaces, 120 columns, no semicolons, double quotes), as in the Effect monorepo.
import effect from "@effect/eslint-plugin"
import tseslint from "typescript-eslint"

export default tseslint.config(
  { ignores: ["node_modules/**", "dist/**", "coverage/**", "bench/.build/**", "soak/.build/**"] },
  ...tseslint.configs.recommended,
  ...effect.configs.dprint,
  {
    rules: {
      "@effect/dprint": ["error", {
        config: {
          indentWidth: 2,
          lineWidth: 120,
          semiColons: "asi",
          quoteStyle: "alwaysDouble",
          trailingCommas: "never",
          operatorPosition: "maintain",
          "arrowFunction.useParentheses": "force"
        }
      }],
      "@typescript-eslint/no-explicit-any": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/no-namespace": "off",
      "@typescript-eslint/no-empty-object-type": "off",
      "no-restricted-syntax": ["error", {
        selector: "ThrowStatement",
        message: "Fail with a tagged error (or die) instead of throwing."
      }]
    }
  }
)
