/**
 * Heartbeat: proof that a worker is making progress.
 *
 * Work beats; a `Watchdog` reads `elapsed` to spot a stuck loop, and
 * listeners registered with `onBeat` piggyback on the beat. Listeners run in
 * registration order before `beat` returns; one that fails is logged and does
 * not stop the others. Work that must not hold up the beat — the
 * `LeaseExtender`'s visibility extension, which goes to the database — is
 * registered with `forkOnBeat`: the heartbeat forks it when it is due,
 * keeps at most one in flight (a beat meanwhile is dropped), and its detach
 * step waits for the one in flight, so after detaching nothing runs any more.
 * Keep a listener's own work short: a worker loop beats on every poll from a
 * region a stop cannot interrupt (see `MailboxWorker`).
 *
 * **Beat from anywhere.** The heartbeat of the work in progress is carried by
 * a `FiberRef` (as `Deadline.current` is): `MailboxWorker`, and so `MainLoop`
 * and `EvalLoop`, run each loop under its heartbeat, `InnerLoop` and
 * `ToolExecutor` under theirs, and every fiber the work forks inherits it. So
 * `yield* Heartbeat.beat` in a helper three calls deep inside a tool beats the
 * heartbeat of the message being handled, with nothing passed down. Outside
 * any run it does nothing (`current` says whether there is one). A FiberRef,
 * not a `Context.Tag`: a tag would put `Heartbeat` in the requirements of every
 * helper that beats and make code that also runs outside a worker provide a
 * dummy; a beat is optional proof of life, so its absence is not an error.
 * Two loops in one process never cross: each fiber sees its own loop's.
 *
 * State lives in a `Ref` (the last beat on the monotonic clock, the
 * listeners), as the design card asks: a beat is one `Ref.modify` that reads
 * the clock, records the beat and calls the listeners on the list it read,
 * then runs whatever work they asked for; it allocates the new state and
 * nothing else when no listener asks for work. (Two plain fields did the same
 * in no step of their own: BENCHMARKS.md has what the `Ref` costs a beat and
 * a loop's message.) Ages are read on the
 * monotonic clock (`Clock.currentTimeNanos`), never the wall clock: a
 * wall-clock step (NTP, a VM resumed) must neither make a healthy worker look
 * stuck nor stop its lease extensions. `TestClock` drives both readings.
 *
 * For long work that makes progress in steps, `beatEvery` beats on a
 * `Stream`'s elements (at most once per interval): a stream that stalls stops
 * beating, and the lease runs out as it should.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberRef from "effect/FiberRef"
import { dual, identity } from "effect/Function"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import { age as ageGauge, BeatRecordId, currentRef, monotonicMillis, runAll } from "./internal/heartbeat.js"

/**
 * A liveness signal with listeners.
 *
 * @category models
 */
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
  /** `onBeatAt` without a scope: adds the listener and returns the step that removes it. */
  readonly addListener: (listener: Listener) => Effect.Effect<Effect.Effect<void>>
  /**
   * Forks `task.run` on each beat for which `task.due` says yes, on a fiber of its own (the beat never
   * waits for it), with at most one in flight: a beat that comes while it runs is dropped. Returns the
   * detach step: it stops listening, then waits for the run in flight, if any.
   */
  readonly forkOnBeat: (task: BeatTask) => Effect.Effect<Effect.Effect<void>>
}

/**
 * A beat listener. `beatAt` is a monotonic reading in milliseconds: only the
 * difference between two readings means anything (it is not a date).
 *
 * @category models
 */
export type Listener = (beatAt: number) => Effect.Effect<void> | undefined

/**
 * Work a heartbeat forks on its beats (`unsafeForkOnBeat`).
 *
 * @category models
 */
