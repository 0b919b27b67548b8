/**
 * Dead letters: where a message goes when retrying it is pointless — it
 * failed too often, or with an error that is known to be permanent — so a
 * poison message stops blocking the queue and is kept for inspection.
 *
 * `DLQPolicy` decides per failure: an error whose tag is in `excludeErrors`
 * is never dead-lettered (always retried); one in `includeErrors` is
 * dead-lettered at once; otherwise a message is dead-lettered when its
 * `deliveryCount` reaches `maxDeliveryCount`. Below that it is nacked with a
 * growing backoff, `min(60 s × deliveryCount, 15 min)`. Exclude wins over
 * include. `MailboxWorker.deadLetterConsumer` is a worker loop over a
 * dead-letter mailbox.
 */
import type * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Options_ from "./internal/options.js"
import type { SendError } from "./Mailbox.js"

/**
 * When to dead-letter instead of retrying.
 *
 * @category models
 */
export class DLQPolicy extends Schema.Class<DLQPolicy>("leasehold/DLQPolicy")({
  /** Dead-letter once a message has been delivered this many times (default 5; a positive integer). */
  maxDeliveryCount: Schema.optionalWith(Options_.PositiveInt, { default: () => 5 }),
  /** Error tags that dead-letter at once. */
  includeErrors: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] }),
  /** Error tags that never dead-letter (exclude wins over include). */
  excludeErrors: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] })
}) {}

/**
 * Options of `policy`: `DLQPolicy`'s fields as callers write them.
 *
 * @category models
 */
export type Options = Partial<{
  maxDeliveryCount: number
  includeErrors: ReadonlyArray<string>
  excludeErrors: ReadonlyArray<string>
}>

const decodeOptions = Options_.classDecoder("DeadLetter.policy", DLQPolicy)

/**
 * Decodes a policy from plain options, failing with a `ParseError` naming what is wrong.
 *
 * @category constructors
 */
export const policy = (options?: Options): Effect.Effect<DLQPolicy, ParseResult.ParseError> => decodeOptions(options)

/**
 * What to do with a failed message.
 *
 * @category models
 */
export type Decision = "dead-letter" | "retry"

/**
 * Applies the policy to a failure with `errorTag` on delivery `deliveryCount`.
 *
 * @category utils
 */
export const decide = (policy: DLQPolicy, deliveryCount: number, errorTag: string): Decision => {
  if (policy.excludeErrors.includes(errorTag)) return "retry"
  if (policy.includeErrors.includes(errorTag)) return "dead-letter"
  return deliveryCount >= policy.maxDeliveryCount ? "dead-letter" : "retry"
}

/**
 * Visibility of a retried message: `min(60 s × deliveryCount, 15 min)`.
 *
 * @category utils
 */
export const backoff = (deliveryCount: number): Duration.Duration =>
  Duration.min(Duration.seconds(60 * Math.max(1, deliveryCount)), Duration.minutes(15))

/**
 * A message that was given up on, with what is known about why.
 *
 * @category models
 */
export interface DeadLetter<A> {
  readonly messageId: string
  readonly body: A
  readonly sourceMailbox: string
  readonly deliveryCount: number
  readonly lastError: string
  readonly lastErrorTag: string
  readonly enqueuedAt: DateTime.Utc
  readonly deadLetteredAt: DateTime.Utc
  readonly requestId: string | undefined
  readonly replyTo: string | undefined
  readonly traceId: string | undefined
  /** The message's key and priority (scheduling by key), kept so a redrive puts it back under its key. */
  readonly key?: string | undefined
  readonly priority?: number | undefined
}

/**
 * Where a loop stores dead letters: a mailbox, or `MailboxSqlAdmin.deadLetters(...).sink(schema)` (a table).
 *
 * @category models
 */
export interface DeadLetterSink<A> {
  readonly name: string
  readonly send: (letter: DeadLetter<A>) => Effect.Effect<string, SendError>
}

/**
 * Where dead letters of `A` go and when.
 *
 * @category models
 */
export interface DeadLetterQueue<A> {
  readonly mailbox: DeadLetterSink<A>
  readonly policy: DLQPolicy
}
