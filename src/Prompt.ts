/**
 * Prompt: what an agent is asked — a name, instructions, the conversation so
 * far, the tools it may call, and optionally a Schema its final answer must
 * decode with (the answer is then JSON).
 */
import type * as Schema from "effect/Schema"
import type * as Tool from "./Tool.js"

/**
 * One message of a conversation.
 *
 * @category models
 */
export interface ChatMessage {
  readonly role: "system" | "user" | "assistant" | "tool"
  readonly content: string
  /** On a tool message: the call it answers, and the tool's name. */
  readonly toolCallId?: string | undefined
  readonly toolName?: string | undefined
  /** On an assistant message: the tools it asked for. */
  readonly toolCalls?: ReadonlyArray<ToolCall> | undefined
}

/**
 * A tool the model asked for, with its arguments as the model wrote them.
 *
 * @category models
 */
export interface ToolCall {
  readonly id: string
  readonly name: string
  readonly params: unknown
}

/**
 * A prompt whose final output is `Out`.
 *
 * @category models
 */
export interface Prompt<Out = string> {
  readonly name: string
  readonly instructions: string
  readonly messages: ReadonlyArray<ChatMessage>
  readonly tools: ReadonlyArray<Tool.Any>
  /** Without it, the output is the final text. */
  readonly output: Schema.Schema<Out, unknown> | undefined
}

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options<Out = string, I = unknown> {
  /** Names the prompt in sessions, logs and errors. */
  readonly name: string
  /** The system message. */
  readonly instructions: string
  /** Shorthand for a single user message, after `messages`. */
  readonly input?: string
  /** The conversation so far. */
  readonly messages?: ReadonlyArray<ChatMessage>
  /** Tools the model may call (names unique within the prompt). */
  readonly tools?: ReadonlyArray<Tool.Any>
  /** The final answer's Schema (the answer is then JSON); without it the output is the final text. */
  readonly output?: Schema.Schema<Out, I>
}

/**
 * Makes a prompt; `input` is shorthand for a single user message.
 *
 * @category constructors
 */
export const make = <Out = string, I = unknown>(options: Options<Out, I>): Prompt<Out> => ({
  name: options.name,
  instructions: options.instructions,
  messages: [
    ...(options.messages ?? []),
    ...(options.input !== undefined ? [{ role: "user" as const, content: options.input }] : [])
  ],
  tools: options.tools ?? [],
  // The encoded side only matters to decoding, which takes unknown input.
  output: options.output as Schema.Schema<Out, unknown> | undefined
})
