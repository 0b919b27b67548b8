import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Ref, Schedule, TestClock } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import * as Watchdog from "../src/Watchdog.js"
import { captureLogs, jumpingClock, refusedOptions, runTsx } from "./helpers.js"

const settle = Effect.repeatN(Effect.yieldNow(), 10)

describe("Watchdog", () => {
  it.scoped("logs a stall at error level naming the loop, acts once per stall, and a beat clears it", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const actions = yield* Ref.make<ReadonlyArray<ReadonlyArray<string>>>([])
      const watchdog = yield* Watchdog.make({
        threshold: "10 seconds",
        interval: "1 second",
        onStall: (stalls) => Ref.update(actions, (all) => [...all, stalls.map((s) => s.name)])
      })
      const busy = yield* Heartbeat.make
      const stuck = yield* Heartbeat.make
      yield* watchdog.register("busy-loop", busy)
      yield* watchdog.register("stuck-loop", stuck)
      yield* watchdog.start
      yield* watchdog.start // idempotent: one checker, not two
      for (let t = 0; t < 15; t++) {
        yield* busy.beat
        yield* TestClock.adjust("1 second")
        yield* settle
      }
      expect(yield* Ref.get(actions)).toEqual([["stuck-loop"]])
      expect(yield* watchdog.stalled).toEqual(["stuck-loop"])
      const errors = logs.lines.filter((l) => l.level === "ERROR")
      expect(errors.length).toBe(1)
      expect(errors[0]!.message).toContain("stuck-loop")

      yield* stuck.beat
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(yield* watchdog.stalled).toEqual([])
      yield* TestClock.adjust("12 seconds")
      yield* settle
      // Both loops have stopped beating now; each stall acts once, when it starts.
      expect(yield* Ref.get(actions)).toEqual([["stuck-loop"], ["busy-loop"], ["stuck-loop"]])
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("check can be called directly and a custom schedule is honoured", () =>
    Effect.gen(function*() {
      const checks = yield* Ref.make(0)
      const watchdog = yield* Watchdog.make({
        threshold: "5 seconds",
        schedule: Schedule.spaced("10 seconds").pipe(Schedule.tapOutput(() => Ref.update(checks, (n) => n + 1))),
        onStall: () => Effect.void
      })
      const hb = yield* Heartbeat.make
      yield* watchdog.register("loop", hb)
      expect(yield* watchdog.check).toEqual([])
      yield* TestClock.adjust("6 seconds")
      const stalls = yield* watchdog.check
      expect(stalls.map((s) => s.name)).toEqual(["loop"])
      yield* watchdog.start
      yield* TestClock.adjust("30 seconds")
      yield* settle
      expect(yield* Ref.get(checks)).toBe(4) // at 0, 10, 20 and 30 s
    }))

  it.scoped("a loop unregisters when its scope closes", () =>
    Effect.gen(function*() {
      const watchdog = yield* Watchdog.make({ threshold: "1 second", onStall: () => Effect.void })
      yield* Effect.scoped(Effect.flatMap(Heartbeat.make, (hb) => watchdog.register("gone", hb)))
      yield* TestClock.adjust("1 minute")
      expect(yield* watchdog.check).toEqual([])
    }))

  it.effect("refuses bad config with a ParseError", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Watchdog.make({ threshold: -1 }))
      expect(error.message).toContain("threshold")
    }))

  it.effect("refuses a threshold or interval that is zero, infinite, beyond 24 h or NaN in any form", () =>
    Effect.gen(function*() {
      const refused = (options: Watchdog.Options) => Effect.map(Effect.flip(Watchdog.make(options)), refusedOptions)
      // Zero: every loop would be stalled at every check / a check loop without pause.
      expect(yield* refused({ threshold: 0 })).toEqual(["threshold"])
      expect(yield* refused({ interval: 0 })).toEqual(["interval"])
      expect(yield* refused({ threshold: "0 seconds", interval: [0, 0] })).toEqual(["threshold", "interval"])
      // Infinite or too long: no stall would ever be seen / no check would ever come.
      for (const long of [Infinity, Duration.infinity, "25 hours", 1e300] as const) {
        expect(yield* refused({ threshold: long })).toEqual(["threshold"])
        expect(yield* refused({ interval: long })).toEqual(["interval"])
      }
      for (const nan of [NaN, [NaN, 0], [0, NaN]] as const) {
        expect(yield* refused({ threshold: nan, interval: nan })).toEqual(["threshold", "interval"])
      }
      const error = yield* Effect.flip(Watchdog.make({ interval: Infinity }))
      expect(error.message).toContain("Watchdog.make options")
      expect(error.message).toContain("must be greater than zero and at most 24 hours")
      const edge = yield* Watchdog.make({ threshold: "24 hours", interval: 1, onStall: () => Effect.void })
      expect(Duration.toHours(edge.config.threshold)).toBe(24)
    }))

  it.live("by default exits the process with code 1 (a real child process)", () =>
    Effect.gen(function*() {
      const { code, stdout, stderr } = yield* runTsx("test/fixtures/watchdog-exit.ts")
      expect(code).toBe(1)
      const output = stdout + stderr
      expect(output).toContain("watchdog started")
      expect(output).toContain("stuck-loop")
      expect(output).not.toContain("still alive")
    }), 30_000)
})

describe("liveness on the monotonic clock", () => {
  it.scoped("the wall clock jumps +1 h then -2 h while monotonic time runs on: no false stall, no missed extension", () =>
    Effect.gen(function*() {
      const { clock, jump } = yield* jumpingClock
      yield* Effect.gen(function*() {
        const stalls = yield* Ref.make<ReadonlyArray<string>>([])
        const watchdog = yield* Watchdog.make({
          threshold: "10 seconds",
          interval: "1 second",
          onStall: (found) => Ref.update(stalls, (all) => [...all, ...found.map((stall) => stall.name)])
        })
        const heartbeat = yield* Heartbeat.make
        yield* watchdog.register("worker", heartbeat)
        yield* watchdog.start
        const extensions: Array<number> = []
        const message: LeaseExtender.Extendable = {
          id: "m",
          extendVisibility: () =>
            Effect.map(Clock.currentTimeNanos, (nanos) => void extensions.push(Number(nanos / BigInt(1_000_000_000))))
        }
        const extender = yield* LeaseExtender.make({ interval: "20 seconds", extension: "60 seconds" })
        yield* extender.attach(message, heartbeat)
        for (let second = 0; second < 60; second++) {
          yield* heartbeat.beat // the worker works, and proves it every second
          if (second === 10) yield* jump(60 * 60 * 1000) // NTP steps the wall clock an hour forward...
          if (second === 30) yield* jump(-2 * 60 * 60 * 1000) // ...then two hours back
          yield* settle
          yield* TestClock.adjust("1 second")
        }
        yield* settle
        expect(yield* Ref.get(stalls)).toEqual([])
        expect(extensions).toEqual([0, 20, 40]) // once per 20 s of real work, through both jumps
        expect(yield* watchdog.check).toEqual([])
      }).pipe(Effect.withClock(clock))
    }))
})
