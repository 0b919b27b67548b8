import { describe, expect, it } from "@effect/vitest"
import { DateTime, Effect, Exit, Fiber, HashMap, Layer, Logger, Ref, Schema, Scope, TestClock } from "effect"
import * as DeadLetter from "../src/DeadLetter.js"
import * as Deadline from "../src/Deadline.js"
import * as Health from "../src/Health.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import { refusedOptions } from "./helpers.js"

class ToolBroke extends Error {
  readonly _tag = "ToolBroke"
}
class Permanent extends Error {
  readonly _tag = "Permanent"
}

const settle = Effect.repeatN(Effect.yieldNow(), 30)

/** A requests mailbox, a responses mailbox and a resolver that knows both. */
const setup = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<
    MainLoop.MainLoopRequest<string>,
    MainLoop.MainLoopResult<string>
  >({ name: "requests" })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  const deadLetters = yield* MailboxMemory.make<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<string>>, unknown>({
    name: "dead-letters"
  })
  const send = (body: string, options?: Parameters<typeof MainLoop.request<string>>[1]) =>
    requests.send(MainLoop.request(body, options), { replyTo: "responses" })
  const replies = Effect.map(responses.receive({ maxMessages: 10 }), (messages) => messages.map((m) => m.body))
  return {
    requests,
    responses,
    deadLetters,
    send,
    replies,
    resolver: MailboxResolver.fromMailboxes(requests, responses)
  }
})

const withResolver = <A, E, R>(resolver: MailboxResolver["Type"], effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, MailboxResolver, resolver)

describe("MainLoop", () => {
  it.scoped("logs inside execute carry the requestId next to the caller's annotations", () =>
    Effect.gen(function*() {
      const { requests, resolver, send } = yield* setup
      yield* send("first", { requestId: "req-a" })
      yield* send("second", { requestId: "req-b" })
      const lines: Array<{ message: unknown; annotations: Record<string, unknown> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message, annotations: Object.fromEntries(HashMap.toEntries(annotations)) })
      })
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (request: string) => Effect.as(Effect.logInfo(`working on ${request}`), request)
        })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 })).pipe(
        Effect.annotateLogs({ outer: "kept" }),
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const of = (text: string) => lines.find((line) => String(line.message).includes(text))?.annotations
      expect(of("working on first")).toMatchObject({ requestId: "req-a", outer: "kept", module: "MailboxWorker" })
      expect(of("working on second")).toMatchObject({ requestId: "req-b", outer: "kept" })
      // That it does not outlive its message is MailboxWorker's test ("… and not the next message's").
    }))

  it.scoped("processes a request: replies the result to replyTo, then acknowledges", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      const requestId = "req-1"
      yield* send("hello", { requestId, traceId: "trace-9" })
      const seen = yield* Ref.make<Array<MainLoop.ExecuteContext>>([])
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (request: string, context) =>
            Effect.as(Ref.update(seen, (all) => [...all, context]), request.toUpperCase()),
          config: { workerId: "worker-7" }
        })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      const [result] = yield* replies
      expect(result!.success).toBe(true)
      expect(result!.output).toBe("HELLO")
      expect(result!.requestId).toBe(requestId)
      expect(result!.runContext).toMatchObject({ workerId: "worker-7", requestId, attempt: 1, traceId: "trace-9" })
      const [context] = yield* Ref.get(seen)
      expect(context!.runContext.runId).toBe(result!.runContext.runId)
      expect(context!.deadline).toBeUndefined()
      expect(yield* requests.approximateCount).toBe(0)
    }))

  it.scoped("the default workerId is host-pid", () =>
    Effect.sync(() => expect(MainLoop.defaultWorkerId()).toMatch(new RegExp(`-${process.pid}$`))))

  it.scoped("an execute failure without a DLQ: error reply, then acknowledge", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      yield* send("x")
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({ requests, execute: () => Effect.fail(new ToolBroke("the tool broke")) })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      const [result] = yield* replies
      expect(result!.success).toBe(false)
      expect(result!.error).toEqual({ tag: "ToolBroke", message: "the tool broke" })
      expect(yield* requests.approximateCount).toBe(0)
    }))

  it.scoped("an execute that throws instead of returning an effect: a Defect error reply, and the loop goes on", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      for (const body of ["throw", "fine"]) yield* send(body)
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (request: string) => {
            // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
            if (request === "throw") throw new Error("thrown while building the effect")
            return Effect.succeed(request)
          }
        })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 2, waitTime: 0 }))
      const [thrown, fine] = yield* replies
      expect(thrown!.success).toBe(false)
      expect(thrown!.error?.tag).toBe("Defect")
      expect(thrown!.error?.message).toContain("thrown while building the effect")
      expect(fine!.output).toBe("fine")
      expect(yield* requests.approximateCount).toBe(0)
    }))

  it.scoped("maxIterations bounds the polls", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      for (const body of ["a", "b", "c"]) yield* send(body)
      const loop = yield* withResolver(resolver, MainLoop.make({ requests, execute: (r: string) => Effect.succeed(r) }))
      yield* withResolver(resolver, loop.run({ maxIterations: 2, waitTime: 0 }))
      expect((yield* replies).map((r) => r.output)).toEqual(["a", "b"])
      expect(yield* requests.approximateCount).toBe(1)
      expect(yield* loop.running).toBe(false)
    }))

  it.scoped("a request deadline shorter than the work: interrupted, error result naming the deadline", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      const interrupted = yield* Ref.make(false)
      yield* send("slow", { deadline: yield* Deadline.after("2 seconds") })
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (_: string, context) =>
            Effect.as(Effect.sleep("10 seconds"), `deadline was ${context.deadline?.iso}`).pipe(
              Effect.onInterrupt(() => Ref.set(interrupted, true))
            )
        })
      )
      const fiber = yield* Effect.fork(withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 })))
      yield* settle
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(fiber)
      const [result] = yield* replies
      expect(result!.error?.tag).toBe("DeadlineExceededError")
      expect(result!.error?.message).toContain("1970-01-01T00:00:02.000Z")
      expect(yield* Ref.get(interrupted)).toBe(true)
    }))

  it.scoped("a budget reaches execute as a tracker, and its deadline applies too", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      const { Budget } = yield* Effect.promise(() => import("../src/index.js"))
      yield* send("x", { budget: yield* Budget.make({ maxTotalTokens: 10 }) })
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (_: string, { budgetTracker }) =>
            Effect.gen(function*() {
              yield* budgetTracker!.record("e", { inputTokens: 8, outputTokens: 8 }).pipe(Effect.orDie)
              yield* budgetTracker!.check
              return "never"
            })
        })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      const [result] = yield* replies
      expect(result!.error?.tag).toBe("BudgetExceededError")
    }))
})

