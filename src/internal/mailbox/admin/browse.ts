/**
 * The operator's look into a queue (`MailboxSqlAdmin.browse`, the console's browse and message pages): a page
 * of its queued, delayed, in-flight or dead-lettered messages, and one message whole.
 *
 * Pages are keyset-paged, never by offset: messages on their sequence number, dead letters on
 * (dead_lettered_at, id) — their list order. A page may be of one key's messages (`filter.key`: scheduling by
 * key, mailbox migration 14), each row saying its key. A page's `next` cursor is where the next one starts, so rows sent
 * or settled meanwhile neither shift a page nor make it show a row twice.
 *
 * Every page is bounded in bytes and time whatever the database holds: at most `maxPageSize` rows, each body and
 * error cut to a preview by the database; a body-text search looks at most `scanLimit` rows of the queue per
 * page (and the first `searchLength` characters of each body), so a search that matches nothing still ends —
 * its page says how far it looked and its cursor continues from there. A search folds case beyond ASCII on
 * both databases: PostgreSQL's `ILIKE` folds as `lower()` does, and SQLite's `LIKE` folds ASCII only, so on
 * SQLite the scanned rows' text is read in chunks and folded here (`fold`), the same for "é" and "CAFÉ". On
 * PostgreSQL every read also runs
 * under a statement timeout. One message's body is read up to `detailLength` characters (its full length is
 * given, so the page can say it was cut); its error is read whole, as stored (leasehold stores at most
 * `detailLength` characters of one: a longer one is a row written by hand, cut alike and said so).
 */
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { InvalidParameterError } from "../../../Errors.js"
import type { MailboxConnectionError } from "../../../Mailbox.js"
import { nameProblem } from "../../names.js"
import { nowOf, statements } from "../sql/statements.js"
import { connectionError, type Store } from "../sql/store.js"
export * from "./browseModel.js"
import type * as DateTime from "effect/DateTime"
import * as StoredTime from "../../storedTime.js"
import {
  detailLength,
  maxPageSize,
  maxSearchLength,
  type MessageDetail,
  type MessagePage,
  type MessageQuery,
  type MessageRow,
  type MessageState,
  previewLength,
  scanLimit,
  searchLength,
  statementTimeoutMillis,
  states
} from "./browseModel.js"
type Count = number | string
interface ListedRow {
  readonly id: Count
  readonly queue: string
  readonly delivery_count: Count
  readonly enqueued_at: Count
  readonly at: Count
  readonly leased: Count | boolean
  readonly received_by: string | null
  readonly key: string | null
  readonly error_tag: string | null
  readonly error: string | null
  readonly body: string
  readonly body_length: Count
}

const invalid = (parameter: string, value: unknown, reason: string) =>
  new InvalidParameterError({ parameter, value, reason })

/** A dead letter's cursor: its dead-lettering time and id (any text), opaque and URL-safe. */
const encodeDeadCursor = (at: number, id: string) => Buffer.from(JSON.stringify([at, id])).toString("base64url")
const decodeDeadCursor = (cursor: string): readonly [number, string] | undefined => {
  try {
    const value: unknown = JSON.parse(Buffer.from(cursor, "base64url").toString())
    return Array.isArray(value) && value.length === 2 && Number.isSafeInteger(value[0]) &&
        typeof value[1] === "string"
      ? [value[0] as number, value[1]]
      : undefined
  } catch {
    return undefined
  }
}

/** A message's id as its sequence number, or undefined when no message can have it. */
const seqOf = (id: string) => /^\d{1,15}$/.test(id) ? Number(id) : undefined

/**
 * A text as a search compares it on SQLite: lower case, as JavaScript's `toLowerCase` (Unicode's default case
 * mapping) makes it — what PostgreSQL's `lower()` and `ILIKE` do in a UTF-8 database with a non-C locale.
 */
export const fold = (text: string): string => text.toLowerCase()

