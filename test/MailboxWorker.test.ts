import { describe, expect, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Fiber, HashMap, Logger, Metric, Option, Ref, TestClock, Tracer } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"
import { InvalidParameterError, type Mailbox, MailboxConnectionError, type Message } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxWorker from "../src/MailboxWorker.js"

import { logSettleFailure } from "../src/internal/loops/settleFailure.js"
import { captureLogs, refusedOptions } from "./helpers.js"

const settle = Effect.repeatN(Effect.yieldNow(), 30)

/** A worker over a string mailbox whose handler runs `work`; acks on success. */
const worker = (
  mailbox: Mailbox<string>,
  work: (body: string, heartbeat: Heartbeat.Heartbeat) => Effect.Effect<void>
) =>
  MailboxWorker.make({
    name: "test-worker",
    mailbox,
    handle: (message, heartbeat) => work(message.body, heartbeat),
    onSuccess: () => Effect.succeedNone,
    onFailure: (message) => logSettleFailure("nack")(message.nack(0))
  })

describe("MailboxWorker shutdown", () => {
  it.scoped("an idle loop blocked in a 20 s long poll stops at once", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker(mailbox, () => Effect.void)
      const fiber = yield* Effect.fork(loop.run({ waitTime: "20 seconds" }))
      yield* settle
      expect(yield* loop.running).toBe(true)
      expect(yield* loop.shutdown({ timeout: "5 seconds" })).toBe(true) // no clock advance needed
      expect(Exit.isSuccess(yield* Fiber.await(fiber))).toBe(true)
      expect(yield* loop.running).toBe(false)
    }))

  it.scoped("lets the in-flight message finish, nacks the rest of the batch at once, and returns true", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      for (const body of ["first", "second", "third"]) yield* mailbox.send(body)
      const done = yield* Ref.make<Array<string>>([])
      const loop = yield* worker(
        mailbox,
        (body) => Effect.zipRight(Effect.sleep("5 seconds"), Ref.update(done, (all) => [...all, body]))
      )
      const fiber = yield* Effect.fork(loop.run({ maxMessages: 3 }))
      yield* settle
      const stopping = yield* Effect.fork(loop.shutdown({ timeout: "30 seconds" }))
      yield* settle
      // The two unstarted messages are visible to another receiver right away.
      const others = yield* mailbox.receive({ maxMessages: 10 })
      expect(others.map((m) => [m.body, m.deliveryCount])).toEqual([["second", 2], ["third", 2]])
      yield* TestClock.adjust("5 seconds")
      expect(yield* Fiber.join(stopping)).toBe(true)
      yield* Fiber.join(fiber)
      expect(yield* Ref.get(done)).toEqual(["first"])
      expect(yield* mailbox.approximateCount).toBe(2) // "first" acked; the others are with the other receiver
    }))

  it.scoped("a 100 ms timeout during a 5 s handler: returns false, interrupts the work, nacks it; the loop runs again", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("long")
      const calls = yield* Ref.make(0)
      const interrupted = yield* Ref.make(false)
      const loop = yield* worker(
        mailbox,
        () =>
          Effect.zipRight(Ref.update(calls, (n) => n + 1), Effect.sleep("5 seconds")).pipe(
            Effect.onInterrupt(() => Ref.set(interrupted, true))
          )
      )
      const fiber = yield* Effect.fork(loop.run())
      yield* settle
      const stopping = yield* Effect.fork(loop.shutdown({ timeout: "100 millis" }))
      yield* settle
      yield* TestClock.adjust("100 millis")
      expect(yield* Fiber.join(stopping)).toBe(false)
      yield* Fiber.join(fiber)
      expect(yield* Ref.get(interrupted)).toBe(true)
      const [again] = yield* mailbox.receive({ visibilityTimeout: 0 }) // visible at once: nacked, not left to expire
      expect(again!.deliveryCount).toBe(2)

      // It runs again after a shutdown.
      const rerun = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0 }))
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* Fiber.join(rerun)
      expect(yield* Ref.get(calls)).toBe(2)
      expect(yield* mailbox.approximateCount).toBe(0)
    }))

  it.scoped("stops when its mailbox closes, and shutdown of a stopped loop is true", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker(mailbox, () => Effect.void)
      const fiber = yield* Effect.fork(loop.run())
      yield* settle
      yield* mailbox.close
      yield* Fiber.join(fiber)
      expect(yield* loop.shutdown()).toBe(true)
    }))

  it.scoped("interrupting run gives back the in-flight message", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("m")
      const loop = yield* worker(mailbox, () => Effect.never)
      const fiber = yield* Effect.fork(loop.run())
      yield* settle
      yield* Fiber.interrupt(fiber)
      expect((yield* mailbox.receive({ visibilityTimeout: 0 })).map((m) => m.deliveryCount)).toEqual([2])
    }))

  it.scoped("bad options fail with InvalidParameterError naming them; a second concurrent run, AlreadyRunningError", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker(mailbox, () => Effect.void)
      const refused = (options: MailboxWorker.RunOptions) =>
        Effect.map(Effect.flip(loop.run(options)), (e) => e._tag === "InvalidParameterError" && e.parameter)
      expect(yield* refused({ waitTime: "1 minute" })).toBe("waitTime")
      expect(yield* refused({ maxIterations: -1 })).toBe("maxIterations")
      yield* Effect.fork(loop.run())
      yield* settle
      const again = yield* Effect.flip(loop.run())
      expect([again._tag, again.message]).toEqual([
        "AlreadyRunningError",
        "Loop \"test-worker\" is already running: stop it, or wait for its run to end, before running it again"
      ])
    }))

  it.scoped("runScoped: the same run options are configuration there, a ParseError naming them before anything runs", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker(mailbox, () => Effect.void)
      const error = yield* Effect.flip(
        MailboxWorker.runScoped(loop, { run: { waitTime: "1 minute" }, shutdownTimeout: "forever" as "1 second" })
      )
      expect(refusedOptions(error)).toEqual(["run.waitTime", "shutdownTimeout"])
      expect(error.message).toContain("MailboxWorker.runScoped options")
      expect(error.message).toContain("must be between 0 and 20s")
      expect(yield* loop.running).toBe(false)
    }))
})

