/**
 * MailboxSql: the mailbox contract on SQLite (a temporary file) and on
 * PostgreSQL (a throwaway cluster started for this file), then what only a
 * database can show: replies that commit with the acknowledgement,
 * undecodable rows, dead-letter operations, concurrent receivers and a
 * database that goes away.
 */
import { SqlClient, Statement } from "@effect/sql"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "@effect/vitest"
import {
  Clock,
  ConfigProvider,
  Context,
  DateTime,
  Deferred,
  Effect,
  Either,
  Exit,
  Fiber,
  Layer,
  Option,
  Schedule,
  Schema,
  Scope,
  TestClock
} from "effect"
import { mkdtempSync } from "node:fs"
import { hostname, tmpdir } from "node:os"
import { join } from "node:path"
import { MailboxResolver, parentSpan, settleAll } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import { mailboxContract } from "./contract/MailboxContract.js"
import { captureLogs, refusedOptions, skewedClock } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-mailbox-"))
let tables = 0
let prefix = "t0_"
beforeEach(() => {
  prefix = `t${++tables}_`
})

const suiteScope = Effect.runSync(Scope.make())
// The client with the layer's stores (the mailboxes of a test share one per prefix), without its resolver.
let sqliteContext: Context.Context<SqlClient.SqlClient>
let pgContext: Context.Context<SqlClient.SqlClient>
let sqlite: SqlClient.SqlClient
let pg: SqlClient.SqlClient
let cluster: Postgres.Cluster
const withoutResolver = Context.omit(MailboxResolver)
beforeAll(async () => {
  sqliteContext = await Effect.runPromise(
    Layer.buildWithScope(MailboxSql.layerSqlite({ filename: join(directory, "mailbox.db") }), suiteScope).pipe(
      Effect.map(withoutResolver)
    )
  )
  sqlite = Context.get(sqliteContext, SqlClient.SqlClient)
  cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))
  pgContext = await Effect.runPromise(
    Layer.buildWithScope(MailboxSql.layerPg({ url: cluster.url }), suiteScope).pipe(Effect.map(withoutResolver))
  )
  pg = Context.get(pgContext, SqlClient.SqlClient)
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const backends = [
  { label: "SQLite", client: () => sqlite, context: () => sqliteContext },
  { label: "PostgreSQL", client: () => pg, context: () => pgContext }
] as const

for (const backend of backends) {
  mailboxContract(
    `SQL on ${backend.label}`,
    (options) =>
      MailboxSql.make<string, string, string, string>({ ...options, schema: Schema.String, prefix }).pipe(
        Effect.provide(backend.context())
      ),
    // In the database, as `leasehold mailbox pause` sets it.
    {
      pause: (mailbox) =>
        MailboxSqlAdmin.queues({ prefix }).pipe(
          Effect.flatMap((queues) => queues.pause(mailbox.name)),
          Effect.provideService(SqlClient.SqlClient, backend.client())
        ),
      resume: (mailbox) =>
        MailboxSqlAdmin.queues({ prefix }).pipe(
          Effect.flatMap((queues) => queues.resume(mailbox.name)),
          Effect.provideService(SqlClient.SqlClient, backend.client())
        )
    }
  )
}

const Job = Schema.Struct({ n: Schema.Number })
const provide = (context: () => Context.Context<SqlClient.SqlClient>) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provide(effect, context())

