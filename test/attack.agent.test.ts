/**
 * Hostile-provider / careless-tool attacks on the agent path (streaming, limits, beats, deadlines, divergence,
 * journal lifetime). Each test states the documented claim it checks.
 */
import { OpenAiClient, OpenAiLanguageModel } from "@effect/ai-openai"
import { HttpClient, HttpClientResponse } from "@effect/platform"
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Option, Redacted, Ref, Schedule, Schema, Stream } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Anthropic from "../src/adapters/Anthropic.js"
import * as EffectAi from "../src/adapters/EffectAi.js"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import * as DeadLetter from "../src/DeadLetter.js"
import * as Deadline from "../src/Deadline.js"
import * as Heartbeat from "../src/Heartbeat.js"
import * as InnerLoop from "../src/InnerLoop.js"
import * as Journal from "../src/Journal.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import * as Retention from "../src/Retention.js"
import * as Session from "../src/Session.js"
import * as Tool from "../src/Tool.js"
import { journalFree } from "./support/journalFree.js"
import { memoryMailboxes } from "./support/streamingAgent.js"

// ---------------------------------------------------------------------------------------------------------------
// A raw SSE client: each reply is a list of chunks (strings or bytes) written as they are, so a test controls the
// exact bytes and where chunk boundaries fall. "stall" keeps the connection open; "reset" errors the body.
// ---------------------------------------------------------------------------------------------------------------
type Chunk = string | Uint8Array | "stall" | "reset"
const encoder = new TextEncoder()
const rawClient = (replies: ReadonlyArray<Iterable<Chunk>>) => {
  const bodies: Array<unknown> = []
  const client = HttpClient.make((request) =>
    Effect.sync(() => {
      bodies.push(request.body)
      const reply = replies[bodies.length - 1]
      if (reply === undefined) {
        return HttpClientResponse.fromWeb(request, new Response("{\"error\":\"script over\"}", { status: 500 }))
      }
      const it = reply[Symbol.iterator]()
      const readable = new ReadableStream<Uint8Array>({
        pull(controller) {
          const next = it.next()
          if (next.done === true) return controller.close()
          const chunk = next.value
          if (chunk === "stall") return new Promise<void>(() => {})
          if (chunk === "reset") return controller.error(new Error("ECONNRESET"))
          controller.enqueue(typeof chunk === "string" ? encoder.encode(chunk) : chunk)
        }
      })
      return HttpClientResponse.fromWeb(
        request,
        new Response(readable, { status: 200, headers: { "content-type": "text/event-stream" } })
      )
    })
  )
  return { client, bodies }
}

const sse = (data: unknown, event?: string) =>
  `${event === undefined ? "" : `event: ${event}\n`}data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`

// --- OpenAI Responses API events ----------------------------------------------------------------------------
const envelope = (usage: unknown, status = "completed", output: ReadonlyArray<unknown> = []) => ({
  id: "resp_a",
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
  ...(usage === undefined ? {} : { usage })
})
const oaUsage = (input: number | string, output: number | string) =>
  `{"input_tokens":${input},"input_tokens_details":{"cached_tokens":0},"output_tokens":${output},` +
  `"output_tokens_details":{"reasoning_tokens":0},"total_tokens":0}`
let seq = 0
const oa = (data: Record<string, unknown>) => sse({ ...data, sequence_number: seq++ }, data["type"] as string)
const oaStart = () => [
  oa({ type: "response.created", response: envelope(undefined, "in_progress") }),
  oa({
    type: "response.output_item.added",
    output_index: 0,
    item: { type: "message", id: "msg_1", role: "assistant", status: "in_progress", content: [] }
  })
]
const oaDelta = (delta: string) =>
  oa({ type: "response.output_text.delta", item_id: "msg_1", output_index: 0, content_index: 0, delta })
const oaDone = (text: string) =>
  oa({
    type: "response.output_item.done",
    output_index: 0,
    item: {
      type: "message",
      id: "msg_1",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text, annotations: [] }]
    }
  })
/** response.completed with a raw usage JSON text (so a test can write 1e400, -3, 1.5). */
const oaCompletedRaw = (usageJson: string) => {
  const body = JSON.stringify({ type: "response.completed", response: envelope("__USAGE__"), sequence_number: seq++ })
  return `event: response.completed\ndata: ${body.replace("\"__USAGE__\"", usageJson)}\n\n`
}
const oaText = (pieces: ReadonlyArray<string>, usageJson = oaUsage(3, 4)): Array<string> => [
  ...oaStart(),
  ...pieces.map(oaDelta),
  oaDone(pieces.join("")),
  oaCompletedRaw(usageJson)
]

const openAiAdapter = (client: HttpClient.HttpClient, options?: EffectAi.Options) =>
  EffectAi.make({ stream: true, ...options }).pipe(
    Effect.provide(
      OpenAiLanguageModel.layer({ model: "stub-model" }).pipe(
        Layer.provide(OpenAiClient.layer({ apiKey: Redacted.make("k"), apiUrl: "http://stub/v1" })),
        Layer.provide(Layer.succeed(HttpClient.HttpClient, client))
      )
    )
  )

// --- Anthropic Messages API events --------------------------------------------------------------------------
const an = (data: Record<string, unknown>) => sse(data, data["type"] as string)
const anStart = (block: unknown = { type: "text", text: "" }) => [
  an({
    type: "message_start",
    message: {
      id: "msg_a",
      type: "message",
      role: "assistant",
      model: "claude-stub",
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 3, output_tokens: 1 }
    }
  }),
  an({ type: "content_block_start", index: 0, content_block: block })
]
const anText = (text: string) => an({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text } })
const anEnd = (stopReason = "end_turn", output = 4) => [
  an({ type: "content_block_stop", index: 0 }),
  an({
    type: "message_delta",
    delta: { stop_reason: stopReason, stop_sequence: null },
    usage: { output_tokens: output }
  }),
  an({ type: "message_stop" })
]
const anthropicAdapter = (client: HttpClient.HttpClient, retry?: InnerLoop.Options["retry"]) =>
  Anthropic.make({ model: "claude-stub", apiKey: Redacted.make("k"), stream: true, retry }).pipe(
    Effect.provideService(HttpClient.HttpClient, client)
  )

const essay = Prompt.make({ name: "essay", instructions: "", input: "write" })

const evaluate = (adapter: Effect.Effect.Success<ReturnType<typeof openAiAdapter>>) =>
  Effect.flatMap(Session.make, (session) => Effect.either(journalFree(adapter.evaluate(essay, { session }))))