describe("MailboxWorker shutdown where nothing can be interrupted", () => {
  it.scoped("called from an uninterruptible region (a finalizer, an onInterrupt), it still keeps its timeout", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("stuck")
      const loop = yield* worker(mailbox, () => Effect.never)
      const running = yield* Effect.fork(loop.run({ visibilityTimeout: "1 hour" }))
      yield* settle
      const stopping = yield* Effect.fork(Effect.uninterruptible(loop.shutdown({ timeout: "2 seconds" })))
      yield* settle
      yield* TestClock.adjust("2 seconds")
      expect(yield* Fiber.join(stopping)).toBe(false)
      yield* Fiber.join(running)
      expect((yield* mailbox.receive()).map((m) => m.deliveryCount)).toEqual([2]) // nacked, visible at once
    }))

  it.scoped("two shutdowns at once, the first timing out: neither says the stop was clean", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("stuck")
      const loop = yield* worker(mailbox, () => Effect.never)
      yield* Effect.fork(loop.run())
      yield* settle
      const first = yield* Effect.fork(loop.shutdown({ timeout: "1 second" }))
      const second = yield* Effect.fork(loop.shutdown({ timeout: "1 minute" }))
      yield* settle
      yield* TestClock.adjust("1 second")
      expect([yield* Fiber.join(first), yield* Fiber.join(second)]).toEqual([false, false])
    }))

  it.scoped("run called from an uninterruptible region still runs an interruptible loop", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("stuck")
      const loop = yield* worker(mailbox, () => Effect.never)
      const running = yield* Effect.fork(Effect.uninterruptible(loop.run()))
      yield* settle
      const stopping = yield* Effect.fork(loop.shutdown({ timeout: "1 second" }))
      yield* settle
      yield* TestClock.adjust("1 second")
      expect(yield* Fiber.join(stopping)).toBe(false)
      yield* Fiber.join(running)
    }))
})

