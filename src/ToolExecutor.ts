/**
 * ToolExecutor: runs one tool call for the inner loop.
 *
 * It beats before and after the tool (so even tools that never beat keep the
 * request leased between calls), decodes the parameters with the tool's
 * Schema, and runs the handler under `Deadline.within`, so a handler that
 * ignores the deadline is interrupted when it passes. A deadline — passed
 * before the call (the handler is then never called), raised by the handler
 * as `DeadlineExceededError`, reached while it runs, or reported by a
 * subagent — aborts the evaluation with `PromptEvaluationError { phase: "tool",
 * reason: "deadline" }`. Any other failure is a `ToolResult.Error` for the model.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Deadline from "./Deadline.js"
import * as Errors from "./Errors.js"
import * as Heartbeat from "./Heartbeat.js"
import { deadlinePayload, since } from "./internal/agent.js"
import type * as Prompt from "./Prompt.js"
import { PromptEvaluationError } from "./ProviderAdapter.js"
import { type ToolContext, ToolResult } from "./Tool.js"

const isDeadlineFailure = (error: unknown): boolean =>
  typeof error === "object" && error !== null && "_tag" in error &&
  (error._tag === "DeadlineExceededError" ||
    (error instanceof PromptEvaluationError && error.reason === "deadline"))

/**
 * Executes `call` with `context`; fails only when the deadline ends the evaluation.
 *
 * @category utils
 */
export const execute = (
  call: Prompt.ToolCall,
  context: ToolContext
): Effect.Effect<ToolResult, PromptEvaluationError> =>
  Effect.gen(function*() {
    const { deadline, prompt, session } = context
    const deadlineError = (detail: string) =>
      new PromptEvaluationError({
        phase: "tool",
        reason: "deadline",
        promptName: prompt.name,
        detail,
        providerPayload: deadlinePayload(deadline) ?? {}
      })
    yield* context.beat
    if (deadline !== undefined && (yield* Deadline.isExpired(deadline))) {
      return yield* deadlineError(`the deadline passed before tool "${call.name}" could start`)
    }
    const started = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    yield* session.record({
      _tag: "ToolCall",
      promptName: prompt.name,
      toolName: call.name,
      callId: call.id,
      params: call.params,
      at: started
    })
    const tool = prompt.tools.find((t) => t.name === call.name)
    let result: ToolResult
    if (tool === undefined) {
      result = ToolResult.Error({
        message: `unknown tool "${call.name}"; available: ${prompt.tools.map((t) => t.name).join(", ") || "none"}`
      })
    } else {
      const params = Schema.decodeUnknownEither(tool.parameters)(call.params)
      if (params._tag === "Left") {
        result = ToolResult.Error({
          message: `invalid parameters for "${call.name}": ${ParseResult.TreeFormatter.formatErrorSync(params.left)}`
        })
      } else {
        // The tool and everything it calls or forks beat the context's heartbeat through `Heartbeat.beat`.
        const handler = tool.handler(params.right as never, context)
        const run = context.heartbeat === undefined ? handler : Heartbeat.within(handler, context.heartbeat)
        const exit = yield* Effect.exit(deadline === undefined ? run : Deadline.within(run, deadline))
        if (Exit.isSuccess(exit)) {
          const encoded = Schema.encodeUnknownEither(tool.success)(exit.value)
          result = encoded._tag === "Right"
            ? ToolResult.Ok({ value: encoded.right })
            : ToolResult.Error({ message: `tool "${call.name}" returned an invalid result` })
        } else {
          const failure = Cause.failureOption(exit.cause)
          if (Option.isSome(failure) && isDeadlineFailure(failure.value)) {
            return yield* deadlineError(
              `tool "${call.name}" ran out of time: ${Errors.describe(failure.value).message}`
            )
          }
          if (Cause.isInterruptedOnly(exit.cause)) return yield* Effect.interrupt
          const described = Option.match(failure, {
            onNone: () => ({ tag: "Defect", message: Cause.pretty(exit.cause) }),
            onSome: Errors.describe
          })
          if (Option.isNone(failure)) yield* Effect.logError(`Tool "${call.name}" died`, exit.cause)
          result = ToolResult.Error({ message: `${described.tag}: ${described.message}` })
        }
      }
    }
    yield* session.record({
      _tag: "ToolResult",
      promptName: prompt.name,
      toolName: call.name,
      callId: call.id,
      ok: result._tag === "Ok",
      value: result._tag === "Ok" ? result.value : result.message,
      durationMs: yield* since(started)
    })
    yield* context.beat
    return result
  }).pipe(Effect.withSpan("ToolExecutor.execute", { attributes: { tool: call.name }, captureStackTrace: false }))