/** Under MainLoop.agent on the memory mailbox (journaled): one delivery, and what came of it. */
const underAgent = (adapter: Effect.Effect.Success<ReturnType<typeof openAiAdapter>>, requestId: string) =>
  Effect.gen(function*() {
    const env = yield* memoryMailboxes
    const id = yield* env.requests.send(MainLoop.request("write", { requestId }), { replyTo: "responses" })
    const loop = yield* MainLoop.agent({
      requests: env.requests,
      adapter,
      prepare: (request: string) => Effect.succeed(Prompt.make({ name: "essay", instructions: "", input: request }))
    }).pipe(Effect.provideService(MailboxResolver, env.resolver))
    yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
    const replies = yield* env.responses.receive()
    return { replies, steps: yield* env.steps(id), queued: yield* env.requests.approximateCount }
  })

// ===============================================================================================================
// 1. Only a complete answer is an answer
// ===============================================================================================================
describe("attack 1: only a complete answer is an answer", () => {
  it.live("1a OpenAI: final event then more text — the text after response.completed is not part of the answer", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...oaText(["real "]), oaDelta("INJECTED-AFTER-FINAL")]])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      // Either it is rejected as a broken answer, or the answer is only what came before the final event.
      if (result._tag === "Right") expect(result.right.text).toBe("real ")
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  it.live("1a' Anthropic: message_stop then more text — not part of the answer", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...anStart(), anText("real "), ...anEnd(), anText("INJECTED")]])
      const adapter = yield* anthropicAdapter(stub.client)
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      if (result._tag === "Right") expect(result.right.text).toBe("real ")
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  it.live("1b OpenAI: final event duplicated — usage is not silently replaced / doubled", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...oaText(["ok"], oaUsage(3, 4)), oaCompletedRaw(oaUsage(1, 1))]])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      if (result._tag === "Right") expect(result.right.usage).toEqual({ inputTokens: 3, outputTokens: 4 })
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  for (
    const [label, usage] of [
      ["negative", oaUsage(-5, 4)],
      ["fractional", oaUsage(1.5, 4)],
      ["1e400 (Infinity)", oaUsage("1e400", 4)],
      ["huge 1e300", oaUsage("1e300", 4)]
    ] as const
  ) {
    it.live(`1c OpenAI: usage ${label} without a budget is not returned as the answer's usage`, () =>
      Effect.gen(function*() {
        const stub = rawClient([oaText(["ok"], usage)])
        const result = yield* evaluate(yield* openAiAdapter(stub.client))
        if (result._tag === "Right") {
          // An answer must carry a chargeable (non-negative integer) usage.
          expect(Number.isSafeInteger(result.right.usage.inputTokens) && result.right.usage.inputTokens >= 0).toBe(true)
        } else {
          expect([result.left.phase, result.left.reason]).toEqual(["response", "provider"])
        }
      }).pipe(Effect.scoped))

    it.live(`1d OpenAI under MainLoop.agent: usage ${label} is a typed provider failure, not a journal defect`, () =>
      Effect.gen(function*() {
        const stub = rawClient([oaText(["ok"], usage)])
        const out = yield* underAgent(yield* openAiAdapter(stub.client), `usage-${label}`)
        const error = out.replies[0]?.body.error
        // Documented: a turn that cannot be charged is a PromptEvaluationError phase response / provider (retried);
        // what we check: whatever it is, it is not a journal 'undecodable' error, and no answer was replied.
        expect(out.replies[0]?.body.output).toBeUndefined()
        if (error !== undefined) {
          expect(error.details).toMatchObject({ phase: "response", reason: "provider" })
        }
      }).pipe(Effect.scoped))
  }

  it.live("1d' OpenAI under MainLoop.agent with retry: one negative-usage final event, then a good answer", () =>
    Effect.gen(function*() {
      // The analogue of a final event without usage (documented: retried): a turn that cannot be charged.
      const stub = rawClient([oaText(["bad"], oaUsage(-5, 4)), oaText(["good"], oaUsage(3, 4))])
      const adapter = yield* openAiAdapter(stub.client, { retry: Schedule.recurs(2) })
      const out = yield* underAgent(adapter, "neg-retry")
      const body = out.replies[0]?.body
      console.log("1d' reply:", body?.output, body?.error?.tag, body?.error?.details, "requests", stub.bodies.length)
      expect(body?.error).toBeUndefined()
      expect(body?.output).toBe("good")
    }).pipe(Effect.scoped))

  it.live("1c' OpenAI: a negative usage is reported as unchargeable usage, not as a stream cut short", () =>
    Effect.gen(function*() {
      const stub = rawClient([oaText(["ok"], oaUsage(-5, 4))])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      expect(result._tag).toBe("Left")
      if (result._tag === "Left") {
        expect([result.left.phase, result.left.reason]).toEqual(["response", "provider"])
        expect(result.left.detail).toContain("unchargeable usage")
        expect(result.left.detail).not.toContain("ended before its final event")
      }
    }).pipe(Effect.scoped))

  for (
    const [label, usage] of [
      ["negative", { inputTokens: -1, outputTokens: 2 }],
      ["fractional", { inputTokens: 1, outputTokens: 0.5 }],
      ["NaN", { inputTokens: Number.NaN, outputTokens: 1 }],
      ["Infinity", { inputTokens: 1, outputTokens: Number.POSITIVE_INFINITY }],
      ["unsafe", { inputTokens: 2 ** 60, outputTokens: 1 }]
    ] as const
  ) {
    it.live(`1p hand-written adapter (streamed and whole): usage ${label} is unchargeable, retried, then answered`, () =>
      Effect.gen(function*() {
        const calls = { stream: 0, whole: 0 }
        const good = { inputTokens: 1, outputTokens: 1 }
        const streamed = yield* InnerLoop.makeAdapter("hand", {
          stream: () =>
            Stream.suspend(() =>
              Stream.make<Array<InnerLoop.TurnPart>>(
                { _tag: "Text", delta: calls.stream === 0 ? "bad" : "good" },
                { _tag: "Usage", usage: calls.stream++ === 0 ? usage : good }
              )
            )
        }, { retry: Schedule.recurs(1) })
        const whole = yield* InnerLoop.makeAdapter(
          "hand",
          () =>
            Effect.sync(() => ({
              text: calls.whole === 0 ? "bad" : "good",
              toolCalls: [],
              usage: calls.whole++ === 0 ? usage : good
            })),
          { retry: Schedule.recurs(1) }
        )
        for (const adapter of [streamed, whole]) {
          const result = yield* journalFree(adapter.evaluate(essay, { session: yield* Session.make }))
          expect([result.text, result.usage]).toEqual(["good", good])
        }
        // Without a retry: the typed failure, naming it.
        const once = yield* InnerLoop.makeAdapter("hand", () => Effect.succeed({ text: "x", toolCalls: [], usage }))
        const failed = yield* Effect.flip(journalFree(once.evaluate(essay, { session: yield* Session.make })))
        expect([failed.phase, failed.reason]).toEqual(["response", "provider"])
        expect(failed.detail).toContain("unchargeable usage")
      }).pipe(Effect.scoped))
  }

  it.live("1k hand-written adapter: a Text part after the Usage (final) part is not part of the answer", () =>
    Effect.gen(function*() {
      const adapter = yield* InnerLoop.makeAdapter("hand", {
        stream: () =>
          Stream.make<Array<InnerLoop.TurnPart>>(
            { _tag: "Text", delta: "real" },
            { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } },
            { _tag: "Text", delta: " INJECTED-AFTER-FINAL" }
          )
      })
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      console.log("1k:", result._tag, result._tag === "Right" ? result.right.text : result.left.detail)
      if (result._tag === "Right") expect(result.right.text).toBe("real")
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  it.live("1l hand-written adapter: two Usage parts — the turn is not charged only the last (smaller) one", () =>
    Effect.gen(function*() {
      const adapter = yield* InnerLoop.makeAdapter("hand", {
        stream: () =>
          Stream.make<Array<InnerLoop.TurnPart>>(
            { _tag: "Text", delta: "ok" },
            { _tag: "Usage", usage: { inputTokens: 1000, outputTokens: 1000 } },
            { _tag: "Usage", usage: { inputTokens: 0, outputTokens: 0 } }
          )
      })
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      console.log("1l:", result._tag, result._tag === "Right" ? JSON.stringify(result.right.usage) : result.left.detail)
      if (result._tag === "Right") expect(result.right.usage.inputTokens).toBeGreaterThanOrEqual(1000)
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  it.live("1m Anthropic: message_stop with no message_delta (no output usage) is not an answer charged 0", () =>
    Effect.gen(function*() {
      const stub = rawClient([[
        ...anStart(),
        anText("hi"),
        an({ type: "content_block_stop", index: 0 }),
        an({ type: "message_stop" })
      ]])
      const adapter = yield* anthropicAdapter(stub.client)
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      console.log("1m:", result._tag, result._tag === "Right" ? JSON.stringify(result.right.usage) : result.left.detail)
      if (result._tag === "Right") expect(result.right.usage.outputTokens).toBeGreaterThan(0)
      else expect([result.left.phase, result.left.reason]).toEqual(["response", "provider"])
    }).pipe(Effect.scoped))

  it.live("1n Anthropic: negative output usage under MainLoop.agent is a provider failure (the SDK rejects the event)", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...anStart(), anText("hi"), ...anEnd("end_turn", -7)]])
      const out = yield* underAgent(yield* anthropicAdapter(stub.client), "an-neg")
      const body = out.replies[0]?.body
      console.log("1n:", body?.output, body?.error?.tag, JSON.stringify(body?.error?.details))
      expect(body?.output).toBeUndefined()
      // A malformed event is a broken stream (reason provider); the model had started answering, so it is reported
      // in phase "response" (it was "request" before).
      if (body?.error !== undefined) expect(body.error.details).toMatchObject({ phase: "response", reason: "provider" })
    }).pipe(Effect.scoped))

  it.live("1o Anthropic: an error event mid-stream (overloaded) is retried, the retry's answer is the answer", () =>
    Effect.gen(function*() {
      const stub = rawClient([
        [
          ...anStart(),
          anText("half"),
          an({ type: "error", error: { type: "overloaded_error", message: "Overloaded" } })
        ],
        [...anStart(), anText("whole"), ...anEnd()]
      ])
      const adapter = yield* anthropicAdapter(stub.client, Schedule.recurs(1))
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      console.log("1o:", result._tag, result._tag === "Right" ? result.right.text : result.left.detail)
      expect(result._tag === "Right" ? result.right.text : result.left.detail).toBe("whole")
    }).pipe(Effect.scoped))

  it.live("1e OpenAI: final event early (before any content) then content — not an answer with content", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...oaStart(), oaCompletedRaw(oaUsage(1, 1)), oaDelta("late content"), oaDone("x")]])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      if (result._tag === "Right") expect(result.right.text).toBe("")
      else expect(result.left.phase).toBe("response")
    }).pipe(Effect.scoped))

  it.live("1f OpenAI: connection reset mid-event — response/provider, not a defect", () =>
    Effect.gen(function*() {
      const full = oaText(["hello world"])
      const last = full.at(-1)!
      const stub = rawClient([[...full.slice(0, -1), last.slice(0, 40), "reset"]])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      expect(result._tag).toBe("Left")
      if (result._tag === "Left") expect(result.left.reason).toBe("provider")
    }).pipe(Effect.scoped))

  it.live("1f' OpenAI: body ends mid-event (half a final event, then EOF) is cut short", () =>
    Effect.gen(function*() {
      const full = oaText(["hello world"])
      const last = full.at(-1)!
      const stub = rawClient([[...full.slice(0, -1), last.slice(0, last.length - 3)]])
      const result = yield* evaluate(yield* openAiAdapter(stub.client))
      expect(result._tag).toBe("Left")
      if (result._tag === "Left") expect([result.left.phase, result.left.reason]).toEqual(["response", "provider"])
    }).pipe(Effect.scoped))

  it.live("1g OpenAI: garbage lines between events do not crash (typed failure or the answer)", () =>
    Effect.gen(function*() {
      const full = oaText(["hello"])
      const stub = rawClient([[
        ": keep-alive comment\n\n",
        "garbage line\n\n",
        ...full.slice(0, 2),
        "data: {not json\n\n",
        ...full.slice(2)
      ]])
      const exit = yield* Effect.exit(evaluate(yield* openAiAdapter(stub.client)))
      expect(exit._tag).toBe("Success") // typed (Either), never a defect
    }).pipe(Effect.scoped))

  it.live("1h Anthropic: stop_reason max_tokens with a final event — what happens to a truncated text", () =>
    Effect.gen(function*() {
      const stub = rawClient([[...anStart(), anText("half of the ans"), ...anEnd("max_tokens")]])
      const adapter = yield* anthropicAdapter(stub.client)
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      // Documentation does not promise a max_tokens answer is rejected; recorded for the report.
      expect(result._tag === "Right" ? result.right.text : result.left.detail).toBeDefined()
      console.log("1h max_tokens ->", result._tag, result._tag === "Right" ? result.right.text : result.left.detail)
    }).pipe(Effect.scoped))

  it.live("1i Anthropic: a tool call cut mid-JSON then message_stop (max_tokens) is not a tool call with garbage", () =>
    Effect.gen(function*() {
      const ran = yield* Ref.make(0)
      const tool = Tool.make({
        name: "lookup",
        description: "d",
        parameters: Schema.Struct({ city: Schema.String }),
        success: Schema.String,
        handler: () => Effect.as(Ref.update(ran, (n) => n + 1), "ok")
      })
      const stub = rawClient([[
        ...anStart({ type: "tool_use", id: "toolu_1", name: "lookup", input: {} }),
        an({
          type: "content_block_delta",
          index: 0,
          delta: { type: "input_json_delta", partial_json: "{\"city\": \"Pa" }
        }),
        ...anEnd("max_tokens")
      ]])
      const adapter = yield* anthropicAdapter(stub.client)
      const prompt = Prompt.make({ name: "t", instructions: "", input: "x", tools: [tool] })
      const result = yield* Effect.either(journalFree(adapter.evaluate(prompt, { session: yield* Session.make })))
      expect(yield* Ref.get(ran)).toBe(0)
      expect(result._tag).toBe("Left")
      if (result._tag === "Left") expect(result.left.reason).toBe("provider")
    }).pipe(Effect.scoped))

  it.live(
    "1j OpenAI: events split at every byte (multibyte and astral UTF-8 split mid-code-point)",
    () =>
      Effect.gen(function*() {
        const text = "héllo 😀 — 世界 \u{10FFFF}"
        const bytes = encoder.encode(oaText([text.slice(0, 5), text.slice(5)]).join(""))
        const chunks = Array.from(bytes, (b) => Uint8Array.of(b))
        const result = yield* evaluate(yield* openAiAdapter(rawClient([chunks]).client))
        expect(result._tag).toBe("Right")
        if (result._tag === "Right") expect(result.right.text).toBe(text)
      }).pipe(Effect.scoped),
    60_000
  )

  it.live("1j' Anthropic: events split at every byte (multibyte UTF-8 split)", () =>
    Effect.gen(function*() {
      const text = "ñ😀€𝄞"
      const bytes = encoder.encode([...anStart(), anText(text), ...anEnd()].join(""))
      const stub = rawClient([Array.from(bytes, (b) => Uint8Array.of(b))])
      const adapter = yield* anthropicAdapter(stub.client)
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      expect(result._tag === "Right" ? result.right.text : result.left.detail).toBe(text)
    }).pipe(Effect.scoped), 60_000)
})

