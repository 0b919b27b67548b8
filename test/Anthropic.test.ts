/**
 * The Anthropic adapter against a small stub of the Messages API (`POST /v1/messages`, non-streaming) started
 * on a free local port (real HTTP): the stub answers each request from a script, optionally after a delay, and
 * records what it received. With `stream: true` it runs the streaming suite (`support/streamingAgent.ts`)
 * against a stubbed `HttpClient` that writes the Messages API's server-sent events on the TestClock; a stream cut
 * short under `MainLoop.agent` is checked on the memory mailbox and on the journaled SQLite and PostgreSQL ones.
 */
import { FetchHttpClient, HttpClient } from "@effect/platform"
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Redacted, Schema, TestClock } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as Anthropic from "../src/adapters/Anthropic.js"
import * as Budget from "../src/Budget.js"
import type * as DeadLetter from "../src/DeadLetter.js"
import * as Deadline from "../src/Deadline.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import * as Session from "../src/Session.js"
import { journalFree } from "./support/journalFree.js"
import { sqlBackends } from "./support/sqlBackends.js"
import type { SseEvent, SseReply } from "./support/sse.js"
import type { StreamingProvider } from "./support/streamingAgent.js"
import {
  cutShortUnderAgent,
  memoryMailboxes,
  realClockDeadlinePhase,
  streamingSuite
} from "./support/streamingAgent.js"
import { weatherPrompt } from "./support/weather.js"

/** An Anthropic `Message` as the API returns it. */
const message = (
  id: string,
  content: ReadonlyArray<unknown>,
  stopReason: "end_turn" | "tool_use",
  usage: { input: number; output: number }
) => ({
  id,
  type: "message",
  role: "assistant",
  model: "claude-stub",
  content,
  stop_reason: stopReason,
  stop_sequence: null,
  usage: { input_tokens: usage.input, output_tokens: usage.output }
})

interface Reply {
  readonly body: unknown
  /** Never answered: the request hangs until the stub closes (the API still thinking when a deadline passes). */
  readonly hold?: boolean
}

interface Received {
  readonly method: string | undefined
  readonly url: string | undefined
  readonly headers: Record<string, unknown>
  readonly body: Record<string, unknown>
}

/** Serves `script` on a free port, one reply per request; records each request. */
const stubServer = (script: ReadonlyArray<Reply>) =>
  Effect.acquireRelease(
    Effect.async<{
      readonly url: string
      readonly received: Array<Received>
      /** Resolves once the first request has arrived. */
      readonly firstRequest: Promise<void>
      readonly close: () => void
    }>(
      (resume) => {
        const received: Array<Received> = []
        let arrived: () => void = () => {}
        const firstRequest = new Promise<void>((resolve) => (arrived = resolve))
        const server = createServer((request, response) => {
          let raw = ""
          request.on("data", (chunk) => (raw += chunk))
          request.on("end", () => {
            received.push({
              method: request.method,
              url: request.url,
              headers: request.headers,
              body: JSON.parse(raw || "{}")
            })
            arrived()
            const reply = script[received.length - 1]
            const send = () => {
              response.writeHead(reply === undefined ? 500 : 200, { "content-type": "application/json" })
              response.end(
                JSON.stringify(reply?.body ?? { type: "error", error: { type: "api_error", message: "script over" } })
              )
            }
            if (reply?.hold !== true) send()
          })
        })
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as AddressInfo
          resume(Effect.succeed({
            url: `http://127.0.0.1:${port}`,
            received,
            firstRequest,
            close: () => {
              server.closeAllConnections()
              server.close()
            }
          }))
        })
      }
    ),
    (stub) => Effect.sync(() => stub.close())
  )

const adapterFor = (url: string) =>
  Anthropic.make({ model: "claude-stub", apiKey: Redacted.make("test-key"), apiUrl: url, maxTokens: 512 }).pipe(
    Effect.provide(FetchHttpClient.layer)
  )

