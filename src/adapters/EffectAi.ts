/**
 * EffectAi: a `ProviderAdapter` over any `@effect/ai` `LanguageModel`
 * (OpenAI, Anthropic, a local OpenAI-compatible server...).
 *
 * Each model turn is one `generateText` call with leasehold's tools declared
 * to the provider (their parameter Schemas become the provider's JSON
 * Schemas) and tool-call resolution turned off: the tool calls come back to
 * leasehold's `InnerLoop`, which runs them with heartbeats and deadlines.
 * With `stream: true` each turn is one `streamText` call instead: its parts
 * reach the `InnerLoop` as they arrive (text deltas, tool calls once their
 * parameters are complete, the usage of the `finish` part), so every chunk
 * that carries something beats the heartbeat and a deadline can stop the
 * response mid-way. Only a finished stream is an answer: one that ends before
 * its `finish` part (Anthropic's `message_stop`, OpenAI's
 * `response.completed`), a `finish` without token usage or with counts that
 * are not non-negative safe integers ("unchargeable usage"), or a server-sent
 * event larger than the SSE parser takes is a `ProviderError` in the
 * `response` phase, retried like any broken stream.
 * `@effect/ai` is an optional peer dependency, loaded when an adapter is made
 * (whoever provides a `LanguageModel` has it installed). The exported types
 * name none of its types, so a program that imports the root without
 * `@effect/ai` installed type-checks with `skipLibCheck` off.
 */
import type * as AiLanguageModel from "@effect/ai/LanguageModel"
import type * as AiPrompt from "@effect/ai/Prompt"
import type * as AiResponse from "@effect/ai/Response"
import type * as AiTool from "@effect/ai/Tool"
import type * as Toolkit from "@effect/ai/Toolkit"
import * as Cause from "effect/Cause"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import * as InnerLoop from "../InnerLoop.js"
import { unchargeable } from "../internal/agent.js"
import * as Options_ from "../internal/options.js"
import type * as Prompt from "../Prompt.js"
import { ProviderAdapter } from "../ProviderAdapter.js"
import type * as Tool from "../Tool.js"

const toAiMessage = (message: Prompt.ChatMessage): AiPrompt.MessageEncoded => {
  switch (message.role) {
    case "system":
      return { role: "system", content: message.content }
    case "user":
      return { role: "user", content: message.content }
    case "assistant":
      return {
        role: "assistant",
        content: [
          ...(message.content.length > 0 ? [{ type: "text" as const, text: message.content }] : []),
          ...(message.toolCalls ?? []).map((call) => ({
            type: "tool-call" as const,
            id: call.id,
            name: call.name,
            params: call.params,
            providerExecuted: false
          }))
        ]
      }
    case "tool":
      return {
        role: "tool",
        content: [{
          type: "tool-result",
          id: message.toolCallId ?? "",
          name: message.toolName ?? "",
          isFailure: message.content.startsWith("error: "),
          result: message.content,
          providerExecuted: false
        }]
      }
  }
}

/** The provider sees each tool with the encoded side of its parameter Schema: what the model must write. */
const toAiTool = (AiTool: AiToolModule, tool: Tool.Any): AiTool.Any =>
  AiTool.make(tool.name, { description: tool.description, success: Schema.Unknown }).setParameters(
    Schema.encodedSchema(tool.parameters) as unknown as AiTool.AnyStructSchema
  ) as unknown as AiTool.Any

type AiToolModule = typeof import("@effect/ai/Tool")

/**
 * The service this adapter needs: `@effect/ai`'s `LanguageModel` tag, named by its key rather than imported,
 * so that these declarations do not need `@effect/ai` to type-check. Providing `@effect/ai`'s
 * `LanguageModel` (a provider's layer, or `Effect.provideService`) satisfies it.
 *
 * @category models
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the service's shape is @effect/ai's to define
export interface LanguageModel extends Context.TagClassShape<"@effect/ai/LanguageModel", any> {}

/** The options of one model call: the conversation, and leasehold's tools declared with resolution off. */
const callOptions = (AiTool: AiToolModule, request: InnerLoop.ModelRequest) => {
  const prompt = request.messages.map(toAiMessage)
  const tools = Object.fromEntries(request.tools.map((tool) => [tool.name, toAiTool(AiTool, tool)]))
  // Never called: resolution is off, so the calls come back to the InnerLoop.
  const toolkit = {
    tools,
    handle: () => Effect.dieMessage("leasehold runs tools itself")
  } as unknown as Toolkit.WithHandler<Record<string, AiTool.Any>>
  return { prompt, ...(request.tools.length > 0 ? { toolkit, disableToolCallResolution: true as const } : {}) }
}

const toUsage = (usage: AiResponse.Usage): { inputTokens: number; outputTokens: number } => ({
  inputTokens: usage.inputTokens ?? 0,
  outputTokens: usage.outputTokens ?? 0
})

const complete = (model: AiLanguageModel.Service, AiTool: AiToolModule): InnerLoop.Complete => (request) =>
  Effect.flatMap(
    model.generateText(callOptions(AiTool, request)).pipe(
      Effect.mapError((error) => new InnerLoop.ProviderError({ detail: error.message }))
    ),
    (response) => {
      const usage = toUsage(response.usage)
      const wrong = unchargeable(usage)
      return wrong !== undefined ? Effect.fail(brokenAnswer(wrong)) : Effect.succeed({
        text: response.text,
        toolCalls: response.toolCalls.map((call) => ({ id: call.id, name: call.name, params: call.params })),
        usage
      })
    }
  )

const nothing: InnerLoop.TurnPart = { _tag: "Progress" }

