/**
 * The command line's launcher (src/bin/launcher.cjs) keeps V8's code cache where only this user can write and
 * reads only a cache compiled from the bundle it runs (issue 32: another local user could plant a cache, which V8
 * checks against the source's length only, and so run their code as this user). Real processes over real files:
 * each test copies the launcher next to a one-line fake bundle (`cli.cjs`) in a sandbox of its own, with its own
 * $XDG_CACHE_HOME, $HOME and $TMPDIR, and reads the launcher's LEASEHOLD_CODE_CACHE_DEBUG line.
 *
 * The tests about the attack also set up what the launcher before issue 32 would have read (its cache under
 * $TMPDIR/leasehold-cli-<uid>, named after the bundle's path, size and mtime), so that running them against that
 * launcher shows the attack working: `git show <commit>:src/bin/launcher.cjs > /tmp/old.cjs` and then
 * `LEASEHOLD_TEST_LAUNCHER=/tmp/old.cjs npx vitest run test/launcher.test.ts`.
 */
import { describe, expect, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync
} from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterEach } from "vitest"

const launcherUnderTest = process.env.LEASEHOLD_TEST_LAUNCHER ?? "src/bin/launcher.cjs"
const uid = process.getuid?.() ?? -1
const root = uid === 0
/** Someone else: `nobody`. */
const otherUid = 65534

// The victim's bundle and the attacker's: different code, the same length (all V8 compares).
const victim = `process.stdout.write("victim: ok\\n")\n`
const attacker = `process.stdout.write("ATTACK: ok\\n")\n`

const sandboxes: Array<string> = []
afterEach(() => {
  for (const dir of sandboxes.splice(0)) rmSync(dir, { recursive: true, force: true })
})

/** A sandbox: where the caches go ($XDG_CACHE_HOME = cache, $HOME = home, $TMPDIR = tmp). */
const sandbox = () => {
  const dir = realpathSync(mkdtempSync(join(tmpdir(), "leasehold-launcher-")))
  sandboxes.push(dir)
  mkdirSync(join(dir, "home"))
  mkdirSync(join(dir, "tmp"))
  const env: Record<string, string | undefined> = {
    ...process.env,
    XDG_CACHE_HOME: join(dir, "cache"),
    HOME: join(dir, "home"),
    TMPDIR: join(dir, "tmp"),
    LEASEHOLD_CODE_CACHE_DEBUG: "1"
  }
  return { dir, env, leaf: join(dir, "cache", "leasehold"), oldDir: join(dir, "tmp", `leasehold-cli-${uid}`) }
}

/** The launcher installed in `dir` over a bundle; returns the launcher's path. */
const install = (dir: string, bundle: string) => {
  mkdirSync(dir, { recursive: true })
  copyFileSync(launcherUnderTest, join(dir, "leasehold.cjs"))
  writeFileSync(join(dir, "cli.cjs"), bundle)
  return join(dir, "leasehold.cjs")
}

const run = (launcher: string, env: Record<string, string | undefined>) => {
  const result = spawnSync(process.execPath, [launcher], { env, encoding: "utf8", timeout: 30_000 })
  return { code: result.status, stdout: result.stdout, stderr: result.stderr }
}

/** The code cache V8 makes for `bundle` as the launcher runs it (a planted cache). */
const compiled = (sandboxDir: string, bundle: string, env: Record<string, string | undefined>) => {
  const dir = join(sandboxDir, "compile")
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, "bundle.cjs"), bundle)
  writeFileSync(
    join(dir, "compile.cjs"),
    `const fs = require("node:fs"), vm = require("node:vm"), Module = require("node:module")
const script = new vm.Script(Module.wrap(fs.readFileSync(process.argv[2], "utf8")), { filename: process.argv[2] })
script.runInThisContext()
fs.writeFileSync(process.argv[3], script.createCachedData())
`
  )
  const out = join(dir, `${createHash("sha256").update(bundle).digest("hex").slice(0, 8)}.cache`)
  const result = spawnSync(process.execPath, [join(dir, "compile.cjs"), join(dir, "bundle.cjs"), out], { env })
  expect(result.status, String(result.stderr)).toBe(0)
  return out
}

