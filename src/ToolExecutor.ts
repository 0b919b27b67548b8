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
 *
 * With a journal, the call is a step: a result recorded by an earlier delivery
 * is returned without running the tool (unless the tool says `replay:
 * "rerun"`), a call that differs from the recorded one is a
 * `JournalDivergedError`, and a result is recorded before the run goes on. A
 * journal failure of a subagent the tool evaluated ends the evaluation too.
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
import { deadlinePayload, digest, diverged, replayed, since } from "./internal/agent.js"
import * as Journal from "./Journal.js"
import type * as Prompt from "./Prompt.js"
import { PromptEvaluationError } from "./ProviderAdapter.js"
import { type ToolContext, ToolResult } from "./Tool.js"

const isDeadlineFailure = (error: unknown): boolean =>
  typeof error === "object" && error !== null && "_tag" in error &&
  (error._tag === "DeadlineExceededError" ||
    (error instanceof PromptEvaluationError && error.reason === "deadline"))

const isJournalFailure = (error: unknown): error is Journal.JournalError =>
  error instanceof Journal.JournalDivergedError || error instanceof Journal.JournalStoreError

/** What a rerun tool's step records of its result. */
const resultDigest = (result: ToolResult): string =>
  digest(JSON.stringify(result._tag === "Ok" ? ["ok", result.value ?? null] : ["error", result.message]))

/** The result a journal tool's step recorded. */
const recordedResult = (step: typeof Journal.ToolStep.Type): ToolResult =>
  step.ok ? ToolResult.Ok({ value: step.value }) : ToolResult.Error({ message: String(step.value) })

/**
 * Executes `call` with `context` as a step of `journal` (default: one that keeps nothing); fails only when the
 * deadline or the journal ends the evaluation.
 *
 * @category utils
 */
export const execute = (
  call: Prompt.ToolCall,
  context: ToolContext,
  journal?: Journal.Journal
): Effect.Effect<ToolResult, PromptEvaluationError | Journal.JournalError> =>
  Effect.gen(function*() {
    const { deadline, prompt, session } = context
    const steps = journal ?? Journal.unrecorded(context.runContext?.requestId)
    const key = steps.nextKey()
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
    const tool = prompt.tools.find((t) => t.name === call.name)
    const asked = digest(JSON.stringify([call.name, call.params ?? null]))
    const recorded = yield* steps.recorded(key)
    if (recorded !== undefined && (recorded._tag !== "Tool" || recorded.asked !== asked)) {
      return yield* diverged(
        steps.requestId,
        key,
        recorded,
        recorded._tag === "Tool" && recorded.toolName === call.name
          ? `tool "${call.name}" with other parameters`
          : `tool "${call.name}"`
      )
    }
    const started = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    const event = {
      _tag: "ToolCall",
      promptName: prompt.name,
      toolName: call.name,
      callId: call.id,
      params: call.params,
      at: started
    } as const
    if (recorded !== undefined && recorded.replay === "journal") {
      // Ran on an earlier delivery: its result as the model saw it then, without running it.
      const result = recordedResult(recorded)
      yield* replayed
      yield* session.record({ ...event, replayed: true })
      yield* session.record({
        _tag: "ToolResult",
        promptName: prompt.name,
        toolName: call.name,
        callId: call.id,
        ok: recorded.ok,
        value: recorded.value,
        durationMs: recorded.durationMs,
        replayed: true
      })
      yield* context.beat
      return result
    }
    yield* session.record(event)
    // The stored message's own name, never the sender's request id: two messages that carry the same request id
    // get different keys, and every delivery of one message the same. Without one (no journaling mailbox), the
    // session's id: the same for this evaluation only.
    const idempotencyKey = `${(yield* steps.identity) ?? session.id}/${key}`
    const callContext: ToolContext = {
      ...context,
      journal: steps.within(key),
      idempotencyKey,
      fencingToken: context.runContext?.attempt
    }
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
        const handler = tool.handler(params.right as never, callContext)
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
          // A subagent's journal failed: the evaluation cannot go on from its journal either.
          if (Option.isSome(failure) && isJournalFailure(failure.value)) return yield* failure.value
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
    const durationMs = yield* since(started)
    // Recorded before the run goes on. A rerun tool records a digest of its result; one whose result changed
    // since it was recorded discards what was recorded after it, which followed from the old result.
    const replay = tool?.replay ?? "journal"
    const ok = result._tag === "Ok"
    const value = result._tag === "Ok" ? result.value : result.message
    if (recorded === undefined || recorded.digest !== resultDigest(result)) {
      if (recorded !== undefined) yield* steps.discardFrom(key)
      yield* steps.append({
        _tag: "Tool",
        key,
        promptName: prompt.name,
        toolName: call.name,
        callId: call.id,
        asked,
        replay,
        ok,
        ...(replay === "journal" ? { value } : { digest: resultDigest(result) }),
        durationMs
      })
    }
    yield* session.record({
      _tag: "ToolResult",
      promptName: prompt.name,
      toolName: call.name,
      callId: call.id,
      ok,
      value,
      durationMs
    })
    yield* context.beat
    return result
  }).pipe(Effect.withSpan("ToolExecutor.execute", { attributes: { tool: call.name }, captureStackTrace: false }))
