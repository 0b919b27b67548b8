/**
 * Budgets: limits on one evaluation's deadline and token usage, and the
 * tracker that adds up usage across the evaluations that share it (a parent
 * and its subagents).
 *
 * Usage is recorded per evaluation id as a cumulative total (a later report
 * for the same id replaces the earlier one, so retried reports never double
 * count), and `check` compares the sum across ids with the limits: deadline
 * first, then input, output and total tokens. The tracker keeps its state in
 * a `Ref`, so concurrent fibers can record and check safely.
 */
import * as Effect from "effect/Effect"
import * as ParseResult from "effect/ParseResult"
import * as Ref from "effect/Ref"
import * as Schema from "effect/Schema"
import * as Deadline from "./Deadline.js"
import * as Options_ from "./internal/options.js"

const TokenLimit = Schema.Int.pipe(Schema.positive({ message: () => "a token limit must be a positive integer" }))
const TokenCount = Schema.Int.pipe(
  Schema.nonNegative({ message: () => "a token count must be a non-negative integer" })
)

const noLimit = "a budget needs at least one limit: deadline, maxInputTokens, maxOutputTokens or maxTotalTokens"

const BudgetLimits = Schema.Struct({
  deadline: Schema.optional(Deadline.Deadline),
  maxInputTokens: Schema.optional(TokenLimit),
  maxOutputTokens: Schema.optional(TokenLimit),
  maxTotalTokens: Schema.optional(TokenLimit)
}).pipe(Schema.filter(
  (limits) =>
    limits.deadline !== undefined || limits.maxInputTokens !== undefined ||
    limits.maxOutputTokens !== undefined || limits.maxTotalTokens !== undefined ||
    noLimit
))

/**
 * Limits for an evaluation; at least one is set and token limits are positive integers.
 *
 * @category models
 */
export class Budget extends Schema.Class<Budget>("leasehold/Budget")(BudgetLimits) {}

/**
 * Options of `make`: the limits, at least one of them.
 *
 * @category models
 */
export interface Options {
  /** The evaluation stops when this passes. */
  readonly deadline?: Deadline.Deadline | undefined
  /** Most input tokens, summed over the evaluations that share the tracker (a positive integer). */
  readonly maxInputTokens?: number | undefined
  /** Most output tokens (a positive integer). */
  readonly maxOutputTokens?: number | undefined
  /** Most input and output tokens together (a positive integer). */
  readonly maxTotalTokens?: number | undefined
}

/**
 * Makes a budget from its limits, failing with a `ParseError` naming the limit when none is set or one is out of range.
 *
 * @category constructors
 */
export const make = (limits: Options): Effect.Effect<Budget, ParseResult.ParseError> =>
  Effect.map(decodeOptions(limits), (valid) => new Budget(valid, true))

const OptionalLimit = Schema.optionalWith(Options_.PositiveInt, { exact: true })

const decodeOptions = Options_.decoder(
  "Budget.make",
  {
    deadline: Schema.optionalWith(Schema.typeSchema(Deadline.Deadline), { exact: true }),
    maxInputTokens: OptionalLimit,
    maxOutputTokens: OptionalLimit,
    maxTotalTokens: OptionalLimit
  },
  (limits) =>
    limits.deadline === undefined && limits.maxInputTokens === undefined &&
      limits.maxOutputTokens === undefined && limits.maxTotalTokens === undefined
      ? { message: noLimit }
      : undefined
)

/**
 * Token usage of one evaluation so far.
 *
 * @category models
 */
export class TokenUsage extends Schema.Class<TokenUsage>("leasehold/TokenUsage")({
  inputTokens: TokenCount,
  outputTokens: TokenCount
}) {
  get totalTokens(): number {
    return this.inputTokens + this.outputTokens
  }
}

const decodeUsage = Schema.decodeUnknown(TokenUsage)

/**
 * Which limit was exceeded.
 *
 * @category schemas
 */
export const BudgetDimension = Schema.Literal("deadline", "inputTokens", "outputTokens", "totalTokens")

/**
 * Which limit was exceeded.
 *
 * @category models
 */
export type BudgetDimension = typeof BudgetDimension.Type

/**
 * A budget limit was exceeded; `dimension` names it, `limit` and `used` give the figures for token limits.
 *
 * @category errors
 */
export class BudgetExceededError extends Schema.TaggedError<BudgetExceededError>()("BudgetExceededError", {
  dimension: BudgetDimension,
  limit: Schema.optional(Schema.Number),
  used: Schema.optional(Schema.Number)
}) {
  override get message(): string {
    return this.dimension === "deadline"
      ? "Budget exceeded: the deadline has passed"
      : `Budget exceeded: ${this.dimension} used ${this.used} of ${this.limit}`
  }
}

/**
 * Records token usage per evaluation id and checks the sum against one budget.
 *
 * @category models
 */
export interface BudgetTracker {
  readonly budget: Budget
  /** Records the cumulative usage of `evaluationId`, replacing what was recorded for it before. Counts are non-negative integers. */
  readonly record: (
    evaluationId: string,
    usage: { readonly inputTokens: number; readonly outputTokens: number }
  ) => Effect.Effect<void, ParseResult.ParseError>
  /** Usage summed across every evaluation id. */
  readonly consumed: Effect.Effect<TokenUsage>
  /** Fails when a limit is exceeded: the deadline first, then input, output and total tokens. */
  readonly check: Effect.Effect<void, BudgetExceededError>
}

/**
 * Makes a tracker for `budget`.
 *
 * @category constructors
 */
export const makeTracker = (budget: Budget): Effect.Effect<BudgetTracker> =>
  Effect.map(Ref.make(new Map<string, TokenUsage>()), (usages) => {
    const consumed = Effect.map(Ref.get(usages), (map) => {
      let inputTokens = 0
      let outputTokens = 0
      for (const usage of map.values()) {
        inputTokens += usage.inputTokens
        outputTokens += usage.outputTokens
      }
      return new TokenUsage({ inputTokens, outputTokens }, true)
    })
    const over = (dimension: BudgetDimension, limit: number | undefined, used: number) =>
      limit !== undefined && used > limit ? new BudgetExceededError({ dimension, limit, used }) : undefined
    const check = Effect.gen(function*() {
      if (budget.deadline !== undefined && (yield* Deadline.isExpired(budget.deadline))) {
        return yield* new BudgetExceededError({ dimension: "deadline" })
      }
      const usage = yield* consumed
      const error = over("inputTokens", budget.maxInputTokens, usage.inputTokens) ??
        over("outputTokens", budget.maxOutputTokens, usage.outputTokens) ??
        over("totalTokens", budget.maxTotalTokens, usage.totalTokens)
      if (error !== undefined) return yield* error
    })
    return {
      budget,
      record: (evaluationId, usage) =>
        Effect.flatMap(
          decodeUsage(usage),
          (valid) => Ref.update(usages, (map) => new Map(map).set(evaluationId, valid))
        ),
      consumed,
      check
    }
  })
