/**
 * MailboxWorker: the one poll loop behind MainLoop, EvalLoop and the
 * dead-letter consumer.
 *
 * Each iteration receives a batch, beats, and handles the messages one by
 * one: the lease extender is attached for the message, the message's log
 * annotations are set (`internal/loops/annotations`), the handler (user code)
 * runs inside `restore` of an `uninterruptibleMask`, and the message is
 * settled by the handler's `Exit`: a failure by the caller's policy, before
 * the next message; an interruption by `nack(0)`, so another worker gets it at
 * once; a success by replying (the caller's `onSuccess` makes the reply) and
 * acknowledging, handed to the mailbox's driver as a row of its group commit
 * while the loop goes on (`internal/loops/settler`). A settle that fails is
 * handled without losing the message (`internal/loops/settleFailure`).
 *
 * `shutdown` stops intake at once (an idle long poll does not delay it), nacks
 * the received messages that have not started, lets the in-flight message
 * finish up to the timeout, and otherwise interrupts it (and so nacks it). It
 * keeps that promise wherever it is called from: a scope's finalizer, an
 * `onInterrupt`, a signal handler — regions that cannot be interrupted, where a
 * plain timeout could never fire. It returns true when the loop stopped
 * without interrupting work, whoever stopped it.
 *
 * **What a message costs.** The loop runs under one `uninterruptibleMask` for the whole run (`restore` around
 * the receive's wait and the handler), the lease extender is bound to the loop's heartbeat once per run
 * (`internal/leaseExtender`: attaching a message is a field write), a beat is one step (the heartbeat's
 * `Ref.modify`; its listeners' work only when there is some), and a success is queued as data in the loop's
 * own step: what is left per message is the Effect steps themselves (BENCHMARKS.md counts them).
 *
 * Traced (an exporting tracer installed), a message is handled in a span
 * `MailboxWorker.handle`, a child of the span it was sent in (`traceparent`),
 * and its reply, however settled, carries that span's context back.
 *
 * A loop never dies silently: when its fiber fails (a receive that fails with
 * an unexpected error, a defect while settling), `run` logs the cause at
 * error level with the loop's name, counts it (`leasehold_loop_failures_total`)
 * and fails with that cause; `LoopGroup` decides what happens next. A loop can
 * `run` again after it stopped or died; it also stops when its mailbox closes.
 */
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as MetricLabel from "effect/MetricLabel"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import type * as Scope from "effect/Scope"
import type * as DeadLetter from "./DeadLetter.js"
import { AlreadyRunningError } from "./Errors.js"
import * as Heartbeat from "./Heartbeat.js"
import { beatRecordOf, runAll } from "./internal/heartbeat.js"
import { binderOf } from "./internal/leaseExtender.js"
import * as Environment from "./internal/loops/environment.js"
import * as HeldLeases from "./internal/loops/heldLease.js"
import * as Metrics from "./internal/loops/metrics.js"
import * as Receive from "./internal/loops/receive.js"
import {
  interruptGrace as grace,
  Latch,
  prepareRun,
  type RunState,
  stopWithin as stop
} from "./internal/loops/runState.js"
import * as Scoped from "./internal/loops/scoped.js"
import * as SettleFailure from "./internal/loops/settleFailure.js"
import * as Settler from "./internal/loops/settler.js"
import { validateDuration } from "./internal/mailbox/validation.js"
import { loopNameProblem } from "./internal/names.js"
import * as Options_ from "./internal/options.js"
import * as Pulse from "./internal/registry.js"
import { parseTraceparent } from "./internal/tracing.js"
import * as LeaseExtender from "./LeaseExtender.js"
import { InvalidParameterError, type Mailbox, MailboxResolver, type Message } from "./Mailbox.js"
import type { Runnable, RunOptions } from "./Runnable.js"

/** The loop contract and its run options live in the leaf `Runnable.ts`, so that `Health` imports no loop. */
export type { Runnable, RunOptions } from "./Runnable.js"

/** The loops' metrics: messages processed, failed, interrupted and redelivered, and loops that died (by name). */
export {
  loopFailures,
  messagesFailed,
  messagesInterrupted,
  messagesProcessed,
  messagesRedelivered
} from "./internal/loops/metrics.js"

