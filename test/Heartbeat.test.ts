import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Ref, Scope, TestClock } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"

describe("Heartbeat", () => {
  it.effect("elapsed counts from the last beat", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      yield* TestClock.adjust("3 seconds")
      expect(Duration.toMillis(yield* hb.elapsed)).toBe(3_000)
      yield* hb.beat
      expect(Duration.toMillis(yield* hb.elapsed)).toBe(0)
      yield* TestClock.adjust("250 millis")
      expect(Duration.toMillis(yield* hb.elapsed)).toBe(250)
    }))

  it.effect("runs listeners in registration order before beat returns, until their scope closes", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      const calls = yield* Ref.make<ReadonlyArray<string>>([])
      const log = (name: string) => Ref.update(calls, (all) => [...all, name])
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      yield* Scope.extend(hb.onBeat(log("first")), first)
      yield* Scope.extend(hb.onBeat(log("second")), second)
      yield* hb.beat
      expect(yield* Ref.get(calls)).toEqual(["first", "second"])
      yield* Scope.close(first, Exit.void)
      yield* hb.beat
      expect(yield* Ref.get(calls)).toEqual(["first", "second", "second"])
      yield* Scope.close(second, Exit.void)
      yield* hb.beat
      expect((yield* Ref.get(calls)).length).toBe(3)
    }))

  it.scoped("a failing or dying listener is logged and does not stop the others", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      const calls = yield* Ref.make(0)
      yield* hb.onBeat(Effect.fail("boom") as unknown as Effect.Effect<void>)
      yield* hb.onBeat(Effect.die("bang"))
      yield* hb.onBeat(Ref.update(calls, (n) => n + 1))
      yield* hb.beat
      yield* hb.beat
      expect(yield* Ref.get(calls)).toBe(2)
    }))

  it.scoped("onBeatAt passes the beat's time and runs only the work a listener returns; a throwing one is contained", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      const seen: Array<number> = []
      const ran = yield* Ref.make(0)
      yield* hb.onBeatAt(() => {
        // A listener with a bug: the beat and the other listeners go on.
        return (undefined as unknown as { boom: () => Effect.Effect<void> }).boom()
      })
      yield* hb.onBeatAt((at) => {
        seen.push(at)
        return at % 2000 === 0 ? Ref.update(ran, (n) => n + 1) : undefined
      })
      for (let i = 0; i < 4; i++) {
        yield* hb.beat
        yield* TestClock.adjust("1 second")
      }
      expect(seen).toEqual([0, 1_000, 2_000, 3_000])
      expect(yield* Ref.get(ran)).toBe(2)
    }))
})
