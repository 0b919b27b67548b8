/**
 * The streaming agent suite, run for each provider whose stub speaks server-sent events (`sse.ts`): the
 * provider's test file says how its API writes a streamed text and a streamed tool call, and how an adapter is
 * made over a stubbed `HttpClient`; the suite runs the same claims on each, all on the `TestClock`.
 *
 * - a 10-minute stream keeps its request leased (visibility 60 s) under `MainLoop.agent`, and the reply arrives;
 * - a stream that stalls stops beating: the lease runs out and another receiver gets the request;
 * - a deadline in the middle of a stream stops it with `phase: "response"` (before the first chunk: `"request"`);
 * - a streamed tool call runs through the tool executor and the exchange continues, usage counted;
 * - only a complete answer is an answer: a stream cut short before the provider's final event, or one
 *   server-sent event too large to parse, is a failed response (phase `response`, reason `provider`), retried
 *   like any broken stream, and under `MainLoop.agent` never replied nor journaled (`cutShortUnderAgent` runs
 *   that claim on any mailbox, the SQL ones included);
 * - a provider that never stops writing is stopped at `Journal.maxStepBytes` (real clock: the stub counts the
 *   bytes it wrote before the reader cancelled);
 * - a stream of only empty deltas does not beat: the heartbeat ages and the lease runs out;
 * - a deadline once the model answers is phase `response` under `MainLoop.agent` too, on the TestClock and on
 *   the real clock (where the loop's own timer often fires first), every time.
 */
import type { HttpClient } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Duration, Effect, Fiber, Option, Ref, Schedule, TestClock } from "effect"
import * as Budget from "../../src/Budget.js"
import * as DeadLetter from "../../src/DeadLetter.js"
import * as Deadline from "../../src/Deadline.js"
import * as Heartbeat from "../../src/Heartbeat.js"
import * as Journal from "../../src/Journal.js"
import type { Mailbox } from "../../src/Mailbox.js"
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
  /** A streaming adapter over `client`, retrying failed model requests by `retry` if given. */
  readonly adapter: (
    client: HttpClient.HttpClient,
    options?: { readonly retry?: Schedule.Schedule<unknown, unknown> }
  ) => Effect.Effect<ProviderAdapter["Type"], unknown, Scope.Scope>
  /** The event that ends the provider's stream, which a stream cut short never sends (`message_stop`...). */
  readonly finalEvent: string
  /**
   * A text answer whose first event comes after `first` (default at once), written in `pieces` one every
   * `every`, with the turn's usage at the end; or `stallAfter` pieces then nothing more, the connection open;
   * with `cutShort`, everything but the final event, the connection then closed.
   */
  readonly text: (options: {
    readonly pieces: ReadonlyArray<string>
    readonly every: Duration.DurationInput
    readonly first?: Duration.DurationInput
    readonly usage: { readonly input: number; readonly output: number }
    readonly stallAfter?: number
    readonly cutShort?: boolean
  }) => SseReply
  /**
   * The start of a text answer, then `deltas` text deltas at once, one after another (an iterable, read lazily),
   * then nothing more, the connection open.
   */
  readonly endless: (deltas: Iterable<string>) => SseReply
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

/** The mailboxes of an agent with a dead-letter policy (a failure goes back to the queue), and its journal's size. */
export interface AgentMailboxes {
  readonly requests: Mailbox<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>
  readonly responses: Mailbox<MainLoop.MainLoopResult<string>>
  readonly letters: Mailbox<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<string>>>
  readonly resolver: MailboxResolver["Type"]
  /** The journal steps stored for the request whose message id is `id`. */
  readonly steps: (id: string) => Effect.Effect<number>
}

/** The memory mailboxes of `cutShortUnderAgent`. */
export const memoryMailboxes: Effect.Effect<AgentMailboxes, unknown, Scope.Scope> = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  const letters = yield* MailboxMemory.make<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<string>>>({
    name: "letters"
  })
  return {
    requests,
    responses,
    letters,
    resolver: MailboxResolver.fromMailboxes(requests, responses),
    steps: (id) =>
      Effect.map(MailboxMemory.journal(requests, id), (steps) =>
        Option.match(steps, {
          onNone: () => 0,
          onSome: (stored) => stored.length
        }))
  }
})

/**
 * Under `MainLoop.agent` on `mailboxes` (journaled), a stream cut short before its final event is not the
 * answer: no reply is sent, no journal step is recorded, and the request goes back to the queue.
 */
