/**
 * The one settle path: a handled delivery is acknowledged — with its reply, when it has one — by its own
 * mailbox's driver. A driver that commits many settles at once (SQL: its group commit) offers a `Sink` that
 * takes each settle as a row and does not make the caller wait for the commit; a driver whose settles never
 * wait (memory) offers `inLine`, and the message's own `acknowledge` / `replyAndAcknowledge` run on the
 * caller's fiber. A worker finds its mailbox's sink once per run (`sinkOf(mailbox)`), and settles the
 * messages of a mailbox without one (another implementation) in the background; `Mailbox.settleAll` is the
 * same path for a group. Not part of the contract.
 */
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type {
  MailboxConnectionError,
  MailboxResolver,
  Message,
  ReceiptHandleExpiredError,
  Settlement,
  SettleOutcome
} from "../../Mailbox.js"
import { traceparentOf } from "../tracing.js"

/** How an offered row ended: why it failed (a stale handle, the store), else the reply's id (none without one). */
export type Done = (
  error: ReceiptHandleExpiredError | MailboxConnectionError | undefined,
  replyId: string | undefined
) => void

/** A driver's group commit, as the settle path uses it (`inLine`: none, and settles that never wait). */
export interface Sink {
  /**
   * Queues the acknowledgement of `message` (a delivery of this sink's mailbox), with `reply` inserted in the
   * same transaction when it has one and a `replyTo`, at once; `done` hears the outcome once it committed (on
   * the committer's fiber: it must not block). `true` when it is queued; an effect when it is queued and the
   * committer must be started (run it at once); `false` when the row cannot be data yet — the reply goes to
   * another store, its queue was never resolved, or it is refused — and the caller settles the message in line
   * instead (`settleOne`).
   */
  readonly offer?: <A, R>(
    message: Message<A, R>,
    reply: Option.Option<R>,
    resolver: MailboxResolver["Type"],
    traceparent: string | undefined,
    done: Done
  ) => Effect.Effect<void> | boolean
}

/** The sink of a driver whose settles never wait: each is settled in line, on the caller's fiber. */
export const inLine: Sink = {}

/** Where a mailbox (for its worker) and its messages (for `settleAll`) carry their driver's `Sink`. */
export const Settles: unique symbol = Symbol.for("leasehold/Settles")

/** The sink `holder` (a mailbox, or one of its messages) carries, if its driver has one. */
export const sinkOf = (holder: object): Sink | undefined => (holder as Partial<Record<typeof Settles, Sink>>)[Settles]

/**
 * Settles one message in line: `replyAndAcknowledge` with a reply and a `replyTo`, else `acknowledge` — under
 * `span`, when one is named, so the reply stores that span's trace context.
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

/**
 * `Mailbox.settleAll`: each settlement offered to its message's sink, the rest settled in line concurrently;
 * one wait for all of them. Called uninterruptibly: a row queued has its committer started; `restore` marks
 * the waits.
 */
export const settleAll = <A, R>(
  settlements: ReadonlyArray<Settlement<A, R>>,
  resolver: MailboxResolver["Type"],
  traceparent: string | undefined,
  restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
): Effect.Effect<ReadonlyArray<SettleOutcome>, never, MailboxResolver> => {
  const outcomes = new Array<SettleOutcome>(settlements.length)
  const offers: Array<Effect.Effect<void>> = []
  const inLine: Array<Settlement<A, R>> = []
  const inLineIndexes: Array<number> = []
  let waiting = 0
  let resume: (() => void) | undefined
  settlements.forEach((settlement, index) => {
    const { message, reply, span } = settlement
    const offer = sinkOf(message)?.offer?.(
      message,
      reply,
      resolver,
      span === undefined ? traceparent : traceparentOf(span),
      (error, replyId) => {
        outcomes[index] = error === undefined ? Either.right(replyId) : Either.left(error)
        if (--waiting === 0) resume?.()
      }
    )
    if (offer === undefined || offer === false) {
      inLine.push(settlement)
      inLineIndexes.push(index)
    } else {
      waiting++
      if (offer !== true) offers.push(offer)
    }
  })
  const grouped = waiting === 0 ? Effect.void : Effect.zipRight(
    Effect.all(offers, { discard: true }),
    restore(Effect.async<void>((wake) => {
      if (waiting === 0) return wake(Effect.void)
      resume = () => wake(Effect.void)
    }))
  )
  const single = restore(Effect.forEach(inLine, (settlement, k) =>
    Effect.map(settleOne(settlement), (outcome) => {
      outcomes[inLineIndexes[k]!] = outcome
    }), { concurrency: inLine.length > 1 ? "unbounded" : 1, discard: true }))
  return Effect.as(inLine.length === 0 ? grouped : Effect.zip(grouped, single, { concurrent: true }), outcomes)
}
