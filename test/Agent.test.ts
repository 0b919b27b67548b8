import { describe, expect, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Fiber, Option, Ref, Schedule, Schema, Stream, TestClock } from "effect"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import * as Budget from "../src/Budget.js"
import * as Deadline from "../src/Deadline.js"
import * as Heartbeat from "../src/Heartbeat.js"
import * as InnerLoop from "../src/InnerLoop.js"
import * as Journal from "../src/Journal.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import type * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import type { PromptEvaluationError, ProviderAdapter } from "../src/ProviderAdapter.js"
import * as Session from "../src/Session.js"
import * as Subagent from "../src/Subagent.js"
import * as Tool from "../src/Tool.js"
import * as ToolExecutor from "../src/ToolExecutor.js"
import { refusedOptions } from "./helpers.js"
import { journalFree } from "./support/journalFree.js"

const settle = Effect.repeatN(Effect.yieldNow(), 30)

const echo = Tool.make({
  name: "echo",
  description: "Echoes its text",
  parameters: Schema.Struct({ text: Schema.String }),
  success: Schema.String,
  handler: ({ text }) => Effect.succeed(text)
})

const evaluate = <Out>(
  adapter: ScriptedAdapter.Scripted,
  prompt: Prompt.Prompt<Out>,
  options?: { deadline?: Deadline.Deadline; budgetTracker?: Budget.BudgetTracker; heartbeat?: Heartbeat.Heartbeat }
) =>
  Effect.flatMap(
    Session.make,
    (session) =>
      Effect.map(journalFree(adapter.evaluate(prompt, { session, ...options })), (response) => ({ response, session }))
  )

