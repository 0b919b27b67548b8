/**
 * Extensions group-committed (internal/mailbox/sql/extensions.ts), attacked: on SQLite and PostgreSQL a
 * batch with a stale handle fails that caller only, the same message extended twice lands both in order, an
 * extension racing its acknowledgement never hangs, 0 and 12 h share a batch, a clock jump while an extension
 * waits is judged when its statement runs; and the batcher itself: a store going away fails every waiter of
 * that batch and the next works, an interrupted waiter leaves nothing hanging, claims wait behind extensions
 * that wait or are late, and the lease that ends first is extended first.
 */
import { SqlClient } from "@effect/sql"
import { SqlError } from "@effect/sql/SqlError"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, Exit, Fiber, Metric, Schema, Scope, TestClock } from "effect"
import { type Extension, ExtensionBatcher } from "../src/internal/mailbox/sql/extensions.js"
import { batchRows } from "../src/internal/mailbox/sql/extensions.js"
import * as MailboxSql from "../src/MailboxSql.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("extensions")
let tables = 0

/** Extension statements run so far in this process. */
const statementsSoFar = Effect.map(Metric.value(batchRows), (state) => state.count)

for (const backend of backends) {
  describe(`extensions on ${backend.label}`, () => {
    const mailbox = Effect.suspend(() =>
      MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix: `x${++tables}_` })
    )
    const provided = <A, E>(effect: Effect.Effect<A, E, SqlClient.SqlClient | import("effect/Scope").Scope>) =>
      effect.pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped)

    it.effect("a stale handle in a batch fails that caller only; the batch is one statement", () =>
      provided(Effect.gen(function*() {
        const jobs = yield* mailbox
        for (const n of [1, 2, 3]) yield* jobs.send(n)
        const [a, b, c] = yield* jobs.receive({ maxMessages: 3, visibilityTimeout: "10 seconds" })
        yield* b!.acknowledge
        const before = yield* statementsSoFar
        const results = yield* Effect.all(
          [a!, b!, c!].map((message) => Effect.either(message.extendVisibility("30 seconds"))),
          { concurrency: "unbounded" }
        )
        expect(results.map((result) => Either.isRight(result) ? "ok" : result.left._tag)).toEqual([
          "ok",
          "ReceiptHandleExpiredError",
          "ok"
        ])
        expect((yield* statementsSoFar) - before).toBe(1)
        // The extended ones outlive their first visibility.
        yield* TestClock.adjust("20 seconds")
        expect(yield* jobs.receive({ maxMessages: 3 })).toEqual([])
      })))

    it.effect("the same delivery extended twice in one batch: both land, in order; a stale twin fails alone", () =>
      provided(Effect.gen(function*() {
        const jobs = yield* mailbox
        yield* jobs.send(1)
        yield* jobs.send(2)
        const [first, other] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "5 seconds" })
        // `other` times out and is delivered again: its old handle and its new one go in one batch.
        yield* TestClock.adjust("2 seconds")
        yield* first!.extendVisibility("10 seconds")
        yield* TestClock.adjust("4 seconds")
        const [again] = yield* jobs.receive({ maxMessages: 1, visibilityTimeout: "5 seconds" })
        expect(again!.id).toBe(other!.id)
        const results = yield* Effect.all(
          [
            first!.extendVisibility("20 seconds"),
            first!.extendVisibility("40 seconds"),
            other!.extendVisibility("40 seconds"),
            again!.extendVisibility("40 seconds")
          ].map(Effect.either),
          { concurrency: "unbounded" }
        )
        expect(results.map((result) => Either.isRight(result) ? "ok" : result.left._tag)).toEqual([
          "ok",
          "ok",
          "ReceiptHandleExpiredError",
          "ok"
        ])
        // The later extension of `first` (40 s) is the one that holds.
        yield* TestClock.adjust("30 seconds")
        expect(yield* jobs.receive({ maxMessages: 2 })).toEqual([])
        yield* TestClock.adjust("11 seconds")
        expect((yield* jobs.receive({ maxMessages: 2 })).map((message) => message.id).sort()).toEqual(
          [first!.id, other!.id].sort()
        )
      })))

    it.effect("an extension racing its own acknowledgement: either order, nothing hangs, the message is gone", () =>
      provided(Effect.gen(function*() {
        const jobs = yield* mailbox
        for (let n = 0; n < 20; n++) yield* jobs.send(n)
        const received = yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "10 seconds" })
        const outcomes = yield* Effect.forEach(
          received,
          (message) =>
            Effect.all([Effect.either(message.extendVisibility("30 seconds")), Effect.either(message.acknowledge)], {
              concurrency: "unbounded"
            })
        )
        for (const [extended, acknowledged] of outcomes) {
          expect(Either.isRight(acknowledged)).toBe(true)
          if (Either.isLeft(extended)) expect(extended.left._tag).toBe("ReceiptHandleExpiredError")
        }
        yield* TestClock.adjust("1 minute")
        const rest = yield* jobs.receive({ maxMessages: 10 })
        expect(rest.map((message) => message.body).some((n) => received.some((m) => m.body === n))).toBe(false)
      })))

    it.effect("0 and 12 hours in one batch: one is visible at once, the other 12 hours on", () =>
      provided(Effect.gen(function*() {
        const jobs = yield* mailbox
        yield* jobs.send(1)
        yield* jobs.send(2)
        const [now, later] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "10 seconds" })
        yield* Effect.all([now!.extendVisibility("0 seconds"), later!.extendVisibility("12 hours")], {
          concurrency: "unbounded"
        })
        const [back] = yield* jobs.receive({ maxMessages: 2 })
        expect(back?.id).toBe(now!.id)
        yield* back!.acknowledge
        yield* TestClock.adjust("11 hours")
        expect(yield* jobs.receive({ maxMessages: 2 })).toEqual([])
        yield* TestClock.adjust("1 hour")
        expect((yield* jobs.receive({ maxMessages: 2 })).map((message) => message.id)).toEqual([later!.id])
        // And a bad value never reaches the batch.
        const refused = yield* Effect.either(later!.extendVisibility("13 hours"))
        expect(Either.isLeft(refused) && refused.left._tag).toBe("InvalidParameterError")
      })))

    it.effect("the clock jumps past a visibility while extensions wait: judged when the statement runs", () =>
      provided(Effect.gen(function*() {
        const jobs = yield* mailbox
        yield* jobs.send(1)
        const [message] = yield* jobs.receive({ maxMessages: 1, visibilityTimeout: "5 seconds" })
        const extending = yield* Effect.fork(Effect.either(message!.extendVisibility("30 seconds")))
        yield* TestClock.adjust("6 seconds")
        const result = yield* Fiber.join(extending)
        const redelivered = yield* jobs.receive({ maxMessages: 1 })
        // Either the statement ran before the jump (the lease holds) or after it (the handle had run out).
        if (Either.isLeft(result)) {
          expect(result.left._tag).toBe("ReceiptHandleExpiredError")
          expect(redelivered.map((m) => m.id)).toEqual([message!.id])
        } else expect(redelivered).toEqual([])
      })))
  })
}

