/**
 * Subagent: evaluating a child prompt from inside a tool.
 *
 * The child runs with the same adapter, session, heartbeat and budget
 * tracker as its parent, under the earlier of the parent's deadline and its
 * own — a child can never outlive its parent. If the child runs out of time,
 * its `PromptEvaluationError` (reason `deadline`) reaches the tool, and the
 * tool executor turns it into the parent's own deadline failure. With a
 * journal, the child's steps are recorded inside the tool call's step, and
 * its outcome is a step of its own: a redelivered request gets it back
 * without evaluating the child again.
 */
import type * as Effect from "effect/Effect"
import * as Deadline from "./Deadline.js"
import type * as Journal from "./Journal.js"
import type * as Prompt from "./Prompt.js"
import type { PromptEvaluationError, PromptResponse } from "./ProviderAdapter.js"
import type { ToolContext } from "./Tool.js"

/**
 * Evaluates `prompt` as a subagent of the tool call that `context` belongs to.
 *
 * @category utils
 */
export const evaluate = <Out>(
  context: ToolContext,
  prompt: Prompt.Prompt<Out>,
  options?: { readonly deadline?: Deadline.Deadline | undefined }
): Effect.Effect<PromptResponse<Out>, PromptEvaluationError | Journal.JournalError> =>
  context.adapter.evaluate(prompt, {
    session: context.session,
    deadline: Deadline.earliest(context.deadline, options?.deadline),
    heartbeat: context.heartbeat,
    budgetTracker: context.budgetTracker,
    runContext: context.runContext,
    journal: context.journal
  })
