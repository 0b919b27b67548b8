/**
 * Deadlines: a wall-clock cut-off for a whole unit of work (an evaluation, a
 * tool call, a subagent), validated when it is made and enforced with Effect
 * timeouts.
 *
 * The seed spec could only check a deadline at checkpoints. Effect can preempt:
 * `within` interrupts the work the instant the deadline passes and waits for
 * its finalizers. The active deadline lives in a `FiberRef`, so nested work
 * (tools, subagents) inherits it and a nested `within` can only tighten it.
 * All time is read from `Clock`, so `TestClock` drives every deadline in tests.
 */
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as FiberRef from "effect/FiberRef"
import { dual } from "effect/Function"
import * as Option from "effect/Option"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import * as Durations from "./internal/duration.js"

/**
 * A validated point in time after which work must stop.
 *
 * @category models
 */
export class Deadline extends Schema.Class<Deadline>("leasehold/Deadline")({
  expiresAt: Schema.DateTimeUtc
}) {
  /** The deadline as ISO-8601, the form put in provider payloads and logs. */
  get iso(): string {
    return DateTime.formatIso(this.expiresAt)
  }
}

/**
 * Why a deadline was refused: a string without time zone, unparseable input, a time in the past, or less than 1 s ahead.
 *
 * @category schemas
 */
export const InvalidDeadlineReason = Schema.Literal("naive", "invalid", "past", "too-soon")

/**
 * Why a deadline was refused.
 *
 * @category models
 */
export type InvalidDeadlineReason = typeof InvalidDeadlineReason.Type

/**
 * The input to `make` or `after` cannot be a deadline; `reason` says why and `input` holds what was given.
 *
 * @category errors
 */
export class InvalidDeadlineError extends Schema.TaggedError<InvalidDeadlineError>()("InvalidDeadlineError", {
  reason: InvalidDeadlineReason,
  input: Schema.Unknown
}) {
  override get message(): string {
    const shown = DateTime.isDateTime(this.input)
      ? DateTime.formatIso(DateTime.toUtc(this.input))
      : this.input instanceof Date
      ? (Number.isNaN(this.input.getTime()) ? "Invalid Date" : this.input.toISOString())
      : JSON.stringify(this.input) ?? String(this.input)
    switch (this.reason) {
      case "naive":
        return `Invalid deadline ${shown}: an ISO-8601 date-time needs a time zone (Z or ±HH:MM)`
      case "invalid":
        return `Invalid deadline ${shown}: expected an ISO-8601 date-time with time zone, a Date or a DateTime`
      case "past":
        return `Invalid deadline ${shown}: it is already in the past`
      case "too-soon":
        return `Invalid deadline ${shown}: it must be at least 1 second in the future`
    }
  }
}

/**
 * The deadline passed before the work finished.
 *
 * @category errors
 */
export class DeadlineExceededError extends Schema.TaggedError<DeadlineExceededError>()("DeadlineExceededError", {
  expiresAt: Schema.DateTimeUtc
}) {
  override get message(): string {
    return `Deadline exceeded at ${DateTime.formatIso(this.expiresAt)}`
  }
}

/**
 * The minimum distance between now and a new deadline.
 *
 * @category constants
 */
export const minimumLead: Duration.Duration = Duration.seconds(1)

// Date and time, optional seconds and fraction, optional zone. Date-only strings are "invalid", not "naive".
const ISO_DATE_TIME = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?<zone>[Zz]|[+-]\d{2}(?::?\d{2})?)?$/

const toUtc = (input: unknown): Either.Either<DateTime.Utc, InvalidDeadlineReason> => {
  if (DateTime.isDateTime(input)) return Either.right(DateTime.toUtc(input))
  if (input instanceof Date) {
    return Either.fromOption(DateTime.make(input), () => "invalid" as const)
  }
  if (Predicate.isString(input)) {
    const match = ISO_DATE_TIME.exec(input.trim())
    if (match === null) return Either.left("invalid")
    if (match.groups?.zone === undefined) return Either.left("naive")
    return Either.fromOption(DateTime.make(input.trim()), () => "invalid" as const)
  }
  return Either.left("invalid")
}

const validateAgainstNow = (expiresAt: DateTime.Utc, input: unknown, now: number) => {
  const at = DateTime.toEpochMillis(expiresAt)
  if (at < now) return Effect.fail(new InvalidDeadlineError({ reason: "past", input }))
  if (at < now + Duration.toMillis(minimumLead)) {
    return Effect.fail(new InvalidDeadlineError({ reason: "too-soon", input }))
  }
  return Effect.succeed(new Deadline({ expiresAt }, true))
}

