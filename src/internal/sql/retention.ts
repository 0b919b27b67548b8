/**
 * Retention's statements: for each kind of row leasehold would otherwise keep for ever, a count of the rows
 * older than a cutoff and a delete of at most `limit` of them, each delete one short write transaction.
 * `Retention.ts` decides what to prune and loops over the batches; this file is the SQL.
 *
 * What may go, and why nothing live can:
 * - merge-queue entries in a terminal status (`merged`, `failed_terminal`, `cancelled`: no move leaves one),
 *   by the time they reached it (`state_changed_at`). A queued or in-progress entry is never matched, and a
 *   terminal one is written by nobody, so the delete takes no merge-queue lock row and waits for no agent;
 * - the audit log's oldest rows: the prefix of the log (by id) up to its first row newer than the cutoff, never
 *   its newest row. So the log stays contiguous, and SQLite's audit id (an INTEGER PRIMARY KEY since merge-queue
 *   migration 3, which hands out the largest id plus one) is never handed out twice;
 * - dead letters, by when they were dead-lettered;
 * - step journals (mailbox migration 11) whose message is no longer in the messages table and that no dead
 *   letter keeps (acknowledged by a delivery that did not delete it — an older version's, or one that never read
 *   it —, a dead letter deleted or redriven), step by step, by when each step was recorded. A message's seq is
 *   never handed out again, so a journal whose message is gone is written by nobody; a journal whose message or
 *   dead letter still exists is never matched;
 * - messages of the queues named as reply queues that are visible (not in flight, not delayed) and were
 *   enqueued before the cutoff. On PostgreSQL a row a claim holds is skipped (`FOR UPDATE SKIP LOCKED`, as the
 *   claim itself does), and a row claimed before the delete locked it no longer matches once re-read; on
 *   SQLite the delete holds the file's write lock (`Sql.writeTransaction`), so no claim runs in between.
 *
 * Every delete reads along an index, or the primary key, and stops after `limit` rows.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Effect from "effect/Effect"
import { terminal } from "../mergeQueue/statuses.js"
import * as Sql from "./common.js"

/** The kinds of rows retention prunes. */
export const kinds = ["entries", "audit", "deadLetters", "replies", "journals"] as const

/** A kind of rows retention prunes. */
export type Kind = typeof kinds[number]

/** The tables of one prefix that retention touches. */
export interface Tables {
  readonly entries: string
  readonly audit: string
  readonly messages: string
  readonly deadLetters: string
  readonly journal: string
}

/** Retention's statements on one client, with the cutoff fixed: `olderThanMillis` before the time a statement runs. */
export interface Statements {
  /** How many rows of `kind` (of `queue`, for dead letters and replies) a prune would delete now. */
  readonly count: (kind: Kind, queue: string | undefined) => Effect.Effect<number, SqlError>
  /** Deletes at most `limit` of them in one write transaction; how many it deleted. */
  readonly prune: (kind: Kind, queue: string | undefined, limit: number) => Effect.Effect<number, SqlError>
  /** The source queues the dead-letter table holds letters of. */
  readonly deadLetterQueues: Effect.Effect<ReadonlyArray<string>, SqlError>
}

/**
 * The statements for `tables` on `sql`. `testNow`: the test's time under `TestClock` (`Sql.testTime`), else
 * `undefined` — the database's clock, read by each statement, judges age (on PostgreSQL, several machines'
 * clocks agree on it).
 */
