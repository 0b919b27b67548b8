/**
 * Anthropic: a `ProviderAdapter` for Anthropic's Messages API, over
 * `@effect/ai-anthropic`.
 *
 * It only builds the provider's `LanguageModel` (an `AnthropicClient` on the
 * `HttpClient` in the context, then `AnthropicLanguageModel`) and hands it to
 * `EffectAi`, so deadlines, heartbeats, budgets and tool execution behave
 * exactly as for any other `@effect/ai` model; with `stream: true` it reads
 * the Messages API's server-sent events, each that carries text, a tool call's
 * parameters or the usage beating the heartbeat, and only a stream that
 * reaches `message_stop` is an answer (see `EffectAi`). `@effect/ai-anthropic` (and
 * `@effect/ai` beside it) are optional peer dependencies, loaded when an
 * adapter is made: a program without them is told which to install.
 */
import type * as HttpClient from "@effect/platform/HttpClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type { MissingPackageError } from "../Errors.js"
import * as Optional from "../internal/optional.js"
import * as Options_ from "../internal/options.js"
import { ProviderAdapter } from "../ProviderAdapter.js"
import * as EffectAi from "./EffectAi.js"

/**
 * Options of the Anthropic adapter: the model and how to reach it, plus the loop's and `EffectAi`'s (`stream`).
 *
 * @category models
 */
export interface Options extends EffectAi.Options {
  /** The model, e.g. `"claude-sonnet-4-5"`. */
  readonly model: string
  /** The API key, sent as `x-api-key`; `Redacted` so it never reaches a log. */
  readonly apiKey: Redacted.Redacted<string>
  /** The API's base URL, without `/v1` (default `https://api.anthropic.com`): a proxy, or a stub in tests. */
  readonly apiUrl?: string | undefined
  /** The most tokens the model may write in one turn (default `@effect/ai-anthropic`'s, 4096). */
  readonly maxTokens?: number | undefined
}

const isHttpUrl = (input: unknown): string | undefined => {
  if (typeof input !== "string") return "must be an http(s) URL"
  const url = URL.canParse(input) ? new URL(input) : undefined
  return url !== undefined && (url.protocol === "http:" || url.protocol === "https:")
    ? undefined
    : "must be an http(s) URL"
}

const decodeOptions = Options_.decoder("Anthropic.make", {
  model: Options_.NonEmptyString,
  apiKey: Options_.worded(
    Schema.RedactedFromSelf(Schema.String).pipe(Schema.filter((key) => Redacted.value(key).length > 0)),
    () => "must be a non-empty Redacted string (Redacted.make(key))"
  ),
  apiUrl: Schema.optionalWith(Options_.ruledString(isHttpUrl), { exact: true }),
  maxTokens: Schema.optionalWith(Options_.PositiveInt, { exact: true }),
  // Checked again by `EffectAi.make` and `InnerLoop.makeAdapter`; here so that the error names `Anthropic.make`.
  maxTurns: Schema.optionalWith(Options_.PositiveInt, { exact: true }),
  stream: Schema.optionalWith(Options_.worded(Schema.Boolean, () => "must be a boolean"), { exact: true }),
  beatInterval: Schema.optionalWith(Options_.duration(), { exact: true })
})

const packages = ["@effect/ai-anthropic", "@effect/ai"]

const modules = Effect.all({
  AnthropicClient: Optional.load(packages, "Anthropic.make", () => import("@effect/ai-anthropic/AnthropicClient")),
  AnthropicLanguageModel: Optional.load(
    packages,
    "Anthropic.make",
    () => import("@effect/ai-anthropic/AnthropicLanguageModel")
  ),
  LanguageModel: Optional.load(packages, "Anthropic.make", () => import("@effect/ai/LanguageModel"))
})

/**
 * An adapter for Anthropic's Messages API, over the `HttpClient` in the context (its connections live in the
 * scope). Bad options are a `ParseError` naming them; a missing `@effect/ai-anthropic` is a
 * `MissingPackageError`.
 *
 * @category constructors
 */
export const make = (
  options: Options
): Effect.Effect<
  ProviderAdapter["Type"],
  ParseResult.ParseError | MissingPackageError,
  HttpClient.HttpClient | Scope.Scope
> =>
  Effect.gen(function*() {
    const { apiKey, apiUrl, maxTokens, model } = yield* decodeOptions(options)
    const { AnthropicClient, AnthropicLanguageModel, LanguageModel } = yield* modules
    const client = yield* AnthropicClient.make({ apiKey, ...(apiUrl !== undefined ? { apiUrl } : {}) })
    const languageModel = yield* AnthropicLanguageModel.make({
      model,
      ...(maxTokens !== undefined ? { config: { max_tokens: maxTokens } } : {})
    }).pipe(Effect.provideService(AnthropicClient.AnthropicClient, client))
    const { beatInterval, maxTurns, retry, stream } = options
    return yield* EffectAi.make({ retry, maxTurns, stream, beatInterval }).pipe(
      Effect.provideService(LanguageModel.LanguageModel, languageModel)
    )
  })

/**
 * The adapter as the `ProviderAdapter` service.
 *
 * @category layers
 */
export const layer = (
  options: Options
): Layer.Layer<ProviderAdapter, ParseResult.ParseError | MissingPackageError, HttpClient.HttpClient> =>
  Layer.scoped(ProviderAdapter, make(options))
