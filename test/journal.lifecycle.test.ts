/**
 * How long a step journal lives (issue 43, finding 6, and the acknowledgement of a redelivery): exactly as long as
 * its message or its dead letter. A purge keeps a remaining dead letter's journal, a drop keeps every journal,
 * retention keeps a dead letter's journal until the letter goes, and every acknowledgement of this version deletes
 * the journal (a redelivery that never read it too); one that an older checkout's acknowledgement left behind goes
 * with retention. On memory, SQLite and PostgreSQL.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { DateTime, Effect, Option, Schema, TestClock } from "effect"
import { journalOf, type StoredStep } from "../src/internal/journal.js"
import type { Mailbox, Message } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as Retention from "../src/Retention.js"
import { leasehold } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

let tables = 0
let prefix = "jl0_"
beforeEach(() => {
  prefix = `jl${++tables}_`
})

const Job = Schema.Struct({ n: Schema.Number })
type Job = typeof Job.Type

/** The `position`th step of a run. */
const step = (position: number): StoredStep => ({
  position,
  key: String(position),
  entry: JSON.stringify({ _tag: "Turn", promptName: "p", usage: { inputTokens: position, outputTokens: 2 } }),
  requestId: "r"
})

/** The journal a message offers (every message of these backends does). */
const journal = (message: object) => journalOf(message)!

describe("the memory mailbox", () => {
  it.scoped("a purge deletes the journals of the messages it deletes and keeps a dead-lettered one's", () =>
    Effect.gen(function*() {
      const jobs = yield* MailboxMemory.make<Job>({ name: "jobs" })
      yield* jobs.send({ n: 1 })
      yield* jobs.send({ n: 2 })
      const [dead, purged] = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
      yield* journal(dead!).append(step(1))
      yield* journal(purged!).append(step(1))
      // Dead-lettered as the loop does it: the journal kept, the message acknowledged.
      yield* journal(dead!).keep
      yield* dead!.acknowledge
      expect(yield* jobs.purge).toBe(1)
      expect(Option.isSome(yield* MailboxMemory.journal(jobs, dead!.id))).toBe(true)
      expect(yield* MailboxMemory.journal(jobs, purged!.id)).toEqual(Option.none())
    }))

  it.scoped("a redelivery's acknowledgement deletes the journal it never read", () =>
    Effect.gen(function*() {
      const jobs = yield* MailboxMemory.make<Job>({ name: "jobs" })
      yield* jobs.send({ n: 1 })
      const [first] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
      yield* journal(first!).append(step(1))
      yield* first!.nack()
      const [second] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
      yield* second!.acknowledge
      expect(yield* MailboxMemory.journal(jobs, first!.id)).toEqual(Option.none())
    }))
})