describe("MainLoop with a dead-letter queue", () => {
  const failingLoop = (
    env: Effect.Effect.Success<typeof setup>,
    error: () => Error,
    policy: Parameters<typeof DeadLetter.policy>[0]
  ) =>
    Effect.gen(function*() {
      return yield* withResolver(
        env.resolver,
        MainLoop.make({
          requests: env.requests,
          execute: () => Effect.fail(error()),
          config: { deadLetters: { mailbox: env.deadLetters, policy: yield* DeadLetter.policy(policy) } }
        })
      )
    })

  it.scoped("maxDeliveryCount 1: dead letter with its metadata, and an error reply", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.send("poison", { requestId: "req-p", traceId: "t-1" })
      const loop = yield* failingLoop(env, () => new ToolBroke("boom"), { maxDeliveryCount: 1 })
      yield* withResolver(env.resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      const [letter] = yield* env.deadLetters.receive()
      expect(letter!.body).toMatchObject({
        sourceMailbox: "requests",
        deliveryCount: 1,
        lastError: "boom",
        lastErrorTag: "ToolBroke",
        requestId: "req-p",
        replyTo: "responses",
        traceId: "t-1"
      })
      expect(letter!.body.body.request).toBe("poison")
      const [reply] = yield* env.replies
      expect(reply!.error?.tag).toBe("ToolBroke")
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("maxDeliveryCount 5: nack with backoff min(60 s × deliveryCount, 15 min), dead letter at the 5th", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.send("flaky")
      const loop = yield* failingLoop(env, () => new ToolBroke("boom"), { maxDeliveryCount: 5 })
      const runOnce = withResolver(env.resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      for (let delivery = 1; delivery <= 4; delivery++) {
        yield* runOnce
        expect(yield* env.replies).toEqual([]) // no reply while retrying
        yield* TestClock.adjust(`${60 * delivery - 1} seconds`)
        expect(yield* env.requests.receive({ visibilityTimeout: 0 })).toEqual([]) // still hidden
        yield* TestClock.adjust("1 second")
      }
      yield* runOnce
      expect((yield* env.deadLetters.receive()).map((m) => m.body.deliveryCount)).toEqual([5])
      expect(DeadLetter.backoff(20)).toEqual(DeadLetter.backoff(15))
    }))

  it.scoped("includeErrors dead-letters at once; excludeErrors never does, and exclude wins", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.send("a")
      const include = yield* failingLoop(env, () => new Permanent("no"), { includeErrors: ["Permanent"] })
      yield* withResolver(env.resolver, include.run({ maxIterations: 1, waitTime: 0 }))
      expect((yield* env.deadLetters.receive()).length).toBe(1)

      yield* env.send("b")
      const both = yield* failingLoop(env, () => new Permanent("no"), {
        maxDeliveryCount: 1,
        includeErrors: ["Permanent"],
        excludeErrors: ["Permanent"]
      })
      yield* withResolver(env.resolver, both.run({ maxIterations: 1, waitTime: 0 }))
      expect(yield* env.deadLetters.receive()).toEqual([])
      expect(yield* env.requests.approximateCount).toBe(1) // retried, not lost
      expect(DeadLetter.decide(yield* DeadLetter.policy({ excludeErrors: ["X"] }), 100, "X")).toBe("retry")
    }))

  it.scoped("an error reply that cannot be sent does not block the dead letter", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.requests.send(MainLoop.request("poison"), { replyTo: "nowhere" })
      const loop = yield* failingLoop(env, () => new ToolBroke("boom"), { maxDeliveryCount: 1 })
      yield* withResolver(env.resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      expect((yield* env.deadLetters.receive()).map((m) => m.body.replyTo)).toEqual(["nowhere"])
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("a dead letter that cannot be stored nacks the request instead of losing it", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.send("poison")
      yield* env.deadLetters.close
      const loop = yield* failingLoop(env, () => new ToolBroke("boom"), { maxDeliveryCount: 1 })
      yield* withResolver(env.resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      expect(yield* env.requests.approximateCount).toBe(1)
      expect(yield* env.replies).toEqual([]) // no error reply for a request that is still queued
    }))

  it.scoped("MailboxWorker.deadLetterConsumer acknowledges what its handler resolves and hides a failure for an hour", () =>
    Effect.gen(function*() {
      const env = yield* setup
      yield* env.send("a", { requestId: "ok" })
      yield* env.send("b", { requestId: "fails" })
      const loop = yield* failingLoop(env, () => new ToolBroke("boom"), { maxDeliveryCount: 1 })
      yield* withResolver(env.resolver, loop.run({ maxIterations: 2, waitTime: 0 }))
      const handled: Array<string> = []
      const consumer = yield* MailboxWorker.deadLetterConsumer({
        mailbox: env.deadLetters,
        handle: (letter) =>
          letter.requestId === "fails"
            ? Effect.fail(new Permanent("still broken"))
            : Effect.sync(() => void handled.push(letter.requestId!))
      })
      yield* consumer.run({ maxIterations: 2, waitTime: 0 })
      expect(handled).toEqual(["ok"])
      expect(yield* env.deadLetters.approximateCount).toBe(1)
      yield* TestClock.adjust("59 minutes")
      expect(yield* env.deadLetters.receive()).toEqual([])
      yield* TestClock.adjust("1 minute")
      expect((yield* env.deadLetters.receive()).map((m) => m.body.requestId)).toEqual(["fails"])
    }))

  it.effect("a bad policy is a ParseError", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(DeadLetter.policy({ maxDeliveryCount: 0 }))
      expect(error.message).toContain("maxDeliveryCount")
    }))
})

