/**
 * The EffectAi adapter over @effect/ai-openai, against a small
 * OpenAI-compatible server started on a free local port (real HTTP). The
 * server replies from a script: first a tool call, then a structured answer.
 * With `stream: true` it runs the streaming suite (`support/streamingAgent.ts`)
 * against a stubbed `HttpClient` that writes the Responses API's server-sent
 * events on the TestClock.
 */
import { OpenAiClient, OpenAiLanguageModel } from "@effect/ai-openai"
import { FetchHttpClient, HttpClient } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import type { Duration } from "effect"
import { Effect, Layer, Redacted } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as EffectAi from "../src/adapters/EffectAi.js"
import * as Prompt from "../src/Prompt.js"
import * as Session from "../src/Session.js"
import { journalFree } from "./support/journalFree.js"
import type { SseEvent, SseReply } from "./support/sse.js"
import { sseClient } from "./support/sse.js"
import type { StreamingProvider } from "./support/streamingAgent.js"
import {
  cutShortUnderAgent,
  memoryMailboxes,
  realClockDeadlinePhase,
  streamingSuite
} from "./support/streamingAgent.js"
import { weatherPrompt } from "./support/weather.js"

const responseEnvelope = (
  id: string,
  output: ReadonlyArray<unknown>,
  usage: { input: number; output: number },
  status: "completed" | "in_progress" = "completed"
) => ({
  id,
  object: "response",
  created_at: 0,
  status,
  error: null,
  incomplete_details: null,
  instructions: null,
  model: "stub-model",
  output,
  parallel_tool_calls: true,
  tool_choice: "auto",
  tools: [],
  metadata: {},
  temperature: null,
  top_p: null,
  usage: {
    input_tokens: usage.input,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: usage.output,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: usage.input + usage.output
  }
})

const script = [
  responseEnvelope("resp_1", [{
    type: "function_call",
    id: "fc_1",
    call_id: "call_1",
    name: "lookup_weather",
    arguments: JSON.stringify({ city: "Paris" }),
    status: "completed"
  }], { input: 50, output: 10 }),
  responseEnvelope("resp_2", [{
    type: "message",
    id: "msg_1",
    role: "assistant",
    status: "completed",
    content: [{ type: "output_text", text: JSON.stringify({ city: "Paris", celsius: 21 }), annotations: [] }]
  }], { input: 80, output: 12 })
]

