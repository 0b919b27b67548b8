/**
 * Settling many deliveries at once: a backend that can commit a group of
 * acknowledgements (and their replies) cheaper than one by one puts its
 * `GroupSettler` on its messages under `GroupSettle`; `Mailbox.settleAll`
 * finds it there. Not part of the contract.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { MailboxResolver, Settlement, SettleOutcome } from "../../Mailbox.js"

/**
 * Settles a group of messages of one mailbox, outcomes in order. Not part of the contract: a backend puts
 * one on its messages (under `GroupSettle`) when it can settle many at once cheaper than one by one.
 */
export type GroupSettler = <A, R>(
  settlements: ReadonlyArray<Settlement<A, R>>
) => Effect.Effect<ReadonlyArray<SettleOutcome>, never, MailboxResolver>

/** Where a message carries its mailbox's `GroupSettler`. */
export const GroupSettle: unique symbol = Symbol.for("leasehold/GroupSettle")

/**
 * Settles one message: `replyAndAcknowledge` with a reply and a `replyTo`, else `acknowledge` — under the
 * settlement's `span`, when it names one, so the reply stores that span's trace context.
 */
export const settleOne = <A, R>(
  { message, reply, span }: Settlement<A, R>
): Effect.Effect<SettleOutcome, never, MailboxResolver> => {
  if (Option.isNone(reply) || Option.isNone(message.replyTo)) {
    return Effect.either(Effect.as(message.acknowledge, undefined))
  }
  const replied = Effect.either(message.replyAndAcknowledge(reply.value))
  return span === undefined ? replied : Effect.withParentSpan(replied, span)
}

/** A `GroupSettler` for a mailbox whose settles do not wait on I/O: one after the other. */
export const settleInTurn: GroupSettler = (settlements) =>
  // A worker settles one message at a time when nothing else is outstanding: no `forEach` for that.
  settlements.length === 1
    ? Effect.map(settleOne(settlements[0]!), (outcome) => [outcome])
    : Effect.forEach(settlements, settleOne)