describe("MailboxWorker run and shutdown racing", () => {
  it.scoped("run interrupted at any point of its start never leaves the loop marked running", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const stuck: Array<string> = []
      // Small operation budgets make the fiber yield at many different points of `run`'s start; the
      // interruption lands at each of them in turn.
      for (let ops = 16; ops <= 40; ops++) {
        for (let yields = 0; yields < 10; yields++) {
          const loop = yield* worker(mailbox, () => Effect.void)
          const running = yield* Effect.fork(loop.run().pipe(Effect.withMaxOpsBeforeYield(ops)))
          yield* Effect.repeatN(Effect.yieldNow(), yields)
          const interrupting = yield* Effect.fork(Fiber.interrupt(running))
          yield* Effect.repeatN(Effect.yieldNow(), 300)
          if (interrupting.unsafePoll() === null || (yield* loop.running)) stuck.push(`${ops}/${yields}`)
        }
      }
      expect(stuck).toEqual([])
    }))

  it.scoped("a settle slower than the shutdown timeout: shutdown does not wait for it past the grace, and says false", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("fails")
      const loop = yield* MailboxWorker.make({
        name: "slow-settle",
        mailbox,
        handle: () => Effect.fail("boom"),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.sleep("1 hour") // runs uninterruptibly: the stop cannot cut it short
      })
      const running = yield* Effect.fork(loop.run())
      yield* settle
      const stopping = yield* Effect.fork(loop.shutdown({ timeout: "1 second" }))
      yield* settle
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(stopping.unsafePoll()).toBeNull() // interrupted, waiting for the settle...
      yield* TestClock.adjust(MailboxWorker.interruptGrace)
      expect(yield* Fiber.join(stopping)).toBe(false) // ...at most the grace
      expect(yield* loop.running).toBe(true) // still settling: given up on, not pretended stopped
      yield* TestClock.adjust("1 hour")
      yield* Fiber.join(running)
      expect(yield* loop.running).toBe(false)
    }))
})

describe("MailboxWorker death", () => {
  it.scoped("a receive that fails unexpectedly: run fails with the cause, logged at error level and counted", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      const broken: Mailbox<string> = {
        ...mailbox,
        receive: () => Effect.fail(new InvalidParameterError({ parameter: "receive", value: 1, reason: "bug" }))
      }
      const loop = yield* MailboxWorker.make({
        name: "dying",
        mailbox: broken,
        handle: () => Effect.void,
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void
      })
      const failures = Metric.tagged(MailboxWorker.loopFailures, "loop", "dying")
      const before = (yield* Metric.value(failures)).count
      const exit = yield* Effect.exit(loop.run())
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toMatch(/Invalid receive 1: bug/)
      expect(yield* loop.running).toBe(false)
      expect((yield* Metric.value(failures)).count).toBe(before + 1)
      expect(logs.lines.filter((line) => line.level === "ERROR").map((line) => line.message)).toEqual([
        `Loop "dying" died`
      ])
      // Not the retry warning: only connection errors are retried.
      expect(logs.lines.some((line) => line.message.includes("retrying"))).toBe(false)
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("a defect while settling (a reply that throws) kills the loop; the message goes back", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("m")
      const loop = yield* MailboxWorker.make({
        name: "throwing-reply",
        mailbox,
        handle: () => Effect.void,
        onSuccess: () => Effect.die(new Error("reply builder bug")),
        onFailure: () => Effect.void
      })
      const exit = yield* Effect.exit(loop.run({ visibilityTimeout: "1 hour" }))
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toMatch(/reply builder bug/)
      expect(yield* loop.running).toBe(false)
      expect((yield* mailbox.receive()).map((m) => m.deliveryCount)).toEqual([2]) // at once, not in an hour
    }))
})

