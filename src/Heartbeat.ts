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
import * as FiberRef from "effect/FiberRef"
import { dual } from "effect/Function"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import * as internal from "./internal/heartbeat.js"
import { age as ageGauge, currentRef, monotonicMillis } from "./internal/heartbeat.js"

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
  /**
   * For a task that works on one thing at a time and says so by having this property (even `undefined`): what
   * it works on now. Beats skip the task without calling `due` while it is `undefined`, so its owner turns it
   * on and off by writing the field.
   */
  readonly subject?: unknown
}

/**
 * Makes a heartbeat whose first beat counts from now, on the clock of the fiber that makes it.
 *
 * @category constructors
 */
export const make: Effect.Effect<Heartbeat> = internal.make
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
