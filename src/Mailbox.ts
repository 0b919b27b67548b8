/**
 * Mailbox: an at-least-once queue with SQS semantics, the interface every
 * backend implements (`MailboxMemory`, `MailboxSql`).
 *
 * A received message stays invisible to other receivers for its visibility
 * timeout; the worker then acknowledges it (done), nacks it (give it back,
 * optionally after a delay) or extends its visibility (still working). If the
 * worker does none of these in time, the message becomes visible again and is
 * redelivered with a higher `deliveryCount`. Each delivery gets a fresh,
 * unguessable receipt handle that is valid only while that delivery's
 * visibility lasts, so a worker that lost its lease cannot touch the message.
 *
 * Replies go to the mailbox named by `replyTo`, found through the
 * `MailboxResolver` service. `settleAll` replies to and acknowledges many
 * messages at once (what workers use). Every backend refuses the same
 * arguments with the same `InvalidParameterError` (the checks live in
 * `internal/mailbox`, with the front end the backends share): SQS's limits,
 * written on `SendOptions` and `ReceiveOptions`. A backend's `make` refuses
 * a bad name or `maxSize` alike, with a `ParseError` naming it.
 *
 * Traces cross the mailbox: `send` (and a reply) stores the W3C trace context of the span current where it
 * runs with the message, and a receiver reads it as `traceparent` (`parentSpan` makes it a parent for
 * `Effect.withSpan`; `MailboxWorker` does so). See docs/tracing.md.
 */
import * as Context from "effect/Context"
import type * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import type * as Tracer from "effect/Tracer"
import { InvalidParameterError } from "./Errors.js"
import { causeText, isUnreachable } from "./internal/errors.js"
import * as Scheduling from "./internal/mailbox/scheduling.js"
import * as Settle from "./internal/mailbox/settle.js"
import { parseTraceparent, traceparentOf } from "./internal/tracing.js"

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/**
 * The receipt handle is stale: the delivery's visibility expired, or it was acknowledged, nacked or purged.
 *
 * @category errors
 */
export class ReceiptHandleExpiredError extends Schema.TaggedError<ReceiptHandleExpiredError>()(
  "ReceiptHandleExpiredError",
  { mailbox: Schema.String, messageId: Schema.String, receiptHandle: Schema.String }
) {
  override get message(): string {
    return `Receipt handle for message ${this.messageId} in mailbox "${this.mailbox}" has expired ` +
      "(visibility timed out, or the message was already acknowledged, nacked or purged)"
  }
}

/**
 * The mailbox holds `maxSize` unacknowledged messages already.
 *
 * @category errors
 */
export class MailboxFullError extends Schema.TaggedError<MailboxFullError>()("MailboxFullError", {
  mailbox: Schema.String,
  maxSize: Schema.Number
}) {
  override get message(): string {
    return `Mailbox "${this.mailbox}" is full (maxSize ${this.maxSize})`
  }
}

/**
 * An argument of an operation (`receive`, `send`, `nack`, `extendVisibility`) is out of range or malformed
 * (shared by every module; defined in `Errors`).
 *
 * @category errors
 */
export { InvalidParameterError } from "./Errors.js"

/**
 * `reply` was called on a message without `replyTo`.
 *
 * @category errors
 */
export class ReplyNotAvailableError extends Schema.TaggedError<ReplyNotAvailableError>()("ReplyNotAvailableError", {
  messageId: Schema.String
}) {
  override get message(): string {
    return `Message ${this.messageId} has no replyTo mailbox to reply to`
  }
}

/**
 * `reply` was called after this delivery was acknowledged or nacked.
 *
 * @category errors
 */
export class MessageFinalizedError extends Schema.TaggedError<MessageFinalizedError>()("MessageFinalizedError", {
  messageId: Schema.String
}) {
  override get message(): string {
    return `Message ${this.messageId} was already acknowledged or nacked: reply before settling it`
  }
}

/**
 * No mailbox answers to `name`.
 *
 * @category errors
 */
export class MailboxResolutionError extends Schema.TaggedError<MailboxResolutionError>()("MailboxResolutionError", {
  name: Schema.String
}) {
  override get message(): string {
    return `No mailbox named "${this.name}" is known to the MailboxResolver`
  }
}

/**
 * A body could not be encoded for storage or decoded from it.
 *
 * @category errors
 */
export class SerializationError extends Schema.TaggedError<SerializationError>()("SerializationError", {
  mailbox: Schema.String,
  messageId: Schema.optional(Schema.String),
  reason: Schema.String
}) {
  override get message(): string {
    return `Cannot serialize a body in mailbox "${this.mailbox}": ${this.reason}`
  }
}

/**
 * The backing store cannot be reached.
 *
 * @category errors
 */
export class MailboxConnectionError extends Schema.TaggedError<MailboxConnectionError>()("MailboxConnectionError", {
  mailbox: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    // One error for both (it is the contract's), but the message says which it was.
    return isUnreachable(this.cause)
      ? `Mailbox "${this.mailbox}" cannot reach its store: ${causeText(this.cause)}`
      : `Mailbox "${this.mailbox}": its store refused a statement: ${causeText(this.cause)}`
  }
}