describe("MailboxWorker leases", () => {
  it.scoped("beats from the handler extend the lease; a handler that stops beating loses it", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("beating")
      const loop = yield* MailboxWorker.make({
        name: "w",
        mailbox,
        handle: (_message, heartbeat) =>
          Effect.gen(function*() {
            for (let i = 0; i < 20; i++) {
              yield* heartbeat.beat
              yield* Effect.sleep("30 seconds")
            }
          }),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void,
        leaseExtender: { interval: "20 seconds", extension: "60 seconds" }
      })
      const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, visibilityTimeout: "60 seconds" }))
      for (let t = 0; t < 20; t++) {
        yield* settle
        expect(yield* mailbox.receive()).toEqual([]) // never visible to others while the worker beats
        yield* TestClock.adjust("30 seconds")
      }
      yield* Fiber.join(fiber)
      expect(yield* mailbox.approximateCount).toBe(0)
    }))

  it.scoped("an extension still in flight when the handler ends is waited for: the message is settled after it, and each message gets an extension of its own", () =>
    Effect.gen(function*() {
      const inner = yield* MailboxMemory.make<string>({ name: "q" })
      yield* inner.send("first")
      yield* inner.send("second")
      const events: Array<string> = []
      // Each message's extension takes 1 s (a slow store); its acknowledgement and extensions are recorded.
      const tracked = (message: Message<string>): Message<string> => ({
        ...message,
        extendVisibility: (timeout) =>
          Effect.sleep("1 second").pipe(
            Effect.zipRight(message.extendVisibility(timeout)),
            Effect.ensuring(Effect.sync(() => events.push(`extended ${message.body}`)))
          ),
        acknowledge: Effect.zipRight(
          Effect.sync(() => events.push(`acknowledged ${message.body}`)),
          message.acknowledge
        )
      })
      const mailbox: Mailbox<string> = {
        ...inner,
        receive: (options) => Effect.map(inner.receive(options), (messages) => messages.map(tracked))
      }
      const loop = yield* MailboxWorker.make({
        name: "w",
        mailbox,
        // The beat starts an extension (the first beat after the message is attached); the handler ends as soon
        // as that extension has started.
        handle: (_message, heartbeat) => Effect.zipRight(heartbeat.beat, Effect.yieldNow()),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void
      })
      const fiber = yield* Effect.fork(loop.run({ maxIterations: 2, waitTime: 0 }))
      yield* settle
      expect(events).toEqual([]) // "first" handled, its settle waiting for the extension
      yield* TestClock.adjust("1 second")
      yield* settle
      // Extended, then acknowledged; "second" got an extension of its own, started by its own beat.
      expect(events.slice(0, 2)).toEqual(["extended first", "acknowledged first"])
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(fiber)
      expect(events).toEqual(["extended first", "acknowledged first", "extended second", "acknowledged second"])
      expect(yield* inner.approximateCount).toBe(0)
    }))
})

/** A tracer that records the spans it is asked for (an exporter, as far as the worker can tell). */
const recordingTracer = () => {
  const spans: Array<{ readonly name: string; readonly attributes: Map<string, unknown> }> = []
  const tracer = Tracer.make({
    span: (name, parent, context, links, startTime, kind) => {
      const attributes = new Map<string, unknown>()
      spans.push({ name, attributes })
      const span: Tracer.Span = {
        _tag: "Span",
        name,
        spanId: `span-${spans.length}`,
        traceId: "trace",
        parent,
        context,
        status: { _tag: "Started", startTime },
        attributes,
        links,
        sampled: true,
        kind,
        end: () => undefined,
        attribute: (key, value) => {
          attributes.set(key, value)
        },
        event: () => undefined,
        addLinks: () => undefined
      }
      return span
    },
    context: (f) => f()
  })
  return { spans, tracer }
}

/** A worker whose handler records, per message, its id and the name of the span it runs in ("none" outside one). */
const spanRecordingWorker = (mailbox: Mailbox<string>) =>
  Effect.gen(function*() {
    const seen = yield* Ref.make<Array<{ readonly id: string; readonly span: string }>>([])
    const loop = yield* MailboxWorker.make({
      name: "test-worker",
      mailbox,
      handle: (message) =>
        Effect.flatMap(Effect.option(Effect.currentSpan), (span) =>
          Ref.update(seen, (entries) => [
            ...entries,
            { id: message.id, span: Option.match(span, { onNone: () => "none", onSome: (s) => s.name }) }
          ])),
      onSuccess: () => Effect.succeedNone,
      onFailure: (message) => logSettleFailure("nack")(message.nack(0))
    })
    return { loop, seen: Ref.get(seen) }
  })

