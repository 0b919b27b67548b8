/**
 * The heartbeat itself, behind the public `Heartbeat` module, and what the
 * loops, the watchdog and the health server share about heartbeats: the
 * monotonic clock reading, the `FiberRef` that carries the current heartbeat
 * (a loop's fiber sets it once), and the heartbeat-age gauge they set. A loop
 * beats once per message: its beat runs here, without passing through the
 * public module.
 */
import type * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberRef from "effect/FiberRef"
import { identity } from "effect/Function"
import * as Metric from "effect/Metric"
import * as Ref from "effect/Ref"
import * as Scope from "effect/Scope"
import type { BeatTask, Heartbeat, Listener } from "../Heartbeat.js"

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

const guard = (effect: Effect.Effect<void>): Effect.Effect<void> =>
  Effect.catchAllCause(effect, (cause) => Effect.logWarning("Heartbeat listener failed", cause))

/** Calls every listener in order and collects the work they ask for, each guarded. */
const collect = (listeners: ReadonlyArray<Entry>, now: number): Array<Effect.Effect<void>> | undefined => {
  let work: Array<Effect.Effect<void>> | undefined
  for (const listener of listeners) {
    let effect: Effect.Effect<void> | undefined
    try {
      effect = listener.call(now)
    } catch (defect) {
      effect = Effect.die(defect)
    }
    if (effect !== undefined) (work ??= []).push(guard(effect))
  }
  return work
}

/** A task's run in flight, between the beat that started it and its end. */
interface Flight {
  fiber: Fiber.RuntimeFiber<void> | undefined
}

/**
 * One `forkOnBeat` registration: its `call` is the beat listener. A class, not closures: one is made per
 * message a worker handles, and a method costs nothing to make where a closure is a new function each time.
 */
class BeatFork {
  private flight: Flight | undefined
  /** The task has a `subject` (`BeatTask.subject`): beats skip it while that is `undefined`. */
  private readonly gated: boolean
  /** `scope` owns the runs' fibers: the detach step closes it once the run in flight has landed. */
  constructor(private readonly task: BeatTask, private readonly scope: Scope.Scope) {
    this.gated = "subject" in task
  }

  call(now: number): Effect.Effect<void> | undefined {
    if (this.flight !== undefined || (this.gated && this.task.subject === undefined) || !this.task.due(now)) {
      return undefined
    }
    // The flight is claimed and forked in one uninterruptible step, when the beat runs the listeners' work —
    // not here, while it collects it: a beat interrupted in between (an earlier listener's work was slow, a
    // loop being stopped) would otherwise leave a flight that never started, and every later beat would be
    // dropped and every detach wait for it for ever.
    return Effect.uninterruptible(Effect.suspend(() => {
      if (this.flight !== undefined) return Effect.void // another beat started one meanwhile
      const started: Flight = this.flight = { fiber: undefined }
      // Suspended: a `run` that throws as it is called fails its own run, and the flight is still released.
      const run = Effect.ensuring(
        Effect.suspend(() => this.task.run(now)),
        Effect.sync(() => {
          if (this.flight === started) this.flight = undefined
        })
      )
      // In the registration's scope, not a child of the beating fiber: the run must finish even if that fiber
      // moves on.
      return Effect.map(Effect.forkIn(run, this.scope), (fiber) => {
        // Not when the run already finished (it ran before this step): a stale fiber would be awaited.
        if (this.flight === started) started.fiber = fiber
      })
    }))
  }

  /** Waits for the run in flight, if any. */
  get landed(): Effect.Effect<void> {
    return Effect.suspend(() => {
      const flight = this.flight
      if (flight === undefined) return Effect.void
      // Started but its fiber not recorded yet (the beating fiber is between two steps): look again.
      if (flight.fiber === undefined) return Effect.zipRight(Effect.yieldNow(), this.landed)
      return Effect.asVoid(Fiber.await(flight.fiber))
    })
  }
}

/** A registered listener: a `Listener` (`call`) or a `BeatFork`. */
interface Entry {
  readonly call: (beatAt: number) => Effect.Effect<void> | undefined
}

/** A heartbeat's state: the last beat on the monotonic clock, and the listeners in registration order. */
interface State {
  /** The last beat, on the monotonic clock (milliseconds). */
  readonly last: number
  /** Replaced, never mutated, so a beat iterates a stable snapshot while listeners come and go. */
  readonly listeners: ReadonlyArray<Entry>
}

/**
 * Makes a heartbeat whose first beat counts from now, on the clock of the fiber that makes it (`Heartbeat.make`).
 */
export const make: Effect.Effect<Heartbeat> = Effect.map(Effect.clock, (clock) => {
  // Beats come once per message and per tool call: the clock is read directly, not looked up each time.
  const state = Ref.unsafeMake<State>({ last: monotonicMillis(clock), listeners: [] })

  const remove = (entry: Entry) =>
    Ref.update(state, (current) => ({ ...current, listeners: current.listeners.filter((e) => e !== entry) }))
  /** Adds `entry` in one step, which returns `then` (built around the removal). */
  const addEntry = <A>(entry: Entry, then: (remove: Effect.Effect<void>) => A) =>
    Ref.modify(state, (current) => [then(remove(entry)), { ...current, listeners: [...current.listeners, entry] }])
  const addListener = (listener: Listener) => addEntry({ call: listener }, identity)
  const onBeatAt = (listener: Listener) =>
    Effect.flatMap(addListener(listener), (remove) => Effect.addFinalizer(() => remove))
  const forkOnBeat = (task: BeatTask): Effect.Effect<Effect.Effect<void>> =>
    Effect.flatMap(Scope.make(), (scope) => {
      const fork = new BeatFork(task, scope)
      return addEntry(fork, (remove) =>
        Effect.zipRight(Effect.zipRight(remove, fork.landed), Scope.close(scope, Exit.void)))
    })

  // One step records the beat and calls the listeners (synchronous callbacks) on the listeners it read; the
  // work they ask for runs next. Made once: a beat allocates the new state and nothing else.
  const record = Ref.modify(state, (current): [Array<Effect.Effect<void>> | undefined, State] => {
    const now = monotonicMillis(clock)
    const { listeners } = current
    return [listeners.length === 0 ? undefined : collect(listeners, now), { last: now, listeners }]
  })

  const heartbeat: Heartbeat = {
    beat: Effect.flatMap(record, runAll),
    elapsed: Effect.map(
      Ref.get(state),
      ({ last }) => Duration.millis(Math.max(0, monotonicMillis(clock) - last))
    ),
    onBeat: (listener) => onBeatAt(() => listener),
    onBeatAt,
    addListener,
    forkOnBeat
  }
  Object.defineProperty(heartbeat, BeatRecordId, { value: record, enumerable: false })
  return heartbeat
})
