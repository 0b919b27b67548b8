/**
 * MailboxWorker: the one poll loop behind MainLoop, EvalLoop and the
 * dead-letter consumer.
 *
 * Each iteration receives a batch, beats, and handles the messages one by
 * one: the lease extender is attached for the message, the message's log
 * annotations (MainLoop's `requestId`) are set, the handler (user code) runs
 * inside `restore` of an `uninterruptibleMask`, and the message is
 * settled by the handler's `Exit`: a failure by the caller's policy, before
 * the next message; an interruption by `nack(0)`, so another worker gets it at
 * once; a success by replying (the caller's `onSuccess` makes the reply) and
 * acknowledging. Successes go to the run's settler, one fiber that settles
 * whatever has queued up in one `Mailbox.settleAll` (a durable mailbox commits
 * them together), so commits overlap the next message, the next receive and
 * the next batch; at most two batches' settles are ever outstanding, and all
 * of them finish before the loop stops.
 *
 * A message's log annotations (MainLoop's `requestId`) are not a FiberRef
 * set per message — two FiberRef writes and a HashMap cost more than a short
 * handler's whole turn — but a cell the run's loggers read: `run` wraps the
 * loggers it finds once, the loop fills the cell while a message is in hand,
 * and a fiber forked meanwhile keeps a copy of the cell as it was when forked.
 *
 * `shutdown` stops intake at once (an idle long poll does not delay it), nacks
 * the received messages that have not started, lets the in-flight message
 * finish up to the timeout, and otherwise interrupts it (and so nacks it).
 * It returns true when the loop stopped without interrupting work. A loop can
 * `run` again after a shutdown; it also stops when its mailbox closes.
 */
import type * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberRef from "effect/FiberRef"
import * as FiberRefs from "effect/FiberRefs"
import * as HashMap from "effect/HashMap"
import * as HashSet from "effect/HashSet"
import * as Logger from "effect/Logger"
import type * as Metric from "effect/Metric"
import type * as MetricLabel from "effect/MetricLabel"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Heartbeat from "./Heartbeat.js"
import { counter } from "./internal/metrics.js"
import { exporting } from "./internal/tracing.js"
import * as LeaseExtender from "./LeaseExtender.js"
import {
  InvalidParameterError,
  type Mailbox,
  MailboxResolver,
  type Message,
  type ReceiptHandleExpiredError,
  type ReplyError,
  settleAll,
  type Settlement,
  validateDuration,
  validateReceiveOptions
} from "./Mailbox.js"

/** Options of `run`. */
export interface RunOptions {
  /** Stop after this many polls (empty ones included); unlimited by default. */
  readonly maxIterations?: number | undefined
  /** Visibility of received messages (default 300 s): longer than the slowest handler plus the shutdown timeout. */
  readonly visibilityTimeout?: Duration.DurationInput | undefined
  /** Long poll per receive (default 20 s). */
  readonly waitTime?: Duration.DurationInput | undefined
  /**
   * Messages per receive (default 1, clamped to 1..10). Later messages of a
   * batch wait while earlier ones run, and their visibility runs meanwhile.
   */
  readonly maxMessages?: number | undefined
}

/** A loop with a graceful stop: what MainLoop, EvalLoop and LoopGroup have in common. */
export interface Runnable {
  readonly name: string
  /** Beaten on every poll and by the work itself; a Watchdog reads it. */
  readonly heartbeat: Heartbeat.Heartbeat
  /** Runs until `maxIterations`, `shutdown` or the mailbox closing. */
  readonly run: (options?: RunOptions) => Effect.Effect<void, InvalidParameterError>
  /** Stops the loop; true when it stopped within `timeout` (default 30 s) without interrupting work. */
  readonly shutdown: (options?: { readonly timeout?: Duration.DurationInput | undefined }) => Effect.Effect<boolean>
  readonly running: Effect.Effect<boolean>
}

/** Messages handled, by outcome. */
export const messagesProcessed = counter("leasehold_messages_processed_total", "Messages whose handler succeeded")
export const messagesFailed = counter("leasehold_messages_failed_total", "Messages whose handler failed")
export const messagesInterrupted = counter(
  "leasehold_messages_interrupted_total",
  "Messages whose handler was interrupted (shutdown timeout) and that were given back"
)
export const messagesRedelivered = counter(
  "leasehold_messages_redelivered_total",
  "Messages received with deliveryCount > 1"
)

