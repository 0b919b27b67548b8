import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Option, Ref, Schedule, Scope, Stream, TestClock } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MainLoop from "../src/MainLoop.js"

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

// ---------------------------------------------------------------------------
// The current heartbeat: beating from anywhere inside the work
// ---------------------------------------------------------------------------

const settle = Effect.repeatN(Effect.yieldNow(), 30)

/** A download three calls deep that knows nothing of heartbeats: it beats through the environment per chunk. */
const downloadFile = (chunks: number) => fetchChunks(chunks)
const fetchChunks = (chunks: number) =>
  Effect.forEach(Array.from({ length: chunks }, (_, i) => i), (i) => writeChunk(i), { discard: true })
const writeChunk = (_chunk: number) => Effect.zipRight(Effect.sleep("30 seconds"), Heartbeat.beat)

/** A request mailbox and a MainLoop over it whose lease is 60 s, extended by 60 s at most every 20 s. */
const leasedLoop = <Out>(name: string, execute: (request: string) => Effect.Effect<Out>) =>
  Effect.gen(function*() {
    const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<Out>>({
      name
    })
    const loop = yield* MainLoop.make({
      requests,
      execute,
      config: { leaseExtender: { interval: "20 seconds", extension: "60 seconds" } }
    })
    yield* requests.send(MainLoop.request("go"))
    const run = yield* Effect.fork(loop.run({ maxIterations: 1, waitTime: 0, visibilityTimeout: "60 seconds" }))
    return { requests, run }
  }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes()))

describe("Heartbeat.forkOnBeat", () => {
  it.scoped("a beat interrupted before its fork ran leaves nothing behind: later beats fork, the detach returns", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      // A listener whose work takes a while, registered first: its work runs before the fork's.
      yield* hb.onBeat(Effect.sleep("100 millis"))
      const runs = yield* Ref.make(0)
      const detach = yield* hb.forkOnBeat({ due: () => true, run: () => Ref.update(runs, (n) => n + 1) })
      const interrupted = yield* Effect.fork(hb.beat)
      yield* TestClock.adjust("50 millis")
      yield* Fiber.interrupt(interrupted)
      expect(yield* Ref.get(runs)).toBe(0)
      // The next beat runs the task (before the fix, the flight the interrupted beat claimed was never
      // started nor released: every later beat was dropped, and the detach waited for ever).
      const next = yield* Effect.fork(hb.beat)
      yield* TestClock.adjust("100 millis")
      yield* Fiber.join(next)
      yield* Effect.repeatN(Effect.yieldNow(), 10)
      expect(yield* Ref.get(runs)).toBe(1)
      const detached = yield* Effect.fork(detach)
      yield* Effect.repeatN(Effect.yieldNow(), 10)
      expect(Option.isSome(yield* Fiber.poll(detached))).toBe(true)
    }))
  it.scoped("a task with a subject is skipped, `due` not even called, while its subject is undefined", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let dueCalls = 0
      const runs = yield* Ref.make(0)
      const task: { subject: string | undefined; due: () => boolean; run: () => Effect.Effect<void> } = {
        subject: undefined,
        due: () => {
          dueCalls++
          return true
        },
        run: () => Ref.update(runs, (n) => n + 1)
      }
      const detach = yield* hb.forkOnBeat(task)
      yield* hb.beat
      yield* Effect.repeatN(Effect.yieldNow(), 10)
      expect([dueCalls, yield* Ref.get(runs)]).toEqual([0, 0])
      task.subject = "m-1"
      yield* hb.beat
      yield* Effect.repeatN(Effect.yieldNow(), 10)
      expect([dueCalls, yield* Ref.get(runs)]).toEqual([1, 1])
      task.subject = undefined
      yield* hb.beat
      yield* Effect.repeatN(Effect.yieldNow(), 10)
      expect([dueCalls, yield* Ref.get(runs)]).toEqual([1, 1])
      yield* detach
    }))
})