// ===============================================================================================================
// 2. Bounded while streaming
// ===============================================================================================================
describe("attack 2: bounded while streaming", () => {
  const textTurn = (bytes: number) =>
    InnerLoop.makeAdapter("hand", {
      stream: () =>
        Stream.make<Array<InnerLoop.TurnPart>>(
          { _tag: "Text", delta: "x".repeat(bytes) },
          { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
        )
    })

  it.live(
    "2a a streamed text just under Journal.maxStepBytes under MainLoop.agent: answered, or the documented limit_bytes error",
    () =>
      Effect.gen(function*() {
        const adapter = yield* textTurn(Journal.maxStepBytes - 64)
        const out = yield* underAgent(adapter, "near-limit")
        const reply = out.replies[0]?.body
        console.log("2a reply error:", reply?.error?.message?.slice(0, 300), reply?.error?.details)
        // Docs: the turn is measured "in UTF-8 bytes, as the journal stores them"; past the limit it is
        // PromptEvaluationError phase response / provider with limit_bytes. Under it, the turn is an answer.
        if (reply?.error !== undefined) {
          expect(reply.error.details).toMatchObject({ phase: "response", reason: "provider" })
        } else {
          expect(reply?.output?.length).toBe(Journal.maxStepBytes - 64)
        }
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "2b many tiny tool calls in one turn are bounded (the turn's JSON as the journal stores it)",
    () =>
      Effect.gen(function*() {
        const call = (i: number): InnerLoop.TurnPart => ({
          _tag: "ToolCall",
          call: { id: `c${i}`, name: "t", params: {} }
        })
        let produced = 0
        const adapter = yield* InnerLoop.makeAdapter("hand", {
          stream: () =>
            Stream.fromIterable((function*() {
              for (;; produced++) yield call(produced)
            })())
        })
        const tool = Tool.make({
          name: "t",
          description: "d",
          parameters: Schema.Struct({}),
          success: Schema.String,
          handler: () => Effect.succeed("x")
        })
        const prompt = Prompt.make({ name: "p", instructions: "", input: "x", tools: [tool] })
        const result = yield* Effect.either(journalFree(adapter.evaluate(prompt, { session: yield* Session.make })))
          .pipe(Effect.timeout("30 seconds"))
        expect(result._tag).toBe("Left")
        if (result._tag === "Left") expect(result.left.providerPayload).toEqual({ limit_bytes: Journal.maxStepBytes })
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "2e OpenAI: an endless tool-call argument stream is stopped at Journal.maxStepBytes (read no further)",
    () =>
      Effect.gen(function*() {
        let sent = 0
        const piece = "\u00e9".repeat(32 * 1024) // 64 KiB UTF-8
        function* reply(): Generator<Chunk> {
          yield oa({ type: "response.created", response: envelope(undefined, "in_progress") })
          yield oa({
            type: "response.output_item.added",
            output_index: 0,
            item: {
              type: "function_call",
              id: "fc_1",
              call_id: "call_1",
              name: "t",
              arguments: "",
              status: "in_progress"
            }
          })
          yield oa({
            type: "response.function_call_arguments.delta",
            item_id: "fc_1",
            output_index: 0,
            delta: "{\"x\":\""
          })
          for (; sent < 400; sent++) {
            yield oa({ type: "response.function_call_arguments.delta", item_id: "fc_1", output_index: 0, delta: piece })
          }
          yield "stall"
        }
        const tool = Tool.make({
          name: "t",
          description: "d",
          parameters: Schema.Struct({ x: Schema.String }),
          success: Schema.String,
          handler: () => Effect.succeed("x")
        })
        const adapter = yield* openAiAdapter(rawClient([reply()]).client)
        const prompt = Prompt.make({ name: "p", instructions: "", input: "x", tools: [tool] })
        const result = yield* Effect.either(journalFree(adapter.evaluate(prompt, { session: yield* Session.make })))
          .pipe(Effect.timeout("30 seconds"))
        expect(result._tag).toBe("Left")
        if (result._tag === "Left") expect(result.left.providerPayload).toEqual({ limit_bytes: Journal.maxStepBytes })
        expect(sent).toBeLessThan(100)
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "2f a tool result of 6 MB UTF-8 (3 Mi 'é', under 4 Mi UTF-16 units) is refused by the journal (docs: a step's JSON up to 4 MiB)",
    () =>
      Effect.gen(function*() {
        const big = Tool.make({
          name: "big",
          description: "d",
          parameters: Schema.Struct({}),
          success: Schema.String,
          handler: () => Effect.succeed("\u00e9".repeat(3_000_000))
        })
        const env = yield* memoryMailboxes
        const id = yield* env.requests.send(MainLoop.request("go", { requestId: "big-1" }), { replyTo: "responses" })
        const adapter = yield* ScriptedAdapter.make([
          { toolCalls: [{ name: "big", params: {} }], usage: { inputTokens: 1, outputTokens: 1 } },
          { text: "never", latency: "1 hour" }
        ])
        const loop = yield* MainLoop.agent({
          requests: env.requests,
          adapter,
          prepare: (input: string) => Effect.succeed(Prompt.make({ name: "p", instructions: "", input, tools: [big] }))
        }).pipe(Effect.provideService(MailboxResolver, env.resolver))
        yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }).pipe(
          Effect.timeout("2 seconds"),
          Effect.ignore
        )
        const stored = yield* MailboxMemory.journal(env.requests, id)
        const sizes = Option.match(stored, {
          onNone: () => [] as Array<number>,
          onSome: (steps) => steps.map((step) => Buffer.byteLength(JSON.stringify(step), "utf8"))
        })
        const [reply] = yield* env.responses.receive()
        console.log("2f stored step UTF-8 sizes:", sizes, "reply:", reply?.body.error?.tag)
        // Either refused (JournalStoreError too large), or every stored step is within maxStepBytes UTF-8 bytes.
        expect(sizes.every((size) => size <= Journal.maxStepBytes + 512)).toBe(true)
      }).pipe(Effect.scoped),
    60_000
  )

  it.live("2c astral characters counted as 4 UTF-8 bytes (not 2 UTF-16 units)", () =>
    Effect.gen(function*() {
      // 1.1 Mi astral characters = 4.4 MiB UTF-8 but only 2.2 Mi UTF-16 units.
      const adapter = yield* InnerLoop.makeAdapter("hand", {
        stream: () =>
          Stream.make<Array<InnerLoop.TurnPart>>(
            { _tag: "Text", delta: "😀".repeat(1_100_000) },
            { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
          )
      })
      const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
      expect(result._tag).toBe("Left")
    }).pipe(Effect.scoped), 60_000)

  it.live(
    "2d Progress bytes NaN / negative / Infinity cannot make a turn unbounded or shrink it",
    () =>
      Effect.gen(function*() {
        const adapter = yield* InnerLoop.makeAdapter("hand", {
          stream: () =>
            Stream.make<Array<InnerLoop.TurnPart>>(
              { _tag: "Text", delta: "x".repeat(3 * 1024 * 1024) },
              { _tag: "Progress", bytes: -10 * 1024 * 1024 },
              { _tag: "Text", delta: "y".repeat(3 * 1024 * 1024) },
              { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
            )
        })
        const result = yield* Effect.either(journalFree(adapter.evaluate(essay, { session: yield* Session.make })))
        expect(result._tag).toBe("Left")
      }).pipe(Effect.scoped),
    60_000
  )
})

// ===============================================================================================================
// 3. Only progress beats
// ===============================================================================================================
describe("attack 3: only progress beats", () => {
  const beatsFor = (parts: ReadonlyArray<InnerLoop.TurnPart>) =>
    Effect.gen(function*() {
      const adapter = yield* InnerLoop.makeAdapter("hand", {
        stream: () =>
          Stream.fromIterable(parts).pipe(
            Stream.tap(() => Effect.sleep("5 millis")),
            Stream.concat(Stream.never)
          )
      }, { beatInterval: "1 millis" })
      const heartbeat = yield* Heartbeat.make
      const beats = yield* Ref.make(0)
      yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
      yield* Effect.fork(adapter.evaluate(essay, { session: yield* Session.make, heartbeat }))
      yield* Effect.sleep(Duration.millis(parts.length * 5 + 200))
      return yield* Ref.get(beats)
    })

  it.live("3a Progress without bytes, with bytes 0, NaN, -1, empty Text: only the turn's own beat", () =>
    Effect.gen(function*() {
      const parts: Array<InnerLoop.TurnPart> = []
      for (let i = 0; i < 10; i++) {
        parts.push({ _tag: "Progress" }, { _tag: "Progress", bytes: 0 }, { _tag: "Progress", bytes: Number.NaN }, {
          _tag: "Progress",
          bytes: -1
        }, { _tag: "Text", delta: "" })
      }
      expect(yield* beatsFor(parts)).toBe(1)
    }).pipe(Effect.scoped))

  it.live("3d whitespace-only text deltas DO beat (documented: only empty deltas do not) — recorded", () =>
    Effect.gen(function*() {
      const parts: Array<InnerLoop.TurnPart> = Array.from({ length: 20 }, () => ({ _tag: "Text", delta: " " }))
      const n = yield* beatsFor(parts)
      console.log("3d whitespace beats:", n)
      expect(n).toBeGreaterThan(1)
    }).pipe(Effect.scoped))

  it.live("3b Anthropic: only ping events and empty text/thinking deltas do not beat", () =>
    Effect.gen(function*() {
      const chunks: Array<Chunk> = [...anStart()]
      for (let i = 0; i < 20; i++) {
        chunks.push(an({ type: "ping" }), anText(""), ": keepalive\n\n")
      }
      chunks.push("stall")
      const stub = rawClient([chunks])
      const adapter = yield* Anthropic.make({
        model: "m",
        apiKey: Redacted.make("k"),
        stream: true,
        beatInterval: "1 millis"
      }).pipe(Effect.provideService(HttpClient.HttpClient, stub.client))
      const heartbeat = yield* Heartbeat.make
      const beats = yield* Ref.make(0)
      yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
      yield* Effect.fork(adapter.evaluate(essay, { session: yield* Session.make, heartbeat }))
      yield* Effect.sleep("500 millis")
      expect(yield* Ref.get(beats)).toBe(1)
    }).pipe(Effect.scoped))

  it.live("3c OpenAI: only empty deltas, metadata events and comments do not beat", () =>
    Effect.gen(function*() {
      const chunks: Array<Chunk> = [...oaStart()]
      for (let i = 0; i < 20; i++) {
        chunks.push(
          oaDelta(""),
          ": ping\n\n",
          oa({ type: "response.in_progress", response: envelope(undefined, "in_progress") })
        )
      }
      chunks.push("stall")
      const stub = rawClient([chunks])
      const adapter = yield* openAiAdapter(stub.client, { beatInterval: "1 millis" })
      const heartbeat = yield* Heartbeat.make
      const beats = yield* Ref.make(0)
      yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
      yield* Effect.fork(adapter.evaluate(essay, { session: yield* Session.make, heartbeat }))
      yield* Effect.sleep("500 millis")
      expect(yield* Ref.get(beats)).toBe(1)
    }).pipe(Effect.scoped))
})

// ===============================================================================================================
// 4. Deadline phase on the real clock
// ===============================================================================================================
describe("attack 4: deadline phase", () => {
  it.live(
    "4a short real-clock deadlines (1.05 s .. 1.3 s) after the first chunk are phase response, every run",
    () =>
      Effect.gen(function*() {
        const phases: Array<unknown> = []
        for (let run = 0; run < 8; run++) {
          const adapter = yield* InnerLoop.makeAdapter("hand", {
            stream: () =>
              Stream.make<Array<InnerLoop.TurnPart>>({ _tag: "Text", delta: "a" }).pipe(
                Stream.concat(
                  Stream.repeatEffect(Effect.as(Effect.sleep("3 millis"), { _tag: "Text", delta: "b" } as const))
                )
              )
          })
          const env = yield* memoryMailboxes
          const deadline = yield* Deadline.after(Duration.millis(1050 + run * 30))
          yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
          const loop = yield* MainLoop.agent({
            requests: env.requests,
            adapter,
            prepare: (request: string) => Effect.succeed(Prompt.make({ name: "e", instructions: "", input: request }))
          }).pipe(Effect.provideService(MailboxResolver, env.resolver))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
          const [reply] = yield* env.responses.receive()
          phases.push(reply?.body.error?.details?.["phase"])
        }
        expect(phases).toEqual(Array.from({ length: 8 }, () => "response"))
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "4b a deadline during a tool under MainLoop.agent is phase tool (real clock, several runs)",
    () =>
      Effect.gen(function*() {
        const phases: Array<unknown> = []
        for (let run = 0; run < 5; run++) {
          const tool = Tool.make({
            name: "slow",
            description: "d",
            parameters: Schema.Struct({}),
            success: Schema.String,
            handler: () => Effect.as(Effect.sleep("10 seconds"), "done")
          })
          const adapter = yield* InnerLoop.makeAdapter("hand", {
            stream: () =>
              Stream.make<Array<InnerLoop.TurnPart>>(
                { _tag: "ToolCall", call: { id: "c1", name: "slow", params: {} } },
                { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
              )
          })
          const env = yield* memoryMailboxes
          const deadline = yield* Deadline.after(Duration.millis(1000 + run * 20))
          yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
          const loop = yield* MainLoop.agent({
            requests: env.requests,
            adapter,
            prepare: (request: string) =>
              Effect.succeed(Prompt.make({ name: "e", instructions: "", input: request, tools: [tool] }))
          }).pipe(Effect.provideService(MailboxResolver, env.resolver))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
          const [reply] = yield* env.responses.receive()
          phases.push(reply?.body.error?.details?.["phase"])
        }
        expect(phases).toEqual(Array.from({ length: 5 }, () => "tool"))
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "4d a deadline while waiting for the SECOND turn's first chunk (after a streamed turn and a tool) is phase request",
    () =>
      Effect.gen(function*() {
        const phases: Array<unknown> = []
        for (let run = 0; run < 4; run++) {
          const tool = Tool.make({
            name: "quick",
            description: "d",
            parameters: Schema.Struct({}),
            success: Schema.String,
            handler: () => Effect.succeed("done")
          })
          let turn = 0
          const adapter = yield* InnerLoop.makeAdapter("hand", {
            stream: () =>
              turn++ === 0
                ? Stream.make<Array<InnerLoop.TurnPart>>(
                  { _tag: "Text", delta: "calling" },
                  { _tag: "ToolCall", call: { id: "c1", name: "quick", params: {} } },
                  { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
                )
                : Stream.never
          })
          const env = yield* memoryMailboxes
          const deadline = yield* Deadline.after(Duration.millis(1000 + run * 20))
          yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
          const loop = yield* MainLoop.agent({
            requests: env.requests,
            adapter,
            prepare: (request: string) =>
              Effect.succeed(Prompt.make({ name: "e", instructions: "", input: request, tools: [tool] }))
          }).pipe(Effect.provideService(MailboxResolver, env.resolver))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
          const [reply] = yield* env.responses.receive()
          phases.push(reply?.body.error?.details?.["phase"])
        }
        expect(phases).toEqual(Array.from({ length: 4 }, () => "request"))
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "4c a deadline before the first chunk under MainLoop.agent is phase request (real clock, several runs)",
    () =>
      Effect.gen(function*() {
        const phases: Array<unknown> = []
        for (let run = 0; run < 5; run++) {
          const adapter = yield* InnerLoop.makeAdapter("hand", { stream: () => Stream.never })
          const env = yield* memoryMailboxes
          const deadline = yield* Deadline.after(Duration.millis(1000 + run * 20))
          yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
          const loop = yield* MainLoop.agent({
            requests: env.requests,
            adapter,
            prepare: (request: string) => Effect.succeed(Prompt.make({ name: "e", instructions: "", input: request }))
          }).pipe(Effect.provideService(MailboxResolver, env.resolver))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
          const [reply] = yield* env.responses.receive()
          phases.push(reply?.body.error?.details?.["phase"])
        }
        expect(phases).toEqual(Array.from({ length: 5 }, () => "request"))
      }).pipe(Effect.scoped),
    60_000
  )
})

// ===============================================================================================================
// 5. Divergence across a "deploy"
// ===============================================================================================================
describe("attack 5: divergence", () => {
  const mkTool = (
    name: string,
    description: string,
    parameters: Schema.Schema.AnyNoContext,
    success: Schema.Schema.AnyNoContext = Schema.String
  ) =>
    Tool.make({
      name,
      description,
      parameters: parameters as Schema.Schema<unknown, unknown, never>,
      success: success as Schema.Schema<unknown, unknown, never>,
      handler: () => Effect.succeed("r" as unknown)
    })
  const A = mkTool("a", "tool a", Schema.Struct({ x: Schema.String }))
  const B = mkTool("b", "tool b", Schema.Struct({ y: Schema.Number }))

  /** Delivery 1 records turn 1 (calls a) and the tool, then the model fails; delivery 2 runs with `tools2`. */
  const deploy = (tools1: ReadonlyArray<Tool.Any>, tools2: ReadonlyArray<Tool.Any>) =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
        name: "requests"
      })
      const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
      const resolver = MailboxResolver.fromMailboxes(requests, responses)
      yield* requests.send(MainLoop.request("go", { requestId: "dep" }), { replyTo: "responses" })
      const run = (
        tools: ReadonlyArray<Tool.Any>,
        adapter: Effect.Effect.Success<ReturnType<typeof ScriptedAdapter.make>>
      ) =>
        Effect.gen(function*() {
          const loop = yield* MainLoop.agent({
            requests,
            adapter,
            prepare: (input: string) => Effect.succeed(Prompt.make({ name: "p", instructions: "i", input, tools }))
          }).pipe(Effect.provideService(MailboxResolver, resolver))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 second" }).pipe(
            Effect.timeout("400 millis"),
            Effect.ignore
          )
        })
      const first = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "a", params: { x: "1" } }], usage: { inputTokens: 1, outputTokens: 1 } },
        { text: "never", latency: "1 hour" }
      ])
      yield* run(tools1, first) // dies mid-run (interrupted), turn 1 and the tool recorded
      yield* Effect.sleep("1200 millis")
      const second = yield* ScriptedAdapter.make([{ text: "fresh answer" }, { text: "fresh answer" }])
      yield* run(tools2, second)
      const replies = yield* responses.receive({ maxMessages: 10 })
      const last = replies.at(-1)?.body
      return { last, live: (yield* second.requests).length }
    })

  it.live("5a reordering the tools (same set) — diverges or replays consistently; recorded", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A, B], [B, A])
      console.log("5a reorder:", JSON.stringify(out.last).slice(0, 300), "live", out.live)
      expect(out.last).toBeDefined()
    }).pipe(Effect.scoped))

  it.live("5b a changed description diverges", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A], [mkTool("a", "tool a, reworded", Schema.Struct({ x: Schema.String }))])
      expect(out.last?.error?.message ?? "").toMatch(/diverg|JournalDiverged/i)
      expect(out.live).toBe(0)
    }).pipe(Effect.scoped))

  it.live("5c a field's description annotation changed diverges", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A], [
        mkTool("a", "tool a", Schema.Struct({ x: Schema.String.annotations({ description: "now a city" }) }))
      ])
      expect(out.last?.error?.message ?? "").toMatch(/diverg/i)
      expect(out.live).toBe(0)
    }).pipe(Effect.scoped))

  it.live("5d a required field added inside a nested Schema.Class diverges", () =>
    Effect.gen(function*() {
      class P1 extends Schema.Class<P1>("P")({ x: Schema.String }) {}
      class P2 extends Schema.Class<P2>("P")({ x: Schema.String, must: Schema.String }) {}
      const out = yield* deploy(
        [mkTool("a", "tool a", Schema.Struct({ p: P1 }))],
        [mkTool("a", "tool a", Schema.Struct({ p: P2 }))]
      )
      expect(out.last?.error?.message ?? "").toMatch(/diverg/i)
      expect(out.live).toBe(0)
    }).pipe(Effect.scoped))

  it.live("5e a filter without JSON Schema (Schema.filter) added to a field replays (documented: only what JSON Schema shows counts)", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A], [
        mkTool("a", "tool a", Schema.Struct({ x: Schema.String.pipe(Schema.filter((s) => s.length > 5)) }))
      ])
      console.log("5e filter:", JSON.stringify(out.last).slice(0, 300), "live", out.live)
      expect(out.last?.output).toBe("fresh answer")
    }).pipe(Effect.scoped))

  it.live("5f a changed success schema replays (documented)", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A], [mkTool("a", "tool a", Schema.Struct({ x: Schema.String }), Schema.Number)])
      console.log("5f success:", JSON.stringify(out.last).slice(0, 300), "live", out.live)
      expect(out.last?.output).toBe("fresh answer")
    }).pipe(Effect.scoped))

  it.live("5g a transformation's encoded side changed (String -> NumberFromString, same JSON Schema?) diverges", () =>
    Effect.gen(function*() {
      const out = yield* deploy([A], [mkTool("a", "tool a", Schema.Struct({ x: Schema.NumberFromString }))])
      console.log("5g NumberFromString:", JSON.stringify(out.last).slice(0, 300), "live", out.live)
      expect(out.last?.error?.message ?? "").toMatch(/diverg/i)
    }).pipe(Effect.scoped))
})

