/**
 * `leasehold prune`, run as a child process (bundled from src/bin/leasehold.ts as the package does) against a
 * real SQLite file and a throwaway PostgreSQL, each seeded by the library with rows of every kind and then
 * aged by the database's own columns (the command judges age by the database's clock): `--dry-run` counts and
 * deletes nothing, a prune deletes exactly those rows in small batches and a second finds nothing, live rows
 * stay; bad `--older-than` and `--batch-size` are usage errors (exit 2); a database without leasehold's tables
 * exits 1 naming them; two processes pruning the same database at once delete every old row once between them.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Option, Schema, Scope } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MergeQueue from "../src/MergeQueue.js"
import { leasehold } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-cli-prune-"))
const sqliteFile = join(directory, "prune.db")
const TIMEOUT = 120_000

const Job = Schema.Struct({ n: Schema.Number })

/**
 * Rows of every kind, then made old (epoch + 1 s) where they may go: three terminal entries (merged, failed,
 * cancelled), one pending and one in progress; the audit log; two replies on "answers", one unanswered request
 * on "jobs"; one dead letter. Then one recent dead letter.
 */
const seed = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const queue = yield* MergeQueue.make()
  for (let i = 0; i < 5; i++) yield* queue.enqueue(`ws-${i}`)
  for (
    const path of [["rebasing", "testing", "ready_to_merge", "merging", "merged"], ["failed_terminal"], [
      "cancelled"
    ]] as const
  ) {
    const claim = Option.getOrThrow(yield* queue.nextWithLock("agent-1"))
    for (const status of path) yield* queue.transition(claim, status)
    yield* queue.releaseProcessingLock(claim)
  }
  yield* queue.nextWithLock("agent-2") // ws-3 in progress; ws-4 pending
  const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job })
  for (let n = 1; n <= 3; n++) yield* jobs.send({ n }, { replyTo: "answers" })
  for (const request of yield* jobs.receive({ maxMessages: 2 })) yield* request.replyAndAcknowledge(request.body)
  const corrupt = yield* jobs.send({ n: 4 })
  yield* sql`UPDATE leasehold_mailbox_messages SET body = '[]' WHERE seq = ${Number(corrupt)}`
  yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "1 hour" }) // dead-letters it; request 3 in flight
  yield* sql`UPDATE leasehold_merge_queue SET state_changed_at = 1000`
  yield* sql`UPDATE leasehold_merge_queue_audit SET at = 1000`
  yield* sql`UPDATE leasehold_mailbox_messages SET enqueued_at = 1000`
  yield* sql`UPDATE leasehold_mailbox_dead_letters SET dead_lettered_at = 1000`
  const recent = yield* jobs.send({ n: 5 })
  yield* sql`UPDATE leasehold_mailbox_messages SET body = '[]' WHERE seq = ${Number(recent)}`
  yield* jobs.receive({ maxMessages: 10 })
  const audit = yield* sql<{ n: number | string }>`SELECT count(*) AS n FROM leasehold_merge_queue_audit`
  return Number(audit[0]!.n)
}).pipe(Effect.scoped)

/** 40 old dead letters under `conc_`, for two processes at once. */
const seedLetters = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* MailboxSqlAdmin.deadLetters({ prefix: "conc_" })
  for (let n = 0; n < 40; n++) {
    yield* sql`INSERT INTO conc_mailbox_dead_letters
      (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
      VALUES (${`old-${n}`}, ${`queue-${n % 3}`}, '{}', 1, 1000, 1000, 'Old', 'old')`
  }
})

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
const audits = { sqlite: 0, pg: 0 }
beforeAll(async () => {
  const run = <A>(
    effect: Effect.Effect<A, unknown, MailboxSql.Services>,
    layer: Layer.Layer<MailboxSql.Services, unknown>
  ) => Effect.runPromise(Effect.provide(effect, layer))
  audits.sqlite = await run(seed, MailboxSql.layerSqlite({ filename: sqliteFile }))
  await run(seedLetters, MailboxSql.layerSqlite({ filename: sqliteFile }))
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
  audits.pg = await run(seed, MailboxSql.layerPg({ url: pgUrl }))
  await run(seedLetters, MailboxSql.layerPg({ url: pgUrl }))
}, TIMEOUT)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const targets = [
  { label: "SQLite", db: () => sqliteFile, audit: () => audits.sqlite },
  { label: "PostgreSQL", db: () => pgUrl, audit: () => audits.pg }
] as const

