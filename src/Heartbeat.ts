/**
 * Heartbeat: proof that a worker is making progress.
 *
 * Workers (and the tools they call) `beat`; a `Watchdog` reads `elapsed` to
 * spot a stuck loop, and listeners registered with `onBeat` piggyback on the
 * beat — the `LeaseExtender` uses one to extend a message's visibility only
 * while work really happens. Listeners run in registration order before
 * `beat` returns; one that fails is logged and does not stop the others.
 *
 * Beats are frequent (every tool call, every loop iteration), so a listener
 * that usually has nothing to do can register with `onBeatAt` and return
 * `undefined`: such a beat then costs little more than reading the clock.
 *
 * Ages are read on the monotonic clock (`Clock.currentTimeNanos`), never the
 * wall clock: a wall-clock step (NTP, a VM resumed) must neither make a
 * healthy worker look stuck nor stop its lease extensions. `TestClock` drives
 * both readings.
 */
import type * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import type * as Scope from "effect/Scope"

/** A liveness signal with listeners. */
export interface Heartbeat {
  /** Records a beat now, then runs the listeners. */
  readonly beat: Effect.Effect<void>
  /** Time since the last beat (or since the heartbeat was made), on the monotonic clock. */
  readonly elapsed: Effect.Effect<Duration.Duration>
  /** Runs `listener` on every beat until the scope closes. */
  readonly onBeat: (listener: Effect.Effect<void>) => Effect.Effect<void, never, Scope.Scope>
  /**
   * Calls `listener` with the beat's monotonic time on every beat until the
   * scope closes, and runs the effect it returns, if any.
   */
  readonly onBeatAt: (listener: Listener) => Effect.Effect<void, never, Scope.Scope>
  /** `onBeatAt` without a scope: adds the listener now and returns the function that removes it. */
  readonly unsafeOnBeatAt: (listener: Listener) => () => void
}

/**
 * A beat listener. `beatAt` is a monotonic reading in milliseconds: only the
 * difference between two readings means anything (it is not a date).
 */
export type Listener = (beatAt: number) => Effect.Effect<void> | undefined

/** The monotonic clock in milliseconds (`Clock.currentTimeNanos`): for ages and rate limits, not dates. */
export const monotonicMillis = (clock: Clock.Clock): number => Number(clock.unsafeCurrentTimeNanos()) / 1_000_000

const guard = (effect: Effect.Effect<void>): Effect.Effect<void> =>
  Effect.catchAllCause(effect, (cause) => Effect.logWarning("Heartbeat listener failed", cause))

/** Calls every listener in order and collects the work they ask for, each guarded. */
const collect = (listeners: ReadonlyArray<Listener>, now: number): Array<Effect.Effect<void>> | undefined => {
  let work: Array<Effect.Effect<void>> | undefined
  for (const listener of listeners) {
    let effect: Effect.Effect<void> | undefined
    try {
      effect = listener(now)
    } catch (defect) {
      effect = Effect.die(defect)
    }
    if (effect !== undefined) (work ??= []).push(guard(effect))
  }
  return work
}

/** Makes a heartbeat whose first beat counts from now, on the clock of the fiber that makes it. */
export const make: Effect.Effect<Heartbeat> = Effect.map(Effect.clock, (clock) => {
  // Beats come once per message and per tool call: the clock is read directly, not looked up each time.
  let last = monotonicMillis(clock)
  // Replaced, never mutated, so a beat iterates a stable snapshot while listeners come and go.
  let listeners: ReadonlyArray<Listener> = []

  const unsafeOnBeatAt = (listener: Listener) => {
    listeners = [...listeners, listener]
    return () => {
      listeners = listeners.filter((l) => l !== listener)
    }
  }
  const onBeatAt = (listener: Listener) =>
    Effect.flatMap(
      Effect.sync(() => unsafeOnBeatAt(listener)),
      (remove) => Effect.addFinalizer(() => Effect.sync(remove))
    )

  return {
    beat: Effect.suspend(() => {
      const now = monotonicMillis(clock)
      last = now
      const work = listeners.length === 0 ? undefined : collect(listeners, now)
      if (work === undefined) return Effect.void
      return work.length === 1 ? work[0]! : Effect.forEach(work, (effect) => effect, { discard: true })
    }),
    elapsed: Effect.sync(() => Duration.millis(Math.max(0, monotonicMillis(clock) - last))),
    onBeat: (listener) => onBeatAt(() => listener),
    onBeatAt,
    unsafeOnBeatAt
  }
})

/**
 * Seconds since a loop's heartbeat last beat, by loop name. Set when it is read — each scrape of the health
 * server's `/metrics` and each watchdog check — so a scrape shows the age at that moment.
 */
export const age: Metric.Metric.Gauge<number> = Metric.gauge("leasehold_heartbeat_age_seconds", {
  description: "Seconds since the loop's heartbeat last beat (monotonic clock)"
})

/** Sets the `age` gauge of loop `name` from `heartbeat`. */
export const recordAge = (name: string, heartbeat: Heartbeat): Effect.Effect<void> =>
  Effect.flatMap(
    heartbeat.elapsed,
    (elapsed) => Metric.set(Metric.tagged(age, "loop", name), Duration.toMillis(elapsed) / 1000)
  )