// ===============================================================================================================
// 6. Journal lifetime (SQLite)
// ===============================================================================================================
describe("attack 6: journal lifetime on SQLite", () => {
  const onSqlite = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    (effect as Effect.Effect<A, E, SqlClient.SqlClient | MailboxResolver | import("effect").Scope.Scope>).pipe(
      Effect.provide(MailboxResolver.layer()),
      Effect.provide(MailboxSql.layerSqlite({ filename: join(mkdtempSync(join(tmpdir(), "lh-atk6-")), "a.db") })),
      Effect.scoped
    )
  const tool = Tool.make({
    name: "t",
    description: "d",
    parameters: Schema.Struct({}),
    success: Schema.String,
    handler: () => Effect.succeed("tool-result")
  })
  const prompt = (input: string) => Prompt.make({ name: "p", instructions: "i", input, tools: [tool] })
  const setup = Effect.gen(function*() {
    const requests = yield* MailboxSql.make({
      name: "req",
      schema: MainLoop.requestSchema(Schema.String),
      replySchema: MainLoop.resultSchema(Schema.String)
    })
    const replies = yield* MailboxSql.make({ name: "rep", schema: MainLoop.resultSchema(Schema.String) })
    const letters = yield* MailboxSqlAdmin.deadLetters()
    const journals = yield* MailboxSqlAdmin.journals()
    const sql = yield* SqlClient.SqlClient
    const journalRows = Effect.map(
      sql<{ n: number }>`SELECT COUNT(*) AS n FROM leasehold_mailbox_journal`,
      (r) => Number(r[0]!.n)
    )
    return { requests, replies, letters, journals, journalRows }
  })
  /** Turn 1 calls the tool (recorded, tool recorded), turn 2 fails: a run with 2 steps that fails. */
  const failingAfterTwoSteps = () =>
    ScriptedAdapter.make([{ toolCalls: [{ name: "t", params: {} }], usage: { inputTokens: 1, outputTokens: 1 } }, {
      fail: "boom"
    }])

  it.live(
    "6a a dead-lettered request keeps its journal; a redrive runs afresh; once redriven and acked no journal is left",
    () =>
      onSqlite(Effect.gen(function*() {
        const env = yield* setup
        const id = yield* env.requests.send(MainLoop.request("go", { requestId: "dl-1" }), { replyTo: "rep" })
        const loop = yield* MainLoop.agent({
          requests: env.requests,
          adapter: yield* failingAfterTwoSteps(),
          prepare: (input: string) => Effect.succeed(prompt(input)),
          config: {
            deadLetters: {
              mailbox: env.letters.sink(MainLoop.requestSchema(Schema.String)),
              policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 })
            }
          }
        })
        yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 minute" })
        expect(yield* env.letters.count()).toBe(1)
        const kept = yield* env.journals.read(id)
        expect(Option.map(kept, (v) => v.steps.length)).toEqual(Option.some(2)) // kept for the operator
        // A redrive: a new message, run afresh (the model is asked again; no replay of the old journal).
        expect(yield* env.letters.redrive()).toBe(1)
        const fresh = yield* ScriptedAdapter.make([{ text: "fresh" }])
        const again = yield* MainLoop.agent({
          requests: env.requests,
          adapter: fresh,
          prepare: (input: string) => Effect.succeed(prompt(input))
        })
        yield* again.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 minute" })
        const got = yield* env.replies.receive({ maxMessages: 10 })
        const last = got.at(-1)?.body
        console.log("6a redriven reply:", JSON.stringify(last)?.slice(0, 300))
        expect(last?.output).toBe("fresh")
        expect((yield* fresh.requests).length).toBe(1)
        // "A step journal lives exactly as long as its message or dead letter" (CHANGELOG, Fixed): the dead letter is
        // gone (redriven) and the redriven message acknowledged, so nothing should be left.
        const byRequest = yield* env.journals.read("dl-1")
        console.log(
          "6a journal rows after redrive+ack:",
          yield* env.journalRows,
          "read(dl-1):",
          JSON.stringify(Option.map(byRequest, (v) => v.steps.length))
        )
        expect(yield* env.journalRows).toBe(0)
      })),
    60_000
  )

  it.live(
    // Was "retention removes the orphaned journal of the old message" (docs then left it to retention): a redrive
    // now deletes the letter's journal in its own transaction, so nothing is orphaned for retention to find.
    "6d a redrive deletes the old message's journal at once; retention (journals, 1 ms) finds nothing left",
    () =>
      onSqlite(Effect.gen(function*() {
        const env = yield* setup
        yield* env.requests.send(MainLoop.request("go", { requestId: "dl-2" }), { replyTo: "rep" })
        const loop = yield* MainLoop.agent({
          requests: env.requests,
          adapter: yield* failingAfterTwoSteps(),
          prepare: (input: string) => Effect.succeed(prompt(input)),
          config: {
            deadLetters: {
              mailbox: env.letters.sink(MainLoop.requestSchema(Schema.String)),
              policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 })
            }
          }
        })
        yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 minute" })
        expect(yield* env.journalRows).toBe(2)
        expect(yield* env.letters.redrive()).toBe(1)
        expect(yield* env.journalRows).toBe(0)
        yield* Effect.sleep("20 millis")
        const result = yield* Retention.prune({ olderThan: "1 millis", kinds: ["journals"] })
        console.log("6d prune:", JSON.stringify(result))
        expect(yield* env.journalRows).toBe(0)
      })),
    60_000
  )

  it.live(
    "6b a redelivery acknowledged by code that never read the journal deletes it",
    () =>
      onSqlite(Effect.gen(function*() {
        const env = yield* setup
        const id = yield* env.requests.send(MainLoop.request("go", { requestId: "rd-1" }), { replyTo: "rep" })
        const hang = yield* ScriptedAdapter.make([
          { toolCalls: [{ name: "t", params: {} }], usage: { inputTokens: 1, outputTokens: 1 } },
          { text: "never", latency: "1 hour" }
        ])
        const loop = yield* MainLoop.agent({
          requests: env.requests,
          adapter: hang,
          prepare: (input: string) => Effect.succeed(prompt(input))
        })
        yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 second" }).pipe(
          Effect.timeout("500 millis"),
          Effect.ignore
        )
        expect(yield* env.journalRows).toBe(2)
        yield* Effect.sleep("1200 millis")
        const [second] = yield* env.requests.receive({ visibilityTimeout: "1 minute" })
        expect(second?.id).toBe(id)
        yield* second!.acknowledge
        expect(yield* env.journalRows).toBe(0)
      })),
    60_000
  )

  it.live("6c the operator's queue purge and drop keep a dead letter's journal", () =>
    onSqlite(Effect.gen(function*() {
      const env = yield* setup
      const id = yield* env.requests.send(MainLoop.request("go", { requestId: "pq-1" }), { replyTo: "rep" })
      const loop = yield* MainLoop.agent({
        requests: env.requests,
        adapter: yield* failingAfterTwoSteps(),
        prepare: (input: string) => Effect.succeed(prompt(input)),
        config: {
          deadLetters: {
            mailbox: env.letters.sink(MainLoop.requestSchema(Schema.String)),
            policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 })
          }
        }
      })
      yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 minute" })
      const queues = yield* MailboxSqlAdmin.queues()
      yield* env.requests.send(MainLoop.request("other"))
      yield* queues.purge("req")
      yield* env.requests.purge
      console.log("6c drop:", yield* queues.drop("req"))
      expect(Option.map(yield* env.journals.read(id), (v) => v.steps.length)).toEqual(Option.some(2))
    })), 60_000)
})
