/**
 * The operator's view of step journals (`MailboxSqlAdmin.journals`, `leasehold mailbox journal`, the console's
 * message and dead-letter pages): the steps of one message, found by its id or by the request id its steps
 * carry, where the message is now, and each entry parsed from the stored text — never trusted: text that does
 * not parse is shown as stored. Bounded: at most `stepLimit` steps are read. And `discard`, for a journal the
 * code no longer matches (a run that diverged after a deploy).
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { InvalidParameterError } from "../../../Errors.js"
import { type JournalReadBound, type JournalStep, type JournalView, maxEntryChars, stepLimit } from "./journalModel.js"
import type { Store } from "./store.js"

interface Row {
  readonly message_seq: number | string
  readonly position: number | string
  readonly step_key: string
  readonly queue: string
  readonly request_id: string | null
  readonly entry: string
  readonly entry_length: number | string
  readonly recorded_at: number | string
}

/** An id that may be a message's seq (a request id may look like one too: then both are tried, the seq first). */
const seqLike = /^[1-9][0-9]{0,14}$/

/** The entry stored as `text`: parsed, or the text itself when it is not JSON. */
export const parseEntry = (text: string): unknown =>
  Either.getOrElse(Either.try(() => JSON.parse(text) as unknown), () => text)

/** `id` checked: a message id or a request id, 1 to 1000 characters. */
const checked = (id: string): Effect.Effect<string, InvalidParameterError> =>
  id.length === 0 || id.length > 1000
    ? Effect.fail(
      new InvalidParameterError({
        parameter: "id",
        value: id.slice(0, 100),
        reason: "must be a message id or a request id (1 to 1000 characters)"
      })
    )
    : Effect.succeed(id)

/**
 * The message whose journal `id` names: a message id with steps, or else the newest message whose steps carry
 * `id` as their request id (when several messages answered one request — a redriven message has a new id).
 */
const resolve = (store: Store, id: string): Effect.Effect<number | undefined, SqlError | InvalidParameterError> =>
  Effect.gen(function*() {
    yield* checked(id)
    const { sql } = store
    const journal = sql(store.journal)
    if (seqLike.test(id)) {
      const own = yield* sql`SELECT 1 FROM ${journal} WHERE message_seq = ${Number(id)} LIMIT 1`
      if (own.length > 0) return Number(id)
    }
    const newest = yield* sql<{ seq: number | string | null }>`SELECT max(message_seq) AS seq FROM ${journal}
      WHERE request_id = ${id}`
    const seq = newest[0]?.seq
    return seq === null || seq === undefined ? undefined : Number(seq)
  })

/** `value` of `parameter` checked: an integer in 1..`max`. */
const bounded = (parameter: string, value: number | undefined, max: number) =>
  value === undefined || (Number.isSafeInteger(value) && value >= 1 && value <= max)
    ? Effect.succeed(value ?? max)
    : Effect.fail(new InvalidParameterError({ parameter, value, reason: `must be an integer in 1..${max}` }))

/**
 * The journal `id` names (see `resolve`); `None` when no journal has steps under it. At most `bound.steps`
 * steps (default `stepLimit`) are read, each entry at most `bound.entryChars` characters (default: whole); an
 * entry cut so is its text as stored, its whole length in `entryLength`.
 */
export const read = (
  store: Store,
  id: string,
  bound?: JournalReadBound
): Effect.Effect<Option.Option<JournalView>, SqlError | InvalidParameterError> =>
  Effect.gen(function*() {
    const limit = yield* bounded("steps", bound?.steps, stepLimit)
    const chars = yield* bounded("entryChars", bound?.entryChars, maxEntryChars)
    const seq = yield* resolve(store, id)
    if (seq === undefined) return Option.none()
    const { sql } = store
    const rows = yield* sql<Row>`SELECT message_seq, position, step_key, queue, request_id,
      substr(entry, 1, ${chars}) AS entry, length(entry) AS entry_length, recorded_at
      FROM ${sql(store.journal)} WHERE message_seq = ${seq} ORDER BY position LIMIT ${limit + 1}`
    const first = rows[0]
    if (first === undefined) return Option.none()
    const messageId = String(first.message_seq)
    const [queued, dead] = yield* Effect.all([
      sql`SELECT seq FROM ${sql(store.messages)} WHERE seq = ${seq}`,
      sql`SELECT id FROM ${sql(store.deadLetters)} WHERE id = ${messageId}`
    ])
    const requestId = rows.find((row) => row.request_id !== null)?.request_id
    return Option.some<JournalView>({
      messageId,
      queue: first.queue,
      requestId: Option.fromNullable(requestId),
      where: queued.length > 0 ? "queued" : dead.length > 0 ? "dead letter" : "gone",
      steps: rows.slice(0, limit).map((row): JournalStep => {
        const length = Number(row.entry_length)
        const cut = length > row.entry.length
        return {
          position: Number(row.position),
          key: row.step_key,
          recordedAt: DateTime.unsafeMake(Number(row.recorded_at)),
          entry: cut ? row.entry : parseEntry(row.entry),
          ...(cut ? { entryLength: length } : {})
        }
      }),
      truncated: rows.length > limit
    })
  })

/**
 * Deletes the journal `id` names (see `resolve`): the steps it held, 0 when there was none. The request's next
 * delivery runs from its first step; a delivery that holds it now goes on, and what it records after this
 * starts a new journal.
 */
export const discard = (store: Store, id: string): Effect.Effect<number, SqlError | InvalidParameterError> =>
  Effect.flatMap(resolve(store, id), (seq) =>
    seq === undefined
      ? Effect.succeed(0)
      : Effect.map(
        store.sql`DELETE FROM ${store.sql(store.journal)} WHERE message_seq = ${seq} RETURNING position`,
        (rows) => rows.length
      ))

/** A one-line summary of an entry: its `_tag`, and its `promptName`, `toolName`, token usage and `ok` when present. */
export const summary = (entry: unknown): string => {
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    const text = typeof entry === "string" ? entry : JSON.stringify(entry) ?? String(entry)
    return `(not a JSON object) ${text.length > 80 ? `${text.slice(0, 80)}…` : text}`
  }
  const fields = entry as Record<string, unknown>
  const parts: Array<string> = [typeof fields._tag === "string" ? fields._tag : "?"]
  const word = (value: unknown) => {
    const text = String(value)
    return text.length > 60 ? `${text.slice(0, 60)}…` : text
  }
  if (typeof fields.promptName === "string") parts.push(`prompt=${word(fields.promptName)}`)
  if (typeof fields.toolName === "string") parts.push(`tool=${word(fields.toolName)}`)
  const usage = fields.usage
  if (typeof usage === "object" && usage !== null) {
    const { inputTokens, outputTokens } = usage as Record<string, unknown>
    if (typeof inputTokens === "number" || typeof outputTokens === "number") {
      parts.push(`tokens=${String(inputTokens ?? "?")}/${String(outputTokens ?? "?")}`)
    }
  }
  if (typeof fields.ok === "boolean") parts.push(`ok=${fields.ok}`)
  return parts.join(" ")
}
