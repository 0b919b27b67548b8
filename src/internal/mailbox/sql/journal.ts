/**
 * The step journal's statements (the storage `internal/journal.ts` describes), one table per prefix
 * (mailbox migrations 11 and 12): a delivery's steps are rows keyed by its message's seq and their position. The
 * request id a step carries is stored as JSON text (`request_json`: any string `send` accepts, NUL and lone
 * surrogates included, is text PostgreSQL takes) and indexed by its digest (`request_digest`: an id of any length
 * fits the index), the same on SQLite and PostgreSQL. A message's identity (the base of its tools' idempotency
 * keys) is the database's identity (`<prefix>mailbox_identity`, drawn at random by migration 12) and its seq. An append
 * is written only while the delivery holds the message — checked in the insert itself, which selects the
 * message row by seq, receipt handle and visibility (on PostgreSQL locking it `FOR SHARE`, so a claim and the
 * append serialise) — and the appends of a mailbox's concurrent loops go together in one statement (a
 * `GroupCommit`). The journal goes with the message's acknowledgement (`statements.ts`, `SettleItem.journal`),
 * with its queue's purge (a dead letter's stays), or by retention once its message and dead letter are gone
 * (`retention.ts`).
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { decodeRequestId, encodeRequestId, maxSteps, requestDigest, type StoredStep, utf8Bytes } from "../../journal.js"
import * as Sql from "../../sql/common.js"
import { batchLimits } from "./batching.js"
import { GroupCommit } from "./groupCommit.js"
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
  readonly request_json: string | null
}

/** The table holding the database's identity under `prefix` (migration 12): one row, drawn at random. */
export const identityTable = (prefix: string): string => `${prefix}mailbox_identity`

/** Creates the identity table and draws the database's identity (idempotent: a second draw is ignored). */
export const createIdentity = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const table = sql(identityTable(store.prefix))
  return Effect.zipRight(
    sql`CREATE TABLE IF NOT EXISTS ${table} (one INTEGER PRIMARY KEY CHECK (one = 1), id TEXT NOT NULL)`,
    Effect.flatMap(
      Effect.sync(() => randomUUID()),
      (id) => sql`INSERT INTO ${table} (one, id) VALUES (1, ${id}) ON CONFLICT (one) DO NOTHING`
    )
  )
}

/**
 * The identity of the database under the store's prefix (read once per store, drawn if the row was removed): a
 * message's identity is it and the message's seq, so two prefixes, two databases or a database made again never
 * name two messages alike.
 */
export const databaseIdentity = (store: Store): Effect.Effect<string, SqlError> =>
  Effect.suspend(() => {
    if (store.identity !== undefined) return Effect.succeed(store.identity)
    const { sql } = store
    const read = Effect.map(
      sql<{ id: string }>`SELECT id FROM ${sql(identityTable(store.prefix))} WHERE one = 1`,
      (rows) => rows[0]?.id
    )
    return read.pipe(
      Effect.flatMap((found) =>
        found !== undefined ? Effect.succeed(found) : Effect.zipRight(createIdentity(store), read)
      ),
      Effect.flatMap((found) =>
        found === undefined
          ? Effect.dieMessage("the mailbox identity row is missing after it was written")
          : Effect.sync(() => (store.identity = found))
      )
    )
  })

/** The identity of message `seq` (see `databaseIdentity`). */
export const messageIdentity = (store: Store, seq: string): Effect.Effect<string, SqlError> =>
  Effect.map(databaseIdentity(store), (database) => `${database}.${seq}`)

/** What a step stores of its request id: the id as JSON text and its digest (both NULL without one). */
const requestColumns = (requestId: string | undefined) =>
  requestId === undefined
    ? { request: null, digest: null }
    : { request: encodeRequestId(requestId), digest: requestDigest(requestId) }

