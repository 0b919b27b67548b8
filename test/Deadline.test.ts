import { describe, expect, it } from "@effect/vitest"
import { DateTime, Duration, Effect, Exit, Fiber, Option, Ref, TestClock } from "effect"
import * as Deadline from "../src/Deadline.js"

// TestClock starts at the epoch; these inputs are read against it.
const reasonOf = (input: Parameters<typeof Deadline.make>[0]) =>
  Deadline.make(input).pipe(Effect.flip, Effect.map((error) => error.reason))

describe("Deadline.make", () => {
  it.effect("accepts an ISO-8601 string with Z or an offset, a Date and a DateTime", () =>
    Effect.gen(function*() {
      const z = yield* Deadline.make("1970-01-01T00:01:00Z")
      expect(DateTime.toEpochMillis(z.expiresAt)).toBe(60_000)
      const offset = yield* Deadline.make("1970-01-01T01:01:00+01:00")
      expect(DateTime.toEpochMillis(offset.expiresAt)).toBe(60_000)
      const date = yield* Deadline.make(new Date(5_000))
      expect(DateTime.toEpochMillis(date.expiresAt)).toBe(5_000)
      const dt = yield* Deadline.make(DateTime.unsafeMake(7_000))
      expect(dt.iso).toBe("1970-01-01T00:00:07.000Z")
    }))

  it.effect("gives each invalid input its own reason and keeps the input", () =>
    Effect.gen(function*() {
      expect(yield* reasonOf("1970-01-01T00:01:00")).toBe("naive")
      expect(yield* reasonOf("1970-01-01 00:01")).toBe("naive")
      expect(yield* reasonOf("1970-01-02")).toBe("invalid")
      expect(yield* reasonOf("tomorrow at noon")).toBe("invalid")
      expect(yield* reasonOf("1970-13-45T00:00:00Z")).toBe("invalid")
      expect(yield* reasonOf(new Date(Number.NaN))).toBe("invalid")
      yield* TestClock.setTime(10_000)
      expect(yield* reasonOf(new Date(9_999))).toBe("past")
      expect(yield* reasonOf(new Date(10_000))).toBe("too-soon")
      expect(yield* reasonOf(new Date(10_999))).toBe("too-soon")
      const exact = yield* Deadline.make(new Date(11_000))
      expect(DateTime.toEpochMillis(exact.expiresAt)).toBe(11_000)
      const error = yield* Effect.flip(Deadline.make("1970-01-01T00:01:00"))
      expect(error._tag).toBe("InvalidDeadlineError")
      expect(error.input).toBe("1970-01-01T00:01:00")
      expect(error.message).toContain("time zone")
    }))

  it.effect("after(duration) counts from the clock and refuses bad durations", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(1_000)
      const d = yield* Deadline.after("5 seconds")
      expect(DateTime.toEpochMillis(d.expiresAt)).toBe(6_000)
      expect((yield* Effect.flip(Deadline.after(500))).reason).toBe("too-soon")
      expect((yield* Effect.flip(Deadline.after(-5))).reason).toBe("invalid")
      expect((yield* Effect.flip(Deadline.after("soon" as Duration.DurationInput))).reason).toBe("invalid")
    }))
})

describe("Deadline time queries", () => {
  it.effect("remaining counts down to zero and isExpired flips at expiresAt", () =>
    Effect.gen(function*() {
      const d = yield* Deadline.after("10 seconds")
      expect(Duration.toMillis(yield* Deadline.remaining(d))).toBe(10_000)
      expect(yield* Deadline.isExpired(d)).toBe(false)
      yield* TestClock.adjust("9999 millis")
      expect(yield* Deadline.isExpired(d)).toBe(false)
      yield* TestClock.adjust("1 millis")
      expect(yield* Deadline.isExpired(d)).toBe(true)
      expect(Duration.toMillis(yield* Deadline.remaining(d))).toBe(0)
      yield* TestClock.adjust("1 hour")
      expect(Duration.toMillis(yield* Deadline.remaining(d))).toBe(0)
    }))

  it.effect("earliest picks the sooner, a on a tie, the present one otherwise", () =>
    Effect.gen(function*() {
      const a = yield* Deadline.after("10 seconds")
      const b = yield* Deadline.after("20 seconds")
      const aTwin = yield* Deadline.after("10 seconds")
      expect(Deadline.earliest(a, b)).toBe(a)
      expect(Deadline.earliest(b, a)).toBe(a)
      expect(Deadline.earliest(a, aTwin)).toBe(a)
      expect(Deadline.earliest(aTwin, a)).toBe(aTwin)
      expect(Deadline.earliest(undefined, b)).toBe(b)
      expect(Deadline.earliest(b, undefined)).toBe(b)
      expect(Deadline.earliest()).toBeUndefined()
    }))
})

