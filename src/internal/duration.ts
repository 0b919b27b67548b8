/**
 * Strict parsing of user-supplied durations.
 *
 * `Duration.decode` throws on malformed input and silently turns a negative
 * number into zero; a timeout of "-5 seconds" must be an error instead, so
 * every public option that takes a `DurationInput` goes through `parse`.
 */
import * as Duration from "effect/Duration"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"

const DURATION_STRING = /^\d+(?:\.\d+)?\s+(nanos?|micros?|millis?|seconds?|minutes?|hours?|days?|weeks?)$/

/** Decodes a `DurationInput`, failing with a description of what is wrong (negative, NaN, unknown unit...). */
export const parse = (input: unknown): Either.Either<Duration.Duration, string> => {
  if (Duration.isDuration(input)) return Either.right(input)
  if (Predicate.isNumber(input)) {
    if (Number.isNaN(input)) return Either.left("is not a number")
    if (input < 0) return Either.left("must not be negative")
    return Either.right(Duration.millis(input))
  }
  if (Predicate.isBigInt(input)) {
    return input < BigInt(0) ? Either.left("must not be negative") : Either.right(Duration.nanos(input))
  }
  if (Predicate.isString(input)) {
    const trimmed = input.trim()
    if (trimmed.startsWith("-")) return Either.left("must not be negative")
    if (!DURATION_STRING.test(trimmed)) {
      return Either.left("is not a duration (expected milliseconds, a Duration, or a string like \"30 seconds\")")
    }
    return Either.fromOption(Duration.decodeUnknown(trimmed), () => "is not a duration")
  }
  if (Array.isArray(input) && input.length === 2 && input.every(Predicate.isNumber)) {
    const [seconds, nanos] = input as [number, number]
    if (seconds < 0 || nanos < 0) return Either.left("must not be negative")
    return Either.fromOption(Duration.decodeUnknown([seconds, nanos] as const), () => "is not a duration")
  }
  return Either.left("is not a duration (expected milliseconds, a Duration, or a string like \"30 seconds\")")
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
