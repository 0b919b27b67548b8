/**
 * The state of one `MailboxWorker` run, which the loop, its stop and its cleanup share, and the check of
 * `run`'s options.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberRef from "effect/FiberRef"
import type * as MetricLabel from "effect/MetricLabel"
import { InvalidParameterError, type Message } from "../../Mailbox.js"
import type { RunOptions } from "../../MailboxWorker.js"
import type { Binding } from "../leaseExtender.js"
import { validateReceiveOptions } from "../mailbox/validation.js"
import { exporting } from "../tracing.js"
import { type AnnotationCell, makeCell } from "./annotations.js"
import type * as Settler from "./settler.js"

/**
 * Opened once, when a run ends; `await` resumes when it is. A `Deferred` would do, but Effect makes each one by
 * spreading a prototype into an object literal, which gives it a hidden class of its own: many times the size
 * of this, for every run.
 */
export class Latch {
  private opened = false
  private waiters: Array<() => void> | undefined = undefined
  open(): void {
    this.opened = true
    const waiters = this.waiters
    this.waiters = undefined
    if (waiters !== undefined) { for (const resume of waiters) resume() }
  }
  get await(): Effect.Effect<void> {
    return Effect.async<void>((resume) => {
      if (this.opened) return resume(Effect.void)
      const waiter = () => resume(Effect.void)
      this.waiters = this.waiters === undefined ? [waiter] : [...this.waiters, waiter]
      // Interrupted (a shutdown's timeout): forgotten, so a latch never opened keeps no dead waiters.
      return Effect.sync(() => {
        this.waiters = this.waiters?.filter((other) => other !== waiter)
      })
    })
  }
}

/** One run's state. */
export interface RunState<A, R> {
  /** Opened when the run ends, whoever ends it: what `shutdown` waits for. */
  readonly done: Latch
  stopping: boolean
  /** Work was interrupted (a shutdown's timeout, an interrupted `run`): the stop is not clean. */
  interruptedWork: boolean
  /** A stop is interrupting the loop (`stopWithin`): it takes no further message. */
  interrupting: boolean
  /** "receiving" while the loop waits on the mailbox: the only time shutdown interrupts it right away. */
  phase: "receiving" | "processing"
  /** The batch received last; its messages from `next` on have not started. */
  pending: ReadonlyArray<Message<A, R>>
  next: number
  /** The message being handled or settled: given back if the loop dies before settling it. */
  inHand: Message<A, R> | undefined
  /** The fiber running the loop; interrupting it while processing interrupts the handler (and nacks). */
  fiber: Fiber.RuntimeFiber<void> | undefined
  /** The lease extender, bound to the loop's heartbeat for the run. */
  readonly extender: Binding
  /** Successful messages' replies and acknowledgements: rows of the mailbox's group commit, or settled in line. */
  readonly settler: Settler.Settler<A, R>
  /** `run`'s fiber, waiting for the loop's: a failed settle is handled on a fiber started as a fork of it would be. */
  readonly caller: Fiber.RuntimeFiber<unknown, unknown>
  /** The annotations of the message in hand, which the run's loggers add. */
  readonly annotations: AnnotationCell
  /** Whether handled messages are spans: an exporting tracer was installed when the run started. */
  readonly traced: boolean
  /** The metric labels of the run (`Effect.tagMetrics`), read once: counters are updated directly. */
  readonly metricLabels: ReadonlyArray<MetricLabel.MetricLabel>
}

/** Checks `run`'s options and fills in the defaults. */
export const validateRunOptions = (runOptions: RunOptions | undefined) =>
  Effect.flatMap(
    validateReceiveOptions({
      maxMessages: runOptions?.maxMessages ?? 1,
      visibilityTimeout: runOptions?.visibilityTimeout ?? Duration.seconds(300),
      waitTime: runOptions?.waitTime ?? Duration.seconds(20)
    }),
    (receiveOptions) => {
      const maxIterations = runOptions?.maxIterations ?? Number.POSITIVE_INFINITY
      return maxIterations >= 0
        ? Effect.succeed({ receiveOptions, maxIterations })
        : Effect.fail(
          new InvalidParameterError({
            parameter: "maxIterations",
            value: maxIterations,
            reason: "must be a non-negative number"
          })
        )
    }
  )

/** What `run` checks and reads before it claims the loop: its options, what it runs with, and its fiber. */
export const prepareRun = (runOptions: RunOptions | undefined) =>
  Effect.gen(function*() {
    const { maxIterations, receiveOptions } = yield* validateRunOptions(runOptions)
    return {
      maxIterations,
      receiveOptions,
      cell: yield* makeCell,
      traced: yield* exporting,
      metricLabels: yield* FiberRef.get(FiberRef.currentMetricLabels),
      caller: yield* Effect.withFiberRuntime<Fiber.RuntimeFiber<unknown, unknown>>((fiber) => Effect.succeed(fiber))
    }
  })

/**
 * How long a stop waits for a loop it interrupted (`MailboxWorker.interruptGrace`) before giving up on it.
 */
export const interruptGrace: Duration.Duration = Duration.seconds(5)

/**
 * Interrupts the loop fiber of `current` and waits for it to end, at most `interruptGrace`: its handler is
 * interruptible, but a settle in progress (store I/O, the caller's `onFailure`) is not, and a stop must not
 * hang on it.
 */
export const stopWithin = <A, R>(
  name: string,
  current: RunState<A, R>,
  fiber: Fiber.RuntimeFiber<void>,
  why: string
): Effect.Effect<void> =>
  Effect.flatMap(
    Effect.timeoutOption(
      Effect.interruptible(Effect.suspend(() => {
        current.interrupting = true
        return Fiber.interrupt(fiber)
      })),
      interruptGrace
    ),
    (ended) => {
      if (ended._tag === "Some") return Effect.void
      current.interruptedWork = true
      // The loop waits for its settles as it ends: given up, it can end, and their messages come back when
      // their leases end.
      return Effect.flatMap(current.settler.abandon, (out) =>
        (out > 0
          ? Effect.logWarning(
            `Loop "${name}" did not end within ${Duration.format(interruptGrace)} of its interruption (${why}): ` +
              `giving up on ${out} settle(s) still out (is the store reachable?); their messages will be ` +
              "delivered again when their leases end"
          )
          : Effect.logError(
            `Loop "${name}" did not end within ${Duration.format(interruptGrace)} of its interruption (${why}): ` +
              "a settle is stuck (is the store reachable?); giving up on it"
          )).pipe(Effect.annotateLogs({ module: "MailboxWorker", worker: name })))
    }
  )