/**
 * The mailbox was closed; it accepts no more messages.
 *
 * @category errors
 */
export class MailboxClosedError extends Schema.TaggedError<MailboxClosedError>()("MailboxClosedError", {
  mailbox: Schema.String
}) {
  override get message(): string {
    return `Mailbox "${this.mailbox}" is closed`
  }
}

// ---------------------------------------------------------------------------
// Interfaces
// ---------------------------------------------------------------------------

/**
 * Options of `send`.
 *
 * @category models
 */
export interface SendOptions {
  /** Name of the mailbox that replies go to. */
  readonly replyTo?: string | undefined
  /** Keep the message invisible this long after sending (0..15 min, default 0). */
  readonly delay?: Duration.DurationInput | undefined
  /**
   * The message's key: a tenant, customer or any grouping (the name rule). A key's messages share its
   * concurrency limit, rates and fair share of worker time (see docs/mailboxes.md); none: in no key.
   */
  readonly key?: string | undefined
  /** Lower first among a key's messages (an integer, 32-bit; default 0). */
  readonly priority?: number | undefined
}

/**
 * Options of `receive`.
 *
 * @category models
 */
export interface ReceiveOptions {
  /** At most this many messages (clamped to 1..10, default 1). */
  readonly maxMessages?: number | undefined
  /** How long received messages stay invisible to others (0..12 h, default 30 s). */
  readonly visibilityTimeout?: Duration.DurationInput | undefined
  /** Long poll: wait up to this long for a message (0..20 s, default 0). */
  readonly waitTime?: Duration.DurationInput | undefined
}

/**
 * Errors of `send`.
 *
 * @category errors
 */
export type SendError =
  | MailboxClosedError
  | MailboxFullError
  | InvalidParameterError
  | SerializationError
  | MailboxConnectionError

/**
 * Errors a stored-state operation on a delivery can give.
 *
 * @category errors
 */
export type SettleError = ReceiptHandleExpiredError | MailboxConnectionError

/**
 * Errors of `reply`.
 *
 * @category errors
 */
export type ReplyError =
  | ReplyNotAvailableError
  | MessageFinalizedError
  | MailboxResolutionError
  | MailboxFullError
  | MailboxClosedError
  | InvalidParameterError
  | SerializationError
  | MailboxConnectionError

/**
 * One delivery of a message.
 *
 * @category models
 */
export interface Message<A, R = never> {
  readonly id: string
  readonly body: A
  /** New on every delivery, unguessable; valid while this delivery's visibility lasts. */
  readonly receiptHandle: string
  /** 1 on the first delivery. */
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  readonly replyTo: Option.Option<string>
  /**
   * The W3C trace context of the span current where the message was sent
   * (`00-<trace id>-<span id>-<flags>`); absent when no span was current, or when the stored value is
   * malformed (never a reason to refuse the message). `parentSpan` turns it into a span parent.
   */
  readonly traceparent?: string | undefined
  /** The key it was sent with (`SendOptions.key`); absent when none. */
  readonly key?: string | undefined
  /** The priority it was sent with (`SendOptions.priority`); absent when 0. */
  readonly priority?: number | undefined
  /** Deletes the message: it will not be delivered again. */
  readonly acknowledge: Effect.Effect<void, SettleError>
  /** Gives the message back, visible again after `visibilityTimeout` (0..12 h, default 0); kills this handle. */
  readonly nack: (
    visibilityTimeout?: Duration.DurationInput
  ) => Effect.Effect<void, SettleError | InvalidParameterError>
  /** Keeps the message invisible for `timeout` from now (0..12 h). */
  readonly extendVisibility: (
    timeout: Duration.DurationInput
  ) => Effect.Effect<void, SettleError | InvalidParameterError>
  /** Sends `body` to the `replyTo` mailbox; must come before acknowledge / nack. */
  readonly reply: (body: R) => Effect.Effect<string, ReplyError, MailboxResolver>
  /**
   * Replies and acknowledges as one step, for workers that must answer each
   * request once: a stale delivery sends no reply (`ReceiptHandleExpiredError`).
   * When the reply queue lives in the same store (SQL), reply and
   * acknowledgement commit together — a crash in between leaves neither.
   */
  readonly replyAndAcknowledge: (
    body: R
  ) => Effect.Effect<string, ReplyError | ReceiptHandleExpiredError, MailboxResolver>
}

/**
 * A message to reply to (with `reply`, when it has a `replyTo`) and acknowledge, as one step.
 *
 * @category models
 */
export interface Settlement<A, R> {
  readonly message: Message<A, R>
  readonly reply: Option.Option<R>
  /**
   * The span the reply continues: its trace context is stored with the reply. By default the span current
   * where the settle runs; a worker that settles in the background names the span the message was handled in.
   */
  readonly span?: Tracer.AnySpan | undefined
}

/**
 * How one settlement ended: the reply's id (undefined when none was sent), or why it failed.
 *
 * @category models
 */
