// Builds the `leasehold` command line into dist/bin: cli.cjs, src/bin/leasehold.ts and everything it uses in
// one minified CommonJS file (esbuild), and leasehold.cjs, the launcher that runs it through V8's code cache
// (src/bin/launcher.cjs says how). One file and a code cache make a cold start a fraction of loading the same
// code from hundreds of modules. The commands load what only they need (the SQL drivers, the demo) when they
// run. better-sqlite3 is native and stays outside: the SQLite commands load it from where it is installed.
// `node scripts/build-cli.mjs DIR` builds into DIR instead (the tests run the command line as it ships).
import { build } from "esbuild"
import { chmodSync, copyFileSync, mkdirSync, readFileSync, rmSync } from "node:fs"

const out = process.argv[2] ?? "dist/bin"
rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })
await build({
  entryPoints: ["src/bin/leasehold.ts"],
  outfile: `${out}/cli.cjs`,
  bundle: true,
  minify: true,
  platform: "node",
  target: "node20",
  format: "cjs",
  external: ["better-sqlite3", "pg-native"],
  logLevel: "warning"
})
// The launcher runs the bundle as a vm.Script; once it runs from the code cache, V8 refuses a dynamic import()
// (only modules left outside the bundle keep one: Node built-ins, better-sqlite3). Import those statically.
const dynamic = readFileSync(`${out}/cli.cjs`, "utf8").match(/\bimport\("[^"]*"\)/g)
if (dynamic !== null) {
  console.error(`build-cli: the bundle keeps ${dynamic.join(", ")}: the launcher cannot run it; import it statically.`)
  process.exit(1)
}
copyFileSync("src/bin/launcher.cjs", `${out}/leasehold.cjs`)
chmodSync(`${out}/leasehold.cjs`, 0o755)