export interface BeatTask {
  /** Whether a beat at `beatAt` should start a run (called synchronously on every beat: keep it cheap). */
  readonly due: (beatAt: number) => boolean
  /** The run; its failures are its own business (log them): the heartbeat only waits for it on detach. */
  readonly run: (beatAt: number) => Effect.Effect<void>
}

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
  /** `scope` owns the runs' fibers: the detach step closes it once the run in flight has landed. */
  constructor(private readonly task: BeatTask, private readonly scope: Scope.Scope) {}

  call(now: number): Effect.Effect<void> | undefined {
    if (this.flight !== undefined || !this.task.due(now)) return undefined
    // The flight is claimed and forked in one uninterruptible step, when the beat runs the listeners' work —
    // not here, while it collects it: a beat interrupted in between (an earlier listener's work was slow, a
    // loop being stopped) would otherwise leave a flight that never started, and every later beat would be
    // dropped and every detach wait for it for ever.
    return Effect.uninterruptible(Effect.suspend(() => {
      if (this.flight !== undefined) return Effect.void // another beat started one meanwhile
      const started: Flight = this.flight = { fiber: undefined }
      const run = Effect.ensuring(
        this.task.run(now),
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

/** What a beat runs after the listeners were called: the work they asked for, in order. */

/**
 * Makes a heartbeat whose first beat counts from now, on the clock of the fiber that makes it.
 *
 * @category constructors
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

// ---------------------------------------------------------------------------
// The current heartbeat
// ---------------------------------------------------------------------------

/**
 * The heartbeat of the work the current fiber runs (set by `within`; the loops set it), if any.
 *
 * @category getters
 */
export const current: Effect.Effect<Option.Option<Heartbeat>> = Effect.map(
  FiberRef.get(currentRef),
  Option.fromNullable
)

/**
 * Beats the current heartbeat (see `current`); does nothing outside any run.
 *
 * @category utils
 */
export const beat: Effect.Effect<void> = FiberRef.getWith(
  currentRef,
  (heartbeat) => heartbeat === undefined ? Effect.void : heartbeat.beat
)

/**
 * Runs `self` with `heartbeat` as the current one: its `Heartbeat.beat`s, and its forks', beat it.
 *
 * @category combinators
 */
export const within: {
  (heartbeat: Heartbeat): <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  <A, E, R>(self: Effect.Effect<A, E, R>, heartbeat: Heartbeat): Effect.Effect<A, E, R>
} = dual(
  2,
  <A, E, R>(self: Effect.Effect<A, E, R>, heartbeat: Heartbeat): Effect.Effect<A, E, R> =>
    Effect.locally(self, currentRef, heartbeat)
)

/**
 * Beats the current heartbeat as `self`'s elements arrive, at most once per `interval` (default: on every
 * element): a download, an upload or a test run that reports progress proves it works, and one that stalls
 * stops beating — its message's lease then runs out and it is redelivered. Outside any run it does nothing.
 *
 * @category combinators
 */
export const beatEvery: {
  (interval?: Duration.DurationInput): <A, E, R>(self: Stream.Stream<A, E, R>) => Stream.Stream<A, E, R>
  <A, E, R>(self: Stream.Stream<A, E, R>, interval?: Duration.DurationInput): Stream.Stream<A, E, R>
} = dual(
  (args) => Stream.StreamTypeId in Object(args[0]),
  <A, E, R>(self: Stream.Stream<A, E, R>, interval?: Duration.DurationInput): Stream.Stream<A, E, R> => {
    const everyMillis = interval === undefined ? 0 : Duration.toMillis(interval)
    return Stream.unwrap(Effect.map(Effect.clock, (clock) => {
      let lastBeat: number | undefined
      return Stream.tap(self, () =>
        Effect.suspend(() => {
          const now = monotonicMillis(clock)
          if (lastBeat !== undefined && now - lastBeat < everyMillis) return Effect.void
          lastBeat = now
          return beat
        }))
    }))
  }
)

/**
 * Seconds since a loop's heartbeat last beat, by loop name. Set when it is read — each scrape of the health
 * server's `/metrics` and each watchdog check — so a scrape shows the age at that moment.
 *
 * @category metrics
 */
export const age: Metric.Metric.Gauge<number> = ageGauge
