/**
 * Retention on SQLite (a temporary file) and PostgreSQL (a throwaway cluster): a prune deletes exactly the old
 * rows that nothing reads any more — terminal merge-queue entries, the audit log's old prefix (never its newest
 * row), dead letters, unread replies of the named reply queues — and keeps every queued, delayed, in-flight,
 * in-progress or recent row; a dry run counts the same rows and deletes nothing; a batch deletes at most
 * `batchSize` rows and the loop still takes them all; the scheduled layer prunes on its schedule; and pruning
 * while a producer, a worker, a reply consumer and a merge-queue agent run on the same tables loses no live
 * row. Age is driven by `TestClock` where time is in-process; the live-traffic test runs on the database's
 * clock, its old rows written old.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Exit, Fiber, Layer, Option, Ref, Schema, TestClock } from "effect"
import * as Sql from "../src/internal/sql/common.js"
import * as Statements from "../src/internal/sql/retention.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as Retention from "../src/Retention.js"
import { captureLogs } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("retention")

let tables = 0
let prefix = "r0_"
beforeEach(() => {
  prefix = `r${++tables}_`
})

const TIMEOUT = 120_000
const Job = Schema.Struct({ n: Schema.Number })

/** The number of rows of `table` (under the test's prefix) matching `where`. */
const count = (table: string, where?: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ n: number | string }>`SELECT count(*) AS n FROM ${sql(`${prefix}${table}`)}${
        where === undefined ? sql`` : sql` WHERE ${sql.literal(where)}`
      }`,
      (rows) => Number(rows[0]!.n)
    ))

/** A real-time wait between two looks at what a background fiber did (its I/O does not run on `TestClock`). */
const realPause = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 10)))

/** `effect` again until `done` holds: the layer's passes run on fibers of their own, and on real I/O. */
const eventually = <A, E, R>(effect: Effect.Effect<A, E, R>, done: (a: A) => boolean): Effect.Effect<A, E, R> =>
  Effect.flatMap(
    effect,
    (a) => done(a) ? Effect.succeed(a) : Effect.zipRight(realPause, Effect.suspend(() => eventually(effect, done)))
  )

/** Takes the next pending entry through `path` (from `claimed`), then releases the lock. */
const work = (queue: MergeQueue.MergeQueueService, path: ReadonlyArray<MergeQueue.Status>) =>
  Effect.gen(function*() {
    const claim = Option.getOrThrow(yield* queue.nextWithLock("agent-1"))
    for (const status of path) yield* queue.transition(claim, status)
    yield* queue.releaseProcessingLock(claim)
    return claim.id
  })

const toMerged: ReadonlyArray<MergeQueue.Status> = ["rebasing", "testing", "ready_to_merge", "merging", "merged"]

/** Every row of every kind, for "nothing changed". */
const snapshot = Effect.all([
  count("merge_queue"),
  count("merge_queue_audit"),
  count("mailbox_dead_letters"),
  count("mailbox_messages")
])

