import { NodeFileSystem } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Schema, Scope, TestClock } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Budget from "../src/Budget.js"
import * as Dataset from "../src/Dataset.js"
import * as DeadLetter from "../src/DeadLetter.js"
import * as Deadline from "../src/Deadline.js"
import * as EvalLoop from "../src/EvalLoop.js"
import * as Evaluator from "../src/Evaluator.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as Session from "../src/Session.js"

const settle = Effect.repeatN(Effect.yieldNow(), 30)
const schemas = { input: Schema.Number, expected: Schema.Number }

describe("Dataset", () => {
  it.effect("decodes JSON Lines with the Schemas, skipping blank lines", () =>
    Effect.gen(function*() {
      const samples = yield* Dataset.fromJsonl(
        `{"id":"a","input":1,"expected":2}\n\n{"id":"b","input":2,"expected":4}\n`,
        schemas
      )
      expect(samples).toEqual([{ id: "a", input: 1, expected: 2 }, { id: "b", input: 2, expected: 4 }])
    }))

  it.effect("names the line of bad JSON, a Schema mismatch and a duplicate id", () =>
    Effect.gen(function*() {
      const bad = (text: string) => Effect.flip(Dataset.fromJsonl(text, schemas, "evals.jsonl"))
      const notJson = yield* bad(`{"id":"a","input":1,"expected":2}\n{oops`)
      expect(notJson.line).toBe(2)
      expect(notJson.message).toMatch(/^Dataset evals.jsonl, line 2: not JSON/)
      const mismatch = yield* bad(`\n\n{"id":"a","input":"one","expected":2}`)
      expect(mismatch.line).toBe(3)
      expect(mismatch.message).toContain("input")
      const duplicate = yield* bad(`{"id":"a","input":1,"expected":2}\n{"id":"a","input":1,"expected":2}`)
      expect(duplicate.message).toContain(`line 2: duplicate sample id "a"`)
    }))

  it.effect("loads a file, and a missing file is a DatasetError naming it", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "leasehold-dataset-"))
      const path = join(dir, "evals.jsonl")
      writeFileSync(path, `{"id":"x","input":3,"expected":6}\n`)
      expect((yield* Dataset.loadJsonl(path, schemas)).length).toBe(1)
      const missing = yield* Effect.flip(Dataset.loadJsonl(join(dir, "missing.jsonl"), schemas))
      expect(missing.line).toBe(0)
      expect(missing.message).toContain("missing.jsonl")
    }).pipe(Effect.provide(NodeFileSystem.layer)))
})

describe("Evaluators", () => {
  it.effect("exactMatch compares structurally, contains looks for text, allOf averages, anyOf takes the best", () =>
    Effect.gen(function*() {
      const session = yield* Session.make
      expect((yield* Evaluator.exactMatch({ a: [1, 2] }, { a: [1, 2] }, session)).passed).toBe(true)
      expect((yield* Evaluator.exactMatch("x", "y", session)).value).toBe(0)
      expect((yield* Evaluator.contains("the answer is 42", "42", session)).passed).toBe(true)
      const even: Evaluator.Evaluator<number, number> = (output) =>
        Effect.succeed(
          new Evaluator.Score({ value: output % 2 === 0 ? 1 : 0, passed: output % 2 === 0, reason: "even" })
        )
      const all = yield* Evaluator.allOf<number, number>(Evaluator.exactMatch, even)(4, 6, session)
      expect([all.value, all.passed]).toEqual([0.5, false])
      const any = yield* Evaluator.anyOf<number, number>(Evaluator.exactMatch, even)(4, 6, session)
      expect([any.value, any.passed]).toEqual([1, true])
      const error = yield* Effect.flip(Schema.decodeUnknown(Evaluator.Score)({ value: 1.5, passed: true, reason: "" }))
      expect(error.message).toContain("between 0 and 1")
    }))
})

