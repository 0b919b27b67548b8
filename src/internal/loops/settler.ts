/**
 * A run's settles of handled messages. Each success goes to its mailbox's driver as data: a row of the
 * driver's group commit (`internal/mailbox/settle.ts`), batched there with every other loop's, while the loop
 * goes on with the next message — one batching step, the driver's. A driver whose settles never wait (memory)
 * settles in line, and so does a row that cannot be data yet (a reply to another store, or to a queue not
 * resolved yet); another implementation's message settles on a fiber of its own.
 *
 * The loop bounds the overlap by counting: a new batch waits for the settles of the batch before last
 * (`nextBatch`), and a run waits for all of them (`stop`) before it ends, unless a stop gives up on them
 * (`abandon`): a settle that never returns must not hold a shutdown, and its message comes back when its lease
 * ends. A row that fails is logged on a fiber of `run`'s caller (its loggers, the worker's annotations), and
 * counted done once logged.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import type { Mailbox, MailboxResolver, Message } from "../../Mailbox.js"
import * as FrontEnd from "../mailbox/frontEnd.js"
import { Settles, type Sink } from "../mailbox/settle.js"
import { traceparentOf } from "../tracing.js"
import { onSettleFailure } from "./settleFailure.js"

/** The settles of one run and how far they got. */
export interface Settler<A, R> {
  /** Settles a success: its acknowledgement, with `reply` when there is one (queued, or in line). */
  readonly settle: (message: Message<A, R>, reply: Option.Option<R>) => Effect.Effect<void, never, MailboxResolver>
  /**
   * Marks the start of a batch; returns the wait for the settles of the batch before last, or `undefined`
   * when they are done already (nearly always: the loop then pays nothing).
   */
  readonly nextBatch: () => Effect.Effect<void> | undefined
  /** Waits for every settle queued so far (at once after `abandon`). */
  readonly stop: Effect.Effect<void>
  /**
   * Stops waiting for the settles still out, and interrupts those on fibers of their own; returns how many
   * were out. Their messages stay unsettled: delivered again when their leases end.
   */
  readonly abandon: Effect.Effect<number>
}

/** How long a message whose reply failed stays away before it is delivered again. */
type RetryAfter<A, R> = (message: Message<A, R>) => Duration.Duration

/**
 * Settles a success in line: its own `replyAndAcknowledge` (a reply and a `replyTo`) or `acknowledge`; never
 * fails (`onSettleFailure` handles a failure).
 */
export const settleInLine = <A, R>(
  message: Message<A, R>,
  reply: Option.Option<R>,
  retryAfter: RetryAfter<A, R>
): Effect.Effect<void, never, MailboxResolver> => {
  const replied = Option.isSome(reply) && Option.isSome(message.replyTo)
  return Effect.catchAllCause(
    replied ? message.replyAndAcknowledge(reply.value) : message.acknowledge,
    (cause) =>
      cause._tag === "Fail"
        ? onSettleFailure(message, replied, cause.error, retryAfter(message))
        : Effect.logError("Settling a handled message failed", cause)
  )
}

/**
 * The settler of a run over `mailbox` (`run`: whether it is traced, and `run`'s fiber): rows go to the mailbox's
 * sink, if it has one, with `resolver` routing their replies; `fork` runs a failed row's handling on a fiber of
 * `run`'s caller.
 */
