/**
 * The package as a newcomer's project gets it: `npm pack` (which builds, through `prepack`), the tarball
 * installed into a fresh project with only the required peers (`effect`, `@effect/platform`, `@effect/sql`) —
 * offline, from the npm cache, with a lockfile cut from ours so no registry is asked — then
 *
 * - plain Node ESM imports the root and four subpaths and runs a request/reply through a `MailboxMemory`
 *   and a `MainLoop` (so the light core loads without any optional peer installed), and opening SQLite
 *   without its driver says which package to install;
 * - `tsc` under `strict` type-checks a consumer file, with `moduleResolution` `nodenext` and `bundler`;
 * - `npx leasehold --help` prints the usage (the bundled command line, no tsx).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "..")

/** Runs a command; fails with its output when it exits non-zero. */
const run = (command: string, args: ReadonlyArray<string>, cwd: string, timeoutMs = 240_000) =>
  Effect.async<string, Error>((resume) => {
    const child = execFile(
      command,
      args,
      { cwd, timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024, env: { ...process.env, NO_COLOR: "1" } },
      (error, stdout, stderr) => {
        if (error === null) resume(Effect.succeed(stdout))
        else {resume(
            Effect.fail(new Error(`${command} ${args.join(" ")} failed: ${error.message}\n${stdout}\n${stderr}`))
          )}
      }
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

interface LockEntry {
  readonly dependencies?: Record<string, string>
  readonly optionalDependencies?: Record<string, string>
  readonly peerDependencies?: Record<string, string>
  readonly peerDependenciesMeta?: Record<string, { readonly optional?: boolean }>
  readonly optional?: boolean
  readonly dev?: boolean
  readonly [key: string]: unknown
}

/**
 * The entries of our lockfile that `names` need (their dependencies, optional ones included, and required
 * peers, transitively), at
 * the same paths: a consumer's lockfile that `npm ci --offline` installs from the cache our own install filled.
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
    const { dev: _dev, ...entry } = lock.packages[path]!
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

const requiredPeers = ["effect", "@effect/platform", "@effect/sql"] as const

/** A request/reply through the light core, from plain ESM: the root and three subpaths. */
const plainProgram = `
import { MailboxMemory, MainLoop } from "leasehold"
import * as Deadline from "leasehold/Deadline"
import * as Heartbeat from "leasehold/Heartbeat"
import * as Database from "leasehold/Database"
import { MailboxResolver } from "leasehold/Mailbox"
import { Effect, Layer } from "effect"

const program = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make({ name: "requests" })
  const replies = yield* MailboxMemory.make({ name: "replies" })
  const loop = yield* MainLoop.make({
    requests,
    execute: (text) => Effect.as(Heartbeat.beat, text.toUpperCase())
  }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, replies)))
  const deadline = yield* Deadline.after("1 minute")
  yield* requests.send(MainLoop.request("hello", { requestId: "r1", deadline }), { replyTo: "replies" })
  yield* loop.run({ maxIterations: 1, waitTime: 0 })
  const [reply] = yield* replies.receive({ maxMessages: 1 })
  console.log(\`reply \${reply.body.requestId}: \${reply.body.output}\`)
  // No SQLite driver is installed: opening a database says which package to add.
  const missing = yield* Effect.flip(Effect.scoped(Layer.build(Database.layerSqlite({ filename: "app.db" }))))
  console.log(missing.message)
})
Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
`

/** What a TypeScript consumer writes: typed requests and replies, a layer, errors by tag. */
const consumerSource = `
import { Deadline, MailboxMemory, MainLoop } from "leasehold"
import * as Mailbox from "leasehold/Mailbox"
import * as MailboxSql from "leasehold/MailboxSql"
import * as WorkLease from "leasehold/WorkLease"
import { Effect, Layer } from "effect"

interface Request {
  readonly text: string
}

export const program: Effect.Effect<string | undefined, unknown, never> = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<Request>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const replies = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "replies" })
  const loop = yield* MainLoop.make({
    requests,
    execute: (request: Request) => Effect.succeed(request.text.length.toString())
  }).pipe(Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests, replies)))
  const deadline: Deadline.Deadline = yield* Deadline.after("1 minute")
  yield* requests.send(MainLoop.request({ text: "hi" }, { requestId: "r1", deadline }), { replyTo: "replies" })
  yield* loop.run({ maxIterations: 1, waitTime: 0 })
  const leases = yield* WorkLease.make({ maxRetries: 3 })
  const acquired = yield* leases.tryAcquire("repo", 0)
  const [reply] = yield* replies.receive({ maxMessages: 1 })
  return acquired._tag === "Acquired" ? reply?.body.output : undefined
}).pipe(Effect.scoped)

export const durable = MailboxSql.layerSqlite({ filename: "app.db" }).pipe(Layer.orDie)
`

describe("the package", () => {
  it.effect(
    "packs, installs offline into a fresh project, runs from plain ESM, type-checks for nodenext and bundler, and its command line starts",
    () =>
      Effect.gen(function*() {
        const work = mkdtempSync(join(tmpdir(), "leasehold-package-"))
        yield* run("npm", ["pack", "--pack-destination", work, "--silent"], root)
        const tarball = readdirSync(work).find((name) => name.endsWith(".tgz"))
        expect(tarball).toBeDefined()

        const project = join(work, "app")
        yield* run("mkdir", ["-p", project], work)
        const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"))
        const entries = lockClosure(requiredPeers)
        const versionOf = (name: string) => String(entries[`node_modules/${name}`]!.version)
        const dependencies = {
          leasehold: `file:../${tarball}`,
          ...Object.fromEntries(requiredPeers.map((name) => [name, versionOf(name)]))
        }
        writeFileSync(
          join(project, "package.json"),
          JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true, dependencies }, null, 2)
        )
        writeFileSync(
          join(project, "package-lock.json"),
          JSON.stringify(
            {
              name: "app",
              version: "1.0.0",
              lockfileVersion: 3,
              requires: true,
              packages: {
                "": { name: "app", version: "1.0.0", dependencies },
                ...entries,
                "node_modules/leasehold": {
                  version: manifest.version,
                  resolved: `file:../${tarball}`,
                  peerDependencies: manifest.peerDependencies,
                  peerDependenciesMeta: manifest.peerDependenciesMeta,
                  bin: { leasehold: "dist/bin/leasehold.mjs" }
                }
              }
            },
            null,
            2
          )
        )
        yield* run("npm", ["ci", "--offline", "--no-audit", "--no-fund", "--ignore-scripts"], project)
        const installed = readdirSync(join(project, "node_modules", "@effect"))
        // The light core installs no driver, HTTP server, exporter or model provider.
        for (const optional of ["sql-pg", "sql-sqlite-node", "platform-node", "opentelemetry", "ai"]) {
          expect(installed).not.toContain(optional)
        }

        // (a) plain Node ESM: the root and four subpaths, a request answered by a MainLoop.
        writeFileSync(join(project, "plain.mjs"), plainProgram)
        const output = yield* run("node", ["plain.mjs"], project)
        expect(output).toContain("reply r1: HELLO")
        expect(output).toContain(
          "Database.layerSqlite needs the package @effect/sql-sqlite-node, which is not installed: " +
            "npm install @effect/sql-sqlite-node"
        )

        // (b) a strict TypeScript consumer, resolved the way Node resolves it and the way bundlers do.
        writeFileSync(join(project, "consumer.ts"), consumerSource)
        const tsc = join(root, "node_modules", "typescript", "bin", "tsc")
        for (const [module, moduleResolution] of [["nodenext", "nodenext"], ["esnext", "bundler"]] as const) {
          const config = `tsconfig.${moduleResolution}.json`
          writeFileSync(
            join(project, config),
            JSON.stringify({
              compilerOptions: {
                strict: true,
                exactOptionalPropertyTypes: true,
                skipLibCheck: true,
                noEmit: true,
                target: "es2022",
                module,
                moduleResolution,
                types: []
              },
              files: ["consumer.ts"]
            })
          )
          yield* run("node", [tsc, "-p", config], project)
        }

        // (c) the command line, compiled and bundled: no tsx at run time.
        expect(yield* run("npx", ["--offline", "leasehold", "--help"], project)).toMatch(/leasehold[\s\S]*queue/)
      }),
    300_000
  )
})
