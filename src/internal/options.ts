/**
 * The one rule for bad configuration. What a constructor is given (`make`,
 * `layer…` options) is decoded by a Schema, so bad configuration is a
 * `ParseError` whose message names the constructor and the field and says in
 * one line what is allowed:
 *
 *     MailboxSql.make options
 *     └─ ["maxSize"]
 *        └─ must be a positive integer
 *
 * never a defect, and never `InvalidParameterError`, which is for the
 * arguments of an operation (`receive`, `nack`, `tryAcquire`…). The field
 * schemas here carry the rules that several constructors share, each failure
 * worded once (`problem`), whatever part of the check failed.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as AST from "effect/SchemaAST"
import * as Durations from "./duration.js"

const isPlainObject = (input: unknown): input is Record<string, unknown> => {
  if (typeof input !== "object" || input === null) return false
  const proto = Object.getPrototypeOf(input)
  return proto === Object.prototype || proto === null
}

/**
 * Properties given as `undefined` are left out, in nested plain objects too (a few levels: options are
 * shallow): an optional option set to `undefined` is not given (what `exactOptionalPropertyTypes` callers
 * write for "use the default").
 */
const given = (input: unknown, depth = 0): unknown => {
  if (depth > 3 || !isPlainObject(input)) return input
  let copy: Record<string, unknown> | undefined
  for (const [key, value] of Object.entries(input)) {
    const kept = given(value, depth + 1)
    if (kept !== value || value === undefined) {
      copy ??= { ...input }
      if (value === undefined) delete copy[key]
      else copy[key] = kept
    }
  }
  return copy ?? input
}

const toArray = (path: ParseResult.Path): Array<PropertyKey> =>
  Array.isArray(path) ? [...path as ReadonlyArray<PropertyKey>] : [path as PropertyKey]

/**
 * `issue` without what only restates that an optional option may be left out: the "Expected undefined"
 * branch of an optional field's union, which would stand beside the one line that says what is wrong.
 */
const simplify = (issue: ParseResult.ParseIssue): ParseResult.ParseIssue => {
  switch (issue._tag) {
    case "Pointer": {
      const inner = simplify(issue.issue)
      // One bad field of a nested struct: one path, `["config"]["timeout"]`.
      if (inner._tag === "Composite" && inner.ast._tag === "TypeLiteral") {
        const issues = inner.issues as ParseResult.ParseIssue | ReadonlyArray<ParseResult.ParseIssue>
        const only = Array.isArray(issues) ? (issues.length === 1 ? issues[0] : undefined) : issues
        if (only?._tag === "Pointer") {
          const path = [...toArray(issue.path), ...toArray(only.path)] as unknown as ParseResult.Path
          return new ParseResult.Pointer(path, issue.actual, only.issue)
        }
      }
      return new ParseResult.Pointer(issue.path, issue.actual, inner)
    }
    case "Transformation":
      return new ParseResult.Transformation(issue.ast, issue.actual, issue.kind, simplify(issue.issue))
    case "Refinement":
      return new ParseResult.Refinement(issue.ast, issue.actual, issue.kind, simplify(issue.issue))
    case "Composite": {
      const issues = (Array.isArray(issue.issues) ? issue.issues : [issue.issues]) as Array<ParseResult.ParseIssue>
      const kept = issues
        .filter((inner) =>
          !(issue.ast._tag === "Union" && inner._tag === "Type" && inner.ast._tag === "UndefinedKeyword")
        )
        .map(simplify)
      if (kept.length === 1 && issue.ast._tag === "Union") return kept[0]!
      return kept.length === 0
        ? issue
        : new ParseResult.Composite(
          issue.ast,
          issue.actual,
          kept as [ParseResult.ParseIssue, ...Array<ParseResult.ParseIssue>],
          issue.output
        )
    }
    default:
      return issue
  }
}

