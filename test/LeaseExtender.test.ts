import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Option, Ref, Scope, TestClock } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import { ReceiptHandleExpiredError } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import { captureLogs, refusedOptions } from "./helpers.js"

/** A message that records the timeouts it is extended by; `behaviour` decides each call's outcome. */
const fakeMessage = (
  behaviour: (call: number) => Effect.Effect<void, { readonly _tag: string }> = () => Effect.void
) =>
  Effect.map(Ref.make<ReadonlyArray<number>>([]), (calls) => ({
    calls,
    message: {
      id: "m-1",
      extendVisibility: (timeout: Duration.Duration) =>
        Effect.flatMap(
          Ref.modify(calls, (all) => [all.length, [...all, Duration.toMillis(timeout)]]),
          behaviour
        )
    }
  }))

/** Lets forked extension fibers run. */
const settle = Effect.repeatN(Effect.yieldNow(), 10)

describe("LeaseExtenderConfig", () => {
  it.effect("has the seed's defaults and refuses bad config with a ParseError", () =>
    Effect.gen(function*() {
      const extender = yield* LeaseExtender.make()
      expect(Duration.toMillis(extender.config.interval)).toBe(60_000)
      expect(Duration.toMillis(extender.config.extension)).toBe(300_000)
      expect(extender.config.enabled).toBe(true)
      const error = yield* Effect.flip(LeaseExtender.make({ interval: -1 }))
      expect(error._tag).toBe("ParseError")
      expect(error.message).toContain("must not be negative")
      const error2 = yield* Effect.flip(LeaseExtender.make({ extension: "five minutes" as Duration.DurationInput }))
      expect(error2.message).toContain("extension")
    }))

  it.effect("refuses an extension that cannot keep a message: zero, beyond 12 h, or not longer than the interval", () =>
    Effect.gen(function*() {
      const refused = (options: LeaseExtender.Options) =>
        Effect.map(Effect.flip(LeaseExtender.make(options)), (error) => ({
          fields: refusedOptions(error),
          message: error.message
        }))
      // Zero: every extension would make the message visible to another receiver while the handler runs.
      const zero = yield* refused({ extension: 0 })
      expect(zero.fields).toEqual(["extension"])
      expect(zero.message).toContain("must be greater than zero")
      expect((yield* refused({ extension: "0 seconds" })).fields).toEqual(["extension"])
      // Beyond the 12 h every mailbox's extendVisibility takes: every extension would fail at run time.
      const long = yield* refused({ extension: "13 hours" })
      expect(long.fields).toEqual(["extension"])
      expect(long.message).toContain("at most 12 hours")
      expect((yield* refused({ extension: Duration.infinity })).fields).toEqual(["extension"])
      expect((yield* refused({ extension: Infinity })).fields).toEqual(["extension"])
      // Not longer than the interval: the lease would run out between two extensions.
      const short = yield* refused({ interval: "5 minutes", extension: "5 minutes" })
      expect(short.fields).toEqual(["extension"])
      expect(short.message).toContain("longer than interval")
      expect((yield* refused({ interval: "10 minutes" })).fields).toEqual(["extension"]) // the default 300 s
      expect((yield* refused({ interval: "13 hours", extension: "12 hours" })).fields).toEqual(["interval"])
      // NaN in any form is refused, never read as zero.
      for (const nan of [NaN, [NaN, 0], [0, NaN]] as const) {
        expect((yield* refused({ extension: nan })).fields).toEqual(["extension"])
        expect((yield* refused({ interval: nan })).fields).toEqual(["interval"])
      }
      // The bounds themselves are fine.
      const edge = yield* LeaseExtender.make({ interval: "11 hours", extension: "12 hours" })
      expect(Duration.toHours(edge.config.extension)).toBe(12)
      yield* LeaseExtender.make({ interval: 0, extension: 1 })
    }))
})