for (const backend of backends) {
  const onDb = provide(backend.context)
  describe(`MailboxSql on ${backend.label}`, () => {
    it.scoped("a stored body that no longer decodes is dead-lettered with its error, never delivered", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const bad = yield* jobs.send({ n: 1 })
        yield* jobs.send({ n: 2 })
        const notJson = yield* jobs.send({ n: 3 })
        yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = ${"{\"n\":\"two\"}"}
          WHERE seq = ${Number(bad)}`
        yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = ${"{\"n\": 3"} WHERE seq = ${Number(notJson)}`
        const received = yield* jobs.receive({ maxMessages: 10 })
        expect(received.map((m) => m.body)).toEqual([{ n: 2 }])
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        const [letter, truncated] = yield* letters.list()
        expect(letter!.id).toBe(bad)
        expect(letter!.queue).toBe("jobs")
        expect(letter!.errorTag).toBe("SerializationError")
        expect(letter!.error).toContain("Expected number")
        expect(letter!.deliveryCount).toBe(1)
        expect(truncated!.id).toBe(notJson)
        expect(truncated!.error).toContain("Not JSON")
        expect(yield* jobs.approximateCount).toBe(1)
      }).pipe(onDb))

    it.scoped("a stored traceparent that is not well-formed reads as none; the message is delivered", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        const stored = [
          valid,
          "not a traceparent",
          "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", // upper case
          "00-00000000000000000000000000000000-b7ad6b7169203331-01", // trace id all zeros
          "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", // span id all zeros
          "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", // version ff
          `${valid}-more`, // version 00 with a suffix
          ""
        ]
        for (const [n, traceparent] of stored.entries()) {
          const id = yield* jobs.send({ n })
          yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET traceparent = ${traceparent}
            WHERE seq = ${Number(id)}`
        }
        const received = yield* jobs.receive({ maxMessages: 10 })
        expect(received.map((m) => [m.body.n, m.traceparent])).toEqual(
          stored.map((_, n) => [n, n === 0 ? valid : undefined])
        )
        expect(Option.isNone(parentSpan(received[1]!))).toBe(true)
      }).pipe(onDb))

    it.scoped("a database made before migration 6 gains the traceparent column: old rows read without one", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const messages = sql(`${prefix}mailbox_messages`)
        yield* Effect.scoped(MailboxSql.make({ name: "jobs", schema: Job, prefix }))
        // Back to how migration 5 left a database: no columns, migrations 6 and 7 not recorded, and on
        // PostgreSQL no settle overload that takes trace contexts nor claim overload that takes the receiver.
        yield* sql`DELETE FROM ${sql(`${prefix}mailbox_migrations`)} WHERE migration_id >= 6`
        if (backend.label === "PostgreSQL") {
          yield* sql`DROP FUNCTION ${
            sql(`${prefix}mailbox_settle`)
          }(bigint[], text[], text[], text[], bigint, text, text[])`
          yield* sql`DROP FUNCTION ${sql(`${prefix}mailbox_claim`)}(text, bigint, bigint, integer, text)`
        }
        yield* sql`ALTER TABLE ${messages} DROP COLUMN traceparent`
        yield* sql`ALTER TABLE ${messages} DROP COLUMN received_by`
        yield* sql`ALTER TABLE ${messages} DROP COLUMN extended_at`
        yield* sql`ALTER TABLE ${sql(`${prefix}mailbox_dead_letters`)} DROP COLUMN traceparent`
        yield* sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, reply_to)
          VALUES ('jobs', ${JSON.stringify({ n: 1 })}, 0, 0, 'done')`
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix })
        const done = yield* MailboxSql.make({ name: "done", schema: Job, prefix })
        const [old] = yield* jobs.receive()
        expect([old?.body, old?.traceparent]).toEqual([{ n: 1 }, undefined])
        const traceparent = yield* Effect.zipLeft(
          Effect.map(Effect.currentSpan, (span) => `00-${span.traceId}-${span.spanId}-01`),
          old!.replyAndAcknowledge({ n: 2 })
        ).pipe(Effect.withSpan("upgraded"))
        const [reply] = yield* done.receive()
        expect([reply?.body, reply?.traceparent]).toEqual([{ n: 2 }, traceparent])
      }).pipe(onDb, Effect.provide(MailboxResolver.layer())))

    it.scoped("a delivery records the receiving process; an extension when it happened, a new claim clears it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const row = (id: string) =>
          Effect.map(
            sql<{ received_by: string | null; extended_at: number | string | null }>`SELECT received_by,
              extended_at FROM ${sql(`${prefix}mailbox_messages`)} WHERE seq = ${Number(id)}`,
            (rows) => ({ receivedBy: rows[0]!.received_by, extendedAt: rows[0]!.extended_at })
          )
        const id = yield* jobs.send({ n: 1 })
        expect(yield* row(id)).toEqual({ receivedBy: null, extendedAt: null })
        const [first] = yield* jobs.receive({ visibilityTimeout: "30 seconds" })
        expect(yield* row(id)).toEqual({ receivedBy: `${hostname()}:${process.pid}`, extendedAt: null })
        yield* TestClock.adjust("10 seconds")
        yield* first!.extendVisibility("30 seconds")
        const extended = yield* row(id)
        expect(Number(extended.extendedAt)).toBe(yield* Clock.currentTimeMillis)
        yield* first!.nack()
        yield* jobs.receive()
        expect((yield* row(id)).extendedAt).toBeNull()
      }).pipe(onDb))

    it.scoped("a dead letter keeps its message's trace context, and a redrive puts it back", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        const current = Effect.map(Effect.currentSpan, (span) => `00-${span.traceId}-${span.spanId}-01`)
        // A message that no longer decodes is dead-lettered by the receive, with the context it was sent in.
        const [id, sent] = yield* Effect.zip(jobs.send({ n: 1 }), current).pipe(Effect.withSpan("sender"))
        yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = ${`{"n":"one"}`} WHERE seq = ${Number(id)}`
        expect(yield* jobs.receive()).toEqual([])
        yield* sql`UPDATE ${sql(`${prefix}mailbox_dead_letters`)} SET body = ${`{"n":1}`}`
        expect(yield* letters.redrive()).toBe(1)
        const [redriven] = yield* jobs.receive()
        expect([redriven?.body, redriven?.traceparent]).toEqual([{ n: 1 }, sent])
        yield* redriven!.acknowledge
        // A loop's dead letter is stored in the span it handled the message in.
        const handled = yield* Effect.zipLeft(
          current,
          letters.sink(Job).send({
            messageId: "m1",
            body: { n: 2 },
            sourceMailbox: "jobs",
            deliveryCount: 5,
            lastError: "boom",
            lastErrorTag: "Boom",
            enqueuedAt: DateTime.unsafeMake(0),
            deadLetteredAt: DateTime.unsafeMake(0),
            requestId: undefined,
            replyTo: undefined,
            traceId: undefined
          })
        ).pipe(Effect.withSpan("handle"))
        expect(yield* letters.redrive()).toBe(1)
        const [fromLoop] = yield* jobs.receive()
        expect([fromLoop?.body, fromLoop?.traceparent]).toEqual([{ n: 2 }, handled])
      }).pipe(onDb))

    it.scoped("dead letters: a loop's sink stores them; list, count, redrive and purge", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        const sink = letters.sink(Job)
        const letter = (n: number) => ({
          messageId: `m${n}`,
          body: { n },
          sourceMailbox: "jobs",
          deliveryCount: 5,
          lastError: "boom",
          lastErrorTag: "Boom",
          enqueuedAt: DateTime.unsafeMake(0),
          deadLetteredAt: DateTime.unsafeMake(n),
          requestId: undefined,
          replyTo: undefined,
          traceId: undefined
        })
        for (const n of [1, 2, 3]) yield* sink.send(letter(n))
        yield* sink.send(letter(3)) // stored again after a crash: still one letter
        yield* sink.send({ ...letter(9), sourceMailbox: "other" })
        expect(yield* letters.count()).toBe(4)
        expect(yield* letters.count({ queue: "jobs" })).toBe(3)
        expect((yield* letters.list({ queue: "jobs", limit: 2 })).map((l) => l.id)).toEqual(["m1", "m2"])
        expect(yield* letters.redrive({ queue: "jobs", ids: ["m1", "m2"] })).toBe(2)
        const back = yield* jobs.receive({ maxMessages: 10 })
        expect(back.map((m) => m.body)).toEqual([{ n: 1 }, { n: 2 }])
        expect(back.every((m) => m.deliveryCount === 1)).toBe(true)
        expect(yield* letters.purge({ ids: [] })).toBe(0)
        expect(yield* letters.purge({ queue: "jobs" })).toBe(1)
        expect((yield* letters.list()).map((l) => l.id)).toEqual(["m9"])
      }).pipe(onDb))

    it.scoped("replies reach a queue the resolver does not know when the mailbox has a replySchema", () =>
      Effect.gen(function*() {
        const requests = yield* MailboxSql.make({ name: "requests", schema: Job, replySchema: Job, prefix })
        yield* requests.send({ n: 1 }, { replyTo: "elsewhere" })
        const [message] = yield* requests.receive()
        yield* message!.replyAndAcknowledge({ n: 2 }).pipe(Effect.provide(MailboxResolver.layer()))
        const elsewhere = yield* MailboxSql.make({ name: "elsewhere", schema: Job, prefix })
        expect((yield* elsewhere.receive()).map((m) => m.body)).toEqual([{ n: 2 }])
        expect(yield* requests.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("reply bodies with quotes, backslashes, newlines and non-ASCII text arrive intact, alone or grouped", () =>
      Effect.gen(function*() {
        const Text = Schema.Struct({ text: Schema.String })
        const requests = yield* MailboxSql.make({ name: "requests", schema: Text, replySchema: Text, prefix })
        const responses = yield* MailboxSql.make({ name: "responses", schema: Text, prefix })
        const resolver = MailboxResolver.fromMailboxes(requests, responses)
        const texts = ["say \"hi\"", "C:\\temp\\new", "line 1\nline 2\t{}", "naïve — 東京 🚀", "", "null"]
        for (const text of texts) yield* requests.send({ text }, { replyTo: "responses" })
        const [first, ...rest] = yield* requests.receive({ maxMessages: 10 })
        yield* first!.replyAndAcknowledge({ text: first!.body.text }).pipe(
          Effect.provideService(MailboxResolver, resolver)
        )
        yield* settleAll(rest.map((message) => ({ message, reply: Option.some({ text: message.body.text }) }))).pipe(
          Effect.provideService(MailboxResolver, resolver)
        )
        const replies = yield* responses.receive({ maxMessages: 10 })
        expect(replies.map((m) => m.body.text)).toEqual(texts)
        expect(yield* requests.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("grouped sends and a grouped settle give each item its own id: the ids the receivers see", () =>
      Effect.gen(function*() {
        const requests = yield* MailboxSql.make({ name: "requests", schema: Job, replySchema: Job, prefix })
        const responses = yield* MailboxSql.make({ name: "responses", schema: Job, prefix })
        const resolver = MailboxResolver.fromMailboxes(requests, responses)
        // Sent concurrently, so they commit together; one without a replyTo, one delayed.
        const sent = yield* Effect.all(
          [1, 2, 3, 4, 5].map((n) =>
            requests.send({ n }, n === 4 ? { delay: "1 minute" } : n === 2 ? {} : { replyTo: "responses" })
          ),
          { concurrency: "unbounded" }
        )
        expect(new Set(sent).size).toBe(5)
        const first = yield* requests.receive({ maxMessages: 10, visibilityTimeout: "1 second" })
        expect(first.map((m) => m.body.n)).toEqual([1, 2, 3, 5])
        yield* TestClock.adjust("2 seconds")
        const received = yield* requests.receive({ maxMessages: 10 })
        expect(received.map((m) => [m.id, m.body.n])).toEqual([[sent[0], 1], [sent[1], 2], [sent[2], 3], [
          sent[4],
          5
        ]])
        // Settled as one group, with the first delivery of the first message, stale since it timed out.
        const outcomes = yield* settleAll(
          [first[0]!, ...received].map((message) => ({ message, reply: Option.some({ n: message.body.n * 10 }) }))
        ).pipe(Effect.provideService(MailboxResolver, resolver))
        expect(outcomes.map(Either.isRight)).toEqual([false, true, true, true, true])
        const replies = yield* responses.receive({ maxMessages: 10 })
        // The redelivery of the first message was settled in a statement of its own, after the others.
        expect(replies.map((m) => m.body.n)).toEqual([30, 50, 10])
        // Each settled delivery learns its reply's id; the one without a replyTo has none.
        expect(outcomes.slice(1).map((outcome) => Either.getOrUndefined(outcome))).toEqual([
          replies[2]!.id,
          undefined,
          replies[0]!.id,
          replies[1]!.id
        ])
      }).pipe(onDb))

    it.scoped("the resolver finds mailboxes made in this process on the same database", () =>
      Effect.gen(function*() {
        const requests = yield* MailboxSql.make<{ readonly n: number }, { readonly n: number }, { readonly n: number }>(
          { name: "requests", schema: Job, prefix }
        )
        const responses = yield* MailboxSql.make({ name: "responses", schema: Job, prefix })
        const resolver = yield* MailboxSql.resolver({ prefix })
        expect((yield* resolver.resolve("responses")).name).toBe("responses")
        expect((yield* Effect.flip(resolver.resolve("nobody")))._tag).toBe("MailboxResolutionError")
        yield* requests.send({ n: 1 }, { replyTo: "responses" })
        const [message] = yield* requests.receive()
        yield* message!.replyAndAcknowledge({ n: 3 }).pipe(Effect.provideService(MailboxResolver, resolver))
        expect((yield* responses.receive()).map((m) => m.body)).toEqual([{ n: 3 }])
      }).pipe(onDb))

    it.scoped("8 concurrent receivers never get the same message; 8 concurrent acks of one: exactly one wins", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        for (let n = 0; n < 200; n++) yield* jobs.send({ n })
        const seen: Array<number> = []
        yield* Effect.all(
          Array.from({ length: 8 }, () =>
            Effect.gen(function*() {
              for (;;) {
                const batch = yield* jobs.receive({ maxMessages: 3, visibilityTimeout: "10 minutes" })
                if (batch.length === 0) return
                for (const message of batch) seen.push(message.body.n)
              }
            })),
          { concurrency: "unbounded", discard: true }
        )
        expect(seen.length).toBe(200)
        expect(new Set(seen).size).toBe(200)

        yield* jobs.purge
        yield* jobs.send({ n: 1 })
        const [message] = yield* jobs.receive()
        const acks = yield* Effect.all(Array.from({ length: 8 }, () => Effect.either(message!.acknowledge)), {
          concurrency: "unbounded"
        })
        expect(acks.filter(Either.isRight).length).toBe(1)
        expect(acks.filter(Either.isLeft).every((e) => e.left._tag === "ReceiptHandleExpiredError")).toBe(true)
      }).pipe(onDb))

    it.live("a receive interrupted around its claim loses nothing: the message is returned or visible again", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        for (let n = 0; n < 30; n++) {
          const receiving = yield* Effect.fork(jobs.receive({ waitTime: "20 seconds", visibilityTimeout: "1 hour" }))
          yield* Effect.sleep(`${n % 3} millis`)
          yield* jobs.send({ n })
          yield* Effect.sleep(`${n % 5} millis`)
          const exit = yield* Fiber.interrupt(receiving)
          const taken = Exit.isSuccess(exit) ? exit.value : yield* jobs.receive()
          expect(taken.map((m) => [m.body.n, m.deliveryCount])).toEqual([[n, 1]])
          yield* taken[0]!.acknowledge
        }
      }).pipe(onDb, Effect.scoped))

    it.scoped("bad options are refused with a ParseError naming them", () =>
      Effect.gen(function*() {
        const refused = (options: MailboxSql.Options<{ n: number }, { readonly n: number }, never, never>) =>
          Effect.map(Effect.flip(MailboxSql.make(options)), refusedOptions)
        expect(yield* refused({ name: "", schema: Job })).toEqual(["name"])
        expect(yield* refused({ name: "jobs", schema: Job, maxSize: 0 })).toEqual(["maxSize"])
        expect(yield* refused({ name: "jobs", schema: Job, prefix: "1; DROP TABLE x" })).toEqual(["prefix"])
        // PostgreSQL folds names to lower case, and cuts them at 63 characters: both are refused up front.
        expect(yield* refused({ name: "jobs", schema: Job, prefix: "Jobs_" })).toEqual(["prefix"])
        expect(yield* refused({ name: "jobs", schema: Job, prefix: "p".repeat(38) })).toEqual(["prefix"])
        yield* MailboxSql.make({ name: "jobs", schema: Job, prefix: "p".repeat(37) }) // the longest that fits
        // A queue name a PostgreSQL notification cannot carry.
        expect(yield* refused({ name: "a\u0000b", schema: Job })).toEqual(["name"])
        expect(yield* refused({ name: "q".repeat(201), schema: Job })).toEqual(["name"])
        expect(yield* refused({ name: "jobs", schema: Job, pollInterval: "2 minutes" })).toEqual(["pollInterval"])
        // Every bad option at once, each with what is allowed.
        const all = yield* Effect.flip(MailboxSql.make({ name: "", schema: Job, maxSize: -1, prefix: "X" }))
        expect(refusedOptions(all)).toEqual(["name", "maxSize", "prefix"])
        expect(all.message).toContain("MailboxSql.make options")
        expect(all.message).toContain("must be a positive integer")
        expect(all.message).toContain("must be lower-case letters, digits and underscores")
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const error = yield* Effect.flip(jobs.send({ n: "x" } as unknown as { n: number }))
        expect(error._tag).toBe("SerializationError")
        // A body the schema accepts but JSON cannot hold is refused too, and nothing is stored.
        const anything = yield* MailboxSql.make({ name: "anything", schema: Schema.Unknown, prefix })
        const notJson = yield* Effect.flip(anything.send(10n))
        expect(notJson._tag).toBe("SerializationError")
        expect(notJson.message).toContain("Not JSON")
        expect(yield* anything.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped(
      "a body over maxBodyBytes is refused at send; sends worth several batches commit, and the queue goes on",
      () =>
        Effect.gen(function*() {
          const blobs = yield* MailboxSql.make({ name: "blobs", schema: Schema.String, prefix })
          const tooBig = yield* Effect.flip(blobs.send("x".repeat(MailboxSql.defaultMaxBodyBytes)))
          expect(tooBig._tag).toBe("SerializationError")
          expect(tooBig.message).toContain(`more than this queue's maxBodyBytes (${MailboxSql.defaultMaxBodyBytes})`)
          expect(yield* blobs.approximateCount).toBe(0)
          // 8 concurrent sends of 10 MB: more than one grouped statement should carry, so they are split.
          const big = yield* MailboxSql.make({ name: "big", schema: Schema.String, prefix, maxBodyBytes: 12_000_000 })
          const sent = yield* Effect.forEach(
            Array.from({ length: 8 }, (_, i) => String(i).repeat(10_000_000)),
            (body) => big.send(body),
            { concurrency: "unbounded" }
          )
          expect(new Set(sent).size).toBe(8)
          yield* big.send("small").pipe(Effect.timeoutFail({ duration: "1 second", onTimeout: () => "wedged" }))
          expect(yield* big.approximateCount).toBe(9)
          yield* big.purge
          const bad = yield* Effect.flip(MailboxSql.make({ name: "x", schema: Schema.String, prefix, maxBodyBytes: 0 }))
          expect(refusedOptions(bad)).toEqual(["maxBodyBytes"])
        }).pipe(onDb),
      120_000
    )

    it.scoped("a number JSON cannot hold (NaN, ±Infinity) is refused at send, naming where it is; nothing is stored", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "numbers", schema: Job, prefix })
        const nan = yield* Effect.flip(jobs.send({ n: Number.NaN }))
        expect(nan._tag).toBe("SerializationError")
        expect(nan.message).toContain("NaN at .n has no JSON form")
        const nested = yield* MailboxSql.make({ name: "nested", schema: Schema.Unknown, prefix })
        const infinity = yield* Effect.flip(nested.send({ scores: [1, null, Number.POSITIVE_INFINITY] }))
        expect(infinity.message).toContain("Infinity at .scores[2] has no JSON form")
        expect(yield* jobs.approximateCount).toBe(0)
        expect(yield* nested.approximateCount).toBe(0)
        // A real null is fine.
        yield* nested.send({ scores: [1, null] })
        expect((yield* nested.receive()).map((m) => m.body)).toEqual([{ scores: [1, null] }])
      }).pipe(onDb))
  })
}

