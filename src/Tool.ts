/**
 * Tool: a function the model may call, with Schemas for its parameters and
 * its result.
 *
 * The handler gets a `ToolContext`: the active deadline, the heartbeat
 * (`beat` proves progress and keeps the request leased; it is a no-op when
 * there is no heartbeat), the run context, the prompt and the session. The
 * handler also runs under that heartbeat as the current one, so
 * `Heartbeat.beat` anywhere inside it — a helper calls deep, a fiber it
 * forks — beats the same heartbeat with nothing passed down. A tool
 * that fails does not crash the evaluation: the failure becomes a
 * `ToolResult.error` the model sees. Only a deadline ends the evaluation.
 *
 * With a journal (see `Journal`), a tool's result is recorded, and a
 * redelivered request gets it back without running the tool again
 * (`replay: "journal"`, the default). A tool that must run again — it reads
 * state that may have changed — says `replay: "rerun"`. Either way the
 * context's `idempotencyKey` is the same on every delivery of the message:
 * pass it to the services a tool changes outside leasehold, so a step that
 * ran but was not recorded (the worker died in between) does not act twice.
 * It is the stored message's own name and the step's key — never the sender's
 * request id, so two messages sent with the same request id get different
 * keys. `fencingToken` (the attempt: the message's delivery count) grows with
 * every delivery: a store that keeps the highest token it accepted for the
 * key's message and refuses lower ones refuses a zombie — an earlier delivery
 * still running after the message was redelivered.
 */
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import type * as Schema from "effect/Schema"
import type * as Budget from "./Budget.js"
import type * as Deadline from "./Deadline.js"
import type * as Heartbeat from "./Heartbeat.js"
import type * as Journal from "./Journal.js"
import type * as Prompt from "./Prompt.js"
import type * as ProviderAdapter from "./ProviderAdapter.js"
import type { RunContext } from "./RunContext.js"
import type * as Session from "./Session.js"

/**
 * What a tool handler receives besides its parameters.
 *
 * @category models
 */
export interface ToolContext {
  readonly deadline: Deadline.Deadline | undefined
  readonly heartbeat: Heartbeat.Heartbeat | undefined
  /** Proves progress; a no-op without a heartbeat. The same as `Heartbeat.beat` inside the handler. */
  readonly beat: Effect.Effect<void>
  readonly runContext: RunContext | undefined
  readonly prompt: Prompt.Prompt<unknown>
  readonly session: Session.Session
  readonly budgetTracker: Budget.BudgetTracker | undefined
  /** The adapter evaluating the prompt, for subagents. */
  readonly adapter: ProviderAdapter.ProviderAdapter["Type"]
  /** The journal of the steps inside this tool call (a subagent's), when the run keeps one. */
  readonly journal: Journal.Journal | undefined
  /**
   * For side effects outside leasehold: `<message identity>/<step key>`, the same on every delivery of the message
   * and different for any other message (whatever request id it carries; another queue, prefix or database).
   * The identity is the stored message's (`Journal.identity`); without a journaling mailbox, the session's id.
   */
  readonly idempotencyKey: string
  /**
   * The fencing token of this delivery: the attempt (`runContext.attempt`, the message's delivery count), higher on
   * every redelivery. Hand it to storage with the key: it keeps the highest token it accepted and refuses a
   * lower one, so a zombie (an earlier delivery still running) cannot overwrite the current one. `undefined`
   * outside a loop (no run context).
   */
  readonly fencingToken: number | undefined
}

/**
 * How a recorded tool call is replayed on redelivery: its recorded result (`"journal"`), or by running it again
 * (`"rerun"`).
 *
 * @category models
 */
export type Replay = "journal" | "rerun"

/**
 * What the model sees of a tool call: its encoded result, or an error message.
 *
 * @category models
 */
export type ToolResult = Data.TaggedEnum<{
  Ok: { readonly value: unknown }
  Error: { readonly message: string }
}>

/**
 * Makes and matches `ToolResult`s (`ToolResult.Ok({ value })`, `ToolResult.Error({ message })`).
 *
 * @category constructors
 */
export const ToolResult = Data.taggedEnum<ToolResult>()

/**
 * A tool with parameters `P` and result `S`.
 *
 * @category models
 */
export interface Tool<P, S, E = never> {
  readonly name: string
  readonly description: string
  readonly parameters: Schema.Schema<P, unknown>
  readonly success: Schema.Schema<S, unknown>
  readonly handler: (params: P, context: ToolContext) => Effect.Effect<S, E>
  /** How a recorded call is replayed (default `"journal"`). */
  readonly replay?: Replay | undefined
}

/**
 * Any tool, as a prompt holds them.
 *
 * @category models
 */
export interface Any {
  readonly name: string
  readonly description: string
  readonly parameters: Schema.Schema<unknown, unknown>
  readonly success: Schema.Schema<unknown, unknown>
  readonly handler: (params: never, context: ToolContext) => Effect.Effect<unknown, unknown>
  readonly replay?: Replay | undefined
}

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options<P, PI, S, SI, E = never> {
  /** The name the model calls it by: unique within a prompt. */
  readonly name: string
  /** What the tool does, for the model. */
  readonly description: string
  /** Decodes the arguments the model wrote (its encoded side is what the model is shown). */
  readonly parameters: Schema.Schema<P, PI>
  /** Encodes the result for the model. */
  readonly success: Schema.Schema<S, SI>
  /** The work; a failure becomes a `ToolResult.Error` the model sees. */
  readonly handler: (params: P, context: ToolContext) => Effect.Effect<S, E>
  /**
   * On redelivery, reuse the recorded result (`"journal"`, the default) or run the tool again (`"rerun"`: it reads
   * fresh state). A rerun tool whose result changed discards what was recorded after it: the run goes on live.
   */
  readonly replay?: Replay | undefined
}

/**
 * Makes a tool. Its name must be unique within a prompt.
 *
 * @category constructors
 */
export const make = <P, PI, S, SI, E = never>(options: Options<P, PI, S, SI, E>): Tool<P, S, E> & Any =>
  options as unknown as Tool<P, S, E> & Any