describe("MainLoop settling never loses a request", () => {
  it.scoped("a reply that cannot be sent nacks the request, which stays queued", () =>
    Effect.gen(function*() {
      const { requests, resolver } = yield* setup
      yield* requests.send(MainLoop.request("x"), { replyTo: "nowhere" })
      const loop = yield* withResolver(resolver, MainLoop.make({ requests, execute: (r: string) => Effect.succeed(r) }))
      yield* withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      expect(yield* requests.approximateCount).toBe(1)
      yield* TestClock.adjust("60 seconds")
      const [again] = yield* requests.receive()
      expect(again!.deliveryCount).toBe(2)
    }))

  it.scoped("a delivery whose lease expired sends no reply; the request stays queued and the loop goes on", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      yield* send("slow")
      yield* send("next")
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (r: string) => r === "slow" ? Effect.as(Effect.sleep("2 seconds"), r) : Effect.succeed(r),
          config: { leaseExtender: { enabled: false } }
        })
      )
      const fiber = yield* Effect.fork(
        withResolver(resolver, loop.run({ maxIterations: 2, waitTime: 0, visibilityTimeout: "1 second" }))
      )
      yield* settle
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(fiber)
      // "slow" lost its lease while running: no reply (the next delivery will answer), and it is still queued.
      expect((yield* replies).map((r) => r.output)).toEqual(["next"])
      expect(yield* requests.approximateCount).toBe(1)
    }))
})