describe("MailboxSql long polls across clients (another process, as far as the database can tell)", () => {
  // A second client on the same database; the waiting receiver's own process never sends, so only
  // NOTIFY (PostgreSQL) or polling (SQLite) can wake it before its 20 s wait ends.
  const otherClient = (layer: Layer.Layer<MailboxSql.Services, unknown>) =>
    Layer.build(Layer.fresh(layer)).pipe(Effect.map(Context.get(SqlClient.SqlClient)))

  it.live(
    "PostgreSQL: a send from another client wakes a receiver through LISTEN/NOTIFY, not polling",
    () =>
      Effect.gen(function*() {
        const waiting = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix, pollInterval: "1 minute" })
        const receiving = yield* Effect.fork(waiting.receive({ waitTime: "20 seconds" }))
        yield* Effect.sleep("300 millis") // the receiver is asleep in its long poll
        const other = yield* otherClient(MailboxSql.layerPg({ url: cluster.url }))
        const sender = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix }).pipe(
          Effect.provideService(SqlClient.SqlClient, other)
        )
        yield* sender.send({ n: 7 })
        const received = yield* Fiber.join(receiving).pipe(Effect.timeout("10 seconds"))
        expect(received.map((m) => m.body)).toEqual([{ n: 7 }])
      }).pipe(Effect.provide(pgContext), Effect.scoped),
    30_000
  )

  it.live(
    "PostgreSQL: replies settled by another client wake a receiver of the reply queue",
    () =>
      Effect.gen(function*() {
        const done = yield* MailboxSql.make({ name: "done", schema: Job, prefix, pollInterval: "1 minute" })
        const receiving = yield* Effect.fork(done.receive({ waitTime: "20 seconds", maxMessages: 10 }))
        yield* Effect.sleep("300 millis") // the receiver is asleep in its long poll
        const other = yield* otherClient(MailboxSql.layerPg({ url: cluster.url }))
        const worker = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix }).pipe(
          Effect.provideService(SqlClient.SqlClient, other)
        )
        yield* Effect.forEach([1, 2, 3], (n) => worker.send({ n }, { replyTo: "done" }), { discard: true })
        const requests = yield* worker.receive({ waitTime: 0, maxMessages: 10 })
        const outcomes = yield* settleAll(requests.map((message) => ({
          message,
          reply: Option.some({ n: message.body.n * 10 })
        }))).pipe(Effect.provide(MailboxResolver.layer()))
        expect(outcomes.every(Either.isRight)).toBe(true)
        const received = yield* Fiber.join(receiving).pipe(Effect.timeout("10 seconds"))
        expect(received.length).toBeGreaterThan(0)
        const replies = [
          ...received.map((m) => m.body.n),
          ...(yield* done.receive({ waitTime: 0, maxMessages: 10 })).map((m) => m.body.n)
        ]
        expect(replies.sort((a, b) => a - b)).toEqual([10, 20, 30])
      }).pipe(Effect.provide(pgContext), Effect.scoped),
    30_000
  )

  it.live(
    "PostgreSQL: idle receivers of a queue share one look-up of when its next message is visible",
    () =>
      Effect.gen(function*() {
        const lookUps: Array<string> = []
        const countLookUps: Statement.Statement.Transformer = (statement) =>
          Effect.sync(() => {
            const [text] = statement.compile()
            if (text.includes("min(visible_at)")) lookUps.push(text)
            return statement
          })
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix, pollInterval: "1 minute" })
        yield* jobs.send({ n: 1 }, { delay: "1 minute" })
        const receivers = yield* Effect.forEach(
          Array.from({ length: 8 }),
          () => Effect.fork(Statement.withTransformer(jobs.receive({ waitTime: "20 seconds" }), countLookUps)),
          { concurrency: "unbounded" }
        )
        yield* Effect.sleep("300 millis") // all eight found the queue empty and sleep until the next visible time
        expect(lookUps).toHaveLength(1)
        yield* Effect.forEach(receivers, Fiber.interrupt, { discard: true })
      }).pipe(Effect.provide(pgContext), Effect.scoped),
    30_000
  )

  it.live("SQLite: a send from another client reaches a waiting receiver by polling", () =>
    Effect.gen(function*() {
      const waiting = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
      const receiving = yield* Effect.fork(waiting.receive({ waitTime: "20 seconds" }))
      yield* Effect.sleep("300 millis")
      const other = yield* otherClient(MailboxSql.layerSqlite({ filename: join(directory, "mailbox.db") }))
      const sender = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix }).pipe(
        Effect.provideService(SqlClient.SqlClient, other)
      )
      yield* sender.send({ n: 8 })
      const received = yield* Fiber.join(receiving).pipe(Effect.timeout("10 seconds"))
      expect(received.map((m) => m.body)).toEqual([{ n: 8 }])
    }).pipe(Effect.provide(sqliteContext), Effect.scoped), 30_000)
})

