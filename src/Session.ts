/**
 * Session: the record of one evaluation — every provider call, tool call and
 * tool result with its timing and token usage — kept so evaluators, reports
 * and operators can see what an agent actually did.
 */
import * as Effect from "effect/Effect"
import * as Ref from "effect/Ref"
import { randomUUID } from "node:crypto"

/**
 * Tokens one provider call used.
 *
 * @category models
 */
export interface Usage {
  readonly inputTokens: number
  readonly outputTokens: number
}

/**
 * What happened during an evaluation, in order.
 *
 * @category models
 */
export type SessionEvent =
  | {
    readonly _tag: "ProviderCall"
    readonly promptName: string
    readonly at: number
    readonly durationMs: number
    readonly usage: Usage
    /** Replayed from the journal: the provider was not called (its duration is the recorded one). */
    readonly replayed?: boolean | undefined
  }
  | {
    readonly _tag: "ToolCall"
    readonly promptName: string
    readonly toolName: string
    readonly callId: string
    readonly params: unknown
    readonly at: number
    /** Replayed from the journal (the tool ran on an earlier delivery). */
    readonly replayed?: boolean | undefined
  }
  | {
    readonly _tag: "ToolResult"
    readonly promptName: string
    readonly toolName: string
    readonly callId: string
    readonly ok: boolean
    readonly value: unknown
    readonly durationMs: number
    /** Replayed from the journal: the tool did not run now. */
    readonly replayed?: boolean | undefined
  }

/**
 * The event log of one evaluation (subagents write to their parent's session).
 *
 * @category models
 */
export interface Session {
  readonly id: string
  readonly record: (event: SessionEvent) => Effect.Effect<void>
  readonly events: Effect.Effect<ReadonlyArray<SessionEvent>>
  /** Tokens used by every provider call so far. */
  readonly usage: Effect.Effect<Usage>
}

/**
 * Makes an empty session.
 *
 * @category constructors
 */
export const make: Effect.Effect<Session> = Effect.map(Ref.make<ReadonlyArray<SessionEvent>>([]), (events) => ({
  id: randomUUID(),
  record: (event) => Ref.update(events, (all) => [...all, event]),
  events: Ref.get(events),
  usage: Effect.map(Ref.get(events), (all) =>
    all.reduce(
      (sum, event) =>
        event._tag === "ProviderCall"
          ? {
            inputTokens: sum.inputTokens + event.usage.inputTokens,
            outputTokens: sum.outputTokens + event.usage.outputTokens
          }
          : sum,
      { inputTokens: 0, outputTokens: 0 }
    ))
}))