/** How a worker settles messages; the handler's success and failure are the caller's to settle. */
export interface Options<A, R, Out, E, Req> {
  readonly name: string
  readonly mailbox: Mailbox<A, R>
  /** The user's work for one message; interruptible. */
  readonly handle: (message: Message<A, R>, heartbeat: Heartbeat.Heartbeat) => Effect.Effect<Out, E, Req>
  /**
   * The reply to a message whose handler succeeded (`Option.none()` for none). The worker sends it to
   * the message's `replyTo`, if any, and acknowledges, as one step (`replyAndAcknowledge`), in the
   * background and together with the other messages handled meanwhile (`Mailbox.settleAll`).
   */
  readonly onSuccess: (message: Message<A, R>, output: Out) => Effect.Effect<Option.Option<R>, never, Req>
  /** Settles a message whose handler failed (nack, error reply, dead letter). Runs uninterruptibly. */
  readonly onFailure: (message: Message<A, R>, cause: Cause.Cause<E>) => Effect.Effect<void, never, Req>
  /** How long a message whose reply could not be sent stays away before it is delivered again (default 0). */
  readonly retryAfter?: ((message: Message<A, R>) => Duration.Duration) | undefined
  /**
   * Log annotations for what the handler, `onSuccess` and `onFailure` log (MainLoop's `requestId`,
   * say), winning over annotations of the same name. The loggers in place when `run` starts add them
   * (not a logger the handler installs itself); a fiber forked while the message is in hand keeps them,
   * the loop's own logs after the message do not.
   */
  readonly annotations?: ((message: Message<A, R>) => Readonly<Record<string, unknown>>) | undefined
  readonly leaseExtender?: Partial<
    { interval: Duration.DurationInput; extension: Duration.DurationInput; enabled: boolean }
  >
}

interface RunState<A, R> {
  readonly done: Deferred.Deferred<void>
  stopping: boolean
  /** "receiving" while the loop waits on the mailbox: the only time shutdown interrupts it right away. */
  phase: "receiving" | "processing"
  /** Received, not started. */
  pending: Array<Message<A, R>>
  /** The fiber running the loop; interrupting it while processing interrupts the handler (and nacks). */
  fiber: Fiber.RuntimeFiber<void> | undefined
  /** Successful messages' replies and acknowledgements, committed in the background (see `settler`). */
  readonly settles: SettleQueue<A, R>
  /** Settles queued before the current batch started: done before the batch after it starts. */
  previousBatchStart: number
  /** The annotations of the message in hand, which the run's loggers add (see `annotating`). */
  readonly annotations: AnnotationCell
  /** Empties `annotations`, once the message is settled. */
  readonly unannotate: Effect.Effect<void>
  /** Whether handled messages are spans: an exporting tracer was installed when the run started. */
  readonly traced: boolean
  /** The metric labels of the run (`Effect.tagMetrics`), read once: counters are updated directly. */
  readonly metricLabels: ReadonlyArray<MetricLabel.MetricLabel>
}

/** Settles handed to a run's settler fiber, and how far it got. */
interface SettleQueue<A, R> {
  queued: Array<Settlement<A, R>>
  /** Settles ever queued, and ever finished (committed, or failed and handled). */
  submitted: number
  completed: number
  /** Wakes the settler when it waits for work. */
  wake: (() => void) | undefined
  /** Fibers waiting until `completed` reaches their count. */
  waiters: Array<{ readonly count: number; readonly resume: () => void }>
}

/**
 * Log annotations of the message in hand (`current`), and of the runs around this one (`outer`: a
 * worker running inside another's handler).
 */
interface AnnotationCell {
  current: Readonly<Record<string, unknown>> | undefined
  readonly outer: AnnotationCell | undefined
}

/**
 * The annotation cell of the fiber's run. A fiber forked while a message is in hand gets a copy (it keeps
 * the message it was forked for after the loop moves on); joining a child leaves the parent's cell.
 */
const annotationCell = FiberRef.unsafeMake<AnnotationCell | undefined>(undefined, {
  fork: (cell) => cell === undefined ? undefined : { current: cell.current, outer: cell.outer },
  join: (parent) => parent
})