describe("Anthropic adapter (stub Messages API over real HTTP)", () => {
  it.live("a tool_use round trip: the InnerLoop runs the tool and the model sees its tool_result", () =>
    Effect.gen(function*() {
      const stub = yield* stubServer([
        {
          body: message(
            "msg_1",
            [
              { type: "text", text: "Let me look that up." },
              { type: "tool_use", id: "toolu_1", name: "lookup_weather", input: { city: "Paris" } }
            ],
            "tool_use",
            { input: 50, output: 10 }
          )
        },
        {
          body: message("msg_2", [{ type: "text", text: JSON.stringify({ city: "Paris", celsius: 21 }) }], "end_turn", {
            input: 80,
            output: 12
          })
        }
      ])
      const prompt = weatherPrompt
      const session = yield* Session.make
      const adapter = yield* adapterFor(stub.url)
      const response = yield* adapter.evaluate(prompt, { session })

      expect(response.output).toEqual({ city: "Paris", celsius: 21 })
      expect(response.usage).toEqual({ inputTokens: 130, outputTokens: 22 })
      const events = yield* session.events
      expect(events.filter((e) => e._tag === "ToolCall")).toMatchObject([{
        toolName: "lookup_weather",
        params: { city: "Paris" }
      }])

      // What the API saw: two Messages requests with the key, the tool's JSON Schema, then the tool's result.
      expect(stub.received.map((r) => [r.method, r.url?.split("?")[0]])).toEqual([
        ["POST", "/v1/messages"],
        ["POST", "/v1/messages"]
      ])
      const [first, second] = stub.received
      expect(first!.headers["x-api-key"]).toBe("test-key")
      expect(first!.body).toMatchObject({ model: "claude-stub", max_tokens: 512 })
      expect(first!.body["tools"]).toMatchObject([{
        name: "lookup_weather",
        description: "Current temperature of a city",
        input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
      }])
      expect(JSON.stringify(first!.body["system"])).toContain("Answer with JSON.")
      expect(first!.body["messages"]).toMatchObject([{ role: "user" }])
      const messages = second!.body["messages"] as ReadonlyArray<
        {
          readonly role: string
          readonly content: ReadonlyArray<{ readonly type: string; readonly content?: unknown }>
        }
      >
      expect(messages.map((m) => m.role)).toEqual(["user", "assistant", "user"])
      expect(messages[1]!.content).toContainEqual(
        expect.objectContaining({ type: "tool_use", id: "toolu_1", name: "lookup_weather", input: { city: "Paris" } })
      )
      const toolResult = messages[2]!.content.find((block) => block.type === "tool_result")
      expect(toolResult).toMatchObject({ tool_use_id: "toolu_1" })
      expect(JSON.stringify(toolResult?.content)).toContain("celsius")
    }).pipe(Effect.scoped))

  it.effect("a deadline that passes while the API is answering fails the call with reason deadline", () =>
    Effect.gen(function*() {
      // The stub never answers; the deadline passes on the TestClock while the (real) HTTP request is in flight.
      const stub = yield* stubServer([{
        body: message("msg_1", [{ type: "text", text: "too late" }], "end_turn", { input: 1, output: 1 }),
        hold: true
      }])
      const adapter = yield* adapterFor(stub.url)
      const session = yield* Session.make
      const deadline = yield* Deadline.after("1 second")
      const call = yield* Effect.fork(
        journalFree(
          adapter.evaluate(Prompt.make({ name: "slow", instructions: "", input: "hi" }), { session, deadline })
        )
      )
      yield* Effect.promise(() => stub.firstRequest)
      yield* TestClock.adjust("1 second")
      const exit = yield* Fiber.await(call)
      expect(Exit.isFailure(exit)).toBe(true)
      const error = yield* Effect.flip(exit)
      expect(error._tag).toBe("PromptEvaluationError")
      expect([error.phase, error.reason]).toEqual(["request", "deadline"])
      expect(error.providerPayload).toEqual({ deadline_expires_at: deadline.iso })
      expect(stub.received.length).toBe(1) // the request was in flight when the deadline passed
    }).pipe(Effect.scoped))

  it.live("the response's usage is recorded in the budget tracker, and a budget it exceeds stops the call", () =>
    Effect.gen(function*() {
      const answer = message("msg_1", [{ type: "text", text: "hello" }], "end_turn", { input: 300, output: 40 })
      const stub = yield* stubServer([{ body: answer }, { body: answer }])
      const adapter = yield* adapterFor(stub.url)
      const prompt = Prompt.make({ name: "greet", instructions: "", input: "hi" })

      const roomy = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
      const response = yield* adapter.evaluate(prompt, { session: yield* Session.make, budgetTracker: roomy })
      expect(response.text).toBe("hello")
      expect(yield* roomy.consumed).toMatchObject({ inputTokens: 300, outputTokens: 40, totalTokens: 340 })

      const tight = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 100 }))
      const error = yield* Effect.flip(
        journalFree(adapter.evaluate(prompt, { session: yield* Session.make, budgetTracker: tight }))
      )
      expect([error.phase, error.reason]).toEqual(["response", "budget"])
      expect(yield* tight.consumed).toMatchObject({ totalTokens: 340 })
    }).pipe(Effect.scoped))

  it.effect("bad options are a ParseError naming the field", () =>
    Effect.gen(function*() {
      const badUrl = yield* Effect.flip(
        Anthropic.make({ model: "claude-stub", apiKey: Redacted.make("k"), apiUrl: "not a url" }).pipe(
          Effect.provide(FetchHttpClient.layer),
          Effect.scoped
        )
      )
      expect(badUrl._tag).toBe("ParseError")
      expect(badUrl.message).toContain("Anthropic.make options")
      expect(badUrl.message).toContain("[\"apiUrl\"]")
      expect(badUrl.message).toContain("must be an http(s) URL")

      const plainKey = yield* Effect.flip(
        Anthropic.make({ model: "", apiKey: "sk-plain" as unknown as Redacted.Redacted<string> }).pipe(
          Effect.provide(FetchHttpClient.layer),
          Effect.scoped
        )
      )
      expect(plainKey.message).toContain("[\"apiKey\"]")
      expect(plainKey.message).toContain("must be a non-empty Redacted string")
      expect(plainKey.message).toContain("[\"model\"]")
      expect(plainKey.message).not.toContain("sk-plain")

      const badStream = yield* Effect.flip(
        Anthropic.make({
          model: "claude-stub",
          apiKey: Redacted.make("k"),
          stream: "yes" as unknown as boolean,
          beatInterval: "soon" as Duration.DurationInput
        }).pipe(Effect.provide(FetchHttpClient.layer), Effect.scoped)
      )
      expect(badStream.message).toContain("[\"stream\"]")
      expect(badStream.message).toContain("must be a boolean")
      expect(badStream.message).toContain("[\"beatInterval\"]")
    }))
})