/** How many scanned rows a SQLite search reads and folds at a time (each up to `searchLength` characters). */
const foldChunk = 100

/** `text` as a LIKE pattern matching it anywhere (its `%`, `_` and `\` matched as themselves). */
export const containsPattern = (text: string) => `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`

/** The operator's look into the queues of `store` (see the module comment). */
export const make = (store: Store, clock: Clock.Clock) => {
  const { sql } = store
  const messages = sql(store.messages)
  const letters = sql(store.deadLetters)
  const at = statements(store).at
  const withStore = connectionError(store.messages)
  const pg = store.dialect === "pg"
  /**
   * SQLite's search: the keys of the scanned rows (`texts`, `foldChunk` at a time in scan order, each row's
   * searched texts) whose folded text holds the folded `text`, stopping at `wanted` of them. The scan is the same
   * bounded one the PostgreSQL statement reads.
   */
  const foldedKeys = <K>(
    texts: (
      offset: number
    ) => Effect.Effect<ReadonlyArray<{ readonly key: K; readonly texts: ReadonlyArray<string> }>, SqlError>,
    text: string,
    wanted: number
  ): Effect.Effect<ReadonlyArray<K>, SqlError> =>
    Effect.gen(function*() {
      const needle = fold(text)
      const keys: Array<K> = []
      for (let offset = 0; offset < scanLimit && keys.length < wanted; offset += foldChunk) {
        const chunk = yield* texts(offset)
        for (const row of chunk) {
          if (keys.length < wanted && row.texts.some((haystack) => fold(haystack).includes(needle))) keys.push(row.key)
        }
        if (chunk.length < foldChunk) break
      }
      return keys
    })
  /** On PostgreSQL, under a statement timeout (in a transaction: `SET LOCAL` ends with it). */
  const bounded = <A, E, R>(read: Effect.Effect<A, E, R>) =>
    store.dialect === "pg"
      ? sql.withTransaction(
        Effect.zipRight(sql.unsafe(`SET LOCAL statement_timeout = ${statementTimeoutMillis}`), read)
      )
      : read
  /** Which optional columns the tables have (workers before mailbox migrations 6-8 wrote none). */
  const columns = Effect.map(
    Effect.all([columnsOf(store, store.messages), columnsOf(store, store.deadLetters)]),
    ([message, dead]) => ({
      receivedBy: message.has("received_by"),
      traceparent: message.has("traceparent"),
      deadTraceparent: dead.has("traceparent"),
      // Scheduling by key (mailbox migration 14) adds both tables' `key`.
      key: message.has("key"),
      deadKey: dead.has("key")
    })
  )

  const messagesPage = (query: MessageQuery): Effect.Effect<MessagePage, MailboxConnectionError> =>
    Effect.gen(function*() {
      const has = yield* columns
      const now = at(nowOf(clock)())
      const limit = query.limit ?? 50
      const oldest = query.order !== "newest"
      const direction = sql.literal(oldest ? "ASC" : "DESC")
      const after = query.after === undefined ? undefined : seqOf(query.after)
      const state = query.state === "queued"
        ? sql`visible_at <= ${now}`
        : query.state === "inFlight"
        ? sql`visible_at > ${now} AND receipt_handle IS NOT NULL`
        : sql`visible_at > ${now} AND receipt_handle IS NULL`
      const conditions: Array<Statement.Fragment> = [sql`queue = ${query.queue}`, state]
      if (after !== undefined) conditions.push(oldest ? sql`seq > ${after}` : sql`seq < ${after}`)
      const id = query.filter?.id
      if (id !== undefined) {
        const seq = seqOf(id)
        if (seq === undefined) return { rows: [], next: undefined, searchCut: false }
        conditions.push(sql`seq = ${seq}`)
      }
      const key = query.filter?.key
      if (key !== undefined) {
        // Before mailbox migration 14 no message has a key.
        if (!has.key) return { rows: [], next: undefined, searchCut: false }
        conditions.push(sql`key = ${key}`)
      }
      const columnsShown = sql`seq AS id, queue, delivery_count, enqueued_at, visible_at AS at,
        CASE WHEN receipt_handle IS NOT NULL THEN 1 ELSE 0 END AS leased,
        ${has.receivedBy ? sql`received_by` : sql`NULL AS received_by`}, ${has.key ? sql`key` : sql`NULL AS key`},
        NULL AS error_tag, NULL AS error,
        substr(body, 1, ${previewLength}) AS body, length(body) AS body_length`
      const text = query.filter?.text
      const scanned = sql`SELECT seq FROM ${messages} WHERE ${sql.and(conditions)}
        ORDER BY seq ${direction} LIMIT ${scanLimit}`
      const rows = yield* (text === undefined
        ? sql<ListedRow>`SELECT ${columnsShown} FROM ${messages} WHERE ${sql.and(conditions)}
            ORDER BY seq ${direction} LIMIT ${limit + 1}`
        : pg
        ? sql<ListedRow>`SELECT ${columnsShown} FROM ${messages} WHERE seq IN (${scanned})
            AND substr(body, 1, ${searchLength}) ILIKE ${containsPattern(text)} ESCAPE '\\'
            ORDER BY seq ${direction} LIMIT ${limit + 1}`
        : Effect.flatMap(
          foldedKeys(
            (offset) =>
              Effect.map(
                sql<{ seq: Count; body: string }>`SELECT seq, substr(body, 1, ${searchLength}) AS body
                  FROM ${messages} WHERE seq IN (${scanned}) ORDER BY seq ${direction}
                  LIMIT ${foldChunk} OFFSET ${offset}`,
                (chunk) => chunk.map((row) => ({ key: Number(row.seq), texts: [row.body] }))
              ),
            text,
            limit + 1
          ),
          (keys) =>
            keys.length === 0
              ? Effect.succeed([])
              : sql<ListedRow>`SELECT ${columnsShown} FROM ${messages} WHERE ${sql.in("seq", keys)}
                ORDER BY seq ${direction}`
        ))
      return yield* pageOf(rows, limit, text === undefined, (row) => String(row.id), (row) => {
        const leased = Number(row.leased) === 1
        return query.state === "queued" ? "queued" : leased ? "inFlight" : "delayed"
      }, () =>
        Effect.map(
          sql<{ n: Count; edge: Count | null }>`SELECT count(*) AS n, ${
            sql.literal(oldest ? "MAX" : "MIN")
          }(seq) AS edge FROM (${scanned}) scanned`,
          (extent) =>
            Number(extent[0]?.n ?? 0) >= scanLimit && extent[0]?.edge !== null
              ? String(extent[0]?.edge)
              : undefined
        ))
    }).pipe(bounded, withStore)

  const deadPage = (query: MessageQuery): Effect.Effect<MessagePage, MailboxConnectionError> =>
    Effect.gen(function*() {
      const limit = query.limit ?? 50
      const oldest = query.order !== "newest"
      const direction = sql.literal(oldest ? "ASC" : "DESC")
      const conditions: Array<Statement.Fragment> = [sql`queue = ${query.queue}`]
      const after = query.after === undefined ? undefined : decodeDeadCursor(query.after)
      if (after !== undefined) {
        const [time, id] = after
        conditions.push(
          oldest
            ? sql`(dead_lettered_at > ${time} OR (dead_lettered_at = ${time} AND id > ${id}))`
            : sql`(dead_lettered_at < ${time} OR (dead_lettered_at = ${time} AND id < ${id}))`
        )
      }
      if (query.filter?.id !== undefined) conditions.push(sql`id = ${query.filter.id}`)
      const has = yield* columns
      if (query.filter?.key !== undefined) {
        if (!has.deadKey) return { rows: [], next: undefined, searchCut: false }
        conditions.push(sql`key = ${query.filter.key}`)
      }
      const order = sql`ORDER BY dead_lettered_at ${direction}, id ${direction}`
      const columnsShown = sql`id, queue, delivery_count, enqueued_at, dead_lettered_at AS at, 0 AS leased,
        NULL AS received_by, ${
        has.deadKey ? sql`key` : sql`NULL AS key`
      }, substr(error_tag, 1, ${previewLength}) AS error_tag,
        substr(error, 1, ${previewLength}) AS error, substr(body, 1, ${previewLength}) AS body,
        length(body) AS body_length`
      const text = query.filter?.text
      const scanned = sql`SELECT id FROM ${letters} WHERE ${sql.and(conditions)} ${order} LIMIT ${scanLimit}`
      const rows = yield* (text === undefined
        ? sql<ListedRow>`SELECT ${columnsShown} FROM ${letters} WHERE ${sql.and(conditions)} ${order}
            LIMIT ${limit + 1}`
        : pg
        ? sql<ListedRow>`SELECT ${columnsShown} FROM ${letters} WHERE id IN (${scanned})
            AND (substr(body, 1, ${searchLength}) ILIKE ${containsPattern(text)} ESCAPE '\\'
              OR substr(error, 1, ${searchLength}) ILIKE ${containsPattern(text)} ESCAPE '\\')
            ${order} LIMIT ${limit + 1}`
        : Effect.flatMap(
          foldedKeys(
            (offset) =>
              Effect.map(
                sql<
                  { id: string; body: string; error: string | null }
                >`SELECT id, substr(body, 1, ${searchLength}) AS body,
                  substr(error, 1, ${searchLength}) AS error FROM ${letters} WHERE id IN (${scanned}) ${order}
                  LIMIT ${foldChunk} OFFSET ${offset}`,
                (chunk) => chunk.map((row) => ({ key: row.id, texts: [row.body, row.error ?? ""] }))
              ),
            text,
            limit + 1
          ),
          (keys) =>
            keys.length === 0
              ? Effect.succeed([])
              : sql<ListedRow>`SELECT ${columnsShown} FROM ${letters} WHERE ${sql.in("id", keys)} ${order}`
        ))
      const cursor = (row: { readonly at: Count; readonly id: Count }) =>
        encodeDeadCursor(Number(row.at), String(row.id))
      return yield* pageOf(rows, limit, text === undefined, cursor, () => "dead", () =>
        Effect.map(
          sql<{ id: string; at: Count }>`SELECT id, dead_lettered_at AS at FROM ${letters} WHERE id IN (${scanned})
            ${order}`,
          // The last row looked at, when the search looked at all it may.
          (looked) => looked.length >= scanLimit ? cursor(looked[looked.length - 1]!) : undefined
        ))
    }).pipe(bounded, withStore)

  return {
    messages: (query: MessageQuery): Effect.Effect<MessagePage, MailboxConnectionError | InvalidParameterError> => {
      const problem = checkQuery(query)
      if (problem !== undefined) return Effect.fail(problem)
      return query.state === "dead" ? deadPage(query) : messagesPage(query)
    },
    message: (queue: string, id: string): Effect.Effect<Option.Option<MessageDetail>, MailboxConnectionError> => {
      const seq = seqOf(id)
      if (seq === undefined || nameProblem(queue) !== undefined) return Effect.succeedNone
      return Effect.gen(function*() {
        const has = yield* columns
        const now = at(nowOf(clock)())
        const rows = yield* sql<{
          seq: Count
          queue: string
          body: string
          body_length: Count
          delivery_count: Count
          reply_to: string | null
          traceparent: string | null
          enqueued_at: Count
          visible_at: Count
          leased: Count | boolean
          visible: Count | boolean
          received_by: string | null
          extended_at: Count | null
        }>`SELECT seq, queue, substr(body, 1, ${detailLength}) AS body, length(body) AS body_length, delivery_count,
            reply_to, ${has.traceparent ? sql`traceparent` : sql`NULL AS traceparent`}, enqueued_at, visible_at,
            CASE WHEN receipt_handle IS NOT NULL THEN 1 ELSE 0 END AS leased,
            CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END AS visible,
            ${has.receivedBy ? sql`received_by, extended_at` : sql`NULL AS received_by, NULL AS extended_at`}
          FROM ${messages} WHERE seq = ${seq} AND queue = ${queue}`
        return Option.map(Option.fromNullable(rows[0]), (row): MessageDetail => ({
          id: String(row.seq),
          queue: row.queue,
          state: Number(row.visible) === 1 ? "queued" : Number(row.leased) === 1 ? "inFlight" : "delayed",
          body: row.body,
          bodyLength: Number(row.body_length),
          deliveryCount: Number(row.delivery_count),
          replyTo: row.reply_to ?? undefined,
          traceparent: row.traceparent ?? undefined,
          enqueuedAt: StoredTime.decode(row.enqueued_at),
          visibleAt: StoredTime.decode(row.visible_at),
          receivedBy: row.received_by ?? undefined,
          extendedAt: row.extended_at === null ? undefined : StoredTime.decode(row.extended_at),
          deadLetteredAt: undefined,
          errorTag: undefined,
          error: undefined,
          errorLength: undefined
        }))
      }).pipe(bounded, withStore)
    },
    deadLetter: (queue: string, id: string): Effect.Effect<Option.Option<MessageDetail>, MailboxConnectionError> => {
      if (nameProblem(queue) !== undefined || nameProblem(id) !== undefined) return Effect.succeedNone
      return Effect.gen(function*() {
        const has = yield* columns
        const rows = yield* sql<{
          id: string
          queue: string
          body: string
          body_length: Count
          delivery_count: Count
          reply_to: string | null
          traceparent: string | null
          enqueued_at: Count
          dead_lettered_at: Count
          error_tag: string
          error: string
          error_length: Count
        }>`SELECT id, queue, substr(body, 1, ${detailLength}) AS body, length(body) AS body_length, delivery_count,
            reply_to, ${has.deadTraceparent ? sql`traceparent` : sql`NULL AS traceparent`}, enqueued_at,
            dead_lettered_at, substr(error_tag, 1, ${previewLength}) AS error_tag,
            substr(error, 1, ${detailLength}) AS error, length(error) AS error_length
          FROM ${letters} WHERE id = ${id} AND queue = ${queue}`
        return Option.map(Option.fromNullable(rows[0]), (row): MessageDetail => ({
          id: row.id,
          queue: row.queue,
          state: "dead",
          body: row.body,
          bodyLength: Number(row.body_length),
          deliveryCount: Number(row.delivery_count),
          replyTo: row.reply_to ?? undefined,
          traceparent: row.traceparent ?? undefined,
          enqueuedAt: StoredTime.decode(row.enqueued_at),
          visibleAt: undefined,
          receivedBy: undefined,
          extendedAt: undefined,
          deadLetteredAt: StoredTime.decode(row.dead_lettered_at),
          errorTag: row.error_tag,
          error: row.error,
          errorLength: Number(row.error_length)
        }))
      }).pipe(bounded, withStore)
    },
    /**
     * Deletes a message of `queue` that no receiver holds now (queued or delayed); whether it did. With
     * `shown`, only while it is still the message shown (enqueued when it was: a seq used again after the
     * table was emptied, or in a copy of another database, names another message).
     */
    remove: (
      queue: string,
      id: string,
      shown?: { readonly enqueuedAt: DateTime.Utc }
    ): Effect.Effect<boolean, MailboxConnectionError> => {
      const seq = seqOf(id)
      if (seq === undefined || nameProblem(queue) !== undefined) return Effect.succeed(false)
      return Effect.suspend(() => {
        const now = at(nowOf(clock)())
        return sql`DELETE FROM ${messages} WHERE seq = ${seq} AND queue = ${queue}
          AND (receipt_handle IS NULL OR visible_at <= ${now})${
          shown === undefined ? sql`` : sql` AND ${StoredTime.still(sql, "enqueued_at", shown.enqueuedAt)}`
        } RETURNING seq`
      }).pipe(Effect.map((rows) => rows.length > 0), withStore)
    }
  }
}

