#!/usr/bin/env node
/* eslint-disable @typescript-eslint/no-require-imports */
// The installed `leasehold` command (dist/bin/leasehold.cjs). It runs the bundled command line (cli.cjs, made
// by scripts/build-cli.mjs) through V8's code cache: the first run saves the compiled code, and later runs skip
// most of the parse and compile that dominates a cold start.
//
// A code cache is code, and V8 checks one against the source's length only: whoever can write the cache can make
// this command run anything, as this user. So the cache is this user's alone. It lives in `leasehold` (kept 0700)
// under the user's cache directory ($XDG_CACHE_HOME when absolute, else ~/.cache; made 0700 when missing), and each
// is opened without following a link and checked on the opened descriptor: a symlink, a directory that is not this
// user's, or one others may write, is refused. A cache file is named after a hash of the bundle's content (and
// Node's version), so it is only ever read for the source it was made from, and it too is opened without following
// a link and read through the descriptor that was checked (a plain file, this user's, not writable by others).
// Node cannot open a file relative to a directory descriptor, so the file's own check is what vouches for what is
// read; the directory's is what keeps others from putting anything there. A new cache is written to a file created
// exclusively (0600) in that directory, then renamed into place; this copy's older caches are unlinked (never
// followed). Without such a place (no home, a symlinked ~/.cache, Windows) the command runs the same way,
// uncached, just slower. LEASEHOLD_CODE_CACHE_DEBUG=1 prints on stderr, one line each, where the cache is and
// whether it was used or written, or why not.
"use strict"
const crypto = require("node:crypto")
const fs = require("node:fs")
const os = require("node:os")
const path = require("node:path")
const vm = require("node:vm")
const Module = require("node:module")

const { O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_RDONLY, O_WRONLY } = fs.constants
const uid = typeof process.getuid === "function" ? process.getuid() : undefined
const debug = process.env.LEASEHOLD_CODE_CACHE_DEBUG === "1"
const report = (line) => {
  if (debug) process.stderr.write(`leasehold: code cache ${line}\n`)
}

const file = path.join(__dirname, "cli.cjs")
const bytes = fs.readFileSync(file)
const source = bytes.toString("utf8")

/** Why a failed open or check refuses `name`, for the debug line. */
const reason = (error, name) => {
  if (error.code === "ELOOP" || error.code === "ENOTDIR") {
    try {
      if (fs.lstatSync(name).isSymbolicLink()) return `${name} is a symbolic link`
    } catch {
      // Gone meanwhile: the error says enough.
    }
    if (error.code === "ENOTDIR") return `${name} is not a directory`
  }
  return String(error.message)
}

/** Why an opened file or directory is not this user's alone, or undefined when it is. */
const refusal = (stat, name) => {
  if (stat.uid !== uid) return `${name} is not this user's`
  if ((stat.mode & 0o022) !== 0) return `${name} is writable by others`
  return undefined
}

/** Makes `dir` (0700) unless it exists, then checks the directory itself, not a link: why not, or undefined. */
const directoryRefusal = (dir, tighten) => {
  try {
    try {
      fs.mkdirSync(dir, { mode: 0o700 })
    } catch (error) {
      if (error.code !== "EEXIST") return reason(error, dir)
    }
    const fd = fs.openSync(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
    try {
      const why = refusal(fs.fstatSync(fd), dir)
      if (why === undefined && tighten) fs.fchmodSync(fd, 0o700)
      return why
    } finally {
      fs.closeSync(fd)
    }
  } catch (error) {
    return reason(error, dir)
  }
}

/** This user's cache directory for the command, or why there is none. */
const cacheDirectory = () => {
  if (uid === undefined || O_NOFOLLOW === undefined || O_DIRECTORY === undefined) {
    return { why: "this platform has no owner to check" }
  }
  const xdg = process.env.XDG_CACHE_HOME
  let base
  try {
    base = xdg !== undefined && path.isAbsolute(xdg) ? xdg : path.join(os.homedir(), ".cache")
  } catch (error) {
    return { why: String(error.message) }
  }
  if (!path.isAbsolute(base)) return { why: `${base} is not an absolute path` }
  const dir = path.join(base, "leasehold")
  const why = directoryRefusal(base, false) ?? directoryRefusal(dir, true)
  return why === undefined ? { dir } : { why }
}

/** The cache's bytes, nothing when there is none yet, or why the file there is refused. */
const readCache = (cacheFile) => {
  let fd
  try {
    fd = fs.openSync(cacheFile, O_RDONLY | O_NOFOLLOW)
  } catch (error) {
    return error.code === "ENOENT" ? {} : { why: reason(error, cacheFile) }
  }
  try {
    const stat = fs.fstatSync(fd)
    const why = stat.isFile() ? refusal(stat, cacheFile) : `${cacheFile} is not a plain file`
    return why === undefined ? { data: fs.readFileSync(fd) } : { why }
  } catch (error) {
    return { why: reason(error, cacheFile) }
  } finally {
    fs.closeSync(fd)
  }
}

const { dir, why } = cacheDirectory()
// One cache per installed copy (by path, so that copies of different versions keep theirs), named after what it
// was compiled from.
const copy = crypto.createHash("sha256").update(file).digest("hex").slice(0, 16)
const content = crypto.createHash("sha256").update(`${process.version}\0${process.arch}\0`).update(bytes).digest("hex")
const cacheFile = dir === undefined ? undefined : path.join(dir, `${copy}-${content}.cache`)
let cachedData
if (cacheFile === undefined) {
  report(`off: ${why}`)
} else {
  const read = readCache(cacheFile)
  cachedData = read.data
  if (read.why !== undefined) report(`not read: ${read.why}`)
}

const script = new vm.Script(Module.wrap(source), { filename: file, cachedData })
if (cacheFile !== undefined) {
  report(`${cachedData === undefined ? "none" : script.cachedDataRejected ? "rejected" : "used"} ${cacheFile}`)
}
if (cacheFile !== undefined && (cachedData === undefined || script.cachedDataRejected === true)) {
  // Saved at the end, when the functions this run needed have been compiled too.
  process.once("beforeExit", () => {
    const temporary = path.join(dir, `${copy}-${crypto.randomBytes(8).toString("hex")}.tmp`)
    let created = false
    try {
      const fd = fs.openSync(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600)
      created = true
      try {
        fs.writeFileSync(fd, script.createCachedData())
      } finally {
        fs.closeSync(fd)
      }
      fs.renameSync(temporary, cacheFile)
      report(`written ${cacheFile}`)
    } catch (error) {
      try {
        if (created) fs.unlinkSync(temporary)
      } catch {
        // Nothing to remove.
      }
      report(`not written: ${error.message}`)
      return
    }
    // This copy's caches of earlier builds or Node versions are never read again, nor are the files a killed run
    // was writing. Unlinking removes a name, never what a link points to.
    try {
      for (const name of fs.readdirSync(dir)) {
        if (!name.startsWith(`${copy}-`) || name === path.basename(cacheFile)) continue
        const entry = path.join(dir, name)
        try {
          if (name.endsWith(".cache") || (name.endsWith(".tmp") && fs.lstatSync(entry).mtimeMs < Date.now() - 60_000)) {
            fs.unlinkSync(entry)
          }
        } catch {
          // Another run got there first.
        }
      }
    } catch {
      // The old caches stay until the next write.
    }
  })
}
const module_ = { exports: {} }
script.runInThisContext()(module_.exports, Module.createRequire(file), module_, file, __dirname)