describe("Heartbeat.beat, through the environment", () => {
  it.scoped("a helper three calls deep keeps its message leased for 20 minutes (visibility 60 s), passing nothing", () =>
    Effect.gen(function*() {
      const { requests, run } = yield* leasedLoop("downloads", () => downloadFile(40))
      for (let t = 0; t < 41; t++) {
        yield* settle
        expect(yield* requests.receive()).toEqual([]) // another receiver never sees it
        yield* TestClock.adjust("30 seconds")
      }
      yield* Fiber.join(run)
      expect(yield* requests.approximateCount).toBe(0)
    }))

  it.effect("outside any run, the same helper works and its beats do nothing", () =>
    Effect.gen(function*() {
      expect(Option.isNone(yield* Heartbeat.current)).toBe(true)
      const fiber = yield* Effect.fork(downloadFile(3))
      yield* TestClock.adjust("90 seconds")
      expect(Exit.isSuccess(yield* Fiber.await(fiber))).toBe(true)
    }))

  it.scoped("two loops in one process: a fiber forked inside execute beats its own message, never the other's", () =>
    Effect.gen(function*() {
      // A's work forks a fiber that beats every 30 s for 20 minutes; B's work is stuck and never beats.
      const a = yield* leasedLoop("a", () => Effect.flatMap(Effect.fork(downloadFile(40)), Fiber.join))
      const b = yield* leasedLoop("b", () => Effect.never)
      for (let t = 0; t < 41; t++) {
        yield* settle
        expect(yield* a.requests.receive()).toEqual([])
        yield* TestClock.adjust("30 seconds")
      }
      yield* Fiber.join(a.run)
      expect(yield* a.requests.approximateCount).toBe(0)
      // B's lease ran out long ago: A's beats did not keep it.
      const [again] = yield* b.requests.receive()
      expect(again!.deliveryCount).toBe(2)
    }))

  it.scoped("execute's context.heartbeat is the current heartbeat: one heartbeat, two ways to reach it", () =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<boolean>>({
        name: "requests"
      })
      const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<boolean>>({ name: "responses" })
      const loop = yield* MainLoop.make({
        requests,
        execute: (_request: string, context) =>
          Effect.map(Heartbeat.current, (current) => Option.getOrUndefined(current) === context.heartbeat)
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(responses)))
      yield* requests.send(MainLoop.request("go"), { replyTo: "responses" })
      yield* loop.run({ maxIterations: 1, waitTime: 0 })
      const [reply] = yield* responses.receive()
      expect(reply!.body).toMatchObject({ success: true, output: true })
    }))

  it.scoped("Heartbeat.within sets the current heartbeat for the effect and every fiber it forks", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      yield* TestClock.adjust("10 seconds")
      yield* Effect.flatMap(Effect.fork(Heartbeat.beat), Fiber.join).pipe(Heartbeat.within(hb))
      expect(Duration.toMillis(yield* hb.elapsed)).toBe(0)
      expect(Option.isNone(yield* Heartbeat.current)).toBe(true)
    }))
})

describe("Heartbeat.beatEvery", () => {
  it.scoped("beats on a stream's progress, at most once per interval, and stops when the stream stalls", () =>
    Effect.gen(function*() {
      // A chunk every 30 s for 3 minutes, then nothing: the lease holds while chunks come, then runs out.
      const chunks = Stream.concat(
        Stream.fromSchedule(Schedule.spaced("30 seconds")).pipe(Stream.take(6)),
        Stream.never
      )
      const { requests } = yield* leasedLoop(
        "uploads",
        () => Stream.runDrain(Heartbeat.beatEvery(chunks, "20 seconds"))
      )
      for (let t = 0; t < 6; t++) {
        yield* settle
        expect(yield* requests.receive()).toEqual([])
        yield* TestClock.adjust("30 seconds")
      }
      // The last chunk came at 3 min and its beat extended the lease to 4 min; nothing has beaten since.
      yield* settle
      yield* TestClock.adjust("59 seconds")
      expect(yield* requests.receive()).toEqual([])
      yield* TestClock.adjust("2 seconds")
      const [again] = yield* requests.receive()
      expect(again!.deliveryCount).toBe(2)
    }))

  it.effect("beats once per interval however fast elements come", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let beats = 0
      yield* hb.onBeat(Effect.sync(() => beats++))
      yield* Stream.range(1, 100).pipe(
        Stream.tap(() => TestClock.adjust("1 second")),
        Heartbeat.beatEvery("10 seconds"),
        Stream.runDrain,
        Heartbeat.within(hb)
      )
      expect(beats).toBe(10)
    }).pipe(Effect.scoped))
})
