/**
 * ProviderAdapter: the service that evaluates a prompt with a model.
 *
 * `evaluate(prompt, { session, deadline?, budgetTracker?, heartbeat? })` runs
 * the whole agentic exchange (model turns and tool calls, see `InnerLoop`)
 * and returns the decoded output, the final text and the tokens used. Every
 * way it can stop early is one `PromptEvaluationError`: `phase` says where
 * (`preflight`, `request`, `tool`, `response`) and `reason` why (`deadline`,
 * `budget`, `provider`, `tool`, `output`); a deadline failure carries
 * `providerPayload.deadline_expires_at` for the logs. With a `journal`, a
 * journal failure stops it too (`JournalDivergedError`, `JournalStoreError`).
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type * as Budget from "./Budget.js"
import type * as Deadline from "./Deadline.js"
import type * as Heartbeat from "./Heartbeat.js"
import type * as Journal from "./Journal.js"
import type * as Prompt from "./Prompt.js"
import type { RunContext } from "./RunContext.js"
import type * as Session from "./Session.js"

/**
 * Where an evaluation stopped.
 *
 * @category schemas
 */
export const Phase = Schema.Literal("preflight", "request", "tool", "response")

/**
 * Why it stopped.
 *
 * @category schemas
 */
export const Reason = Schema.Literal("deadline", "budget", "provider", "tool", "output")

/**
 * An evaluation stopped before producing its output.
 *
 * @category errors
 */
export class PromptEvaluationError extends Schema.TaggedError<PromptEvaluationError>()("PromptEvaluationError", {
  phase: Phase,
  reason: Reason,
  promptName: Schema.String,
  detail: Schema.String,
  providerPayload: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
}) {
  override get message(): string {
    return `Prompt "${this.promptName}" stopped in ${this.phase} (${this.reason}): ${this.detail}`
  }
}

/**
 * The result of an evaluation.
 *
 * @category models
 */
export interface PromptResponse<Out> {
  readonly output: Out
  readonly text: string
  readonly usage: Session.Usage
}

/**
 * What an evaluation runs with.
 *
 * @category models
 */
export interface EvaluateOptions {
  readonly session: Session.Session
  readonly deadline?: Deadline.Deadline | undefined
  readonly budgetTracker?: Budget.BudgetTracker | undefined
  readonly heartbeat?: Heartbeat.Heartbeat | undefined
  readonly runContext?: RunContext | undefined
  /** Where the evaluation records its steps and replays them from (`MainLoop`'s `context.journal`); none by default. */
  readonly journal?: Journal.Journal | undefined
}

/**
 * Evaluates prompts with a model.
 *
 * @category services
 */
export class ProviderAdapter extends Context.Tag("leasehold/ProviderAdapter")<ProviderAdapter, {
  readonly name: string
  readonly evaluate: <Out>(
    prompt: Prompt.Prompt<Out>,
    options: EvaluateOptions
  ) => Effect.Effect<PromptResponse<Out>, PromptEvaluationError | Journal.JournalError>
}>() {}
