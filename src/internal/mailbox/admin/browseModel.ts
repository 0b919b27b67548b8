/**
 * What a look into a queue answers (`MailboxSqlAdmin.browse`; browse.ts reads it): the states, the query, a
 * page and one message whole, and the bounds every page keeps. A leaf: the public declarations name these
 * types without pulling in the store (and through it a driver's types).
 */
import type * as DateTime from "effect/DateTime"
/**
 * Where a message is: visible now (`queued`), waiting for its delay (`delayed`), leased (`inFlight`), or in
 * the dead-letter table (`dead`).
 *
 * @category models
 */
export type MessageState = "queued" | "delayed" | "inFlight" | "dead"

/** The states, in the order the console shows them. */
export const states: ReadonlyArray<MessageState> = ["queued", "delayed", "inFlight", "dead"]

/**
 * A page of a queue's messages to read: `state`, `order` (`oldest`, the default, or `newest` first), `after` (a
 * page's `next` cursor), `filter` (`id`: that message only; `text`: bodies — and dead letters' errors — that
 * contain it, in any case; `key`: those sent with that key) and `limit` (1..100, default 50).
 *
 * @category models
 */
export interface MessageQuery {
  readonly queue: string
  readonly state: MessageState
  /** By sequence (dead letters: by when they were dead-lettered); default oldest first. */
  readonly order?: "oldest" | "newest" | undefined
  /** A page's `next`: the page after it. */
  readonly after?: string | undefined
  /**
   * The message whose id is `id` only; those whose body (a dead letter's: or error) contains `text`; those sent
   * with the key `key` (scheduling by key, mailbox migration 14: none before it).
   */
  readonly filter?:
    | { readonly id?: string | undefined; readonly text?: string | undefined; readonly key?: string | undefined }
    | undefined
  /** At most `maxPageSize`; default 50. */
  readonly limit?: number | undefined
}

/**
 * A message of a page: its body and error cut to a preview (`bodyLength` is the whole body's).
 *
 * @category models
 */
export interface MessageRow {
  readonly id: string
  readonly queue: string
  readonly state: MessageState
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  /** When it becomes visible (queued: became); for a dead letter, when it was dead-lettered. */
  readonly at: DateTime.Utc
  /** The process that received it (`host:pid`), where recorded. */
  readonly receivedBy: string | undefined
  /** The key it was sent with (scheduling by key), if any. */
  readonly key: string | undefined
  /** A dead letter's error tag and the start of its error. */
  readonly errorTag: string | undefined
  readonly error: string | undefined
  /** The start of the stored body (`previewLength` characters). */
  readonly body: string
  /** The stored body's length in characters. */
  readonly bodyLength: number
}

/**
 * A page of messages and the cursor of the next (`undefined` after the last). A text search looks at a bounded
 * number of rows per page: `searchCut` says it stopped there, and `next` continues it.
 *
 * @category models
 */
export interface MessagePage {
  readonly rows: ReadonlyArray<MessageRow>
  readonly next: string | undefined
  /** A text search stopped after `scanLimit` rows before filling the page: `next` continues the search. */
  readonly searchCut: boolean
}

/**
 * One message, or one dead letter, whole: body (cut past 64 Ki characters, `bodyLength` says), delivery count,
 * reply-to, trace context, times, and a dead letter's error as stored.
 *
 * @category models
 */
export interface MessageDetail {
  readonly id: string
  readonly queue: string
  readonly state: MessageState
  /** The stored body, cut to `detailLength` characters when longer (see `bodyLength`). */
  readonly body: string
  readonly bodyLength: number
  readonly deliveryCount: number
  readonly replyTo: string | undefined
  /** The sender's W3C trace context, as stored. */
  readonly traceparent: string | undefined
  readonly enqueuedAt: DateTime.Utc
  /** When a message becomes (or became) visible; none for a dead letter. */
  readonly visibleAt: DateTime.Utc | undefined
  readonly receivedBy: string | undefined
  readonly extendedAt: DateTime.Utc | undefined
  readonly deadLetteredAt: DateTime.Utc | undefined
  /** A dead letter's error tag, and its error whole as stored (leasehold stores at most `detailLength` characters). */
  readonly errorTag: string | undefined
  readonly error: string | undefined
  /** The stored error's length in characters (longer than `error` only for a row leasehold did not write). */
  readonly errorLength: number | undefined
}

/** The most rows a page holds. */
export const maxPageSize = 100

/** How much of a body (and of a dead letter's error) a page's row carries. */
export const previewLength = 200

/** How many rows of a queue a body-text search looks at per page. */
export const scanLimit = 2_000

/** How much of each body a text search looks at (characters). */
export const searchLength = 64 * 1024

/** The longest text searched for. */
export const maxSearchLength = 200

/** How much of a body (and of an error: leasehold stores at most this much of one) one message's read takes. */
export const detailLength = 64 * 1024

/** PostgreSQL stops a read that takes longer (SQLite's reads are bounded by `scanLimit`). */
export const statementTimeoutMillis = 5_000