describe("MailboxWorker tracing", () => {
  it.scoped("with an exporting tracer installed, receives and handled messages are spans", () =>
    Effect.gen(function*() {
      const { spans, tracer } = recordingTracer()
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("one")
      yield* mailbox.send("two")
      const { loop, seen } = yield* spanRecordingWorker(mailbox)
      yield* loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 }).pipe(Effect.withTracer(tracer))
      expect(spans.filter((span) => span.name === "Mailbox.receive").map((span) => span.attributes.get("mailbox")))
        .toEqual(["q"])
      const handled = spans.filter((span) => span.name === "MailboxWorker.handle")
      expect(handled.map((span) => span.attributes.get("worker"))).toEqual(["test-worker", "test-worker"])
      const entries = yield* seen
      expect(entries.map((entry) => entry.span)).toEqual(["MailboxWorker.handle", "MailboxWorker.handle"])
      expect(handled.map((span) => span.attributes.get("messageId"))).toEqual(entries.map((entry) => entry.id))
    }))

  it.scoped("with the default tracer, which exports nothing, no receive or handle span is made", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      yield* mailbox.send("one")
      const { loop, seen } = yield* spanRecordingWorker(mailbox)
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      expect((yield* seen).map((entry) => entry.span)).toEqual(["none"])
      expect(yield* mailbox.approximateCount).toBe(0)
    }))
})

describe("MailboxWorker settles", () => {
  it.scoped("a batch's settles commit while the next batch runs, but never more than two batches' worth", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      for (const body of ["a", "b", "c", "d", "e", "f"]) yield* mailbox.send(body)
      const gate = yield* Deferred.make<void>()
      const handled = yield* Ref.make<Array<string>>([])
      // A store whose commits hang until the gate opens.
      const slow: Mailbox<string> = {
        ...mailbox,
        receive: (options) =>
          Effect.map(mailbox.receive(options), (messages) =>
            messages.map((message): Message<string> => ({
              id: message.id,
              body: message.body,
              receiptHandle: message.receiptHandle,
              deliveryCount: message.deliveryCount,
              enqueuedAt: message.enqueuedAt,
              replyTo: message.replyTo,
              acknowledge: Effect.zipRight(Deferred.await(gate), message.acknowledge),
              nack: message.nack,
              extendVisibility: message.extendVisibility,
              reply: message.reply,
              replyAndAcknowledge: message.replyAndAcknowledge
            })))
      }
      const loop = yield* MailboxWorker.make({
        name: "slow-commits",
        mailbox: slow,
        handle: (message) => Ref.update(handled, (bodies) => [...bodies, message.body]),
        onSuccess: () => Effect.succeedNone,
        onFailure: (message) => logSettleFailure("nack")(message.nack(0))
      })
      const fiber = yield* Effect.fork(loop.run({ maxIterations: 3, maxMessages: 2, waitTime: 0 }))
      yield* settle
      // Batches one and two ran; the third waits for the first batch's commits.
      expect(yield* Ref.get(handled)).toEqual(["a", "b", "c", "d"])
      expect(yield* mailbox.approximateCount).toBe(6)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(fiber)
      // The loop ends only once every settle has committed.
      expect(yield* Ref.get(handled)).toEqual(["a", "b", "c", "d", "e", "f"])
      expect(yield* mailbox.approximateCount).toBe(0)
    }))
})

describe("MailboxWorker metrics", () => {
  it.scoped("its counters carry the metric labels the run was started with", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      for (const body of ["ok", "ok", "fail"]) yield* mailbox.send(body)
      const loop = yield* MailboxWorker.make({
        name: "counting",
        mailbox,
        handle: (message) => message.body === "fail" ? Effect.fail("boom") : Effect.void,
        onSuccess: () => Effect.succeedNone,
        onFailure: (message) => logSettleFailure("nack")(message.nack(0))
      })
      yield* loop.run({ maxIterations: 1, maxMessages: 3, waitTime: 0 }).pipe(Effect.tagMetrics("worker", "w-7"))
      const count = (counter: typeof MailboxWorker.messagesProcessed) =>
        Effect.map(Metric.value(Metric.tagged(counter, "worker", "w-7")), (state) => state.count)
      expect(yield* count(MailboxWorker.messagesProcessed)).toBe(2)
      expect(yield* count(MailboxWorker.messagesFailed)).toBe(1)
    }))
})