describe("session-aware evaluators", () => {
  it.effect("usedTool, maxToolCalls and maxTokens read what the agent did", () =>
    Effect.gen(function*() {
      const session = yield* Session.make
      yield* session.record({ _tag: "ToolCall", promptName: "p", toolName: "search", callId: "1", params: {}, at: 0 })
      yield* session.record({ _tag: "ToolCall", promptName: "p", toolName: "search", callId: "2", params: {}, at: 0 })
      yield* session.record({
        _tag: "ProviderCall",
        promptName: "p",
        at: 0,
        durationMs: 5,
        usage: { inputTokens: 300, outputTokens: 50 }
      })
      expect((yield* Evaluator.usedTool("search")(null, null, session)).passed).toBe(true)
      expect((yield* Evaluator.usedTool("calculator")(null, null, session)).reason).toBe("never called calculator")
      expect((yield* Evaluator.maxToolCalls(1)(null, null, session)).passed).toBe(false)
      expect((yield* Evaluator.maxTokens(350)(null, null, session)).passed).toBe(true)
      expect((yield* Evaluator.maxTokens(349)(null, null, session)).reason).toBe("350 tokens (at most 349)")
    }))

  it.scoped("EvalLoop gives execute a session per sample and scores with it", () =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<number, number>, EvalLoop.EvalResult>({
        name: "evals"
      })
      const results = yield* MailboxMemory.make<EvalLoop.EvalResult>({ name: "results" })
      const loop = yield* EvalLoop.make({
        requests,
        execute: (n: number, { session }) =>
          Effect.as(
            n > 1
              ? session.record({ _tag: "ToolCall", promptName: "p", toolName: "calc", callId: "c", params: {}, at: 0 })
              : Effect.void,
            n
          ),
        evaluator: Evaluator.allOf<number, number>(Evaluator.exactMatch, Evaluator.usedTool("calc"))
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, results)))
      yield* EvalLoop.submitDataset(
        requests,
        [{ id: "a", input: 1, expected: 1 }, { id: "b", input: 2, expected: 2 }],
        {
          replyTo: "results"
        }
      )
      yield* loop.run({ maxIterations: 2, waitTime: 0 })
      const scores = (yield* EvalLoop.collectResults(results, 2, "1 second")).map((r) => [r.sampleId, r.score.value])
      expect(scores).toEqual([["a", 0.5], ["b", 1]])
    }))
})