/**
 * How a worker settles messages; the handler's success and failure are the caller's to settle.
 *
 * @category models
 */
export interface Options<A, R, Out, E, Req> {
  readonly name: string
  readonly mailbox: Mailbox<A, R>
  /**
   * The user's work for one message; interruptible. Called by the loop's fiber as the message starts, and its
   * effect run at once (a throw is a defect, like a failing effect's).
   */
  readonly handle: (message: Message<A, R>, heartbeat: Heartbeat.Heartbeat) => Effect.Effect<Out, E, Req>
  /**
   * The reply to a message whose handler succeeded (`Option.none()` for none). The worker sends it to
   * the message's `replyTo`, if any, and acknowledges, as one step (`replyAndAcknowledge`): a durable
   * mailbox commits it with the other messages settled meanwhile, while the loop goes on.
   */
  readonly onSuccess: (message: Message<A, R>, output: Out) => Effect.Effect<Option.Option<R>, never, Req>
  /**
   * Settles a message whose handler failed (nack, error reply, dead letter). Runs uninterruptibly. Slow work
   * before the settle (storing a dead letter) runs inside `lease.keep`, so the message stays leased meanwhile.
   */
  readonly onFailure: (
    message: Message<A, R>,
    cause: Cause.Cause<E>,
    lease: HeldLease
  ) => Effect.Effect<void, never, Req>
  /** How long a message whose reply could not be sent stays away before it is delivered again (default 0). */
  readonly retryAfter?: ((message: Message<A, R>) => Duration.Duration) | undefined
  /**
   * Log annotations for what the handler, `onSuccess` and `onFailure` log (MainLoop's `requestId`,
   * say), winning over annotations of the same name. The loggers in place when `run` starts add them
   * (not a logger the handler installs itself); a fiber forked while the message is in hand keeps them,
   * the loop's own logs after the message do not.
   */
  readonly annotations?: ((message: Message<A, R>) => Readonly<Record<string, unknown>>) | undefined
  /** How the lease of the message in hand is extended (see `LeaseExtender.make`). */
  readonly leaseExtender?: LeaseExtender.Options | undefined
}

/**
 * The lease of a failed message while its failure is settled: `keep` runs the worker's own work before the
 * settle (storing a dead letter) with the message's lease kept, at most `holdLimit`.
 *
 * @category models
 */
export type HeldLease = HeldLeases.HeldLease

/**
 * The longest `HeldLease.keep` holds a message's lease (unless the extension is longer): the worker's own work
 * before a settle is a statement or two, and one that takes minutes is stuck.
 *
 * @category constants
 */
export const holdLimit: Duration.Duration = HeldLeases.holdLimit

const { logSettleFailure } = SettleFailure

/**
 * How long a stop waits for a loop it interrupted (after a shutdown's timeout, or an interrupted `run`) before
 * giving up on it. The handler is interruptible and ends at once; only a settle in progress can take this long.
 *
 * @category constants
 */
export const interruptGrace: Duration.Duration = grace

const decodeOptions = Options_.decoder("MailboxWorker.make", { name: Options_.ruledString(loopNameProblem) })

/**
 * Makes a worker; a bad name or lease-extender config fails with a `ParseError` naming it.
 *
 * @category constructors
 */
