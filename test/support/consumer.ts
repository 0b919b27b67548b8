/**
 * A newcomer's project: the package as `npm pack` makes it (building through `prepack`), installed into a
 * fresh directory without the network, from the npm cache our own install filled — either with the README's
 * install line run against a loopback registry serving that cache (`installLine`, the packaging test) or
 * with `npm ci --offline` from a lockfile cut out of ours (`install`, the install-size benchmark).
 */
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as CacheRegistry from "./cacheRegistry.js"

/** The repository (where `npm pack` runs). */
export const root = resolve(import.meta.dirname, "..", "..")

/** Runs a command; its standard output and error, or a failure with both when it exits non-zero. */
export const exec = (command: string, args: ReadonlyArray<string>, cwd: string, timeoutMs = 240_000) =>
  Effect.async<{ readonly stdout: string; readonly stderr: string }, Error>((resume) => {
    const child = execFile(
      command,
      args,
      { cwd, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024, env: { ...process.env, NO_COLOR: "1" } },
      (error, stdout, stderr) => {
        if (error === null) resume(Effect.succeed({ stdout, stderr }))
        else {
          resume(
            Effect.fail(new Error(`${command} ${args.join(" ")} failed: ${error.message}\n${stdout}\n${stderr}`))
          )
        }
      }
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** Runs a command; its standard output, or a failure with its output when it exits non-zero. */
export const run = (command: string, args: ReadonlyArray<string>, cwd: string, timeoutMs = 240_000) =>
  Effect.map(exec(command, args, cwd, timeoutMs), ({ stdout }) => stdout)

interface LockEntry {
  readonly version?: string
  readonly dependencies?: Record<string, string>
  readonly optionalDependencies?: Record<string, string>
  readonly peerDependencies?: Record<string, string>
  readonly peerDependenciesMeta?: Record<string, { readonly optional?: boolean }>
  readonly [key: string]: unknown
}

/**
 * The entries of our lockfile that `names` need (their dependencies, optional ones included, and required
 * peers, transitively), at the same paths.
 */
const lockClosure = (names: ReadonlyArray<string>): Record<string, LockEntry> => {
  const lock = JSON.parse(readFileSync(join(root, "package-lock.json"), "utf8")) as {
    readonly packages: Record<string, LockEntry>
  }
  const picked: Record<string, LockEntry> = {}
  // Node's lookup: from `from` (a node_modules path) up to the top.
  const locate = (name: string, from: string): string | undefined => {
    let base = from
    for (;;) {
      const candidate = `${base === "" ? "" : `${base}/`}node_modules/${name}`
      if (lock.packages[candidate] !== undefined) return candidate
      if (base === "") return undefined
      const cut = base.lastIndexOf("/node_modules/")
      base = cut === -1 ? "" : base.slice(0, cut)
    }
  }
  const visit = (name: string, from: string) => {
    const path = locate(name, from)
    if (path === undefined || picked[path] !== undefined) return
    const { dev: _dev, devOptional: _devOptional, ...entry } = lock.packages[path]!
    picked[path] = entry
    for (const dependency of Object.keys({ ...entry.dependencies, ...entry.optionalDependencies })) {
      visit(dependency, path)
    }
    for (const peer of Object.keys(entry.peerDependencies ?? {})) {
      if (entry.peerDependenciesMeta?.[peer]?.optional !== true) visit(peer, path)
    }
  }
  for (const name of names) visit(name, "")
  return picked
}

/** What a consumer installs beside leasehold: the required peers, and with `optionalPeers` every optional one. */
export const peersFor = (optionalPeers: boolean): ReadonlyArray<string> => {
  const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
    readonly peerDependencies: Record<string, string>
    readonly peerDependenciesMeta: Record<string, { readonly optional?: boolean }>
  }
  return Object.keys(manifest.peerDependencies).filter((name) =>
    optionalPeers || manifest.peerDependenciesMeta[name]?.optional !== true
  )
}

/** Packs the package into a new temporary directory; the tarball's path. */
export const pack: Effect.Effect<string, Error> = Effect.gen(function*() {
  const work = mkdtempSync(join(tmpdir(), "leasehold-package-"))
  yield* run("npm", ["pack", "--pack-destination", work, "--silent"], root)
  const tarball = readdirSync(work).find((name) => name.endsWith(".tgz"))
  if (tarball === undefined) return yield* Effect.fail(new Error("npm pack made no tarball"))
  return join(work, tarball)
})

/**
 * A project beside `tarball` (in `name`) that depends on leasehold and `peers`, installed offline; its
 * directory. Install scripts do not run (the core needs none; better-sqlite3 is not among the core's peers).
 */
export const install = (tarball: string, name: string, peers: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"))
    const project = join(resolve(tarball, ".."), name)
    mkdirSync(project, { recursive: true })
    const entries = lockClosure(peers)
    const spec = `file:${tarball}`
    const dependencies = {
      leasehold: spec,
      ...Object.fromEntries(peers.map((peer) => [peer, String(entries[`node_modules/${peer}`]!.version)]))
    }
    writeFileSync(
      join(project, "package.json"),
      JSON.stringify({ name, version: "1.0.0", type: "module", private: true, dependencies }, null, 2)
    )
    writeFileSync(
      join(project, "package-lock.json"),
      JSON.stringify(
        {
          name,
          version: "1.0.0",
          lockfileVersion: 3,
          requires: true,
          packages: {
            "": { name, version: "1.0.0", dependencies },
            ...entries,
            "node_modules/leasehold": {
              version: manifest.version,
              resolved: spec,
              peerDependencies: manifest.peerDependencies,
              peerDependenciesMeta: manifest.peerDependenciesMeta,
              bin: manifest.bin
            }
          }
        },
        null,
        2
      )
    )
    yield* run("npm", ["ci", "--offline", "--no-audit", "--no-fund", "--ignore-scripts"], project)
    return project
  })

/** The install line of README.md's Install section (`npm install leasehold …`), split into its words. */
export const readmeInstallLine: Effect.Effect<ReadonlyArray<string>, Error> = Effect.suspend(() => {
  const readme = readFileSync(join(root, "README.md"), "utf8")
  const section = readme.slice(readme.indexOf("\n## Install\n"))
  const line = /^npm install leasehold .*$/m.exec(section)?.[0]
  return line === undefined
    ? Effect.fail(new Error("README.md's Install section has no `npm install leasehold …` line"))
    : Effect.succeed(line.trim().split(/\s+/))
})

/**
 * A loopback registry for the scope that serves the npm cache our own install filled, and `tarball` as
 * `leasehold` (support/cacheRegistry.ts); its URL.
 */
export const cacheRegistry = (tarball: string) =>
  Effect.gen(function*() {
    const npmCache = (yield* run("npm", ["config", "get", "cache"], root)).trim()
    const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"))
    return yield* CacheRegistry.start(join(npmCache, "_cacache"), [{
      manifest: {
        name: manifest.name,
        version: manifest.version,
        type: manifest.type,
        engines: manifest.engines,
        peerDependencies: manifest.peerDependencies,
        peerDependenciesMeta: manifest.peerDependenciesMeta,
        bin: manifest.bin
      },
      tarball
    }])
  })

/** An empty project beside `tarball`, in `name`; its directory. */
export const emptyProject = (tarball: string, name: string): string => {
  const project = join(resolve(tarball, ".."), name)
  mkdirSync(project, { recursive: true })
  writeFileSync(
    join(project, "package.json"),
    JSON.stringify({ name, version: "1.0.0", type: "module", private: true }, null, 2)
  )
  return project
}

/**
 * Runs `line` — `npm install …` as a user types it — in `project` against `registry`, with a cache of the
 * project's own; everything npm printed. Install scripts do not run (the core needs none).
 */
export const npmInstall = (project: string, registry: string, line: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const [npm, command, ...specs] = line
    if (npm !== "npm" || command !== "install") {
      return yield* Effect.fail(new Error(`not an npm install line: ${line.join(" ")}`))
    }
    const { stderr, stdout } = yield* exec("npm", [
      "install",
      ...specs,
      "--registry",
      registry,
      "--cache",
      join(project, ".npm-cache"),
      "--no-audit",
      "--no-fund",
      "--ignore-scripts"
    ], project)
    return `${stdout}\n${stderr}`
  })