/**
 * A streamed Messages API answer: `message_start` (after `first`), one content block of `deltas` (one every
 * `every`), the usage, `message_stop`.
 */
const messageStream = (options: {
  readonly block: unknown
  readonly deltas: ReadonlyArray<unknown>
  readonly first?: Duration.DurationInput | undefined
  readonly every: Duration.DurationInput
  readonly stopReason: "end_turn" | "tool_use"
  readonly usage: { readonly input: number; readonly output: number }
  readonly stallAfter?: number | undefined
  readonly cutShort?: boolean | undefined
}): SseReply => {
  const event = (data: { readonly type: string }, after?: Duration.DurationInput): SseEvent => ({
    event: data.type,
    data,
    ...(after !== undefined ? { after } : {})
  })
  const deltas = options.deltas.map((delta, i) =>
    event({ type: "content_block_delta", index: 0, delta } as { type: string }, i === 0 ? undefined : options.every)
  )
  const start = [
    event({
      type: "message_start",
      message: { ...message("msg_s", [], "end_turn", { input: options.usage.input, output: 1 }), stop_reason: null }
    } as { type: string }, options.first),
    event({ type: "content_block_start", index: 0, content_block: options.block } as { type: string })
  ]
  if (options.stallAfter !== undefined) return [...start, ...deltas.slice(0, options.stallAfter), "stall"]
  return [
    ...start,
    ...deltas,
    event({ type: "content_block_stop", index: 0 } as { type: string }),
    event({
      type: "message_delta",
      delta: { stop_reason: options.stopReason, stop_sequence: null },
      usage: { output_tokens: options.usage.output }
    } as { type: string }),
    // Cut short: the usage came, the final event never did (the connection closed).
    ...(options.cutShort === true ? [] : [event({ type: "message_stop" })])
  ]
}

