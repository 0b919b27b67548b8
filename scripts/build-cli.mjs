// Builds the `leasehold` command line into dist/bin: cli.cjs, src/bin/leasehold.ts and everything it uses in
// one minified CommonJS file (esbuild), and leasehold.cjs, the launcher that runs it through V8's code cache
// (src/bin/launcher.cjs says how). One file and a code cache make a cold start a fraction of loading the same
// code from hundreds of modules. The commands load what only they need (the SQL drivers, the demo) when they
// run. better-sqlite3 is native and stays outside: the SQLite commands load it from where it is installed.
import { build } from "esbuild"
import { chmodSync, copyFileSync, mkdirSync, rmSync } from "node:fs"

rmSync("dist/bin", { recursive: true, force: true })
mkdirSync("dist/bin", { recursive: true })
await build({
  entryPoints: ["src/bin/leasehold.ts"],
  outfile: "dist/bin/cli.cjs",
  bundle: true,
  minify: true,
  platform: "node",
  target: "node20",
  format: "cjs",
  external: ["better-sqlite3", "pg-native"],
  logLevel: "warning"
})
copyFileSync("src/bin/launcher.cjs", "dist/bin/leasehold.cjs")
chmodSync("dist/bin/leasehold.cjs", 0o755)