export type SettleOutcome = Either.Either<string | undefined, ReplyError | ReceiptHandleExpiredError>

/**
 * Replies to and acknowledges each message (`replyAndAcknowledge` when it has a reply and a `replyTo`,
 * `acknowledge` otherwise), one outcome per message, in order. A durable mailbox commits the group
 * together and waits once for all of it; messages of other mailboxes (or of several) settle concurrently.
 * It takes the path a worker's settles take (`internal/mailbox/settle.ts`).
 *
 * @category utils
 */
export const settleAll = <A, R>(
  settlements: ReadonlyArray<Settlement<A, R>>
): Effect.Effect<ReadonlyArray<SettleOutcome>, never, MailboxResolver> =>
  settlements.length === 0 ? Effect.succeed([]) : Effect.flatMap(MailboxResolver, (resolver) =>
    // Uninterruptible from queuing a row to starting its committer: only the wait for the outcomes is not.
    Effect.uninterruptibleMask((restore) =>
      Effect.withFiberRuntime((fiber) =>
        Settle.settleAll(settlements, resolver, traceparentOf(fiber.currentSpan), restore)
      )
    ))

/**
 * The span `message` was sent in, as a `parent` for `Effect.withSpan` (the worker's span is its child, and a
 * sender reading a reply continues the worker's trace); none without a well-formed `traceparent`.
 *
 * @category utils
 */
export const parentSpan = <A, R>(message: Message<A, R>): Option.Option<Tracer.ExternalSpan> =>
  Option.fromNullable(parseTraceparent(message.traceparent))

/**
 * Charges `tokens` (a turn's model usage) to the token budget of the message's key, in the store and across
 * processes (see `KeySettings.tokens`): a key over its budget is not claimed until its window turns. A message
 * without a key, or of a backend that does not schedule by key: nothing to charge. The agent path charges each
 * turn's usage itself.
 *
 * @category utils
 */
export const chargeTokens = <A, R>(
  message: Message<A, R>,
  tokens: number
): Effect.Effect<void, InvalidParameterError | MailboxConnectionError> =>
  Effect.suspend((): Effect.Effect<void, InvalidParameterError | MailboxConnectionError> => {
    const valid = Scheduling.validateTokens(tokens)
    if (Either.isLeft(valid)) return Effect.fail(valid.left)
    const scheduled = Scheduling.scheduledOf(message)
    return scheduled === undefined || valid.right === 0 ? Effect.void : scheduled.chargeTokens(valid.right)
  })

/**
 * An at-least-once queue of `A` whose replies carry `R`.
 *
 * @category models
 */
export interface Mailbox<A, R = never> {
  readonly name: string
  /** Enqueues `body` and returns the new message's id. */
  readonly send: (
    body: A,
    options?: SendOptions
  ) => Effect.Effect<string, SendError>
  /** Receives up to `maxMessages` visible messages, first deliveries in enqueue order. */
  readonly receive: (
    options?: ReceiveOptions
  ) => Effect.Effect<ReadonlyArray<Message<A, R>>, InvalidParameterError | MailboxConnectionError>
  /** Deletes every unacknowledged message; returns how many. */
  readonly purge: Effect.Effect<number, MailboxConnectionError>
  /** Messages not yet acknowledged: visible, delayed or in flight. */
  readonly approximateCount: Effect.Effect<number, MailboxConnectionError>
  /** Refuses further sends and wakes blocked receivers; later receives return empty. */
  readonly close: Effect.Effect<void>
  readonly isClosed: Effect.Effect<boolean>
}

// ---------------------------------------------------------------------------
// Resolver
// ---------------------------------------------------------------------------

/**
 * Where a reply can be sent: any mailbox, seen only through `send`.
 *
 * @category models
 */
export interface ReplyTarget {
  readonly name: string
  readonly send: (body: unknown, options?: SendOptions) => Effect.Effect<string, SendError>
}

/**
 * Finds the mailbox a reply goes to, by name.
 *
 * @category services
 */
export class MailboxResolver extends Context.Tag("leasehold/MailboxResolver")<MailboxResolver, {
  readonly resolve: (name: string) => Effect.Effect<ReplyTarget, MailboxResolutionError>
}>() {
  /** A resolver over a fixed set of mailboxes (the reply body is trusted to match the target's type). */
  static fromMailboxes(
    ...mailboxes: ReadonlyArray<{ readonly name: string; readonly send: Mailbox<never>["send"] }>
  ): MailboxResolver["Type"] {
    const byName = new Map(mailboxes.map((mailbox) => [mailbox.name, mailbox as ReplyTarget]))
    return {
      resolve: (name) => {
        const found = byName.get(name)
        return found === undefined ? Effect.fail(new MailboxResolutionError({ name })) : Effect.succeed(found)
      }
    }
  }

  /** A layer with `fromMailboxes`. */
  static layer(
    ...mailboxes: ReadonlyArray<{ readonly name: string; readonly send: Mailbox<never>["send"] }>
  ): Layer.Layer<MailboxResolver> {
    return Layer.succeed(MailboxResolver, MailboxResolver.fromMailboxes(...mailboxes))
  }
}