describe("InnerLoop with the scripted adapter", () => {
  it.effect("a maxTurns that is not a positive integer is a ParseError when the adapter is made", () =>
    Effect.gen(function*() {
      for (const maxTurns of [0, -1, 2.5, Number.NaN]) {
        const error = yield* Effect.flip(ScriptedAdapter.make([], { maxTurns }))
        expect(refusedOptions(error)).toEqual(["maxTurns"])
        expect(error.message).toContain("InnerLoop.makeAdapter options")
      }
    }))

  it.effect("runs tool calls and returns the final output; the session records calls, params, results and usage", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "echo", params: { text: "hi" } }], usage: { inputTokens: 10, outputTokens: 5 } },
        { output: { answer: 42 }, usage: { inputTokens: 20, outputTokens: 3 } }
      ])
      const prompt = Prompt.make({
        name: "answer",
        instructions: "Answer.",
        input: "What is it?",
        tools: [echo],
        output: Schema.Struct({ answer: Schema.Number })
      })
      const { response, session } = yield* evaluate(adapter, prompt)
      expect(response.output).toEqual({ answer: 42 })
      expect(response.usage).toEqual({ inputTokens: 30, outputTokens: 8 })
      const events = yield* session.events
      expect(events.map((e) => e._tag)).toEqual(["ProviderCall", "ToolCall", "ToolResult", "ProviderCall"])
      expect(events[1]).toMatchObject({ toolName: "echo", params: { text: "hi" } })
      expect(events[2]).toMatchObject({ ok: true, value: "hi" })
      expect(yield* session.usage).toEqual({ inputTokens: 30, outputTokens: 8 })
      const requests = yield* adapter.requests
      expect(requests[1]!.messages.at(-1)).toMatchObject({ role: "tool", content: "\"hi\"" })
    }))

  it.effect("a failing tool, bad parameters and an unknown tool become results the model sees", () =>
    Effect.gen(function*() {
      const broken = Tool.make({
        name: "broken",
        description: "Always fails",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: () => Effect.fail(new Error("disk full"))
      })
      const adapter = yield* ScriptedAdapter.make([
        {
          toolCalls: [
            { name: "broken", params: {} },
            { name: "echo", params: { text: 7 } },
            { name: "nope", params: {} }
          ]
        },
        { text: "gave up" }
      ])
      const { response } = yield* evaluate(
        adapter,
        Prompt.make({ name: "p", instructions: "", tools: [echo, broken] })
      )
      expect(response.output).toBe("gave up")
      const toolMessages = (yield* adapter.requests)[1]!.messages.filter((m) => m.role === "tool").map((m) => m.content)
      expect(toolMessages[0]).toContain("disk full")
      expect(toolMessages[1]).toContain("invalid parameters for \"echo\"")
      expect(toolMessages[2]).toContain("unknown tool \"nope\"")
    }))

  it.effect("an answer that does not decode fails with reason output and the parse error", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([{ output: { answer: "forty-two" } }, { text: "not json" }])
      const prompt = Prompt.make({ name: "p", instructions: "", output: Schema.Struct({ answer: Schema.Number }) })
      const first = yield* Effect.flip(evaluate(adapter, prompt))
      expect([first.phase, first.reason]).toEqual(["response", "output"])
      expect(first.detail).toContain("answer")
      const second = yield* Effect.flip(evaluate(adapter, prompt))
      expect(second.detail).toContain("not JSON")
    }))

  it.effect("a budget exceeded mid-evaluation stops it with reason budget, naming the dimension", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "echo", params: { text: "a" } }], usage: { inputTokens: 40, outputTokens: 20 } },
        { toolCalls: [{ name: "echo", params: { text: "b" } }], usage: { inputTokens: 40, outputTokens: 20 } },
        { text: "never reached" }
      ])
      const budgetTracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 100 }))
      const error = yield* Effect.flip(
        evaluate(adapter, Prompt.make({ name: "p", instructions: "", tools: [echo] }), { budgetTracker })
      )
      expect([error.phase, error.reason]).toEqual(["response", "budget"])
      expect(error.detail).toContain("totalTokens")
      expect(error.providerPayload).toEqual({ dimension: "totalTokens" })
      expect((yield* adapter.requests).length).toBe(2)
    }))

  it.effect("provider retries re-check the deadline before each attempt", () =>
    Effect.gen(function*() {
      const flaky = yield* ScriptedAdapter.make([{ fail: "503" }, { fail: "503" }, { text: "ok" }], {
        retry: Schedule.recurs(3)
      })
      expect((yield* evaluate(flaky, Prompt.make({ name: "p", instructions: "" }))).response.output).toBe("ok")

      const slow = yield* ScriptedAdapter.make(
        [{ fail: "503", latency: "2 seconds" }, { fail: "503", latency: "2 seconds" }, { text: "late" }],
        { retry: Schedule.spaced("2 seconds") }
      )
      const deadline = yield* Deadline.after("5 seconds")
      const fiber = yield* Effect.fork(
        Effect.flip(evaluate(slow, Prompt.make({ name: "p", instructions: "" }), { deadline }))
      )
      for (let i = 0; i < 10; i++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      const error = yield* Fiber.join(fiber)
      expect([error.phase, error.reason]).toEqual(["request", "deadline"])
      expect((yield* slow.requests).length).toBeLessThanOrEqual(2) // no attempt after the deadline
    }))

  it.effect("a wait between retries ends at the deadline, not when the wait would", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([{ fail: "503" }, { text: "too late" }], {
        retry: Schedule.spaced("60 seconds")
      })
      const deadline = yield* Deadline.after("5 seconds")
      const fiber = yield* Effect.fork(
        Effect.flip(evaluate(adapter, Prompt.make({ name: "p", instructions: "" }), { deadline }))
      )
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* settle
      const error = yield* Fiber.join(fiber) // done at 5 s: no adjustment to 60 s was needed
      expect([error.phase, error.reason]).toEqual(["request", "deadline"])
      expect(error.providerPayload).toEqual({ deadline_expires_at: deadline.iso })
      expect((yield* adapter.requests).length).toBe(1)
    }))
})

