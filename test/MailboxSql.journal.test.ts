/**
 * The step journal on SQLite and PostgreSQL (`internal/mailbox/sql/journal.ts`): steps load in the order they
 * were recorded; only the delivery that holds the message records (a stale one gets `ReceiptHandleExpiredError`
 * and writes nothing); the journal goes with the acknowledgement (alone, with a reply, in a group settle) unless
 * kept, stays through a nack or an expiry, goes with a purge; concurrent appends of many deliveries land
 * together, a stale one failing alone; retention prunes only journals whose message is gone; the operator reads
 * a journal by message id or request id (`MailboxSqlAdmin.journal`, `leasehold mailbox journal`), and the
 * console's message and dead-letter pages show it, escaped.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { DateTime, Deferred, Effect, Either, Fiber, Option, Ref, Schema, TestClock } from "effect"
import { createHash } from "node:crypto"
import * as InnerLoop from "../src/InnerLoop.js"
import { journalOf, type StoredStep } from "../src/internal/journal.js"
import * as Schema_ from "../src/internal/mailbox/sql/schema.js"
import * as Store from "../src/internal/mailbox/sql/store.js"
import * as Sql from "../src/internal/sql/common.js"
import { type Mailbox, MailboxResolver, type Message, settleAll } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import * as Retention from "../src/Retention.js"
import * as Tool from "../src/Tool.js"
import { leasehold } from "./helpers.js"
import { startConsole } from "./support/console.js"
import { sqlBackends } from "./support/sqlBackends.js"

/**
 * `length` characters that do not compress (base64 of a hash chain): PostgreSQL compresses an index entry before it
 * checks its size, so a repeated character would fit its btree where a real long id does not.
 */
const incompressible = (length: number): string => {
  let text = ""
  for (let n = 0; text.length < length; n++) text += createHash("sha256").update(`${n}`).digest("base64")
  return text.slice(0, length)
}

let tables = 0
let prefix = "j0_"
beforeEach(() => {
  prefix = `j${++tables}_`
})

const backends = sqlBackends("journal")

const Job = Schema.Struct({ n: Schema.Number })

/** The `position`th step of a run answering `requestId`. */
const step = (position: number, requestId?: string): StoredStep => ({
  position,
  key: String(position),
  entry: JSON.stringify({ _tag: "Turn", promptName: "p", usage: { inputTokens: position, outputTokens: 2 } }),
  requestId
})

/**
 * Dead-letters `message` as the loop does: its letter stored under the message's id, its journal kept, the
 * message acknowledged.
 */
const deadLetter = (
  letters: MailboxSqlAdmin.DeadLetters,
  message: Message<Schema.Schema.Type<typeof Job>>,
  requestId: string
) =>
  Effect.gen(function*() {
    yield* letters.sink(Job).send({
      messageId: message.id,
      body: message.body,
      sourceMailbox: "jobs",
      deliveryCount: 1,
      lastError: "boom",
      lastErrorTag: "Boom",
      enqueuedAt: DateTime.unsafeMake(0),
      deadLetteredAt: DateTime.unsafeMake(0),
      requestId,
      replyTo: undefined,
      traceId: undefined
    })
    yield* journalOf(message)!.keep
    yield* message.acknowledge
  })

/** The journal a SQL message offers (every one does). */
const journal = (message: object) => journalOf(message)!

/** Every journal row of the prefix, as `seq:position`. */
const rows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ message_seq: number | string; position: number | string }>`SELECT message_seq, position
      FROM ${sql(`${prefix}mailbox_journal`)} ORDER BY message_seq, position`,
    (found) => found.map((row) => `${row.message_seq}:${row.position}`)
  ))

