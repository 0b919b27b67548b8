/**
 * A dead-lettered request settles once, however slow the dead-letter store: its letter is stored while the
 * request stays leased, then the error reply and the acknowledgement go in one lease-checked step. Shown on
 * every backend with a dead-letter sink whose every send takes longer than the requests' visibility timeout —
 * the case where the request came back while its letter was being stored, to be dead-lettered and answered
 * again, for ever. Time is driven with `TestClock` (the SQL statements use the test's time too).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Ref, Schema, type Scope, TestClock } from "effect"
import * as DeadLetter from "../src/DeadLetter.js"
import { type Mailbox, MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import { sqlBackends } from "./support/sqlBackends.js"

type Requests = Mailbox<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>
type Responses = Mailbox<MainLoop.MainLoopResult<string>, never>

const sql = sqlBackends("dlq")

let tables = 0

/** The requests and responses mailboxes of one backend, with a resolver that knows both. */
const backends: ReadonlyArray<{
  readonly label: string
  readonly mailboxes: Effect.Effect<{ requests: Requests; responses: Responses }, unknown, Scope.Scope>
}> = [
  {
    label: "memory",
    mailboxes: Effect.all({
      requests: MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
        name: "requests"
      }),
      responses: MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
    })
  },
  ...sql.map((backend) => ({
    label: backend.label,
    mailboxes: Effect.suspend(() => {
      const prefix = `d${++tables}_`
      return Effect.all({
        requests: MailboxSql.make({
          name: "requests",
          schema: MainLoop.requestSchema(Schema.String),
          replySchema: MainLoop.resultSchema(Schema.String),
          prefix
        }),
        responses: MailboxSql.make({ name: "responses", schema: MainLoop.resultSchema(Schema.String), prefix })
      }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()))
    })
  }))
]

describe("a dead-lettered request settles once, however slow the dead-letter store", () => {
  for (const backend of backends) {
    it.scoped(
      `${backend.label}: a sink slower than the visibility timeout every time — one letter, one reply, gone`,
      () =>
        Effect.gen(function*() {
          const { requests, responses } = yield* backend.mailboxes
          const letters = yield* MailboxMemory.make<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<string>>, unknown>({
            name: "dead-letters"
          })
          // Every letter takes 3 s to store; a request is leased for 2 s at a time.
          const slowSink: DeadLetter.DeadLetterSink<MainLoop.MainLoopRequest<string>> = {
            name: "slow-dead-letters",
            send: (letter) => Effect.zipRight(Effect.sleep("3 seconds"), letters.send(letter))
          }
          const attempts = yield* Ref.make(0)
          const resolver = MailboxResolver.fromMailboxes(requests, responses)
          const loop = yield* MainLoop.make({
            requests,
            execute: () => Effect.zipRight(Ref.update(attempts, (n) => n + 1), Effect.fail(new Error("poison"))),
            config: {
              deadLetters: { mailbox: slowSink, policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 }) },
              leaseExtender: { interval: "500 millis", extension: "2 seconds" }
            }
          }).pipe(Effect.provideService(MailboxResolver, resolver))
          yield* requests.send(MainLoop.request("poison", { requestId: "req-1" }), { replyTo: "responses" })
          const running = yield* loop.run({ visibilityTimeout: "2 seconds", waitTime: "1 second" }).pipe(
            Effect.provideService(MailboxResolver, resolver),
            Effect.fork
          )
          // Test time in 100 ms steps, with real I/O between them for the databases.
          const advance = (seconds: number) =>
            Effect.gen(function*() {
              for (let step = 0; step < seconds * 10; step++) {
                yield* TestClock.adjust("100 millis")
                yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
                yield* Effect.yieldNow()
              }
            })
          yield* advance(30)
          const count = yield* requests.approximateCount
          // Stopped before anything is asserted, the clock still moving: a loop caught storing a letter must be
          // able to time out, or a failed expectation would leave it hanging on the test clock.
          const stopping = yield* Effect.fork(loop.shutdown({ timeout: "1 second" }))
          yield* advance(10)
          yield* Fiber.join(stopping)
          yield* Fiber.join(running)
          const stored = yield* letters.receive({ maxMessages: 10 })
          const replies = yield* responses.receive({ maxMessages: 10 })
          expect(stored.map((letter) => [letter.body.requestId, letter.body.deliveryCount])).toEqual([["req-1", 1]])
          expect(replies.map((reply) => [reply.body.requestId, reply.body.error?.tag])).toEqual([["req-1", "Error"]])
          expect(count).toBe(0)
          expect(yield* Ref.get(attempts)).toBe(1)
        }),
      60_000
    )
  }

  it.scoped("a dead-letter store that never answers holds the request at most holdLimit, and the stall shows", () =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
        name: "requests"
      })
      const hung: DeadLetter.DeadLetterSink<MainLoop.MainLoopRequest<string>> = {
        name: "hung-dead-letters",
        send: () => Effect.never
      }
      const loop = yield* MainLoop.make({
        requests,
        execute: () => Effect.fail(new Error("poison")),
        config: {
          deadLetters: { mailbox: hung, policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 }) },
          leaseExtender: { interval: "20 seconds", extension: "60 seconds" }
        }
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests)))
      yield* requests.send(MainLoop.request("poison", { requestId: "req-1" }))
      const running = yield* loop.run({ visibilityTimeout: "60 seconds", waitTime: "1 second" }).pipe(
        Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests)),
        Effect.fork
      )
      yield* TestClock.adjust("4 minutes")
      // Leased all along (extended while the store is tried), and the loop's heartbeat shows it is stuck.
      expect(yield* requests.receive()).toEqual([])
      expect(Duration.toMillis(yield* loop.heartbeat.elapsed)).toBeGreaterThanOrEqual(4 * 60_000)
      // At the limit the store is given up and the request goes back with backoff; the loop goes on.
      yield* TestClock.adjust(Duration.sum(MailboxWorker.holdLimit, "2 minutes"))
      expect(yield* loop.running).toBe(true)
      expect(yield* requests.approximateCount).toBe(1)
      const stopping = yield* Effect.fork(loop.shutdown({ timeout: "1 second" }))
      yield* TestClock.adjust("10 seconds")
      yield* Fiber.join(stopping)
      yield* Fiber.join(running)
    }))
})
