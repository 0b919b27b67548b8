/**
 * The package as a newcomer's project gets it: `npm pack` (which builds, through `prepack`), then the README's
 * install line, exactly as written, run in a fresh project — offline, against a loopback registry that serves
 * the npm cache our own install filled (support/cacheRegistry.ts) — and npm must print no peer warning. Then
 *
 * - plain Node ESM imports the root and five subpaths and runs a request/reply through a `MailboxMemory`
 *   and a `MainLoop` (so the light core loads without any optional peer installed), and opening SQLite
 *   without its driver, or making the Anthropic adapter without `@effect/ai-anthropic`, says which package
 *   to install, at the version range package.json's peers give;
 * - CommonJS `require`s the root and a subpath and runs the same request/reply;
 * - `tsc` under `strict` with `skipLibCheck: false` type-checks a consumer that imports the root and every
 *   subpath with only the required peers installed (no declaration may need an optional peer), with
 *   `moduleResolution` `nodenext` and `bundler`;
 * - `npx leasehold --help` prints the usage (the bundled command line, no tsx);
 * - the install line the missing-SQLite message gives resolves too, without a peer warning, on the Effect 3 line.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import semver from "semver"
import {
  cacheRegistry,
  emptyProject,
  npmInstall,
  pack,
  peersFor,
  readmeInstallLine,
  root,
  run
} from "./support/consumer.js"

const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
  readonly peerDependencies: Record<string, string>
  readonly exports: Record<string, unknown>
}

/** The install line a missing-package message gives for `name`: the range package.json's peers give. */
const installLineFor = (name: string) => `npm install ${name}@${manifest.peerDependencies[name]}`

/** What npm says when it resolved a peer dependency it was not asked for, or could not satisfy one. */
const peerTrouble = /ERESOLVE|peer/i

/** A request/reply through the light core, from plain ESM: the root and five subpaths. */
const plainProgram = `
import { MailboxMemory, MainLoop } from "leasehold"
import * as Deadline from "leasehold/Deadline"
import * as Heartbeat from "leasehold/Heartbeat"
import * as Database from "leasehold/Database"
import * as Anthropic from "leasehold/Anthropic"
import { MailboxResolver } from "leasehold/Mailbox"
import { FetchHttpClient } from "@effect/platform"
import { Effect, Layer, Redacted } from "effect"

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
  // Nor is the Anthropic provider: making its adapter says which package to add.
  const noProvider = yield* Effect.flip(
    Anthropic.make({ model: "claude", apiKey: Redacted.make("key") }).pipe(Effect.provide(FetchHttpClient.layer))
  )
  console.log(noProvider.message)
})
Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
`

/** The same request/reply from CommonJS: `require` of the ESM package (Node 20.19+ loads it). */
const commonJsProgram = `
const { MailboxMemory, MainLoop } = require("leasehold")
const { MailboxResolver } = require("leasehold/Mailbox")
const { Effect } = require("effect")

const program = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make({ name: "requests" })
  const replies = yield* MailboxMemory.make({ name: "replies" })
  const loop = yield* MainLoop.make({ requests, execute: (text) => Effect.succeed(text + "!") }).pipe(
    Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, replies))
  )
  yield* requests.send(MainLoop.request("hi", { requestId: "c1" }), { replyTo: "replies" })
  yield* loop.run({ maxIterations: 1, waitTime: 0 })
  const [reply] = yield* replies.receive({ maxMessages: 1 })
  console.log(\`cjs reply \${reply.body.requestId}: \${reply.body.output}\`)
})
Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
`

