// Bundles the `leasehold` command line (src/bin/leasehold.ts) into dist/bin/leasehold.mjs with esbuild:
// one minified module starts in about a third of the time Node takes to load the same code from hundreds of
// files. What only some commands need (the SQL drivers, the demo) sits in chunks loaded on first use, so
// `leasehold --help` loads none of it. better-sqlite3 is native and stays outside: the SQLite commands load
// it from where the user installed it.
import { build } from "esbuild"
import { rmSync } from "node:fs"

rmSync("dist/bin", { recursive: true, force: true })
const result = await build({
  entryPoints: { leasehold: "src/bin/leasehold.ts" },
  outdir: "dist/bin",
  chunkNames: "chunks/[name]-[hash]",
  bundle: true,
  splitting: true,
  metafile: process.env.METAFILE === "1",
  minify: true,
  platform: "node",
  target: "node20",
  format: "esm",
  external: ["better-sqlite3", "pg-native"],
  outExtension: { ".js": ".mjs" },
  // Bundled CommonJS dependencies call `require`.
  banner: {
    js: "#!/usr/bin/env node\nimport { createRequire as __createRequire } from 'node:module'; " +
      "const require = __createRequire(import.meta.url);"
  },
  logLevel: "warning"
})
if (result.metafile !== undefined) {
  const { writeFileSync } = await import("node:fs")
  writeFileSync("node_modules/.cache/cli-meta.json", JSON.stringify(result.metafile))
}