describe("MainLoop.resultSchema", () => {
  it("encodes what a generic struct encoding gives, and decodes back to an equal result", () => {
    const Output = Schema.Struct({ at: Schema.DateTimeUtc, n: Schema.NumberFromString })
    const Generic = Schema.Struct({
      requestId: Schema.String,
      output: Schema.optional(Output),
      error: Schema.optional(Schema.Struct({ tag: Schema.String, message: Schema.String })),
      runContext: Schema.Struct({
        workerId: Schema.String,
        runId: Schema.String,
        requestId: Schema.String,
        attempt: Schema.Number,
        traceId: Schema.optional(Schema.String),
        spanId: Schema.optional(Schema.String)
      }),
      completedAt: Schema.DateTimeUtc
    })
    const runContext = { workerId: "w", runId: "r", requestId: "q", attempt: 2 }
    const completedAt = DateTime.unsafeMake(1_700_000_000_000)
    const results = [
      new MainLoop.MainLoopResult({
        requestId: "q",
        output: { at: DateTime.unsafeMake(0), n: 7 },
        runContext,
        completedAt
      }),
      new MainLoop.MainLoopResult<typeof Output.Type>({
        requestId: "q",
        error: { tag: "Boom", message: "it broke" },
        runContext: { ...runContext, traceId: "t", spanId: "s" },
        completedAt
      })
    ]
    const schema = MainLoop.resultSchema(Output)
    for (const result of results) {
      const encoded = Schema.encodeSync(schema)(result)
      const { output, error, ...rest } = result
      expect(encoded).toEqual(
        Schema.encodeSync(Generic)({
          ...rest,
          ...(output === undefined ? {} : { output }),
          ...(error === undefined ? {} : { error }),
          runContext: Object.fromEntries(
            Object.entries(result.runContext).filter(([, v]) => v !== undefined)
          ) as typeof runContext
        })
      )
      const decoded = Schema.decodeUnknownSync(schema)(JSON.parse(JSON.stringify(encoded)))
      expect(decoded).toBeInstanceOf(MainLoop.MainLoopResult)
      expect(decoded.success).toBe(result.success)
      expect(Schema.encodeSync(schema)(decoded)).toEqual(encoded)
    }
    // A stored result that is not one fails to decode, naming what is wrong.
    expect(() => Schema.decodeUnknownSync(schema)({ requestId: 1 })).toThrow(/requestId/)
  })
})

/** A "slow" request (2 s of work) taken by a `MainLoop.layer` built in a scope of its own; the scope's close, forked. */
const slowRequestUnderLayer = Effect.gen(function*() {
  const { replies, requests, resolver, send } = yield* setup
  yield* send("slow")
  const scope = yield* Scope.make()
  yield* Layer.buildWithScope(
    MainLoop.layer({
      requests,
      execute: (r: string) => Effect.as(Effect.sleep("2 seconds"), r.toUpperCase()),
      shutdownTimeout: "10 seconds"
    }).pipe(Layer.provide(Layer.succeed(MailboxResolver, resolver))),
    scope
  )
  yield* settle
  return { replies, requests, close: Effect.fork(Scope.close(scope, Exit.void)) }
})

