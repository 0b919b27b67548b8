/**
 * ShutdownCoordinator: turns the signals an orchestrator sends (SIGTERM from
 * Kubernetes, ECS, systemd; SIGINT from Ctrl-C) into a graceful shutdown.
 *
 * Callbacks registered with it run, in registration order, on the first
 * signal (one registered after that runs at once); a second signal ends the
 * process at once, for the operator who really means it. `LoopGroup.run`
 * registers its shutdown when a coordinator is provided.
 *
 * Under `NodeRuntime.runMain` the coordinator is optional: SIGTERM interrupts
 * the main fiber, and interrupting `LoopGroup.run` or closing a loop layer's
 * scope is the same graceful shutdown. The coordinator adds the second-signal
 * exit and lets code that is not a loop (a server, a consumer of your own)
 * hear the signal.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Runtime from "effect/Runtime"
import * as Schema from "effect/Schema"
import { constants } from "node:os"
import * as Options_ from "./internal/options.js"

/**
 * Runs shutdown callbacks when the process is asked to stop.
 *
 * @category services
 */
export class ShutdownCoordinator extends Context.Tag("leasehold/ShutdownCoordinator")<ShutdownCoordinator, {
  /** Runs `callback` on shutdown; at once if shutdown was already triggered. */
  readonly register: (callback: Effect.Effect<void>) => Effect.Effect<void>
  /** Forgets `callback` (the same effect value that was registered). */
  readonly unregister: (callback: Effect.Effect<void>) => Effect.Effect<void>
  /** Triggers shutdown: runs every registered callback in registration order; later calls do nothing. */
  readonly trigger: Effect.Effect<void>
  readonly triggered: Effect.Effect<boolean>
}>() {}

const guard = (callback: Effect.Effect<void>) =>
  Effect.catchAllCause(callback, (cause) => Effect.logError("Shutdown callback failed", cause))

/**
 * A coordinator without signal handlers (trigger it yourself).
 *
 * @category constructors
 */
export const make: Effect.Effect<ShutdownCoordinator["Type"]> = Effect.sync(() => {
  let callbacks: ReadonlyArray<Effect.Effect<void>> = []
  let triggered = false
  return {
    register: (callback) =>
      Effect.suspend(() => {
        callbacks = [...callbacks, callback]
        return triggered ? guard(callback) : Effect.void
      }),
    unregister: (callback) =>
      Effect.sync(() => {
        callbacks = callbacks.filter((c) => c !== callback)
      }),
    trigger: Effect.suspend(() => {
      if (triggered) return Effect.void
      triggered = true
      return Effect.forEach(callbacks, guard, { discard: true })
    }),
    triggered: Effect.sync(() => triggered)
  }
})

/**
 * Exit code for a process stopped by a second signal (128 + SIGINT).
 *
 * @category constants
 */
export const forcedExitCode = 130

/**
 * A signal's name, such as `"SIGTERM"` (every `NodeJS.Signals` is one). Spelled without `@types/node`, so that
 * a program without it type-checks these declarations; `layer` refuses a name Node does not know.
 *
 * @category models
 */
export type SignalName = `SIG${string}`

/**
 * The signals `layer` handles unless told otherwise.
 *
 * @category constants
 */
export const defaultSignals: ReadonlyArray<SignalName> = ["SIGTERM", "SIGINT"]

/**
 * Options of `layer`.
 *
 * @category models
 */
export interface Options {
  /** The signals that trigger shutdown (default SIGTERM and SIGINT; not SIGKILL, SIGSTOP or a fault). */
  readonly signals?: ReadonlyArray<SignalName> | undefined
}

/** Signals a handler cannot be installed for (Node throws), or that report a fault rather than ask for a stop. */
const refused: ReadonlySet<string> = new Set(["SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"])

const Signal = Options_.ruledString((input) =>
  typeof input === "string" && Object.hasOwn(constants.signals, input) && !refused.has(input)
    ? undefined
    : "must be the name of a signal that asks the process to stop (SIGTERM, SIGINT, SIGHUP…): " +
      "not SIGKILL or SIGSTOP, which cannot be handled, nor a fault such as SIGSEGV"
)

const decodeOptions = Options_.decoder("ShutdownCoordinator.layer", {
  signals: Schema.optionalWith(Schema.Array(Signal), { exact: true, default: () => defaultSignals })
})

/**
 * The coordinator with handlers for `signals` (default SIGTERM and SIGINT), removed when the layer closes.
 * The first signal triggers shutdown; the second exits at once with `forcedExitCode`. A name that is not a signal
 * a handler can serve is a `ParseError` naming it.
 *
 * @category layers
 */
export const layer = (options?: Options): Layer.Layer<ShutdownCoordinator, ParseResult.ParseError> =>
  Layer.scoped(
    ShutdownCoordinator,
    Effect.gen(function*() {
      const decoded = yield* decodeOptions(options)
      const coordinator = yield* make
      const runtime = yield* Effect.runtime<never>()
      const signals = [...new Set(decoded.signals)]
      let received = 0
      const onSignal = (signal: string) => {
        received++
        if (received > 1) {
          process.stderr.write(`leasehold: second ${signal}, exiting now\n`)
          process.exit(forcedExitCode)
        }
        Runtime.runFork(runtime)(
          Effect.zipRight(Effect.logInfo(`${signal} received: shutting down gracefully`), coordinator.trigger)
        )
      }
      yield* Effect.acquireRelease(
        Effect.sync(() => {
          for (const signal of signals) process.on(signal, onSignal)
        }),
        () =>
          Effect.sync(() => {
            for (const signal of signals) process.removeListener(signal, onSignal)
          })
      )
      return coordinator
    }).pipe(Effect.annotateLogs({ module: "ShutdownCoordinator" }))
  )

/**
 * A coordinator without signals, for tests and embedding.
 *
 * @category layers
 */
export const layerManual: Layer.Layer<ShutdownCoordinator> = Layer.effect(ShutdownCoordinator, make)
