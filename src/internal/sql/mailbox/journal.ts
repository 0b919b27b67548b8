/**
 * The step journal's statements (the storage `internal/mailbox/journal.ts` describes), one table per prefix
 * (mailbox migration 11): a delivery's steps are rows keyed by its message's seq and their position. An append
 * is written only while the delivery holds the message — checked in the insert itself, which selects the
 * message row by seq, receipt handle and visibility (on PostgreSQL locking it `FOR SHARE`, so a claim and the
 * append serialise) — and the appends of a mailbox's concurrent loops go together in one statement (a
 * `GroupCommit`). The journal goes with the message's acknowledgement (`statements.ts`, `SettleItem.journal`),
 * with its queue's purge (a dead letter's stays), or by retention once its message and dead letter are gone
 * (`retention.ts`).
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import { maxSteps, type StoredStep } from "../../mailbox/journal.js"
import * as Sql from "../common.js"
import { GroupCommit } from "../groupCommit.js"
import { batchLimits } from "./batching.js"
import type { Now, Statements } from "./statements.js"
import type { Store } from "./store.js"

/** One step to record, with the delivery that records it. */
export interface AppendItem {
  readonly seq: string
  readonly handle: string
  readonly step: StoredStep
}

/** Appends committed together: each item's outcome, `false` when its delivery no longer held the message. */
export type AppendBatcher = GroupCommit<AppendItem, boolean, SqlError>

/** The journal's row as read. */
interface StepRow {
  readonly position: number | string
  readonly step_key: string
  readonly entry: string
  readonly request_id: string | null
}

/** The steps of message `seq`, in position order. */
export const load = (store: Store, seq: string): Effect.Effect<ReadonlyArray<StoredStep>, SqlError> => {
  const { sql } = store
  return Effect.map(
    sql<StepRow>`SELECT position, step_key, entry, request_id FROM ${sql(store.journal)}
      WHERE message_seq = ${Number(seq)} ORDER BY position LIMIT ${maxSteps + 1}`,
    (rows) =>
      rows.map((row): StoredStep => ({
        position: Number(row.position),
        key: row.step_key,
        entry: row.entry,
        requestId: row.request_id ?? undefined
      }))
  )
}

/**
 * Inserts the items whose delivery still holds its message (handle current, visibility not run out), in one
 * statement: whether each was written. A step already recorded at the same position or key fails the statement
 * (the group commit then retries the items alone, so only that one fails).
 */
export const append = (
  store: Store,
  statements: Statements,
  items: ReadonlyArray<AppendItem>,
  now: Now
): Effect.Effect<ReadonlyArray<boolean>, SqlError> => {
  const { sql } = store
  const journal = sql(store.journal)
  const messages = sql(store.messages)
  const at = statements.at(now)
  const written = (rows: ReadonlyArray<{ message_seq: number | string; position: number | string }>) => {
    const done = new Set(rows.map((row) => `${row.message_seq} ${row.position}`))
    return items.map((item) => done.has(`${item.seq} ${item.step.position}`))
  }
  if (store.dialect === "pg") {
    const input = JSON.stringify(items.map((item) => ({
      seq: item.seq,
      handle: item.handle,
      position: item.step.position,
      key: item.step.key,
      entry: item.step.entry,
      request: item.step.requestId ?? null
    })))
    // The message row is locked (FOR SHARE) while the steps go in: a claim (FOR UPDATE SKIP LOCKED) skips it
    // meanwhile, and an append that waited for a claim re-reads the row and finds another handle.
    return Effect.map(
      store.onLane((lane) =>
        lane<{ message_seq: string; position: number }>`INSERT INTO ${journal}
          (message_seq, position, step_key, queue, request_id, entry, recorded_at)
        SELECT m.seq, v.position, v.key, m.queue, v.request, v.entry, ${at}
        FROM json_to_recordset(${input}::json)
            AS v (seq bigint, handle text, position integer, key text, entry text, request text)
          JOIN ${messages} m ON m.seq = v.seq AND m.receipt_handle = v.handle AND m.visible_at > ${at}
        FOR SHARE OF m
        RETURNING message_seq, position`
      ),
      written
    )
  }
  const input = JSON.stringify(items.map((item) => [
    Number(item.seq),
    item.handle,
    item.step.position,
    item.step.key,
    item.step.entry,
    item.step.requestId ?? null
  ]))
  // In a write transaction, so the check and the insert see the message as the file has it (no claim between).
  return Effect.map(
    Sql.writeTransaction(sql)(
      sql<{ message_seq: number; position: number }>`INSERT INTO ${journal}
        (message_seq, position, step_key, queue, request_id, entry, recorded_at)
      SELECT m.seq, json_extract(v.value, '$[2]'), json_extract(v.value, '$[3]'), m.queue,
        json_extract(v.value, '$[5]'), json_extract(v.value, '$[4]'), ${at}
      FROM json_each(${input}) v
        JOIN ${messages} m ON m.seq = json_extract(v.value, '$[0]') AND m.receipt_handle = json_extract(v.value, '$[1]')
          AND m.visible_at > ${at}
      ORDER BY v.key
      RETURNING message_seq, position`
    ),
    written
  )
}

/**
 * Deletes the steps of message `seq` at `fromPosition` and after, if the delivery still holds the message
 * (checked as `append` checks, in the same statement or transaction); whether it did.
 */
export const truncate = (
  store: Store,
  statements: Statements,
  seq: string,
  handle: string,
  fromPosition: number,
  now: Now
): Effect.Effect<boolean, SqlError> => {
  const { sql } = store
  const journal = sql(store.journal)
  const messages = sql(store.messages)
  const at = statements.at(now)
  if (store.dialect === "pg") {
    return Effect.map(
      store.onLane((lane) =>
        lane<{ held: number | string }>`WITH m AS (
            SELECT seq FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle} AND visible_at > ${at}
            FOR SHARE),
          gone AS (DELETE FROM ${journal} WHERE message_seq IN (SELECT seq FROM m) AND position >= ${fromPosition})
          SELECT count(*) AS held FROM m`
      ),
      (rows) => Number(rows[0]?.held ?? 0) > 0
    )
  }
  return Sql.writeTransaction(sql)(Effect.gen(function*() {
    const held = yield* sql`SELECT seq FROM ${messages}
      WHERE seq = ${Number(seq)} AND receipt_handle = ${handle} AND visible_at > ${at}`
    if (held.length === 0) return false
    yield* sql`DELETE FROM ${journal} WHERE message_seq = ${Number(seq)} AND position >= ${fromPosition}`
    return true
  }))
}

/** The appends of a mailbox's messages, committed together (one bad item fails alone). */
export const appendBatcher = (store: Store, statements: Statements, now: () => Now): AppendBatcher =>
  new GroupCommit((items) => append(store, statements, items, now()), {
    ...batchLimits,
    sizeOf: (item) => 96 + item.step.entry.length + item.step.key.length,
    retryAlone: Sql.isDataError
  })

/** Whether the database has the journal table (a database before mailbox migration 11 has not). */
export const present = (store: Store): Effect.Effect<boolean, SqlError> =>
  Effect.map(Sql.missingTables(store.sql, [store.journal]), (missing) => missing.length === 0)
