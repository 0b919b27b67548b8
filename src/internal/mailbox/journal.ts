/**
 * The step journal's storage, as a delivery offers it: a backend that can keep
 * a run's journal with the message puts a `DeliveryJournal` on its messages
 * under `Journaled` (as it puts its `GroupSettler` under `GroupSettle`);
 * `Journal` (the public module) finds it there. Not part of the contract: a
 * mailbox without it runs agents as before, from the first step on every
 * delivery.
 *
 * What a backend promises:
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
import type { MailboxConnectionError, ReceiptHandleExpiredError } from "../../Mailbox.js"

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

/** Where a message carries its delivery's journal. */
export const Journaled: unique symbol = Symbol.for("leasehold/Journaled")

/** The journal `message` offers, if its backend keeps journals. */
export const journalOf = (message: object): DeliveryJournal | undefined =>
  (message as Partial<Record<typeof Journaled, DeliveryJournal>>)[Journaled]