for (const target of targets) {
  describe(`leasehold prune on ${target.label}`, () => {
    it.live(
      "--dry-run counts and deletes nothing; a prune deletes exactly those rows; a second finds none",
      () =>
        Effect.gen(function*() {
          const db = target.db()
          const expected = {
            entries: 3,
            audit: target.audit() - 1,
            deadLetters: 1,
            replies: 2,
            journals: 0,
            skipped: []
          }
          const args = ["prune", "--db", db, "--older-than", "7d", "--reply-queue", "answers"]
          const dry = yield* leasehold(...args, "--dry-run", "--json")
          expect(dry.code).toBe(0)
          expect(JSON.parse(dry.stdout)).toEqual({ ...expected, dryRun: true, olderThan: "7d" })
          // Nothing went: the same again.
          expect(JSON.parse((yield* leasehold(...args, "--dry-run", "--json")).stdout)).toMatchObject(expected)

          // Without --reply-queue no reply is looked at, and the text says so.
          const noReplies = yield* leasehold("prune", "--db", db, "--older-than", "7d", "--dry-run")
          expect(noReplies.code).toBe(0)
          expect(noReplies.stdout).toMatch(/would delete rows older than 7d:/)
          expect(noReplies.stdout).toMatch(/merge-queue entries \(merged, failed, cancelled\)\s+3/)
          expect(noReplies.stdout).toMatch(/unread replies\s+0/)
          expect(noReplies.stdout).toContain("no --reply-queue given")

          const pruned = yield* leasehold(...args, "--batch-size", "2", "--json")
          expect(pruned.code).toBe(0)
          expect(JSON.parse(pruned.stdout)).toEqual({ ...expected, dryRun: false, olderThan: "7d" })
          const again = yield* leasehold(...args)
          expect(again.stdout).toMatch(/deleted rows older than 7d:/)
          expect(again.stdout).toMatch(/dead letters\s+0/)
          expect(again.stdout).toMatch(/unread replies\s+0/)

          // What was live is all there: the pending and in-progress entries, the request in flight, the recent
          // dead letter, the newest audit row.
          const entries = yield* leasehold("queue", "list", "--db", db, "--json")
          expect((JSON.parse(entries.stdout) as Array<{ status: string }>).map((e) => e.status).sort()).toEqual([
            "claimed",
            "pending"
          ])
          const stats = JSON.parse((yield* leasehold("mailbox", "stats", "--db", db, "--json")).stdout) as Array<
            { queue: string; inFlight: number; queued: number; deadLetters: number }
          >
          expect(stats.map(({ deadLetters, inFlight, queue, queued }) => ({ queue, queued, inFlight, deadLetters })))
            .toEqual([{ queue: "jobs", queued: 0, inFlight: 1, deadLetters: 1 }])
        }),
      TIMEOUT
    )

    it.live(
      "an age under 1 ms or over 100 years is a usage error (exit 2) naming --older-than and the bound, alike on both",
      () =>
        Effect.gen(function*() {
          for (
            const [age, bound] of [
              ["0.0001s", "at least 1 millisecond"],
              ["0.5 millis", "at least 1 millisecond"],
              ["300000000000000000d", "at most 36500 days"],
              ["36501d", "at most 36500 days"]
            ] as const
          ) {
            // A dry run: before the bound, the first counted every row as old, the third failed on PostgreSQL only.
            const run = yield* leasehold("prune", "--db", target.db(), "--older-than", age, "--dry-run")
            expect(run.code, age).toBe(2)
            expect(run.stdout + run.stderr, age).toContain("--older-than")
            expect(run.stdout + run.stderr, age).toContain(bound)
          }
          // The bounds themselves are taken.
          for (const age of ["1 millis", "36500d"]) {
            const run = yield* leasehold("prune", "--db", target.db(), "--older-than", age, "--dry-run", "--json")
            expect(run.code, age).toBe(0)
          }
        }),
      TIMEOUT
    )

    it.live("two processes pruning at once delete every old row once between them", () =>
      Effect.gen(function*() {
        const args = ["prune", "--db", target.db(), "--prefix", "conc_", "--older-than", "1h", "--json"]
        const both = yield* Effect.all(
          [leasehold(...args, "--batch-size", "3"), leasehold(...args, "--batch-size", "2")],
          { concurrency: 2 }
        )
        expect(both.map((run) => run.code)).toEqual([0, 0])
        const counts = both.map((run) => JSON.parse(run.stdout) as { deadLetters: number; skipped: Array<string> })
        expect(counts[0]!.deadLetters + counts[1]!.deadLetters).toBe(40)
        expect(counts[0]!.skipped).toEqual(["entries", "audit"])
        const left = yield* leasehold(...args.filter((arg) => arg !== "--json"), "--dry-run")
        expect(left.stdout).toMatch(/dead letters\s+0/)
        expect(left.stdout).toMatch(/merge-queue audit rows\s+- \(no such tables\)/)
      }), TIMEOUT)
  })
}

