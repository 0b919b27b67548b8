import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, Metric, Ref, Schedule, TestClock } from "effect"
import * as Health from "../src/Health.js"
import * as LoopGroup from "../src/LoopGroup.js"
import { InvalidParameterError, type Mailbox } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as ShutdownCoordinator from "../src/ShutdownCoordinator.js"
import { captureLogs, refusedOptions } from "./helpers.js"

const settle = Effect.repeatN(Effect.yieldNow(), 30)

const worker = (name: string, mailbox: Mailbox<string>, work: Effect.Effect<void>) =>
  MailboxWorker.make({
    name,
    mailbox,
    handle: () => work,
    onSuccess: () => Effect.succeedNone,
    onFailure: () => Effect.void
  })

/** A mailbox whose receive dies (an unexpected error) the first `failures` times, then works. */
const breaking = (mailbox: Mailbox<string>, failures: number) =>
  Effect.map(Ref.make(0), (calls): Mailbox<string> => ({
    ...mailbox,
    receive: (options) =>
      Effect.flatMap(Ref.getAndUpdate(calls, (n) => n + 1), (n) =>
        n < failures
          ? Effect.fail(new InvalidParameterError({ parameter: "receive", value: n, reason: "the store broke" }))
          : mailbox.receive(options))
  }))