/**
 * Makes a deadline from a `DateTime`, a `Date` or an ISO-8601 string with a
 * time zone. It must lie at least one second after `Clock`'s now.
 *
 * @category constructors
 */
export const make = (input: DateTime.DateTime | Date | string): Effect.Effect<Deadline, InvalidDeadlineError> =>
  Either.match(toUtc(input), {
    onLeft: (reason) => Effect.fail(new InvalidDeadlineError({ reason, input })),
    onRight: (expiresAt) => Effect.flatMap(Clock.currentTimeMillis, (now) => validateAgainstNow(expiresAt, input, now))
  })

/**
 * Makes a deadline `duration` from now (at least one second), checked against the same clock reading.
 *
 * @category constructors
 */
export const after = (duration: Duration.DurationInput): Effect.Effect<Deadline, InvalidDeadlineError> =>
  Either.match(Durations.parse(duration), {
    onLeft: () => Effect.fail(new InvalidDeadlineError({ reason: "invalid", input: duration })),
    onRight: (d) =>
      Effect.flatMap(
        Clock.currentTimeMillis,
        (now) =>
          // Past what a date can hold (an infinite or astronomical duration): no deadline, not a defect.
          Option.match(DateTime.make(now + Duration.toMillis(d)), {
            onNone: () => Effect.fail(new InvalidDeadlineError({ reason: "invalid", input: duration })),
            onSome: (expiresAt) => validateAgainstNow(DateTime.toUtc(expiresAt), duration, now)
          })
      )
  })

/**
 * Time left before the deadline; zero once it has passed.
 *
 * @category getters
 */
export const remaining = (deadline: Deadline): Effect.Effect<Duration.Duration> =>
  Effect.map(
    Clock.currentTimeMillis,
    (now) => Duration.millis(Math.max(0, DateTime.toEpochMillis(deadline.expiresAt) - now))
  )

/**
 * True once `now ≥ expiresAt`.
 *
 * @category getters
 */
export const isExpired = (deadline: Deadline): Effect.Effect<boolean> =>
  Effect.map(Clock.currentTimeMillis, (now) => now >= DateTime.toEpochMillis(deadline.expiresAt))

/**
 * The sooner of two optional deadlines (`a` on a tie, the present one when the other is missing).
 *
 * @category utils
 */
export const earliest = (a?: Deadline | undefined, b?: Deadline | undefined): Deadline | undefined => {
  if (a === undefined) return b
  if (b === undefined) return a
  return DateTime.toEpochMillis(b.expiresAt) < DateTime.toEpochMillis(a.expiresAt) ? b : a
}

const currentRef: FiberRef.FiberRef<Option.Option<Deadline>> = FiberRef.unsafeMake(Option.none())

/**
 * The deadline the current fiber runs under, if any (set by `within`).
 *
 * @category getters
 */
export const current: Effect.Effect<Option.Option<Deadline>> = FiberRef.get(currentRef)

const exceeded = (deadline: Deadline) => new DeadlineExceededError({ expiresAt: deadline.expiresAt })

/**
 * Fails with `DeadlineExceededError` if the current deadline has passed; succeeds when there is none.
 *
 * @category combinators
 */
export const checkpoint: Effect.Effect<void, DeadlineExceededError> = Effect.flatMap(
  current,
  Option.match({
    onNone: () => Effect.void,
    onSome: (deadline) =>
      Effect.flatMap(isExpired(deadline), (expired) => expired ? Effect.fail(exceeded(deadline)) : Effect.void)
  })
)

/**
 * Runs `self` under the tighter of the current deadline and `deadline`, which
 * nested work inherits through `current`. When the deadline passes, `self` is
 * interrupted (its finalizers run) and the result is `DeadlineExceededError`.
 * An already-expired deadline fails without starting `self`.
 *
 * @category combinators
 */
export const within: {
  (deadline: Deadline): <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E | DeadlineExceededError, R>
  <A, E, R>(self: Effect.Effect<A, E, R>, deadline: Deadline): Effect.Effect<A, E | DeadlineExceededError, R>
} = dual(
  2,
  <A, E, R>(self: Effect.Effect<A, E, R>, deadline: Deadline): Effect.Effect<A, E | DeadlineExceededError, R> =>
    Effect.flatMap(current, (outer) => {
      const effective = earliest(deadline, Option.getOrUndefined(outer)) ?? deadline
      return Effect.flatMap(remaining(effective), (left) =>
        Duration.isZero(left)
          ? Effect.fail(exceeded(effective))
          : self.pipe(
            Effect.locally(currentRef, Option.some(effective)),
            Effect.timeoutFail({ duration: left, onTimeout: () => exceeded(effective) })
          ))
    })
)