/** A text block that never ends: `message_start`, the block's start, each of `deltas` at once, then a stall. */
function* endlessMessage(deltas: Iterable<string>): Generator<SseEvent | "stall"> {
  const [start, block] = messageStream({
    block: { type: "text", text: "" },
    deltas: [],
    every: 0,
    stopReason: "end_turn",
    usage: { input: 1, output: 1 }
  }) as ReadonlyArray<SseEvent>
  yield start!
  yield block!
  for (const text of deltas) {
    yield {
      event: "content_block_delta",
      data: { type: "content_block_delta", index: 0, delta: { type: "text_delta", text } }
    }
  }
  yield "stall" // the connection stays open: the final event never comes
}

const anthropic: StreamingProvider = {
  name: "Anthropic",
  adapter: (client, options) =>
    Anthropic.make({ model: "claude-stub", apiKey: Redacted.make("test-key"), stream: true, retry: options?.retry })
      .pipe(Effect.provideService(HttpClient.HttpClient, client)),
  finalEvent: "message_stop",
  text: ({ cutShort, every, first, pieces, stallAfter, usage }) =>
    messageStream({
      block: { type: "text", text: "" },
      deltas: pieces.map((text) => ({ type: "text_delta", text })),
      first,
      every,
      stopReason: "end_turn",
      usage,
      stallAfter,
      cutShort
    }),
  endless: endlessMessage,
  toolCall: ({ every, id, name, pieces, usage }) =>
    messageStream({
      block: { type: "tool_use", id, name, input: {} },
      deltas: pieces.map((partial_json) => ({ type: "input_json_delta", partial_json })),
      every,
      stopReason: "tool_use",
      usage
    })
}

streamingSuite(anthropic)
realClockDeadlinePhase(anthropic)
cutShortUnderAgent(anthropic, "memory", memoryMailboxes)

// The same on the journaled SQL mailboxes, each run on tables of its own (their statements run on the TestClock).
let tables = 0
for (const backend of sqlBackends("anthropic-stream")) {
  cutShortUnderAgent(
    anthropic,
    backend.label,
    Effect.suspend(() => {
      const prefix = `as${++tables}_`
      return Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const requests = yield* MailboxSql.make({
          name: "requests",
          schema: MainLoop.requestSchema(Schema.String),
          replySchema: MainLoop.resultSchema(Schema.String),
          prefix
        })
        const responses = yield* MailboxSql.make({
          name: "responses",
          schema: MainLoop.resultSchema(Schema.String),
          prefix
        })
        const letters = yield* MailboxMemory.make<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<string>>>({
          name: "letters"
        })
        return {
          requests,
          responses,
          letters,
          resolver: MailboxResolver.fromMailboxes(requests, responses),
          // Every step stored in these tables, whatever its message.
          steps: () =>
            sql<{ readonly n: number | string }>`SELECT COUNT(*) AS n FROM ${sql(`${prefix}mailbox_journal`)}`.pipe(
              Effect.map((rows) => Number(rows[0]!.n)),
              Effect.orDie
            )
        }
      }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()))
    })
  )
}