/** Why `query` cannot be answered, if it cannot. */
const checkQuery = (query: MessageQuery): InvalidParameterError | undefined => {
  const problem = nameProblem(query.queue)
  if (problem !== undefined) return invalid("queue", query.queue, problem)
  if (!states.includes(query.state)) return invalid("state", query.state, `must be one of ${states.join(", ")}`)
  if (query.order !== undefined && query.order !== "oldest" && query.order !== "newest") {
    return invalid("order", query.order, "must be oldest or newest")
  }
  const limit = query.limit
  if (limit !== undefined && !(Number.isSafeInteger(limit) && limit > 0 && limit <= maxPageSize)) {
    return invalid("limit", limit, `must be an integer in 1..${maxPageSize}`)
  }
  if (
    query.after !== undefined &&
    (query.state === "dead" ? decodeDeadCursor(query.after) === undefined : seqOf(query.after) === undefined)
  ) {
    return invalid("after", query.after, "must be a page's next cursor")
  }
  const text = query.filter?.text
  if (text !== undefined && (text.length === 0 || text.length > maxSearchLength || nameProblem(text) !== undefined)) {
    return invalid("filter.text", text, `must be 1..${maxSearchLength} characters of text`)
  }
  const id = query.filter?.id
  if (id !== undefined && nameProblem(id) !== undefined) return invalid("filter.id", id, nameProblem(id)!)
  const key = query.filter?.key
  if (key !== undefined && nameProblem(key) !== undefined) return invalid("filter.key", key, nameProblem(key)!)
  return undefined
}