const addAnnotations = (
  annotations: HashMap.HashMap<string, unknown>,
  extra: Readonly<Record<string, unknown>>
): HashMap.HashMap<string, unknown> => {
  let result = annotations
  for (const key in extra) result = HashMap.set(result, key, extra[key])
  return result
}

/** Adds a cell's annotations to a log line's, the outer runs' first, so the innermost win. */
const addCell = (
  annotations: HashMap.HashMap<string, unknown>,
  cell: AnnotationCell
): HashMap.HashMap<string, unknown> => {
  const outer = cell.outer === undefined ? annotations : addCell(annotations, cell.outer)
  return cell.current === undefined ? outer : addAnnotations(outer, cell.current)
}

/** Loggers that already add the cell's annotations: a nested run does not wrap them again. */
const annotatingLoggers = new WeakSet<Logger.Logger<unknown, unknown>>()

/** Wraps a logger so it adds the annotations of the logging fiber's cell, if any. */
const annotating = (logger: Logger.Logger<unknown, unknown>): Logger.Logger<unknown, unknown> => {
  if (annotatingLoggers.has(logger)) return logger
  const wrapped = Logger.mapInputOptions(logger, (options) => {
    const cell = FiberRefs.getOrDefault(options.context, annotationCell)
    return cell === undefined ? options : { ...options, annotations: addCell(options.annotations, cell) }
  })
  annotatingLoggers.add(wrapped)
  return wrapped
}

/** Logs a settle step that failed (an expired handle, a store error) instead of crashing the loop. */
export const logSettleFailure = (step: string) => <E>(effect: Effect.Effect<void, E>): Effect.Effect<void> =>
  Effect.catchAllCause(effect, (cause) => Effect.logWarning(`${step} failed`, cause))

/**
 * What to do when a reply + acknowledgement failed: a stale delivery sent nothing (another delivery owns
 * the message); a store that cannot be reached leaves the message to come back when its visibility
 * ends; any other reply failure gives the message back after `retryAfter` instead of losing the work.
 */