/** Where the launcher before issue 32 looked for the cache of the bundle next to `launcher`. */
const oldSchemeCache = (oldDir: string, launcher: string) => {
  const file = join(launcher, "..", "cli.cjs")
  const stat = statSync(file)
  const copy = createHash("sha256").update(file).digest("hex").slice(0, 16)
  return join(oldDir, `${copy}-${process.version}-${stat.size}-${Math.round(stat.mtimeMs)}.cache`)
}

/** The cache files in `dir` (none when it does not exist). */
const caches = (dir: string) =>
  existsSync(dir) ? readdirSync(dir).filter((name) => name.endsWith(".cache")).map((name) => join(dir, name)) : []

const mode = (path: string) => statSync(path).mode & 0o777

describe("launcher: the code cache is this user's alone", () => {
  it("writes the cache under $XDG_CACHE_HOME/leasehold (0700, file 0600) and uses it on the next run", () => {
    const { dir, env, leaf } = sandbox()
    const launcher = install(join(dir, "app"), victim)
    const first = run(launcher, env)
    expect(first.stdout).toBe("victim: ok\n")
    expect(first.stderr).toMatch(/code cache written /)
    expect(mode(join(dir, "cache"))).toBe(0o700)
    expect(mode(leaf)).toBe(0o700)
    const [cache, ...more] = caches(leaf)
    expect(more).toEqual([])
    expect(mode(cache!)).toBe(0o600)
    expect(statSync(cache!).uid).toBe(uid)
    const before = statSync(cache!)

    const second = run(launcher, env)
    expect(second.stdout).toBe("victim: ok\n")
    expect(second.stderr).toContain(`code cache used ${cache}`)
    expect(second.stderr).not.toMatch(/written/)
    const after = statSync(cache!)
    expect([after.ino, after.mtimeMs]).toEqual([before.ino, before.mtimeMs])

    // A new build of this copy gets a new cache; the old one is unlinked, and a link among them is unlinked
    // without touching what it points to.
    const target = join(dir, "precious")
    writeFileSync(target, "keep me")
    const stale = join(leaf, `${cache!.slice(leaf.length + 1).split("-")[0]}-${"0".repeat(64)}.cache`)
    symlinkSync(target, stale)
    writeFileSync(join(dir, "app", "cli.cjs"), `process.stdout.write("victim: v2\\n")\n`)
    const third = run(launcher, env)
    expect(third.stdout).toBe("victim: v2\n")
    expect(third.stderr).toMatch(/code cache written /)
    expect(caches(leaf)).toHaveLength(1)
    expect(caches(leaf)[0]).not.toBe(cache)
    expect(() => lstatSync(stale)).toThrow(/ENOENT/)
    expect(readFileSync(target, "utf8")).toBe("keep me")
  })

  it("without $XDG_CACHE_HOME, keeps the cache under $HOME/.cache/leasehold", () => {
    const { dir, env } = sandbox()
    const launcher = install(join(dir, "app"), victim)
    const noXdg = { ...env, XDG_CACHE_HOME: undefined }
    expect(run(launcher, noXdg).stdout).toBe("victim: ok\n")
    const leaf = join(dir, "home", ".cache", "leasehold")
    expect(mode(leaf)).toBe(0o700)
    expect(caches(leaf)).toHaveLength(1)
    const second = run(launcher, noXdg)
    expect(second.stdout).toBe("victim: ok\n")
    expect(second.stderr).toMatch(/code cache used /)
  })

  it("refuses a cache directory that is a symbolic link: runs uncached and writes nothing through the link", () => {
    const { dir, env, leaf, oldDir } = sandbox()
    const launcher = install(join(dir, "app"), victim)
    // Someone else's link to a directory that passes for ours; they can point it elsewhere between a check of the
    // path and its use. Also where the launcher before issue 32 kept its cache.
    const elsewhere = join(dir, "elsewhere")
    mkdirSync(elsewhere, { mode: 0o700 })
    mkdirSync(join(dir, "cache"), { mode: 0o700 })
    symlinkSync(elsewhere, leaf)
    symlinkSync(elsewhere, oldDir)
    const runs = [run(launcher, env), run(launcher, env)]
    expect(readdirSync(elsewhere)).toEqual([])
    for (const result of runs) {
      expect(result.stdout).toBe("victim: ok\n")
      expect(result.stderr).toContain(`code cache off: ${leaf} is a symbolic link`)
    }

    // The cache directory's parent ($XDG_CACHE_HOME itself) a link: refused too.
    const other = sandbox()
    const realCache = join(other.dir, "real-cache")
    mkdirSync(realCache, { mode: 0o700 })
    symlinkSync(realCache, join(other.dir, "cache"))
    const result = run(install(join(other.dir, "app"), victim), other.env)
    expect(result.stdout).toBe("victim: ok\n")
    expect(result.stderr).toContain(`code cache off: ${join(other.dir, "cache")} is a symbolic link`)
    expect(readdirSync(realCache)).toEqual([])
  })

  it("refuses a cache directory others may write, or that is not this user's", () => {
    const cases: Array<[string, (s: ReturnType<typeof sandbox>) => void, string]> = [
      ["world-writable", (s) => {
        mkdirSync(s.leaf, { recursive: true, mode: 0o700 })
        chmodSync(s.leaf, 0o777)
      }, "leaf"],
      ["group-writable", (s) => {
        mkdirSync(s.leaf, { recursive: true, mode: 0o700 })
        chmodSync(s.leaf, 0o770)
      }, "leaf"],
      ["parent world-writable", (s) => {
        mkdirSync(s.leaf, { recursive: true, mode: 0o700 })
        chmodSync(join(s.dir, "cache"), 0o777)
      }, "parent"]
    ]
    for (const [name, setUp, which] of cases) {
      const s = sandbox()
      setUp(s)
      const launcher = install(join(s.dir, "app"), victim)
      for (let i = 0; i < 2; i++) {
        const result = run(launcher, s.env)
        expect(result.stdout, name).toBe("victim: ok\n")
        const refused = which === "leaf" ? s.leaf : join(s.dir, "cache")
        expect(result.stderr, name).toContain(`code cache off: ${refused} is writable by others`)
      }
      expect(caches(s.leaf), name).toEqual([])
      // Not "fixed" either: what others may write is not ours to trust.
      expect(mode(which === "leaf" ? s.leaf : join(s.dir, "cache")) & 0o022, name).not.toBe(0)
    }
  })

  it.skipIf(!root)("refuses a cache directory owned by another user (needs root, to chown)", () => {
    const s = sandbox()
    mkdirSync(s.leaf, { recursive: true, mode: 0o700 })
    chownSync(s.leaf, otherUid, otherUid)
    const result = run(install(join(s.dir, "app"), victim), s.env)
    expect(result.stdout).toBe("victim: ok\n")
    expect(result.stderr).toContain(`code cache off: ${s.leaf} is not this user's`)
    expect(caches(s.leaf)).toEqual([])
  })

  it("runs the bundle it was given, never a cache compiled from other code of the same length", () => {
    // A cache planted under the predictable name the launcher before issue 32 read.
    const s = sandbox()
    const launcher = install(join(s.dir, "app"), victim)
    const planted = compiled(s.dir, attacker, s.env)
    mkdirSync(s.oldDir, { mode: 0o700 })
    copyFileSync(planted, oldSchemeCache(s.oldDir, launcher))
    expect(run(launcher, s.env).stdout).toBe("victim: ok\n")
    expect(run(launcher, s.env).stdout).toBe("victim: ok\n")

    // The same installed copy, its bundle replaced by other code of the same length with the same mtime (npm
    // gives every file in a package the same one): the cache of the other code is there, under the name the
    // new code would have had before issue 32; now it is keyed on the content and is never read for the new code.
    const t = sandbox()
    const app = join(t.dir, "app")
    const copy = install(app, attacker)
    const npmTime = new Date("1985-10-26T08:15:00Z")
    utimesSync(join(app, "cli.cjs"), npmTime, npmTime)
    expect(run(copy, t.env).stdout).toBe("ATTACK: ok\n") // Writes the cache of the attacker's code.
    writeFileSync(join(app, "cli.cjs"), victim)
    utimesSync(join(app, "cli.cjs"), npmTime, npmTime)
    const result = run(copy, t.env)
    expect(result.stdout).toBe("victim: ok\n")
    expect(result.stderr).toMatch(/code cache none /)
    expect(run(copy, t.env).stdout).toBe("victim: ok\n")
  })

  it("refuses a cache file that is a symbolic link or not this user's", () => {
    const s = sandbox()
    const launcher = install(join(s.dir, "app"), victim)
    expect(run(launcher, s.env).stdout).toBe("victim: ok\n")
    const written = [...caches(s.leaf), ...caches(s.oldDir)]
    expect(written.length).toBeGreaterThan(0)
    // Each cache becomes a link to the attacker's cache (same-length code): it must not be read.
    const planted = compiled(s.dir, attacker, s.env)
    const plantedBytes = readFileSync(planted)
    for (const file of written) {
      unlinkSync(file)
      symlinkSync(planted, file)
    }
    const result = run(launcher, s.env)
    expect(result.stdout).toBe("victim: ok\n")
    expect(result.stderr).toMatch(/code cache not read: .* is a symbolic link/)
    expect(readFileSync(planted)).toEqual(plantedBytes) // Nothing written through the link.
    // The link was replaced by a cache of the victim's code, which is used from now on.
    expect(lstatSync(written[0]!).isSymbolicLink()).toBe(false)
    const next = run(launcher, s.env)
    expect(next.stdout).toBe("victim: ok\n")
    expect(next.stderr).toMatch(/code cache used /)

    if (!root) return // Making a file another user's needs root (chown): that case is skipped.
    for (const file of [...caches(s.leaf), ...caches(s.oldDir)]) {
      unlinkSync(file)
      copyFileSync(planted, file)
      chmodSync(file, 0o644)
      chownSync(file, otherUid, otherUid)
    }
    const foreign = run(launcher, s.env)
    expect(foreign.stdout).toBe("victim: ok\n")
    expect(foreign.stderr).toMatch(/code cache not read: .* is not this user's/)
  })

  it("runs uncached, correctly, where there is no safe place", () => {
    const s = sandbox()
    const launcher = install(join(s.dir, "app"), victim)
    const aFile = join(s.dir, "a-file")
    writeFileSync(aFile, "")
    const places: Array<[string, Record<string, string | undefined>, RegExp]> = [
      ["$XDG_CACHE_HOME a file", { ...s.env, XDG_CACHE_HOME: aFile }, /is not a directory/],
      ["$HOME missing", { ...s.env, XDG_CACHE_HOME: undefined, HOME: join(s.dir, "no-such-home") }, /ENOENT/],
      ["$HOME a file", { ...s.env, XDG_CACHE_HOME: "relative/is/ignored", HOME: aFile }, /ENOTDIR|not a directory/]
    ]
    for (const [name, env, why] of places) {
      for (let i = 0; i < 2; i++) {
        const result = run(launcher, env)
        expect(result.code, name).toBe(0)
        expect(result.stdout, name).toBe("victim: ok\n")
        expect(result.stderr, name).toMatch(/code cache off: /)
        expect(result.stderr, name).toMatch(why)
      }
    }
    expect(readFileSync(aFile, "utf8")).toBe("")
    expect(existsSync(join(s.dir, "no-such-home"))).toBe(false)

    // ~/.cache a link (to a directory of ours): refused like any other link; $XDG_CACHE_HOME can name the real one.
    const real = join(s.dir, "real-cache")
    mkdirSync(real, { mode: 0o700 })
    symlinkSync(real, join(s.dir, "home", ".cache"))
    const linked = run(launcher, { ...s.env, XDG_CACHE_HOME: undefined })
    expect(linked.stdout).toBe("victim: ok\n")
    expect(linked.stderr).toContain(`code cache off: ${join(s.dir, "home", ".cache")} is a symbolic link`)
    expect(readdirSync(real)).toEqual([])
  })
})