describe("EvalLoop end to end", () => {
  it.scoped("20 samples × 2 experiments through a scripted execute: the report's figures, checked by hand", () =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<number, number>, EvalLoop.EvalResult>({
        name: "evals"
      })
      const results = yield* MailboxMemory.make<EvalLoop.EvalResult>({ name: "results" })
      const samples = Array.from({ length: 20 }, (_, i) => ({ id: `s${i + 1}`, input: i + 1, expected: 2 * (i + 1) }))
      // n % 5 == 0 fails; in "baseline", n % 3 == 0 answers 2n + 2 (even, but wrong). Sample n takes 10·n ms.
      const execute = (n: number, { experiment }: EvalLoop.EvalContext) =>
        Effect.gen(function*() {
          yield* TestClock.adjust(`${10 * n} millis`)
          if (n % 5 === 0) return yield* Effect.fail(new Error(`tool broke on ${n}`))
          return experiment === "baseline" && n % 3 === 0 ? 2 * n + 2 : 2 * n
        })
      const even: Evaluator.Evaluator<number, number> = (output) =>
        Effect.succeed(
          new Evaluator.Score({ value: output % 2 === 0 ? 1 : 0, passed: output % 2 === 0, reason: "even" })
        )
      const loop = yield* EvalLoop.make({
        requests,
        execute,
        evaluator: Evaluator.allOf<number, number>(Evaluator.exactMatch, even)
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, results)))

      yield* EvalLoop.submitDataset(requests, samples, { experiment: "baseline", replyTo: "results" })
      yield* EvalLoop.submitDataset(requests, samples, { experiment: "treatment", replyTo: "results" })
      yield* loop.run({ maxIterations: 40, waitTime: 0 })
      const collected = yield* EvalLoop.collectResults(results, 40, "1 second")
      expect(collected.length).toBe(40)
      const failed = collected.find((r) => r.sampleId === "s5" && r.experiment === "baseline")!
      expect(failed.error).toBe("Error: tool broke on 5")
      expect(failed.score.value).toBe(0)

      const report = EvalLoop.report(collected)
      // baseline: 16 successful (5, 10, 15, 20 failed); wrong: 3, 6, 9, 12, 18 → 11 passed;
      // scores 11 × 1 + 5 × 0.5 = 13.5; latency of successful: 10 × (210 − 50) / 16 = 100 ms.
      expect(report.experiments["baseline"]).toEqual({
        total: 20,
        successful: 16,
        failed: 4,
        passed: 11,
        passRate: 11 / 16,
        meanScore: 13.5 / 16,
        meanLatencyMs: 100
      })
      expect(report.experiments["treatment"]).toMatchObject({ successful: 16, passed: 16, passRate: 1, meanScore: 1 })
      expect(report).toMatchObject({ total: 40, successful: 32, passed: 27, passRate: 27 / 32, meanScore: 29.5 / 32 })
      expect(EvalLoop.compare(report, "baseline", "treatment")).toEqual({
        baseline: "baseline",
        treatment: "treatment",
        passRateDelta: 1 - 11 / 16,
        meanScoreDelta: 1 - 13.5 / 16,
        meanLatencyMsDelta: 0
      })
      expect(EvalLoop.compare(report, "baseline", "missing")).toBeUndefined()
    }))

  it.scoped("collectResults returns what arrived when the timeout passes", () =>
    Effect.gen(function*() {
      const results = yield* MailboxMemory.make<EvalLoop.EvalResult>({ name: "results" })
      const fiber = yield* Effect.fork(EvalLoop.collectResults(results, 3, "30 seconds"))
      yield* settle
      yield* TestClock.adjust("30 seconds")
      expect(yield* Fiber.join(fiber)).toEqual([])
    }))

  it.scoped("a sample's execution beats the loop's heartbeat, which keeps the eval message leased", () =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<number, number>, EvalLoop.EvalResult>({
        name: "evals"
      })
      const loop = yield* EvalLoop.make({
        requests,
        execute: (n: number, { heartbeat }) =>
          Effect.gen(function*() {
            for (let i = 0; i < 5; i++) {
              yield* heartbeat.beat
              yield* settle
              yield* TestClock.adjust("900 millis") // 4.5 s in all, against a 1 s visibility timeout
            }
            return n
          }),
        evaluator: Evaluator.exactMatch,
        config: { leaseExtender: { interval: 0, extension: "1 second" } }
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests)))
      yield* requests.send({ requestId: "r", experiment: "e", sample: { id: "s", input: 1, expected: 1 } })
      yield* loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "1 second" })
      expect(yield* requests.approximateCount).toBe(0) // the ack found its lease still valid
    }))
})

/** An eval requests mailbox, a results mailbox, dead letters, and a way to send samples of numbers. */
const evalSetup = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<number, number>, EvalLoop.EvalResult>({
    name: "evals"
  })
  const results = yield* MailboxMemory.make<EvalLoop.EvalResult>({ name: "results" })
  const deadLetters = yield* MailboxMemory.make<DeadLetter.DeadLetter<EvalLoop.EvalRequest<number, number>>, unknown>({
    name: "eval-dead-letters"
  })
  const send = (id: string, input: number, extra?: Partial<EvalLoop.EvalRequest<number, number>>) =>
    requests.send({ requestId: id, experiment: "e", sample: { id, input, expected: input }, ...extra }, {
      replyTo: "results"
    })
  const received = Effect.map(results.receive({ maxMessages: 10 }), (messages) => messages.map((m) => m.body))
  return { requests, results, deadLetters, send, received, resolver: MailboxResolver.fromMailboxes(requests, results) }
})