export const make = <A, R>(
  mailbox: Mailbox<A, R>,
  resolver: MailboxResolver["Type"],
  retryAfter: RetryAfter<A, R>,
  run: { readonly traced: boolean; readonly caller: Fiber.RuntimeFiber<unknown, unknown> },
  fork: (effect: Effect.Effect<void, never, MailboxResolver>) => Fiber.RuntimeFiber<void>
): Settler<A, R> => {
  const { caller, traced } = run
  const sink = FrontEnd.fieldsOf(mailbox)[Settles]
  /** Rows ever queued, and ever finished (committed, or failed and handled). */
  let submitted = 0
  let completed = 0
  /** Rows queued before the current batch started: done before the batch after it starts. */
  let previousBatchStart = 0
  /** Fibers waiting until `completed` reaches their count. */
  let waiters: Array<{ readonly count: number; readonly resume: () => void }> = []
  /** Settles running on fibers of their own, for `abandon` to interrupt. */
  const forked = new Set<Fiber.RuntimeFiber<void>>()
  let abandoned = false

  const forkTracked = (effect: Effect.Effect<void, never, MailboxResolver>) => {
    const fiber = fork(effect)
    forked.add(fiber)
    fiber.addObserver(() => forked.delete(fiber))
  }

  const complete = () => {
    completed++
    if (waiters.length === 0) return
    const ready = waiters.filter((waiter) => waiter.count <= completed)
    waiters = waiters.filter((waiter) => waiter.count > completed)
    for (const waiter of ready) waiter.resume()
  }

  const settledUpTo = (count: number): Effect.Effect<void> =>
    Effect.async<void>((resume) => {
      if (abandoned || completed >= count) return resume(Effect.void)
      waiters.push({ count, resume: () => resume(Effect.void) })
    })

  /**
   * A row of the mailbox's group commit, queued in this step; in line when it cannot be one. The reply continues
   * the span the message was handled in: in a traced run, the loop fiber's current span, read per message;
   * otherwise the span `run` was called in, the loop fiber's for the whole run.
   */
  const queue = (offer: NonNullable<Sink["offer"]>) => {
    const row = (message: Message<A, R>, reply: Option.Option<R>, traceparent: string | undefined) => {
      const queued = offer(message, reply, resolver, traceparent, (error) => {
        if (error === undefined) return complete()
        const replied = Option.isSome(reply) && Option.isSome(message.replyTo)
        forkTracked(
          Effect.ensuring(onSettleFailure(message, replied, error, retryAfter(message)), Effect.sync(complete))
        )
      })
      if (queued === false) return settleInLine(message, reply, retryAfter)
      submitted++
      return queued === true ? Effect.void : queued
    }
    if (traced) {
      return (message: Message<A, R>, reply: Option.Option<R>) =>
        Effect.withFiberRuntime<void, never, MailboxResolver>((fiber) =>
          row(message, reply, traceparentOf(fiber.currentSpan))
        )
    }
    const traceparent = traceparentOf(caller.currentSpan)
    return (message: Message<A, R>, reply: Option.Option<R>) => row(message, reply, traceparent)
  }

  /**
   * Another implementation's message: its own settle on a fiber of its own, so that its commit overlaps the
   * next message as a group commit's would; the reply continues the span the message was handled in.
   */
  const background = (message: Message<A, R>, reply: Option.Option<R>) =>
    Effect.withFiberRuntime<void>((fiber) => {
      const span = fiber.currentSpan
      const settled = settleInLine(message, reply, retryAfter)
      submitted++
      forkTracked(
        Effect.ensuring(span === undefined ? settled : Effect.withParentSpan(settled, span), Effect.sync(complete))
      )
      return Effect.void
    })

  const settle = sink === undefined
    ? background
    : sink.offer === undefined
    ? (message: Message<A, R>, reply: Option.Option<R>) => settleInLine(message, reply, retryAfter)
    : queue(sink.offer)

  return {
    settle,
    nextBatch: () => {
      const older = previousBatchStart
      previousBatchStart = submitted
      return abandoned || completed >= older ? undefined : settledUpTo(older)
    },
    stop: Effect.suspend(() => settledUpTo(submitted)),
    abandon: Effect.suspend(() => {
      abandoned = true
      const out = submitted - completed
      const resumed = waiters
      waiters = []
      for (const waiter of resumed) waiter.resume()
      // Not waited for: an uninterruptible settle may never end either.
      return Effect.as(Effect.forEach([...forked], Fiber.interruptFork, { discard: true }), out)
    })
  }
}
