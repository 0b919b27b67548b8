/**
 * The streaming agent suite, run for each provider whose stub speaks server-sent events (`sse.ts`): the
 * provider's test file says how its API writes a streamed text and a streamed tool call, and how an adapter is
 * made over a stubbed `HttpClient`; the suite runs the same claims on each, all on the `TestClock`.
 *
 * - a 10-minute stream keeps its request leased (visibility 60 s) under `MainLoop.agent`, and the reply arrives;
 * - a stream that stalls stops beating: the lease runs out and another receiver gets the request;
 * - a deadline in the middle of a stream stops it with `phase: "response"` (before the first chunk: `"request"`);
 * - a streamed tool call runs through the tool executor and the exchange continues, usage counted.
 */
import type { HttpClient } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import type { Duration, Scope } from "effect"
import { Effect, Fiber, TestClock } from "effect"
import * as Budget from "../../src/Budget.js"
import * as Deadline from "../../src/Deadline.js"
import { MailboxResolver } from "../../src/Mailbox.js"
import * as MailboxMemory from "../../src/MailboxMemory.js"
import * as MainLoop from "../../src/MainLoop.js"
import * as Prompt from "../../src/Prompt.js"
import type { ProviderAdapter } from "../../src/ProviderAdapter.js"
import * as Session from "../../src/Session.js"
import { journalFree } from "./journalFree.js"
import type { SseReply } from "./sse.js"
import { sseClient } from "./sse.js"
import { weatherPrompt } from "./weather.js"

/** How a provider's API streams, and how an adapter is made over a client. */
export interface StreamingProvider {
  readonly name: string
  /** A streaming adapter over `client`. */
  readonly adapter: (client: HttpClient.HttpClient) => Effect.Effect<ProviderAdapter["Type"], unknown, Scope.Scope>
  /**
   * A text answer whose first event comes after `first` (default at once), written in `pieces` one every
   * `every`, with the turn's usage at the end; or `stallAfter` pieces then nothing more, the connection open.
   */
  readonly text: (options: {
    readonly pieces: ReadonlyArray<string>
    readonly every: Duration.DurationInput
    readonly first?: Duration.DurationInput
    readonly usage: { readonly input: number; readonly output: number }
    readonly stallAfter?: number
  }) => SseReply
  /** A tool call whose JSON parameters arrive in `pieces`, one every `every`, then the turn's usage. */
  readonly toolCall: (options: {
    readonly id: string
    readonly name: string
    readonly pieces: ReadonlyArray<string>
    readonly every: Duration.DurationInput
    readonly usage: { readonly input: number; readonly output: number }
  }) => SseReply
}

const settle = Effect.repeatN(Effect.yieldNow(), 30)

/** Sixty words, one every 10 s: a 10-minute answer. */
const words = Array.from({ length: 60 }, (_, i) => `w${i} `)

const mailboxes = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  return { requests, responses, resolver: MailboxResolver.fromMailboxes(requests, responses) }
})

const agentLoop = (
  env: Effect.Effect.Success<typeof mailboxes>,
  adapter: ProviderAdapter["Type"]
) =>
  MainLoop.agent({
    requests: env.requests,
    adapter,
    prepare: (request: string) => Effect.succeed(Prompt.make({ name: "essay", instructions: "", input: request })),
    config: { leaseExtender: { interval: "20 seconds", extension: "60 seconds" } }
  }).pipe(Effect.provideService(MailboxResolver, env.resolver))

