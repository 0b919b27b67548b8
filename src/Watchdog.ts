/**
 * Watchdog: notices a worker loop that stopped beating and acts on it.
 *
 * Each registered loop has a `Heartbeat`. On every tick of its `Schedule` the
 * watchdog reads how long ago each one beat; one older than `threshold` is a
 * stall: it is logged at error level with the loop's name, then the
 * configured action runs once for that stall. The default action exits the
 * process: a fiber that is stuck cannot be trusted to honour a graceful stop,
 * and its messages come back by themselves once their leases run out. A beat
 * clears the stall, so a later stall acts again.
 *
 * Ages are measured on the monotonic clock (see `Heartbeat`): a wall-clock
 * step forward is not a stall. Each check also sets the loops'
 * `leasehold_heartbeat_age_seconds` gauge.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import type * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Heartbeat from "./Heartbeat.js"
import { recordAge } from "./internal/heartbeat.js"
import { counter } from "./internal/metrics.js"
import * as Options_ from "./internal/options.js"

/**
 * A threshold or interval: zero would make every loop stalled, or checks without a pause; an infinite or very long
 * one would never see a stall (a timer longer than ~24.8 days never fires at all).
 */
const Liveness = Options_.duration({
  positive: true,
  max: Duration.hours(24),
  range: "must be greater than zero and at most 24 hours"
})

/**
 * When a heartbeat counts as stalled, and how often to look.
 *
 * @category models
 */
export class WatchdogConfig extends Schema.Class<WatchdogConfig>("leasehold/WatchdogConfig")({
  /** A heartbeat older than this is a stall (default 720 s; more than zero, at most 24 h). */
  threshold: Schema.optionalWith(Liveness, { default: () => Duration.seconds(720) }),
  /** Time between checks when no schedule is given (default 60 s; more than zero, at most 24 h). */
  interval: Schema.optionalWith(Liveness, { default: () => Duration.seconds(60) })
}) {}

/**
 * A loop whose heartbeat is older than the threshold.
 *
 * @category models
 */
export interface Stall {
  readonly name: string
  readonly elapsed: Duration.Duration
}

/**
 * What to do about stalls.
 *
 * @category models
 */
export type StallAction = (stalls: ReadonlyArray<Stall>) => Effect.Effect<void>

/**
 * Exits the process with code 1 — the default action.
 *
 * @category utils
 */
export const exitProcess: StallAction = () => Effect.sync(() => process.exit(1))

/**
 * Watches named heartbeats.
 *
 * @category models
 */
export interface Watchdog {
  readonly config: WatchdogConfig
  /** Watches `heartbeat` under `name` until the scope closes. */
  readonly register: (name: string, heartbeat: Heartbeat.Heartbeat) => Effect.Effect<void, never, Scope.Scope>
  /** Checks every heartbeat once: logs and acts on new stalls, returns every current stall. */
  readonly check: Effect.Effect<ReadonlyArray<Stall>>
  /** Starts the periodic check in the scope; a second call while running does nothing. */
  readonly start: Effect.Effect<void, never, Scope.Scope>
  /** Names of the loops currently stalled. */
  readonly stalled: Effect.Effect<ReadonlyArray<string>>
}

/**
 * Stalls detected.
 *
 * @category metrics
 */
export const stallsDetected = counter("leasehold_watchdog_stalls_total", "Heartbeat stalls detected by the watchdog")

/**
 * Options of `make`: `WatchdogConfig`'s fields as callers write them, a schedule and a stall action.
 *
 * @category models
 */
export interface Options {
  /** A heartbeat older than this is a stall (default 720 s). */
  readonly threshold?: Duration.DurationInput | undefined
  /** Time between checks when no schedule is given (default 60 s). */
  readonly interval?: Duration.DurationInput | undefined
  /** When to check; defaults to `Schedule.spaced(interval)`. */
  readonly schedule?: Schedule.Schedule<unknown> | undefined
  /** What to do about new stalls; defaults to `exitProcess`. */
  readonly onStall?: StallAction | undefined
}

/** `Options` as decoded: the config's fields, and a schedule and an action that are what they say. */
const optionFields = {
  ...WatchdogConfig.fields,
  schedule: Schema.optionalWith(Options_.ScheduleValue, { exact: true }),
  onStall: Schema.optionalWith(Options_.Callback, { exact: true })
}

const decodeOptions = Options_.decoder("Watchdog.make", optionFields)

/**
 * Makes a watchdog; config that cannot work (a threshold or interval of zero, infinite or beyond 24 h, NaN in any
 * form, a schedule that is not a `Schedule`) fails with a `ParseError` naming it.
 *
 * @category constructors
 */
export const make = (options?: Options): Effect.Effect<Watchdog, ParseResult.ParseError> =>
  Effect.map(
    decodeOptions(options),
    ({ interval, threshold }): Watchdog => {
      const config = new WatchdogConfig({ interval, threshold }, true)
      const thresholdMillis = Duration.toMillis(config.threshold)
      const onStall = options?.onStall ?? exitProcess
      const schedule = options?.schedule ?? Schedule.spaced(config.interval)
      const watched = new Map<string, Heartbeat.Heartbeat>()
      const stalled = new Set<string>()
      let started = false

      const register = (name: string, heartbeat: Heartbeat.Heartbeat) =>
        Effect.acquireRelease(
          Effect.sync(() => {
            watched.set(name, heartbeat)
          }),
          () =>
            Effect.sync(() => {
              if (watched.get(name) === heartbeat) watched.delete(name)
              stalled.delete(name)
            })
        )

      const check = Effect.gen(function*() {
        const stalls: Array<Stall> = []
        const fresh: Array<Stall> = []
        for (const [name, heartbeat] of watched) {
          const elapsed = yield* heartbeat.elapsed
          yield* recordAge(name, heartbeat)
          if (Duration.toMillis(elapsed) > thresholdMillis) {
            const stall = { name, elapsed }
            stalls.push(stall)
            if (!stalled.has(name)) fresh.push(stall)
          } else {
            stalled.delete(name)
          }
        }
        if (fresh.length > 0) {
          for (const stall of fresh) {
            stalled.add(stall.name)
            yield* Effect.logError(
              `Loop "${stall.name}" has not beaten for ${Duration.format(stall.elapsed)} ` +
                `(threshold ${Duration.format(config.threshold)}): it is stuck`
            ).pipe(Effect.annotateLogs({ loop: stall.name }))
          }
          yield* Metric.incrementBy(stallsDetected, fresh.length)
          yield* onStall(fresh)
        }
        return stalls
      }).pipe(Effect.annotateLogs({ module: "Watchdog" }))

      const start = Effect.suspend(() => {
        if (started) return Effect.void
        started = true
        return check.pipe(
          Effect.catchAllCause((cause) => Effect.logError("Watchdog check failed", cause)),
          Effect.repeat(schedule),
          Effect.ensuring(Effect.sync(() => {
            started = false
          })),
          Effect.interruptible,
          Effect.forkScoped,
          Effect.asVoid
        )
      })

      return {
        config,
        register,
        check,
        start,
        stalled: Effect.sync(() => [...stalled])
      }
    }
  )
