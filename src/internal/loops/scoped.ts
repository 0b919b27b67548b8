/**
 * A loop run for a scope's lifetime (`MailboxWorker.runScoped`, and the
 * `layer` of MainLoop and EvalLoop): its run options and shutdown timeout
 * are configuration, decoded before anything runs (a `ParseError` naming the
 * option), by the same rules `Runnable.run` applies to its arguments.
 * Where `Runnable.Readiness` or `Health` is provided, the loop counts in readiness while
 * the scope is open, and readiness turns 503 the moment the scope starts
 * to close — before the drain, as a `LoopGroup` does.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Runnable from "../../Runnable.js"
import { limits } from "../mailbox/validation.js"
import * as Options from "../options.js"
import * as Readiness from "../readiness.js"

const RunOptions = Schema.Struct({
  maxIterations: Schema.optionalWith(
    Options.worded(Schema.Number.pipe(Schema.nonNegative()), () => "must be a non-negative number"),
    { exact: true }
  ),
  visibilityTimeout: Schema.optionalWith(Options.duration({ max: limits.maxVisibilityTimeout }), { exact: true }),
  waitTime: Schema.optionalWith(Options.duration({ max: limits.maxWaitTime }), { exact: true }),
  maxMessages: Schema.optionalWith(
    Options.worded(Schema.Number.pipe(Schema.filter((n) => !Number.isNaN(n))), () => "must be a number"),
    { exact: true }
  )
}).annotations({ identifier: "run" })

/** The options of a scoped run: `run`'s options, and how long the graceful stop may take (default 30 s). */
export const fields = {
  run: Schema.optionalWith(RunOptions, { exact: true }),
  shutdownTimeout: Schema.optionalWith(Options.ShutdownTimeout, { exact: true, default: () => Duration.seconds(30) })
}

/** A decoder of a scoped run's options, for the constructor `label`. */
export const decoder = (label: string) => Options.decoder(label, fields)

/**
 * Runs `loop` in the current scope, in the background, with decoded options; closing the scope shuts it down
 * gracefully within `shutdownTimeout`. The loop's death is logged by the loop itself. With `Readiness`,
 * the loop counts in readiness, and closing the scope first marks the worker as shutting down.
 */
export const run = (
  loop: Runnable.Runnable,
  options: {
    readonly run?: Runnable.RunOptions | undefined
    readonly shutdownTimeout: Duration.Duration
  }
): Effect.Effect<void, never, Scope.Scope> =>
  Effect.gen(function*() {
    const health = yield* Readiness.current
    yield* loop.run(options.run).pipe(
      Effect.catchAll((error) => Effect.logError(`Loop "${loop.name}" could not run`, error)),
      Effect.catchAllCause(() => Effect.void), // a death: the loop logged it
      Effect.interruptible,
      Effect.forkScoped
    )
    if (Option.isSome(health)) yield* health.value.register(loop)
    // Added after the fork, so it runs before the fork is interrupted: a graceful stop, not an interruption.
    yield* Effect.addFinalizer(() =>
      Effect.flatMap(
        loop.shutdown({ timeout: options.shutdownTimeout }),
        (clean) =>
          clean
            ? Effect.logInfo(`Loop "${loop.name}" stopped cleanly`)
            : Effect.logWarning(`Loop "${loop.name}" had to be interrupted; its message was given back`)
      )
    )
    // Added last, so it runs first: readiness turns 503 before the drain starts.
    if (Option.isSome(health)) yield* Effect.addFinalizer(() => health.value.setShuttingDown)
  })
