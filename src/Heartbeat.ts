/**
 * Heartbeat: proof that a worker is making progress.
 *
 * Workers (and the tools they call) `beat`; a `Watchdog` reads `elapsed` to
 * spot a stuck loop, and listeners registered with `onBeat` piggyback on the
 * beat — the `LeaseExtender` uses one to extend a message's visibility only
 * while work really happens. Listeners run in registration order before
 * `beat` returns; one that fails is logged and does not stop the others.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Ref from "effect/Ref"
import type * as Scope from "effect/Scope"

/** A liveness signal with listeners. */
export interface Heartbeat {
  /** Records a beat now, then runs the listeners. */
  readonly beat: Effect.Effect<void>
  /** Time since the last beat (or since the heartbeat was made). */
  readonly elapsed: Effect.Effect<Duration.Duration>
  /** Clock time of the last beat, in epoch milliseconds. */
  readonly lastBeatMillis: Effect.Effect<number>
  /** Runs `listener` on every beat until the scope closes. */
  readonly onBeat: (listener: Effect.Effect<void>) => Effect.Effect<void, never, Scope.Scope>
}

const guard = (listener: Effect.Effect<void>): Effect.Effect<void> =>
  Effect.catchAllCause(listener, (cause) => Effect.logWarning("Heartbeat listener failed", cause))

/** Makes a heartbeat whose first beat counts from now. */
export const make: Effect.Effect<Heartbeat> = Effect.map(Clock.currentTimeMillis, (start) => {
  const last = Ref.unsafeMake(start)
  // Replaced, never mutated, so a beat iterates a stable snapshot while listeners come and go.
  let listeners: ReadonlyArray<Effect.Effect<void>> = []
  const runListeners = Effect.suspend(() => {
    const current = listeners
    switch (current.length) {
      case 0:
        return Effect.void
      case 1:
        return current[0]!
      default:
        return Effect.forEach(current, (listener) => listener, { discard: true })
    }
  })
  return {
    beat: Effect.zipRight(Effect.flatMap(Clock.currentTimeMillis, (now) => Ref.set(last, now)), runListeners),
    elapsed: Effect.zipWith(
      Clock.currentTimeMillis,
      Ref.get(last),
      (now, at) => Duration.millis(Math.max(0, now - at))
    ),
    lastBeatMillis: Ref.get(last),
    onBeat: (listener) => {
      const guarded = guard(listener)
      return Effect.acquireRelease(
        Effect.sync(() => {
          listeners = [...listeners, guarded]
        }),
        () =>
          Effect.sync(() => {
            listeners = listeners.filter((l) => l !== guarded)
          })
      )
    }
  }
})
