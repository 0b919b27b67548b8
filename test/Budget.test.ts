import { describe, expect, it } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import * as Budget from "../src/Budget.js"
import * as Deadline from "../src/Deadline.js"

describe("Budget.make", () => {
  it.effect("needs at least one limit", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Budget.make({}))
      expect(error._tag).toBe("ParseError")
      expect(error.message).toContain("at least one limit")
    }))

  it.effect("refuses token limits that are not positive integers", () =>
    Effect.gen(function*() {
      for (const bad of [0, -1, 1.5]) {
        const error = yield* Effect.flip(Budget.make({ maxInputTokens: bad }))
        expect(error.message).toContain("maxInputTokens")
      }
      expect((yield* Effect.flip(Budget.make({ maxTotalTokens: 0 }))).message).toContain("maxTotalTokens")
    }))

  it.effect("accepts a deadline alone or token limits alone", () =>
    Effect.gen(function*() {
      const deadline = yield* Deadline.after("1 minute")
      expect((yield* Budget.make({ deadline })).deadline).toBe(deadline)
      expect((yield* Budget.make({ maxOutputTokens: 10, maxInputTokens: undefined })).maxOutputTokens).toBe(10)
    }))
})

describe("BudgetTracker", () => {
  it.effect("records cumulative usage per evaluation id and sums across ids", () =>
    Effect.gen(function*() {
      const tracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
      yield* tracker.record("a", { inputTokens: 10, outputTokens: 5 })
      yield* tracker.record("a", { inputTokens: 30, outputTokens: 7 }) // replaces, not adds
      yield* tracker.record("b", { inputTokens: 1, outputTokens: 2 })
      const used = yield* tracker.consumed
      expect([used.inputTokens, used.outputTokens, used.totalTokens]).toEqual([31, 9, 40])
    }))

  it.effect("refuses negative or fractional usage with a ParseError", () =>
    Effect.gen(function*() {
      const tracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
      const error = yield* Effect.flip(tracker.record("a", { inputTokens: -1, outputTokens: 0 }))
      expect(error._tag).toBe("ParseError")
      expect((yield* tracker.consumed).totalTokens).toBe(0)
    }))

  it.effect("check tests the deadline first, then input, output and total tokens", () =>
    Effect.gen(function*() {
      const deadline = yield* Deadline.after("10 seconds")
      const budget = yield* Budget.make({ deadline, maxInputTokens: 10, maxOutputTokens: 10, maxTotalTokens: 15 })
      const tracker = yield* Budget.makeTracker(budget)
      const dimension = Effect.map(Effect.flip(tracker.check), (e) => e.dimension)

      yield* tracker.check
      yield* tracker.record("a", { inputTokens: 8, outputTokens: 8 })
      expect(yield* dimension).toBe("totalTokens")
      yield* tracker.record("a", { inputTokens: 8, outputTokens: 11 })
      expect(yield* dimension).toBe("outputTokens")
      yield* tracker.record("a", { inputTokens: 11, outputTokens: 11 })
      expect(yield* dimension).toBe("inputTokens")
      const error = yield* Effect.flip(tracker.check)
      expect([error.limit, error.used]).toEqual([10, 11])
      yield* TestClock.adjust("10 seconds")
      expect(yield* dimension).toBe("deadline")
    }))

  it.effect("is safe under concurrent fibers", () =>
    Effect.gen(function*() {
      const tracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000_000 }))
      yield* Effect.forEach(
        Array.from({ length: 200 }, (_, i) => i),
        (i) =>
          Effect.zipRight(
            Effect.yieldNow(),
            tracker.record(`eval-${i % 50}`, { inputTokens: i % 50, outputTokens: 1 })
          ),
        { concurrency: "unbounded", discard: true }
      )
      const used = yield* tracker.consumed
      // 50 ids, each last recorded with inputTokens = id, outputTokens = 1.
      expect(used.inputTokens).toBe((49 * 50) / 2)
      expect(used.outputTokens).toBe(50)
    }))
})
