/**
 * Shutdown and supervision with real processes and real signals: a worker
 * under `NodeRuntime.runMain` (with or without `ShutdownCoordinator.layer`,
 * as `LoopGroup.run` or as `MainLoop.layer`) whose handler is stuck stops at
 * its shutdown timeout and gives the request back at once; a worker whose
 * loop dies exits non-zero with the cause logged. test/fixtures/loop-process.ts
 * is the worker; its SQLite mailbox is read after it exits.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import { spawnBundled } from "./helpers.js"

const WORKER = "test/fixtures/loop-process.ts"
const directory = mkdtempSync(join(tmpdir(), "leasehold-loops-"))
let files = 0

/** The requests still queued in `filename`, received now with their delivery counts. */
const queued = (filename: string) =>
  Effect.gen(function*() {
    const requests = yield* MailboxSql.make({ name: "requests", schema: MainLoop.requestSchema(Schema.String) })
    const messages = yield* requests.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
    return messages.map((message) => [message.body.requestId, message.deliveryCount])
  }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename })))

const variants = [
  { label: "LoopGroup.run under runMain alone", flags: [] },
  { label: "LoopGroup.run with ShutdownCoordinator.layer", flags: ["--coordinator"] },
  { label: "MainLoop.layer under Layer.launch and runMain", flags: ["--layer"] }
] as const

describe("a stuck handler and SIGTERM", () => {
  for (const variant of variants) {
    it.live(
      `${variant.label}: interrupted and nacked at the 1.5 s timeout, and the process exits`,
      () =>
        Effect.gen(function*() {
          const filename = join(directory, `stuck-${++files}.db`)
          const child = yield* spawnBundled(WORKER, [
            filename,
            "--send",
            "--stuck",
            "--shutdown-ms",
            "1500",
            ...variant.flags
          ])
          yield* child.waitFor(/started job-1/)
          const signalled = performance.now()
          yield* child.signal("SIGTERM")
          const { code } = yield* child.exited
          const seconds = (performance.now() - signalled) / 1000
          const output = child.output()
          expect(code).toBe(0)
          expect(output).toMatch(/Shutdown timed out after 1s 500ms; interrupting in-flight work/)
          expect(output).toMatch(/Handler interrupted; giving the message back/)
          expect(output).not.toMatch(/stopped cleanly/)
          // The timeout plus a small constant (process teardown), nowhere near the 1 h visibility or a 20 s poll.
          expect(seconds).toBeLessThan(6.5)
          // Visible again at once, on its second delivery: nacked, not left to its one-hour visibility.
          expect(yield* queued(filename)).toEqual([["job-1", 2]])
        }).pipe(Effect.scoped),
      60_000
    )
  }

  it.live("an idle worker under runMain alone exits at once on SIGTERM, cleanly", () =>
    Effect.gen(function*() {
      const child = yield* spawnBundled(WORKER, [join(directory, `idle-${++files}.db`)])
      yield* child.waitFor(/ready/)
      yield* Effect.sleep("200 millis") // into its 20 s long poll
      const signalled = performance.now()
      yield* child.signal("SIGTERM")
      const { code } = yield* child.exited
      expect(code).toBe(0)
      expect(child.output()).toMatch(/Group interrupted: all loops stopped cleanly/)
      expect((performance.now() - signalled) / 1000).toBeLessThan(5)
    }).pipe(Effect.scoped), 60_000)
})

describe("a loop that dies", () => {
  it.live(
    "makes the runMain process exit non-zero, with the cause logged at error level",
    () =>
      Effect.gen(function*() {
        const child = yield* spawnBundled(WORKER, [join(directory, `dies-${++files}.db`), "--die"])
        const { code } = yield* child.exited
        const output = child.output()
        expect(code).toBe(1)
        expect(output).toMatch(/ERROR \(#\d+\): Loop "worker" died/)
        expect(output).toMatch(/the store broke/)
        expect(output).not.toMatch(/main ended/)
      }).pipe(Effect.scoped),
    60_000
  )
})
