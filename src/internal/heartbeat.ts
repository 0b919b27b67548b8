/**
 * What the loops, the watchdog and the health server share about heartbeats
 * beyond the public `Heartbeat` module: the monotonic clock reading, the
 * `FiberRef` that carries the current heartbeat (a loop's fiber sets it once),
 * and the heartbeat-age gauge they set.
 */
import type * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberRef from "effect/FiberRef"
import * as Metric from "effect/Metric"
import type { Heartbeat } from "../Heartbeat.js"

/** The monotonic clock in milliseconds (`Clock.currentTimeNanos`): for ages and rate limits, not dates. */
export const monotonicMillis = (clock: Clock.Clock): number => Number(clock.unsafeCurrentTimeNanos()) / 1_000_000

/** The heartbeat of the work the current fiber runs, if any (`Heartbeat.current`, `Heartbeat.within`). */
export const currentRef: FiberRef.FiberRef<Heartbeat | undefined> = FiberRef.unsafeMake<Heartbeat | undefined>(
  undefined
)

/**
 * Makes `heartbeat` the current one for the rest of the calling fiber's life (and the fibers it forks from
 * now on): for a fiber that does nothing but that heartbeat's work, such as a worker's loop. Elsewhere
 * `Heartbeat.within`, which restores the previous one.
 */
export const setCurrent = (heartbeat: Heartbeat): Effect.Effect<void> => FiberRef.set(currentRef, heartbeat)

/**
 * A heartbeat's record step, for the loop that owns it (`Heartbeat.make` registers it): one `Ref.modify` of its
 * state that records the beat and gives the work its listeners asked for, if any. The loop runs that work only
 * when there is some, so a beat costs it one step (`beat` itself is the record step and a step for the work).
 */
export const BeatRecordId: unique symbol = Symbol.for("leasehold/Heartbeat/beatRecord")

/** The record step of a heartbeat `Heartbeat.make` made (a field of it, not enumerable). */
export type BeatRecord = Effect.Effect<Array<Effect.Effect<void>> | undefined>

/** `heartbeat`'s record step, if `Heartbeat.make` made it. */
export const beatRecordOf = (heartbeat: Heartbeat): BeatRecord | undefined =>
  (heartbeat as { readonly [BeatRecordId]?: BeatRecord })[BeatRecordId]

/** Runs the listeners' work of a beat, in registration order . */
export const runAll = (work: Array<Effect.Effect<void>> | undefined): Effect.Effect<void> => {
  if (work === undefined) return Effect.void
  return work.length === 1 ? work[0]! : Effect.forEach(work, (effect) => effect, { discard: true })
}

/** Seconds since a loop's heartbeat last beat, by loop name (`Heartbeat.age`). */
export const age: Metric.Metric.Gauge<number> = Metric.gauge("leasehold_heartbeat_age_seconds", {
  description: "Seconds since the loop's heartbeat last beat (monotonic clock)"
})

/** Sets the `age` gauge of loop `name` from `heartbeat`: each health scrape and each watchdog check. */
export const recordAge = (name: string, heartbeat: Heartbeat): Effect.Effect<void> =>
  Effect.flatMap(
    heartbeat.elapsed,
    (elapsed) => Metric.set(Metric.tagged(age, "loop", name), Duration.toMillis(elapsed) / 1000)
  )