/** The steps of message `seq`, in position order. */
export const load = (store: Store, seq: string): Effect.Effect<ReadonlyArray<StoredStep>, SqlError> => {
  const { sql } = store
  return Effect.map(
    sql<StepRow>`SELECT position, step_key, entry, request_json FROM ${sql(store.journal)}
      WHERE message_seq = ${Number(seq)} ORDER BY position LIMIT ${maxSteps + 1}`,
    (rows) =>
      rows.map((row): StoredStep => ({
        position: Number(row.position),
        key: row.step_key,
        entry: row.entry,
        requestId: row.request_json === null ? undefined : decodeRequestId(row.request_json)
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
      ...requestColumns(item.step.requestId)
    })))
    // The message row is locked (FOR SHARE) while the steps go in: a claim (FOR UPDATE SKIP LOCKED) skips it
    // meanwhile, and an append that waited for a claim re-reads the row and finds another handle.
    return Effect.map(
      store.onLane((lane) =>
        lane<{ message_seq: string; position: number }>`INSERT INTO ${journal}
          (message_seq, position, step_key, queue, request_json, request_digest, entry, recorded_at)
        SELECT m.seq, v.position, v.key, m.queue, v.request, v.digest, v.entry, ${at}
        FROM json_to_recordset(${input}::json)
            AS v (seq bigint, handle text, position integer, key text, entry text, request text, digest text)
          JOIN ${messages} m ON m.seq = v.seq AND m.receipt_handle = v.handle AND m.visible_at > ${at}
        FOR SHARE OF m
        RETURNING message_seq, position`
      ),
      written
    )
  }
  const input = JSON.stringify(items.map((item) => {
    const { digest, request } = requestColumns(item.step.requestId)
    return [Number(item.seq), item.handle, item.step.position, item.step.key, item.step.entry, request, digest]
  }))
  // In a write transaction, so the check and the insert see the message as the file has it (no claim between).
  return Effect.map(
    Sql.writeTransaction(sql)(
      sql<{ message_seq: number; position: number }>`INSERT INTO ${journal}
        (message_seq, position, step_key, queue, request_json, request_digest, entry, recorded_at)
      SELECT m.seq, json_extract(v.value, '$[2]'), json_extract(v.value, '$[3]'), m.queue,
        json_extract(v.value, '$[5]'), json_extract(v.value, '$[6]'), json_extract(v.value, '$[4]'), ${at}
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
export const appendBatcher = (
  store: Store,
  statements: Statements,
  now: () => Now,
  scope: Scope.Scope
): AppendBatcher =>
  new GroupCommit((items) => append(store, statements, items, now()), {
    ...batchLimits,
    sizeOf: (item) =>
      160 + utf8Bytes(item.step.entry) + item.step.key.length +
      (item.step.requestId === undefined ? 0 : utf8Bytes(encodeRequestId(item.step.requestId))),
    retryAlone: Sql.isDataError
  }, scope)

/**
 * Migration 12: the request id stored as JSON text and indexed by its digest, not as raw text indexed whole (a
 * PostgreSQL btree refuses an entry over about 2,700 bytes; its text refuses NUL), and the database's identity.
 * The rows recorded before it get both columns from their `request_id`, which is then no longer written.
 */
export const migrateIdentity = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const journal = sql(store.journal)
  // Idempotent on both databases (SQLite has no ADD COLUMN IF NOT EXISTS): a database whose migrations table
  // lost its rows runs this again over the columns it made.
  const addColumn = (name: string) =>
    store.dialect === "pg"
      ? sql`ALTER TABLE ${journal} ADD COLUMN IF NOT EXISTS ${sql(name)} TEXT`
      : Effect.flatMap(
        sql<{ name: string }>`SELECT name FROM pragma_table_info(${store.journal}) WHERE name = ${name}`,
        (found) => found.length > 0 ? Effect.void : sql`ALTER TABLE ${journal} ADD COLUMN ${sql(name)} TEXT`
      )
  return Effect.all([
    addColumn("request_json"),
    addColumn("request_digest"),
    sql`DROP INDEX IF EXISTS ${sql(`${store.journal}_request`)}`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${store.journal}_request_digest`)} ON ${journal} (request_digest)`,
    Effect.flatMap(
      sql<{ request_id: string }>`SELECT DISTINCT request_id FROM ${journal} WHERE request_id IS NOT NULL`,
      (rows) =>
        Effect.forEach(
          rows,
          ({ request_id }) =>
            sql`UPDATE ${journal} SET request_json = ${encodeRequestId(request_id)},
            request_digest = ${requestDigest(request_id)}, request_id = NULL WHERE request_id = ${request_id}`,
          {
            discard: true
          }
        )
    ),
    createIdentity(store)
  ], { discard: true })
}

/** Whether the database has the journal table (a database before mailbox migration 11 has not). */
export const present = (store: Store): Effect.Effect<boolean, SqlError> =>
  Effect.map(Sql.missingTables(store.sql, [store.journal]), (missing) => missing.length === 0)

/** A dead letter's id that names a message's seq (the SQL mailbox's ids: a positive integer, written canonically). */
const seqOf = (id: string): number | undefined => {
  if (!/^[1-9][0-9]{0,15}$/.test(id)) return undefined
  const seq = Number(id)
  return Number.isSafeInteger(seq) ? seq : undefined
}

/**
 * Deletes the journals of the dead letters `ids` as they go (redriven or deleted, in the caller's transaction): a
 * letter's id is its message's seq. A journal whose message is still in the table stays: it is that message's (a
 * delivery that dead-lettered the request and has not acknowledged it yet, or lost its lease and was received again).
 */
export const dropLetters = (store: Store, ids: ReadonlyArray<string>): Effect.Effect<void, SqlError> => {
  const seqs = ids.flatMap((id) => {
    const seq = seqOf(id)
    return seq === undefined ? [] : [seq]
  })
  if (seqs.length === 0) return Effect.void
  const { sql } = store
  const journal = sql(store.journal)
  const messages = sql(store.messages)
  const input = JSON.stringify(seqs)
  const named = store.dialect === "pg"
    ? sql`SELECT value::bigint FROM json_array_elements_text(${input}::json)`
    : sql`SELECT value FROM json_each(${input})`
  return Effect.asVoid(
    sql`DELETE FROM ${journal} WHERE message_seq IN (${named})
      AND NOT EXISTS (SELECT 1 FROM ${messages} m WHERE m.seq = ${journal}.message_seq)`
  )
}