for (const backend of sqlBackends("journal-lifecycle")) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  /** Every journal row of the prefix, as `seq:position`. */
  const rows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ message_seq: number | string; position: number | string }>`SELECT message_seq, position
        FROM ${sql(`${prefix}mailbox_journal`)} ORDER BY message_seq, position`,
      (found) => found.map((row) => `${row.message_seq}:${row.position}`)
    ))

  /** Dead-letters `message` as the loop does: its letter stored under its id, its journal kept, the message acked. */
  const deadLetter = (message: Message<Job>, queue = "jobs") =>
    Effect.gen(function*() {
      const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
      yield* letters.sink(Job).send({
        messageId: message.id,
        body: message.body,
        sourceMailbox: queue,
        deliveryCount: message.deliveryCount,
        lastError: "boom",
        lastErrorTag: "Boom",
        enqueuedAt: DateTime.unsafeMake(0),
        deadLetteredAt: DateTime.unsafeMake(0),
        requestId: "r",
        replyTo: undefined,
        traceId: undefined
      })
      yield* journal(message).keep
      yield* message.acknowledge
    })

  /** One message of `jobs` with a step, dead-lettered on its second delivery (the first was nacked). */
  const deadLettered = (jobs: Mailbox<Job>) =>
    Effect.gen(function*() {
      yield* jobs.send({ n: 0 })
      const [first] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
      yield* journal(first!).append(step(1))
      yield* first!.nack()
      const [second] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
      expect(second!.deliveryCount).toBe(2)
      yield* deadLetter(second!)
      return second!
    })

  describe(`how long a journal lives on ${backend.label}`, () => {
    it.scoped("a purge (the mailbox's, the operator's) keeps a remaining dead letter's journal", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const dead = yield* deadLettered(jobs)
        yield* jobs.send({ n: 1 })
        const [purged] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(purged!).append(step(1))
        expect(yield* rows).toEqual([`${dead.id}:1`, `${purged!.id}:1`])
        expect(yield* jobs.purge).toBe(1)
        expect(yield* rows).toEqual([`${dead.id}:1`])
        // The operator's purge of the queue (messages only): the dead letter's journal stays.
        yield* jobs.send({ n: 2 })
        const queues = yield* MailboxSqlAdmin.queues({ prefix })
        expect(yield* queues.purge("jobs")).toBe(1)
        expect(yield* rows).toEqual([`${dead.id}:1`])
        const shown = yield* (yield* MailboxSqlAdmin.journals({ prefix })).read(dead.id)
        expect(Option.map(shown, (view) => view.steps.length)).toEqual(Option.some(1))
      }).pipe(onDb))

    it.scoped("a purge deletes a journal whose message and dead letter are both gone, not another queue's", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const other = yield* MailboxSql.make({ name: "other", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        yield* other.send({ n: 2 })
        const [orphan] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        const [theirs] = yield* other.receive({ visibilityTimeout: "1 minute" })
        yield* journal(orphan!).append(step(1))
        yield* journal(theirs!).append(step(1))
        // Kept, then its dead letter deleted by the operator: nothing keeps the journal any more.
        yield* deadLetter(orphan!)
        expect(yield* (yield* MailboxSqlAdmin.deadLetters({ prefix })).purge({ ids: [orphan!.id] })).toBe(1)
        expect(yield* jobs.purge).toBe(0)
        expect(yield* rows).toEqual([`${theirs!.id}:1`])
      }).pipe(onDb))

    it.scoped("a drop keeps the dead letters' journals (it loses nothing)", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const dead = yield* deadLettered(jobs)
        const queues = yield* MailboxSqlAdmin.queues({ prefix })
        expect(yield* queues.drop("jobs")).toBe("dropped")
        expect(yield* rows).toEqual([`${dead.id}:1`])
        const shown = yield* (yield* MailboxSqlAdmin.journals({ prefix })).read(dead.id)
        expect(Option.map(shown, (view) => view.steps.length)).toEqual(Option.some(1))
        // Dropping again: not recorded any more, and still nothing lost.
        expect(yield* queues.drop("jobs")).toBe("unknown")
        expect(yield* rows).toEqual([`${dead.id}:1`])
      }).pipe(onDb))

    it.live("`leasehold mailbox drop` keeps the dead letters' journals", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 0 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        yield* deadLetter(message!)
        const run = yield* leasehold("mailbox", "drop", "jobs", "--db", backend.db(), "--prefix", prefix)
        expect([run.code, run.stdout.trim()]).toEqual([0, "dropped jobs"])
        expect(yield* rows).toEqual([`${message!.id}:1`])
      }).pipe(onDb, Effect.scoped), 60_000)

    it.scoped("retention keeps a dead letter's journal while the letter is there, and takes it with the letter", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const dead = yield* deadLettered(jobs)
        yield* TestClock.adjust("2 hours")
        const options: Retention.Options = { olderThan: "1 hour", prefix, kinds: ["journals"], pause: 0 }
        expect(yield* Retention.prune({ ...options, dryRun: true })).toMatchObject({ journals: 0 })
        expect(yield* Retention.prune(options)).toMatchObject({ journals: 0 })
        expect(yield* rows).toEqual([`${dead.id}:1`])
        // Retention's dead letters go first (the letter's age is from the test's time zero), then the journal.
        const both = yield* Retention.prune({ ...options, kinds: ["deadLetters", "journals"] })
        expect(both).toMatchObject({ deadLetters: 1, journals: 1 })
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("a redelivery's acknowledgement deletes the journal it never read; a first delivery's acks as before", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        for (const n of [1, 2]) yield* jobs.send({ n })
        const first = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
        for (const message of first) yield* journal(message).append(step(1))
        for (const message of first) yield* message.nack()
        // Redelivered to code that never reads the journal (a plain loop, a run that failed before its first step).
        const again = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "1 minute" })
        expect(again.map((message) => message.deliveryCount)).toEqual([2, 2])
        yield* again[0]!.acknowledge
        expect(yield* rows).toEqual([`${again[1]!.id}:1`])
        yield* again[1]!.acknowledge
        expect(yield* rows).toEqual([])
        // A first delivery without a journal acknowledges as before.
        yield* jobs.send({ n: 3 })
        const [fresh] = yield* jobs.receive()
        yield* fresh!.acknowledge
        expect(yield* jobs.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("hostile dead-letter ids (not a seq, a look-alike of one, another queue's) break nothing", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        // Letters a sink was handed by other code: none of them is this message's dead letter.
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        for (const id of ["not-a-seq", `0${message!.id}`, ` ${message!.id}`, `${message!.id}.0`, "é".repeat(500)]) {
          yield* letters.sink(Job).send({
            messageId: id,
            body: { n: 0 },
            sourceMailbox: "jobs",
            deliveryCount: 1,
            lastError: "x",
            lastErrorTag: "X",
            enqueuedAt: DateTime.unsafeMake(0),
            deadLetteredAt: DateTime.unsafeMake(0),
            requestId: undefined,
            replyTo: undefined,
            traceId: undefined
          })
        }
        expect(yield* jobs.purge).toBe(1)
        expect(yield* rows).toEqual([])
        yield* jobs.send({ n: 2 })
        const [orphan] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(orphan!).append(step(1))
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM ${sql(`${prefix}mailbox_messages`)} WHERE seq = ${Number(orphan!.id)}`
        yield* TestClock.adjust("2 hours")
        const options: Retention.Options = { olderThan: "1 hour", prefix, kinds: ["journals"], pause: 0 }
        expect(yield* Retention.prune(options)).toMatchObject({ journals: 1 })
        expect(yield* letters.count()).toBe(5)
      }).pipe(onDb))

    it.scoped("a purge whose journal delete fails deletes no message either (one transaction)", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        // A sick store: deleting a journal row fails.
        const sql = yield* SqlClient.SqlClient
        const table = sql(`${prefix}mailbox_journal`)
        const trigger = sql(`${prefix}sick`)
        const sick = backend.label === "SQLite"
          ? sql`CREATE TRIGGER ${trigger} BEFORE DELETE ON ${table} BEGIN SELECT RAISE(ABORT, 'sick store'); END`
          : Effect.zipRight(
            sql.unsafe(`CREATE FUNCTION ${prefix}sick() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN RAISE EXCEPTION 'sick store'; END $$`),
            sql`CREATE TRIGGER ${trigger} BEFORE DELETE ON ${table} FOR EACH ROW EXECUTE FUNCTION ${trigger}()`
          )
        yield* sick
        const failed = yield* Effect.flip(jobs.purge)
        expect(failed._tag).toBe("MailboxConnectionError")
        expect(yield* jobs.approximateCount).toBe(1)
        expect(yield* rows).toEqual([`${message!.id}:1`])
        yield* backend.label === "SQLite" ? sql`DROP TRIGGER ${trigger}` : sql`DROP TRIGGER ${trigger} ON ${table}`
        expect(yield* jobs.purge).toBe(1)
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("`dlq delete` (the admin's purge) deletes the letters' journals with them; other letters' stay", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const one = yield* deadLettered(jobs)
        const two = yield* deadLettered(jobs)
        expect(yield* rows).toEqual([`${one.id}:1`, `${two.id}:1`])
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        expect(yield* letters.purge({ ids: [one.id] })).toBe(1)
        expect(yield* rows).toEqual([`${two.id}:1`])
        expect(yield* letters.purge({ queue: "jobs" })).toBe(1)
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("`dlq redrive` deletes the redriven letters' journals: the new message runs afresh, nothing is left", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const one = yield* deadLettered(jobs)
        const two = yield* deadLettered(jobs)
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        expect(yield* letters.redrive({ ids: [one.id] })).toBe(1)
        expect(yield* rows).toEqual([`${two.id}:1`])
        expect(yield* letters.redrive({ queue: "jobs" })).toBe(1)
        expect(yield* rows).toEqual([])
        const redriven = yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(redriven.length).toBe(2)
        for (const message of redriven) {
          expect(message.id).not.toBe(one.id)
          expect(message.id).not.toBe(two.id)
          yield* message.acknowledge
        }
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.scoped("a redrive or delete keeps the journal of a letter whose message is still there (not yet acked)", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        // The letter is stored, the delivery has not acknowledged yet (or lost its lease and runs again).
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        yield* letters.sink(Job).send({
          messageId: message!.id,
          body: message!.body,
          sourceMailbox: "jobs",
          deliveryCount: 1,
          lastError: "boom",
          lastErrorTag: "Boom",
          enqueuedAt: DateTime.unsafeMake(0),
          deadLetteredAt: DateTime.unsafeMake(0),
          requestId: "r",
          replyTo: undefined,
          traceId: undefined
        })
        expect(yield* letters.redrive({ ids: [message!.id] })).toBe(1)
        expect(yield* rows).toEqual([`${message!.id}:1`])
        // Its delivery still holds it and records on.
        yield* journal(message!).append(step(2))
        expect(yield* rows).toEqual([`${message!.id}:1`, `${message!.id}:2`])
      }).pipe(onDb))

    it.scoped("a redrive or delete whose journal delete fails moves and deletes no letter (one transaction)", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        const dead = yield* deadLettered(jobs)
        const sql = yield* SqlClient.SqlClient
        const table = sql(`${prefix}mailbox_journal`)
        const trigger = sql(`${prefix}sick`)
        const sick = backend.label === "SQLite"
          ? sql`CREATE TRIGGER ${trigger} BEFORE DELETE ON ${table} BEGIN SELECT RAISE(ABORT, 'sick store'); END`
          : Effect.zipRight(
            sql.unsafe(`CREATE FUNCTION ${prefix}sick() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN RAISE EXCEPTION 'sick store'; END $$`),
            sql`CREATE TRIGGER ${trigger} BEFORE DELETE ON ${table} FOR EACH ROW EXECUTE FUNCTION ${trigger}()`
          )
        yield* sick
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        expect((yield* Effect.flip(letters.redrive({ ids: [dead.id] })))._tag).toBe("MailboxConnectionError")
        expect((yield* Effect.flip(letters.purge({ ids: [dead.id] })))._tag).toBe("MailboxConnectionError")
        expect(yield* letters.count()).toBe(1)
        expect(yield* jobs.approximateCount).toBe(0)
        expect(yield* rows).toEqual([`${dead.id}:1`])
        yield* backend.label === "SQLite" ? sql`DROP TRIGGER ${trigger}` : sql`DROP TRIGGER ${trigger} ON ${table}`
        expect(yield* letters.redrive({ ids: [dead.id] })).toBe(1)
        expect(yield* rows).toEqual([])
      }).pipe(onDb))

    it.live("`leasehold mailbox dlq delete --id` deletes the letter's journal", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 0 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        yield* deadLetter(message!)
        const run = yield* leasehold(
          "mailbox",
          "dlq",
          "delete",
          "--id",
          message!.id,
          "--db",
          backend.db(),
          "--prefix",
          prefix
        )
        expect(run.code).toBe(0)
        expect(yield* rows).toEqual([])
      }).pipe(onDb, Effect.scoped), 60_000)

    it.scoped("a journal an older checkout's acknowledgement left behind (a bare delete) goes with retention", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
        yield* jobs.send({ n: 1 })
        const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        yield* journal(message!).append(step(1))
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM ${sql(`${prefix}mailbox_messages`)} WHERE seq = ${Number(message!.id)}`
        expect(yield* rows).toEqual([`${message!.id}:1`])
        yield* TestClock.adjust("2 hours")
        const options: Retention.Options = { olderThan: "1 hour", prefix, kinds: ["journals"], pause: 0 }
        expect(yield* Retention.prune(options)).toMatchObject({ journals: 1 })
        expect(yield* rows).toEqual([])
      }).pipe(onDb))
  })
}
