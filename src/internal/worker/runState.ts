/**
 * The state of one `MailboxWorker` run, which the loop, its stop and its cleanup share, and the check of
 * `run`'s options.
 */
import type * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type * as MetricLabel from "effect/MetricLabel"
import { InvalidParameterError, type Message } from "../../Mailbox.js"
import type { RunOptions } from "../../MailboxWorker.js"
import type { Binding } from "../leaseExtender.js"
import { validateReceiveOptions } from "../mailbox/validation.js"
import type { AnnotationCell } from "./annotations.js"
import type * as Settler from "./settler.js"

/** One run's state. */
export interface RunState<A, R> {
  readonly done: Deferred.Deferred<void>
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
  /** Successful messages' replies and acknowledgements, committed in the background. */
  readonly settler: Settler.Settler<A, R>
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
      return Effect.logError(
        `Loop "${name}" did not end within ${Duration.format(interruptGrace)} of its interruption (${why}): ` +
          "a settle is stuck (is the store reachable?); giving up on it"
      )
    }
  )