describe("ExtensionBatcher", () => {
  /** Lets the forked fibers run as far as they can. */
  const settle = Effect.repeatN(Effect.yieldNow(), 20)
  const item = (seq: number, leaseEnd = 1_000_000): Extension => ({
    seq: String(seq),
    handle: "h",
    timeoutMillis: 1000,
    leaseEnd
  })

  it.scoped("a store that fails mid-batch fails every waiter of that batch, and the next batch works", () =>
    Effect.gen(function*() {
      let calls = 0
      const batcher = yield* ExtensionBatcher.make(
        (items) =>
          Effect.suspend(() =>
            ++calls === 1
              ? Effect.fail(new SqlError({ cause: new Error("gone") }))
              : Effect.succeed(items.map(() => true))
          ),
        yield* Effect.clock,
        yield* Effect.scope
      )
      const first = yield* Effect.all([1, 2, 3].map((n) => Effect.exit(batcher.submit(item(n)))), {
        concurrency: "unbounded"
      })
      expect(first.map((exit) => Exit.isFailure(exit))).toEqual([true, true, true])
      expect(calls).toBe(1) // not a data error: no retry one by one
      expect(yield* Effect.all([4, 5].map((n) => batcher.submit(item(n))), { concurrency: "unbounded" })).toEqual([
        true,
        true
      ])
      yield* batcher.beforeClaim // nothing outstanding: the gate is open
    }))

  it.scoped("the mailbox closing under a batch in flight fails its waiters; a later extension runs alone", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      let calls = 0
      const batcher = yield* ExtensionBatcher.make(
        (items) => calls++ === 0 ? Effect.never : Effect.succeed(items.map(() => true)),
        yield* Effect.clock,
        scope
      )
      const waiting = yield* Effect.fork(batcher.submit(item(1)))
      yield* settle
      yield* Scope.close(scope, Exit.void)
      const exit = yield* Fiber.await(waiting)
      expect(Exit.isFailure(exit) && !Exit.isInterrupted(exit)).toBe(true)
      // A job still running when its mailbox closed keeps its lease: the extension is its own statement.
      expect(yield* batcher.submit(item(2))).toBe(true)
      expect(calls).toBe(2)
      yield* batcher.beforeClaim
    }))

  it.scoped("an interrupted waiter leaves nothing hanging: the others get their results, claims go on", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const batcher = yield* ExtensionBatcher.make(
        (items) => Effect.as(Deferred.await(gate), items.map(() => true)),
        yield* Effect.clock,
        yield* Effect.scope
      )
      const a = yield* Effect.fork(batcher.submit(item(1)))
      const b = yield* Effect.fork(batcher.submit(item(2)))
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(a)
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(b)).toBe(true)
      yield* batcher.beforeClaim
    }))

  it.scoped("claims wait while extensions wait or the batch in flight is late, and go once it lands", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const clock = yield* Effect.clock
      const batcher = yield* ExtensionBatcher.make(
        (items) => Effect.as(Deferred.await(gate), items.map(() => true)),
        clock,
        yield* Effect.scope
      )
      yield* batcher.beforeClaim // idle: no wait
      const now = clock.unsafeCurrentTimeMillis()
      // A lease with 4 s left: late once it has waited 1 s.
      const extension = yield* Effect.fork(batcher.submit(item(1, now + 4000)))
      const claim = yield* Effect.fork(batcher.beforeClaim)
      yield* settle
      // Taken into a statement and not late yet: the claim went.
      expect(yield* Fiber.poll(claim)).toEqual(expect.objectContaining({ _tag: "Some" }))
      yield* TestClock.adjust("1 second")
      const late = yield* Effect.fork(batcher.beforeClaim)
      yield* settle
      expect((yield* Fiber.poll(late))._tag).toBe("None")
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(extension)).toBe(true)
      yield* Fiber.join(late)
    }))

  it.scoped("past a batch's size, the leases that end soonest go first", () =>
    Effect.gen(function*() {
      const batches: Array<ReadonlyArray<Extension>> = []
      const batcher = yield* ExtensionBatcher.make(
        (items) => Effect.sync(() => (batches.push(items), items.map(() => true))),
        yield* Effect.clock,
        yield* Effect.scope
      )
      const items = Array.from({ length: 1500 }, (_, n) => item(n, 1_000_000 - n)) // the last ends soonest
      yield* Effect.all(items.map((extension) => batcher.submit(extension)), { concurrency: "unbounded" })
      expect(batches.length).toBe(2)
      expect(batches[0]!.length).toBe(1000)
      expect(batches[0]!.some((extension) => extension.seq === "1499")).toBe(true)
      expect(batches[1]!.some((extension) => extension.seq === "0")).toBe(true)
    }))
})
