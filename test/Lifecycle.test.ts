import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Ref, TestClock } from "effect"
import * as Health from "../src/Health.js"
import * as Lifecycle from "../src/Lifecycle.js"
import type { Mailbox } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxWorker from "../src/MailboxWorker.js"

const settle = Effect.repeatN(Effect.yieldNow(), 30)

const worker = (name: string, mailbox: Mailbox<string>, work: Effect.Effect<void>) =>
  MailboxWorker.make({
    name,
    mailbox,
    handle: () => work,
    onSuccess: () => Effect.succeedNone,
    onFailure: () => Effect.void
  })

describe("ShutdownCoordinator", () => {
  it.effect("runs callbacks in registration order once; a late one runs at once; unregister forgets", () =>
    Effect.gen(function*() {
      const coordinator = yield* Lifecycle.makeCoordinator
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
})

describe("LoopGroup", () => {
  it.scoped("shutdown asks every loop even when the first times out", () =>
    Effect.gen(function*() {
      const busyBox = yield* MailboxMemory.make<string>({ name: "busy" })
      const idleBox = yield* MailboxMemory.make<string>({ name: "idle" })
      yield* busyBox.send("slow")
      const busy = yield* worker("busy", busyBox, Effect.sleep("5 seconds"))
      const idle = yield* worker("idle", idleBox, Effect.void)
      const group = Lifecycle.makeGroup([busy, idle], { shutdownTimeout: "100 millis" })
      const running = yield* Effect.fork(group.run())
      yield* settle
      const stopping = yield* Effect.fork(group.shutdown())
      yield* settle
      yield* TestClock.adjust("100 millis")
      expect(yield* Fiber.join(stopping)).toBe(false)
      expect(yield* idle.running).toBe(false)
      expect(yield* busy.running).toBe(false)
      yield* Fiber.join(running)
    }))

  it.scoped("interrupting run is a graceful shutdown: the in-flight work completes", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      yield* box.send("m")
      const completed = yield* Ref.make(0)
      const loop = yield* worker(
        "w",
        box,
        Effect.zipRight(Effect.sleep("2 seconds"), Ref.update(completed, (n) => n + 1))
      )
      const group = Lifecycle.makeGroup([loop])
      const running = yield* Effect.fork(group.run())
      yield* settle
      const interrupting = yield* Effect.fork(Fiber.interrupt(running))
      yield* settle
      yield* TestClock.adjust("2 seconds")
      expect(Exit.isInterrupted(yield* Fiber.join(interrupting))).toBe(true)
      expect(yield* Ref.get(completed)).toBe(1)
      expect(yield* box.approximateCount).toBe(0) // acknowledged, not given back
    }))

  it.scoped("a triggered ShutdownCoordinator stops the group's loops", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const coordinator = yield* Lifecycle.makeCoordinator
      const group = Lifecycle.makeGroup([loop])
      const running = yield* Effect.fork(
        group.run().pipe(Effect.provideService(Lifecycle.ShutdownCoordinator, coordinator))
      )
      yield* settle
      expect(yield* loop.running).toBe(true)
      yield* coordinator.trigger
      yield* Fiber.join(running)
      expect(yield* loop.running).toBe(false)
    }))

  it.scoped("watches its loops' heartbeats: a handler that hangs without beating is a stall", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      yield* box.send("hangs")
      const stalls = yield* Ref.make<Array<string>>([])
      const loop = yield* worker("hanging-loop", box, Effect.never)
      const group = Lifecycle.LoopGroup.make([loop], {
        watchdog: {
          threshold: "10 seconds",
          interval: "1 second",
          onStall: (found) => Ref.update(stalls, (all) => [...all, ...found.map((s) => s.name)])
        }
      })
      yield* Effect.fork(group.run())
      for (let t = 0; t < 12; t++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      yield* settle
      expect(yield* Ref.get(stalls)).toEqual(["hanging-loop"])
      expect(yield* group.shutdown({ timeout: 0 })).toBe(false) // the hung handler has to be interrupted
    }))

  it.scoped("reports its loops to Health: ready while running, not ready once shutdown begins", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const group = Lifecycle.LoopGroup.make([loop])
      const health = yield* Health.Health
      yield* Effect.fork(group.run())
      yield* settle
      expect(yield* health.readiness).toEqual({ ready: true, reasons: [] })
      expect(yield* group.shutdown()).toBe(true)
      const after = yield* health.readiness
      expect(after.ready).toBe(false)
      expect(after.reasons).toContain("shutting down")
    }).pipe(Effect.provide(Health.layerRegistry())))
})