describe("InnerLoop with a streaming adapter", () => {
  /** A streamed answer: `count` words, one every `every`, then the usage; `breakAfter` words then a failure. */
  const streamed =
    (count: number, every: Duration.DurationInput, breakAfter?: number): InnerLoop.CompleteStream => () => {
      const words = Stream.range(1, count).pipe(
        Stream.mapEffect((i) => Effect.as(Effect.sleep(every), { _tag: "Text" as const, delta: `w${i} ` }))
      )
      return breakAfter === undefined
        ? Stream.concat(words, Stream.make({ _tag: "Usage" as const, usage: { inputTokens: 5, outputTokens: count } }))
        : Stream.concat(
          Stream.take(words, breakAfter),
          Stream.fail(new InnerLoop.ProviderError({ detail: "connection reset" }))
        )
    }

  it.scoped("a stream of 100 words over 10 s beats once per beatInterval, not once per word", () =>
    Effect.gen(function*() {
      const adapter = yield* InnerLoop.makeAdapter("streamed", { stream: streamed(100, "100 millis") }, {
        beatInterval: "1 second"
      })
      const heartbeat = yield* Heartbeat.make
      const beats = yield* Ref.make(0)
      yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
      const fiber = yield* Effect.fork(
        adapter.evaluate(Prompt.make({ name: "p", instructions: "" }), { session: yield* Session.make, heartbeat })
      )
      for (let t = 0; t < 11; t++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      const response = yield* Fiber.join(fiber)
      expect(response.text.split(" ").filter((word) => word.length > 0)).toHaveLength(100)
      expect(response.usage).toEqual({ inputTokens: 5, outputTokens: 100 })
      // One beat for the turn, then one per second of streaming (the first word, then every 10th).
      expect(yield* Ref.get(beats)).toBe(11)
    }))

  it.effect("a beatInterval that is not a finite duration is a ParseError naming it", () =>
    Effect.gen(function*() {
      for (const beatInterval of ["soon", -1, Infinity]) {
        const error = yield* Effect.flip(InnerLoop.makeAdapter("streamed", { stream: streamed(1, "1 second") }, {
          beatInterval: beatInterval as Duration.DurationInput
        }))
        expect(refusedOptions(error)).toEqual(["beatInterval"])
      }
    }))

  it.effect("a stream that breaks is a failed request: a deadline during the wait before its retry is phase request", () =>
    Effect.gen(function*() {
      const adapter = yield* InnerLoop.makeAdapter("streamed", { stream: streamed(10, "1 second", 3) }, {
        retry: Schedule.spaced("1 minute")
      })
      const deadline = yield* Deadline.after("10 seconds")
      const fiber = yield* Effect.fork(
        Effect.flip(journalFree(adapter.evaluate(Prompt.make({ name: "p", instructions: "" }), {
          session: yield* Session.make,
          deadline
        })))
      )
      for (let t = 0; t < 10; t++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      const error = yield* Fiber.join(fiber)
      expect([error.phase, error.reason]).toEqual(["request", "deadline"])
    }))
})

describe("a streamed turn from a hostile provider (InnerLoop, any adapter)", () => {
  const prompt = Prompt.make({ name: "p", instructions: "" })
  const usage: InnerLoop.TurnPart = { _tag: "Usage", usage: { inputTokens: 1, outputTokens: 1 } }
  const adapterOf = (parts: InnerLoop.CompleteStream) => InnerLoop.makeAdapter("hostile", { stream: parts })

  it.effect("a stream that ends without its final part (the usage) is a failed response, not the answer", () =>
    Effect.gen(function*() {
      const adapter = yield* adapterOf(() => Stream.make({ _tag: "Text" as const, delta: "half an answ" }))
      const session = yield* Session.make
      const error = yield* Effect.flip(journalFree(adapter.evaluate(prompt, { session })))
      expect([error.phase, error.reason]).toEqual(["response", "provider"])
      expect(error.detail).toContain("cut short")
      expect(yield* session.events).toEqual([])
    }))

  it.effect("a stream cut short is retried; an empty stream too, and none is taken for an empty answer", () =>
    Effect.gen(function*() {
      const calls = yield* Ref.make(0)
      const adapter = yield* InnerLoop.makeAdapter("hostile", {
        stream: () =>
          Stream.unwrap(Effect.map(Ref.updateAndGet(calls, (n) => n + 1), (n) =>
            n === 1
              ? Stream.empty
              : n === 2
              ? Stream.make({ _tag: "Text" as const, delta: "ha" })
              : Stream.make({ _tag: "Text" as const, delta: "whole" }, usage)))
      }, { retry: Schedule.recurs(3) })
      const response = yield* adapter.evaluate(prompt, { session: yield* Session.make })
      expect([response.text, yield* Ref.get(calls)]).toEqual(["whole", 3])
    }))

  it.effect("the turn's size is counted in UTF-8 bytes: 1.5 M '€' (4.7 MB, 1.5 M UTF-16 units) is refused mid-stream", () =>
    Effect.gen(function*() {
      const pulled = yield* Ref.make(0)
      const euros = "€".repeat(64 * 1024)
      const adapter = yield* adapterOf(() =>
        Stream.concat(
          Stream.repeatEffect(Effect.as(Ref.update(pulled, (n) => n + 1), { _tag: "Text" as const, delta: euros }))
            .pipe(Stream.take(24)),
          Stream.make(usage)
        )
      )
      const result = yield* Effect.either(journalFree(adapter.evaluate(prompt, { session: yield* Session.make })))
      expect(result._tag).toBe("Left") // not a 4.7 MB answer
      const error = yield* Effect.flip(result)
      expect([error.phase, error.reason]).toEqual(["response", "provider"])
      expect(error.detail).toContain("Journal.maxStepBytes")
      // Stopped the moment it passed 4 MiB: 22 parts of 192 KiB, not all 24.
      expect(yield* Ref.get(pulled)).toBe(Math.ceil((Journal.maxStepBytes + 1) / (3 * 64 * 1024)))
    }))

  it.effect("a provider that never stops (tool-call arguments, reasoning) is stopped at the limit: typed, bounded", () =>
    Effect.gen(function*() {
      const pulled = yield* Ref.make(0)
      const adapter = yield* adapterOf(() =>
        // 1 GiB of arguments claimed, then the connection stays open: it never sends its final part.
        Stream.repeatEffect(
          Effect.as(Ref.update(pulled, (n) => n + 1), { _tag: "Progress" as const, bytes: 1024 * 1024 })
        ).pipe(Stream.take(1024), Stream.concat(Stream.never))
      )
      const error = yield* Effect.flip(journalFree(adapter.evaluate(prompt, { session: yield* Session.make })))
      expect([error.phase, error.reason, error.providerPayload]).toEqual([
        "response",
        "provider",
        { limit_bytes: Journal.maxStepBytes }
      ])
      expect(yield* Ref.get(pulled)).toBe(5)
    }))

  it.scoped("only progress beats: empty deltas, bare Progress and nonsense byte counts do not; a real one does", () =>
    Effect.gen(function*() {
      const idle: ReadonlyArray<InnerLoop.TurnPart> = [
        { _tag: "Text", delta: "" },
        { _tag: "Progress" },
        { _tag: "Progress", bytes: 0 },
        { _tag: "Progress", bytes: -5 },
        { _tag: "Progress", bytes: Number.NaN },
        { _tag: "Progress", bytes: Number.POSITIVE_INFINITY }
      ]
      const beatsOf = (parts: ReadonlyArray<InnerLoop.TurnPart>) =>
        Effect.gen(function*() {
          const adapter = yield* InnerLoop.makeAdapter("hostile", {
            stream: () =>
              Stream.fromIterable(parts).pipe(
                Stream.mapEffect((part) => Effect.as(Effect.sleep("10 seconds"), part)),
                Stream.concat(Stream.never)
              )
          }, { beatInterval: "1 second" })
          const heartbeat = yield* Heartbeat.make
          const beats = yield* Ref.make(0)
          yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
          const fiber = yield* Effect.fork(adapter.evaluate(prompt, { session: yield* Session.make, heartbeat }))
          for (let t = 0; t < parts.length + 1; t++) {
            yield* settle
            yield* TestClock.adjust("10 seconds")
          }
          yield* Fiber.interrupt(fiber)
          return { beats: yield* Ref.get(beats), idleSeconds: Duration.toSeconds(yield* heartbeat.elapsed) }
        })
      const quiet = yield* beatsOf(idle)
      expect(quiet.beats).toBe(1) // the turn's own beat only
      expect(quiet.idleSeconds).toBeGreaterThanOrEqual(60)
      const working = yield* beatsOf([...idle, { _tag: "Progress", bytes: 12 }, { _tag: "Text", delta: "a" }])
      expect(working.beats).toBe(3)
    }))
})

describe("deadlines on the agent path", () => {
  const recordDeadline = (seen: Ref.Ref<Option.Option<Deadline.Deadline | undefined>>) =>
    Tool.make({
      name: "look",
      description: "Records the deadline it sees",
      parameters: Schema.Struct({}),
      success: Schema.Null,
      handler: (_, context) => Effect.as(Ref.set(seen, Option.some(context.deadline)), null)
    })

  it.effect("the tool context receives the deadline; omitting it changes nothing", () =>
    Effect.gen(function*() {
      const seen = yield* Ref.make<Option.Option<Deadline.Deadline | undefined>>(Option.none())
      const prompt = Prompt.make({ name: "p", instructions: "", tools: [recordDeadline(seen)] })
      const turns = [{ toolCalls: [{ name: "look", params: {} }] }, { text: "done" }]
      const deadline = yield* Deadline.after("1 minute")
      yield* evaluate(yield* ScriptedAdapter.make(turns), prompt, { deadline })
      expect(Option.getOrThrow(yield* Ref.get(seen))).toBe(deadline)
      const { response } = yield* evaluate(yield* ScriptedAdapter.make(turns), prompt)
      expect(response.output).toBe("done")
      expect(Option.getOrThrow(yield* Ref.get(seen))).toBeUndefined()
    }))

  it.effect("an already-expired deadline object fails in preflight; the provider is never called", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([{ text: "x" }])
      const deadline = yield* Deadline.after("1 second")
      yield* TestClock.adjust("2 seconds")
      const error = yield* Effect.flip(evaluate(adapter, Prompt.make({ name: "p", instructions: "" }), { deadline }))
      expect([error.phase, error.reason]).toEqual(["preflight", "deadline"])
      expect(yield* adapter.requests).toEqual([])
    }))

  it.effect("a deadline that passed before a provider request never reaches the provider (phase request)", () =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([{ text: "x" }])
      const deadline = yield* Deadline.after("1 second")
      // Inherited (not passed), and overrun by uninterruptible work before the evaluation starts.
      const caught = yield* Ref.make<PromptEvaluationError | undefined>(undefined)
      yield* Effect.uninterruptible(
        Effect.zipRight(
          TestClock.adjust("2 seconds"),
          Effect.flatMap(
            Effect.flip(evaluate(adapter, Prompt.make({ name: "p", instructions: "" }))),
            (e) => Ref.set(caught, e)
          )
        )
      ).pipe(Deadline.within(deadline), Effect.ignore)
      const error = (yield* Ref.get(caught))!
      expect([error.phase, error.reason]).toEqual(["request", "deadline"])
      expect(error.providerPayload).toEqual({ deadline_expires_at: "1970-01-01T00:00:01.000Z" })
      expect(yield* adapter.requests).toEqual([])
    }))

  it.effect("a handler raising DeadlineExceededError aborts with phase tool, reason deadline and the ISO payload", () =>
    Effect.gen(function*() {
      const giveUp = Tool.make({
        name: "give-up",
        description: "Knows it cannot finish in time",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: (_, { deadline }) =>
          Effect.fail(new Deadline.DeadlineExceededError({ expiresAt: deadline!.expiresAt }))
      })
      const adapter = yield* ScriptedAdapter.make([{ toolCalls: [{ name: "give-up", params: {} }] }, { text: "no" }])
      const deadline = yield* Deadline.after("1 minute")
      const error = yield* Effect.flip(
        evaluate(adapter, Prompt.make({ name: "p", instructions: "", tools: [giveUp] }), { deadline })
      )
      expect([error.phase, error.reason]).toEqual(["tool", "deadline"])
      expect(error.providerPayload).toEqual({ deadline_expires_at: deadline.iso })
      expect((yield* adapter.requests).length).toBe(1)
    }))

  it.effect("a handler that simply runs too long is interrupted at the deadline: phase tool, reason deadline", () =>
    Effect.gen(function*() {
      const interrupted = yield* Ref.make(false)
      const slow = Tool.make({
        name: "slow",
        description: "Ignores the deadline",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: () =>
          Effect.as(Effect.sleep("1 hour"), "late").pipe(Effect.onInterrupt(() => Ref.set(interrupted, true)))
      })
      const adapter = yield* ScriptedAdapter.make([{ toolCalls: [{ name: "slow", params: {} }] }, { text: "no" }])
      const deadline = yield* Deadline.after("10 seconds")
      const fiber = yield* Effect.fork(
        Effect.flip(evaluate(adapter, Prompt.make({ name: "p", instructions: "", tools: [slow] }), { deadline }))
      )
      yield* settle
      yield* TestClock.adjust("10 seconds")
      const error = yield* Fiber.join(fiber)
      expect([error.phase, error.reason]).toEqual(["tool", "deadline"])
      expect(error.providerPayload).toEqual({ deadline_expires_at: "1970-01-01T00:00:10.000Z" })
      expect(yield* Ref.get(interrupted)).toBe(true)
    }))

  it.effect("the handler is never called when the deadline already passed", () =>
    Effect.gen(function*() {
      const called = yield* Ref.make(false)
      const tool = Tool.make({
        name: "t",
        description: "",
        parameters: Schema.Struct({}),
        success: Schema.Null,
        handler: () => Effect.as(Ref.set(called, true), null)
      })
      const deadline = yield* Deadline.after("1 second")
      yield* TestClock.adjust("1 second")
      const adapter = yield* ScriptedAdapter.make([])
      const error = yield* Effect.flip(journalFree(ToolExecutor.execute({ id: "c", name: "t", params: {} }, {
        deadline,
        heartbeat: undefined,
        beat: Effect.void,
        runContext: undefined,
        prompt: Prompt.make({ name: "p", instructions: "", tools: [tool] }) as Prompt.Prompt<unknown>,
        session: yield* Session.make,
        budgetTracker: undefined,
        adapter,
        journal: undefined,
        idempotencyKey: "t",
        fencingToken: undefined
      })))
      expect([error.phase, error.reason]).toEqual(["tool", "deadline"])
      expect(yield* Ref.get(called)).toBe(false)
    }))

  it.effect("a subagent with a later deadline still stops at the parent's, as a deadline failure of the parent", () =>
    Effect.gen(function*() {
      const childDeadline = yield* Ref.make<Deadline.Deadline | undefined>(undefined)
      const delegate = Tool.make({
        name: "delegate",
        description: "Asks a subagent",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: (_, context) =>
          Effect.gen(function*() {
            const own = yield* Deadline.after("1 hour")
            const child = Prompt.make({
              name: "child",
              instructions: "",
              tools: [Tool.make({
                name: "peek",
                description: "",
                parameters: Schema.Struct({}),
                success: Schema.Null,
                handler: (_, childContext) => Effect.as(Ref.set(childDeadline, childContext.deadline), null)
              })]
            })
            const response = yield* Subagent.evaluate(context, child, { deadline: own })
            return response.output
          })
      })
      const adapter = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "delegate", params: {} }] }, // parent
        { toolCalls: [{ name: "peek", params: {} }] }, // child
        { text: "child thinking", latency: "1 hour" }, // child, too slow
        { text: "parent never gets here" }
      ])
      const parentDeadline = yield* Deadline.after("30 seconds")
      const fiber = yield* Effect.fork(Effect.flip(
        evaluate(adapter, Prompt.make({ name: "parent", instructions: "", tools: [delegate] }), {
          deadline: parentDeadline
        })
      ))
      yield* settle
      yield* TestClock.adjust("30 seconds")
      const error = yield* Fiber.join(fiber)
      expect([error.promptName, error.phase, error.reason]).toEqual(["parent", "tool", "deadline"])
      expect(DateTime.toEpochMillis((yield* Ref.get(childDeadline))!.expiresAt)).toBe(30_000)
    }))
})