describe("leasehold prune's usage", () => {
  it.live(
    "a bad or non-positive --older-than, or a bad --batch-size, is a usage error (exit 2) naming it",
    () =>
      Effect.gen(function*() {
        for (const age of ["0d", "0", "-3d", "soon", "7 parsecs", "0 hours", ""]) {
          const run = yield* leasehold("prune", "--db", sqliteFile, "--older-than", age)
          expect(run.code, age).toBe(2)
          expect(run.stdout + run.stderr, age).toContain("--older-than")
        }
        for (const size of ["0", "10001", "-1"]) {
          const run = yield* leasehold("prune", "--db", sqliteFile, "--older-than", "7d", "--batch-size", size)
          expect(run.code, size).toBe(2)
          expect(run.stdout + run.stderr, size).toContain("--batch-size")
        }
        const missing = yield* leasehold("prune", "--db", sqliteFile)
        expect(missing.code).toBe(2)
        expect(missing.stdout + missing.stderr).toContain("older-than")
        // Words and the short forms both parse.
        for (const age of ["36 hours", "2w", "90s", "1.5d"]) {
          const run = yield* leasehold("prune", "--db", sqliteFile, "--older-than", age, "--dry-run")
          expect(run.code, age).toBe(0)
        }
      }),
    TIMEOUT
  )

  it.live(
    "a database without leasehold's tables exits 1 naming them; an unreachable one exits 1 without its password",
    () =>
      Effect.gen(function*() {
        const empty = join(directory, "empty.db")
        writeFileSync(empty, "")
        const run = yield* leasehold("prune", "--db", empty, "--older-than", "7d")
        expect(run.code).toBe(1)
        expect(run.stderr).toContain("no leasehold tables with prefix \"leasehold_\"")
        expect(run.stderr).toContain("leasehold_mailbox_dead_letters")
        const wrongPrefix = yield* leasehold("prune", "--db", sqliteFile, "--older-than", "7d", "--prefix", "nope_")
        expect(wrongPrefix.code).toBe(1)
        // An unreachable server: exit 1, its password never shown.
        const unreachable = yield* leasehold(
          "prune",
          "--db",
          "postgres://app:hunter22@127.0.0.1:1/app",
          "--older-than",
          "7d"
        )
        expect(unreachable.code).toBe(1)
        expect(unreachable.stdout + unreachable.stderr).not.toContain("hunter22")
      }),
    TIMEOUT
  )
})
