/**
 * What a worker does when settling a handled message fails: nothing is lost
 * and nothing is answered twice.
 *
 * A stale delivery sent nothing (another delivery owns the message); a store
 * that cannot be reached leaves the message to come back when its visibility
 * ends; any other reply failure gives the message back after `retryAfter`
 * instead of losing the work. Every failure is logged, none escapes: a settle
 * step never stops the loop.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { MailboxResolver, Message, ReceiptHandleExpiredError, ReplyError } from "../../Mailbox.js"

/** Logs a settle step that failed (an expired handle, a store error) instead of failing. */
export const logSettleFailure = (step: string) => <E>(effect: Effect.Effect<void, E>): Effect.Effect<void> =>
  Effect.catchAllCause(effect, (cause) => Effect.logWarning(`${step} failed`, cause))

/** Handles the failure of a message's reply + acknowledgement (`replied`: a reply was part of it). */
export const onSettleFailure = <A, R>(
  message: Message<A, R>,
  replied: boolean,
  error: ReplyError | ReceiptHandleExpiredError,
  retryAfter: Duration.Duration
): Effect.Effect<void> => {
  if (!replied) return Effect.logWarning(`acknowledge of ${message.id} failed`, error)
  switch (error._tag) {
    case "ReceiptHandleExpiredError":
      return Effect.logWarning(`Reply to ${message.id} not sent: this delivery lost its lease`, error)
    case "MailboxConnectionError":
      return Effect.logError(
        `Reply to ${message.id} could not be stored; the message comes back when its visibility ends`,
        error
      )
    default:
      return Effect.zipRight(
        Effect.logError(`Reply to ${message.id} could not be sent; the message goes back to the queue`, error),
        logSettleFailure("nack after a failed reply")(message.nack(retryAfter))
      )
  }
}

/**
 * Replies and acknowledges in one step (`Message.replyAndAcknowledge`), so a request is answered once even
 * when it ran twice; failures are handled by `onSettleFailure`. A message without `replyTo` is only
 * acknowledged.
 */
export const replyThenAck = <A, R>(
  message: Message<A, R>,
  reply: R,
  retryAfter: Duration.Duration
): Effect.Effect<void, never, MailboxResolver> => {
  if (Option.isNone(message.replyTo)) return logSettleFailure(`acknowledge of ${message.id}`)(message.acknowledge)
  return Effect.catchAll(
    message.replyAndAcknowledge(reply),
    (error) => onSettleFailure(message, true, error, retryAfter)
  )
}