export const make = <A, R, Out, E, Req>(
  options: Options<A, R, Out, E, Req>
): Effect.Effect<Runnable, ParseResult.ParseError, Req> =>
  Effect.gen(function*() {
    const { mailbox } = options
    const { name } = yield* decodeOptions(options)
    const extender = yield* LeaseExtender.make(options.leaseExtender)
    const bind = binderOf(extender)!
    const keepLease = HeldLeases.keeper(extender.config)
    const heartbeat = yield* Heartbeat.make
    const beatRecord = beatRecordOf(heartbeat)!
    const context = yield* Effect.context<Req>()
    const retryAfter = options.retryAfter ?? (() => Duration.zero)
    const environment = Environment.make(name, context as Context.Context<never>, heartbeat)
    const resolver = Context.get(environment.context, MailboxResolver)
    let state: RunState<A, R> | undefined
    Pulse.track(mailbox, name, heartbeat.elapsed, () => state as RunState<unknown, unknown> | undefined)

    const nackAll = (messages: ReadonlyArray<Message<A, R>>) =>
      Effect.forEach(messages, (message) => logSettleFailure("nack of an unstarted message")(message.nack(0)), {
        discard: true,
        concurrency: "unbounded"
      })

    /**
     * Handles the message in hand: the extender is attached, the handler (user code) runs inside `restore`,
     * and the message is settled by the handler's exit — a success handed to the run's settler (its commit
     * overlaps the next message, the next receive and the next batch), a failure settled here before the next
     * message starts, an interruption given back at once.
     *
     * It runs once per message, inside the loop's one `uninterruptibleMask` (see `loop`), so it is written
     * as a chain of the fewest steps: no mask, finalizer, `annotateLogs` or generator of its own — each costs
     * more than a short handler's whole turn. The detach and the settle run however the handler ends.
     */
    const process = (
      run: RunState<A, R>,
      message: Message<A, R>,
      restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
    ): Effect.Effect<void, never, Req | MailboxResolver> => {
      if (message.deliveryCount > 1) Metrics.messagesRedelivered.unsafeUpdate(1, run.metricLabels)
      if (options.annotations !== undefined) run.annotations.current = options.annotations(message)
      run.extender.subject = message
      // Called here rather than suspended (a step fewer): a handler that throws is a defect all the same.
      let work: Effect.Effect<Out, E, Req>
      try {
        work = options.handle(message, heartbeat)
      } catch (defect) {
        work = Effect.die(defect)
      }
      // Matched rather than `exit` + `flatMap`: one step fewer, and no `Exit` made, per message.
      const handling = Effect.matchCauseEffect(restore(work), {
        onSuccess: (output) => afterDetach(run, () => settleSuccess(run, message, output)),
        onFailure: (cause) => afterDetach(run, () => settleFailure(run, message, cause))
      })
      // A child of the sender's span, not a link: handling a request continues the sender's operation (which
      // awaits the reply), so the two and the reply make one trace. A link suits a span gathering many senders'
      // messages (a batch); here each message has its own. No (well-formed) context: a new trace, as before.
      return run.traced
        ? Effect.withSpan(handling, "MailboxWorker.handle", {
          attributes: { worker: name, messageId: message.id },
          captureStackTrace: false,
          parent: parseTraceparent(message.traceparent)
        })
        : handling
    }

    /** Detaches the extender (waiting for an extension of the message in flight, if any), then `settle`. */
    const afterDetach = <X, Y, Z>(run: RunState<A, R>, settle: () => Effect.Effect<X, Y, Z>) => {
      const binding = run.extender
      const attached = binding.subject
      binding.subject = undefined
      const flight = binding.flight
      return flight === undefined || flight.message !== attached
        ? settle()
        : Effect.zipRight(Deferred.await(flight.done), Effect.suspend(settle))
    }

    const settleSuccess = (
      run: RunState<A, R>,
      message: Message<A, R>,
      output: Out
    ): Effect.Effect<void, never, Req | MailboxResolver> => {
      const reply = options.onSuccess(message, output)
      // A reply made already (`Effect.succeed`, as MainLoop's are) is an `Exit`: taken as it is, a step fewer.
      if (Exit.isExit(reply)) {
        const made = reply as Exit.Exit<Option.Option<R>, never>
        if (Exit.isSuccess(made)) return settleReply(run, message, made.value)
      }
      return Effect.flatMap(reply, (made) => settleReply(run, message, made))
    }

    const settleReply = (
      run: RunState<A, R>,
      message: Message<A, R>,
      reply: Option.Option<R>
    ): Effect.Effect<void, never, Req | MailboxResolver> => {
      Metrics.messagesProcessed.unsafeUpdate(1, run.metricLabels)
      return run.settler.settle(message, reply)
    }

    const settleFailure = (
      run: RunState<A, R>,
      message: Message<A, R>,
      cause: Cause.Cause<E>
    ): Effect.Effect<void, never, Req | MailboxResolver> => {
      // Only the paths that log pay for these annotations.
      const annotate = Effect.annotateLogs({ messageId: message.id, deliveryCount: message.deliveryCount })
      if (Cause.isInterrupted(cause)) {
        run.interruptedWork = true
        Metrics.messagesInterrupted.unsafeUpdate(1, run.metricLabels)
        return annotate(Effect.zipRight(
          Effect.logWarning("Handler interrupted; giving the message back"),
          logSettleFailure("nack after interruption")(message.nack(0))
        ))
      }
      Metrics.messagesFailed.unsafeUpdate(1, run.metricLabels)
      return annotate(options.onFailure(message, cause, { keep: (work) => keepLease(message, work) }))
    }

    /**
     * The loop. It runs uninterruptibly except where it waits — the receive, the settles of the batch
     * before last — and the handler: one `uninterruptibleMask` for the run rather than one per message.
     * Messages are recorded (`pending`, then `inHand`) in the step that receives them, before an
     * interruption can land, so however the loop ends the cleanup of `startLoop` gives them back. A stop
     * that interrupts the loop (`stopWithin`) marks `interrupting` first: the loop then takes no further
     * message, and an interruption that arrives while nothing waits lands at the next `restore`.
     */
    const loop = (
      run: RunState<A, R>,
      receiveOptions: { maxMessages: number; visibilityTimeout: Duration.Duration; waitTime: Duration.Duration },
      maxIterations: number
    ) =>
      Effect.uninterruptibleMask((restore) => {
        const receive = Receive.retrying(mailbox, receiveOptions, run.traced)
        return Effect.gen(function*() {
          for (let iteration = 0; iteration < maxIterations; iteration++) {
            // Checked in the same step that marks the phase: a shutdown either sees "receiving" (and interrupts
            // the wait) or was seen here — never a long poll that nobody cuts short.
            if (run.stopping || run.interrupting) return
            run.phase = "receiving"
            // Recorded in the step that receives (nothing can interrupt in between): a shutdown from here on
            // sees the batch and where it stands.
            run.pending = yield* restore(receive)
            run.next = 0
            run.phase = "processing"
            // Every poll beats, empty ones included, when it returns; that beat counts for the batch's first
            // message, the others beat as they start.
            const work = yield* beatRecord
            if (work !== undefined) yield* runAll(work)
            // A closed mailbox answers every receive at once with nothing: looked at only then.
            if (run.pending.length === 0 && (yield* mailbox.isClosed)) return
            const previous = run.settler.nextBatch()
            if (previous !== undefined) yield* restore(previous)
            while (run.next < run.pending.length) {
              const message = run.pending[run.next++]!
              // In hand from the moment it leaves `pending`: however the loop ends from here, it is given back.
              run.inHand = message
              if (run.interrupting) return
              if (run.stopping) {
                const rest = run.pending.slice(run.next - 1)
                run.pending = []
                run.inHand = undefined
                return yield* nackAll(rest)
              }
              if (run.next > 1) {
                const work = yield* beatRecord
                if (work !== undefined) yield* runAll(work)
              }
              yield* process(run, message, restore)
              run.annotations.current = undefined
              run.inHand = undefined
            }
          }
        })
      })

    /**
     * Starts the loop fiber of `current`. It is interruptible however `run` was called (a layer, a
     * finalizer), so a shutdown can always stop it. It ends once every settle it queued is done. However the loop ends, what it had received and not
     * settled goes back: unstarted messages at once, a message in hand when the loop died after `retryAfter`
     * (it may be what killed the loop; it must not come straight back and kill the next one).
     */
    const startLoop = (
      current: RunState<A, R>,
      receiveOptions: { maxMessages: number; visibilityTimeout: Duration.Duration; waitTime: Duration.Duration },
      maxIterations: number
    ) => {
      // The fiber first sets what it runs with, once (`internal/loops/environment`: context, heartbeat,
      // annotations, loggers), in its first step, so that no frame holds the set-up or the loop for the run.
      const body = Effect.suspend(() =>
        Effect.zipRight(
          Environment.setUpLoop(environment, options.annotations === undefined ? undefined : current.annotations),
          loop(current, receiveOptions, maxIterations) as Effect.Effect<void>
        )
      )
      const giveBack = (exit: Exit.Exit<void>) =>
        Effect.suspend(() => {
          const { inHand } = current
          const pending = current.pending.slice(current.next)
          current.pending = []
          current.inHand = undefined
          // The loop's own logs after a message do not carry its annotations (these are about other messages).
          current.annotations.current = undefined
          current.extender.subject = undefined // given back below: no beat may extend it any more
          const died = Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)
          return Effect.zipRight(
            nackAll(pending),
            inHand === undefined
              ? Effect.void
              : logSettleFailure("nack of the message in hand")(inHand.nack(died ? retryAfter(inHand) : Duration.zero))
          )
        })
      return Effect.uninterruptible(
        Effect.interruptible(body).pipe(
          Effect.onExit((exit) =>
            giveBack(exit).pipe(
              Effect.zipRight(current.extender.stop),
              Effect.zipRight(current.settler.stop)
            )
          )
        )
      ).pipe(Effect.fork)
    }

    /** Ends a run's claim on the loop: it can run again, and the `shutdown`s waiting for it hear it stopped. */
    const release = (current: RunState<A, R>) =>
      Effect.sync(() => {
        if (state !== current) return
        state = undefined
        current.done.open()
      })

    /** A loop that died: counted and logged (a loop never dies silently), and `run` fails with its cause. */
    const died = (cause: Cause.Cause<never>, metricLabels: ReadonlyArray<MetricLabel.MetricLabel>) => {
      Metrics.loopFailures.unsafeUpdate(1, [...metricLabels, MetricLabel.make("loop", name)])
      return Effect.zipRight(
        Effect.logError(`Loop "${name}" died`, cause).pipe(Environment.annotateLogs(name)),
        Effect.failCause(cause)
      )
    }

    /** Claims the loop, starts its fiber and waits for it: a chain of a few steps, which `run`'s fiber holds. */
    const run = (runOptions?: RunOptions): Effect.Effect<void, InvalidParameterError | AlreadyRunningError> =>
      Effect.flatMap(prepareRun(runOptions), ({ caller, cell, maxIterations, metricLabels, receiveOptions, traced }) =>
        // From claiming the loop to awaiting its fiber nothing can be interrupted: an interruption in between
        // would leave the loop marked running with nobody to finish it.
        Effect.uninterruptibleMask((restore) =>
          Effect.suspend(() => {
            // Checked and claimed in one step: two runs cannot both start.
            if (state !== undefined) return Effect.fail(new AlreadyRunningError({ name: `Loop "${name}"` }))
            return Effect.flatMap(bind(heartbeat), (binding) => {
              const current: RunState<A, R> = {
                done: new Latch(),
                stopping: false,
                interruptedWork: false,
                interrupting: false,
                phase: "processing",
                pending: [],
                next: 0,
                inHand: undefined,
                fiber: undefined,
                extender: binding,
                settler: Settler.make(
                  mailbox,
                  resolver,
                  retryAfter,
                  { traced, caller },
                  (effect) => Environment.forkSettler(environment, caller, effect)
                ),
                caller,
                annotations: cell,
                traced,
                metricLabels
              }
              state = current
              return Effect.flatMap(startLoop(current, receiveOptions, maxIterations), (fiber) => {
                current.fiber = fiber
                // However the wait ends, the claim ends with it. Interrupting `run` interrupts the loop (and so the
                // in-flight handler, which gives its message back), waiting at most `interruptGrace` for it.
                return Effect.matchCauseEffect(restore(Fiber.await(fiber)), {
                  onFailure: (cause) =>
                    Effect.zipRight(
                      Cause.isInterruptedOnly(cause) ? stopWithin(current, fiber, "run was interrupted") : Effect.void,
                      Effect.zipRight(release(current), Effect.failCause(cause))
                    ),
                  // Stopped (maxIterations, the mailbox closed) or stopped by a shutdown: nothing to report.
                  onSuccess: (exit) =>
                    Effect.zipRight(
                      release(current),
                      Exit.isSuccess(exit) || Cause.isInterruptedOnly(exit.cause)
                        ? Effect.void
                        : died(exit.cause, metricLabels)
                    )
                })
              })
            })
          })
        ))

    const stopWithin = (current: RunState<A, R>, fiber: Fiber.RuntimeFiber<void>, why: string) =>
      stop(name, current, fiber, why)

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
        const unstarted = current.pending.slice(current.next)
        current.pending = []
        yield* nackAll(unstarted)
        // An idle long poll must not delay the stop (the loop's cleanup is waited for under the timeout below).
        if (current.phase === "receiving" && current.fiber !== undefined) yield* Fiber.interruptFork(current.fiber)
        // Interruptible even when the caller is not (a finalizer, an `onInterrupt`): otherwise the timeout
        // could never interrupt the wait, and a stuck handler would hold the stop for ever.
        const stopped = yield* Effect.timeoutOption(Effect.interruptible(current.done.await), timeout)
        if (Option.isNone(stopped)) {
          current.interruptedWork = true
          yield* Effect.logWarning(`Shutdown timed out after ${Duration.format(timeout)}; interrupting in-flight work`)
          if (current.fiber !== undefined) yield* stopWithin(current, current.fiber, "shutdown timed out")
        }
        // Whoever stopped it: a second caller of `shutdown` hears about the first one's interruption too.
        return !current.interruptedWork
      }).pipe(Environment.annotateLogs(name))

    return {
      name,
      heartbeat,
      run,
      shutdown,
      running: Effect.sync(() => state !== undefined)
    }
  })

