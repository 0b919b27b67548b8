import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import { GroupCommit } from "../../src/internal/mailbox/sql/groupCommit.js"

const settle = Effect.repeatN(Effect.yieldNow(), 20)

describe("GroupCommit", () => {
  it.scoped("a batch whose statement throws while it is built fails its callers; the next batch commits", () =>
    Effect.gen(function*() {
      const batches: Array<ReadonlyArray<string>> = []
      const commit = new GroupCommit<string, number, string>(
        (items) => {
          if (items.includes("poison")) {
            // What JSON.stringify does with a batch too large for one string.
            return (null as unknown as () => Effect.Effect<ReadonlyArray<number>, string>)()
          }
          batches.push(items)
          return Effect.succeed(items.map((item) => item.length))
        },
        { maxItems: 10, maxBytes: 1_000, sizeOf: (item) => item.length },
        yield* Effect.scope
      )
      const first = yield* Effect.fork(Effect.exit(commit.submit("poison")))
      const second = yield* Effect.fork(Effect.exit(commit.submit("same batch")))
      yield* settle
      expect(Exit.isFailure(yield* Fiber.join(first))).toBe(true)
      expect(Exit.isFailure(yield* Fiber.join(second))).toBe(true)
      // The committer is not wedged: a later submit starts a new batch and commits.
      expect(yield* commit.submit("after")).toBe(5)
      expect(batches).toEqual([["after"]])
    }))

  it.scoped("batches are split by count and by bytes; an item larger than the byte limit goes alone", () =>
    Effect.gen(function*() {
      const batches: Array<ReadonlyArray<string>> = []
      const commit = new GroupCommit<string, number, never>(
        (items) => {
          batches.push(items)
          return Effect.succeed(items.map((item) => item.length))
        },
        { maxItems: 3, maxBytes: 10, sizeOf: (item) => item.length },
        yield* Effect.scope
      )
      const items = ["aaaa", "bbbb", "cccc", "d", "e", "f", "g", "x".repeat(25), "h"]
      const results = yield* commit.submitAll(items)
      expect(results.map((exit) => Exit.isSuccess(exit) && exit.value)).toEqual(items.map((item) => item.length))
      expect(batches).toEqual([["aaaa", "bbbb"], ["cccc", "d", "e"], ["f", "g"], ["x".repeat(25)], ["h"]])
    }))
})