describe("LeaseExtender.attach", () => {
  it.scoped("interval 0: three beats give three extensions of the configured length", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make({ interval: 0, extension: "90 seconds" })
      const hb = yield* Heartbeat.make
      yield* Effect.scoped(Effect.gen(function*() {
        yield* extender.attach(message, hb)
        for (let i = 0; i < 3; i++) {
          yield* hb.beat
          yield* settle // work between beats lets each extension finish
        }
      }))
      expect(yield* Ref.get(calls)).toEqual([90_000, 90_000, 90_000])
    }))

  it.scoped("interval 200 ms: beat, beat, beat, +250 ms, beat gives two", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make({ interval: "200 millis" })
      const hb = yield* Heartbeat.make
      yield* Effect.scoped(Effect.gen(function*() {
        yield* extender.attach(message, hb)
        yield* hb.beat
        yield* settle
        yield* hb.beat
        yield* hb.beat
        yield* TestClock.adjust("250 millis")
        yield* hb.beat
      }))
      expect((yield* Ref.get(calls)).length).toBe(2)
    }))

  it.scoped("one extension in flight: beats meanwhile are dropped, and closing the scope waits for it", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const finished = yield* Ref.make(false)
      const { calls, message } = yield* fakeMessage(() =>
        Effect.zipRight(Deferred.await(gate), Ref.set(finished, true))
      )
      const extender = yield* LeaseExtender.make({ interval: 0 })
      const hb = yield* Heartbeat.make
      const scope = yield* Scope.make()
      yield* Scope.extend(extender.attach(message, hb), scope)
      yield* hb.beat
      yield* settle
      yield* hb.beat
      yield* hb.beat
      expect((yield* Ref.get(calls)).length).toBe(1)
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(closing))).toBe(true) // still waiting for the extension
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(closing)
      expect(yield* Ref.get(finished)).toBe(true)
      yield* hb.beat // after detach: nothing
      yield* settle
      expect((yield* Ref.get(calls)).length).toBe(1)
    }))

  it.scoped("an expired handle is final: one warning, and no further extension is tried for that message", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage(() =>
        Effect.fail(new ReceiptHandleExpiredError({ mailbox: "q", messageId: "m-1", receiptHandle: "h" }))
      )
      const extender = yield* LeaseExtender.make({ interval: 0, extension: "1 minute" })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message, hb)
      for (let i = 0; i < 100; i++) {
        yield* hb.beat
        yield* settle
      }
      expect((yield* Ref.get(calls)).length).toBe(1)
      expect(logs.lines.filter((line) => line.message.includes("receipt handle expired")).length).toBe(1)
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("a store that keeps failing is retried on every beat, logged as an error once until it works again", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage((call) =>
        call < 20 || call === 21 ? Effect.fail({ _tag: "MailboxConnectionError" }) : Effect.void
      )
      const extender = yield* LeaseExtender.make({ interval: 0, extension: "1 minute" })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message, hb)
      for (let i = 0; i < 22; i++) {
        yield* hb.beat
        yield* settle
      }
      expect((yield* Ref.get(calls)).length).toBe(22)
      // Twenty failures in a row, one that worked, one more failure: two errors.
      expect(logs.lines.filter((line) => line.level === "ERROR").length).toBe(2)
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("failures are logged, never raised; a failed extension is retried on the next beat", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage((call) =>
        call < 2 ? Effect.fail({ _tag: "MailboxConnectionError" }) : Effect.void
      )
      const extender = yield* LeaseExtender.make({ interval: "1 minute" })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message, hb)
      yield* hb.beat
      yield* settle
      yield* hb.beat // the first failed: not rate limited
      yield* settle
      yield* hb.beat // the second failed too
      yield* settle
      yield* hb.beat // the third succeeded: now rate limited
      yield* settle
      expect((yield* Ref.get(calls)).length).toBe(3)
    }))

  it.scoped("a second attach while the first scope is open fails AlreadyAttachedError; after it closes, works", () =>
    Effect.gen(function*() {
      const { message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make()
      const hb = yield* Heartbeat.make
      const first = yield* Scope.make()
      yield* Scope.extend(extender.attach(message, hb), first)
      const error = yield* Effect.flip(extender.attach({ ...message, id: "m-2" }, hb))
      expect(error._tag).toBe("AlreadyAttachedError")
      expect(error.attachedTo).toBe("m-1")
      yield* Scope.close(first, Exit.void)
      yield* extender.attach({ ...message, id: "m-2" }, hb)
    }))

  it.scoped("disabled config attaches nothing", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make({ enabled: false, interval: 0 })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message, hb)
      yield* extender.attach(message, hb)
      yield* hb.beat
      yield* settle
      expect(yield* Ref.get(calls)).toEqual([])
    }))

  it.scoped("other listeners of the heartbeat still run", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make({ interval: 0 })
      const hb = yield* Heartbeat.make
      const other = yield* Ref.make(0)
      yield* hb.onBeat(Ref.update(other, (n) => n + 1))
      yield* extender.attach(message, hb)
      yield* hb.beat
      yield* settle
      expect(yield* Ref.get(other)).toBe(1)
      expect((yield* Ref.get(calls)).length).toBe(1)
    }))
})

describe("LeaseExtender with a real mailbox", () => {
  it.scoped("a heartbeat that stops beating lets the message become visible to another receiver", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "work" })
      yield* mailbox.send("job")
      const [message] = yield* mailbox.receive({ visibilityTimeout: "60 seconds" })
      const extender = yield* LeaseExtender.make({ interval: "20 seconds", extension: "60 seconds" })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message!, hb)
      yield* hb.beat // one beat, then the worker gets stuck
      yield* settle
      yield* TestClock.adjust("59 seconds")
      expect(yield* mailbox.receive()).toEqual([])
      yield* TestClock.adjust("1 second")
      const [again] = yield* mailbox.receive()
      expect(again?.deliveryCount).toBe(2)
      expect(again?.body).toBe("job")
    }))

  it.scoped("a heartbeat every 30 s keeps a 60 s lease invisible for 20 minutes", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "work" })
      yield* mailbox.send("job")
      const [message] = yield* mailbox.receive({ visibilityTimeout: "60 seconds" })
      const extender = yield* LeaseExtender.make({ interval: "20 seconds", extension: "60 seconds" })
      const hb = yield* Heartbeat.make
      yield* extender.attach(message!, hb)
      for (let t = 0; t < 40; t++) {
        yield* hb.beat
        yield* settle
        yield* TestClock.adjust("30 seconds")
        expect(yield* mailbox.receive()).toEqual([])
      }
      yield* message!.acknowledge
      expect(yield* mailbox.approximateCount).toBe(0)
    }))
})

describe("LeaseExtender.extendWhile", () => {
  it.scoped("extends while the effect runs, detaches after it, and refuses a second message meanwhile", () =>
    Effect.gen(function*() {
      const { calls, message } = yield* fakeMessage()
      const extender = yield* LeaseExtender.make({ interval: 0 })
      const hb = yield* Heartbeat.make
      const inner = yield* extender.extendWhile(
        message,
        hb,
        Effect.gen(function*() {
          yield* hb.beat
          yield* settle
          return yield* Effect.flip(extender.attach({ ...message, id: "m-2" }, hb))
        })
      )
      expect(inner._tag).toBe("AlreadyAttachedError")
      yield* hb.beat // after: nothing
      yield* settle
      expect((yield* Ref.get(calls)).length).toBe(1)
      yield* extender.attach({ ...message, id: "m-3" }, hb) // free again
    }))
})