/**
 * The issue under the wrappers a struct with defaults adds (a transformation from its encoded side), re-rooted
 * under `title` and simplified: so the tree reads options, field, problem — and nothing about how Schema got
 * there.
 */
const reroot = (title: AST.AST, input: unknown, issue: ParseResult.ParseIssue): ParseResult.ParseIssue => {
  let inner = issue
  while (
    (inner._tag === "Transformation" && inner.kind === "Encoded") ||
    (inner._tag === "Refinement" && inner.kind === "From")
  ) inner = inner.issue
  if (inner._tag === "Composite") return simplify(new ParseResult.Composite(title, input, inner.issues))
  return inner._tag === "Pointer" || inner._tag === "Type" && inner.ast === title
    ? simplify(new ParseResult.Composite(title, input, inner))
    : simplify(issue)
}

/**
 * A rule across fields, checked once each field is valid: what is wrong, and the field it blames (none when
 * the options as a whole are wrong, such as no limit at all).
 */
export interface CrossCheck<A> {
  (options: A): { readonly field?: string | undefined; readonly message: string } | undefined
}

/**
 * A decoder of the options of `label` (e.g. `"MailboxSql.make"`): a struct of `fields` (others are ignored, so
 * the same options object can carry what is not configuration, a Schema or a callback) whose every bad field
 * is reported, then `check` across them. `undefined` and a missing object count as not given.
 */
export const decoder = <Fields extends Schema.Struct.Fields>(
  label: string,
  fields: Fields,
  check?: CrossCheck<Schema.Struct.Type<Fields>>
): (input: unknown) => Effect.Effect<Schema.Struct.Type<Fields>, ParseResult.ParseError> => {
  const title = Schema.Unknown.annotations({ identifier: `${label} options` }).ast
  // Option fields need no services (the field schemas here need none).
  const decode = ParseResult.decodeUnknown(
    Schema.Struct(fields) as unknown as Schema.Schema<Schema.Struct.Type<Fields>, unknown>,
    { errors: "all" }
  )
  return (raw) => {
    const input = given(raw ?? {})
    // Said in one line, not as the struct-with-defaults transformation Schema would describe.
    const decoded = Predicate.isRecord(input)
      ? decode(input)
      : Effect.fail(new ParseResult.Type(title, input, "must be an object"))
    return decoded.pipe(
      Effect.flatMap((options): Effect.Effect<Schema.Struct.Type<Fields>, ParseResult.ParseIssue> => {
        const problem = check?.(options)
        if (problem === undefined) return Effect.succeed(options)
        if (problem.field === undefined) return Effect.fail(new ParseResult.Type(title, input, problem.message))
        const value = (options as Record<string, unknown>)[problem.field]
        return Effect.fail(
          new ParseResult.Pointer(problem.field, input, new ParseResult.Type(title, value, problem.message))
        )
      }),
      Effect.mapError((issue) => new ParseResult.ParseError({ issue: reroot(title, input, issue) }))
    )
  }
}

/**
 * A decoder for the options of `label` into the config class `Class` (its fields, their defaults, its rules, and
 * `check` across them).
 */
export const classDecoder = <Self, Fields extends Schema.Struct.Fields>(
  label: string,
  Class: { readonly fields: Fields; new(props: Schema.Struct.Type<Fields>, options?: boolean): Self },
  check?: CrossCheck<Schema.Struct.Type<Fields>>
): (input: unknown) => Effect.Effect<Self, ParseResult.ParseError> => {
  const decode = decoder(label, Class.fields, check)
  return (input) => Effect.map(decode(input), (props) => new Class(props, true))
}

/** `schema`, every failure of which reads as one line: `problem(input)`. */
export const worded = <A, I, R>(
  schema: Schema.Schema<A, I, R>,
  problem: (input: unknown) => string
): Schema.Schema<A, I, R> =>
  schema.annotations({ message: (issue) => ({ message: problem(issue.actual), override: true }) })

/** A positive integer (a size, a count). */
export const PositiveInt: Schema.Schema<number> = worded(
  Schema.Int.pipe(Schema.positive()),
  () => "must be a positive integer"
)