describe("MailboxSql layers", () => {
  it.effect("a SQLite file that cannot be opened is a MailboxConnectionError naming it", () =>
    Effect.gen(function*() {
      const filename = join(directory, "missing", "dir", "mailbox.db")
      const error = yield* Effect.flip(Effect.scoped(Layer.build(MailboxSql.layerSqlite({ filename }))))
      expect(error._tag).toBe("MailboxConnectionError")
      expect(error.message).toContain(filename)
    }))

  it.live("layerPg opens minConnections connections when it starts; bad pool sizes are a ParseError naming them", () =>
    Effect.gen(function*() {
      // Counted by application name, so other tests' connections coming and going cannot change the count.
      const url = `${cluster.url}?application_name=pool_size_test`
      const sessions = pg<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE application_name = 'pool_size_test'`.pipe(Effect.map((rows) => rows[0]!.n))
      expect(yield* sessions).toBe(0)
      yield* Layer.build(Layer.fresh(MailboxSql.layerPg({ url, minConnections: 3 })))
      expect(yield* sessions).toBe(3)
      for (
        const [options, parameter] of [
          [{ maxConnections: 0 }, "maxConnections"],
          [{ minConnections: -1 }, "minConnections"],
          [{ maxConnections: 2, minConnections: 3 }, "minConnections"],
          [{ minConnections: 1.5 }, "minConnections"]
        ] as const
      ) {
        const error = yield* Effect.flip(Layer.build(MailboxSql.layerPg({ url: cluster.url, ...options })))
        expect(refusedOptions(error)).toEqual([parameter])
      }
    }).pipe(Effect.scoped))

  it.effect("layerPg without a url reads LEASEHOLD_DATABASE_URL and says so when it is missing", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(
        Effect.scoped(Layer.build(MailboxSql.layerPg())).pipe(
          Effect.withConfigProvider(ConfigProvider.fromMap(new Map()))
        )
      )
      expect(String(error)).toContain("DATABASE_URL")
    }))
})

describe("MailboxSql lane on PostgreSQL", () => {
  // Sessions counted by application name, so other tests' connections coming and going cannot change the count.
  const sessions = (application: string) =>
    pg<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE application_name = ${application}`.pipe(Effect.map((rows) => rows[0]!.n))
  /** The count once it is `n` (connections open and end in the background), or the last count after 5 s. */
  const sessionsReach = (application: string, n: number) =>
    sessions(application).pipe(
      Effect.filterOrFail((count) => count === n, (count) => count),
      Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
      Effect.merge
    )

  /** The count once it is at most `n`, or the last count after 5 s. */
  const sessionsAtMost = (application: string, n: number) =>
    sessions(application).pipe(
      Effect.filterOrFail((count) => count <= n, (count) => count),
      Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
      Effect.merge
    )

  it.live(
    "claims, acknowledgements and sends run on one connection of the store's own, which closes with its last mailbox",
    () =>
      Effect.gen(function*() {
        const url = `${cluster.url}?application_name=lane_test`
        const context = yield* Layer.build(
          Layer.fresh(MailboxSql.layerPg({ url, maxConnections: 1, minConnections: 1 }))
        )
        const sql = Context.get(context, SqlClient.SqlClient)
        const mailboxes = yield* Scope.make()
        const [jobs, done] = yield* Effect.all([
          MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix }),
          MailboxSql.make({ name: "done", schema: Job, prefix })
        ]).pipe(Effect.provide(context), Scope.extend(mailboxes))
        yield* jobs.send({ n: 1 }, { replyTo: "done" })
        // The pool's one connection, LISTEN's, and the lane's.
        expect(yield* sessionsReach("lane_test", 3)).toBe(3)

        // The application holds the pool's only connection in a transaction; the mailboxes go on without it.
        const gate = yield* Deferred.make<void>()
        const holding = yield* Effect.fork(sql.withTransaction(Effect.zipRight(sql`SELECT 1`, Deferred.await(gate))))
        yield* Effect.all([jobs.send({ n: 2 }, { replyTo: "done" }), jobs.send({ n: 3 }, { replyTo: "done" })], {
          concurrency: "unbounded"
        })
        const received = yield* jobs.receive({ maxMessages: 10, waitTime: 0 })
        expect(received.map((message) => message.body.n).sort()).toEqual([1, 2, 3])
        const outcomes = yield* settleAll(received.map((message) => ({
          message,
          reply: Option.some({ n: message.body.n * 10 })
        })))
        expect(outcomes.every(Either.isRight)).toBe(true)
        const replies = yield* done.receive({ maxMessages: 10, waitTime: 0 })
        expect(replies.map((message) => message.body.n).sort((a, b) => a - b)).toEqual([10, 20, 30])
        yield* Effect.forEach(replies, (message) => message.acknowledge, { discard: true })
        expect(yield* sessions("lane_test")).toBe(3)
        yield* Deferred.succeed(gate, undefined)
        yield* Fiber.join(holding)

        yield* Scope.close(mailboxes, Exit.void)
        // LISTEN's and the lane's sessions end; the pool's own may stay or be recycled by the pool (a CI run under
        // load saw it gone too), which is the pool's business, not the mailbox's.
        expect(yield* sessionsAtMost("lane_test", 1)).toBeLessThanOrEqual(1)
      }).pipe(Effect.provide(MailboxResolver.layer()), Effect.scoped),
    30_000
  )

  it.live(
    "the application holding every pooled connection does not starve a working message's extensions",
    () =>
      Effect.gen(function*() {
        const sql = Context.get(
          yield* Layer.build(
            Layer.fresh(MailboxSql.layerPg({ url: cluster.url, maxConnections: 2, minConnections: 2 }))
          ),
          SqlClient.SqlClient
        )
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix }).pipe(
          Effect.provideService(SqlClient.SqlClient, sql)
        )
        yield* jobs.send({ n: 1 })
        // The application takes both pooled connections and keeps them for the whole run.
        const gate = yield* Deferred.make<void>()
        const holders = yield* Effect.forEach([1, 2], () =>
          Effect.fork(sql.withTransaction(Effect.zipRight(sql`SELECT pg_sleep(0)`, Deferred.await(gate)))))
        yield* Effect.sleep("200 millis")
        let executions = 0
        let seenByOthers = 0
        const loop = yield* MailboxWorker.make({
          name: "starved?",
          mailbox: jobs,
          // 10 s of work against a 1 s visibility, the pool held throughout: the message stays leased only if
          // every extension gets through.
          handle: (_message, heartbeat) =>
            Effect.gen(function*() {
              executions++
              for (let step = 0; step < 50; step++) {
                yield* heartbeat.beat
                yield* Effect.sleep("200 millis")
                seenByOthers += (yield* jobs.receive({ waitTime: 0 })).length
              }
            }),
          onSuccess: () =>
            Effect.succeedNone,
          onFailure: () => Effect.void,
          leaseExtender: { interval: "200 millis", extension: "1 second" }
        })
        yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 second" })
        expect([executions, seenByOthers]).toEqual([1, 0])
        // A nack needs no pooled connection either.
        yield* jobs.send({ n: 2 })
        const [second] = yield* jobs.receive({ visibilityTimeout: "1 hour" })
        yield* second!.nack(0).pipe(Effect.timeoutFail({ duration: "2 seconds", onTimeout: () => "nack starved" }))
        expect((yield* jobs.receive()).map((m) => [m.body.n, m.deliveryCount])).toEqual([[2, 2]])
        yield* Deferred.succeed(gate, undefined)
        yield* Fiber.joinAll(holders)
      }).pipe(Effect.provide(MailboxResolver.layer()), Effect.scoped),
    30_000
  )

  it.live("a lane connection the server ends is replaced: the mailbox goes on", () =>
    Effect.gen(function*() {
      const sql = Context.get(
        yield* Layer.build(Layer.fresh(MailboxSql.layerPg({ url: `${cluster.url}?application_name=lane_end_test` }))),
        SqlClient.SqlClient
      )
      const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix }).pipe(
        Effect.provideService(SqlClient.SqlClient, sql)
      )
      yield* jobs.send({ n: 1 })
      // The lane is the one session whose last statement was a send.
      const lane = yield* pg<{ pid: number }>`SELECT pid FROM pg_stat_activity
        WHERE application_name = 'lane_end_test' AND query LIKE 'WITH input AS MATERIALIZED%'`
      expect(lane.length).toBe(1)
      yield* pg`SELECT pg_terminate_backend(${lane[0]!.pid})`
      const gone = pg<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ${lane[0]!.pid}`
      yield* gone.pipe(
        Effect.filterOrFail((rows) => rows[0]!.n === 0, () => "still there"),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 })
      )
      // The statements that find the connection dead fail (MailboxConnectionError) and send nothing; the pool
      // drops it, and the next statement gets a new one.
      const sent = yield* jobs.send({ n: 2 }).pipe(
        Effect.tapError((error) => Effect.sync(() => expect(error._tag).toBe("MailboxConnectionError"))),
        Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 5 }),
        Effect.either
      )
      expect(Either.isRight(sent)).toBe(true)
      const received = yield* jobs.receive({ maxMessages: 10, waitTime: 0 })
      expect(received.map((message) => message.body.n)).toEqual([1, 2])
    }).pipe(Effect.scoped), 30_000)
})

describe("MailboxSql on PostgreSQL judges leases by the database's clock", () => {
  it.live("a worker 2 minutes ahead and one 2 minutes behind: none steals an in-flight message, none misses one", () =>
    Effect.gen(function*() {
      const open = (skew: number) =>
        MailboxSql.make({ name: "skewed", schema: Job, prefix }).pipe(
          Effect.provide(pgContext),
          Effect.withClock(skewedClock(skew))
        )
      const ahead = yield* open(2 * 60_000)
      const behind = yield* open(-2 * 60_000)
      // Sent by the one ahead, seen at once by the one behind (judged by its own clock it was 4 minutes off).
      yield* ahead.send({ n: 1 })
      const [message] = yield* behind.receive({ visibilityTimeout: "60 seconds" })
      expect(message?.body).toEqual({ n: 1 })
      // In flight for 60 s: the one ahead must not take it (by its own clock it expired a minute ago).
      expect(yield* ahead.receive({ maxMessages: 10 })).toEqual([])
      // The holder's acknowledgement finds its lease.
      yield* message!.acknowledge
      expect(yield* ahead.approximateCount).toBe(0)
      // And the other way round: sent behind, received ahead, the one behind cannot steal it.
      yield* behind.send({ n: 2 })
      const [second] = yield* ahead.receive({ visibilityTimeout: "60 seconds" })
      expect(second?.body).toEqual({ n: 2 })
      expect(yield* behind.receive({ maxMessages: 10 })).toEqual([])
      yield* second!.extendVisibility("60 seconds")
      yield* second!.acknowledge
    }).pipe(Effect.provide(MailboxResolver.layer()), Effect.scoped))
})

describe("MailboxSql migrations on PostgreSQL", () => {
  it.effect("a database made before migration 4 gets the PL/pgSQL claim and settle functions (5's settle) and works", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const old = "upgraded_"
      const language = sql<{ name: string; language: string }>`SELECT p.proname AS name, l.lanname AS language
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
        WHERE p.proname IN (${old + "mailbox_claim"}, ${old + "mailbox_settle"}) ORDER BY p.proname`
      yield* MailboxSql.make({ name: "jobs", schema: Job, prefix: old })
      // Back to how migration 3 left a database: its functions in plain SQL, migrations 4 to 7 not recorded.
      yield* sql`DELETE FROM upgraded_mailbox_migrations WHERE migration_id >= 4`
      yield* sql`DROP FUNCTION upgraded_mailbox_settle(bigint[], text[], text[], text[], bigint, text, text[])`
      yield* sql`DROP FUNCTION upgraded_mailbox_claim(text, bigint, bigint, integer, text)`
      yield* sql`ALTER TABLE upgraded_mailbox_messages DROP COLUMN traceparent, DROP COLUMN received_by,
        DROP COLUMN extended_at`
      yield* sql`ALTER TABLE upgraded_mailbox_dead_letters DROP COLUMN traceparent`
      yield* sql`CREATE OR REPLACE FUNCTION upgraded_mailbox_claim(
          p_queue text, p_now bigint, p_visible_at bigint, p_max integer)
        RETURNS SETOF upgraded_mailbox_messages LANGUAGE sql VOLATILE
        AS $$ SELECT * FROM upgraded_mailbox_messages WHERE false $$`
      expect((yield* language).map((row) => row.language)).toEqual(["sql", "plpgsql"])
      const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix: old })
      yield* MailboxSql.make({ name: "done", schema: Job, prefix: old })
      // Two settles: 5's, which a process of the previous version still calls, and 6's, which stores each
      // reply's trace context; two claims likewise: 4's, and 7's, which records the receiver.
      expect(yield* language).toEqual([
        { name: "upgraded_mailbox_claim", language: "plpgsql" },
        { name: "upgraded_mailbox_claim", language: "plpgsql" },
        { name: "upgraded_mailbox_settle", language: "plpgsql" },
        { name: "upgraded_mailbox_settle", language: "plpgsql" }
      ])
      // Migration 5's settle: one NOTIFY per reply queue (6's too).
      const settles = yield* sql<{ source: string; args: number }>`SELECT prosrc AS source, pronargs AS args
        FROM pg_proc WHERE proname = ${old + "mailbox_settle"} ORDER BY pronargs`
      expect(settles.map((settle) => Number(settle.args))).toEqual([6, 7])
      for (const settle of settles) expect(settle.source).toContain("DISTINCT unnest(p_reply_queues)")
      yield* jobs.send({ n: 1 }, { replyTo: "done" })
      const [message] = yield* jobs.receive({ waitTime: 0 })
      expect(message?.body).toEqual({ n: 1 })
      yield* message!.replyAndAcknowledge({ n: 2 })
      expect(yield* jobs.approximateCount).toBe(0)
    }).pipe(
      Effect.provide(pgContext),
      Effect.provide(MailboxResolver.layer()),
      Effect.scoped
    ))
})

// Last in the file: it stops the shared cluster (and starts it again).
describe("MailboxSql when PostgreSQL goes away", () => {
  it.live(
    "receive fails MailboxConnectionError; a MainLoop retries with backoff and recovers when it is back",
    () =>
      Effect.gen(function*() {
        const logs = captureLogs()
        const requests = yield* MailboxSql.make({
          name: "requests",
          schema: MainLoop.requestSchema(Schema.Number),
          replySchema: MainLoop.resultSchema(Schema.Number),
          prefix
        })
        const responses = yield* MailboxSql.make({
          name: "responses",
          schema: MainLoop.resultSchema(Schema.Number),
          prefix
        })
        const loop = yield* MainLoop.make({ requests, execute: (n: number) => Effect.succeed(n + 1) }).pipe(
          Effect.provide(MailboxResolver.layer())
        )
        yield* Effect.forkScoped(loop.run({ waitTime: "1 second" }).pipe(Effect.provide(logs.layer)))
        yield* Effect.sleep("200 millis")

        yield* cluster.stop
        const error = yield* Effect.flip(requests.receive())
        expect(error._tag).toBe("MailboxConnectionError")
        expect(error.message).toContain("requests")
        yield* Effect.sleep("2 seconds") // the loop keeps failing meanwhile, and says so
        expect(logs.lines.some((line) => line.message.includes("Receive failed; retrying with backoff"))).toBe(true)

        yield* cluster.start
        yield* requests.send(MainLoop.request(41), { replyTo: "responses" }).pipe(
          Effect.retry({ schedule: Schedule.spaced("200 millis"), times: 50 })
        )
        const [reply] = yield* responses.receive({ waitTime: "20 seconds" })
        expect(reply!.body.output).toBe(42)
        yield* loop.shutdown()
      }).pipe(Effect.provide(pgContext), Effect.scoped),
    60_000
  )
})