const onSettleFailure = <A, R>(
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
 * Replies and acknowledges in one step (`Message.replyAndAcknowledge`), so a
 * request is answered once even when it ran twice; failures are handled as
 * described at `onSettleFailure`. A message without `replyTo` is only
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

const receiveBackoff = Schedule.exponential("100 millis", 1.5).pipe(Schedule.union(Schedule.spaced("10 seconds")))

/** Makes a worker; bad lease-extender config fails with a readable `ParseError`. */
export const make = <A, R, Out, E, Req>(
  options: Options<A, R, Out, E, Req>
): Effect.Effect<Runnable, ParseResult.ParseError, Req> =>
  Effect.gen(function*() {
    const { mailbox, name } = options
    const extender = yield* LeaseExtender.make(options.leaseExtender)
    const heartbeat = yield* Heartbeat.make
    const context = yield* Effect.context<Req>()
    let state: RunState<A, R> | undefined

    const nackAll = (messages: ReadonlyArray<Message<A, R>>) =>
      Effect.forEach(messages, (message) => logSettleFailure("nack of an unstarted message")(message.nack(0)), {
        discard: true
      })

    /**
     * Handles one message; interruption of the handler gives the message back at once. The settle
     * that follows a handler's success or failure commits in the background while the next message
     * of the batch runs (a durable store batches those commits), while the loop receives its next
     * batch and while that batch runs (see `nextBatch`); the loop awaits them all before it stops.
     */
    const process = (
      run: RunState<A, R>,
      message: Message<A, R>
    ): Effect.Effect<void, never, Req | MailboxResolver> =>
      Effect.uninterruptibleMask((restore) => {
        // Written as a chain, not a generator, with the extender attached and the log annotations set by
        // hand rather than through `ensuring` / `annotateLogs`: this runs once per message, and their
        // masks and finalizers cost more than a short handler's whole turn. The region is uninterruptible
        // except the handler, so the detach and the reset below run however the handler ends.
        const handled = Effect.suspend(() => {
          if (options.annotations !== undefined) run.annotations.current = options.annotations(message)
          const attached = extender.unsafeAttach(message, heartbeat)
          // A worker handles one message at a time, so it is never attached already.
          if (Either.isLeft(attached)) return Effect.die(attached.left)
          return Effect.flatMap(
            Effect.exit(restore(Effect.suspend(() => options.handle(message, heartbeat)))),
            (exit) => Effect.zipRight(attached.right, Effect.zipRight(settle(run, message, exit), run.unannotate))
          )
        })
        return message.deliveryCount > 1 ? Effect.zipRight(increment(run, messagesRedelivered), handled) : handled
      }).pipe((handling) =>
        run.traced
          ? Effect.withSpan(handling, "MailboxWorker.handle", {
            attributes: { worker: name, messageId: message.id },
            captureStackTrace: false
          })
          : handling
      )

    /**
     * Settles a handled message by its handler's exit: a success is queued for the settler (its commit
     * overlaps the next messages and batches), a failure is settled here before the next message.
     */
    const settle = (
      run: RunState<A, R>,
      message: Message<A, R>,
      exit: Exit.Exit<Out, E>
    ): Effect.Effect<void, never, Req | MailboxResolver> => {
      if (Exit.isSuccess(exit)) {
        return Effect.flatMap(options.onSuccess(message, exit.value), (reply) => {
          messagesProcessed.unsafeUpdate(1, run.metricLabels)
          const { settles } = run
          // Alone (a batch of one, nothing else outstanding): settled here, as there is nothing to
          // overlap and handing it to the settler would cost a wake-up for nothing.
          if (run.pending.length === 0 && settles.completed === settles.submitted) {
            return settleGroup([{ message, reply }])
          }
          queueSettle(settles, { message, reply })
          return Effect.void
        })
      }
      // Only the paths that log pay for these annotations.
      const annotate = Effect.annotateLogs({ messageId: message.id, deliveryCount: message.deliveryCount })
      if (Exit.isInterrupted(exit)) {
        return Effect.zipRight(
          increment(run, messagesInterrupted),
          annotate(Effect.zipRight(
            Effect.logWarning("Handler interrupted; giving the message back"),
            logSettleFailure("nack after interruption")(message.nack(0))
          ))
        )
      }
      return Effect.zipRight(increment(run, messagesFailed), annotate(options.onFailure(message, exit.cause)))
    }

    const increment = (run: RunState<A, R>, counter: Metric.Metric.Counter<number>) =>
      Effect.sync(() => counter.unsafeUpdate(1, run.metricLabels))

    const queueSettle = (settles: SettleQueue<A, R>, settlement: Settlement<A, R>) => {
      settles.queued.push(settlement)
      settles.submitted++
      settles.wake?.()
    }

    /** Waits until the settles queued so far, up to `count`, are done. */
    const settledUpTo = (settles: SettleQueue<A, R>, count: number): Effect.Effect<void> =>
      Effect.async<void>((resume) => {
        if (settles.completed >= count) return resume(Effect.void)
        settles.waiters.push({ count, resume: () => resume(Effect.void) })
      })

    /**
     * The settler: one fiber per run that takes every queued success at once and settles them with
     * `Mailbox.settleAll` — a durable mailbox commits them together and the settler waits once, where
     * a fiber per message would cost a fiber and a wake-up each. Never fails; interrupted only when idle.
     */
    const settler = (run: RunState<A, R>): Effect.Effect<never, never, MailboxResolver> => {
      const { settles } = run
      const take = Effect.async<ReadonlyArray<Settlement<A, R>>>((resume) => {
        const takeAll = () => {
          settles.wake = undefined
          const batch = settles.queued
          settles.queued = []
          resume(Effect.succeed(batch))
        }
        if (settles.queued.length > 0) return takeAll()
        settles.wake = takeAll
      })
      const settleQueued = (batch: ReadonlyArray<Settlement<A, R>>) =>
        settleGroup(batch).pipe(
          Effect.ensuring(Effect.sync(() => {
            settles.completed += batch.length
            const ready = settles.waiters.filter((waiter) => waiter.count <= settles.completed)
            settles.waiters = settles.waiters.filter((waiter) => waiter.count > settles.completed)
            for (const waiter of ready) waiter.resume()
          })),
          Effect.uninterruptible
        )
      return Effect.forever(Effect.flatMap(take, settleQueued))
    }

    /**
     * Settles a group with `Mailbox.settleAll` and deals with each failed outcome; never fails. The loop and
     * the settler run with the run's resolver provided once (a provide per group costs two FiberRef writes).
     */
    const settleGroup = (batch: ReadonlyArray<Settlement<A, R>>): Effect.Effect<void, never, MailboxResolver> =>
      settleAll(batch).pipe(
        Effect.flatMap((outcomes) =>
          outcomes.every(Either.isRight) ? Effect.void : Effect.forEach(outcomes, (outcome, index) => {
            if (Either.isRight(outcome)) return Effect.void
            const { message, reply } = batch[index]!
            const replied = Option.isSome(reply) && Option.isSome(message.replyTo)
            return onSettleFailure(message, replied, outcome.left, options.retryAfter?.(message) ?? Duration.zero)
          }, { discard: true })
        ),
        Effect.catchAllCause((cause) => Effect.logError("Settling handled messages failed", cause))
      )

    /**
     * Starts a new batch: waits for the settles of the batch before last, so a batch's commits overlap
     * the next batch's receive and work, while at most two batches' settles are ever outstanding.
     */
    const nextBatch = (run: RunState<A, R>) =>
      Effect.suspend(() => {
        const older = run.previousBatchStart
        run.previousBatchStart = run.settles.submitted
        return settledUpTo(run.settles, older)
      })

    /** Runs the loop with the loggers it finds wrapped to add the message's annotations (none to add: as it is). */
    const annotated = <X, Y>(cell: AnnotationCell, loop: Effect.Effect<X, Y>): Effect.Effect<X, Y> =>
      options.annotations === undefined ? loop : loop.pipe(
        Effect.locallyWith(FiberRef.currentLoggers, HashSet.map(annotating)),
        Effect.locally(annotationCell, cell)
      )

    /** Waits for every settle queued. */
    const settled = (run: RunState<A, R>) => Effect.suspend(() => settledUpTo(run.settles, run.settles.submitted))

    const loop = (
      run: RunState<A, R>,
      receiveOptions: { maxMessages: number; visibilityTimeout: Duration.Duration; waitTime: Duration.Duration },
      maxIterations: number
    ) =>
      Effect.gen(function*() {
        const receive = mailbox.receive(receiveOptions).pipe(
          Effect.tapError((error) => Effect.logWarning("Receive failed; retrying with backoff", error)),
          Effect.retry({ schedule: receiveBackoff, while: (error) => error._tag === "MailboxConnectionError" }),
          Effect.orDie // options were validated by `run`: any other failure is a bug
        )
        for (let iteration = 0; iteration < maxIterations; iteration++) {
          if (run.stopping || (yield* mailbox.isClosed)) return
          yield* heartbeat.beat
          // Interruptible only while waiting: once messages are in hand they are recorded as pending
          // before an interruption can land, so the ensuring of `run` gives them back.
          yield* Effect.uninterruptibleMask((restore) =>
            Effect.flatMap(
              // Checked in the same step that marks the phase: a shutdown either sees "receiving" (and
              // interrupts the wait) or was seen here — never a long poll that nobody cuts short.
              Effect.suspend(() => {
                if (run.stopping) return Effect.succeed([])
                run.phase = "receiving"
                return restore(receive)
              }),
              (received) =>
                Effect.sync(() => {
                  run.phase = "processing"
                  run.pending = [...received]
                })
            )
          )
          yield* nextBatch(run)
          for (let message = run.pending.shift(); message !== undefined; message = run.pending.shift()) {
            if (run.stopping) {
              yield* nackAll([message, ...run.pending])
              run.pending = []
              return
            }
            yield* heartbeat.beat
            yield* process(run, message)
          }
        }
      })

    const run = (runOptions?: RunOptions): Effect.Effect<void, InvalidParameterError> =>
      Effect.gen(function*() {
        const receiveOptions = yield* validateReceiveOptions({
          maxMessages: runOptions?.maxMessages ?? 1,
          visibilityTimeout: runOptions?.visibilityTimeout ?? Duration.seconds(300),
          waitTime: runOptions?.waitTime ?? Duration.seconds(20)
        })
        const maxIterations = runOptions?.maxIterations ?? Number.POSITIVE_INFINITY
        if (!(maxIterations >= 0)) {
          return yield* new InvalidParameterError({
            parameter: "maxIterations",
            value: maxIterations,
            reason: "must be a non-negative number"
          })
        }
        if (state !== undefined) {
          return yield* new InvalidParameterError({
            parameter: "run",
            value: name,
            reason: "the loop is already running"
          })
        }
        const cell: AnnotationCell = { current: undefined, outer: yield* FiberRef.get(annotationCell) }
        const current: RunState<A, R> = {
          done: yield* Deferred.make<void>(),
          stopping: false,
          phase: "processing",
          pending: [],
          fiber: undefined,
          settles: { queued: [], submitted: 0, completed: 0, wake: undefined, waiters: [] },
          previousBatchStart: 0,
          annotations: cell,
          unannotate: Effect.sync(() => {
            cell.current = undefined
          }),
          traced: yield* exporting,
          metricLabels: yield* FiberRef.get(FiberRef.currentMetricLabels)
        }
        state = current
        // Replies need the resolver; a worker without one (the dead-letter consumer) only acknowledges.
        const resolver = Option.getOrElse(
          Context.getOption(context as Context.Context<never>, MailboxResolver),
          () => MailboxResolver.fromMailboxes()
        )
        const loopContext = Context.add(context, MailboxResolver, resolver)
        // The settler starts with the loop and stops after it, once every settle is done.
        const fiber = yield* Effect.uninterruptibleMask((restore) =>
          // (Interruptible: a fiber forked here would otherwise inherit the mask and never stop.)
          Effect.flatMap(
            Effect.forkDaemon(Effect.interruptible(Effect.provideService(settler(current), MailboxResolver, resolver))),
            (settlerFiber) =>
              restore(annotated(cell, Effect.provide(loop(current, receiveOptions, maxIterations), loopContext))).pipe(
                Effect.ensuring(Effect.suspend(() => {
                  const leftover = current.pending
                  current.pending = []
                  return nackAll(leftover).pipe(
                    Effect.zipRight(settled(current)),
                    Effect.zipRight(Fiber.interrupt(settlerFiber))
                  )
                }))
              )
          )
        ).pipe(Effect.fork)
        current.fiber = fiber
        // Interrupting `run` interrupts the loop (and so the in-flight handler, which gives its message back).
        yield* Fiber.await(fiber).pipe(
          Effect.onInterrupt(() => Fiber.interrupt(fiber)),
          Effect.ensuring(Effect.suspend(() => {
            state = undefined
            return Deferred.succeed(current.done, undefined)
          }))
        )
      }).pipe(Effect.annotateLogs({ module: "MailboxWorker", worker: name }))

    const shutdown = (shutdownOptions?: { readonly timeout?: Duration.DurationInput | undefined }) =>
      Effect.gen(function*() {
        const current = state
        if (current === undefined) {
          return true
        }
        const decoded = validateDuration("timeout", shutdownOptions?.timeout, Duration.seconds(30), Duration.infinity)
        // `shutdown` cannot fail (it is what a signal handler calls): a bad timeout is reported and replaced.
        if (Either.isLeft(decoded)) {
          yield* Effect.logError(`${decoded.left.message}; using 30 s`)
        }
        const timeout = Either.getOrElse(decoded, () => Duration.seconds(30))
        current.stopping = true
        const unstarted = current.pending
        current.pending = []
        yield* nackAll(unstarted)
        // An idle long poll must not delay the stop.
        if (current.phase === "receiving" && current.fiber !== undefined) yield* Fiber.interrupt(current.fiber)
        const stopped = yield* Effect.timeoutOption(Deferred.await(current.done), timeout)
        if (Option.isSome(stopped)) return true
        yield* Effect.logWarning(`Shutdown timed out after ${Duration.format(timeout)}; interrupting in-flight work`)
        if (current.fiber !== undefined) yield* Fiber.interrupt(current.fiber)
        yield* Deferred.await(current.done)
        return false
      }).pipe(Effect.annotateLogs({ module: "MailboxWorker", worker: name }))

    return {
      name,
      heartbeat,
      run,
      shutdown,
      running: Effect.sync(() => state !== undefined)
    }
  })
