/**
 * LoopGroup: several loops run, supervised and stopped as one unit — what a
 * worker process's main fiber runs.
 *
 * `run` starts every loop and returns when all have stopped. Interrupting it
 * — which is what SIGTERM does under `NodeRuntime.runMain` — is a graceful
 * shutdown, not an interruption of the work: every loop stops intake, nacks
 * what it has not started and gets `shutdownTimeout` to finish what it has.
 * `shutdown` asks every loop (even when one fails or times out) and tells
 * whether all stopped cleanly.
 *
 * Supervision: a loop that dies is never silent (the loop logs and counts
 * its death), and the group decides what happens next by its `supervision`
 * policy. `stopGroup` (the default) stops the other loops gracefully and fails
 * `run` with the first cause, so a process under `runMain` exits non-zero and
 * its orchestrator restarts it. `restart(schedule)` runs the dead loop again
 * on the schedule (each restart logged and counted), and stops the group once
 * the schedule gives up. Loops run on fibers of `run`'s own scope: none
 * outlives the group.
 *
 * With a `ShutdownCoordinator` provided, the group registers its shutdown
 * with it; with `Health` or `Runnable.Readiness`, its loops count in readiness; with `watchdog`, their
 * heartbeats are watched for stalls.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import * as ScheduleIntervals from "effect/ScheduleIntervals"
import * as Schema from "effect/Schema"
import { AlreadyRunningError } from "./Errors.js"
import { counter } from "./internal/metrics.js"
import * as Options_ from "./internal/options.js"
import * as Readiness from "./internal/readiness.js"
import type { InvalidParameterError } from "./Mailbox.js"
import * as MailboxWorker from "./MailboxWorker.js"
import { ShutdownCoordinator } from "./ShutdownCoordinator.js"
import * as Watchdog from "./Watchdog.js"

/**
 * What a group does when one of its loops dies.
 *
 * @category models
 */
export type Supervision =
  | { readonly _tag: "StopGroup" }
  | { readonly _tag: "Restart"; readonly schedule: Schedule.Schedule<unknown, Cause.Cause<unknown>> }

/**
 * Stop every other loop gracefully and fail `run` with the dead loop's cause (the default).
 *
 * @category constructors
 */
export const stopGroup: Supervision = { _tag: "StopGroup" }

/**
 * Run a dead loop again when `schedule` says (e.g. `Schedule.exponential("1 second")` capped with
 * `Schedule.union(Schedule.spaced("1 minute"))` and bounded with `Schedule.recurs(10)`); once the
 * schedule is done, stop the group as `stopGroup` does. The schedule counts a loop's deaths over the
 * group's whole run: to forgive deaths after a healthy hour, add `Schedule.resetAfter("1 hour")`. A loop
 * that fails to start (bad run options) is not restarted.
 *
 * @category constructors
 */
export const restart = (schedule: Schedule.Schedule<unknown, Cause.Cause<unknown>>): Supervision => ({
  _tag: "Restart",
  schedule
})

/**
 * Restarts of dead loops, by loop name.
 *
 * @category metrics
 */
export const loopRestarts = counter("leasehold_loop_restarts_total", "Dead worker loops restarted by their group")

/**
 * Several loops run and stopped as one.
 *
 * @category models
 */
export interface LoopGroup {
  readonly loops: ReadonlyArray<MailboxWorker.Runnable>
  /**
   * Runs every loop until all have stopped. Interrupting it shuts the loops down gracefully first; a loop's
   * death stops the group (or restarts the loop) as `supervision` says, and fails `run` with its cause.
   */
  readonly run: (
    options?: MailboxWorker.RunOptions
  ) => Effect.Effect<void, InvalidParameterError | AlreadyRunningError | ParseResult.ParseError>
  /** Asks every loop to stop within `timeout` (default: the group's); true when all stopped cleanly. */
  readonly shutdown: (options?: { readonly timeout?: Duration.DurationInput }) => Effect.Effect<boolean>
}

