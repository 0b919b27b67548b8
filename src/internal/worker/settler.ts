/**
 * A run's settler: the fiber that replies to and acknowledges the messages a
 * worker handled successfully, in groups, in the background.
 *
 * The loop queues each success; the settler takes everything queued at once
 * and settles it with one `Mailbox.settleAll` — a durable mailbox commits the
 * group together and the settler waits once, where a fiber per message would
 * cost a fiber and a wake-up each. So commits overlap the next message, the
 * next receive and the next batch. The loop bounds the overlap: a new batch
 * waits for the settles of the batch before last (`nextBatch`), so at most two
 * batches' settles are ever outstanding, and the loop waits for all of them
 * (`stop`) before it stops. A run makes its settler (and its fiber) when it
 * first queues a settle: a loop that takes one message at a time settles each
 * in line (`settleGroup`) and never has one.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import { type MailboxResolver, settleAll, type Settlement } from "../../Mailbox.js"
import { GroupSettle, type GroupSettler, settleInTurn } from "../mailbox/settle.js"
import { onSettleFailure } from "./settleFailure.js"

/** The settles of one run and how far they got. */
export interface Settler<A, R> {
  /** Queues a success's settle for the settler fiber. */
  readonly queue: (settlement: Settlement<A, R>) => void
  /**
   * `queue`, with the span current here (the one the message was handled in): the settler's fiber has
   * another, and the reply must continue this one. Only traced loops call it, so others make no closure.
   */
  readonly queueInSpan: (settlement: Settlement<A, R>) => Effect.Effect<void>
  /** Nothing queued or in progress: a settle made now would have nothing to overlap. */
  readonly idle: () => boolean
  /**
   * Marks the start of a batch; returns the wait for the settles of the batch before last, or `undefined`
   * when they are done already (nearly always: the loop then pays nothing).
   */
  readonly nextBatch: () => Effect.Effect<void> | undefined
  /** Waits for every settle queued so far, then interrupts the settler's fiber (idle by then). */
  readonly stop: Effect.Effect<void>
}

/** How long a message whose reply failed stays away before it is delivered again. */
type RetryAfter<A, R> = (message: Settlement<A, R>["message"]) => Duration.Duration

/**
 * One message of a mailbox that settles one after the other anyway (no `GroupSettler` of its own, or
 * `settleInTurn`): its own `acknowledge` / `replyAndAcknowledge`, without the group's arrays and outcomes
 * — a worker settles most messages this way, one at a time.
 */
const settleAlone = <A, R>(
  { message, reply, span }: Settlement<A, R>,
  retryAfter: RetryAfter<A, R>
): Effect.Effect<void, never, MailboxResolver> => {
  const replied = Option.isSome(reply) && Option.isSome(message.replyTo)
  const settled = Effect.catchAllCause(
    replied ? message.replyAndAcknowledge(reply.value) : message.acknowledge,
    (cause) =>
      cause._tag === "Fail"
        ? onSettleFailure(message, replied, cause.error, retryAfter(message))
        : Effect.logError("Settling a handled message failed", cause)
  )
  // Settled on the settler's fiber, whose current span is not the message's: the reply continues `span`.
  return span === undefined || !replied ? settled : Effect.withParentSpan(settled, span)
}

/**
 * Settles a group now, on the calling fiber; never fails. Failed replies give their message back after
 * `retryAfter(message)`. The loop settles a message alone with it (no settler needed), the settler each group
 * it takes.
 */
export const settleGroup = <A, R>(
  batch: ReadonlyArray<Settlement<A, R>>,
  retryAfter: RetryAfter<A, R>
): Effect.Effect<void, never, MailboxResolver> => {
  if (batch.length === 1) {
    const groupSettler = (batch[0]!.message as Partial<Record<typeof GroupSettle, GroupSettler>>)[GroupSettle]
    if (groupSettler === undefined || groupSettler === settleInTurn) return settleAlone(batch[0]!, retryAfter)
  }
  return settleAll(batch).pipe(
    Effect.flatMap((outcomes) =>
      outcomes.every(Either.isRight) ? Effect.void : Effect.forEach(outcomes, (outcome, index) => {
        if (Either.isRight(outcome)) return Effect.void
        const { message, reply } = batch[index]!
        const replied = Option.isSome(reply) && Option.isSome(message.replyTo)
        return onSettleFailure(message, replied, outcome.left, retryAfter(message))
      }, { discard: true })
    ),
    Effect.catchAllCause((cause) => Effect.logError("Settling handled messages failed", cause))
  )
}

/**
 * Makes a settler and starts its fiber with `fork` (synchronously, no step: the loop makes one when it first
 * queues a settle, which a loop taking one message at a time never does). The fiber's body takes and settles
 * what is queued, for ever; it never fails, and is interrupted by `stop`.
 */
export const make = <A, R>(
  retryAfter: RetryAfter<A, R>,
  fork: (body: Effect.Effect<never, never, MailboxResolver>) => Fiber.RuntimeFiber<never>
): Settler<A, R> => {
  let queued: Array<Settlement<A, R>> = []
  /** Settles ever queued, and ever finished (committed, or failed and handled). */
  let submitted = 0
  let completed = 0
  /** Settles queued before the current batch started: done before the batch after it starts. */
  let previousBatchStart = 0
  /** Wakes the settler when it waits for work. */
  let wake: (() => void) | undefined
  /** Fibers waiting until `completed` reaches their count. */
  let waiters: Array<{ readonly count: number; readonly resume: () => void }> = []

  const settledUpTo = (count: number): Effect.Effect<void> =>
    Effect.async<void>((resume) => {
      if (completed >= count) return resume(Effect.void)
      waiters.push({ count, resume: () => resume(Effect.void) })
    })

  const take = Effect.async<ReadonlyArray<Settlement<A, R>>>((resume) => {
    const takeAll = () => {
      wake = undefined
      const batch = queued
      queued = []
      resume(Effect.succeed(batch))
    }
    if (queued.length > 0) return takeAll()
    wake = takeAll
  })

  const settleQueued = (batch: ReadonlyArray<Settlement<A, R>>) =>
    settleGroup(batch, retryAfter).pipe(
      Effect.ensuring(Effect.sync(() => {
        completed += batch.length
        const ready = waiters.filter((waiter) => waiter.count <= completed)
        waiters = waiters.filter((waiter) => waiter.count > completed)
        for (const waiter of ready) waiter.resume()
      })),
      Effect.uninterruptible
    )

  const queue = (settlement: Settlement<A, R>) => {
    queued.push(settlement)
    submitted++
    wake?.()
  }

  const fiber = fork(Effect.forever(Effect.flatMap(take, settleQueued)))

  return {
    queue,
    queueInSpan: (settlement) =>
      Effect.withFiberRuntime(({ currentSpan }) => {
        queue(currentSpan === undefined ? settlement : { ...settlement, span: currentSpan })
        return Effect.void
      }),
    idle: () => completed === submitted,
    nextBatch: () => {
      const older = previousBatchStart
      previousBatchStart = submitted
      return completed >= older ? undefined : settledUpTo(older)
    },
    stop: Effect.zipRight(Effect.suspend(() => settledUpTo(submitted)), Fiber.interrupt(fiber))
  }
}