describe("EvalLoop on MainLoop's footing", () => {
  it.scoped("a hung sample is interrupted at the config's timeout: an error result, and the loop goes on", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      yield* env.send("hangs", 1)
      yield* env.send("quick", 2)
      const loop = yield* EvalLoop.make({
        requests: env.requests,
        execute: (n: number) => n === 1 ? Effect.never : Effect.succeed(n),
        evaluator: Evaluator.exactMatch,
        config: { timeout: "30 seconds" }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      const running = yield* Effect.fork(loop.run({ maxIterations: 2, waitTime: 0 }))
      yield* settle
      yield* TestClock.adjust("30 seconds")
      yield* Fiber.join(running)
      const [hung, quick] = yield* env.received
      expect(hung).toMatchObject({ sampleId: "hangs", latencyMs: 30_000 })
      expect(hung!.error).toMatch(/^DeadlineExceededError: Deadline exceeded at/)
      expect(hung!.score.value).toBe(0)
      expect(quick).toMatchObject({ sampleId: "quick", error: undefined })
      expect(quick!.score.passed).toBe(true)
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("a sample's own deadline wins over the config's timeout, and reaches execute", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      const deadline = yield* Deadline.after("5 seconds")
      yield* env.send("s", 1, { deadline })
      const seen: Array<string | undefined> = []
      const loop = yield* EvalLoop.make({
        requests: env.requests,
        execute: (_: number, context) =>
          Effect.zipRight(Effect.sync(() => seen.push(context.deadline?.iso)), Effect.never),
        evaluator: Evaluator.exactMatch,
        config: { timeout: "1 hour" }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      const running = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0 }))
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* Fiber.join(running)
      expect(seen).toEqual([deadline.iso])
      expect((yield* env.received).map((r) => r.latencyMs)).toEqual([5_000])
    }))

  it.scoped("a budget reaches execute as a tracker; exceeding it is an error result", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      yield* env.send("greedy", 1)
      const loop = yield* EvalLoop.make({
        requests: env.requests,
        execute: (n: number, { budgetTracker }) =>
          Effect.gen(function*() {
            yield* budgetTracker!.record("call-1", { inputTokens: 900, outputTokens: 200 })
            yield* budgetTracker!.check
            return n
          }),
        evaluator: Evaluator.exactMatch,
        config: { budget: yield* Budget.make({ maxTotalTokens: 1000 }) }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      const [result] = yield* env.received
      expect(result!.error).toBe("BudgetExceededError: Budget exceeded: totalTokens used 1100 of 1000")
    }))

  it.scoped("an evaluator that crashes, without dead letters: an error result and an ack, not a nack for ever", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      yield* env.send("s", 1)
      const loop = yield* EvalLoop.make({
        requests: env.requests,
        execute: (n: number) => Effect.succeed(n),
        evaluator: () => Effect.die(new Error("judge crashed"))
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      const [result] = yield* env.received
      expect(result!.error).toMatch(/^Defect: .*judge crashed/s)
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("with dead letters: a crashing sample is retried with backoff, then dead-lettered and answered", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      yield* env.send("poison", 1)
      const loop = yield* EvalLoop.make({
        requests: env.requests,
        execute: (n: number) => Effect.succeed(n),
        evaluator: () => Effect.die(new Error("judge crashed")),
        config: {
          deadLetters: { mailbox: env.deadLetters, policy: yield* DeadLetter.policy({ maxDeliveryCount: 2 }) }
        }
      }).pipe(Effect.provideService(MailboxResolver, env.resolver))
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      expect(yield* env.received).toEqual([]) // nacked with backoff: no result yet
      expect(yield* env.requests.receive({ visibilityTimeout: 0 })).toEqual([]) // hidden for 60 s
      yield* TestClock.adjust("60 seconds")
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      const [result] = yield* env.received
      expect(result).toMatchObject({ sampleId: "poison", experiment: "e" })
      expect(result!.error).toMatch(/judge crashed/)
      const [letter] = yield* env.deadLetters.receive()
      expect(letter!.body).toMatchObject({ requestId: "poison", deliveryCount: 2, lastErrorTag: "Defect" })
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("EvalLoop.layer: closing the scope lets the sample in flight finish and reply", () =>
    Effect.gen(function*() {
      const env = yield* evalSetup
      yield* env.send("slow", 7)
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        EvalLoop.layer({
          requests: env.requests,
          execute: (n: number) => Effect.as(Effect.sleep("2 seconds"), n),
          evaluator: Evaluator.exactMatch,
          shutdownTimeout: "10 seconds"
        }).pipe(Layer.provide(Layer.succeed(MailboxResolver, env.resolver))),
        scope
      )
      yield* settle
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* settle
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(closing)
      expect((yield* env.received).map((r) => [r.sampleId, r.score.passed])).toEqual([["slow", true]])
      expect(yield* env.requests.approximateCount).toBe(0)
    }))
})
