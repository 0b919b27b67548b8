/**
 * The step journal's storage, as a delivery offers it: a backend that can keep
 * a run's journal with the message puts a `DeliveryJournal` on its messages
 * under `Journaled` (as it puts its settle `Sink` under `Settles`);
 * `Journal` (the public module) finds it there. A leaf the agent side and
 * every backend import, so neither imports the other. Not part of the
 * contract: a mailbox without it runs agents as before, from the first step
 * on every delivery.
 *
 * What a backend promises:
 * - `identity` names the stored message uniquely among every message of every
 *   store (another queue, table prefix or database included) and is the same
 *   on every delivery of it: the base of a tool's idempotency key. Never from
 *   the body (a sender chooses its request id).
 * - `load` answers the steps every earlier delivery of the message recorded, in
 *   the order they were recorded (`position` ascending), entries as stored —
 *   at most `maxSteps + 1` of them, so a reader can tell a journal that is too
 *   long without reading all of it.
 * - `append` records one step only while this delivery holds the message (its
 *   receipt handle current and its visibility not run out), checked in the
 *   same statement or transaction that writes the step — a delivery that lost
 *   its lease gets `ReceiptHandleExpiredError` and writes nothing. On
 *   PostgreSQL the check locks the message row (`FOR SHARE`), so a claim by the
 *   next delivery and a step of the previous one cannot interleave.
 * - The journal is deleted with the message when a delivery acknowledges it,
 *   unless `keep` was called on that delivery first (the loop dead-letters the
 *   request: its journal stays, under the message's id, for the operator until
 *   retention removes it). A nack, an expiry or a crash leave it for the next
 *   delivery.
 */
import type * as Effect from "effect/Effect"
import { createHash } from "node:crypto"
import type { MailboxConnectionError, ReceiptHandleExpiredError } from "../Mailbox.js"

/** One recorded step as stored: where it sits in the run, and its entry (JSON text, see `Journal.Step`). */
export interface StoredStep {
  /** 1 for the first step the message's deliveries recorded, then 2, 3, … (recording order). */
  readonly position: number
  /** The step's place in the run's tree (`"3"`, `"3.1"`): see `Journal`. */
  readonly key: string
  /** The step, encoded as JSON text. */
  readonly entry: string
  /** The request the run answers (MainLoop's `requestId`), so an operator can find its journal by it. */
  readonly requestId: string | undefined
}

/** The journal of the message one delivery holds. */
export interface DeliveryJournal {
  /** The stored message's own name: unique across stores, the same on every delivery (see above). */
  readonly identity: Effect.Effect<string, MailboxConnectionError>
  /** Steps earlier deliveries recorded, by position. */
  readonly load: Effect.Effect<ReadonlyArray<StoredStep>, MailboxConnectionError>
  /** Records a step while this delivery holds the message. */
  readonly append: (step: StoredStep) => Effect.Effect<void, ReceiptHandleExpiredError | MailboxConnectionError>
  /**
   * Deletes the steps at `fromPosition` and after, while this delivery holds the message (checked as `append`
   * checks): a tool that reran gave a different result, so what was recorded after it no longer follows.
   */
  readonly truncate: (fromPosition: number) => Effect.Effect<void, ReceiptHandleExpiredError | MailboxConnectionError>
  /** The journal outlives this delivery's acknowledgement (kept with the dead letter). */
  readonly keep: Effect.Effect<void>
}

/** The most steps one request's journal holds (a run that would record more stops: `Journal.maxSteps`). */
export const maxSteps = 10_000

/** The size of `text` as stored: its UTF-8 bytes (every journal size is counted so, never in UTF-16 units). */
export const utf8Bytes = (text: string): number => Buffer.byteLength(text, "utf8")

/**
 * The request id as the SQL journal stores it: JSON text, which escapes NUL and lone surrogates, so any string
 * `send` accepts is stored as PostgreSQL takes text (well-formed, no NUL) and read back exactly.
 */
export const encodeRequestId = (requestId: string): string => JSON.stringify(requestId)

/** The request id stored as `encoded` (see `encodeRequestId`); `undefined` when it is not a JSON string. */
export const decodeRequestId = (encoded: string): string | undefined => {
  try {
    const value: unknown = JSON.parse(encoded)
    return typeof value === "string" ? value : undefined
  } catch {
    return undefined
  }
}

/**
 * What the SQL journal indexes a request id by: a SHA-256 digest of its encoded form (base64url, 43 characters),
 * so an id of any length is found through a small index entry, and two ids that differ only in a lone surrogate
 * (which UTF-8 would replace) have different digests. A match is confirmed on the stored id itself.
 */
export const requestDigest = (requestId: string): string =>
  createHash("sha256").update(encodeRequestId(requestId)).digest("base64url")

/** Where a message carries its delivery's journal. */
export const Journaled: unique symbol = Symbol.for("leasehold/Journaled")

/** The journal `message` offers, if its backend keeps journals. */
export const journalOf = (message: object): DeliveryJournal | undefined =>
  (message as Partial<Record<typeof Journaled, DeliveryJournal>>)[Journaled]
