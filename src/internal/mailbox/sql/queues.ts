/**
 * The queues table (mailbox migration 10, `<prefix>mailbox_queues`): one row per queue a process sent to —
 * its name, when it was first recorded, and whether it is paused. It keeps an empty queue listed for the
 * operator until it is dropped, and holds the pause a claim honours (the claim statement of each dialect
 * looks the queue's row up by its primary key: see statements.ts and store.ts).
 *
 * A send records its queue once per store and process (`record`): the first send's batch upserts the row,
 * later ones write nothing more. A dropped queue that a running process sends to again is not recorded again
 * by that process: it is listed while it has rows, as before migration 10.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Sql from "../../sql/common.js"
import type { Now } from "./statements.js"
import type { Store } from "./store.js"

/** The queues table's name under `prefix`. */
export const tableOf = (prefix: string) => `${prefix}mailbox_queues`

/** Migration 10: the table, and a row for every queue that has messages or dead letters already. */
export const create = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const table = sql(tableOf(store.prefix))
  return Effect.all([
    // `paused` is 0 or 1 on both dialects: the claim compares it the same way everywhere.
    sql`CREATE TABLE IF NOT EXISTS ${table} (
      name TEXT PRIMARY KEY,
      created_at BIGINT NOT NULL,
      paused INTEGER NOT NULL DEFAULT 0)`,
    sql`INSERT INTO ${table} (name, created_at, paused)
      SELECT queue, MIN(enqueued_at), 0 FROM (
        SELECT queue, enqueued_at FROM ${sql(store.messages)}
        UNION ALL SELECT queue, enqueued_at FROM ${sql(store.deadLetters)}) q
      GROUP BY queue
      ON CONFLICT (name) DO NOTHING`
  ], { discard: true })
}

/** `now` as SQL: the test's time, or the database's clock. */
const at = (store: Store, now: Now) =>
  now === undefined
    ? Sql.databaseNow(store.sql)
    : store.dialect === "pg"
    ? store.sql`${now}::bigint`
    : store.sql`${now}`

/**
 * Records `queue` (once per store in this process: the hot path writes nothing more). Runs before the first
 * send's insert, in its batch.
 */
export const record = (store: Store, queue: string, now: Now): Effect.Effect<void, SqlError> =>
  Effect.suspend(() => {
    if (store.recorded.has(queue)) return Effect.void
    const { sql } = store
    return Effect.as(
      sql`INSERT INTO ${sql(tableOf(store.prefix))} (name, created_at, paused) VALUES (${queue}, ${at(store, now)}, 0)
        ON CONFLICT (name) DO NOTHING`,
      undefined
    ).pipe(Effect.tap(() => Effect.sync(() => store.recorded.add(queue))))
  })

/** A row of the queues table. */
export interface QueueRow {
  readonly name: string
  readonly createdAt: number
  readonly paused: boolean
}

/** Every recorded queue, by name. */
export const list = (store: Store): Effect.Effect<ReadonlyArray<QueueRow>, SqlError> => {
  const { sql } = store
  return Effect.map(
    sql<{ name: string; created_at: number | string; paused: number | string }>`SELECT name, created_at, paused
      FROM ${sql(tableOf(store.prefix))} ORDER BY name`,
    (rows) =>
      rows.map((row) => ({ name: row.name, createdAt: Number(row.created_at), paused: Number(row.paused) !== 0 }))
  )
}

/**
 * Pauses or resumes `queue` (recording it if it was not). A resume wakes the queue's receivers: on PostgreSQL
 * by a notification, which reaches other processes; elsewhere receivers see it at their next poll.
 */
export const setPaused = (store: Store, queue: string, paused: boolean): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const upsert = sql`INSERT INTO ${sql(tableOf(store.prefix))} (name, created_at, paused)
    VALUES (${queue}, ${Sql.databaseNow(sql)}, ${paused ? 1 : 0})
    ON CONFLICT (name) DO UPDATE SET paused = ${paused ? 1 : 0}`
  return Effect.zipRight(
    upsert,
    paused ? Effect.void : Effect.sync(() => store.wake(queue)).pipe(
      Effect.zipRight(store.dialect === "pg" ? sql`SELECT pg_notify(${store.channel}, ${queue})` : Effect.void),
      Effect.asVoid
    )
  )
}

/** What `drop` found: the row deleted, a queue that still has messages, or no such row. */
export type Dropped = "dropped" | "not empty" | "unknown"

/**
 * Deletes `queue`'s row if the queue has no messages, and nothing else: its dead letters, if any, keep it listed
 * while they last, and keep their journals (a journal goes with its message or its dead letter, or by retention).
 */
export const drop = (store: Store, queue: string): Effect.Effect<Dropped, SqlError> => {
  const { sql } = store
  const table = sql(tableOf(store.prefix))
  return Effect.flatMap(
    sql`DELETE FROM ${table} WHERE name = ${queue}
      AND NOT EXISTS (SELECT 1 FROM ${sql(store.messages)} WHERE queue = ${queue}) RETURNING name`,
    (deleted) =>
      deleted.length > 0
        ? Effect.succeed("dropped" as const)
        : Effect.map(
          sql`SELECT name FROM ${table} WHERE name = ${queue}`,
          (rows): Dropped => rows.length > 0 ? "not empty" : "unknown"
        )
  ).pipe(Effect.tap(() => Effect.sync(() => store.recorded.delete(queue))))
}

/** Whether the database has the queues table (a database before migration 10 has not). */
export const present = (store: Store): Effect.Effect<boolean, SqlError> =>
  Effect.map(Sql.missingTables(store.sql, [tableOf(store.prefix)]), (missing) => missing.length === 0)