/** The page of `rows` (one more than `limit` was asked for: whether there is a next page). */
const pageOf = <E, R>(
  rows: ReadonlyArray<ListedRow>,
  limit: number,
  complete: boolean,
  cursor: (row: ListedRow) => string,
  state: (row: ListedRow) => MessageState,
  searchedTo: () => Effect.Effect<string | undefined, E, R>
): Effect.Effect<MessagePage, E, R> => {
  const shown = rows.slice(0, limit).map((row): MessageRow => ({
    id: String(row.id),
    queue: row.queue,
    state: state(row),
    deliveryCount: Number(row.delivery_count),
    enqueuedAt: StoredTime.decode(row.enqueued_at),
    at: StoredTime.decode(row.at),
    receivedBy: row.received_by ?? undefined,
    key: row.key ?? undefined,
    errorTag: row.error_tag ?? undefined,
    error: row.error ?? undefined,
    body: row.body,
    bodyLength: Number(row.body_length)
  }))
  if (rows.length > limit) return Effect.succeed({ rows: shown, next: cursor(rows[limit - 1]!), searchCut: false })
  // A full scan's page is the last; a search may have stopped at `scanLimit` rows with more beyond.
  if (complete) return Effect.succeed({ rows: shown, next: undefined, searchCut: false })
  return Effect.map(searchedTo(), (next) => ({ rows: shown, next, searchCut: next !== undefined }))
}

/** The columns `table` has. */
const columnsOf = (store: Store, table: string) =>
  Effect.map(
    store.dialect === "pg"
      ? store.sql<{ name: string }>`SELECT column_name AS name FROM information_schema.columns
          WHERE table_schema = current_schema() AND table_name = ${table}`
      : store.sql<{ name: string }>`SELECT name FROM pragma_table_info(${table})`,
    (rows) => new Set(rows.map((row) => row.name))
  )
