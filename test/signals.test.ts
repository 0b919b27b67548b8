/**
 * Process-level claims, proven with real processes and real signals:
 * examples/loop-group-signals.ts is the worker under test.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawnTsx } from "./helpers.js"

const worker = "examples/loop-group-signals.ts"

describe("a worker process and its signals", () => {
  it.live(
    "SIGTERM in the middle of a message: it finishes, replies, and exits 0 within the shutdown timeout",
    () =>
      Effect.gen(function*() {
        const child = yield* spawnTsx(worker, ["--work-ms", "1500"])
        yield* child.waitFor(/started job-1/)
        const signalled = performance.now()
        yield* child.signal("SIGTERM")
        const { code } = yield* child.exited
        const seconds = (performance.now() - signalled) / 1000
        expect(code).toBe(0)
        const output = child.output()
        expect(output).toMatch(/finished job-1/)
        expect(output).toMatch(/replied job-1: JOB-1/)
        expect(output).toMatch(/stopped; 0 requests left queued/)
        expect(seconds).toBeLessThan(10) // the shutdown timeout
      }).pipe(Effect.scoped),
    60_000
  )

  it.live("SIGTERM while idle in a 20 s long poll exits long before the poll would end", () =>
    Effect.gen(function*() {
      const child = yield* spawnTsx(worker, ["--idle"])
      yield* child.waitFor(/worker ready/)
      yield* Effect.sleep("200 millis") // let the loop enter its long poll
      const signalled = performance.now()
      yield* child.signal("SIGTERM")
      const { code } = yield* child.exited
      expect(code).toBe(0)
      expect((performance.now() - signalled) / 1000).toBeLessThan(5)
    }).pipe(Effect.scoped), 60_000)

  it.live("a second SIGINT exits at once, without waiting for the work", () =>
    Effect.gen(function*() {
      const child = yield* spawnTsx(worker, ["--work-ms", "60000"])
      yield* child.waitFor(/started job-1/)
      yield* child.signal("SIGINT")
      yield* child.waitFor(/SIGINT received: shutting down gracefully/)
      yield* child.signal("SIGINT")
      const { code } = yield* child.exited
      expect(code).toBe(130)
      expect(child.output()).not.toMatch(/finished job-1/)
    }).pipe(Effect.scoped), 60_000)
})
