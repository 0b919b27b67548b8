/**
 * The operator's view of step journals (`MailboxSqlAdmin.journals`, `leasehold mailbox journal`, the console's
 * message and dead-letter pages): the steps of one message, found by its id or by the request id its steps
 * carry (never guessed: an id that names several journals, in several queues or as another message's id, is
 * refused with the list), where the message is now, and each entry parsed from the stored text — never trusted: text that does
 * not parse is shown as stored. Bounded: at most `stepLimit` steps are read. And `discard`, for a journal the
 * code no longer matches (a run that diverged after a deploy).
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { InvalidParameterError } from "../../../Errors.js"
import { decodeRequestId, requestDigest } from "../../journal.js"
import { refusedName } from "../../names.js"
import * as StoredTime from "../../storedTime.js"
import type { Store } from "../sql/store.js"
import {
  JournalAmbiguousError,
  type JournalLookup,
  type JournalMatch,
  type JournalReadOptions,
  type JournalStep,
  type JournalView,
  matchLimit,
  maxEntryChars,
  stepLimit
} from "./journalModel.js"

interface Row {
  readonly message_seq: number | string
  readonly position: number | string
  readonly step_key: string
  readonly queue: string
  readonly request_json: string | null
  readonly entry: string
  readonly entry_length: number | string
  readonly recorded_at: number | string
}

/** An id that may be a message's seq (a request id may look like one too: see `JournalLookup.by`). */
const seqLike = /^[1-9][0-9]{0,14}$/

/** The longest id looked up: a request id may be long (any string `send` accepts is journaled). */
const maxIdLength = 1_000_000

/** The entry stored as `text`: parsed, or the text itself when it is not JSON. */
export const parseEntry = (text: string): unknown =>
  Either.getOrElse(Either.try(() => JSON.parse(text) as unknown), () => text)

const refused = (parameter: string, value: unknown, reason: string) =>
  new InvalidParameterError({
    parameter,
    value: typeof value === "string" ? value.slice(0, 100) : value,
    reason
  })

/** `id` and `lookup` checked: an id of 1 to `maxIdLength` characters, a queue by the name rule, a known `by`. */
const checked = (id: string, lookup: JournalLookup | undefined): Effect.Effect<void, InvalidParameterError> => {
  if (typeof id !== "string" || id.length === 0 || id.length > maxIdLength) {
    return Effect.fail(refused("id", id, `must be a message id or a request id (1 to ${maxIdLength} characters)`))
  }
  const by = lookup?.by
  if (by !== undefined && by !== "message" && by !== "request" && by !== "either") {
    return Effect.fail(refused("by", by, "must be \"message\", \"request\" or \"either\""))
  }
  const queue = lookup?.queue
  if (queue !== undefined) {
    const problem = refusedName("queue", queue)
    if (problem !== undefined) return Effect.fail(problem)
  }
  return Effect.void
}

/**
 * Every journal `id` names under `lookup` (at most `matchLimit + 1`, in message order): the message whose seq it
 * is, and the messages whose steps carry it as their request id — found by the id's digest, confirmed on the
 * stored id.
 */
const find = (
  store: Store,
  id: string,
  lookup: JournalLookup | undefined
): Effect.Effect<ReadonlyArray<JournalMatch>, SqlError | InvalidParameterError> =>
  Effect.gen(function*() {
    yield* checked(id, lookup)
    const { sql } = store
    const journal = sql(store.journal)
    const by = lookup?.by ?? "either"
    const queue = lookup?.queue
    const inQueue = queue === undefined ? sql`` : sql`AND queue = ${queue}`
    const found = new Map<string, JournalMatch>()
    if (by !== "request" && seqLike.test(id)) {
      const own = yield* sql<{ queue: string }>`SELECT queue FROM ${journal}
        WHERE message_seq = ${Number(id)} ${inQueue} LIMIT 1`
      if (own[0] !== undefined) found.set(id, { messageId: id, queue: own[0].queue, matchedBy: "message id" })
    }
    if (by !== "message") {
      const rows = yield* sql<{ message_seq: number | string; queue: string; request_json: string }>`
        SELECT message_seq, queue, request_json FROM ${journal}
        WHERE request_digest = ${requestDigest(id)} ${inQueue}
        GROUP BY message_seq, queue, request_json ORDER BY message_seq LIMIT ${matchLimit + 1}`
      for (const row of rows) {
        const messageId = String(row.message_seq)
        if (decodeRequestId(row.request_json) !== id || found.has(messageId)) continue
        found.set(messageId, { messageId, queue: row.queue, matchedBy: "request id" })
      }
    }
    return [...found.values()].sort((a, b) => Number(a.messageId) - Number(b.messageId)).slice(0, matchLimit + 1)
  })

