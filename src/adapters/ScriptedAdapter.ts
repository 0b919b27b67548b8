/**
 * ScriptedAdapter: a deterministic "model" that replays scripted turns —
 * tool calls, final texts or outputs, token usage and latency (slept on
 * `Clock`, so `TestClock` drives it) — for tests, examples and demos. It
 * records every request that reached it, so a test can prove one did not.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Ref from "effect/Ref"
import * as Schema from "effect/Schema"
import * as InnerLoop from "../InnerLoop.js"
import * as Options_ from "../internal/options.js"
import { ProviderAdapter } from "../ProviderAdapter.js"

type ProviderAdapterService = ProviderAdapter["Type"]

/**
 * One scripted model turn.
 *
 * @category models
 */
export interface ScriptedTurn {
  /** Tools the model calls this turn (ids default to `call-N`). */
  readonly toolCalls?: ReadonlyArray<{ readonly name: string; readonly params: unknown; readonly id?: string }>
  /** The final text (when there are no tool calls). */
  readonly text?: string
  /** A final structured output; sent as its JSON text. */
  readonly output?: unknown
  readonly usage?: { readonly inputTokens?: number; readonly outputTokens?: number }
  /** How long the model "thinks" before answering. */
  readonly latency?: Duration.DurationInput
  /** Fail this turn with a provider error. */
  readonly fail?: string
}

/**
 * A scripted adapter, and the requests it received.
 *
 * @category models
 */
export interface Scripted extends ProviderAdapterService {
  readonly requests: Effect.Effect<ReadonlyArray<InnerLoop.ModelRequest>>
}

/** The turns' timing, checked when the script is made (a latency that cannot be slept is a `ParseError`). */
const decodeTurns = Options_.decoder("ScriptedAdapter.make", {
  turns: Schema.Array(
    Schema.Struct({ latency: Schema.optionalWith(Options_.duration({ max: Duration.hours(24) }), { exact: true }) })
  )
})

/**
 * Replays `turns` in order across every evaluation; a request past the end is a provider error. Bad options
 * are a `ParseError` naming them (see `InnerLoop.makeAdapter`).
 *
 * @category constructors
 */
export const make = (
  turns: ReadonlyArray<ScriptedTurn>,
  options?: InnerLoop.Options
): Effect.Effect<Scripted, ParseResult.ParseError> =>
  Effect.gen(function*() {
    yield* decodeTurns({ turns })
    const next = yield* Ref.make(0)
    const received = yield* Ref.make<ReadonlyArray<InnerLoop.ModelRequest>>([])
    const complete: InnerLoop.Complete = (request) =>
      Effect.gen(function*() {
        yield* Ref.update(received, (all) => [...all, request])
        const index = yield* Ref.getAndUpdate(next, (n) => n + 1)
        const turn = turns[index]
        if (turn === undefined) {
          return yield* new InnerLoop.ProviderError({ detail: `the script has only ${turns.length} turns` })
        }
        if (turn.latency !== undefined) yield* Effect.sleep(turn.latency)
        if (turn.fail !== undefined) return yield* new InnerLoop.ProviderError({ detail: turn.fail })
        return {
          text: turn.output !== undefined ? JSON.stringify(turn.output) : turn.text ?? "",
          toolCalls: (turn.toolCalls ?? []).map((call, i) => ({
            id: call.id ?? `call-${index + 1}-${i + 1}`,
            name: call.name,
            params: call.params
          })),
          usage: { inputTokens: turn.usage?.inputTokens ?? 0, outputTokens: turn.usage?.outputTokens ?? 0 }
        }
      })
    return { ...yield* InnerLoop.makeAdapter("scripted", complete, options), requests: Ref.get(received) }
  })

/**
 * The scripted adapter as the `ProviderAdapter` service.
 *
 * @category layers
 */
export const layer = (
  turns: ReadonlyArray<ScriptedTurn>,
  options?: InnerLoop.Options
): Layer.Layer<ProviderAdapter, ParseResult.ParseError> => Layer.effect(ProviderAdapter, make(turns, options))
