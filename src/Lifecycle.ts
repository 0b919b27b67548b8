/**
 * Lifecycle: stopping a worker process without losing a message.
 *
 * `ShutdownCoordinator` turns SIGTERM / SIGINT into a shutdown: callbacks
 * registered with it run, in registration order, on the first signal (one
 * registered after that runs at once); a second signal ends the process at
 * once, for the operator who really means it. `LoopGroup` runs several loops
 * as one unit: `shutdown` asks every loop (even when one fails or times out)
 * and tells whether all stopped cleanly, and interrupting `run` — which is
 * what SIGTERM does under `NodeRuntime.runMain` — is a graceful shutdown, not
 * an interruption of the work. With the options, the group also watches its
 * loops' heartbeats (`Watchdog`) and reports them to the `Health` server.
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Runtime from "effect/Runtime"
import type * as Scope from "effect/Scope"
import * as Health from "./Health.js"
import type { InvalidParameterError } from "./Mailbox.js"
import type * as MailboxWorker from "./MailboxWorker.js"
import * as Watchdog from "./Watchdog.js"

/** Runs shutdown callbacks when the process is asked to stop. */
export class ShutdownCoordinator extends Context.Tag("leasehold/ShutdownCoordinator")<ShutdownCoordinator, {
  /** Runs `callback` on shutdown; at once if shutdown was already triggered. */
  readonly register: (callback: Effect.Effect<void>) => Effect.Effect<void>
  /** Forgets `callback` (the same effect value that was registered). */
  readonly unregister: (callback: Effect.Effect<void>) => Effect.Effect<void>
  /** Triggers shutdown: runs every registered callback in registration order; later calls do nothing. */
  readonly trigger: Effect.Effect<void>
  readonly triggered: Effect.Effect<boolean>
}>() {
  /** With SIGTERM / SIGINT handlers (see `layer`). */
  static get layer(): Layer.Layer<ShutdownCoordinator> {
    return layer
  }
  /** Without signal handlers (see `layerManual`). */
  static get layerManual(): Layer.Layer<ShutdownCoordinator> {
    return layerManual
  }
}

const guard = (callback: Effect.Effect<void>) =>
  Effect.catchAllCause(callback, (cause) => Effect.logError("Shutdown callback failed", cause))

/** A coordinator without signal handlers (trigger it yourself). */
export const makeCoordinator: Effect.Effect<ShutdownCoordinator["Type"]> = Effect.sync(() => {
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

/** Exit code for a process stopped by a second signal (128 + SIGINT). */
export const forcedExitCode = 130

/**
 * The coordinator with SIGTERM and SIGINT handlers, removed when the layer
 * closes. The first signal triggers shutdown; the second exits at once.
 */
export const layer: Layer.Layer<ShutdownCoordinator> = Layer.scoped(
  ShutdownCoordinator,
  Effect.gen(function*() {
    const coordinator = yield* makeCoordinator
    const runtime = yield* Effect.runtime<never>()
    let signals = 0
    const onSignal = (signal: NodeJS.Signals) => {
      signals++
      if (signals > 1) {
        process.stderr.write(`leasehold: second ${signal}, exiting now\n`)
        process.exit(forcedExitCode)
      }
      Runtime.runFork(runtime)(
        Effect.zipRight(Effect.logInfo(`${signal} received: shutting down gracefully`), coordinator.trigger)
      )
    }
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        process.on("SIGTERM", onSignal)
        process.on("SIGINT", onSignal)
      }),
      () =>
        Effect.sync(() => {
          process.removeListener("SIGTERM", onSignal)
          process.removeListener("SIGINT", onSignal)
        })
    )
    return coordinator
  })
)

/** A coordinator without signals, for tests and embedding. */
export const layerManual: Layer.Layer<ShutdownCoordinator> = Layer.effect(ShutdownCoordinator, makeCoordinator)

/** Several loops run and stopped as one. */
export interface LoopGroup {
  readonly loops: ReadonlyArray<MailboxWorker.Runnable>
  /**
   * Runs every loop until all have stopped. Interrupting it shuts the loops
   * down gracefully first. Registers with the `ShutdownCoordinator` and the
   * `Health` server when they are provided.
   */
  readonly run: (
    options?: MailboxWorker.RunOptions
  ) => Effect.Effect<void, InvalidParameterError | ParseResult.ParseError, Scope.Scope>
  /** Asks every loop to stop within `timeout` (default: the group's); true when all stopped cleanly. */
  readonly shutdown: (options?: { readonly timeout?: Duration.DurationInput }) => Effect.Effect<boolean>
}

/** Makes a group; with `watchdog`, a stalled loop is handled as `Watchdog` says. Also `LoopGroup.make`. */
export const makeGroup = (
  loops: ReadonlyArray<MailboxWorker.Runnable>,
  options?: {
    readonly shutdownTimeout?: Duration.DurationInput
    readonly watchdog?: Parameters<typeof Watchdog.make>[0]
  }
): LoopGroup => {
  const defaultTimeout = options?.shutdownTimeout ?? Duration.seconds(30)

  const shutdown: LoopGroup["shutdown"] = (shutdownOptions) =>
    Effect.gen(function*() {
      const health = yield* Effect.serviceOption(Health.Health)
      if (Option.isSome(health)) yield* health.value.setShuttingDown
      const results = yield* Effect.forEach(
        loops,
        (loop) =>
          loop.shutdown({ timeout: shutdownOptions?.timeout ?? defaultTimeout }).pipe(
            Effect.catchAllCause((cause) =>
              Effect.as(Effect.logError(`Loop "${loop.name}" failed to stop`, cause), false)
            )
          ),
        { concurrency: "unbounded" }
      )
      return results.every((clean) => clean)
    })

  const run: LoopGroup["run"] = (runOptions) =>
    Effect.gen(function*() {
      const coordinator = yield* Effect.serviceOption(ShutdownCoordinator)
      const health = yield* Effect.serviceOption(Health.Health)
      const stop = Effect.asVoid(shutdown())
      if (Option.isSome(coordinator)) {
        yield* Effect.acquireRelease(coordinator.value.register(stop), () => coordinator.value.unregister(stop))
      }
      if (Option.isSome(health)) yield* Effect.forEach(loops, health.value.register, { discard: true })
      if (options?.watchdog !== undefined) {
        const watchdog = yield* Watchdog.make(options.watchdog)
        yield* Effect.forEach(loops, (loop) => watchdog.register(loop.name, loop.heartbeat), { discard: true })
        yield* watchdog.start
      }
      // Daemons, so interrupting `run` does not interrupt the loops' work: it shuts them down instead.
      const fibers = yield* Effect.forEach(loops, (loop) => Effect.forkDaemon(loop.run(runOptions)))
      yield* Fiber.joinAll(fibers).pipe(
        Effect.onInterrupt(() =>
          Effect.zipRight(
            Effect.flatMap(shutdown(), (clean) =>
              clean
                ? Effect.logInfo("All loops stopped cleanly")
                : Effect.logWarning("Some loops had to be interrupted")),
            Fiber.awaitAll(fibers)
          )
        )
      )
    }).pipe(Effect.annotateLogs({ module: "LoopGroup" }))

  return { loops, run, shutdown }
}

/** `LoopGroup.make(loops, { shutdownTimeout })`, the name the design uses. */
export const LoopGroup = { make: makeGroup } as const
