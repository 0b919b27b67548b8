/**
 * What the operator reads of a step journal (`MailboxSqlAdmin.journals`): a leaf of types and the read's
 * bound, so the public declarations name them without reaching the store (and its optional drivers).
 */
import type * as DateTime from "effect/DateTime"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type { InvalidParameterError } from "../../../Errors.js"
import type { MailboxConnectionError } from "../../../Mailbox.js"

/** The most steps one read returns (`JournalView.truncated` says when there were more). */
export const stepLimit = 1000

/** The most characters `JournalReadBound.entryChars` may ask for (more than any entry a journal takes). */
export const maxEntryChars = 64 * 1024 * 1024

/**
 * How much of a journal one read returns (the console's message page shows a few hundred steps, a bounded part
 * of each): at most `steps` steps (1..`stepLimit`, default `stepLimit`) and at most `entryChars` characters of
 * each entry (default: whole).
 *
 * @category models
 */
export interface JournalReadBound {
  readonly steps?: number | undefined
  readonly entryChars?: number | undefined
}

/**
 * One recorded step as the operator sees it.
 *
 * @category models
 */
export interface JournalStep {
  /** 1 for the first step the message's deliveries recorded, then 2, 3, … */
  readonly position: number
  /** The step's place in the run's tree (`"3"`, `"3.1"`). */
  readonly key: string
  /** When it was recorded (the database's clock). */
  readonly recordedAt: DateTime.Utc
  /** The entry, parsed from the stored JSON text; the text itself when it does not parse, or when it was cut. */
  readonly entry: unknown
  /** Only when the read cut the entry (`JournalReadBound.entryChars`): its whole length; `entry` is its start. */
  readonly entryLength?: number
}

/**
 * The step journal of one message, as `MailboxSqlAdmin.journals().read` reads it.
 *
 * @category models
 */
export interface JournalView {
  readonly messageId: string
  readonly queue: string
  /** The request the run answers (MainLoop's `requestId`), when its steps carry one. */
  readonly requestId: Option.Option<string>
  /** Where the message is: still in its queue (queued, delayed or in flight), dead-lettered, or neither. */
  readonly where: "queued" | "dead letter" | "gone"
  /** Its steps in position order: the first `stepLimit` of them (or of the read's bound). */
  readonly steps: ReadonlyArray<JournalStep>
  /** There were more steps than the read returns (`stepLimit`, or the read's bound: only the first are in `steps`). */
  readonly truncated: boolean
}

/**
 * The step journals of a database's agent runs, for the operator. `id` is a message id or the request id the
 * steps carry (the newest message's journal, when several answered one request); a bad id is an
 * `InvalidParameterError`.
 *
 * @category models
 */
export interface Journals {
  /** The journal `id` names, with where its message is now; `None` when no journal has steps under it. */
  readonly read: (
    id: string,
    bound?: JournalReadBound
  ) => Effect.Effect<Option.Option<JournalView>, InvalidParameterError | MailboxConnectionError>
  /**
   * Deletes the journal `id` names (a run the code no longer matches): how many steps it held. The request's next
   * delivery starts from its first step.
   */
  readonly discard: (id: string) => Effect.Effect<number, InvalidParameterError | MailboxConnectionError>
}