/**
 * Options of a group.
 *
 * @category models
 */
export interface Options {
  /** How long each loop may take to finish its in-flight message when the group stops (default 30 s; 0..12 h). */
  readonly shutdownTimeout?: Duration.DurationInput | undefined
  /** Watch the loops' heartbeats (see `Watchdog.make`). */
  readonly watchdog?: Watchdog.Options | undefined
  /** What to do when a loop dies (default `stopGroup`). */
  readonly supervision?: Supervision | undefined
}

/** One `run` of a group: whether it is stopping, and its loops' fibers as they are forked. */
interface GroupRun {
  stopping: boolean
  readonly fibers: Array<Fiber.RuntimeFiber<void, InvalidParameterError | AlreadyRunningError>>
}

const isSupervision = (input: unknown): input is Supervision =>
  Predicate.isRecord(input) &&
  (input._tag === "StopGroup" || input._tag === "Restart" && Schedule.isSchedule(input.schedule))

const decodeOptions = Options_.decoder("LoopGroup.make", {
  shutdownTimeout: Schema.optionalWith(Options_.ShutdownTimeout, { exact: true }),
  supervision: Schema.optionalWith(
    Options_.worded(
      Schema.declare(isSupervision),
      () => "must be LoopGroup.stopGroup or LoopGroup.restart(schedule)"
    ),
    { exact: true }
  )
})

/**
 * Makes a group. Its options are checked when `run` starts (a `ParseError` naming a bad one fails `run`
 * before any loop starts), so a group is a plain value to build.
 *
 * @category constructors
 */
