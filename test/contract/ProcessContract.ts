/**
 * A durable mailbox across real processes, on every backend that has them (SQLite, PostgreSQL, Redis): three
 * MainLoop workers (test/fixtures/mailbox-worker.ts) answer 2,000 requests while a controller SIGKILLs one of them
 * about every second and starts a replacement — at the end every request has exactly one reply and nothing is
 * left in flight. And four processes receiving from one queue never get the same message.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema, type Scope } from "effect"
import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { type Mailbox, MailboxResolver } from "../../src/Mailbox.js"
import * as MainLoop from "../../src/MainLoop.js"
import { type Child, spawnBundled } from "../helpers.js"

/** A backend the worker processes share with the test. */
export interface ProcessBackend {
  readonly label: string
  /** What a worker process is given: a SQLite file, a PostgreSQL or Redis URL. */
  readonly target: () => string
  /** The test's own mailbox of `name` under `prefix`. */
  readonly open: <A, I>(
    name: string,
    schema: Schema.Schema<A, I>,
    prefix: string
  ) => Effect.Effect<Mailbox<A, never>, unknown, Scope.Scope>
  /** A directory for the test's files. */
  readonly directory: string
  /**
   * Replies are at least once, not once: the reply and the acknowledgement are not one write (a Redis Cluster's
   * queues in two slots: a worker killed between them replies again on the redelivery). None may be lost.
   */
  readonly repliesAtLeastOnce?: boolean
}

const REQUESTS = 2000
const WORKER = "test/fixtures/mailbox-worker.ts"
let tables = 0
const newPrefix = () => `p${++tables}_`

export const mailboxProcessContract = (backend: ProcessBackend) =>
  describe(`Mailbox processes on ${backend.label}`, () => {
    it.live(
      `${REQUESTS} requests, 3 MainLoop workers, one SIGKILLed about every second: one reply each, none lost`,
      () =>
        Effect.gen(function*() {
          const prefix = newPrefix()
          const requests = yield* backend.open("requests", MainLoop.requestSchema(Schema.Number), prefix)
          const responses = yield* backend.open("responses", MainLoop.resultSchema(Schema.Number), prefix)
          const ids: Array<string> = []
          for (let n = 0; n < REQUESTS; n++) {
            const request = MainLoop.request(n)
            ids.push(request.requestId)
            yield* requests.send(request, { replyTo: "responses" })
          }
          const spawn = () => spawnBundled(WORKER, ["mainloop", backend.target(), prefix])
          const everyone: Array<Child> = []
          const live: Array<Child> = []
          for (let i = 0; i < 3; i++) {
            const child = yield* spawn()
            everyone.push(child)
            live.push(child)
          }
          // Every second or so, SIGKILL a random worker that is working (a booting one holds nothing) and start
          // a replacement. Workers need ~2 s to boot on 2 cores, so killing blindly would mostly kill boots.
          let kills = 0
          for (let round = 0; (yield* responses.approximateCount) < REQUESTS; round++) {
            if (round >= 200) return yield* Effect.dieMessage(`only ${yield* responses.approximateCount} replies`)
            yield* Effect.sleep(`${700 + Math.floor(Math.random() * 600)} millis`)
            const working = live.filter((child) => /^exec /m.test(child.output()))
            if (working.length === 0) continue
            const victim = working[Math.floor(Math.random() * working.length)]!
            live.splice(live.indexOf(victim), 1)
            yield* victim.signal("SIGKILL")
            yield* victim.exited
            kills++
            const replacement = yield* spawn()
            everyone.push(replacement)
            live.push(replacement)
          }
          // Every reply was committed with its request's acknowledgement: nothing can be in flight.
          expect(yield* requests.approximateCount).toBe(0)
          for (const child of live) yield* Effect.zipRight(child.waitFor(/^ready$/m), child.signal("SIGTERM"))
          const exits = yield* Effect.all(live.map((child) => child.exited))
          expect(exits.map((exit) => exit.code)).toEqual(live.map(() => 0))

          const replies = new Map<string, number>()
          let redelivered = 0
          for (;;) {
            const batch = yield* responses.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
            if (batch.length === 0) break
            for (const reply of batch) {
              replies.set(reply.body.requestId, (replies.get(reply.body.requestId) ?? 0) + 1)
              if (reply.body.runContext.attempt > 1) redelivered++
            }
          }
          const executions = new Map<string, number>()
          for (const child of everyone) {
            for (const match of child.output().matchAll(/^exec (\S+)$/gm)) {
              executions.set(match[1]!, (executions.get(match[1]!) ?? 0) + 1)
            }
          }
          const executedTwice = [...executions.values()].filter((count) => count > 1).length
          yield* Effect.logInfo(
            `${backend.label}: ${REQUESTS} requests, ${kills} workers killed, ${redelivered} answered on a ` +
              `redelivery, ${executedTwice} executed more than once (at-least-once), 0 lost`
          )
          expect(ids.filter((id) => (replies.get(id) ?? 0) === 0)).toEqual([])
          if (backend.repliesAtLeastOnce !== true) expect(ids.filter((id) => replies.get(id) !== 1)).toEqual([])
          expect(replies.size).toBe(REQUESTS)
          expect(kills).toBeGreaterThanOrEqual(2)
          expect(redelivered).toBeGreaterThan(0)
        }).pipe(Effect.provide(MailboxResolver.layer()), Effect.scoped),
      200_000
    )

    it.live("4 processes receiving from one queue never get the same message", () =>
      Effect.gen(function*() {
        const prefix = newPrefix()
        const jobs = yield* backend.open("jobs", Schema.Number, prefix)
        for (let n = 0; n < 400; n++) yield* jobs.send(n)
        const startFile = join(backend.directory, `${prefix}go`)
        const receivers = yield* Effect.all(
          [1, 2, 3, 4].map(() => spawnBundled(WORKER, ["receive", backend.target(), prefix, startFile])),
          { concurrency: "unbounded" }
        )
        yield* Effect.all(receivers.map((child) => child.waitFor(/^ready$/m)), { concurrency: "unbounded" })
        writeFileSync(startFile, "")
        const exits = yield* Effect.all(receivers.map((child) => child.exited))
        expect(exits.map((exit) => exit.code)).toEqual([0, 0, 0, 0])
        const got = receivers.flatMap((child) => [...child.output().matchAll(/^got (\S+)$/gm)].map((m) => m[1]!))
        expect(got.length).toBe(400)
        expect(new Set(got).size).toBe(400)
        // Each process took a share: they really competed.
        expect(receivers.filter((child) => /^got /m.test(child.output())).length).toBeGreaterThan(1)
      }).pipe(Effect.scoped), 120_000)
  })