for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  describe(`Retention on ${backend.label}`, () => {
    it.scoped(
      "prunes exactly the old rows nothing reads; a dry run counts them and deletes nothing",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const queue = yield* MergeQueue.make({ prefix })
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix })
          const answers = yield* MailboxSql.make({ name: "answers", schema: Job, prefix })
          const other = yield* MailboxSql.make({ name: "other", schema: Job, prefix })

          // At 0 (old by the end): entries in every kind of status.
          for (const workspace of ["merged", "failed", "retrying", "cancelled", "working", "waiting"]) {
            yield* queue.enqueue(workspace)
          }
          const merged = yield* work(queue, toMerged)
          const failed = yield* work(queue, ["failed_terminal"])
          yield* work(queue, ["failed_retryable"])
          const cancelled = (yield* queue.list({ status: ["pending"] })).find((e) => e.workspace === "cancelled")!.id
          yield* queue.transition(cancelled, "cancelled")
          const working = Option.getOrThrow(yield* queue.nextWithLock("agent-2")) // in progress, its lock expires

          // Old replies: one unread, one read and given up (its visibility ran out), one in flight for 12 h; an
          // old request nobody received, an old message of a queue that is not a reply queue, an old dead letter.
          for (let n = 1; n <= 4; n++) yield* jobs.send({ n }, { replyTo: "answers" })
          for (const request of yield* jobs.receive({ maxMessages: 3 })) {
            yield* request.replyAndAcknowledge(request.body)
          }
          yield* answers.receive({ visibilityTimeout: "1 minute" })
          const [held] = yield* answers.receive({ visibilityTimeout: "12 hours" })
          yield* other.send({ n: 5 })
          const corrupt = yield* jobs.send({ n: 6 })
          yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '{"n":"six"}' WHERE seq = ${Number(corrupt)}`
          yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "12 hours" }) // dead-letters it; takes request 4
          const oldAudit = yield* count("merge_queue_audit")

          // Two hours later: recent rows of every kind.
          yield* TestClock.adjust("2 hours")
          yield* queue.enqueue("recent")
          const recentCancelled = (yield* queue.list({ status: ["pending"] })).find((e) => e.workspace === "recent")!.id
          yield* queue.transition(recentCancelled, "cancelled")
          yield* jobs.send({ n: 7 }, { replyTo: "answers" })
          const [request] = yield* jobs.receive()
          yield* request!.replyAndAcknowledge({ n: 7 })
          const corrupt2 = yield* jobs.send({ n: 8 })
          yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '{"n":"8"}' WHERE seq = ${Number(corrupt2)}`
          yield* jobs.receive({ maxMessages: 10 })

          const options: Retention.Options = { olderThan: "1 hour", prefix, replyQueues: ["answers"], pause: 0 }
          const before = yield* snapshot
          const dry = yield* Retention.prune({ ...options, dryRun: true })
          expect(yield* snapshot).toEqual(before)
          const expected = { entries: 3, audit: oldAudit, deadLetters: 1, replies: 2, journals: 0, skipped: [] }
          expect(dry).toEqual({ ...expected, dryRun: true })

          expect(yield* Retention.prune(options)).toEqual({ ...expected, dryRun: false })
          // Entries: the old merged, failed and cancelled ones went; retrying, in progress, pending, recent stay.
          const left = yield* queue.list()
          expect(left.map((entry) => entry.id)).not.toContain(merged)
          expect(left.map((entry) => entry.id)).not.toContain(failed)
          expect(left.map((entry) => entry.id)).not.toContain(cancelled)
          expect(left.map((entry) => [entry.workspace, entry.status]).sort()).toEqual([
            ["recent", "cancelled"],
            ["retrying", "failed_retryable"],
            ["waiting", "pending"],
            ["working", "claimed"]
          ])
          // Audit: only the rows written in the last hour, in order; the in-progress claim still works.
          const audit = yield* queue.auditLog()
          expect(audit.length).toBe(before[1] - oldAudit)
          expect(audit.every((row) => DateTime.toEpochMillis(row.at) >= 3_600_000)).toBe(true)
          expect(Option.map(yield* queue.get(working.id), (entry) => entry.status)).toEqual(Option.some("claimed"))
          // Dead letters: the recent one.
          const letters = yield* (yield* MailboxSqlAdmin.deadLetters({ prefix })).list()
          expect(letters.map((letter) => letter.id)).toEqual([corrupt2])
          // Replies: the recent unread one and the old one in flight (still acknowledgeable); the old request in
          // flight on jobs and the old message of "other" stay.
          const peek = yield* (yield* MailboxSqlAdmin.queues({ prefix })).peek("answers")
          expect(peek.map((message) => message.state).sort()).toEqual(["in flight", "queued"])
          yield* held!.acknowledge
          expect(yield* jobs.approximateCount).toBe(1)
          expect((yield* other.receive()).map((message) => message.body)).toEqual([{ n: 5 }])

          // Nothing old is left: a second prune deletes nothing.
          expect(yield* Retention.prune(options)).toEqual({
            entries: 0,
            audit: 0,
            deadLetters: 0,
            replies: 0,
            journals: 0,
            dryRun: false,
            skipped: []
          })
        }).pipe(onDb, Effect.provide(MailboxResolver.layer())),
      TIMEOUT
    )

    it.scoped(
      "a batch deletes at most batchSize rows, and the loop takes them all; the audit log keeps its newest row",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const queue = yield* MergeQueue.make({ prefix })
          for (let i = 0; i < 5; i++) {
            yield* queue.enqueue(`ws-${i}`)
            yield* work(queue, ["failed_terminal"])
          }
          const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
          for (let n = 0; n < 5; n++) {
            const id = yield* jobs.send({ n })
            yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '[]' WHERE seq = ${Number(id)}`
          }
          yield* jobs.receive({ maxMessages: 10 })
          expect(yield* letters.count()).toBe(5)
          const audit = yield* count("merge_queue_audit")
          const newest = (yield* queue.auditLog({ last: 1 }))[0]!.id
          yield* TestClock.adjust("2 hours")

          // One statement: two rows, whatever is left.
          const statements = Statements.make(
            sql,
            {
              entries: `${prefix}merge_queue`,
              audit: `${prefix}merge_queue_audit`,
              messages: `${prefix}mailbox_messages`,
              deadLetters: `${prefix}mailbox_dead_letters`,
              journal: `${prefix}mailbox_journal`
            },
            3_600_000,
            () => 7_200_000
          )
          expect(yield* statements.prune("deadLetters", "jobs", 2)).toBe(2)
          expect(yield* statements.prune("entries", undefined, 2)).toBe(2)
          expect(yield* statements.prune("audit", undefined, 2)).toBe(2)
          expect(yield* letters.count()).toBe(3)

          // The loop: batches of two until one comes short; the audit log's newest row stays even though old.
          const result = yield* Retention.prune({ olderThan: "1 hour", prefix, batchSize: 2, pause: 0 })
          expect(result).toMatchObject({ entries: 3, deadLetters: 3, audit: audit - 3 })
          expect(yield* letters.count()).toBe(0)
          expect(yield* queue.list()).toEqual([])
          expect((yield* queue.auditLog()).map((row) => row.id)).toEqual([newest])
          // A new audit row gets a new id, never one handed out before.
          yield* queue.enqueue("later")
          expect((yield* queue.auditLog({ last: 1 }))[0]!.id).toBeGreaterThan(newest)
        }).pipe(onDb),
      TIMEOUT
    )

    it.scoped(
      "the kinds not asked for are left alone; tables that are not there are skipped, none at all refused",
      () =>
        Effect.gen(function*() {
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
          const sql = yield* SqlClient.SqlClient
          const id = yield* jobs.send({ n: 1 })
          yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '[]' WHERE seq = ${Number(id)}`
          yield* jobs.receive()
          yield* TestClock.adjust("2 hours")
          // No merge queue on this prefix: its kinds are skipped.
          const only = yield* Retention.prune({ olderThan: "1 hour", prefix, kinds: ["audit"], pause: 0 }).pipe(
            Effect.flip
          )
          expect(only._tag).toBe("TablesNotFoundError")
          expect(only.message).toContain(`${prefix}merge_queue_audit`)
          const dry = yield* Retention.prune({ olderThan: "1 hour", prefix, dryRun: true })
          expect(dry).toEqual({
            entries: 0,
            audit: 0,
            deadLetters: 1,
            replies: 0,
            journals: 0,
            dryRun: true,
            skipped: ["entries", "audit"]
          })
          expect(yield* Retention.prune({ olderThan: "1 hour", prefix, kinds: ["replies"], replyQueues: ["jobs"] }))
            .toMatchObject({ deadLetters: 0, replies: 0 })
          expect(yield* count("mailbox_dead_letters")).toBe(1)
          // Nothing was created.
          expect((yield* Effect.flip(count("merge_queue")))._tag).toBe("SqlError")
        }).pipe(onDb),
      TIMEOUT
    )

    it.scoped(
      "the layer prunes at start, then on its schedule; two of them at once share the work",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
          const letter = (n: number) =>
            Effect.gen(function*() {
              const id = yield* jobs.send({ n })
              yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '[]' WHERE seq = ${Number(id)}`
              yield* jobs.receive()
            })
          yield* letter(1)
          yield* TestClock.adjust("90 minutes")
          yield* letter(2)
          yield* TestClock.adjust("30 minutes")
          // Two layers, as two processes would run them, each at start and every hour.
          yield* Layer.build(Layer.merge(
            Retention.layer({ every: "1 hour", olderThan: "1 hour", prefix, pause: 0 }),
            Retention.layer({ every: "1 hour", olderThan: "1 hour", prefix, pause: 0 })
          ))
          // Both passes at start ran (each then sleeps): the 2-hour-old letter went, the 30-minute-old one stays.
          yield* eventually(TestClock.sleeps(), (sleeps) => sleeps.length === 2)
          expect(yield* count("mailbox_dead_letters")).toBe(1)
          // An hour and a half later (past the next passes), the other one has gone too.
          yield* TestClock.adjust("90 minutes")
          expect(yield* eventually(count("mailbox_dead_letters"), (n) => n === 0)).toBe(0)
          yield* eventually(TestClock.sleeps(), (sleeps) => sleeps.length === 2)
        }).pipe(onDb),
      TIMEOUT
    )

    it.scoped(
      "a failed pass is logged as a warning, and the next pass runs on schedule",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const logs = captureLogs()
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, prefix })
          const id = yield* jobs.send({ n: 1 })
          yield* sql`UPDATE ${sql(`${prefix}mailbox_messages`)} SET body = '[]' WHERE seq = ${Number(id)}`
          yield* jobs.receive()
          // A fault inside the database: every delete of a dead letter fails.
          const table = `${prefix}mailbox_dead_letters`
          const name = `${prefix}refuse_delete`
          const pg = backend.label === "PostgreSQL"
          if (pg) {
            yield* sql.unsafe(`CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'injected fault'; END $$`)
            yield* sql.unsafe(
              `CREATE TRIGGER ${name} BEFORE DELETE ON ${table} FOR EACH ROW EXECUTE FUNCTION ${name}()`
            )
          } else {
            yield* sql.unsafe(`CREATE TRIGGER ${name} BEFORE DELETE ON ${table} BEGIN
            SELECT RAISE(ABORT, 'injected fault'); END`)
          }
          yield* TestClock.adjust("2 hours")
          yield* Layer.build(Retention.layer({ every: "1 hour", olderThan: "1 hour", prefix, pause: 0 })).pipe(
            Effect.provide(logs.layer)
          )
          yield* eventually(TestClock.sleeps(), (sleeps) => sleeps.length === 1)
          const warning = logs.lines.find((line) => line.level === "WARN")
          expect(warning?.message).toContain("Retention pass failed")
          expect(yield* count("mailbox_dead_letters")).toBe(1)
          yield* sql.unsafe(pg ? `DROP TRIGGER ${name} ON ${table}` : `DROP TRIGGER ${name}`)
          yield* TestClock.adjust("1 hour")
          expect(yield* eventually(count("mailbox_dead_letters"), (n) => n === 0)).toBe(0)
        }).pipe(onDb),
      TIMEOUT
    )

    it.live(
      "pruning during live traffic loses no live row: every request is answered, every reply received",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const queue = yield* MergeQueue.make({ prefix })
          const work_ = yield* MailboxSql.make({ name: "work", schema: Job, replySchema: Job, prefix })
          const answers = yield* MailboxSql.make({ name: "answers", schema: Job, prefix })
          const messages = sql(`${prefix}mailbox_messages`)
          // Old rows, written old (the database's clock judges them): replies, dead letters, terminal entries.
          for (let n = 0; n < 7; n++) {
            yield* sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at)
              VALUES ('answers', '{"n":-1}', 1000, 1000)`
            yield* sql`INSERT INTO ${sql(`${prefix}mailbox_dead_letters`)}
            (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
            VALUES (${`old-${n}`}, 'work', '{}', 1, 1000, 1000, 'Old', 'old')`
            yield* queue.enqueue(`old-${n}`)
            yield* work(queue, ["cancelled"]).pipe(Effect.ignore)
          }
          yield* sql`UPDATE ${sql(`${prefix}merge_queue`)} SET status = 'cancelled', state_changed_at = 1000`
          yield* sql`UPDATE ${sql(`${prefix}merge_queue_audit`)} SET at = 1000`

          const total = 60
          const received = yield* Ref.make(new Set<number>())
          const merged = yield* Ref.make(0)
          const producer = Effect.forEach(
            Array.from({ length: total }, (_, n) => n),
            (n) => work_.send({ n }, { replyTo: "answers" }),
            { discard: true }
          )
          const worker = Effect.gen(function*() {
            for (const request of yield* work_.receive({ maxMessages: 5, waitTime: "200 millis" })) {
              yield* request.replyAndAcknowledge(request.body)
            }
          }).pipe(Effect.forever)
          const consumer = Effect.gen(function*() {
            while ((yield* Ref.get(received)).size < total) {
              for (const reply of yield* answers.receive({ maxMessages: 5, waitTime: "200 millis" })) {
                if (reply.body.n >= 0) yield* Ref.update(received, (ids) => new Set([...ids, reply.body.n]))
                yield* reply.acknowledge
              }
            }
          })
          const agent = Effect.gen(function*() {
            for (let i = 0; i < 10; i++) {
              yield* queue.enqueue(`live-${i}`)
              yield* work(queue, toMerged)
              yield* Ref.update(merged, (m) => m + 1)
            }
          })
          const pruner = Retention.prune({
            olderThan: "1 hour",
            prefix,
            batchSize: 2,
            pause: 0,
            replyQueues: ["answers"]
          }).pipe(Effect.zipLeft(Effect.sleep("1 millis")), Effect.forever) // let the timers of the traffic run

          const workerFiber = yield* Effect.fork(worker)
          const prunerFiber = yield* Effect.fork(pruner)
          // A lost reply would leave the consumer waiting: the traffic fails after a minute instead.
          yield* Effect.all([producer, consumer, agent], { concurrency: "unbounded" }).pipe(
            Effect.timeoutFail({ duration: "1 minute", onTimeout: () => "a request or a reply was lost" })
          )
          yield* Fiber.interrupt(workerFiber)
          const pruned = yield* Fiber.interrupt(prunerFiber)
          expect(Exit.isInterrupted(pruned)).toBe(true) // it never failed

          // Every request answered once at least, and every answer received.
          expect([...yield* Ref.get(received)].sort((a, b) => a - b)).toEqual(
            Array.from({ length: total }, (_, n) => n)
          )
          expect(yield* Ref.get(merged)).toBe(10)
          expect((yield* queue.list({ status: ["merged"] })).length).toBe(10)
          // The old rows are gone (a last pass for any a batch skipped while a claim held it).
          yield* Retention.prune({ olderThan: "1 hour", prefix, replyQueues: ["answers"], pause: 0 })
          expect(yield* count("mailbox_dead_letters")).toBe(0)
          expect(yield* count("mailbox_messages", "enqueued_at = 1000")).toBe(0)
          expect(yield* count("merge_queue", "state_changed_at = 1000")).toBe(0)
          expect(yield* count("merge_queue_audit", "at = 1000")).toBe(0)
          expect(yield* count("merge_queue_audit")).toBeGreaterThanOrEqual(10 * 8)
        }).pipe(Effect.scoped, onDb, Effect.provide(MailboxResolver.layer())),
      TIMEOUT
    )

    it.live(
      "a cutoff shorter than the traffic's age races every claim: no in-progress entry or received reply goes",
      () =>
        Effect.gen(function*() {
          const queue = yield* MergeQueue.make({ prefix })
          const work_ = yield* MailboxSql.make({ name: "work", schema: Job, replySchema: Job, prefix })
          const answers = yield* MailboxSql.make({ name: "answers", schema: Job, prefix })
          const total = 60
          const answered = yield* Ref.make(0)
          const producer = Effect.forEach(
            Array.from({ length: total }, (_, n) => n),
            (n) => work_.send({ n }, { replyTo: "answers" }),
            { discard: true }
          )
          // The requests' queue is not a reply queue: every request is answered, pruning or not.
          const worker = Effect.gen(function*() {
            while ((yield* Ref.get(answered)) < total) {
              for (const request of yield* work_.receive({ maxMessages: 5, waitTime: "200 millis" })) {
                yield* request.replyAndAcknowledge(request.body)
                yield* Ref.update(answered, (n) => n + 1)
              }
            }
          })
          // Replies may go before they are read (they are older than the cutoff at once), but one received is in
          // flight: its acknowledgement must find it.
          const consumer = Effect.gen(function*() {
            for (
              const reply of yield* answers.receive({
                maxMessages: 5,
                visibilityTimeout: "5 minutes",
                waitTime: "100 millis"
              })
            ) {
              yield* reply.acknowledge
            }
          }).pipe(Effect.forever)
          // Every transition of an in-progress entry must find it, however long it waited in a status (older than
          // the cutoff); terminal ones go as soon as they are made.
          const agent = Effect.gen(function*() {
            for (let i = 0; i < 10; i++) {
              yield* queue.enqueue(`live-${i}`)
              yield* Effect.sleep("5 millis")
              const claim = Option.getOrThrow(yield* queue.nextWithLock("agent-1"))
              for (const status of toMerged) {
                yield* Effect.sleep("5 millis")
                yield* queue.transition(claim, status)
              }
              yield* queue.releaseProcessingLock(claim)
            }
          })
          const pruner = Retention.prune({
            olderThan: "1 millis",
            prefix,
            batchSize: 2,
            pause: 0,
            replyQueues: ["answers"]
          }).pipe(Effect.zipLeft(Effect.sleep("1 millis")), Effect.forever) // let the timers of the traffic run
          const consumerFiber = yield* Effect.fork(consumer)
          const prunerFiber = yield* Effect.fork(pruner)
          yield* Effect.all([producer, worker, agent], { concurrency: "unbounded" }).pipe(
            Effect.timeoutFail({ duration: "1 minute", onTimeout: () => "a request was lost" })
          )
          const consumed = yield* Fiber.interrupt(consumerFiber)
          const pruned = yield* Fiber.interrupt(prunerFiber)
          expect([Exit.isInterrupted(consumed), Exit.isInterrupted(pruned)]).toEqual([true, true]) // neither failed
          expect(yield* Ref.get(answered)).toBe(total)
          expect(yield* queue.list({ status: ["pending", ...MergeQueue.inProgress] })).toEqual([])
        }).pipe(Effect.scoped, onDb, Effect.provide(MailboxResolver.layer())),
      TIMEOUT
    )

    it.live(
      "an olderThan under 1 ms or over 100 years is an InvalidParameterError naming it and the bound, deleting nothing",
      () =>
        Effect.gen(function*() {
          const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
          const sql = yield* SqlClient.SqlClient
          yield* sql`INSERT INTO ${sql(`${prefix}mailbox_dead_letters`)}
            (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
            VALUES ('recent', 'jobs', '{}', 1, 0, ${Sql.databaseNow(sql)} - 50, 'Old', 'old')`
          for (
            const [olderThan, bound] of [
              [Duration.micros(100n), "at least 1 millisecond"],
              ["0.4 millis", "at least 1 millisecond"],
              [1e22, "at most 36500 days"],
              [Duration.days(36_501), "at most 36500 days"],
              [Number.MAX_VALUE, "at most 36500 days"]
            ] as const
          ) {
            for (const dryRun of [false, true]) {
              const error = yield* Effect.flip(Retention.prune({ olderThan, prefix, dryRun }))
              expect(error._tag, String(olderThan)).toBe("InvalidParameterError")
              expect(error.message, String(olderThan)).toContain("olderThan")
              expect(error.message, String(olderThan)).toContain(bound)
            }
            const layerError = yield* Effect.flip(
              Layer.build(Retention.layer({ every: "1 hour", olderThan, prefix })).pipe(Effect.scoped)
            )
            expect(layerError._tag).toBe("InvalidParameterError")
          }
          // Nothing went (a 0 ms cutoff took the 50 ms old letter): it is still there.
          expect(yield* letters.count()).toBe(1)
          // The bounds themselves are taken, on either database alike (the letter is 50 ms old).
          const at = (olderThan: Duration.Duration) =>
            Effect.map(
              Retention.prune({ olderThan, prefix, kinds: ["deadLetters"], dryRun: true }),
              (result) => result.deadLetters
            )
          expect([yield* at(Retention.minAge), yield* at(Retention.maxAge)]).toEqual([1, 0])
        }).pipe(onDb)
    )

    it.effect("bad options are a ParseError naming them", () =>
      Effect.gen(function*() {
        for (
          const [options, field] of [
            [{ olderThan: 0 }, "olderThan"],
            [{ olderThan: "-1 hours" }, "olderThan"],
            [{ olderThan: "soon" }, "olderThan"],
            [{ olderThan: "1 hour", batchSize: 0 }, "batchSize"],
            [{ olderThan: "1 hour", kinds: [] }, "kinds"],
            [{ olderThan: "1 hour", replyQueues: [""] }, "replyQueues"],
            [{ olderThan: "1 hour", prefix: "Bad-" }, "prefix"]
          ] as const
        ) {
          const error = yield* Effect.flip(Retention.prune(options as Retention.Options))
          expect(error._tag).toBe("ParseError")
          expect(error.message).toContain(field)
        }
        const layerError = yield* Effect.flip(
          Layer.build(Retention.layer({ every: 0, olderThan: "1 hour" })).pipe(Effect.scoped)
        )
        expect(layerError.message).toContain("every")
      }).pipe(onDb))
  })
}
