#!/usr/bin/env node
/* eslint-disable @typescript-eslint/no-require-imports */
// The installed `leasehold` command (dist/bin/leasehold.cjs). It runs the bundled command line (cli.cjs, made
// by scripts/build-cli.mjs) through V8's code cache: the first run saves the compiled code in a directory of
// this user's under the system's temporary directory, and later runs skip most of the parse and compile that
// dominates a cold start. The cache is only an accelerator: V8 checks it against the source and rejects a
// stale one, and when it cannot be read or written the command runs the same way, just slower.
"use strict"
const crypto = require("node:crypto")
const fs = require("node:fs")
const os = require("node:os")
const path = require("node:path")
const vm = require("node:vm")
const Module = require("node:module")

const file = path.join(__dirname, "cli.cjs")
const source = fs.readFileSync(file, "utf8")

/** This user's cache directory, or undefined when it is not safely ours (another user could have made it). */
const cacheDirectory = () => {
  try {
    const uid = typeof process.getuid === "function" ? process.getuid() : undefined
    const dir = path.join(os.tmpdir(), `leasehold-cli-${uid ?? "user"}`)
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
    const stat = fs.statSync(dir)
    if (uid !== undefined && (stat.uid !== uid || (stat.mode & 0o022) !== 0)) return undefined
    return dir
  } catch {
    return undefined
  }
}

const dir = cacheDirectory()
const stat = fs.statSync(file)
// One cache per installed copy (by path), replaced when that copy or Node changes.
const copy = crypto.createHash("sha256").update(file).digest("hex").slice(0, 16)
const cacheFile = dir === undefined
  ? undefined
  : path.join(dir, `${copy}-${process.version}-${stat.size}-${Math.round(stat.mtimeMs)}.cache`)
let cachedData
try {
  if (cacheFile !== undefined) cachedData = fs.readFileSync(cacheFile)
} catch {
  cachedData = undefined
}

const script = new vm.Script(Module.wrap(source), { filename: file, cachedData })
if (cacheFile !== undefined && (cachedData === undefined || script.cachedDataRejected === true)) {
  // Saved at the end, when the functions this run needed have been compiled too.
  process.once("beforeExit", () => {
    try {
      const temporary = `${cacheFile}.${process.pid}`
      fs.writeFileSync(temporary, script.createCachedData(), { mode: 0o600 })
      fs.renameSync(temporary, cacheFile)
      // This copy's caches of earlier builds or Node versions are never read again.
      for (const name of fs.readdirSync(dir)) {
        if (name.startsWith(`${copy}-`) && path.join(dir, name) !== cacheFile) {
          fs.rmSync(path.join(dir, name), { force: true })
        }
      }
    } catch {
      // No cache this time.
    }
  })
}
const module_ = { exports: {} }
script.runInThisContext()(module_.exports, Module.createRequire(file), module_, file, __dirname)