for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  describe(`the step journal on ${backend.label}`, () => {
    it.scoped("append and load round-trip in position order; a redelivery sees what earlier ones recorded", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [first] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        expect(yield* journal(first!).load).toEqual([])
        for (const position of [1, 2, 3]) yield* journal(first!).append(step(position, "r-1"))
        expect(yield* journal(first!).load).toEqual([step(1, "r-1"), step(2, "r-1"), step(3, "r-1")])
        // A nack leaves it for the next delivery.
        yield* first!.nack()
        const [second] = yield* jobs.receive()
        expect(second!.id).toBe(first!.id)
        expect((yield* journal(second!).load).map((s) => s.position)).toEqual([1, 2, 3])
        yield* journal(second!).append({ ...step(4), entry: "{\"_tag\":\"Tool\",\"text\":\"quote \\\" é\"}" })
        expect((yield* journal(second!).load)[3]).toEqual({
          ...step(4),
          entry: "{\"_tag\":\"Tool\",\"text\":\"quote \\\" é\"}"
        })
      }).pipe(onDb))

    it.scoped("a delivery whose visibility ran out, or whose message another delivery holds, records nothing", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [first] = yield* jobs.receive({ visibilityTimeout: "10 seconds" })
        yield* journal(first!).append(step(1))
        yield* TestClock.adjust("11 seconds")
        // Run out, not yet claimed again.
        const expired = yield* Effect.flip(journal(first!).append(step(2)))
        expect(expired._tag).toBe("ReceiptHandleExpiredError")
        // Claimed again: the old delivery still records nothing, the new one does.
        const [second] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        expect((yield* Effect.flip(journal(first!).append(step(2))))._tag).toBe("ReceiptHandleExpiredError")
        expect((yield* journal(second!).load).map((s) => s.position)).toEqual([1])
        yield* journal(second!).append(step(2))
        expect(yield* rows).toEqual([`${first!.id}:1`, `${first!.id}:2`])
      }).pipe(onDb))

    it.scoped("an expiry leaves the journal for the next delivery", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [first] = yield* jobs.receive({ visibilityTimeout: "10 seconds" })
        yield* journal(first!).append(step(1))
        yield* TestClock.adjust("11 seconds")
        const [second] = yield* jobs.receive()
        expect((yield* journal(second!).load).map((s) => s.position)).toEqual([1])
      }).pipe(onDb))

    it.scoped("the journal goes with the acknowledgement: plain, with a reply, in a group settle; kept ones stay", () =>
      Effect.gen(function*() {
        const requests = yield* MailboxSql.make({ name: "requests", schema: Job, replySchema: Job, prefix })
        const responses = yield* MailboxSql.make({ name: "responses", schema: Job, prefix })
        const resolver = MailboxResolver.fromMailboxes(requests, responses)
        for (const n of [1, 2, 3, 4, 5, 6]) yield* requests.send({ n }, { replyTo: "responses" })
        const received = yield* requests.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(received.length).toBe(6)
        for (const message of received) yield* journal(message).append(step(1))
        const [plain, replied, kept, ...grouped] = received
        yield* plain!.acknowledge
        yield* replied!.replyAndAcknowledge({ n: 20 }).pipe(Effect.provideService(MailboxResolver, resolver))
        yield* journal(kept!).keep
        yield* kept!.acknowledge
        // A group of three, one of them kept.
        yield* journal(grouped[0]!).keep
        const outcomes = yield* settleAll(
          grouped.map((message) => ({ message, reply: Option.some({ n: message.body.n * 10 }) }))
        ).pipe(Effect.provideService(MailboxResolver, resolver))
        expect(outcomes.map(Either.isRight)).toEqual([true, true, true])
        expect(yield* rows).toEqual([`${kept!.id}:1`, `${grouped[0]!.id}:1`])
        expect((yield* responses.receive({ maxMessages: 10 })).length).toBe(4)
      }).pipe(onDb))

    it.scoped("a delivery that only loaded a journal deletes it when it acknowledges; a stale ack deletes nothing", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        yield* jobs.send({ n: 2 })
        const [a, b] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "10 seconds" })
        yield* journal(a!).append(step(1))
        yield* journal(b!).append(step(1))
        yield* TestClock.adjust("11 seconds")
        // Stale: the acknowledgement fails and the journal stays.
        expect((yield* Effect.flip(a!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        expect((yield* rows).length).toBe(2)
        const again = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
        for (const message of again) expect((yield* journal(message).load).length).toBe(1)
        yield* Effect.forEach(again, (message) => message.acknowledge, { discard: true })
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("a purge of the queue deletes its journals, not another queue's", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const other = yield* MailboxSql.make({ name: "other", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        yield* other.send({ n: 2 })
        const [mine] = yield* jobs.receive()
        const [theirs] = yield* other.receive()
        yield* journal(mine!).append(step(1))
        yield* journal(theirs!).append(step(1))
        expect(yield* jobs.purge).toBe(1)
        expect(yield* rows).toEqual([`${theirs!.id}:1`])
        const queues = yield* MailboxSqlAdmin.queues({ prefix })
        expect(yield* queues.purge("other")).toBe(1)
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("concurrent appends of many deliveries all land; a stale one fails alone", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        for (let n = 0; n < 10; n++) yield* jobs.send({ n })
        const stale = (yield* jobs.receive({ visibilityTimeout: "10 seconds" }))[0]!
        yield* TestClock.adjust("11 seconds")
        const held = yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(held.length).toBe(10)
        const fresh = held.filter((message) => message.id !== stale.id)
        const results = yield* Effect.all(
          [stale, ...fresh].flatMap((message) =>
            [1, 2, 3].map((position) => Effect.either(journal(message).append(step(position))))
          ).reverse(),
          { concurrency: "unbounded" }
        ).pipe(Effect.map((all) => all.reverse()))
        expect(results.slice(0, 3).map((r) => Either.isLeft(r) && r.left._tag)).toEqual([
          "ReceiptHandleExpiredError",
          "ReceiptHandleExpiredError",
          "ReceiptHandleExpiredError"
        ])
        expect(results.slice(3).every(Either.isRight)).toBe(true)
        expect((yield* rows).length).toBe(fresh.length * 3)
        // A step already recorded at that position fails alone too.
        const clash = yield* Effect.all([
          Effect.either(journal(fresh[0]!).append(step(1))),
          Effect.either(journal(fresh[1]!).append(step(4)))
        ], { concurrency: "unbounded" })
        expect(clash.map((r) => r._tag)).toEqual(["Left", "Right"])
        expect((yield* rows).length).toBe(fresh.length * 3 + 1)
      }).pipe(onDb))
    it.scoped("retention prunes old steps of journals whose message is gone, never one whose message is there", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        for (const n of [1, 2, 3]) yield* jobs.send({ n })
        const [kept, waiting, late] = yield* jobs.receive({ maxMessages: 3, visibilityTimeout: "12 hours" })
        for (const message of [kept!, waiting!, late!]) yield* journal(message).append(step(1))
        // Kept and acknowledged: an orphan. Waiting: still in flight. Late: acknowledged, kept, recorded later.
        yield* journal(kept!).keep
        yield* kept!.acknowledge
        yield* TestClock.adjust("2 hours")
        yield* journal(late!).append(step(2))
        yield* journal(late!).keep
        yield* late!.acknowledge
        const options: Retention.Options = { olderThan: "1 hour", prefix, kinds: ["journals"], pause: 0 }
        expect(yield* Retention.prune({ ...options, dryRun: true })).toMatchObject({ journals: 2, dryRun: true })
        expect(yield* Retention.prune(options)).toMatchObject({ journals: 2 })
        expect(yield* rows).toEqual([`${waiting!.id}:1`, `${late!.id}:2`])
        // However old, the journal of a message still there stays.
        yield* TestClock.adjust("10 hours")
        expect(yield* Retention.prune(options)).toMatchObject({ journals: 1 })
        expect(yield* rows).toEqual([`${waiting!.id}:1`])
      }).pipe(onDb))
    it.scoped("the operator reads a journal by message id or request id: queued, dead-lettered, gone", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        yield* jobs.send({ n: 1 })
        yield* jobs.send({ n: 2 })
        const [working, failing] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
        yield* journal(working!).append(step(1, "req-a"))
        yield* journal(working!).append({ ...step(2, "req-a"), key: "2.1", entry: "not json {" })
        yield* journal(failing!).append(step(1, "req-b"))
        yield* journal(failing!).append({
          position: 2,
          key: "2",
          entry: JSON.stringify({ _tag: "ToolResult", toolName: "search", ok: false }),
          requestId: "req-b"
        })
        // Dead-lettered as the loop does it: the letter stored under the message's id, the journal kept.
        yield* deadLetter(letters, failing!, "req-b")

        const byId = yield* MailboxSqlAdmin.journals({ prefix }).pipe(
          Effect.flatMap((journals) => journals.read(working!.id))
        )
        expect(Option.map(byId, (view) => ({ ...view, steps: view.steps.map((s) => [s.position, s.key, s.entry]) })))
          .toEqual(Option.some({
            messageId: working!.id,
            queue: "jobs",
            requestId: Option.some("req-a"),
            where: "queued",
            steps: [[1, "1", { _tag: "Turn", promptName: "p", usage: { inputTokens: 1, outputTokens: 2 } }], [
              2,
              "2.1",
              "not json {"
            ]],
            truncated: false
          }))
        const byRequest = Option.getOrThrow(
          yield* MailboxSqlAdmin.journals({ prefix }).pipe(Effect.flatMap((journals) => journals.read("req-b")))
        )
        expect([byRequest.messageId, byRequest.where, byRequest.steps.length]).toEqual([failing!.id, "dead letter", 2])
        expect(DateTime.isDateTime(byRequest.steps[0]!.recordedAt)).toBe(true)
        expect(yield* MailboxSqlAdmin.journals({ prefix }).pipe(Effect.flatMap((journals) => journals.read("nothing"))))
          .toEqual(Option.none())
        expect(
          (yield* Effect.flip(
            MailboxSqlAdmin.journals({ prefix }).pipe(Effect.flatMap((journals) => journals.read("")))
          ))._tag
        ).toBe("InvalidParameterError")
        // The dead letter deleted: its journal goes with it (in the same transaction), nothing left for retention.
        yield* letters.purge()
        expect(
          Option.map(
            yield* MailboxSqlAdmin.journals({ prefix }).pipe(Effect.flatMap((journals) => journals.read(failing!.id))),
            (view) => view.where
          )
        )
          .toEqual(Option.none())
      }).pipe(onDb))

    it.live(
      "leasehold mailbox journal prints one line per step, --json the whole journal; none exits 1",
      () =>
        Effect.gen(function*() {
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
          yield* jobs.send({ n: 1 })
          const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
          yield* journal(message!).append(step(1, "req-cli"))
          yield* journal(message!).append({
            position: 2,
            key: "1.1",
            entry: JSON.stringify({ _tag: "ToolResult", toolName: "search", ok: true }),
            requestId: "req-cli"
          })
          // A stored value is another party's: its terminal escapes are printed escaped, never sent as such.
          yield* journal(message!).append({
            position: 3,
            key: "1.2",
            entry: JSON.stringify({ _tag: "Tool", toolName: "\u001b]0;owned\u0007\u001b[2J" }),
            requestId: "req-cli"
          })
          const args = ["--db", backend.db(), "--prefix", prefix]
          const text = yield* leasehold("mailbox", "journal", "--id", "req-cli", ...args)
          expect(text.code).toBe(0)
          expect(text.stdout).toContain(`message ${message!.id} (queued) in jobs, request req-cli: 3 steps`)
          expect(text.stdout).toMatch(/^1\s+1\s+\S+Z\s+Turn prompt=p tokens=1\/2$/m)
          expect(text.stdout).toMatch(/^2\s+1\.1\s+\S+Z\s+ToolResult tool=search ok=true$/m)
          expect(text.stdout).toContain("Tool tool=\\u001b]0;owned\\u0007\\u001b[2J")
          expect(text.stdout).not.toContain("\u001b")
          const json = yield* leasehold("mailbox", "journal", "--id", message!.id, "--json", ...args)
          expect(json.code).toBe(0)
          expect(JSON.parse(json.stdout)).toMatchObject({
            messageId: message!.id,
            requestId: "req-cli",
            where: "queued",
            steps: [
              { position: 1, key: "1", entry: { _tag: "Turn" } },
              { position: 2, entry: { toolName: "search" } },
              {
                position: 3
              }
            ]
          })
          const missing = yield* leasehold("mailbox", "journal", "--id", "no-such-request", ...args)
          expect(missing.code).toBe(1)
          expect(missing.stderr).toContain("no step journal for \"no-such-request\"")
          // A journal the code no longer matches is discarded by request id: the next delivery starts afresh.
          const discarded = yield* leasehold("mailbox", "journal", "--id", "req-cli", "--discard", ...args)
          expect([discarded.code, discarded.stdout.trim()]).toEqual([0, "discarded 3 steps"])
          expect(yield* journal(message!).load).toEqual([])
          const again = yield* leasehold("mailbox", "journal", "--id", "req-cli", "--discard", ...args)
          expect(again.code).toBe(1)
          const admin = yield* MailboxSqlAdmin.journals({ prefix })
          yield* journal(message!).append(step(1, "req-cli"))
          expect(yield* admin.discard(message!.id)).toBe(1)
          expect(yield* admin.read(message!.id)).toEqual(Option.none())
          expect((yield* Effect.flip(admin.discard("")))._tag).toBe("InvalidParameterError")
        }).pipe(onDb, Effect.scoped),
      60_000
    )
    it.live("the console's message and dead-letter pages show the journal, escaped", () =>
      Effect.gen(function*() {
        const hostile = `<script>alert(1)</script>`
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        yield* jobs.send({ n: 1 })
        yield* jobs.send({ n: 2 })
        const [working, failing] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
        yield* journal(working!).append({
          position: 1,
          key: hostile,
          entry: JSON.stringify({ _tag: hostile, promptName: hostile, text: hostile }),
          requestId: hostile
        })
        yield* journal(working!).append({ ...step(2), entry: hostile })
        yield* journal(failing!).append(step(1, "req-dead"))
        yield* deadLetter(letters, failing!, "req-dead")
        const { url } = yield* startConsole(["--db", backend.db(), "--prefix", prefix])
        const get = (path: string) =>
          Effect.promise(async () => {
            const response = await fetch(new URL(path, url))
            return { status: response.status, body: await response.text() }
          })
        const message = yield* get(`/message?queue=jobs&id=${working!.id}`)
        expect(message.status).toBe(200)
        expect(message.body).toContain(`<section id="journal">`)
        expect(message.body).not.toContain("<script>")
        expect(message.body).toContain("&lt;script&gt;alert(1)&lt;/script&gt;")
        expect(message.body).toContain("<td>2</td>")
        const dead = yield* get(`/dead-letter?queue=jobs&id=${failing!.id}`)
        expect(dead.status).toBe(200)
        expect(dead.body).toContain(`<section id="journal">`)
        expect(dead.body).toContain("request <code>req-dead</code>")
        expect(dead.body).toContain("Turn prompt=p tokens=1/2")
      }).pipe(onDb, Effect.scoped), 60_000)
  })
}