/** Serves the script on a free port; records the request bodies. */
const stubServer = Effect.acquireRelease(
  Effect.async<{ readonly url: string; readonly bodies: Array<Record<string, unknown>>; readonly close: () => void }>(
    (resume) => {
      const bodies: Array<Record<string, unknown>> = []
      const server = createServer((request, response) => {
        let raw = ""
        request.on("data", (chunk) => (raw += chunk))
        request.on("end", () => {
          bodies.push(JSON.parse(raw || "{}"))
          const reply = script[bodies.length - 1]
          response.writeHead(reply === undefined ? 500 : 200, { "content-type": "application/json" })
          response.end(JSON.stringify(reply ?? { error: { message: "script exhausted" } }))
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}/v1`, bodies, close: () => server.close() }))
      })
    }
  ),
  (stub) => Effect.sync(() => stub.close())
)

describe("EffectAi adapter (OpenAI-compatible server over real HTTP)", () => {
  it.live("a tool call and a final structured output round-trip, with usage in the session", () =>
    Effect.gen(function*() {
      const stub = yield* stubServer
      const prompt = weatherPrompt
      const session = yield* Session.make
      const adapter = yield* EffectAi.make().pipe(
        Effect.provide(
          OpenAiLanguageModel.layer({ model: "stub-model" }).pipe(
            Layer.provide(OpenAiClient.layer({ apiKey: Redacted.make("test-key"), apiUrl: stub.url })),
            Layer.provide(FetchHttpClient.layer)
          )
        )
      )
      const response = yield* adapter.evaluate(prompt, { session })
      expect(response.output).toEqual({ city: "Paris", celsius: 21 })
      expect(response.usage).toEqual({ inputTokens: 130, outputTokens: 22 })
      const events = yield* session.events
      expect(events.filter((e) => e._tag === "ToolCall")).toMatchObject([{
        toolName: "lookup_weather",
        params: { city: "Paris" }
      }])
      expect(yield* session.usage).toEqual({ inputTokens: 130, outputTokens: 22 })

      // What the provider saw: the tool's JSON Schema, then the tool's result in the follow-up request.
      expect(stub.bodies.length).toBe(2)
      expect(JSON.stringify(stub.bodies[0]!["tools"])).toContain("lookup_weather")
      expect(JSON.stringify(stub.bodies[0]!["tools"])).toContain("\"city\"")
      expect(JSON.stringify(stub.bodies[1]!["input"])).toContain("celsius")
    }).pipe(Effect.scoped))
})

/**
 * A streamed Responses API answer: `response.created` (after `first`), one output item whose `deltas` come one
 * every `every`, the item done, then `response.completed` with the usage.
 */
const responseStream = (options: {
  readonly item: Record<string, unknown>
  readonly done: Record<string, unknown>
  readonly deltas: ReadonlyArray<Record<string, unknown>>
  readonly first?: Duration.DurationInput | undefined
  readonly every: Duration.DurationInput
  readonly usage: { readonly input: number; readonly output: number }
  readonly stallAfter?: number | undefined
  readonly cutShort?: boolean | undefined
}): SseReply => {
  let sequence = 0
  const event = (
    data: Record<string, unknown> & { readonly type: string },
    after?: Duration.DurationInput
  ): SseEvent => ({
    event: data.type,
    data: { ...data, sequence_number: sequence++ },
    ...(after !== undefined ? { after } : {})
  })
  const start = [
    event(
      { type: "response.created", response: responseEnvelope("resp_s", [], options.usage, "in_progress") },
      options.first
    ),
    event({ type: "response.output_item.added", output_index: 0, item: options.item })
  ]
  const deltas = options.deltas.map((delta, i) =>
    event({ ...delta, type: delta["type"] as string, output_index: 0 }, i === 0 ? undefined : options.every)
  )
  if (options.stallAfter !== undefined) return [...start, ...deltas.slice(0, options.stallAfter), "stall"]
  return [
    ...start,
    ...deltas,
    event({ type: "response.output_item.done", output_index: 0, item: options.done }),
    // Cut short: the item is done, the final event never came (the connection closed).
    ...(options.cutShort === true
      ? []
      : [event({ type: "response.completed", response: responseEnvelope("resp_s", [options.done], options.usage) })])
  ]
}

/** A message that never ends: `response.created`, the item added, each of `deltas` at once, then a stall. */
function* endlessResponse(deltas: Iterable<string>): Generator<SseEvent | "stall"> {
  const message = { type: "message", id: "msg_1", role: "assistant", status: "in_progress", content: [] }
  const [created, added] = responseStream({
    item: message,
    done: message,
    deltas: [],
    every: 0,
    usage: { input: 1, output: 1 }
  }) as ReadonlyArray<SseEvent>
  yield created!
  yield added!
  let sequence = 2
  for (const delta of deltas) {
    yield {
      event: "response.output_text.delta",
      data: {
        type: "response.output_text.delta",
        item_id: "msg_1",
        output_index: 0,
        content_index: 0,
        delta,
        sequence_number: sequence++
      }
    }
  }
  yield "stall" // the connection stays open: the final event never comes
}

describe("EffectAi streaming: a final event without usage", () => {
  it.effect("a response.completed that carries no usage is a failed response (phase response), never charged 0", () =>
    Effect.gen(function*() {
      const text = openAi.text({ pieces: ["fine"], every: "1 second", usage: { input: 1, output: 1 } })
      const events = [...text] as Array<SseEvent>
      const last = events.at(-1)!
      const response = { ...(last.data as { response: Record<string, unknown> }).response }
      delete response["usage"]
      events[events.length - 1] = { ...last, data: { ...(last.data as object), response } }
      const stub = sseClient([events])
      const adapter = yield* openAi.adapter(stub.client)
      const error = yield* Effect.flip(journalFree(adapter.evaluate(
        Prompt.make({ name: "essay", instructions: "", input: "write" }),
        { session: yield* Session.make }
      )))
      expect([error.phase, error.reason]).toEqual(["response", "provider"])
      expect(error.detail).toContain("no token usage")
    }).pipe(Effect.scoped))
})

const openAi: StreamingProvider = {
  name: "EffectAi over @effect/ai-openai",
  adapter: (client, options) =>
    EffectAi.make({ stream: true, retry: options?.retry }).pipe(
      Effect.provide(
        OpenAiLanguageModel.layer({ model: "stub-model" }).pipe(
          Layer.provide(OpenAiClient.layer({ apiKey: Redacted.make("test-key"), apiUrl: "http://stub/v1" })),
          Layer.provide(Layer.succeed(HttpClient.HttpClient, client))
        )
      )
    ),
  finalEvent: "response.completed",
  endless: endlessResponse,
  text: ({ cutShort, every, first, pieces, stallAfter, usage }) => {
    const message = { type: "message", id: "msg_1", role: "assistant" }
    return responseStream({
      item: { ...message, status: "in_progress", content: [] },
      done: {
        ...message,
        status: "completed",
        content: [{ type: "output_text", text: pieces.join(""), annotations: [] }]
      },
      deltas: pieces.map((delta) => ({
        type: "response.output_text.delta",
        item_id: "msg_1",
        content_index: 0,
        delta
      })),
      first,
      every,
      usage,
      stallAfter,
      cutShort
    })
  },
  toolCall: ({ every, id, name, pieces, usage }) => {
    const call = { type: "function_call", id: "fc_1", call_id: id, name }
    return responseStream({
      item: { ...call, arguments: "", status: "in_progress" },
      done: { ...call, arguments: pieces.join(""), status: "completed" },
      deltas: pieces.map((delta) => ({ type: "response.function_call_arguments.delta", item_id: "fc_1", delta })),
      every,
      usage
    })
  }
}

streamingSuite(openAi)
realClockDeadlinePhase(openAi)
cutShortUnderAgent(openAi, "memory", memoryMailboxes)