describe("MailboxWorker log annotations", () => {
  it.scoped("a message's annotations reach its handler's and its settle's logs, and not the next message's", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      for (const body of ["a", "b"]) yield* mailbox.send(body)
      const lines: Array<{ message: string; keys: Array<string> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message: String(message), keys: [...HashMap.keys(annotations)].sort() })
      })
      const loop = yield* MailboxWorker.make({
        name: "annotating",
        mailbox,
        annotations: (message) => ({ [`only-${message.body}`]: true }),
        handle: (message) => Effect.logInfo(`handling ${message.body}`),
        onSuccess: (message) => Effect.as(Effect.logInfo(`settling ${message.body}`), Option.none()),
        onFailure: () => Effect.void
      })
      yield* loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const keys = (text: string) => lines.find((line) => line.message.includes(text))?.keys
      expect(keys("handling a")).toEqual(["module", "only-a", "worker"])
      expect(keys("settling a")).toEqual(["module", "only-a", "worker"])
      expect(keys("handling b")).toEqual(["module", "only-b", "worker"])
      expect(keys("settling b")).toEqual(["module", "only-b", "worker"])
    }))

  it.scoped("a background settle's logs: the caller's loggers, the worker's annotations, no message's", () =>
    Effect.gen(function*() {
      // Another implementation's messages (a wrapper: no driver's sink) settle on fibers of their own, started from
      // the loop's fiber mid-message: they must still run as `run`'s caller would have them — its loggers — with
      // the worker's annotations and none of the message in hand's.
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      const wrapper: Mailbox<string, string> = { ...mailbox }
      for (const body of ["a", "b"]) yield* mailbox.send(body, { replyTo: "nowhere" })
      const lines: Array<{ message: string; keys: Array<string> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message: String(message), keys: [...HashMap.keys(annotations)].sort() })
      })
      const loop = yield* MailboxWorker.make({
        name: "settling",
        mailbox: wrapper,
        annotations: (message) => ({ [`only-${message.body}`]: true }),
        handle: () => Effect.void,
        onSuccess: (message) => Effect.succeed(Option.some(`re ${message.body}`)),
        onFailure: () => Effect.void
      })
      yield* loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const failed = lines.filter((line) => line.message.includes("could not be sent"))
      expect(failed).toHaveLength(2)
      expect(failed.every((line) => line.keys.join(",") === "module,worker")).toBe(true)
      expect(yield* mailbox.receive({ maxMessages: 10 })).toHaveLength(2) // the replies failed: both went back
    }))

  it.scoped("a settle in line (memory) logs with its own message's annotations", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      for (const body of ["a", "b"]) yield* mailbox.send(body, { replyTo: "nowhere" })
      const lines: Array<{ message: string; keys: Array<string> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message: String(message), keys: [...HashMap.keys(annotations)].sort() })
      })
      const loop = yield* MailboxWorker.make({
        name: "settling",
        mailbox,
        annotations: (message) => ({ [`only-${message.body}`]: true }),
        handle: () => Effect.void,
        onSuccess: (message) => Effect.succeed(Option.some(`re ${message.body}`)),
        onFailure: () => Effect.void
      })
      yield* loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const failed = lines.filter((line) => line.message.includes("could not be sent")).map((line) => line.keys)
      expect(failed.sort()).toEqual([["module", "only-a", "worker"], ["module", "only-b", "worker"]])
      expect(yield* mailbox.receive({ maxMessages: 10 })).toHaveLength(2)
    }))

  it.scoped("a fiber forked for a message keeps that message's annotations after the loop moves on", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "q" })
      for (const body of ["a", "b"]) yield* mailbox.send(body)
      const lines: Array<{ message: string; annotations: Record<string, unknown> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message: String(message), annotations: Object.fromEntries(HashMap.toEntries(annotations)) })
      })
      const gate = yield* Deferred.make<void>()
      const late = yield* Ref.make<Option.Option<Fiber.RuntimeFiber<void>>>(Option.none())
      const loop = yield* MailboxWorker.make({
        name: "forking",
        mailbox,
        annotations: (message) => ({ requestId: message.body }),
        handle: (message) =>
          message.body === "a"
            // Outlives its message: it logs while "b" is in hand.
            ? Effect.flatMap(
              Effect.forkDaemon(Effect.zipRight(Deferred.await(gate), Effect.logInfo("late log of a"))),
              (fiber) => Ref.set(late, Option.some(fiber))
            )
            : Effect.zipRight(
              Deferred.succeed(gate, undefined),
              Effect.flatMap(Ref.get(late), Option.match({ onNone: () => Effect.void, onSome: Fiber.join }))
            ).pipe(Effect.zipRight(Effect.logInfo("handling b"))),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void
      })
      yield* loop.run({ maxIterations: 1, maxMessages: 2, waitTime: 0 }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const of = (text: string) => lines.find((line) => line.message.includes(text))?.annotations
      expect(of("late log of a")).toMatchObject({ requestId: "a" })
      // Joining the forked fiber did not hand its copy to the loop.
      expect(of("handling b")).toMatchObject({ requestId: "b" })
    }))

  it.scoped("a worker run inside another's handler adds both messages' annotations, its own winning", () =>
    Effect.gen(function*() {
      const outerBox = yield* MailboxMemory.make<string>({ name: "outer" })
      const innerBox = yield* MailboxMemory.make<string>({ name: "inner" })
      yield* outerBox.send("o")
      yield* innerBox.send("i")
      const lines: Array<{ message: string; annotations: Record<string, unknown> }> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push({ message: String(message), annotations: Object.fromEntries(HashMap.toEntries(annotations)) })
      })
      const inner = yield* MailboxWorker.make({
        name: "inner",
        mailbox: innerBox,
        annotations: (message) => ({ innerId: message.body, requestId: `inner-${message.body}` }),
        handle: () => Effect.logInfo("inner work"),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void
      })
      const outer = yield* MailboxWorker.make({
        name: "outer",
        mailbox: outerBox,
        annotations: (message) => ({ outerId: message.body, requestId: `outer-${message.body}` }),
        handle: () =>
          Effect.zipRight(
            inner.run({ maxIterations: 1, waitTime: 0 }).pipe(Effect.orDie),
            Effect.logInfo("outer work after the inner run")
          ),
        onSuccess: () => Effect.succeedNone,
        onFailure: () => Effect.void
      })
      yield* outer.run({ maxIterations: 1, waitTime: 0 }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      const of = (text: string) => lines.find((line) => line.message.includes(text))?.annotations
      expect(of("inner work")).toMatchObject({ outerId: "o", innerId: "i", requestId: "inner-i" })
      expect(of("outer work after the inner run")).toMatchObject({ outerId: "o", requestId: "outer-o" })
      expect(of("outer work after the inner run")).not.toHaveProperty("innerId")
      // One wrapper per logger, however deep the nesting: each line is logged once.
      expect(lines.filter((line) => line.message.includes("inner work"))).toHaveLength(1)
    }))
})