/** Hostile and careless ids against the journal's identity (issue 43, findings 3 and 8), on both databases. */
for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  /** One message of queue `queue` received, with a step recorded under `requestId`. */
  const journaled = (queue: Mailbox<{ readonly n: number }>, requestId: string, n = 1) =>
    Effect.gen(function*() {
      yield* queue.send({ n })
      const [message] = yield* queue.receive({ visibilityTimeout: "1 hour" })
      yield* journal(message!).append(step(1, requestId))
      return message!
    })

  describe(`one journal identity on ${backend.label}`, () => {
    it.scoped("any request id send accepts is recorded and read back exactly: 4,000 characters, NUL, lone surrogate", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        // "\ud800" and "\ufffd" are two ids (UTF-8 would make them one): each finds its own journal.
        const ids = [incompressible(4000), "order\u0000-42", "order-\ud800", "order-\ufffd", "\u{1F4B8}".repeat(3000)]
        const messages: Array<Message<{ readonly n: number }>> = []
        for (const id of ids) messages.push(yield* journaled(jobs, id))
        for (const [index, id] of ids.entries()) {
          const message = messages[index]!
          expect((yield* journal(message).load).map((stored) => stored.requestId)).toEqual([id])
          const view = Option.getOrThrow(yield* admin.read(id))
          expect([view.messageId, view.requestId]).toEqual([message.id, Option.some(id)])
          expect(yield* admin.matches(id, { by: "request" })).toEqual([
            { messageId: message.id, queue: "jobs", matchedBy: "request id" }
          ])
        }
        expect(yield* admin.discard("order-\ud800")).toBe(1)
        expect(Option.isSome(yield* admin.read("order-\ufffd"))).toBe(true)
      }).pipe(onDb))

    it.scoped("a request id in two queues is never guessed: read and discard refuse it, listing both; a queue names one", () =>
      Effect.gen(function*() {
        const a = yield* MailboxSql.make({ name: "a", schema: Job, prefix })
        const b = yield* MailboxSql.make({ name: "b", schema: Job, prefix })
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        const inA = yield* journaled(a, "order-42")
        const inB = yield* journaled(b, "order-42")
        const both = [
          { messageId: inA.id, queue: "a", matchedBy: "request id" },
          { messageId: inB.id, queue: "b", matchedBy: "request id" }
        ]
        const refused = yield* Effect.flip(admin.read("order-42"))
        expect(refused).toBeInstanceOf(MailboxSqlAdmin.JournalAmbiguousError)
        expect(refused).toMatchObject({ _tag: "JournalAmbiguousError", id: "order-42", matches: both, more: false })
        expect(refused.message).toContain(`message ${inA.id} in queue "a"`)
        expect((yield* Effect.flip(admin.discard("order-42")))._tag).toBe("JournalAmbiguousError")
        expect(yield* rows).toEqual([`${inA.id}:1`, `${inB.id}:1`]) // nothing discarded
        expect(yield* admin.matches("order-42")).toEqual(both)
        expect(Option.map(yield* admin.read("order-42", { queue: "b" }), (view) => view.messageId))
          .toEqual(Option.some(inB.id))
        expect(yield* admin.read("order-42", { queue: "c" })).toEqual(Option.none())
        expect(yield* admin.discard("order-42", { queue: "a" })).toBe(1)
        expect(Option.map(yield* admin.read("order-42"), (view) => view.queue)).toEqual(Option.some("b"))
      }).pipe(onDb))

    it.scoped("a request id that is another message's id is refused under either; --by names which", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        const victim = yield* journaled(jobs, "req-victim")
        // A sender picks the victim's message id as its request id, to shadow its journal.
        const shadow = yield* journaled(jobs, victim.id, 2)
        const refused = yield* Effect.flip(admin.read(victim.id))
        expect(refused).toMatchObject({
          _tag: "JournalAmbiguousError",
          matches: [
            { messageId: victim.id, queue: "jobs", matchedBy: "message id" },
            { messageId: shadow.id, queue: "jobs", matchedBy: "request id" }
          ]
        })
        expect(Option.map(yield* admin.read(victim.id, { by: "message" }), (view) => view.messageId))
          .toEqual(Option.some(victim.id))
        expect(Option.map(yield* admin.read(victim.id, { by: "request" }), (view) => view.messageId))
          .toEqual(Option.some(shadow.id))
        expect(yield* admin.discard(victim.id, { by: "request" })).toBe(1)
        expect(yield* rows).toEqual([`${victim.id}:1`])
      }).pipe(onDb))

    it.scoped("a request id sent many times lists at most journalMatchLimit matches, and says there were more", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        for (let n = 0; n <= MailboxSqlAdmin.journalMatchLimit; n++) yield* journaled(jobs, "same", n)
        const refused = yield* Effect.flip(admin.read("same"))
        expect(refused).toMatchObject({ _tag: "JournalAmbiguousError", more: true })
        expect(refused._tag === "JournalAmbiguousError" && refused.matches).toHaveLength(
          MailboxSqlAdmin.journalMatchLimit
        )
        expect(yield* admin.matches("same")).toHaveLength(MailboxSqlAdmin.journalMatchLimit)
      }).pipe(onDb))

    it.scoped("a lookup with a bad id, queue or kind is an InvalidParameterError naming it", () =>
      Effect.gen(function*() {
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        const refusedAs = (effect: Effect.Effect<unknown, { readonly _tag: string }>) =>
          Effect.map(Effect.flip(effect), (error) => [error._tag, (error as { parameter?: string }).parameter])
        expect(yield* refusedAs(admin.read(""))).toEqual(["InvalidParameterError", "id"])
        expect(yield* refusedAs(admin.read("x".repeat(1_000_001)))).toEqual(["InvalidParameterError", "id"])
        expect(yield* refusedAs(admin.read("x", { queue: "bad\u001b[2J" }))).toEqual(["InvalidParameterError", "queue"])
        expect(yield* refusedAs(admin.read("x", { queue: "" }))).toEqual(["InvalidParameterError", "queue"])
        expect(yield* refusedAs(admin.matches("x", { by: "everything" as never }))).toEqual([
          "InvalidParameterError",
          "by"
        ])
        expect(yield* refusedAs(admin.discard(42 as never))).toEqual(["InvalidParameterError", "id"])
      }).pipe(onDb))

    it.scoped("a message's identity is its database's and its seq: two prefixes never share one, a redelivery keeps it", () =>
      Effect.gen(function*() {
        const other = `${prefix}x_`
        const here = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const there = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix: other })
        yield* here.send({ n: 1 })
        yield* there.send({ n: 1 })
        const [mine] = yield* here.receive({ visibilityTimeout: "1 minute" })
        const [theirs] = yield* there.receive({ visibilityTimeout: "1 minute" })
        expect(mine!.id).toBe(theirs!.id) // the same seq, in two tables of one database…
        const identity = yield* journal(mine!).identity
        expect(identity).not.toBe(yield* journal(theirs!).identity) // …two identities
        expect(identity).toMatch(new RegExp(`^[0-9a-f-]{36}\\.${mine!.id}$`))
        yield* mine!.nack()
        const [again] = yield* here.receive({ visibilityTimeout: "1 minute" })
        expect(again!.deliveryCount).toBe(2)
        expect(yield* journal(again!).identity).toBe(identity)
        // Kept in the database, not the process: a store made afresh reads the same one.
        const sql = yield* SqlClient.SqlClient
        const stored = yield* sql<{ id: string }>`SELECT id FROM ${sql(`${prefix}mailbox_identity`)}`
        expect(stored.map((row) => `${row.id}.${mine!.id}`)).toEqual([identity])
      }).pipe(onDb))

    it.scoped("a tampered stored request id is never trusted: not found by it, shown as none", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const admin = yield* MailboxSqlAdmin.journals({ prefix })
        const message = yield* journaled(jobs, "order-42")
        const sql = yield* SqlClient.SqlClient
        // Someone with the database rewrote the stored id into text that is not a JSON string, digest untouched.
        yield* sql`UPDATE ${sql(`${prefix}mailbox_journal`)} SET request_json = ${"{\"not\": \"a string\"}"}`
        expect(yield* admin.read("order-42", { by: "request" })).toEqual(Option.none())
        const view = Option.getOrThrow(yield* admin.read(message.id, { by: "message" }))
        expect(view.requestId).toEqual(Option.none())
        yield* sql`UPDATE ${sql(`${prefix}mailbox_journal`)} SET request_json = ${"not json {"}`
        expect(yield* admin.matches("order-42")).toEqual([])
        expect(Option.getOrThrow(yield* admin.read(message.id)).requestId).toEqual(Option.none())
      }).pipe(onDb))

    it.scoped("a database without migration 12 is named as such to the operator (TablesNotFoundError)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const older = Object.fromEntries(Object.entries(Schema_.migrations(Store.tablesOf(sql, prefix))).slice(0, 11))
        yield* Sql.migrate(sql, Schema_.migrationsTable(prefix), older)
        const refused = yield* Effect.flip(MailboxSqlAdmin.journals({ prefix, create: false }))
        expect(refused).toMatchObject({ _tag: "TablesNotFoundError", missing: [`${prefix}mailbox_identity`] })
      }).pipe(onDb))

    it.scoped("migration 12 carries the request ids recorded before it over: found by request id", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const older = Object.fromEntries(
          Object.entries(Schema_.migrations(Store.tablesOf(sql, prefix))).slice(0, 11)
        )
        yield* Sql.migrate(sql, Schema_.migrationsTable(prefix), older)
        yield* sql`INSERT INTO ${sql(`${prefix}mailbox_journal`)}
          (message_seq, position, step_key, queue, request_id, entry, recorded_at)
          VALUES (7, 1, '1', 'jobs', 'legacy-7', '{}', 0)`
        yield* MailboxSql.make({ name: "jobs", schema: Job, prefix }) // migrates to the latest
        const view = Option.getOrThrow(yield* (yield* MailboxSqlAdmin.journals({ prefix })).read("legacy-7"))
        expect([view.messageId, view.requestId]).toEqual(["7", Option.some("legacy-7")])
      }).pipe(onDb))

    it.live(
      "MainLoop.agent resumes a request whose id is 4,000 characters with a NUL and a lone surrogate",
      () =>
        Effect.gen(function*() {
          const requestId = `${incompressible(4000)}\u0000\ud800`
          const requests = yield* MailboxSql.make({
            name: "agent-requests",
            schema: MainLoop.requestSchema(Schema.String),
            replySchema: MainLoop.resultSchema(Schema.String),
            prefix
          })
          const replies = yield* MailboxSql.make({
            name: "agent-replies",
            schema: MainLoop.resultSchema(Schema.String),
            prefix
          })
          const stalled = yield* Deferred.make<void>()
          const turns = yield* Ref.make(0)
          const charge = Tool.make({
            name: "charge",
            description: "Charges; the first attempt stalls until its worker stops.",
            parameters: Schema.Struct({}),
            success: Schema.String,
            handler: (_, context) =>
              context.fencingToken === 1
                ? Effect.zipRight(Deferred.succeed(stalled, undefined), Effect.never)
                : Effect.succeed(`charged by attempt ${context.fencingToken}`)
          })
          const adapter = yield* InnerLoop.makeAdapter("stub", (request) =>
            Effect.map(
              Ref.updateAndGet(turns, (n) => n + 1),
              () =>
                request.messages.some((message) => message.role === "tool")
                  ? { text: "paid", toolCalls: [], usage: { inputTokens: 1, outputTokens: 1 } }
                  : {
                    text: "",
                    toolCalls: [{ id: "c", name: "charge", params: {} }],
                    usage: { inputTokens: 1, outputTokens: 1 }
                  }
            ))
          const loop = MainLoop.agent({
            requests,
            adapter,
            prepare: (input: string) =>
              Effect.succeed(Prompt.make({ name: "pay", instructions: "Pay.", input, tools: [charge] }))
          })
          yield* requests.send(MainLoop.request("pay", { requestId }), { replyTo: "agent-replies" })
          const first = yield* Effect.fork(Effect.flatMap(loop, (runnable) => runnable.run({ waitTime: "100 millis" })))
          yield* Deferred.await(stalled)
          yield* Fiber.interrupt(first) // the worker stops: its request goes back, its journal (the first turn) stays
          yield* Effect.flatMap(loop, (runnable) => runnable.run({ maxIterations: 1, waitTime: "1 second" }))
          const [reply] = yield* replies.receive({ waitTime: "5 seconds" })
          expect(reply?.body.error).toBeUndefined()
          expect([reply?.body.output, reply?.body.requestId, reply?.body.runContext.attempt]).toEqual([
            "paid",
            requestId,
            2
          ])
          expect(yield* Ref.get(turns)).toBe(2) // the first turn came from the journal: not asked again
        }).pipe(onDb, Effect.provide(MailboxResolver.layer()), Effect.scoped),
      60_000
    )

    it.live(
      "leasehold mailbox journal refuses an ambiguous request id (exit 2) listing the matches; --queue names one",
      () =>
        Effect.gen(function*() {
          const a = yield* MailboxSql.make({ name: "a", schema: Job, prefix })
          const b = yield* MailboxSql.make({ name: "b", schema: Job, prefix })
          const inA = yield* journaled(a, "order-42")
          const inB = yield* journaled(b, "order-42")
          const args = ["--db", backend.db(), "--prefix", prefix]
          const refused = yield* leasehold("mailbox", "journal", "--id", "order-42", ...args)
          expect(refused.code).toBe(2)
          expect(refused.stderr).toContain("\"order-42\" names 2 journals")
          expect(refused.stderr).toMatch(new RegExp(`^${inA.id}\\s+a\\s+request id$`, "m"))
          expect(refused.stderr).toMatch(new RegExp(`^${inB.id}\\s+b\\s+request id$`, "m"))
          const discard = yield* leasehold("mailbox", "journal", "--id", "order-42", "--discard", ...args)
          expect(discard.code).toBe(2)
          expect(yield* rows).toEqual([`${inA.id}:1`, `${inB.id}:1`])
          const named = yield* leasehold("mailbox", "journal", "--id", "order-42", "--queue", "b", "--json", ...args)
          expect(named.code).toBe(0)
          expect(JSON.parse(named.stdout)).toMatchObject({ messageId: inB.id, queue: "b", requestId: "order-42" })
          const byMessage = yield* leasehold("mailbox", "journal", "--id", inA.id, "--by", "message", "--json", ...args)
          expect(JSON.parse(byMessage.stdout)).toMatchObject({ messageId: inA.id, queue: "a" })
          const none = yield* leasehold("mailbox", "journal", "--id", "order-42", "--queue", "c", ...args)
          expect([none.code, none.stderr]).toEqual([1, expect.stringContaining("in queue \"c\"")])
          const bad = yield* leasehold("mailbox", "journal", "--id", "order-42", "--by", "guess", ...args)
          expect(bad.code).toBe(2)
          const hostileQueue = yield* leasehold(
            "mailbox",
            "journal",
            "--id",
            "order-42",
            "--queue",
            "\u001b]0;x\u0007",
            ...args
          )
          expect([hostileQueue.code, hostileQueue.stderr]).toEqual([2, expect.stringContaining("Invalid queue")])
          expect(hostileQueue.stderr).not.toContain("\u001b")
        }).pipe(onDb, Effect.scoped),
      60_000
    )
  })
}