/** The root and every subpath package.json exports, each used, so that every declaration file is checked. */
const everySubpath = () => {
  const subpaths = Object.keys(manifest.exports).filter((key) => key !== "." && key !== "./package.json")
  return [
    `import * as Root from "leasehold"`,
    ...subpaths.map((key, i) => `import * as Subpath${i} from "leasehold/${key.slice(2)}"`),
    `export const modules = [Root, ${subpaths.map((_, i) => `Subpath${i}`).join(", ")}] as const`
  ].join("\n")
}

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
  it.scoped(
    "installs with the README's line and no peer warning, runs from ESM and CommonJS, type-checks strictly without optional peers, its command line starts, and a missing package's line resolves",
    () =>
      Effect.gen(function*() {
        const tarball = yield* pack
        const registry = yield* cacheRegistry(tarball)
        const project = emptyProject(tarball, "app")
        const line = yield* readmeInstallLine
        const installOutput = yield* npmInstall(project, registry, line)
        expect(installOutput).not.toMatch(peerTrouble)
        // The required peers, each on the range package.json gives (Effect 3), and nothing optional.
        for (const peer of peersFor(false)) {
          const { version } = JSON.parse(readFileSync(join(project, "node_modules", peer, "package.json"), "utf8"))
          expect(semver.satisfies(version, manifest.peerDependencies[peer]!), `${peer}@${version}`).toBe(true)
        }
        // The licence and the changelog travel with the code.
        const files = readdirSync(join(project, "node_modules", "leasehold"))
        expect(files).toEqual(expect.arrayContaining(["LICENSE", "CHANGELOG.md", "README.md"]))
        expect(readFileSync(join(project, "node_modules", "leasehold", "LICENSE"), "utf8")).toMatch(
          /^MIT License\n\nCopyright \(c\) 2026 leasehold contributors\n/
        )
        const installed = readdirSync(join(project, "node_modules", "@effect"))
        for (const optional of ["sql-pg", "sql-sqlite-node", "platform-node", "opentelemetry", "ai", "ai-anthropic"]) {
          expect(installed).not.toContain(optional)
        }

        // (a) plain Node ESM: the root and five subpaths, a request answered by a MainLoop.
        writeFileSync(join(project, "plain.mjs"), plainProgram)
        const output = yield* run("node", ["plain.mjs"], project)
        expect(output).toContain("reply r1: HELLO")
        const sqliteLine = installLineFor("@effect/sql-sqlite-node")
        expect(output).toContain(
          `Database.layerSqlite needs the package @effect/sql-sqlite-node, which is not installed: ${sqliteLine}`
        )
        expect(output).toContain(
          "Anthropic.make needs the package @effect/ai-anthropic, which is not installed: " +
            installLineFor("@effect/ai-anthropic")
        )

        // (b) CommonJS: require() of the root and a subpath.
        writeFileSync(join(project, "plain.cjs"), commonJsProgram)
        expect(yield* run("node", ["plain.cjs"], project)).toContain("cjs reply c1: hi!")

        // (c) a strict TypeScript consumer with only the required peers, every declaration checked, resolved the
        // way Node resolves it and the way bundlers do.
        writeFileSync(join(project, "consumer.ts"), consumerSource)
        writeFileSync(join(project, "every-subpath.ts"), everySubpath())
        const tsc = join(root, "node_modules", "typescript", "bin", "tsc")
        for (const [module, moduleResolution] of [["nodenext", "nodenext"], ["esnext", "bundler"]] as const) {
          const config = `tsconfig.${moduleResolution}.json`
          writeFileSync(
            join(project, config),
            JSON.stringify({
              compilerOptions: {
                strict: true,
                exactOptionalPropertyTypes: true,
                skipLibCheck: false,
                noEmit: true,
                target: "es2022",
                module,
                moduleResolution,
                types: []
              },
              files: ["consumer.ts", "every-subpath.ts"]
            })
          )
          yield* run("node", [tsc, "-p", config], project)
        }

        // (d) the command line, compiled and bundled: no tsx at run time.
        expect(yield* run("npx", ["--offline", "leasehold", "--help"], project)).toMatch(/leasehold[\s\S]*queue/)

        // (e) the line the missing-SQLite message gave installs the driver beside the core, on Effect 3.
        const driverOutput = yield* npmInstall(project, registry, sqliteLine.split(" "))
        expect(driverOutput).not.toMatch(peerTrouble)
        for (const name of ["@effect/sql-sqlite-node", "effect"]) {
          const { version } = JSON.parse(readFileSync(join(project, "node_modules", name, "package.json"), "utf8"))
          expect(semver.satisfies(version, manifest.peerDependencies[name]!), `${name}@${version}`).toBe(true)
        }
      }),
    300_000
  )
})