describe("MailboxWorker when receive fails", () => {
  it.scoped("a store that cannot be reached is retried with backoff from the failure (100 ms, then 150 ms), logged, and the loop goes on", () =>
    Effect.gen(function*() {
      const inner = yield* MailboxMemory.make<string>({ name: "q" })
      yield* inner.send("after the outage")
      const attempts = yield* Ref.make<Array<number>>([])
      let failuresLeft = 3
      const flaky: Mailbox<string> = {
        ...inner,
        receive: (options) =>
          Effect.gen(function*() {
            const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
            yield* Ref.update(attempts, (all) => [...all, now])
            if (failuresLeft-- > 0) {
              return yield* new MailboxConnectionError({ mailbox: "q", cause: new Error("connect ECONNREFUSED") })
            }
            return yield* inner.receive(options)
          })
      }
      const handled = yield* Ref.make<Array<string>>([])
      const logs = captureLogs()
      const loop = yield* worker(flaky, (body) => Ref.update(handled, (all) => [...all, body]))
      const fiber = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0 }).pipe(Effect.provide(logs.layer)))
      yield* settle
      expect(yield* Ref.get(attempts)).toEqual([0])
      yield* TestClock.adjust("99 millis")
      yield* settle
      expect(yield* Ref.get(attempts)).toEqual([0]) // no retry before the schedule's first delay
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(yield* Ref.get(attempts)).toEqual([0, 100])
      yield* TestClock.adjust("150 millis")
      yield* settle
      expect(yield* Ref.get(attempts)).toEqual([0, 100, 250])
      yield* TestClock.adjust("225 millis")
      yield* Fiber.join(fiber)
      expect(yield* Ref.get(attempts)).toEqual([0, 100, 250, 475])
      expect(yield* Ref.get(handled)).toEqual(["after the outage"])
      expect(logs.lines.filter((line) => line.message.includes("Receive failed; retrying with backoff")).length)
        .toBe(3)
    }))
})
