/**
 * Runnable: a loop with a graceful stop (what MainLoop, EvalLoop and LoopGroup have in common), its run options,
 * and `Readiness`, where a loop counts itself in a worker's readiness.
 *
 * A leaf module: the loops read `Readiness` from their environment and `Health` provides it, so no loop
 * imports the HTTP health service and `Health` imports no loop.
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { AlreadyRunningError, InvalidParameterError } from "./Errors.js"
import type * as Heartbeat from "./Heartbeat.js"

/**
 * Options of `run`.
 *
 * @category models
 */
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

/**
 * A loop with a graceful stop: what MainLoop, EvalLoop and LoopGroup have in common.
 *
 * @category models
 */
export interface Runnable {
  readonly name: string
  /** Beaten on every poll and by the work itself; a Watchdog reads it. */
  readonly heartbeat: Heartbeat.Heartbeat
  /**
   * Runs until `maxIterations`, `shutdown` or the mailbox closing. Fails when the loop dies, with the
   * cause (logged at error level first).
   */
  readonly run: (options?: RunOptions) => Effect.Effect<void, InvalidParameterError | AlreadyRunningError>
  /** Stops the loop; true when it stopped within `timeout` (default 30 s) without interrupting work. */
  readonly shutdown: (options?: { readonly timeout?: Duration.DurationInput | undefined }) => Effect.Effect<boolean>
  readonly running: Effect.Effect<boolean>
}

/**
 * Where loops count in a worker's readiness; `Health.layer` and `Health.layerRegistry` provide it. A loop run
 * for a scope's lifetime, or by a `LoopGroup`, registers itself when it is present (and with a `Health`
 * provided by hand).
 *
 * @category services
 */
export class Readiness extends Context.Tag("leasehold/Runnable/Readiness")<Readiness, {
  /** Counts `loop` in readiness until the scope closes. */
  readonly register: (loop: Runnable) => Effect.Effect<void, never, Scope.Scope>
  /** From now on, not ready: the worker is draining. */
  readonly setShuttingDown: Effect.Effect<void>
}>() {}