describe("MainLoop.layer", () => {
  it.scoped("closing the layer's scope is a graceful shutdown: the in-flight request completes and is replied", () =>
    Effect.gen(function*() {
      const { close, replies, requests } = yield* slowRequestUnderLayer
      const closing = yield* close
      yield* settle
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(closing)
      expect((yield* replies).map((r) => r.output)).toEqual(["SLOW"])
      expect(yield* requests.approximateCount).toBe(0)
    }))

  it.scoped("with Health provided, the loop counts in readiness, which turns 503 before the drain starts", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const { close, replies } = yield* slowRequestUnderLayer
      expect(yield* health.readiness).toEqual({ ready: true, reasons: [] })
      const closing = yield* close
      yield* settle
      // Draining: the request is still in flight, and readiness already says so.
      expect(yield* replies).toEqual([])
      expect((yield* health.readiness).reasons).toContain("shutting down")
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(closing)
      expect((yield* replies).map((r) => r.output)).toEqual(["SLOW"])
      // The loop no longer counts once the layer is closed.
      expect((yield* health.readiness).reasons).toEqual(["shutting down"])
    }).pipe(Effect.provide(Health.layerRegistry())))

  it.scoped("closing the layer's scope with a stuck request: at the timeout it is interrupted and given back", () =>
    Effect.gen(function*() {
      const { replies, requests, resolver, send } = yield* setup
      yield* send("stuck")
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        MainLoop.layer({
          requests,
          execute: () => Effect.never,
          run: { visibilityTimeout: "1 hour" },
          shutdownTimeout: "3 seconds"
        }).pipe(Layer.provide(Layer.succeed(MailboxResolver, resolver))),
        scope
      )
      yield* settle
      // Scope.close runs the finalizers uninterruptibly, as a layer's teardown under runMain does.
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* settle
      yield* TestClock.adjust("2999 millis")
      yield* settle
      expect(closing.unsafePoll()).toBeNull()
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(closing)
      expect(yield* replies).toEqual([])
      expect((yield* requests.receive()).map((m) => m.deliveryCount)).toEqual([2]) // nacked, not left for an hour
    }))

  it.scoped("bad options — how it runs, how it stops, the loop's config — fail the layer with a ParseError", () =>
    Effect.gen(function*() {
      const { requests, resolver } = yield* setup
      const refused = (
        options: MainLoop.LayerOptions & { readonly config?: MainLoop.MainLoopConfig<string> }
      ) =>
        Effect.map(
          Effect.flip(Layer.build(
            MainLoop.layer({ requests, execute: Effect.succeed, ...options }).pipe(
              Layer.provide(Layer.succeed(MailboxResolver, resolver))
            )
          )),
          (error) => {
            expect(error.message).toMatch(/^MainLoop\.(layer|make) options/)
            return refusedOptions(error)
          }
        )
      expect(yield* refused({ run: { waitTime: "1 hour" } })).toEqual(["run.waitTime"])
      expect(yield* refused({ run: { maxIterations: -1, visibilityTimeout: "13 hours" } })).toEqual([
        "run.maxIterations",
        "run.visibilityTimeout"
      ])
      expect(yield* refused({ shutdownTimeout: -5 })).toEqual(["shutdownTimeout"])
      expect(yield* refused({ config: { timeout: "500 millis" } })).toEqual(["config.timeout"])
      // The lease extender's config is LeaseExtender.make's.
      const extender = yield* Effect.flip(Layer.build(
        MainLoop.layer({ requests, execute: Effect.succeed, config: { leaseExtender: { interval: -1 } } }).pipe(
          Layer.provide(Layer.succeed(MailboxResolver, resolver))
        )
      ))
      expect(refusedOptions(extender)).toEqual(["interval"])
      expect(extender.message).toContain("LeaseExtender.make options")
    }))
})

describe("MainLoop: the attempt's journal", () => {
  it.scoped("is made on first use, is the same on every read, and a spread copy of the context carries it", () =>
    Effect.gen(function*() {
      const { requests, resolver, send } = yield* setup
      yield* send("journaled")
      const seen: Array<{ readonly same: boolean; readonly copied: boolean; readonly durable: boolean }> = []
      const loop = yield* withResolver(
        resolver,
        MainLoop.make({
          requests,
          execute: (request: string, context) =>
            Effect.sync(() => {
              const first = context.journal
              seen.push({
                same: first !== undefined && context.journal === first,
                copied: { ...context }.journal === first,
                durable: first?.durable ?? false
              })
              return request
            })
        })
      )
      yield* withResolver(resolver, loop.run({ maxIterations: 1, waitTime: 0 }))
      expect(seen).toEqual([{ same: true, copied: true, durable: true }])
    }))
})