describe("LoopGroup", () => {
  it.scoped("shutdown asks every loop even when the first times out", () =>
    Effect.gen(function*() {
      const busyBox = yield* MailboxMemory.make<string>({ name: "busy" })
      const idleBox = yield* MailboxMemory.make<string>({ name: "idle" })
      yield* busyBox.send("slow")
      const busy = yield* worker("busy", busyBox, Effect.sleep("5 seconds"))
      const idle = yield* worker("idle", idleBox, Effect.void)
      const group = LoopGroup.make([busy, idle], { shutdownTimeout: "100 millis" })
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
      const group = LoopGroup.make([loop])
      const running = yield* Effect.fork(group.run())
      yield* settle
      const interrupting = yield* Effect.fork(Fiber.interrupt(running))
      yield* settle
      yield* TestClock.adjust("2 seconds")
      expect(Exit.isInterrupted(yield* Fiber.join(interrupting))).toBe(true)
      expect(yield* Ref.get(completed)).toBe(1)
      expect(yield* box.approximateCount).toBe(0) // acknowledged, not given back
    }))

  it.scoped("interrupting run with a stuck handler: at the timeout the work is interrupted and nacked, and run ends", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      yield* box.send("stuck")
      const loop = yield* worker("stuck-loop", box, Effect.never)
      const group = LoopGroup.make([loop], { shutdownTimeout: "1500 millis" })
      const running = yield* Effect.fork(group.run({ visibilityTimeout: "1 hour" }))
      yield* settle
      // `Fiber.interrupt` waits for `run` to end: its `onInterrupt` runs uninterruptibly, as under runMain.
      const interrupting = yield* Effect.fork(Fiber.interrupt(running))
      yield* settle
      yield* TestClock.adjust("1499 millis")
      yield* settle
      expect(interrupting.unsafePoll()).toBeNull()
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(interrupting)
      // Visible again at once: nacked, not left to its one-hour visibility.
      expect((yield* box.receive()).map((m) => [m.body, m.deliveryCount])).toEqual([["stuck", 2]])
      const said = logs.lines.map((line) => line.message).join("\n")
      expect(said).toMatch(/some loops had to be interrupted/)
      expect(said).not.toMatch(/stopped cleanly/)
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("a triggered ShutdownCoordinator stops the group's loops", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const coordinator = yield* ShutdownCoordinator.make
      const group = LoopGroup.make([loop])
      const running = yield* Effect.fork(
        group.run().pipe(Effect.provideService(ShutdownCoordinator.ShutdownCoordinator, coordinator))
      )
      yield* settle
      expect(yield* loop.running).toBe(true)
      yield* coordinator.trigger
      yield* Fiber.join(running)
      expect(yield* loop.running).toBe(false)
    }))

  it.scoped("a shutdown triggered before run starts no loop", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      yield* box.send("m")
      const loop = yield* worker("w", box, Effect.void)
      const coordinator = yield* ShutdownCoordinator.make
      yield* coordinator.trigger
      yield* LoopGroup.make([loop]).run().pipe(
        Effect.provideService(ShutdownCoordinator.ShutdownCoordinator, coordinator)
      )
      expect(yield* box.approximateCount).toBe(1)
    }))

  it.scoped("a second run of a running group fails, and the first goes on", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const group = LoopGroup.make([loop])
      const first = yield* Effect.fork(group.run())
      yield* settle
      const error = yield* Effect.flip(group.run())
      expect([error._tag, error.message]).toEqual([
        "AlreadyRunningError",
        "The group of \"w\" is already running: stop it, or wait for its run to end, before running it again"
      ])
      expect(yield* loop.running).toBe(true)
      expect(first.unsafePoll()).toBeNull()
      expect(yield* group.shutdown()).toBe(true)
      yield* Fiber.join(first)
    }))

  it.scoped("watches its loops' heartbeats: a handler that hangs without beating is a stall", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      yield* box.send("hangs")
      const stalls = yield* Ref.make<Array<string>>([])
      const loop = yield* worker("hanging-loop", box, Effect.never)
      const group = LoopGroup.make([loop], {
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
      const group = LoopGroup.make([loop])
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

describe("LoopGroup supervision", () => {
  it.scoped("a loop that dies stops the group: the others finish their work, and run fails with the cause", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const goodBox = yield* MailboxMemory.make<string>({ name: "good" })
      yield* goodBox.send("in flight")
      const done = yield* Ref.make<Array<string>>([])
      const good = yield* worker(
        "good-loop",
        goodBox,
        Effect.zipRight(Effect.sleep("3 seconds"), Ref.update(done, (all) => [...all, "finished"]))
      )
      const bad = yield* worker(
        "bad-loop",
        yield* breaking(yield* MailboxMemory.make<string>({ name: "bad" }), 1),
        Effect.void
      )
      const failures = Metric.tagged(MailboxWorker.loopFailures, "loop", "bad-loop")
      const before = (yield* Metric.value(failures)).count
      const running = yield* Effect.fork(LoopGroup.make([good, bad], { shutdownTimeout: "10 seconds" }).run())
      yield* settle
      // The bad loop died at once; the good one is given its shutdown timeout to finish.
      expect(yield* good.running).toBe(true)
      expect(running.unsafePoll()).toBeNull()
      yield* TestClock.adjust("3 seconds")
      const exit = yield* Fiber.await(running)
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toMatch(/the store broke/)
      expect(yield* Ref.get(done)).toEqual(["finished"])
      expect(yield* goodBox.approximateCount).toBe(0)
      expect(yield* good.running).toBe(false)
      expect((yield* Metric.value(failures)).count).toBe(before + 1)
      const errors = logs.lines.filter((line) => line.level === "ERROR").map((line) => line.message)
      expect(errors.some((message) => message.includes(`Loop "bad-loop" died`))).toBe(true)
      expect(logs.lines.map((line) => line.message).join("\n")).toMatch(
        /Loop "bad-loop" died: all loops stopped cleanly/
      )
    }).pipe(Effect.provide(logs.layer))
  })

  it.scoped("restart(schedule) runs a dead loop again on the schedule, logging each restart", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const handled = yield* Ref.make(0)
      const loop = yield* worker("flaky", yield* breaking(box, 2), Ref.update(handled, (n) => n + 1))
      const group = LoopGroup.make([loop], {
        supervision: LoopGroup.restart(Schedule.spaced("5 seconds").pipe(Schedule.intersect(Schedule.recurs(3))))
      })
      const restarts = Metric.tagged(LoopGroup.loopRestarts, "loop", "flaky")
      const before = (yield* Metric.value(restarts)).count
      const health = yield* Health.Health
      const running = yield* Effect.fork(group.run())
      yield* settle
      expect(yield* loop.running).toBe(false) // died once, waiting for its restart
      expect((yield* health.readiness).reasons).toEqual([`loop "flaky" is not running`])
      yield* TestClock.adjust("4 seconds")
      yield* settle
      expect(yield* loop.running).toBe(false)
      yield* TestClock.adjust("1 second") // restart 1: dies again
      yield* settle
      expect(yield* loop.running).toBe(false)
      yield* TestClock.adjust("5 seconds") // restart 2: the store works now
      yield* settle
      expect(yield* loop.running).toBe(true)
      expect(yield* health.readiness).toEqual({ ready: true, reasons: [] })
      yield* box.send("after the restarts") // wakes its long poll
      yield* settle
      expect(yield* Ref.get(handled)).toBe(1)
      expect((yield* Metric.value(restarts)).count).toBe(before + 2)
      const warnings = logs.lines.filter((line) => line.level === "WARN").map((line) => line.message)
      expect(warnings.filter((message) => /Loop "flaky" died; restart \d in 5s/.test(message)).length).toBe(2)
      expect(yield* group.shutdown()).toBe(true)
      yield* Fiber.join(running)
    }).pipe(Effect.provide([logs.layer, Health.layerRegistry()]))
  })

  it.scoped("once the restart schedule gives up, the group stops and run fails with the cause", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("doomed", yield* breaking(box, 100), Effect.void)
      const group = LoopGroup.make([loop], {
        supervision: LoopGroup.restart(Schedule.spaced("1 second").pipe(Schedule.intersect(Schedule.recurs(2))))
      })
      const running = yield* Effect.fork(group.run({ waitTime: 0 }))
      for (let t = 0; t < 3; t++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      const exit = yield* Fiber.await(running)
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toMatch(/the store broke/)
    }))

  it.scoped("a shutdown while a dead loop waits for its restart returns at once, and run ends", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("waiting", yield* breaking(box, 1), Effect.void)
      const group = LoopGroup.make([loop], { supervision: LoopGroup.restart(Schedule.spaced("1 hour")) })
      const running = yield* Effect.fork(group.run({ waitTime: 0 }))
      yield* settle
      expect(yield* group.shutdown()).toBe(true)
      yield* Fiber.join(running)
      expect(yield* loop.running).toBe(false)
    }))

  it.scoped("bad run options fail run at once, and are not restarted", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const group = LoopGroup.make([loop], { supervision: LoopGroup.restart(Schedule.spaced("1 second")) })
      const error = yield* Effect.flip(group.run({ waitTime: "1 minute" }))
      expect(error._tag).toBe("InvalidParameterError")
    }))

  it.scoped("bad group options fail run with a ParseError naming them, before any loop starts", () =>
    Effect.gen(function*() {
      const box = yield* MailboxMemory.make<string>({ name: "q" })
      const loop = yield* worker("w", box, Effect.void)
      const error = yield* Effect.flip(LoopGroup.make([loop], { shutdownTimeout: -1 }).run())
      expect(refusedOptions(error)).toEqual(["shutdownTimeout"])
      expect(error.message).toContain("LoopGroup.make options")
      const watchdog = yield* Effect.flip(
        LoopGroup.make([loop], { watchdog: { threshold: "soon" as "1 second" } }).run()
      )
      expect(refusedOptions(watchdog)).toEqual(["threshold"])
      expect(yield* loop.running).toBe(false)
    }))
})