/**
 * Options of `deadLetterConsumer`.
 *
 * @category models
 */
export interface DeadLetterConsumerOptions<A, E, Req> {
  /** The loop's name (default `<mailbox>-consumer`). */
  readonly name?: string | undefined
  readonly mailbox: Mailbox<DeadLetter.DeadLetter<A>, unknown>
  /** What to do with a letter; a failure hides it for an hour. */
  readonly handle: (letter: DeadLetter.DeadLetter<A>, heartbeat: Heartbeat.Heartbeat) => Effect.Effect<void, E, Req>
}

/**
 * A loop over a dead-letter mailbox: acknowledges a letter when `handle` succeeds, hides it for an hour when
 * it fails (it will come back).
 *
 * @category constructors
 */
export const deadLetterConsumer = <A, E, Req>(
  options: DeadLetterConsumerOptions<A, E, Req>
): Effect.Effect<Runnable, ParseResult.ParseError, Req> =>
  make({
    name: options.name ?? `${options.mailbox.name}-consumer`,
    mailbox: options.mailbox,
    handle: (message: Message<DeadLetter.DeadLetter<A>, unknown>, heartbeat) => options.handle(message.body, heartbeat),
    onSuccess: () => Effect.succeedNone,
    onFailure: (message, cause) =>
      Effect.zipRight(
        Effect.logWarning("Dead-letter handler failed; retrying in 1 hour", cause),
        logSettleFailure("nack of a dead letter")(message.nack(Duration.hours(1)))
      )
  })

/**
 * Options of `runScoped`.
 *
 * @category models
 */
export interface RunScopedOptions {
  /** How the loop runs (checked here, before anything runs). */
  readonly run?: RunOptions | undefined
  /** How long the in-flight message may take to finish when the scope closes (default 30 s). */
  readonly shutdownTimeout?: Duration.DurationInput | undefined
}

const decodeScoped = Scoped.decoder("MailboxWorker.runScoped")

/**
 * Runs `loop` in the current scope, in the background; closing the scope shuts it down gracefully within
 * `shutdownTimeout` (default 30 s). Bad options are a `ParseError` naming them, before anything runs. The
 * loop's death is logged by the loop itself (see `Runnable.run`); nothing else depends on it.
 *
 * @category combinators
 */
export const runScoped = (
  loop: Runnable,
  options?: RunScopedOptions
): Effect.Effect<void, ParseResult.ParseError, Scope.Scope> =>
  Effect.flatMap(decodeScoped(options), (decoded) => Scoped.run(loop, decoded))
