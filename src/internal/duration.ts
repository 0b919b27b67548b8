/**
 * Strict parsing of user-supplied durations.
 *
 * `Duration.decode` throws on malformed input and silently turns a negative
 * number, and a NaN, into zero; a timeout of "-5 seconds" or `[NaN, 0]` must
 * be an error instead, so every public option that takes a `DurationInput`
 * goes through `parse`.
 */
import * as Duration from "effect/Duration"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"

const DURATION_STRING = /^\d+(?:\.\d+)?\s+(nanos?|micros?|millis?|seconds?|minutes?|hours?|days?|weeks?)$/

/** Longer than any duration written by hand: a longer string is refused before a regex or `BigInt` reads it. */
const MAX_STRING_LENGTH = 64

const NOT_A_DURATION = "is not a duration (expected milliseconds, a Duration, or a string like \"30 seconds\")"
const TOO_LARGE = "is too large"

/**
 * A `Duration` checked, not trusted: `isDuration` only looks for the type id, so an object that carries it with
 * a NaN or negative value (made by hand, or by another copy of effect) would pass as a duration.
 */
const fromDuration = (input: Duration.Duration): Either.Either<Duration.Duration, string> => {
  const value: unknown = input.value
  if (!Predicate.isRecord(value)) return Either.left(NOT_A_DURATION)
  switch (value._tag) {
    case "Infinity":
      return Either.right(input)
    case "Millis": {
      const millis = value.millis
      if (!Predicate.isNumber(millis) || Number.isNaN(millis)) return Either.left("is not a number")
      if (millis < 0) return Either.left("must not be negative")
      return Number.isFinite(millis) ? Either.right(input) : Either.left(NOT_A_DURATION)
    }
    case "Nanos": {
      const nanos = value.nanos
      if (!Predicate.isBigInt(nanos)) return Either.left(NOT_A_DURATION)
      return nanos < BigInt(0) ? Either.left("must not be negative") : finite(input)
    }
    default:
      return Either.left(NOT_A_DURATION)
  }
}

/** A duration not given as infinite must come out finite, in milliseconds too (what the clock and timers use). */
const finite = (duration: Duration.Duration): Either.Either<Duration.Duration, string> =>
  Duration.isFinite(duration) && Number.isFinite(Duration.toMillis(duration))
    ? Either.right(duration)
    : Either.left(TOO_LARGE)

const isWhole = (n: number, below: number) => Number.isInteger(n) && n >= 0 && n < below

/**
 * Decodes a `DurationInput`, failing with a description of what is wrong: negative, NaN (in any form: a number,
 * either half of a `[seconds, nanos]` tuple, a forged `Duration`), malformed, or so large it overflows. Only an
 * input that says so (`Infinity`, `Duration.infinity`) decodes to an infinite duration; an option that cannot be
 * infinite says so with its maximum (see `options.ts`).
 */
export const parse = (input: unknown): Either.Either<Duration.Duration, string> => {
  if (Duration.isDuration(input)) return fromDuration(input)
  if (Predicate.isNumber(input)) {
    if (Number.isNaN(input)) return Either.left("is not a number")
    if (input < 0) return Either.left("must not be negative")
    return Either.right(Duration.millis(input))
  }
  if (Predicate.isBigInt(input)) {
    return input < BigInt(0) ? Either.left("must not be negative") : finite(Duration.nanos(input))
  }
  if (Predicate.isString(input)) {
    if (input.length > MAX_STRING_LENGTH) return Either.left(NOT_A_DURATION)
    const trimmed = input.trim()
    if (trimmed.startsWith("-")) return Either.left("must not be negative")
    if (!DURATION_STRING.test(trimmed)) return Either.left(NOT_A_DURATION)
    return Option.match(Duration.decodeUnknown(trimmed), { onNone: () => Either.left(NOT_A_DURATION), onSome: finite })
  }
  if (Array.isArray(input) && input.length === 2 && input.every(Predicate.isNumber)) {
    // `[seconds, nanos]` as `process.hrtime` gives it. Effect reads a NaN in either half as zero, rounds a
    // fractional nanosecond and reads an infinite half as infinity: all refused here.
    const [seconds, nanos] = input as [number, number]
    if (Number.isNaN(seconds) || Number.isNaN(nanos)) return Either.left("is not a number")
    if (seconds < 0 || nanos < 0) return Either.left("must not be negative")
    if (!isWhole(seconds, Number.MAX_SAFE_INTEGER) || !isWhole(nanos, 1_000_000_000)) {
      return Either.left("must be [seconds, nanoseconds]: whole numbers, nanoseconds below 1000000000")
    }
    return Either.fromOption(Duration.decodeUnknown([seconds, nanos] as const), () => NOT_A_DURATION)
  }
  return Either.left(NOT_A_DURATION)
}

/** Schema from any `DurationInput` to a `Duration`, rejecting negative and malformed input. */
export const DurationFromInput: Schema.Schema<Duration.Duration, Duration.DurationInput> = Schema.transformOrFail(
  Schema.Unknown.annotations({ title: "DurationInput" }),
  Schema.DurationFromSelf,
  {
    strict: true,
    decode: (input, _, ast) =>
      Either.match(parse(input), {
        onLeft: (reason) => ParseResult.fail(new ParseResult.Type(ast, input, `duration ${reason}`)),
        onRight: ParseResult.succeed
      }),
    encode: ParseResult.succeed
  }
).annotations({
  // One line under the option's name ("must not be negative"), not Schema's account of the transformation.
  message: (issue) => ({
    message: Either.match(parse(issue.actual), { onLeft: (reason) => reason, onRight: () => "is not a duration" }),
    override: true
  })
}) as unknown as Schema.Schema<Duration.Duration, Duration.DurationInput>