describe("subagents share the parent's heartbeat and budget tracker", () => {
  it.effect("the child's beats reach the parent's heartbeat and its tokens count against the parent's budget", () =>
    Effect.gen(function*() {
      const delegate = Tool.make({
        name: "delegate",
        description: "",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: (_, context) =>
          Effect.map(Subagent.evaluate(context, Prompt.make({ name: "child", instructions: "" })), (r) => r.output)
      })
      const adapter = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "delegate", params: {} }], usage: { inputTokens: 10, outputTokens: 1 } },
        { text: "child answer", usage: { inputTokens: 100, outputTokens: 10 } },
        { text: "parent answer", usage: { inputTokens: 20, outputTokens: 2 } }
      ])
      const heartbeat = yield* Heartbeat.make
      const beats = yield* Ref.make(0)
      yield* Effect.scoped(Effect.gen(function*() {
        yield* heartbeat.onBeat(Ref.update(beats, (n) => n + 1))
        const budgetTracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
        const { response } = yield* evaluate(
          adapter,
          Prompt.make({ name: "parent", instructions: "", tools: [delegate] }),
          { budgetTracker, heartbeat }
        )
        expect(response.output).toBe("parent answer")
        expect((yield* budgetTracker.consumed).totalTokens).toBe(143) // parent 33 + child 110
      }))
      // Parent: 2 iterations + 2 around the tool; child: 1 iteration.
      expect(yield* Ref.get(beats)).toBe(5)
    }))
})

