/**
 * Evaluators: how an output is scored against the expected answer.
 *
 * A `Score` is a value in 0..1, a pass/fail verdict and a reason. The basic
 * evaluators compare values (`exactMatch`, structurally) or text
 * (`contains`); `allOf` combines by mean (passing when all pass) and `anyOf`
 * by maximum (passing when any passes). Every evaluator also receives the
 * sample's `Session`, so the session-aware ones (`usedTool`, `maxToolCalls`,
 * `maxTokens`) judge how the agent got there, not only what it answered.
 */
import * as Effect from "effect/Effect"
import * as Equal from "effect/Equal"
import * as Schema from "effect/Schema"
import * as Utils from "effect/Utils"
import type * as Session from "./Session.js"

/**
 * A score in 0..1 with a verdict.
 *
 * @category models
 */
export class Score extends Schema.Class<Score>("leasehold/Score")({
  value: Schema.Number.pipe(Schema.between(0, 1, { message: () => "a score must be between 0 and 1" })),
  passed: Schema.Boolean,
  reason: Schema.String
}) {}

/**
 * Scores an output against the expected value; the session holds what the agent did.
 *
 * @category models
 */
export type Evaluator<O, E> = (output: O, expected: E, session: Session.Session) => Effect.Effect<Score>

const verdict = (passed: boolean, reason: string) => new Score({ value: passed ? 1 : 0, passed, reason })

/**
 * 1 when the output equals the expected value (structurally, so arrays and plain objects compare by content).
 *
 * @category evaluators
 */
export const exactMatch: Evaluator<unknown, unknown> = (output, expected) =>
  Effect.sync(() => {
    const equal = Utils.structuralRegion(() => Equal.equals(output, expected))
    return verdict(equal, equal ? "exact match" : `expected ${JSON.stringify(expected)}, got ${JSON.stringify(output)}`)
  })

/**
 * 1 when the output text contains the expected text.
 *
 * @category evaluators
 */
export const contains: Evaluator<string, string> = (output, expected) =>
  Effect.sync(() => {
    const found = String(output).includes(String(expected))
    return verdict(
      found,
      found ? `contains ${JSON.stringify(expected)}` : `does not contain ${JSON.stringify(expected)}`
    )
  })

const combine = <O, E>(
  evaluators: ReadonlyArray<Evaluator<O, E>>,
  value: (values: ReadonlyArray<number>) => number,
  passed: (verdicts: ReadonlyArray<boolean>) => boolean,
  label: string
): Evaluator<O, E> =>
(output, expected, session) =>
  Effect.map(Effect.forEach(evaluators, (evaluate) => evaluate(output, expected, session)), (scores) =>
    new Score({
      value: scores.length === 0 ? 0 : value(scores.map((s) => s.value)),
      passed: scores.length > 0 && passed(scores.map((s) => s.passed)),
      reason: `${label}(${scores.map((s) => s.reason).join("; ")})`
    }))

/**
 * Mean of the scores; passes when every evaluator passes.
 *
 * @category combinators
 */
export const allOf = <O, E>(...evaluators: ReadonlyArray<Evaluator<O, E>>): Evaluator<O, E> =>
  combine(evaluators, (values) => values.reduce((a, b) => a + b, 0) / values.length, (v) => v.every(Boolean), "allOf")

/**
 * Maximum of the scores; passes when any evaluator passes.
 *
 * @category combinators
 */
export const anyOf = <O, E>(...evaluators: ReadonlyArray<Evaluator<O, E>>): Evaluator<O, E> =>
  combine(evaluators, (values) => Math.max(...values), (v) => v.some(Boolean), "anyOf")

/**
 * 1 when the agent called tool `name` at least once during the sample.
 *
 * @category evaluators
 */
export const usedTool = (name: string): Evaluator<unknown, unknown> => (_output, _expected, session) =>
  Effect.map(session.events, (events) => {
    const used = events.some((event) => event._tag === "ToolCall" && event.toolName === name)
    return verdict(used, used ? `called ${name}` : `never called ${name}`)
  })

/**
 * 1 when the agent made at most `max` tool calls.
 *
 * @category evaluators
 */
export const maxToolCalls = (max: number): Evaluator<unknown, unknown> => (_output, _expected, session) =>
  Effect.map(session.events, (events) => {
    const calls = events.filter((event) => event._tag === "ToolCall").length
    return verdict(calls <= max, `${calls} tool calls (at most ${max})`)
  })

/**
 * 1 when the sample used at most `max` tokens in all.
 *
 * @category evaluators
 */
export const maxTokens = (max: number): Evaluator<unknown, unknown> => (_output, _expected, session) =>
  Effect.map(
    session.usage,
    ({ inputTokens, outputTokens }) =>
      verdict(inputTokens + outputTokens <= max, `${inputTokens + outputTokens} tokens (at most ${max})`)
  )
