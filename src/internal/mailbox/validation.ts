/**
 * What every mailbox backend checks the same way: the options of `send`,
 * `receive`, `nack` and `extendVisibility` (SQS's limits, refused with the
 * same `InvalidParameterError`), and the options of `make` — a queue's name
 * and `maxSize`, decoded by the same Schemas (a `ParseError`) — whatever
 * stores the messages.
 */
import * as Duration from "effect/Duration"
import * as Either from "effect/Either"
import type * as Schema from "effect/Schema"
import { InvalidParameterError } from "../../Errors.js"
import type { ReceiveOptions } from "../../Mailbox.js"
import * as Durations from "../duration.js"
import * as Names from "../names.js"
import * as Options from "../options.js"

/** Limits every backend enforces (SQS's). */
export const limits = {
  maxDelay: Duration.minutes(15),
  maxVisibilityTimeout: Duration.hours(12),
  maxWaitTime: Duration.seconds(20),
  maxMessages: 10,
  defaultVisibilityTimeout: Duration.seconds(30)
} as const

/** Decodes a duration option and checks it lies in `0..max`. */
export const validateDuration = (
  parameter: string,
  input: Duration.DurationInput | undefined,
  fallback: Duration.Duration,
  max: Duration.Duration
): Either.Either<Duration.Duration, InvalidParameterError> => {
  if (input === undefined) return Either.right(fallback)
  const parsed = Durations.parse(input)
  if (Either.isLeft(parsed)) {
    return Either.left(new InvalidParameterError({ parameter, value: input, reason: parsed.left }))
  }
  if (Duration.greaterThan(parsed.right, max)) {
    return Either.left(
      new InvalidParameterError({ parameter, value: input, reason: `must be between 0 and ${Duration.format(max)}` })
    )
  }
  // Whole milliseconds, rounded up: what every store keeps (PostgreSQL's BIGINT refused "1.5").
  const millis = Duration.toMillis(parsed.right)
  return Either.right(Number.isInteger(millis) ? parsed.right : Duration.millis(Math.ceil(millis)))
}

/** `receive` options after validation. */
export interface ValidReceiveOptions {
  readonly maxMessages: number
  readonly visibilityTimeout: Duration.Duration
  readonly waitTime: Duration.Duration
}

const defaultReceive: Either.Either<ValidReceiveOptions, InvalidParameterError> = Either.right({
  maxMessages: 1,
  visibilityTimeout: limits.defaultVisibilityTimeout,
  waitTime: Duration.zero
})

/** Validates `receive` options: durations out of range fail, `maxMessages` is clamped to 1..10. */
export const validateReceiveOptions = (
  options: ReceiveOptions | undefined
): Either.Either<ValidReceiveOptions, InvalidParameterError> => {
  if (options === undefined) return defaultReceive
  const requested = options.maxMessages ?? 1
  if (typeof requested !== "number" || Number.isNaN(requested)) {
    return Either.left(
      new InvalidParameterError({ parameter: "maxMessages", value: requested, reason: "must be a number" })
    )
  }
  const maxMessages = Math.min(limits.maxMessages, Math.max(1, Math.floor(requested)))
  return Either.flatMap(
    validateDuration(
      "visibilityTimeout",
      options.visibilityTimeout,
      limits.defaultVisibilityTimeout,
      limits.maxVisibilityTimeout
    ),
    (visibilityTimeout) =>
      Either.map(
        validateDuration("waitTime", options.waitTime, Duration.zero, limits.maxWaitTime),
        (waitTime) => ({ maxMessages, visibilityTimeout, waitTime })
      )
  )
}

/** Validates the `delay` of `send` (0..15 min). */
export const validateDelay = (
  delay: Duration.DurationInput | undefined
): Either.Either<Duration.Duration, InvalidParameterError> =>
  validateDuration("delay", delay, Duration.zero, limits.maxDelay)

/** Validates the timeout of `nack` / `extendVisibility` (0..12 h). */
export const validateVisibility = (
  parameter: string,
  timeout: Duration.DurationInput | undefined
): Either.Either<Duration.Duration, InvalidParameterError> =>
  validateDuration(parameter, timeout, Duration.zero, limits.maxVisibilityTimeout)

/** The longest queue name (the name rule's: `internal/names.ts`). */
export const maxQueueNameLength = Names.maxNameLength

/** Why `name` cannot name a queue, or `undefined`: the name rule every backend applies alike. */
export const queueNameProblem = Names.nameProblem

/** Validates the `replyTo` of `send` by the name rule, before the message is stored or joins a batch. */
export const validateReplyTo = (
  replyTo: string | undefined
): Either.Either<string | undefined, InvalidParameterError> => {
  if (replyTo === undefined) return Either.right(undefined)
  const problem = Names.nameProblem(replyTo)
  return problem === undefined
    ? Either.right(replyTo)
    : Either.left(new InvalidParameterError({ parameter: "replyTo", value: replyTo, reason: problem }))
}

/** A queue's name, by `queueNameProblem`'s rule: the option every backend's `make` decodes alike. */
export const QueueName: Schema.Schema<string> = Options.ruledString(queueNameProblem)

/** `maxSize`, the bound on unacknowledged messages every backend's `make` takes. */
export const MaxSize: Schema.Schema<number> = Options.PositiveInt
