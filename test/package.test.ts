/**
 * The package as a newcomer's project gets it: `npm pack` (which builds, through `prepack`), the tarball
 * installed into a fresh project with only the required peers (`effect`, `@effect/platform`, `@effect/sql`) —
 * offline, from the npm cache, with a lockfile cut from ours so no registry is asked (support/consumer.ts) —
 * then
 *
 * - plain Node ESM imports the root and five subpaths and runs a request/reply through a `MailboxMemory`
 *   and a `MainLoop` (so the light core loads without any optional peer installed), and opening SQLite
 *   without its driver, or making the Anthropic adapter without `@effect/ai-anthropic`, says which package
 *   to install;
 * - `tsc` under `strict` type-checks a consumer file, with `moduleResolution` `nodenext` and `bundler`;
 * - `npx leasehold --help` prints the usage (the bundled command line, no tsx).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { readdirSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { install, pack, peersFor, root, run } from "./support/consumer.js"

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
        const project = yield* install(yield* pack, "app", peersFor(false))
        const installed = readdirSync(join(project, "node_modules", "@effect"))
        // The light core installs no driver, HTTP server, exporter or model provider.
        for (const optional of ["sql-pg", "sql-sqlite-node", "platform-node", "opentelemetry", "ai", "ai-anthropic"]) {
          expect(installed).not.toContain(optional)
        }

        // (a) plain Node ESM: the root and five subpaths, a request answered by a MainLoop.
        writeFileSync(join(project, "plain.mjs"), plainProgram)
        const output = yield* run("node", ["plain.mjs"], project)
        expect(output).toContain("reply r1: HELLO")
        expect(output).toContain(
          "Database.layerSqlite needs the package @effect/sql-sqlite-node, which is not installed: " +
            "npm install @effect/sql-sqlite-node"
        )
        expect(output).toContain(
          "Anthropic.make needs the package @effect/ai-anthropic, which is not installed: npm install @effect/ai-anthropic"
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
