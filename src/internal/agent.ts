/**
 * What the inner loop and the tool executor share: how a deadline failure's
 * provider payload is written, how long a step took by `Clock`, the digest a
 * journal step records of what was asked, the divergence error, and where a
 * streamed answer stands (for a deadline another timer notices).
 */
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as JSONSchema from "effect/JSONSchema"
import * as Metric from "effect/Metric"
import type * as Schema from "effect/Schema"
import { createHash } from "node:crypto"
import type * as Deadline from "../Deadline.js"
import { describe, divergences, JournalDivergedError, type Step, stepsReplayed } from "../Journal.js"
import type * as Tool from "../Tool.js"

/** The payload of a deadline failure: the cut-off as ISO-8601, under `deadline_expires_at`. */
export const deadlinePayload = (deadline: Deadline.Deadline | undefined): Record<string, unknown> | undefined =>
  deadline === undefined ? undefined : { deadline_expires_at: deadline.iso }

/** Milliseconds since `start` by `Clock`. */
export const since = (start: number): Effect.Effect<number> => Effect.map(Clock.currentTimeMillis, (now) => now - start)

/** A digest of `text` (SHA-256, 132 bits in base64url): what a journal step records of what was asked. */
export const digest = (text: string): string => createHash("sha256").update(text).digest("base64url").slice(0, 22)

/**
 * The tools on offer as a turn's digest covers them: each one's name, description and the JSON Schema of its
 * parameters (what the model is shown), so a deploy that changes a tool's parameters or its wording diverges
 * instead of replaying a turn the model answered to another tool.
 */
export const toolsAsked = (tools: ReadonlyArray<Tool.Any>): ReadonlyArray<readonly [string, string, string]> =>
  tools.map((tool) => [tool.name, tool.description, parametersAsked(tool.parameters)])

/**
 * A schema's JSON Schema as text; for one JSON Schema cannot express (a declaration or a recursion without an
 * identifier annotation), its AST as JSON (both sides, through recursion), else its description; never a defect.
 */
const parametersAsked = (parameters: Schema.Schema.AnyNoContext): string =>
  Either.getOrElse(
    Either.try(() => JSON.stringify(JSONSchema.make(parameters))),
    () => Either.getOrElse(Either.try(() => JSON.stringify(parameters.ast.toJSON())), () => String(parameters.ast))
  )

/** Fails: the run asked for `asked` at `key`, where its journal recorded `recorded` (counted). */
export const diverged = (
  requestId: string | undefined,
  key: string,
  recorded: Step,
  asked: string
): Effect.Effect<never, JournalDivergedError> =>
  Effect.zipRight(
    Metric.increment(divergences),
    Effect.fail(
      new JournalDivergedError({
        ...(requestId === undefined ? {} : { requestId }),
        key,
        recorded: describe(recorded),
        asked
      })
    )
  )

/** Counts a step taken from the journal. */
export const replayed: Effect.Effect<void> = Metric.increment(stepsReplayed)

/**
 * Whether the model is answering a streamed turn (its first part has arrived) in the evaluation under way:
 * `MainLoop.agent` provides one per attempt and the inner loop keeps it, so that a deadline the loop's own timer
 * notices first is reported in the phase the inner loop would have said (`response`, not `request`).
 */
export class Answering extends Context.Tag("leasehold/internal/Answering")<Answering, { answering: boolean }>() {}

/** A token count a turn can be charged: a non-negative safe integer (not negative, fractional, NaN or infinite). */
const isCount = (n: unknown): boolean => typeof n === "number" && Number.isSafeInteger(n) && n >= 0

/**
 * What is wrong with a turn's usage, or `undefined` when it can be charged: both counts non-negative safe
 * integers. A turn that cannot be charged is no answer (a `ProviderError` in the `response` phase, retried).
 */
export const unchargeable = (usage: unknown): string | undefined => {
  const { inputTokens, outputTokens } = (typeof usage === "object" && usage !== null ? usage : {}) as Record<
    string,
    unknown
  >
  return isCount(inputTokens) && isCount(outputTokens)
    ? undefined
    : `unchargeable usage from the provider (input ${String(inputTokens)}, output ${String(outputTokens)} tokens; ` +
      "each must be a non-negative safe integer): a turn that cannot be charged is not taken as an answer"
}