export const streamingSuite = (provider: StreamingProvider) =>
  describe(`${provider.name}: streamed responses (SSE stub on the TestClock)`, () => {
    it.scoped("a 10-minute stream keeps its request leased (visibility 60 s) and its reply arrives", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.text({ pieces: words, every: "10 seconds", usage: { input: 20, output: 600 } })
        ])
        const env = yield* mailboxes
        yield* env.requests.send(MainLoop.request("write"), { replyTo: "responses" })
        const loop = yield* agentLoop(env, yield* provider.adapter(stub.client))
        const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
        for (let t = 0; t < 62; t++) {
          yield* settle
          expect(yield* env.requests.receive()).toEqual([]) // a second receiver sees nothing
          yield* TestClock.adjust("10 seconds")
        }
        yield* Fiber.join(fiber)
        const [reply] = yield* env.responses.receive()
        expect(reply!.body.output).toBe(words.join(""))
        expect(yield* env.requests.approximateCount).toBe(0)
      }))

    it.scoped("a stream that stalls stops beating: the lease runs out and another receiver gets the request", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.text({ pieces: words, every: "10 seconds", usage: { input: 20, output: 600 }, stallAfter: 6 })
        ])
        const env = yield* mailboxes
        yield* env.requests.send(MainLoop.request("write"), { replyTo: "responses" })
        const loop = yield* agentLoop(env, yield* provider.adapter(stub.client))
        yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
        // While the chunks come (one every 10 s for a minute), and well past one visibility timeout: leased.
        for (let t = 0; t < 8; t++) {
          yield* settle
          expect(yield* env.requests.receive()).toEqual([])
          yield* TestClock.adjust("10 seconds")
        }
        // Stalled: no chunk, no beat, no extension; within a few minutes the lease has run out.
        let again: ReadonlyArray<{ readonly deliveryCount: number }> = []
        for (let t = 0; t < 30 && again.length === 0; t++) {
          yield* TestClock.adjust("10 seconds")
          yield* settle
          again = yield* env.requests.receive()
        }
        expect(again.map((m) => m.deliveryCount)).toEqual([2])
        expect(yield* env.responses.receive()).toEqual([]) // the stalled attempt never replied
      }))

    it.scoped("a deadline in the middle of a stream stops it: phase response, reason deadline", () =>
      Effect.gen(function*() {
        const stub = sseClient([provider.text({ pieces: words, every: "10 seconds", usage: { input: 1, output: 1 } })])
        const adapter = yield* provider.adapter(stub.client)
        const deadline = yield* Deadline.after("35 seconds")
        const fiber = yield* Effect.fork(Effect.flip(journalFree(adapter.evaluate(
          Prompt.make({ name: "essay", instructions: "", input: "write" }),
          { session: yield* Session.make, deadline }
        ))))
        for (let t = 0; t < 4; t++) {
          yield* settle
          yield* TestClock.adjust("10 seconds")
        }
        const error = yield* Fiber.join(fiber)
        expect([error._tag, error.phase, error.reason]).toEqual(["PromptEvaluationError", "response", "deadline"])
        expect(error.detail).toContain("while the model was answering")
        expect(error.providerPayload).toEqual({ deadline_expires_at: deadline.iso })
      }))

    it.scoped("a deadline that passes before the stream's first chunk stops the request: phase request", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.text({ pieces: ["late"], first: "1 minute", every: "1 second", usage: { input: 1, output: 1 } })
        ])
        const adapter = yield* provider.adapter(stub.client)
        const deadline = yield* Deadline.after("30 seconds")
        const fiber = yield* Effect.fork(Effect.flip(journalFree(adapter.evaluate(
          Prompt.make({ name: "essay", instructions: "", input: "write" }),
          { session: yield* Session.make, deadline }
        ))))
        yield* settle
        yield* TestClock.adjust("30 seconds")
        const error = yield* Fiber.join(fiber)
        expect([error.phase, error.reason]).toEqual(["request", "deadline"])
      }))

    it.scoped("a streamed tool call runs the tool and the exchange continues; the usage is counted in the budget", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.toolCall({
            id: "call_1",
            name: "lookup_weather",
            pieces: ["{\"ci", "ty\": \"Par", "is\"}"],
            every: "5 seconds",
            usage: { input: 50, output: 10 }
          }),
          provider.text({
            pieces: ["{\"city\": \"Paris\", ", "\"celsius\": 21}"],
            every: "5 seconds",
            usage: { input: 80, output: 12 }
          })
        ])
        const adapter = yield* provider.adapter(stub.client)
        const session = yield* Session.make
        const budgetTracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
        const fiber = yield* Effect.fork(adapter.evaluate(weatherPrompt, { session, budgetTracker }))
        for (let t = 0; t < 10; t++) {
          yield* settle
          yield* TestClock.adjust("5 seconds")
        }
        const response = yield* Fiber.join(fiber)
        expect(response.output).toEqual({ city: "Paris", celsius: 21 })
        expect(response.usage).toEqual({ inputTokens: 130, outputTokens: 22 })
        expect(yield* budgetTracker.consumed).toMatchObject({ inputTokens: 130, outputTokens: 22, totalTokens: 152 })
        const events = yield* session.events
        expect(events.map((e) => e._tag)).toEqual(["ProviderCall", "ToolCall", "ToolResult", "ProviderCall"])
        expect(events[1]).toMatchObject({ toolName: "lookup_weather", params: { city: "Paris" } })
        expect(events[2]).toMatchObject({ ok: true, value: { celsius: 21 } })
        // The provider was asked to stream, and saw the tool's result in the follow-up request.
        expect(stub.bodies.map((body) => body["stream"])).toEqual([true, true])
        expect(JSON.stringify(stub.bodies[1])).toContain("celsius")
      }))
  })