export const make = (loops: ReadonlyArray<MailboxWorker.Runnable>, options?: Options): LoopGroup => {
  const defaultTimeout = options?.shutdownTimeout ?? Duration.seconds(30)
  const supervision = options?.supervision ?? stopGroup
  let active: GroupRun | undefined

  /** Interrupts fibers and waits for them, at most `interruptGrace` (a stuck settle must not hold the stop). */
  const interruptWithin = (fibers: ReadonlyArray<Fiber.RuntimeFiber<unknown, unknown>>) =>
    Effect.flatMap(
      Effect.timeoutOption(Effect.interruptible(Fiber.interruptAll(fibers)), MailboxWorker.interruptGrace),
      (ended) =>
        Option.isSome(ended)
          ? Effect.void
          : Effect.logError(
            `Some loops did not end within ${Duration.format(MailboxWorker.interruptGrace)} of their interruption; ` +
              "giving up on them"
          )
    )

  const shutdown: LoopGroup["shutdown"] = (shutdownOptions) =>
    Effect.gen(function*() {
      // The run being stopped, taken now: a later run is not this shutdown's to stop.
      const current = active
      if (current !== undefined) current.stopping = true
      const health = yield* Readiness.current
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
      // Every loop has stopped. What is left of the run's fibers: a loop waiting for its restart, or one that
      // was starting while the loops were asked (it had nothing to stop yet): they end now.
      if (current !== undefined) yield* interruptWithin(current.fibers)
      return results.every((clean) => clean)
    }).pipe(Effect.annotateLogs({ module: "LoopGroup" }))

  /** Stops the group and says truthfully how it went. */
  const stopAll = (why: string) =>
    Effect.flatMap(shutdown(), (clean) =>
      clean
        ? Effect.logInfo(`${why}: all loops stopped cleanly`)
        : Effect.logWarning(`${why}: some loops had to be interrupted; their messages were given back`))

  /** Runs one loop under the group's supervision policy. */
  const supervised = (
    loop: MailboxWorker.Runnable,
    runOptions: MailboxWorker.RunOptions | undefined,
    current: GroupRun
  ) => {
    const once = Effect.suspend(() => current.stopping ? Effect.void : loop.run(runOptions))
    if (supervision._tag === "StopGroup") return once
    let restarts = 0
    const schedule = supervision.schedule.pipe(
      Schedule.onDecision((_, decision) =>
        decision._tag === "Done"
          ? Effect.logError(`Loop "${loop.name}" died and its restart schedule is exhausted`)
          : Effect.flatMap(Clock.currentTimeMillis, (now) => {
            restarts++
            const delay = Duration.millis(Math.max(0, ScheduleIntervals.start(decision.intervals) - now))
            return Effect.zipRight(
              Metric.increment(Metric.tagged(loopRestarts, "loop", loop.name)),
              Effect.logWarning(`Loop "${loop.name}" died; restart ${restarts} in ${Duration.format(delay)}`)
            )
          })
      )
    )
    return once.pipe(
      Effect.sandbox,
      Effect.retry({
        schedule,
        // A death (a defect) is worth a restart; bad options or an interruption are not.
        while: (cause) =>
          !current.stopping && !Cause.isInterruptedOnly(cause) && Option.isNone(Cause.failureOption(cause))
      }),
      Effect.unsandbox
    )
  }

  const run: LoopGroup["run"] = (runOptions) =>
    Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        yield* decodeOptions(options)
        if (active !== undefined) {
          return yield* new AlreadyRunningError({
            name: `The group of ${loops.map((loop) => `"${loop.name}"`).join(", ")}`
          })
        }
        const current: GroupRun = { stopping: false, fibers: [] }
        active = current
        yield* Effect.addFinalizer(() =>
          Effect.sync(() => {
            if (active === current) active = undefined
          })
        )
        // Loops run on daemon fibers that this scope ends (bounded, unlike a scope's own wait for its forks).
        yield* Effect.addFinalizer(() => interruptWithin(current.fibers))
        const coordinator = yield* Effect.serviceOption(ShutdownCoordinator)
        const health = yield* Readiness.current
        const stop = Effect.asVoid(shutdown())
        if (Option.isSome(coordinator)) {
          // A shutdown triggered already runs `stop` at once: then no loop starts (see `supervised`).
          yield* Effect.acquireRelease(coordinator.value.register(stop), () => coordinator.value.unregister(stop))
        }
        if (Option.isSome(health)) yield* Effect.forEach(loops, health.value.register, { discard: true })
        if (options?.watchdog !== undefined) {
          const watchdog = yield* Watchdog.make(options.watchdog)
          yield* Effect.forEach(loops, (loop) => watchdog.register(loop.name, loop.heartbeat), { discard: true })
          yield* watchdog.start
        }
        // The first loop to die, and a signal that one did.
        let died:
          | { readonly loop: string; readonly cause: Cause.Cause<InvalidParameterError | AlreadyRunningError> }
          | undefined
        const someoneDied = yield* Deferred.make<void>()
        for (const loop of loops) {
          const fiber = yield* supervised(loop, runOptions, current).pipe(
            Effect.onError((cause) =>
              Effect.suspend(() => {
                if (Cause.isInterruptedOnly(cause) || died !== undefined) return Effect.void
                died = { loop: loop.name, cause }
                return Deferred.succeed(someoneDied, undefined)
              })
            ),
            Effect.interruptible,
            // In the run's scope: a loop still running when the run ends (it was interrupted) is stopped with it.
            Effect.forkScoped
          )
          current.fibers.push(fiber)
        }
        // Interrupting `run` (SIGTERM under runMain) is a graceful stop: the loops finish or give back their work.
        yield* restore(Effect.raceFirst(Fiber.awaitAll(current.fibers), Deferred.await(someoneDied))).pipe(
          Effect.onInterrupt(() => stopAll("Group interrupted"))
        )
        if (died !== undefined) {
          const { cause, loop } = died
          yield* stopAll(`Loop "${loop}" died`)
          return yield* Effect.failCause(cause)
        }
      }).pipe(Effect.scoped)
    ).pipe(Effect.annotateLogs({ module: "LoopGroup" }))

  return { loops, run, shutdown }
}