describe("MainLoop.agent", () => {
  const mailboxes = Effect.gen(function*() {
    const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
      name: "requests"
    })
    const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
    return { requests, responses, resolver: MailboxResolver.fromMailboxes(requests, responses) }
  })

  /** A step of a build, three calls below the tool, that beats through the environment: it is handed nothing. */
  const buildStep = () => Effect.zipRight(Heartbeat.beat, Effect.sleep("30 seconds"))
  const buildStage = () => buildStep()
  const buildAll = () => Effect.repeatN(buildStage(), 39)

  /**
   * A tool that runs 20 minutes, beating every 30 s — through its context's `beat`, or from a helper three
   * calls deep through `Heartbeat.beat` — or not at all when stuck.
   */
  const container = (beats: "context" | "environment" | false) =>
    Tool.make({
      name: "container",
      description: "Runs a long job",
      parameters: Schema.Struct({}),
      success: Schema.String,
      handler: (_, { beat }) =>
        beats === "environment" ? Effect.as(buildAll(), "built") : Effect.gen(function*() {
          for (let i = 0; i < 40; i++) {
            if (beats) yield* beat
            yield* Effect.sleep("30 seconds")
          }
          return "built"
        })
    })

  const agentLoop = (env: Effect.Effect.Success<typeof mailboxes>, beats: "context" | "environment" | false) =>
    Effect.gen(function*() {
      const adapter = yield* ScriptedAdapter.make([
        { toolCalls: [{ name: "container", params: {} }] },
        { text: "all done" }
      ])
      return yield* MainLoop.agent({
        requests: env.requests,
        adapter,
        prepare: (request: string) =>
          Effect.succeed(Prompt.make({ name: "build", instructions: "", input: request, tools: [container(beats)] })),
        config: { leaseExtender: { interval: "20 seconds", extension: "60 seconds" } }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
    })

  for (const beats of ["context", "environment"] as const) {
    it.scoped(
      `a tool beating every 30 s for 20 minutes (${
        beats === "context" ? "its context's beat" : "Heartbeat.beat three calls deep"
      }) keeps the request invisible (visibility 60 s) and completes`,
      () =>
        Effect.gen(function*() {
          const env = yield* mailboxes
          yield* env.requests.send(MainLoop.request("build it"), { replyTo: "responses" })
          const loop = yield* agentLoop(env, beats)
          const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
          for (let t = 0; t < 41; t++) {
            yield* settle
            expect(yield* env.requests.receive()).toEqual([]) // a second receiver sees nothing
            yield* TestClock.adjust("30 seconds")
          }
          yield* Fiber.join(fiber)
          const [reply] = yield* env.responses.receive()
          expect(reply!.body.output).toBe("all done")
          expect(yield* env.requests.approximateCount).toBe(0)
        })
    )
  }

  it.scoped("the same tool without beats (stuck) lets the request reappear after the visibility timeout", () =>
    Effect.gen(function*() {
      const env = yield* mailboxes
      yield* env.requests.send(MainLoop.request("build it"), { replyTo: "responses" })
      const loop = yield* agentLoop(env, false)
      yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
      yield* settle
      yield* TestClock.adjust("59 seconds")
      expect(yield* env.requests.receive()).toEqual([])
      yield* TestClock.adjust("1 second")
      const [again] = yield* env.requests.receive()
      expect(again!.deliveryCount).toBe(2)
    }))

  it.scoped("the request's deadline overrides the config's timeout, which applies when the request has none", () =>
    Effect.gen(function*() {
      const env = yield* mailboxes
      const seen: Array<number | undefined> = []
      const adapter = yield* ScriptedAdapter.make([{ text: "a" }, { text: "b" }])
      const loop = yield* MainLoop.agent({
        requests: env.requests,
        adapter,
        prepare: (request: string, { deadline }) =>
          Effect.sync(() => {
            seen.push(deadline && DateTime.toEpochMillis(deadline.expiresAt))
            return Prompt.make({ name: "p", instructions: "", input: request })
          }),
        config: { timeout: "1 minute" }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      yield* env.requests.send(MainLoop.request("own", { deadline: yield* Deadline.after("5 seconds") }))
      yield* env.requests.send(MainLoop.request("none"))
      yield* loop.run({ maxIterations: 2, waitTime: 0 })
      expect(seen).toEqual([5_000, 60_000])
      const error = yield* Effect.flip(
        MainLoop.make({ requests: env.requests, execute: () => Effect.succeed("x"), config: { timeout: "10 millis" } })
      ).pipe(Effect.provideService(MailboxResolver, env.resolver))
      expect(error.message).toContain("at least 1 second")
    }))

  /** Runs `loop` for one request while 10 s pass, and returns the error of the reply it sent. */
  const errorAfter10Seconds = (env: Effect.Effect.Success<typeof mailboxes>, loop: MailboxWorker.Runnable) =>
    Effect.gen(function*() {
      const running = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0 }))
      yield* settle
      yield* TestClock.adjust("10 seconds")
      yield* Fiber.join(running)
      const [reply] = yield* env.responses.receive()
      return reply!.body.error
    })

  /** An agent loop whose request has a 10 s deadline; `stage` decides where the work is when it passes. */
  const deadlineReply = (stage: "prepare" | "model" | "tool" | "finalize") =>
    Effect.gen(function*() {
      const env = yield* mailboxes
      const deadline = yield* Deadline.after("10 seconds")
      yield* env.requests.send(MainLoop.request("work", { deadline }), { replyTo: "responses" })
      const slowTool = Tool.make({
        name: "slow",
        description: "Never finishes in time",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: () => Effect.as(Effect.sleep("1 hour"), "late")
      })
      const adapter = yield* ScriptedAdapter.make(
        stage === "model"
          ? [{ text: "late", latency: "1 hour" }]
          : stage === "tool"
          ? [{ toolCalls: [{ name: "slow", params: {} }] }, { text: "done" }]
          : [{ text: "done" }]
      )
      const loop = yield* MainLoop.agent({
        requests: env.requests,
        adapter,
        prepare: (request: string) =>
          Effect.as(
            stage === "prepare" ? Effect.sleep("1 hour") : Effect.void,
            Prompt.make({
              name: "deadline-test",
              instructions: "",
              input: request,
              tools: stage === "tool" ? [slowTool] : [echo]
            })
          ),
        finalize: (response) => Effect.as(stage === "finalize" ? Effect.sleep("1 hour") : Effect.void, response.text)
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      return { error: yield* errorAfter10Seconds(env, loop), deadline }
    })

  for (
    const [stage, phase] of [
      ["prepare", "preflight"],
      ["model", "request"],
      ["tool", "tool"],
      ["finalize", "response"]
    ] as const
  ) {
    it.scoped(`a deadline that passes in ${stage}: the reply is a PromptEvaluationError, phase ${phase}, with the payload`, () =>
      Effect.gen(function*() {
        // Several times: which of the loop's timer and the agent's own notices first must not change the reply.
        const messages = new Set<string | undefined>()
        for (let run = 0; run < 5; run++) {
          const { deadline, error } = yield* deadlineReply(stage)
          messages.add(error?.message.replace(deadline.iso, "<deadline>"))
          expect(error?.tag).toBe("PromptEvaluationError")
          expect(error?.details).toMatchObject({
            phase,
            reason: "deadline",
            providerPayload: { deadline_expires_at: deadline.iso }
          })
        }
        expect(messages.size).toBe(1)
      }))
  }

  it.scoped("an adapter that ignores the deadline is stopped by the loop's timer, and the reply still says where", () =>
    Effect.gen(function*() {
      for (const [toolRunning, phase] of [[true, "tool"], [false, "request"]] as const) {
        const env = yield* mailboxes
        const deadline = yield* Deadline.after("10 seconds")
        yield* env.requests.send(MainLoop.request("work", { deadline }), { replyTo: "responses" })
        // Records a tool call in the session (or nothing: still waiting for the model), then hangs.
        const lazy: ProviderAdapter["Type"] = {
          name: "lazy",
          evaluate: (prompt, { session }) =>
            Effect.zipRight(
              toolRunning
                ? session.record({
                  _tag: "ToolCall",
                  promptName: prompt.name,
                  toolName: "compile",
                  callId: "c1",
                  params: {},
                  at: 0
                })
                : Effect.void,
              Effect.never
            )
        }
        const loop = yield* MainLoop.agent({
          requests: env.requests,
          adapter: lazy,
          prepare: (request: string) =>
            Effect.succeed(Prompt.make({ name: "lazy-test", instructions: "", input: request }))
        }).pipe(Effect.provideService(MailboxResolver, env.resolver))
        const error = yield* errorAfter10Seconds(env, loop)
        expect(error?.tag).toBe("PromptEvaluationError")
        expect(error?.details).toMatchObject({
          phase,
          reason: "deadline",
          promptName: "lazy-test",
          providerPayload: { deadline_expires_at: deadline.iso }
        })
        // Worded as the inner loop and the tool executor word it, whichever timer noticed the deadline.
        expect(error?.message).toContain(
          toolRunning
            ? `tool "compile" ran out of time: Deadline exceeded at ${deadline.iso}`
            : `deadline ${deadline.iso} passed`
        )
      }
    }))
})