export const cutShortUnderAgent = (
  provider: StreamingProvider,
  label: string,
  mailboxes: Effect.Effect<AgentMailboxes, unknown, Scope.Scope>
) =>
  it.scoped(`${provider.name} on ${label}: a stream cut short under MainLoop.agent is neither replied nor journaled`, () =>
    Effect.gen(function*() {
      const stub = sseClient([
        provider.text({
          pieces: ["half an ", "ans"],
          every: "1 second",
          usage: { input: 5, output: 7 },
          cutShort: true
        })
      ])
      const env = yield* mailboxes
      const id = yield* env.requests.send(MainLoop.request("write", { requestId: "cut-1" }), { replyTo: "responses" })
      const loop = yield* MainLoop.agent({
        requests: env.requests,
        adapter: yield* provider.adapter(stub.client),
        prepare: (request: string) => Effect.succeed(Prompt.make({ name: "essay", instructions: "", input: request })),
        config: {
          deadLetters: { mailbox: env.letters, policy: yield* DeadLetter.policy({ maxDeliveryCount: 5 }) }
        }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
      for (let t = 0; t < 5; t++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      yield* Fiber.join(fiber)
      expect(yield* env.responses.receive()).toEqual([]) // not replied: the half answer is no answer
      expect(yield* env.steps(id)).toBe(0) // nor journaled: a redelivery asks the model again
      expect(yield* env.letters.receive()).toEqual([])
      expect(yield* env.requests.approximateCount).toBe(1) // back in the queue, after its backoff
    }))

/**
 * Under `MainLoop.agent`, with a request deadline of 1.2 s on the REAL clock and an answer streaming a word every
 * 100 ms: whichever timer fires first (the loop's or the inner loop's), every reply says phase `response`.
 */
export const realClockDeadlinePhase = (provider: StreamingProvider, runs = 6) =>
  it.live(
    `${provider.name}: a deadline mid-stream under MainLoop.agent is phase response on the real clock (${runs} runs)`,
    () =>
      Effect.gen(function*() {
        const phases: Array<unknown> = []
        for (let run = 0; run < runs; run++) {
          const stub = sseClient([
            provider.text({ pieces: words.slice(0, 40), every: "100 millis", usage: { input: 1, output: 1 } })
          ])
          const env = yield* mailboxes
          const deadline = yield* Deadline.after("1200 millis")
          yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
          const loop = yield* agentLoop(env, yield* provider.adapter(stub.client))
          yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" })
          const [reply] = yield* env.responses.receive()
          phases.push(reply?.body.error?.details?.["phase"])
          expect(reply?.body.error?.details).toMatchObject({ reason: "deadline" })
          expect(reply?.body.error?.message).toContain("while the model was answering")
        }
        expect(phases).toEqual(Array.from({ length: runs }, () => "response"))
      }).pipe(Effect.scoped),
    60_000
  )

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

    it.scoped("a stream that ends before its final event is a failed response (phase response), never the answer", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.text({
            pieces: ["half an ", "ans"],
            every: "1 second",
            usage: { input: 5, output: 7 },
            cutShort: true
          })
        ])
        const adapter = yield* provider.adapter(stub.client)
        const session = yield* Session.make
        const budgetTracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
        const fiber = yield* Effect.fork(Effect.flip(journalFree(adapter.evaluate(
          Prompt.make({ name: "essay", instructions: "", input: "write" }),
          { session, budgetTracker }
        ))))
        for (let t = 0; t < 4; t++) {
          yield* settle
          yield* TestClock.adjust("1 second")
        }
        const error = yield* Fiber.join(fiber)
        expect([error._tag, error.phase, error.reason]).toEqual(["PromptEvaluationError", "response", "provider"])
        expect(error.detail).toContain(provider.finalEvent)
        expect(error.detail).toContain("cut short")
        expect(yield* session.events).toEqual([]) // no turn recorded: nothing was answered
      }))

    it.scoped("a stream cut short is retried like any broken stream: the retry's whole answer is the answer", () =>
      Effect.gen(function*() {
        const stub = sseClient([
          provider.text({ pieces: ["half"], every: "1 second", usage: { input: 5, output: 7 }, cutShort: true }),
          provider.text({ pieces: ["whole ", "answer"], every: "1 second", usage: { input: 5, output: 9 } })
        ])
        const adapter = yield* provider.adapter(stub.client, { retry: Schedule.recurs(2) })
        const fiber = yield* Effect.fork(adapter.evaluate(
          Prompt.make({ name: "essay", instructions: "", input: "write" }),
          { session: yield* Session.make }
        ))
        for (let t = 0; t < 6; t++) {
          yield* settle
          yield* TestClock.adjust("1 second")
        }
        const response = yield* Fiber.join(fiber)
        expect([response.text, response.usage]).toEqual(["whole answer", { inputTokens: 5, outputTokens: 9 }])
        expect(stub.bodies).toHaveLength(2)
      }))

    it.scoped(
      "one server-sent event over the parser's limit is a failed response (phase response), retried",
      () =>
        Effect.gen(function*() {
          const huge = "x".repeat(11 * 1024 * 1024) // the SSE parser's limit is 10 MiB
          const full = provider.text({ pieces: ["fine"], every: "1 second", usage: { input: 1, output: 1 } })
          const once = sseClient([provider.text({ pieces: [huge], every: "1 second", usage: { input: 1, output: 1 } })])
          const error = yield* Effect.flip(journalFree((yield* provider.adapter(once.client)).evaluate(
            Prompt.make({ name: "essay", instructions: "", input: "write" }),
            { session: yield* Session.make }
          )))
          expect([error._tag, error.phase, error.reason]).toEqual(["PromptEvaluationError", "response", "provider"])
          expect(error.detail).toContain("too large")
          const twice = sseClient([
            provider.text({ pieces: [huge], every: "1 second", usage: { input: 1, output: 1 } }),
            full
          ])
          const fiber = yield* Effect.fork(
            (yield* provider.adapter(twice.client, { retry: Schedule.recurs(1) })).evaluate(
              Prompt.make({ name: "essay", instructions: "", input: "write" }),
              { session: yield* Session.make }
            )
          )
          yield* settle
          yield* TestClock.adjust("1 second")
          expect((yield* Fiber.join(fiber)).text).toBe("fine")
        }),
      60_000
    )

    it.scoped("a stream of only empty deltas does not beat: its heartbeat ages, and under the agent the lease runs out", () =>
      Effect.gen(function*() {
        const empty = Array.from({ length: 60 }, () => "")
        const stub = sseClient([provider.text({ pieces: empty, every: "10 seconds", usage: { input: 1, output: 1 } })])
        const adapter = yield* provider.adapter(stub.client)
        const heartbeat = yield* Heartbeat.make
        const beats = yield* Ref.make(0)
        yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
        yield* Effect.fork(adapter.evaluate(
          Prompt.make({ name: "essay", instructions: "", input: "write" }),
          { session: yield* Session.make, heartbeat }
        ))
        for (let t = 0; t < 12; t++) {
          yield* settle
          yield* TestClock.adjust("10 seconds")
        }
        yield* settle
        expect(yield* Ref.get(beats)).toBe(1) // the turn's own beat, none for 110 s of empty deltas
        expect(Duration.toSeconds(yield* heartbeat.elapsed)).toBeGreaterThanOrEqual(110)

        const again = sseClient([provider.text({ pieces: empty, every: "10 seconds", usage: { input: 1, output: 1 } })])
        const env = yield* mailboxes
        yield* env.requests.send(MainLoop.request("write"), { replyTo: "responses" })
        const loop = yield* agentLoop(env, yield* provider.adapter(again.client))
        yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
        let redelivered: ReadonlyArray<{ readonly deliveryCount: number }> = []
        for (let t = 0; t < 30 && redelivered.length === 0; t++) {
          yield* TestClock.adjust("10 seconds")
          yield* settle
          redelivered = yield* env.requests.receive()
        }
        expect(redelivered.map((m) => m.deliveryCount)).toEqual([2]) // another receiver got it mid-stream
      }))

    it.live(
      "a provider that never stops writing is stopped at Journal.maxStepBytes: typed, and read no further",
      () =>
        Effect.gen(function*() {
          const delta = "é".repeat(32 * 1024) // 64 KiB in UTF-8, 32 Ki UTF-16 units
          let sent = 0
          function* deltas() {
            // 16 MiB (4 times the limit), then the connection stays open: it never sends its final event.
            for (; sent < 256; sent++) yield delta
          }
          const stub = sseClient([provider.endless(deltas())])
          const adapter = yield* provider.adapter(stub.client)
          const result = yield* Effect.either(journalFree(adapter.evaluate(
            Prompt.make({ name: "essay", instructions: "", input: "write" }),
            { session: yield* Session.make }
          ))).pipe(Effect.timeout("30 seconds"))
          expect(result._tag).toBe("Left") // not an answer of megabytes
          const error = yield* Effect.flip(result)
          expect([error._tag, error.phase, error.reason]).toEqual(["PromptEvaluationError", "response", "provider"])
          expect(error.detail).toContain("Journal.maxStepBytes")
          expect(error.providerPayload).toEqual({ limit_bytes: Journal.maxStepBytes })
          // The reader cancelled the stream at the limit: the stub wrote little past it.
          expect(stub.written.bytes).toBeGreaterThan(Journal.maxStepBytes)
          expect(stub.written.bytes).toBeLessThan(Journal.maxStepBytes + 2 * 1024 * 1024)
          expect(sent).toBeLessThan(100)
        }).pipe(Effect.scoped),
      60_000
    )

    it.scoped("a deadline mid-stream under MainLoop.agent replies phase response (TestClock)", () =>
      Effect.gen(function*() {
        const stub = sseClient([provider.text({ pieces: words, every: "10 seconds", usage: { input: 1, output: 1 } })])
        const env = yield* mailboxes
        const deadline = yield* Deadline.after("35 seconds")
        yield* env.requests.send(MainLoop.request("write", { deadline }), { replyTo: "responses" })
        const loop = yield* agentLoop(env, yield* provider.adapter(stub.client))
        const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
        for (let t = 0; t < 5; t++) {
          yield* settle
          yield* TestClock.adjust("10 seconds")
        }
        yield* Fiber.join(fiber)
        const [reply] = yield* env.responses.receive()
        expect(reply?.body.error?.details).toMatchObject({ phase: "response", reason: "deadline" })
      }))
  })
