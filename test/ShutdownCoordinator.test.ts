import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Ref } from "effect"
import * as ShutdownCoordinator from "../src/ShutdownCoordinator.js"

describe("ShutdownCoordinator", () => {
  it.effect("runs callbacks in registration order once; a late one runs at once; unregister forgets", () =>
    Effect.gen(function*() {
      const coordinator = yield* ShutdownCoordinator.make
      const calls = yield* Ref.make<Array<string>>([])
      const call = (name: string) => Ref.update(calls, (all) => [...all, name])
      const forgotten = call("forgotten")
      yield* coordinator.register(call("first"))
      yield* coordinator.register(Effect.die("broken callback"))
      yield* coordinator.register(forgotten)
      yield* coordinator.register(call("second"))
      yield* coordinator.unregister(forgotten)
      expect(yield* coordinator.triggered).toBe(false)
      yield* coordinator.trigger
      yield* coordinator.trigger
      expect(yield* Ref.get(calls)).toEqual(["first", "second"])
      yield* coordinator.register(call("late"))
      expect(yield* Ref.get(calls)).toEqual(["first", "second", "late"])
      expect(yield* coordinator.triggered).toBe(true)
    }))

  it.live("layer handles the signals it is given, and only those, until it closes", () =>
    Effect.gen(function*() {
      const before = { usr2: process.listenerCount("SIGUSR2"), term: process.listenerCount("SIGTERM") }
      yield* Effect.gen(function*() {
        const coordinator = yield* ShutdownCoordinator.ShutdownCoordinator
        expect(process.listenerCount("SIGUSR2")).toBe(before.usr2 + 1)
        expect(process.listenerCount("SIGTERM")).toBe(before.term)
        process.kill(process.pid, "SIGUSR2")
        while (!(yield* coordinator.triggered)) yield* Effect.sleep("5 millis")
      }).pipe(Effect.provide(Layer.fresh(ShutdownCoordinator.layer({ signals: ["SIGUSR2"] }))))
      expect(process.listenerCount("SIGUSR2")).toBe(before.usr2)
    }))

  it.effect("by default it handles SIGTERM and SIGINT", () =>
    Effect.gen(function*() {
      const before = { term: process.listenerCount("SIGTERM"), int: process.listenerCount("SIGINT") }
      yield* Effect.gen(function*() {
        yield* ShutdownCoordinator.ShutdownCoordinator
        expect(process.listenerCount("SIGTERM")).toBe(before.term + 1)
        expect(process.listenerCount("SIGINT")).toBe(before.int + 1)
      }).pipe(Effect.provide(Layer.fresh(ShutdownCoordinator.layer())))
      expect(process.listenerCount("SIGTERM")).toBe(before.term)
    }))
})