/** `value` of `parameter` checked: an integer in 1..`max`. */
const bounded = (parameter: string, value: number | undefined, max: number) =>
  value === undefined || (Number.isSafeInteger(value) && value >= 1 && value <= max)
    ? Effect.succeed(value ?? max)
    : Effect.fail(new InvalidParameterError({ parameter, value, reason: `must be an integer in 1..${max}` }))

/** The one message whose journal `id` names; `undefined` for none; `JournalAmbiguousError` for several. */
const resolve = (
  store: Store,
  id: string,
  lookup: JournalLookup | undefined
): Effect.Effect<number | undefined, SqlError | InvalidParameterError | JournalAmbiguousError> =>
  Effect.flatMap(find(store, id, lookup), (found) => {
    if (found.length <= 1) return Effect.succeed(found[0] === undefined ? undefined : Number(found[0].messageId))
    return Effect.fail(
      new JournalAmbiguousError({
        id,
        ...(lookup?.queue === undefined ? {} : { queue: lookup.queue }),
        matches: found.slice(0, matchLimit),
        more: found.length > matchLimit
      })
    )
  })

/** Every journal `id` names (see `find`), at most `matchLimit`. */
export const matches = (
  store: Store,
  id: string,
  lookup?: JournalLookup
): Effect.Effect<ReadonlyArray<JournalMatch>, SqlError | InvalidParameterError> =>
  Effect.map(find(store, id, lookup), (found) => found.slice(0, matchLimit))

/**
 * The journal `id` names (see `resolve`); `None` when no journal has steps under it. At most `options.steps`
 * steps (default `stepLimit`) are read, each entry at most `options.entryChars` characters (default: whole); an
 * entry cut so is its text as stored, its whole length in `entryLength`.
 */
export const read = (
  store: Store,
  id: string,
  options?: JournalReadOptions
): Effect.Effect<Option.Option<JournalView>, SqlError | InvalidParameterError | JournalAmbiguousError> =>
  Effect.gen(function*() {
    const limit = yield* bounded("steps", options?.steps, stepLimit)
    const chars = yield* bounded("entryChars", options?.entryChars, maxEntryChars)
    const seq = yield* resolve(store, id, options)
    if (seq === undefined) return Option.none()
    const { sql } = store
    const rows = yield* sql<Row>`SELECT message_seq, position, step_key, queue, request_json,
      substr(entry, 1, ${chars}) AS entry, length(entry) AS entry_length, recorded_at
      FROM ${sql(store.journal)} WHERE message_seq = ${seq} ORDER BY position LIMIT ${limit + 1}`
    const first = rows[0]
    if (first === undefined) return Option.none()
    const messageId = String(first.message_seq)
    const [queued, dead] = yield* Effect.all([
      sql`SELECT seq FROM ${sql(store.messages)} WHERE seq = ${seq}`,
      sql`SELECT id FROM ${sql(store.deadLetters)} WHERE id = ${messageId}`
    ])
    const stored = rows.find((row) => row.request_json !== null)?.request_json
    return Option.some<JournalView>({
      messageId,
      queue: first.queue,
      requestId: Option.fromNullable(stored === undefined || stored === null ? undefined : decodeRequestId(stored)),
      where: queued.length > 0 ? "queued" : dead.length > 0 ? "dead letter" : "gone",
      steps: rows.slice(0, limit).map((row): JournalStep => {
        const length = Number(row.entry_length)
        const cut = length > row.entry.length
        return {
          position: Number(row.position),
          key: row.step_key,
          recordedAt: StoredTime.decode(row.recorded_at),
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
export const discard = (
  store: Store,
  id: string,
  lookup?: JournalLookup
): Effect.Effect<number, SqlError | InvalidParameterError | JournalAmbiguousError> =>
  Effect.flatMap(resolve(store, id, lookup), (seq) =>
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