/** What the model wrote in a part the loop does not keep: it proves progress when it is not empty. */
const written = (text: string): InnerLoop.TurnPart => ({ _tag: "Progress", bytes: Buffer.byteLength(text, "utf8") })

/** The failure of a stream whose answer came broken: retried, reported in the `response` phase. */
const brokenAnswer = (detail: string) => new InnerLoop.ProviderError({ phase: "response", detail })

/**
 * A part of `@effect/ai`'s stream as the InnerLoop's: tool calls the provider ran itself are only progress; the
 * `finish` part must carry the turn's token usage (a turn that cannot be charged is no answer).
 */
const toTurnPart = (
  part: AiResponse.StreamPart<Record<string, AiTool.Any>>
): Effect.Effect<InnerLoop.TurnPart, InnerLoop.ProviderError> => {
  switch (part.type) {
    case "text-delta":
      return Effect.succeed({ _tag: "Text", delta: part.delta })
    case "reasoning-delta":
    case "tool-params-delta":
      return Effect.succeed(written(part.delta))
    case "tool-call":
      return Effect.succeed(
        part.providerExecuted === true
          ? nothing // its parameters were progress as they were written
          : { _tag: "ToolCall", call: { id: part.id, name: part.name, params: part.params } }
      )
    case "finish": {
      const { inputTokens, outputTokens } = part.usage
      if (typeof inputTokens !== "number" || typeof outputTokens !== "number") {
        return Effect.fail(brokenAnswer(
          `the stream's final event carried no token usage (input ${inputTokens}, output ${outputTokens}): ` +
            "a turn that cannot be charged is not taken as an answer"
        ))
      }
      // Negative, fractional or infinite counts (a provider's JSON can say -5 or 1e400): unchargeable usage.
      const wrong = unchargeable({ inputTokens, outputTokens })
      return wrong === undefined
        ? Effect.succeed({ _tag: "Usage", usage: { inputTokens, outputTokens } })
        : Effect.fail(brokenAnswer(wrong))
    }
    case "error":
      return Effect.fail(
        new InnerLoop.ProviderError({ detail: `the stream reported an error: ${describe(part.error)}` })
      )
    default:
      return Effect.succeed(nothing)
  }
}

const describe = (error: unknown): string => {
  if (error instanceof Error) return error.message
  const json = JSON.stringify(error)
  return json === undefined ? String(error) : json
}

/** `@effect/experimental`'s SSE parser dies with an `SseError` on an event over its size limit. */
const isSseError = (defect: unknown): defect is { readonly message: string } =>
  Predicate.hasProperty(defect, "_tag") && defect._tag === "SseError" && Predicate.hasProperty(defect, "message")

const cutShort = () =>
  brokenAnswer(
    "the stream ended before its final event (no finish part: Anthropic's message_stop, OpenAI's " +
      "response.completed): the answer was cut short"
  )

const completeStream = (model: AiLanguageModel.Service, AiTool: AiToolModule): InnerLoop.CompleteStream => (request) =>
  Stream.suspend(() => {
    let finished = false
    // Once a part has arrived the model was answering: a failure after it (an event the provider's schema
    // rejects, a connection reset) broke the response, not the request.
    let answering = false
    return model.streamText(callOptions(AiTool, request)).pipe(
      Stream.tap(() =>
        Effect.sync(() => {
          answering = true
        })
      ),
      Stream.mapError((error) =>
        new InnerLoop.ProviderError({ ...(answering ? { phase: "response" as const } : {}), detail: error.message })
      ),
      // An oversized event is the provider's doing, not a defect of ours: a broken answer, retried.
      Stream.catchSomeCause((cause) =>
        Option.map(
          Option.filter(Cause.dieOption(cause), isSseError),
          (error) => Stream.fail(brokenAnswer(`a server-sent event was too large to read: ${error.message}`))
        )
      ),
      Stream.mapEffect((part) => {
        if (part.type === "finish") finished = true
        return toTurnPart(part)
      }),
      Stream.concat(Stream.suspend(() => finished ? Stream.empty : Stream.fail(cutShort())))
    )
  })

/**
 * Options of the adapter: the loop's, and whether to stream.
 *
 * @category models
 */
export interface Options extends InnerLoop.Options {
  /**
   * Stream each model response (`streamText`) rather than wait for it whole (`generateText`): every chunk beats
   * the heartbeat (at most once per `beatInterval`) and a deadline stops the response mid-way (default false).
   */
  readonly stream?: boolean | undefined
}

const decodeOptions = Options_.decoder("EffectAi.make", {
  stream: Schema.optionalWith(Options_.worded(Schema.Boolean, () => "must be a boolean"), { exact: true })
})

/**
 * An adapter over the `LanguageModel` in the context. Bad options are a `ParseError` naming them (see
 * `InnerLoop.makeAdapter`).
 *
 * @category constructors
 */
export const make = (
  options?: Options
): Effect.Effect<ProviderAdapter["Type"], ParseResult.ParseError, LanguageModel> =>
  Effect.flatMap(decodeOptions(options), ({ stream }) =>
    Effect.flatMap(
      Effect.promise(() => Promise.all([import("@effect/ai/LanguageModel"), import("@effect/ai/Tool")])),
      ([AiLanguageModel, AiTool]) =>
        Effect.flatMap(
          AiLanguageModel.LanguageModel,
          (model) =>
            InnerLoop.makeAdapter(
              "effect-ai",
              stream === true ? { stream: completeStream(model, AiTool) } : complete(model, AiTool),
              options
            )
        )
    ))

/**
 * The adapter as the `ProviderAdapter` service.
 *
 * @category layers
 */
export const layer = (
  options?: Options
): Layer.Layer<ProviderAdapter, ParseResult.ParseError, LanguageModel> => Layer.effect(ProviderAdapter, make(options))