/** A non-negative integer (a number of retries). */
export const NonNegativeInt: Schema.Schema<number> = worded(
  Schema.Int.pipe(Schema.nonNegative()),
  () => "must be a non-negative integer"
)

/** An integer in `min..max`. */
export const intBetween = (min: number, max: number, problem = `must be an integer in ${min}..${max}`) =>
  worded(Schema.Int.pipe(Schema.between(min, max)), () => problem)

/** A non-negative integer that a database's 32-bit integer column holds (a number of retries). */
export const NonNegativeInt32: Schema.Schema<number> = intBetween(
  0,
  2_147_483_647,
  "must be a non-negative integer, at most 2147483647"
)

/** A non-empty string. */
export const NonEmptyString: Schema.Schema<string> = worded(Schema.NonEmptyString, () => "must be a non-empty string")

/** A string that breaks no rule of `problem` (which says what is wrong with it, or `undefined`). */
export const ruledString = (problem: (input: unknown) => string | undefined): Schema.Schema<string> =>
  worded(Schema.String.pipe(Schema.filter((value) => problem(value) === undefined)), (input) => problem(input) ?? "")

/**
 * A `DurationInput` decoded strictly (see `duration.ts`), then held to a range: at least `min` (and, with
 * `positive`, more than zero) and at most `max`; `range` words the limits when the default wording does not fit.
 * Without a `max` the duration must still be finite: only `max: Duration.infinity` lets `Infinity` through, for
 * an option where "for ever" means something.
 */
export const duration = (options?: {
  readonly min?: Duration.Duration | undefined
  readonly max?: Duration.Duration | undefined
  readonly positive?: boolean | undefined
  readonly range?: string | undefined
}): Schema.Schema<Duration.Duration, Duration.DurationInput> => {
  const min = options?.min
  const max = options?.max
  const outOfRange = (value: Duration.Duration): string | undefined => {
    if (options?.positive === true && Duration.isZero(value)) return options.range ?? "must be greater than zero"
    if (min !== undefined && Duration.lessThan(value, min)) {
      return options?.range ?? `must be at least ${Duration.format(min)}`
    }
    // Not `range`'s wording: without a `max`, it says nothing of an upper limit ("must be at least 1 second").
    if (max === undefined && !Duration.isFinite(value)) return "must be finite"
    if (max !== undefined && Duration.greaterThan(value, max)) {
      return options?.range ?? `must be between 0 and ${Duration.format(max)}`
    }
    return undefined
  }
  return worded(
    Durations.DurationFromInput.pipe(Schema.filter((value) => outOfRange(value) === undefined)),
    (input) => Either.match(Durations.parse(input), { onLeft: (reason) => reason, onRight: outOfRange }) ?? ""
  )
}

/**
 * How long a graceful stop may wait for the work in flight (`shutdownTimeout`): 0..12 h, no longer than the
 * longest visibility a received message can have, past which the work would be redelivered anyway.
 */
export const ShutdownTimeout: Schema.Schema<Duration.Duration, Duration.DurationInput> = duration({
  max: Duration.hours(12),
  range: "must be between 0 and 12 hours"
})

/** A `Schedule` (given as an option, e.g. a watchdog's or a restart policy's). */
export const ScheduleValue: Schema.Schema<Schedule.Schedule<unknown, unknown, unknown>> = worded(
  Schema.declare((input: unknown): input is Schedule.Schedule<unknown, unknown, unknown> => Schedule.isSchedule(input)),
  () => "must be a Schedule"
)

/** A function given as an option (a callback such as `onStall`); what it does is the caller's. */
export const Callback: Schema.Schema<(...args: ReadonlyArray<never>) => unknown> = worded(
  Schema.declare((input: unknown): input is (...args: ReadonlyArray<never>) => unknown => Predicate.isFunction(input)),
  () => "must be a function"
)