export const make = (
  sql: SqlClient.SqlClient,
  tables: Tables,
  olderThanMillis: number,
  testNow: (() => number) | undefined
): Statements => {
  const pg = Sql.dialectOf(sql) === "pg"
  const databaseNow = Sql.databaseNow(sql)
  const now = (): Statement.Fragment =>
    testNow === undefined ? databaseNow : pg ? sql`${testNow()}::bigint` : sql`${testNow()}`
  const cutoff = () => pg ? sql`(${now()} - ${olderThanMillis}::bigint)` : sql`(${now()} - ${olderThanMillis})`
  const entries = sql(tables.entries)
  const audit = sql(tables.audit)
  const messages = sql(tables.messages)
  const deadLetters = sql(tables.deadLetters)
  const journal = sql(tables.journal)
  // A claim holds the rows it takes: skip them rather than wait (PostgreSQL); SQLite's write lock is the file's.
  const skipLocked = pg ? sql`FOR UPDATE SKIP LOCKED` : sql``

  /** The rows of a kind that may go (audit's are a prefix of the log: below), and the index order to take them in. */
  const rule = (kind: Exclude<Kind, "audit" | "journals">, queue: string | undefined) => {
    switch (kind) {
      case "entries":
        return {
          table: entries,
          key: sql("id"),
          where: sql`${sql.in("status", terminal)} AND state_changed_at < ${cutoff()}`,
          order: sql`id`
        }
      case "deadLetters":
        return {
          table: deadLetters,
          key: sql("id"),
          where: sql`queue = ${queue ?? ""} AND dead_lettered_at < ${cutoff()}`,
          order: sql`dead_lettered_at, id`
        }
      case "replies":
        return {
          table: messages,
          key: sql("seq"),
          where: sql`queue = ${queue ?? ""} AND visible_at <= ${now()} AND enqueued_at < ${cutoff()}`,
          order: sql`visible_at, seq`
        }
    }
  }

  /** Audit rows before the first one newer than the cutoff, and before the newest row. */
  const auditCount = Effect.map(
    sql<{ n: number | string }>`SELECT count(*) AS n FROM ${audit} WHERE id < COALESCE(
      (SELECT min(id) FROM ${audit} WHERE at >= ${cutoff()}), (SELECT max(id) FROM ${audit}))`,
    (rows) => Number(rows[0]?.n ?? 0)
  )

  /**
   * The log's first `limit + 1` rows by id (so at most that many are read): the leading ones older than the
   * cutoff go, but never the table's newest (when fewer than `limit + 1` came back, the last is the newest).
   */
  const auditPrune = (limit: number) =>
    Effect.flatMap(
      sql<{ id: number | string; old: number | string | boolean }>`SELECT id,
        CASE WHEN at < ${cutoff()} THEN 1 ELSE 0 END AS old FROM ${audit} ORDER BY id LIMIT ${limit + 1}`,
      (rows) => {
        const bound = rows.length <= limit ? rows.length - 1 : limit
        let old = 0
        while (old < bound && Number(rows[old]!.old) === 1) old++
        if (old === 0) return Effect.succeed(0)
        return Effect.map(
          sql`DELETE FROM ${audit} WHERE ${sql.in("id", rows.slice(0, old).map((row) => Number(row.id)))} RETURNING id`,
          (deleted) => deleted.length
        )
      }
    )

  /**
   * Steps older than the cutoff whose message and dead letter are both gone (a dead letter keeps its journal until
   * the letter itself goes). The table's primary key is two columns: its own statements.
   */
  const orphaned =
    sql`recorded_at < ${cutoff()} AND NOT EXISTS (SELECT 1 FROM ${messages} m WHERE m.seq = j.message_seq)
    AND NOT EXISTS (SELECT 1 FROM ${deadLetters} d WHERE d.id = CAST(j.message_seq AS TEXT))`
  const journalCount = Effect.map(
    sql<{ n: number | string }>`SELECT count(*) AS n FROM ${journal} j WHERE ${orphaned}`,
    (rows) => Number(rows[0]?.n ?? 0)
  )
  const journalPrune = (limit: number) =>
    Effect.map(
      sql`DELETE FROM ${journal} WHERE (message_seq, position) IN (
        SELECT message_seq, position FROM ${journal} j WHERE ${orphaned} ORDER BY recorded_at LIMIT ${limit} ${skipLocked})
      RETURNING message_seq`,
      (deleted) => deleted.length
    )

  return {
    count: (kind, queue) => {
      if (kind === "audit") return auditCount
      if (kind === "journals") return journalCount
      const { table, where } = rule(kind, queue)
      return Effect.map(
        sql<{ n: number | string }>`SELECT count(*) AS n FROM ${table} WHERE ${where}`,
        (rows) => Number(rows[0]?.n ?? 0)
      )
    },
    prune: (kind, queue, limit) =>
      Sql.writeTransaction(sql)(Effect.suspend(() => {
        if (kind === "audit") return auditPrune(limit)
        if (kind === "journals") return journalPrune(limit)
        const { key, order, table, where } = rule(kind, queue)
        return Effect.map(
          sql`DELETE FROM ${table} WHERE ${key} IN (
            SELECT ${key} FROM ${table} WHERE ${where} ORDER BY ${order} LIMIT ${limit} ${skipLocked})
          RETURNING ${key}`,
          (deleted) => deleted.length
        )
      })),
    deadLetterQueues: Effect.map(
      sql<{ queue: string }>`SELECT DISTINCT queue FROM ${deadLetters} ORDER BY queue`,
      (rows) => rows.map((row) => row.queue)
    )
  }
}
