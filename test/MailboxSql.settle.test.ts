/**
 * The one settle path on SQLite and PostgreSQL: a worker's successes go to the store's group commit as rows,
 * and `Mailbox.settleAll` takes the same path. Hostile cases: a batch mixing acknowledgements, replies, an
 * unencodable reply and a zombie's handles; the same delivery twice in one batch; a row the store refuses in
 * the middle of a batch; a `settleAll` interrupted while it waits.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Option, Ref, Schema, TestClock } from "effect"
import { MailboxResolver, type Message, settleAll } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import { captureLogs } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("settle")
let tables = 0

/** Runs `effect` with its logs captured; the lines logged. */
const logged = <A, E, R>(effect: Effect.Effect<A, E, R>) => {
  const { layer, lines } = captureLogs()
  return Effect.map(Effect.provide(effect, layer), () => lines.map((line) => line.message))
}

for (const backend of backends) {
  describe(`the settle path on ${backend.label}`, () => {
    const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.provideService(effect, SqlClient.SqlClient, backend.client())

    /** A request queue with replies, a reply queue, their resolver, on a fresh prefix. */
    const setup = Effect.gen(function*() {
      const prefix = `s${++tables}_`
      const requests = yield* MailboxSql.make({
        name: "requests",
        schema: Schema.Number,
        replySchema: Schema.Number,
        prefix
      })
      const responses = yield* MailboxSql.make({ name: "responses", schema: Schema.Number, prefix })
      return { prefix, requests, responses, resolver: MailboxResolver.fromMailboxes(requests, responses) }
    })

    const bodies = <R>(messages: ReadonlyArray<Message<number, R>>) => messages.map((m) => m.body).sort((a, b) => a - b)

    it.scoped("a worker's batch mixing acks, replies and an unencodable reply: each message its own outcome", () =>
      Effect.gen(function*() {
        const { requests, resolver, responses } = yield* setup
        for (const n of [1, 2]) yield* requests.send(n)
        for (const n of [3, 4, 5, 6]) yield* requests.send(n, { replyTo: "responses" })
        const loop = yield* MailboxWorker.make({
          name: "mixed",
          mailbox: requests,
          handle: () => Effect.void,
          // NaN has no JSON form: the reply to 5 cannot be encoded, in the middle of the batch.
          onSuccess: (message) =>
            Effect.succeed(
              Option.isSome(message.replyTo)
                ? Option.some(message.body === 5 ? Number.NaN : message.body * 10)
                : Option.none()
            ),
          onFailure: () => Effect.void
        }).pipe(Effect.provideService(MailboxResolver, resolver))
        yield* loop.run({ maxIterations: 1, maxMessages: 10, waitTime: 0 })
        // 3's reply resolves the route in line; 4's and 6's are rows of the group commit.
        expect(bodies(yield* responses.receive({ maxMessages: 10 }))).toEqual([30, 40, 60])
        // 5 was given back (its reply could not be sent), the others acknowledged once.
        const back = yield* requests.receive({ maxMessages: 10 })
        expect(back.map((m) => [m.body, m.deliveryCount])).toEqual([[5, 2]])
      }).pipe(onDb))

    it.scoped("a zombie's rows are refused: no reply from a delivery that lost its lease, one from the next", () =>
      Effect.gen(function*() {
        const { requests, resolver, responses } = yield* setup
        // A first reply resolves the route, so the zombie's settles below are rows of the group commit.
        yield* requests.send(0, { replyTo: "responses" })
        const [warm] = yield* requests.receive()
        yield* warm!.replyAndAcknowledge(0).pipe(Effect.provideService(MailboxResolver, resolver))
        yield* responses.receive()
        for (const n of [1, 2, 3]) yield* requests.send(n, { replyTo: "responses" })
        const stolen = yield* Ref.make<ReadonlyArray<Message<number, number>>>([])
        const loop = yield* MailboxWorker.make({
          name: "zombie",
          mailbox: requests,
          // The lease runs out while the first message is handled, and another receiver takes all three.
          handle: (message) =>
            message.body === 1
              ? Effect.zipRight(
                TestClock.adjust("2 seconds"),
                Effect.flatMap(requests.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }), (taken) =>
                  Ref.set(stolen, taken))
              )
              : Effect.void,
          onSuccess: (message) => Effect.succeed(Option.some(message.body * 10)),
          onFailure: () => Effect.void
        }).pipe(Effect.provideService(MailboxResolver, resolver))
        const logs = yield* logged(
          loop.run({ maxIterations: 1, maxMessages: 10, visibilityTimeout: "1 second", waitTime: 0 })
        )
        expect(yield* responses.receive({ maxMessages: 10 })).toEqual([])
        expect(logs.filter((line) => line.includes("this delivery lost its lease"))).toHaveLength(3)
        const taken = yield* Ref.get(stolen)
        expect(bodies(taken)).toEqual([1, 2, 3])
        const outcomes = yield* settleAll(taken.map((message) => ({ message, reply: Option.some(message.body * 100) })))
          .pipe(Effect.provideService(MailboxResolver, resolver))
        expect(outcomes.every(Either.isRight)).toBe(true)
        expect(bodies(yield* responses.receive({ maxMessages: 10 }))).toEqual([100, 200, 300])
        expect(yield* requests.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("the same delivery twice in one batch: one outcome settles it, the other is refused; one reply", () =>
      Effect.gen(function*() {
        const { requests, resolver, responses } = yield* setup
        yield* requests.send(0, { replyTo: "responses" })
        const [warm] = yield* requests.receive()
        yield* warm!.replyAndAcknowledge(0).pipe(Effect.provideService(MailboxResolver, resolver))
        yield* responses.receive()
        yield* requests.send(7, { replyTo: "responses" })
        yield* requests.send(8)
        const [seven, eight] = yield* requests.receive({ maxMessages: 10 })
        const outcomes = yield* settleAll([
          { message: seven!, reply: Option.some(70) },
          { message: eight!, reply: Option.none() },
          { message: seven!, reply: Option.some(71) },
          { message: eight!, reply: Option.none() }
        ]).pipe(Effect.provideService(MailboxResolver, resolver))
        expect(outcomes.map(Either.isRight)).toEqual([true, true, false, false])
        expect(Either.getLeft(outcomes[2]!).pipe(Option.map((error) => error._tag))).toEqual(
          Option.some("ReceiptHandleExpiredError")
        )
        expect(bodies(yield* responses.receive({ maxMessages: 10 }))).toEqual([70])
        expect(yield* requests.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("a row the store refuses in the middle of a batch fails alone: the others commit, it comes back", () =>
      Effect.gen(function*() {
        const { prefix, requests, resolver } = yield* setup
        const sql = yield* SqlClient.SqlClient
        const table = `${prefix}mailbox_messages`
        // The store refuses to delete the message whose body is 7 (a trigger): its row fails, the batch's others not.
        if (backend.label === "SQLite") {
          yield* sql.unsafe(
            `CREATE TRIGGER ${prefix}refuse BEFORE DELETE ON ${table} WHEN OLD.body = '7' ` +
              `BEGIN SELECT RAISE(ABORT, 'refused'); END`
          )
        } else {
          yield* sql.unsafe(
            `CREATE FUNCTION ${prefix}refuse() RETURNS trigger LANGUAGE plpgsql AS ` +
              `$$ BEGIN RAISE EXCEPTION 'refused'; END $$`
          )
          yield* sql.unsafe(
            `CREATE TRIGGER ${prefix}refuse BEFORE DELETE ON ${table} FOR EACH ROW WHEN (OLD.body = '7') ` +
              `EXECUTE FUNCTION ${prefix}refuse()`
          )
        }
        for (const n of [6, 7, 8, 9]) yield* requests.send(n)
        const loop = yield* MailboxWorker.make({
          name: "refused",
          mailbox: requests,
          handle: () => Effect.void,
          onSuccess: () => Effect.succeedNone,
          onFailure: () => Effect.void
        }).pipe(Effect.provideService(MailboxResolver, resolver))
        const logs = yield* logged(
          loop.run({ maxIterations: 1, maxMessages: 10, visibilityTimeout: "1 second", waitTime: 0 })
        )
        expect(logs.filter((line) => line.includes("acknowledge of") && line.includes("failed"))).toHaveLength(1)
        expect(yield* requests.approximateCount).toBe(1)
        yield* TestClock.adjust("2 seconds")
        expect((yield* requests.receive({ maxMessages: 10 })).map((m) => m.body)).toEqual([7])
      }).pipe(onDb))

    it.scoped("a settleAll interrupted while it waits: its rows still commit, and the group commit goes on", () =>
      Effect.gen(function*() {
        const { requests, resolver } = yield* setup
        for (const n of [1, 2, 3]) yield* requests.send(n)
        const received = yield* requests.receive({ maxMessages: 10 })
        const fiber = yield* Effect.fork(
          settleAll(received.map((message) => ({ message, reply: Option.none<number>() }))).pipe(
            Effect.provideService(MailboxResolver, resolver)
          )
        )
        yield* Effect.yieldNow() // it queues its rows and waits
        yield* Fiber.interrupt(fiber)
        yield* requests.send(4)
        const [four] = yield* requests.receive()
        yield* four!.acknowledge // would wait for ever behind a committer that never started
        expect(yield* requests.approximateCount).toBe(0)
      }).pipe(onDb))
  })
}