describe("Deadline.within", () => {
  it.effect("interrupts long work at the deadline and runs its finalizers", () =>
    Effect.gen(function*() {
      const finalized = yield* Ref.make(false)
      const d = yield* Deadline.after("5 seconds")
      const fiber = yield* Effect.never.pipe(
        Effect.ensuring(Ref.set(finalized, true)),
        Deadline.within(d),
        Effect.fork
      )
      yield* TestClock.adjust("4999 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 millis")
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isFailure(exit)).toBe(true)
      const error = yield* Effect.flip(exit)
      expect(error._tag).toBe("DeadlineExceededError")
      expect(DateTime.toEpochMillis(error.expiresAt)).toBe(5_000)
      expect(yield* Ref.get(finalized)).toBe(true)
    }))

  it.effect("lets work that finishes in time through, with current set inside only", () =>
    Effect.gen(function*() {
      const d = yield* Deadline.after("5 seconds")
      expect(Option.isNone(yield* Deadline.current)).toBe(true)
      const inside = yield* Deadline.current.pipe(Effect.delay("1 second"), Deadline.within(d), Effect.fork)
      yield* TestClock.adjust("1 second")
      expect(Option.getOrThrow(yield* Fiber.join(inside))).toBe(d)
      expect(Option.isNone(yield* Deadline.current)).toBe(true)
    }))

  it.effect("nested within takes the earlier deadline, whichever is outer", () =>
    Effect.gen(function*() {
      const soon = yield* Deadline.after("2 seconds")
      const late = yield* Deadline.after("10 seconds")
      const seen = yield* Deadline.current.pipe(Deadline.within(late), Deadline.within(soon))
      expect(Option.getOrThrow(seen)).toBe(soon)
      const seen2 = yield* Deadline.current.pipe(Deadline.within(soon), Deadline.within(late))
      expect(Option.getOrThrow(seen2)).toBe(soon)

      const fiber = yield* Effect.never.pipe(Deadline.within(late), Deadline.within(soon), Effect.fork)
      yield* TestClock.adjust("2 seconds")
      const error = yield* Effect.flip(Fiber.join(fiber))
      expect(DateTime.toEpochMillis(error.expiresAt)).toBe(2_000)
    }))

  it.effect("an already-expired deadline fails without starting the work", () =>
    Effect.gen(function*() {
      const started = yield* Ref.make(false)
      const d = yield* Deadline.after("1 second")
      yield* TestClock.adjust("1 second")
      const error = yield* Effect.flip(Ref.set(started, true).pipe(Deadline.within(d)))
      expect(error._tag).toBe("DeadlineExceededError")
      expect(yield* Ref.get(started)).toBe(false)
    }))

  it.effect("checkpoint fails once the current deadline passed, succeeds before and without one", () =>
    Effect.gen(function*() {
      yield* Deadline.checkpoint
      const d = yield* Deadline.after("3 seconds")
      const seen = yield* Ref.make<ReadonlyArray<string>>([])
      const record = Deadline.checkpoint.pipe(
        Effect.match({ onFailure: (e) => e._tag, onSuccess: () => "ok" }),
        Effect.flatMap((outcome) => Ref.update(seen, (all) => [...all, outcome]))
      )
      // Uninterruptible work that overruns its deadline, checking in before and after.
      const outcome = yield* Effect.uninterruptible(
        Effect.all([record, TestClock.adjust("5 seconds"), record])
      ).pipe(Deadline.within(d), Effect.either)
      expect(yield* Ref.get(seen)).toEqual(["ok", "DeadlineExceededError"])
      expect(outcome._tag).toBe("Left")
    }))
})

describe("Deadline.after on the real clock", () => {
  it.live("after(1 second) is always valid, even when the clock moves between reads", () =>
    Effect.gen(function*() {
      for (let i = 0; i < 2_000; i++) yield* Deadline.after("1 second")
    }))
})
