/**
 * What the operator reads of a step journal (`MailboxSqlAdmin.journals`): a leaf of types, the lookup's error and
 * the read's bounds, so the public declarations name them without reaching the store (and its optional drivers).
 */
import type * as DateTime from "effect/DateTime"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import * as Schema from "effect/Schema"
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
 * The options of `journals().read`: which journal (`JournalLookup`) and how much of it (`JournalReadBound`).
 *
 * @category models
 */
export interface JournalReadOptions extends JournalLookup, JournalReadBound {}

/** The most journals one `matches` lists (`JournalAmbiguousError` names at most these). */
export const matchLimit = 100

/**
 * How `journals()` finds the journal an id names.
 *
 * @category models
 */
export interface JournalLookup {
  /**
   * What the id is: a message id, the request id the steps carry, or either (the default, refused as ambiguous
   * when both answer). A sender chooses its request id, so it may be another message's id, or repeat in another
   * queue.
   */
  readonly by?: "message" | "request" | "either" | undefined
  /** Only the journals of this queue. */
  readonly queue?: string | undefined
}

/**
 * A journal an id names (`Journals.matches`).
 *
 * @category models
 */
export interface JournalMatch {
  readonly messageId: string
  readonly queue: string
  /** How the id named it: as its message id, or as the request id its steps carry. */
  readonly matchedBy: "message id" | "request id"
}

/**
 * An id names more than one journal (a request id sent in two queues, or twice; a message id that is another
 * message's request id): nothing was read or discarded. `matches` lists them (at most `matchLimit`; `more` says
 * there were more): name one by its message id (`by: "message"`) or its queue.
 *
 * @category errors
 */
export class JournalAmbiguousError extends Schema.TaggedError<JournalAmbiguousError>()("JournalAmbiguousError", {
  id: Schema.String,
  queue: Schema.optional(Schema.String),
  matches: Schema.Array(Schema.Struct({
    messageId: Schema.String,
    queue: Schema.String,
    matchedBy: Schema.Literal("message id", "request id")
  })),
  more: Schema.Boolean
}) {
  override get message(): string {
    const listed = this.matches.map((match) =>
      `message ${match.messageId} in queue ${JSON.stringify(match.queue)} (by ${match.matchedBy})`
    )
    return `${JSON.stringify(this.id.length > 200 ? `${this.id.slice(0, 200)}…` : this.id)} names ` +
      `${this.more ? "more than " : ""}${this.matches.length} journals${
        this.queue === undefined ? "" : ` in queue ${JSON.stringify(this.queue)}`
      }: ${listed.join(", ")}. Nothing was read or discarded: name one by its message id, or its queue`
  }
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
 * steps carry (see `JournalLookup`); an id that names several journals is never guessed at: `read` and `discard`
 * fail `JournalAmbiguousError` listing them. A bad id or queue is an `InvalidParameterError`.
 *
 * @category models
 */
export interface Journals {
  /** The journal `id` names, with where its message is now; `None` when no journal has steps under it. */
  readonly read: (
    id: string,
    options?: JournalReadOptions
  ) => Effect.Effect<
    Option.Option<JournalView>,
    InvalidParameterError | JournalAmbiguousError | MailboxConnectionError
  >
  /**
   * Deletes the journal `id` names (a run the code no longer matches): how many steps it held. The request's next
   * delivery starts from its first step.
   */
  readonly discard: (
    id: string,
    lookup?: JournalLookup
  ) => Effect.Effect<number, InvalidParameterError | JournalAmbiguousError | MailboxConnectionError>
  /** Every journal `id` names (at most `matchLimit`, by message id), in message order. */
  readonly matches: (
    id: string,
    lookup?: JournalLookup
  ) => Effect.Effect<ReadonlyArray<JournalMatch>, InvalidParameterError | MailboxConnectionError>
}
