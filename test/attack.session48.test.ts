/**
 * Attacks on session 48's changes, from the public API: `Heartbeat.BeatTask.subject` with hostile tasks, the
 * LeaseExtender binding of a worker (beats after settling, redeliveries, shared extenders, disabled), a stop that
 * gives up on a settle that never returns, a hand-provided `Health`, PostgreSQL's `FOR UPDATE SKIP LOCKED`
 * extension batch under an operator's row locks, and per-message log annotations on forks and nested loops.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Either, Exit, Fiber, Layer, Logger, Option, Schema, Scope } from "effect"
import * as Health from "../src/Health.js"
import * as Heartbeat from "../src/Heartbeat.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import * as LoopGroup from "../src/LoopGroup.js"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Runnable from "../src/Runnable.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("attack48")
let tables = 0
const nextPrefix = () => `a48_${++tables}_`
/** Lets forked runs start and land. */
const settle = Effect.sleep("20 millis")

// ---------------------------------------------------------------------------
// 1. Heartbeat.forkOnBeat with hostile tasks
// ---------------------------------------------------------------------------

describe("session 48: forkOnBeat with hostile tasks", () => {
  it.live("a subject getter that throws: the beat survives, other listeners still run, later beats still work", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let throwing = true
      let runs = 0
      const task: Heartbeat.BeatTask = {
        get subject() {
          // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
          if (throwing) throw new Error("hostile subject")
          return "x"
        },
        due: () => true,
        run: () => Effect.sync(() => void runs++)
      }
      let other = 0
      yield* hb.forkOnBeat(task)
      yield* hb.addListener(() => void other++)
      yield* hb.beat
      yield* settle
      expect([runs, other]).toEqual([0, 1])
      throwing = false
      yield* hb.beat
      yield* settle
      expect([runs, other]).toEqual([1, 2])
    }))

  it.live("a due that throws: logged, the beat survives, the task is not stuck", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let throwing = true
      let runs = 0
      const detach = yield* hb.forkOnBeat({
        subject: "x",
        due: () => {
          // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
          if (throwing) throw new Error("hostile due")
          return true
        },
        run: () => Effect.sync(() => void runs++)
      })
      yield* hb.beat
      throwing = false
      yield* hb.beat
      yield* settle
      expect(runs).toBe(1)
      yield* detach.pipe(Effect.timeout("2 seconds"))
    }))

  it.live("a subject that turns undefined between due and run: the run still runs once (the heartbeat gates due only)", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      const seen: Array<unknown> = []
      const task: { subject: string | undefined } & Heartbeat.BeatTask = {
        subject: "a",
        due: () => {
          task.subject = undefined
          return true
        },
        run: () => Effect.sync(() => void seen.push(task.subject))
      }
      yield* hb.forkOnBeat(task)
      yield* hb.beat
      yield* settle
      yield* hb.beat // subject undefined: skipped
      yield* settle
      expect(seen).toEqual([undefined])
    }))

  it.live("a task registered twice: two registrations, each with one flight; detaching one leaves the other", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let runs = 0
      const task: Heartbeat.BeatTask = { subject: 1, due: () => true, run: () => Effect.sync(() => void runs++) }
      const first = yield* hb.forkOnBeat(task)
      yield* hb.forkOnBeat(task)
      yield* hb.beat
      yield* settle
      expect(runs).toBe(2)
      yield* first
      yield* hb.beat
      yield* settle
      expect(runs).toBe(3)
    }))

  it.live("detached while its run is in flight: detach waits for the run, no run after it", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      const gate = yield* Deferred.make<void>()
      let started = 0
      let finished = 0
      const detach = yield* hb.forkOnBeat({
        subject: "x",
        due: () => true,
        run: () =>
          Effect.sync(() => void started++).pipe(
            Effect.zipRight(Deferred.await(gate)),
            Effect.zipRight(Effect.sync(() => void finished++))
          )
      })
      yield* hb.beat
      yield* settle
      yield* hb.beat // dropped: one in flight
      const detaching = yield* Effect.fork(detach)
      yield* settle
      expect(detaching.unsafePoll()).toBe(null)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(detaching).pipe(Effect.timeout("2 seconds"))
      expect([started, finished]).toEqual([1, 1])
      yield* hb.beat
      yield* settle
      expect(started).toBe(1)
    }))

  // Found broken, now fixed: `BeatFork.call` claimed the flight and then called `task.run(now)`; a `run` that threw
  // as it was called left the flight claimed with no fiber for ever (later beats dropped, detach spinning). The run
  // is now suspended (internal/heartbeat.ts).
  it.live("a run that throws as it is called: later beats still run the task, and detach returns", () =>
    Effect.gen(function*() {
      const hb = yield* Heartbeat.make
      let calls = 0
      const detach = yield* hb.forkOnBeat({
        subject: "x",
        due: () => true,
        run: () => {
          // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
          if (++calls === 1) throw new Error("hostile run")
          return Effect.void
        }
      })
      yield* hb.beat
      yield* settle
      yield* hb.beat
      yield* settle
      expect(calls).toBe(2)
      const detached = yield* Effect.either(Effect.timeout(detach, "1 second"))
      expect(Either.isRight(detached)).toBe(true)
    }))

  // The same hole through LeaseExtender's public `attachUnscoped`: an `Extendable` whose extendVisibility throws.
  // Found broken, now fixed: an `extendVisibility` that threw as it was called escaped `task.run(now)` after the
  // flight was claimed, so the detach never returned. It is now suspended (an extension failure, logged, counted).
  it.live("LeaseExtender.attachUnscoped: an Extendable whose extendVisibility throws; detach still returns", () =>
    Effect.gen(function*() {
      const extender = yield* LeaseExtender.make({ interval: 0, extension: "1 minute" })
      const hb = yield* Heartbeat.make
      const detach = yield* extender.attachUnscoped({
        id: "m-1",
        extendVisibility: () => {
          // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
          throw new Error("hostile extendVisibility")
        }
      }, hb)
      yield* hb.beat
      yield* settle
      const detached = yield* Effect.either(Effect.timeout(detach, "1 second"))
      expect(Either.isRight(detached)).toBe(true)
    }))
})

// ---------------------------------------------------------------------------
// 2. LeaseExtender's binding in a worker
// ---------------------------------------------------------------------------

/** What a tracked message saw: its extension calls and its settle's start, numbered in the order they came. */
interface Track {
  readonly id: string
  extensions: Array<number>
  settledAt: number | undefined
}

/**
 * A mailbox over a memory one whose messages record their extension calls and when they were settled. With
 * `sameObject`, a redelivery hands out the very object of the first delivery (its fields read the latest).
 */
const tracking = <A>(
  inner: Mailbox.Mailbox<A, never>,
  options: {
    readonly sameObject?: boolean
    readonly extend?: (
      m: Mailbox.Message<A, never>,
      d: Duration.Duration
    ) => Effect.Effect<
      void,
      Mailbox.ReceiptHandleExpiredError | Mailbox.MailboxConnectionError | Mailbox.InvalidParameterError
    >
  } = {}
) => {
  // A sequence, not a clock: two events in one millisecond are still ordered.
  let seq = 0
  const tracks: Array<Track> = []
  /** Per id: the object handed out, and the delivery its fields read. */
  const cache = new Map<
    string,
    { readonly made: Mailbox.Message<A, never>; readonly holder: { current: Mailbox.Message<A, never> } }
  >()
  const mailbox: Mailbox.Mailbox<A, never> = {
    name: inner.name,
    send: (body, o) => inner.send(body, o),
    receive: (o) =>
      Effect.map(inner.receive(o), (messages) =>
        messages.map((m): Mailbox.Message<A, never> => {
          const track: Track = { id: m.id, extensions: [], settledAt: undefined }
          tracks.push(track)
          const settled = <X, E, Rq>(effect: Effect.Effect<X, E, Rq>) =>
            Effect.suspend(() => {
              track.settledAt = ++seq
              return effect
            })
          const fields = {
            acknowledge: settled(m.acknowledge),
            nack: (d?: Duration.DurationInput) => settled(m.nack(d)),
            extendVisibility: (d: Duration.DurationInput) =>
              Effect.suspend(() => {
                track.extensions.push(++seq)
                return options.extend === undefined ? m.extendVisibility(d) : options.extend(m, Duration.decode(d))
              }),
            reply: (body: never) => m.reply(body),
            replyAndAcknowledge: (body: never) => settled(m.replyAndAcknowledge(body))
          }
          const cached = cache.get(m.id)
          if (options.sameObject === true && cached !== undefined) {
            cached.holder.current = m
            Object.assign(cached.made, fields)
            return cached.made
          }
          const holder = { current: m }
          const made: Mailbox.Message<A, never> = {
            get id() {
              return holder.current.id
            },
            get body() {
              return holder.current.body
            },
            get receiptHandle() {
              return holder.current.receiptHandle
            },
            get deliveryCount() {
              return holder.current.deliveryCount
            },
            get enqueuedAt() {
              return holder.current.enqueuedAt
            },
            get replyTo() {
              return holder.current.replyTo
            },
            get traceparent() {
              return holder.current.traceparent
            },
            ...fields
          }
          cache.set(m.id, { made, holder })
          return made
        })),
    purge: inner.purge,
    approximateCount: inner.approximateCount,
    close: inner.close,
    isClosed: inner.isClosed
  }
  return { mailbox, tracks }
}

const worker = <A>(
  mailbox: Mailbox.Mailbox<A, never>,
  handle: (m: Mailbox.Message<A, never>) => Effect.Effect<void, string>,
  leaseExtender: LeaseExtender.Options = { interval: 0, extension: "10 seconds" },
  name = "w"
) =>
  MailboxWorker.make({
    name,
    mailbox,
    handle,
    onSuccess: () => Effect.succeedNone,
    onFailure: (message) => Effect.orDie(message.nack(0)),
    leaseExtender
  })

const lateExtensions = (tracks: ReadonlyArray<Track>) =>
  tracks.flatMap((t) =>
    t.extensions.filter((at) => t.settledAt !== undefined && at > t.settledAt).map((at) =>
      `${t.id}: extension #${at} after settle #${t.settledAt}`
    )
  )

describe("session 48: LeaseExtender's binding in a worker", () => {
  it.scopedLive(
    "a handler that beats 500 times, then leaves a fiber beating after its message settled: no settled message is extended",
    () =>
      Effect.gen(function*() {
        const inner = yield* MailboxMemory.make<number>({ name: "jobs" })
        const { mailbox, tracks } = tracking(inner)
        for (let n = 0; n < 6; n++) yield* inner.send(n)
        const outlive = yield* Scope.make()
        const loop = yield* worker(mailbox, () =>
          Effect.gen(function*() {
            for (let i = 0; i < 500; i++) yield* Heartbeat.beat
            // Outlives the message: keeps beating the loop's heartbeat.
            yield* Effect.forkIn(
              Effect.repeatN(Effect.zipRight(Heartbeat.beat, Effect.sleep("2 millis")), 150),
              outlive
            )
            yield* Effect.sleep("30 millis")
          }))
        yield* loop.run({ maxIterations: 8, waitTime: "20 millis" })
        yield* Effect.sleep("200 millis")
        yield* Scope.close(outlive, Exit.void)
        expect(tracks.length).toBe(6)
        expect(tracks.every((t) => t.extensions.length >= 1)).toBe(true)
        expect(lateExtensions(tracks)).toEqual([])
        expect(yield* inner.approximateCount).toBe(0)
      }),
    30_000
  )

  /**
   * One message whose first delivery's extension is refused as expired (final for that delivery) and whose
   * handler then fails: the redelivery must be extended again. `sameObject`: handed out as the very same object.
   */
  const redelivered = (sameObject: boolean) =>
    Effect.gen(function*() {
      const inner = yield* MailboxMemory.make<number>({ name: "jobs" })
      const { mailbox, tracks } = tracking(inner, {
        sameObject,
        extend: (m, d) =>
          m.deliveryCount === 1
            ? Effect.fail(
              new Mailbox.ReceiptHandleExpiredError({ mailbox: "jobs", messageId: m.id, receiptHandle: "h" })
            )
            : m.extendVisibility(d)
      })
      yield* inner.send(1)
      const loop = yield* worker(mailbox, (m) =>
        Effect.gen(function*() {
          for (let i = 0; i < 5; i++) {
            yield* Heartbeat.beat
            yield* Effect.sleep("5 millis")
          }
          if (m.deliveryCount === 1) return yield* Effect.fail("first delivery fails")
        }))
      yield* loop.run({ maxIterations: 4, waitTime: "20 millis" })
      expect(tracks.map((t) => t.extensions.length > 0)).toEqual([true, true])
      expect(tracks[0]!.extensions.length).toBe(1)
      expect(lateExtensions(tracks)).toEqual([])
    })

  it.scopedLive(
    "a redelivery after a nack (a new object per delivery): extended again on the second delivery",
    () => redelivered(false)
  )

  // Found broken, now fixed: the binding keyed a message's extension state by object identity alone, so a custom
  // mailbox handing out the same object on a redelivery inherited the first delivery's `lost = true`. It is now
  // keyed by the object and its receipt handle (new on every delivery, per the contract).
  it.scopedLive(
    "a redelivery that is the same object as the first delivery: extended again on the second delivery",
    () => redelivered(true)
  )

  it.scopedLive("two loops: one's beats (from a fiber outliving its message) never extend the other's message", () =>
    Effect.gen(function*() {
      const innerA = yield* MailboxMemory.make<number>({ name: "a" })
      const innerB = yield* MailboxMemory.make<number>({ name: "b" })
      const a = tracking(innerA)
      const b = tracking(innerB)
      for (let n = 0; n < 3; n++) {
        yield* innerA.send(n)
        yield* innerB.send(n)
      }
      const outlive = yield* Scope.make()
      const loopA = yield* worker(
        a.mailbox,
        () =>
          Effect.zipRight(
            Effect.forkIn(Effect.repeatN(Effect.zipRight(Heartbeat.beat, Effect.sleep("1 millis")), 400), outlive),
            Effect.sleep("10 millis")
          ),
        undefined,
        "a"
      )
      // B's handler never beats: none of its messages may be extended.
      const loopB = yield* worker(b.mailbox, () => Effect.sleep("60 millis"), undefined, "b")
      yield* Effect.all([
        loopA.run({ maxIterations: 5, waitTime: "20 millis" }),
        loopB.run({ maxIterations: 5, waitTime: "20 millis" })
      ], { concurrency: "unbounded" })
      yield* Scope.close(outlive, Exit.void)
      expect(b.tracks.map((t) => t.extensions.length)).toEqual([0, 0, 0])
      expect(lateExtensions(a.tracks)).toEqual([])
    }))

  it.scopedLive("LeaseExtender enabled: false: a handler beating hard is never extended", () =>
    Effect.gen(function*() {
      const inner = yield* MailboxMemory.make<number>({ name: "jobs" })
      const { mailbox, tracks } = tracking(inner)
      for (let n = 0; n < 3; n++) yield* inner.send(n)
      const loop = yield* worker(mailbox, () =>
        Effect.repeatN(Effect.zipRight(Heartbeat.beat, Effect.sleep("1 millis")), 30), {
        enabled: false
      })
      yield* loop.run({ maxIterations: 4, waitTime: "20 millis" })
      expect(tracks.map((t) =>
        t.extensions.length
      )).toEqual([0, 0, 0])
      // And the extender made by hand, disabled: attachUnscoped does nothing.
      const extender = yield* LeaseExtender.make({ enabled: false })
      const hb = yield* Heartbeat.make
      let calls = 0
      const detach = yield* extender.attachUnscoped({
        id: "x",
        extendVisibility: () => Effect.sync(() => void calls++)
      }, hb)
      yield* hb.beat
      yield* settle
      yield* detach
      expect(calls).toBe(0)
    }))

  it.live("one LeaseExtender used from two heartbeats: the second attach is refused; after a detach, neither heartbeat extends a message it does not hold", () =>
    Effect.gen(function*() {
      const extender = yield* LeaseExtender.make({ interval: 0, extension: "1 minute" })
      const hb1 = yield* Heartbeat.make
      const hb2 = yield* Heartbeat.make
      const calls: Array<string> = []
      const message = (id: string): LeaseExtender.Extendable => ({
        id,
        extendVisibility: () => Effect.sync(() => void calls.push(id))
      })
      const detach1 = yield* extender.attachUnscoped(message("m1"), hb1)
      const refused = yield* Effect.either(extender.attachUnscoped(message("m2"), hb2))
      expect(Either.isLeft(refused) && refused.left._tag).toBe("AlreadyAttachedError")
      yield* hb2.beat
      yield* settle
      expect(calls).toEqual([])
      yield* hb1.beat
      yield* settle
      expect(calls).toEqual(["m1"])
      yield* detach1
      const detach2 = yield* extender.attachUnscoped(message("m2"), hb2)
      yield* hb1.beat // m1 detached; hb1 is not m2's
      yield* settle
      expect(calls).toEqual(["m1"])
      yield* hb2.beat
      yield* settle
      expect(calls).toEqual(["m1", "m2"])
      yield* detach2
      yield* detach2 // twice: harmless
      yield* hb2.beat
      yield* settle
      expect(calls).toEqual(["m1", "m2"])
    }))

  it.scopedLive("a custom message whose extendVisibility throws as it is called: the worker carries on and settles it", () =>
    Effect.gen(function*() {
      const inner = yield* MailboxMemory.make<number>({ name: "jobs" })
      const { mailbox, tracks } = tracking(inner, {
        extend: () => {
          // eslint-disable-next-line no-restricted-syntax -- the case under test: user code that throws
          throw new Error("hostile extendVisibility")
        }
      })
      for (let n = 0; n < 3; n++) yield* inner.send(n)
      const loop = yield* worker(mailbox, () =>
        Effect.gen(function*() {
          for (let i = 0; i < 3; i++) {
            yield* Heartbeat.beat
            yield* Effect.sleep("5 millis")
          }
        }))
      yield* loop.run({ maxIterations: 4, waitTime: "20 millis" }).pipe(Effect.timeout("5 seconds"))
      expect(tracks.every((t) => t.settledAt !== undefined)).toBe(true)
      expect(yield* inner.approximateCount).toBe(0)
    }))
})

// ---------------------------------------------------------------------------
// 3. A stop that gives up on settles
// ---------------------------------------------------------------------------

type Req = MainLoop.MainLoopRequest<number>
type Res = MainLoop.MainLoopResult<number>

/**
 * A custom mailbox over a memory one: plain-object messages (with a `replyTo`, so a MainLoop settles with
 * `replyAndAcknowledge`) whose settles are `settle(inner)`; every settle call is counted by message id.
 */
const customSettling = (
  inner: Mailbox.Mailbox<Req, Res>,
  settle: (message: Mailbox.Message<Req, Res>, reply: Option.Option<Res>) => Effect.Effect<void, Mailbox.SettleError>
) => {
  const calls = new Map<string, number>()
  const counted = (m: Mailbox.Message<Req, Res>, reply: Option.Option<Res>) =>
    Effect.suspend(() => {
      calls.set(m.id, (calls.get(m.id) ?? 0) + 1)
      return settle(m, reply)
    })
  const mailbox: Mailbox.Mailbox<Req, Res> = {
    name: inner.name,
    send: (body, options) => inner.send(body, options),
    receive: (options) =>
      Effect.map(inner.receive(options), (messages) =>
        messages.map((m): Mailbox.Message<Req, Res> => ({
          id: m.id,
          body: m.body,
          receiptHandle: m.receiptHandle,
          deliveryCount: m.deliveryCount,
          enqueuedAt: m.enqueuedAt,
          replyTo: Option.some("replies"),
          traceparent: m.traceparent,
          acknowledge: counted(m, Option.none()),
          nack: (timeout) => m.nack(timeout),
          extendVisibility: (timeout) => m.extendVisibility(timeout),
          reply: () => Effect.succeed("reply-id"),
          replyAndAcknowledge: (body) => Effect.as(counted(m, Option.some(body)), "reply-id")
        }))),
    purge: inner.purge,
    approximateCount: inner.approximateCount,
    close: inner.close,
    isClosed: inner.isClosed
  }
  return { mailbox, calls }
}

const elapsedSince = (started: number) => Date.now() - started

describe("session 48: a stop that gives up on a settle", () => {
  it.scopedLive(
    "replyAndAcknowledge never returns (interruptible): MainLoop.layer closes within shutdownTimeout + grace, the settle fiber is interrupted by then, the message comes back once",
    () =>
      Effect.gen(function*() {
        const inner = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
        let interrupted = 0
        const { calls, mailbox } = customSettling(inner, () =>
          Effect.onInterrupt(Effect.never, () => Effect.sync(() => void interrupted++)))
        yield* inner.send(MainLoop.request(1))
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          MainLoop.layer({
            requests: mailbox,
            execute: (n: number) =>
              Effect.succeed(n),
            shutdownTimeout: "500 millis",
            run: { visibilityTimeout: "9 seconds", waitTime: "50 millis" }
          }),
          scope
        ).pipe(Effect.provide(Mailbox.MailboxResolver.layer()))
        yield* Effect.sleep("300 millis")
        const started = Date.now()
        yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("10 seconds"))
        const took = elapsedSince(started)
        const interruptedAtClose = interrupted
        yield* Effect.sleep("50 millis")
        // 0.5 s + 5 s grace + slack; never the 9 s lease.
        expect(took).toBeLessThan(8_000)
        expect(took).toBeGreaterThan(4_500)
        expect([...calls.values()]).toEqual([1])
        expect([interruptedAtClose, interrupted]).toEqual([1, 1])
        const again = yield* inner.receive({ waitTime: "6 seconds" })
        expect(again.map((m) => [m.body.request, m.deliveryCount])).toEqual([[1, 2]])
      }),
    30_000
  )

  // LIMITATION (documented in settler.ts `abandon`: "Not waited for"): an uninterruptible settle (a store call that
  // must not be cut) that returns just after the grace lands after the layer closed, on a fiber nobody awaits any
  // more. The stop is bounded and nothing is acknowledged twice, but "no fiber left running after the layer closes"
  // does not hold for it: this test pins the behaviour as it is.
  it.scopedLive(
    "an uninterruptible acknowledgement returning just after the grace: the layer closes bounded, and the abandoned settle still lands after it closed (a fiber outlives the layer)",
    () =>
      Effect.gen(function*() {
        const inner = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
        let landedAt: number | undefined
        const { calls, mailbox } = customSettling(inner, (m) =>
          Effect.uninterruptible(Effect.zipRight(
            Effect.sleep("6 seconds"),
            Effect.zipRight(m.acknowledge, Effect.sync(() => void (landedAt = Date.now())))
          )))
        yield* inner.send(MainLoop.request(1))
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          MainLoop.layer({
            requests: mailbox,
            execute: (n: number) => Effect.succeed(n),
            shutdownTimeout: "500 millis",
            run: { visibilityTimeout: "20 seconds", waitTime: "50 millis" }
          }),
          scope
        ).pipe(Effect.provide(Mailbox.MailboxResolver.layer()))
        yield* Effect.sleep("100 millis")
        const started = Date.now()
        yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("10 seconds"))
        const closedAt = Date.now()
        expect(closedAt - started).toBeLessThan(8_000)
        yield* Effect.sleep("2 seconds")
        // What happens: the abandoned settle (not waited for, as settler.ts says) lands after the layer closed.
        expect(landedAt).toBeDefined()
        expect(landedAt! > closedAt).toBe(true)
        expect([...calls.values()]).toEqual([1])
        expect(yield* inner.approximateCount).toBe(0)
      }),
    30_000
  )

  it.scopedLive(
    "replyAndAcknowledge fails typed (store unreachable): the layer closes promptly, settled once, the message comes back when its lease ends",
    () =>
      Effect.gen(function*() {
        const inner = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
        const { calls, mailbox } = customSettling(inner, () =>
          Effect.delay(
            Effect.fail(new Mailbox.MailboxConnectionError({ mailbox: "requests", cause: new Error("down") })),
            "20 millis"
          ))
        yield* inner.send(MainLoop.request(1))
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          MainLoop.layer({
            requests: mailbox,
            execute: (n: number) => Effect.succeed(n),
            shutdownTimeout: "1 second",
            run: { visibilityTimeout: "2 seconds", waitTime: "50 millis" }
          }),
          scope
        ).pipe(Effect.provide(Mailbox.MailboxResolver.layer()))
        yield* Effect.sleep("500 millis")
        const started = Date.now()
        yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("10 seconds"))
        expect(elapsedSince(started)).toBeLessThan(1_500)
        expect([...calls.values()]).toEqual([1])
        const again = yield* inner.receive({ waitTime: "3 seconds" })
        expect(again.map((m) => [m.body.request, m.deliveryCount])).toEqual([[1, 2]])
      }),
    30_000
  )

  it.scopedLive(
    "a LoopGroup of two loops, one whose acknowledgements never return: group.shutdown is bounded, the healthy loop's messages all acknowledged once",
    () =>
      Effect.gen(function*() {
        const stuckInner = yield* MailboxMemory.make<Req, Res>({ name: "stuck" })
        const okInner = yield* MailboxMemory.make<Req, Res>({ name: "ok" })
        const stuck = customSettling(stuckInner, () => Effect.never)
        const ok = customSettling(okInner, (m) => m.acknowledge)
        yield* stuckInner.send(MainLoop.request(1))
        for (let n = 0; n < 20; n++) yield* okInner.send(MainLoop.request(n))
        const a = yield* MainLoop.make({
          requests: stuck.mailbox,
          execute: (n: number) => Effect.succeed(n),
          name: "stuck"
        })
        const b = yield* MainLoop.make({ requests: ok.mailbox, execute: (n: number) => Effect.succeed(n), name: "ok" })
        const group = LoopGroup.make([a, b], {
          shutdownTimeout: "500 millis"
        })
        const running = yield* Effect.fork(group.run({ visibilityTimeout: "9 seconds", waitTime: "50 millis" }))
        yield* Effect.sleep("500 millis")
        const started = Date.now()
        const clean = yield* group.shutdown().pipe(Effect.timeout("10 seconds"))
        const joined = yield* Fiber.await(running).pipe(Effect.timeout("10 seconds"))
        const took = elapsedSince(started)
        expect(took).toBeLessThan(8_000)
        expect(clean).toBe(false)
        expect(Exit.isExit(joined)).toBe(true)
        expect(ok.calls.size).toBe(20)
        expect([...ok.calls.values()].every((n) => n === 1)).toBe(true)
        expect(yield* okInner.approximateCount).toBe(0)
        const again = yield* stuckInner.receive({ waitTime: "6 seconds" })
        expect(again.map((m) => m.deliveryCount)).toEqual([2])
      }).pipe(Effect.provide(Mailbox.MailboxResolver.layer())),
    30_000
  )
})

// ---------------------------------------------------------------------------
// 4. A Health provided by hand
// ---------------------------------------------------------------------------

const recordingHealth = (overrides: Partial<Health.Health["Type"]> = {}) => {
  const registered: Array<string> = []
  const released: Array<string> = []
  let shuttingDown = 0
  const health: Health.Health["Type"] = {
    register: (loop) =>
      Effect.acquireRelease(
        Effect.sync(() => void registered.push(loop.name)),
        () => Effect.sync(() => void released.push(loop.name))
      ),
    setShuttingDown: Effect.sync(() => void shuttingDown++),
    readiness: Effect.succeed({ ready: true, reasons: [] }),
    url: undefined,
    ...overrides
  }
  return { health, registered, released, shuttingDown: () => shuttingDown }
}

describe("session 48: a Health provided by hand", () => {
  it.scopedLive("a Health and a different Readiness: the loop registers with each once, both hear shutting down", () =>
    Effect.gen(function*() {
      const h = recordingHealth()
      const r = recordingHealth()
      const requests = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        MainLoop.layer({
          requests,
          execute: (n: number) => Effect.succeed(n),
          name: "both",
          shutdownTimeout: "1 second"
        })
          .pipe(
            Layer.provide(Layer.succeed(Health.Health, h.health)),
            Layer.provide(
              Layer.succeed(Runnable.Readiness, {
                register: r.health.register,
                setShuttingDown: r.health.setShuttingDown
              })
            ),
            Layer.provide(Mailbox.MailboxResolver.layer())
          ),
        scope
      )
      expect([h.registered, r.registered]).toEqual([["both"], ["both"]])
      yield* Scope.close(scope, Exit.void)
      expect([h.released, r.released, h.shuttingDown(), r.shuttingDown()]).toEqual([["both"], ["both"], 1, 1])
      // A LoopGroup under both.
      const g1 = recordingHealth()
      const g2 = recordingHealth()
      const loop = yield* MainLoop.make({ requests, execute: (n: number) => Effect.succeed(n), name: "grouped" })
      const group = LoopGroup.make([loop], { shutdownTimeout: "1 second" })
      const running = yield* Effect.fork(
        group.run({ waitTime: "50 millis" }).pipe(
          Effect.provideService(Health.Health, g1.health),
          Effect.provideService(Runnable.Readiness, {
            register: g2.health.register,
            setShuttingDown: g2.health.setShuttingDown
          })
        )
      )
      yield* Effect.sleep("200 millis")
      yield* Fiber.interrupt(running).pipe(Effect.timeout("5 seconds"))
      expect([g1.registered, g2.registered, g1.released, g2.released]).toEqual([["grouped"], ["grouped"], ["grouped"], [
        "grouped"
      ]])
      expect([g1.shuttingDown(), g2.shuttingDown()]).toEqual([1, 1])
    }).pipe(Effect.provide(Mailbox.MailboxResolver.layer())))

  it.scopedLive(
    "a Health whose register dies: the layer fails to build, no loop keeps consuming, the messages are not held",
    () =>
      Effect.gen(function*() {
        // Dies after the loop has taken a message (register is called after the loop's fork).
        const h = recordingHealth({
          register: () => Effect.zipRight(Effect.sleep("300 millis"), Effect.dieMessage("register refused"))
        })
        const requests = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
        yield* requests.send(MainLoop.request(-1))
        const scope = yield* Scope.make()
        const built = yield* Layer.buildWithScope(
          MainLoop.layer({
            requests,
            execute: (n: number) => Effect.as(Effect.sleep(n < 0 ? "2 seconds" : "10 millis"), n),
            name: "dies",
            shutdownTimeout: "1 second",
            run: { visibilityTimeout: "30 seconds", waitTime: "50 millis" }
          }).pipe(
            Layer.provide(Layer.succeed(Health.Health, h.health)),
            Layer.provide(Mailbox.MailboxResolver.layer())
          ),
          scope
        ).pipe(Effect.exit)
        expect(Exit.isFailure(built)).toBe(true)
        yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("5 seconds"))
        // The message the loop had in hand is given back at once, not held for its 30 s lease.
        const back = yield* requests.receive({ waitTime: "1 second" })
        expect(back.map((m) => [m.body.request, m.deliveryCount])).toEqual([[-1, 2]])
        yield* back[0]!.acknowledge
        // Nothing consumes any more: what is sent now stays, visible.
        for (let n = 0; n < 5; n++) yield* requests.send(MainLoop.request(n))
        yield* Effect.sleep("300 millis")
        expect(yield* requests.approximateCount).toBe(5)
        const visible = yield* requests.receive({ maxMessages: 10, waitTime: "100 millis" })
        expect(visible.length).toBe(5)
      })
  )

  it.scopedLive(
    "a Health as a plain object without setShuttingDown: closing the layer still stops the loop (the defect is reported)",
    () =>
      Effect.gen(function*() {
        const h = recordingHealth()
        const partial = {
          register: h.health.register,
          readiness: h.health.readiness
        } as unknown as Health.Health["Type"]
        const requests = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          MainLoop.layer({
            requests,
            execute: (n: number) => Effect.succeed(n),
            name: "partial",
            shutdownTimeout: "1 second",
            run: { waitTime: "50 millis" }
          }).pipe(Layer.provide(Layer.succeed(Health.Health, partial)), Layer.provide(Mailbox.MailboxResolver.layer())),
          scope
        )
        expect(h.registered).toEqual(["partial"])
        const closed = yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("5 seconds"), Effect.exit)
        yield* Effect.logInfo(`close of a layer under a Health without setShuttingDown: ${closed._tag}`)
        expect(h.released).toEqual(["partial"])
        for (let n = 0; n < 3; n++) yield* requests.send(MainLoop.request(n))
        yield* Effect.sleep("300 millis")
        expect(yield* requests.approximateCount).toBe(3)
      })
  )

  it.scopedLive("a Health as a plain object without register: the layer fails to build, nothing left consuming", () =>
    Effect.gen(function*() {
      const partial = { setShuttingDown: Effect.void } as unknown as Health.Health["Type"]
      const requests = yield* MailboxMemory.make<Req, Res>({ name: "requests" })
      const scope = yield* Scope.make()
      const built = yield* Layer.buildWithScope(
        MainLoop.layer({
          requests,
          execute: (n: number) => Effect.succeed(n),
          name: "noregister",
          shutdownTimeout: "1 second",
          run: { waitTime: "50 millis" }
        }).pipe(Layer.provide(Layer.succeed(Health.Health, partial)), Layer.provide(Mailbox.MailboxResolver.layer())),
        scope
      ).pipe(Effect.exit)
      yield* Effect.logInfo(`build under a Health without register: ${built._tag}`)
      yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("5 seconds"))
      for (let n = 0; n < 3; n++) yield* requests.send(MainLoop.request(n))
      yield* Effect.sleep("300 millis")
      expect(yield* requests.approximateCount).toBe(3)
    }))
})

// ---------------------------------------------------------------------------
// 5. PostgreSQL: the extension batch under an operator's row locks (FOR UPDATE SKIP LOCKED)
// ---------------------------------------------------------------------------

const tag = (either: Either.Either<unknown, { readonly _tag: string }>) =>
  Either.isRight(either) ? "ok" : either.left._tag

describe("session 48: PostgreSQL extensions past locked rows", () => {
  it.live(
    "3 rows of 30 locked by an operator for 2 s while all extend: the others hold, the locked fail typed then succeed after the release",
    () =>
      Effect.gen(function*() {
        const backend = backends[1]
        const prefix = nextPrefix()
        const sql = backend.client()
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix }).pipe(
          Effect.provide(backend.context())
        )
        const thief = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix }).pipe(
          Effect.provideService(SqlClient.SqlClient, sql)
        )
        for (let n = 0; n < 30; n++) yield* jobs.send(n)
        const held: Array<Mailbox.Message<number>> = []
        while (held.length < 30) {
          held.push(...(yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "1500 millis" })))
        }
        const locked = held.slice(0, 3)
        const lockedIds = new Set(locked.map((m) => m.id))
        // The locked ones get a long lease first, so they are still theirs after the lock is released.
        for (const m of locked) yield* m.extendVisibility("20 seconds")
        const released = yield* Deferred.make<void>()
        const lock = yield* Effect.fork(
          sql.withTransaction(
            Effect.zipRight(
              sql.unsafe(
                `SELECT seq FROM ${prefix}mailbox_messages WHERE seq IN (${
                  locked.map((m) => Number(m.id)).join(",")
                }) FOR UPDATE`
              ),
              Effect.sleep("2 seconds")
            )
          ).pipe(Effect.ensuring(Deferred.succeed(released, undefined)))
        )
        yield* Effect.sleep("100 millis")
        const during: Array<string> = []
        const others: Array<string> = []
        const beating = yield* Effect.fork(
          Effect.forEach(held, (m) =>
            Effect.repeat(
              Effect.either(m.extendVisibility("1500 millis")).pipe(
                Effect.tap((either) =>
                  Effect.map(Deferred.isDone(released), (done) => {
                    if (!lockedIds.has(m.id)) others.push(tag(either))
                    else if (!done) during.push(tag(either))
                  })
                ),
                Effect.zipRight(Effect.sleep("250 millis"))
              ),
              { times: 10 }
            ), { concurrency: "unbounded", discard: true })
        )
        const stolen = new Set<string>()
        for (let i = 0; i < 25; i++) {
          for (const m of yield* thief.receive({ maxMessages: 10, visibilityTimeout: "30 seconds" })) stolen.add(m.id)
          yield* Effect.sleep("100 millis")
        }
        yield* Fiber.join(lock)
        yield* Fiber.join(beating)
        expect([...stolen]).toEqual([])
        expect(others.filter((t) => t !== "ok")).toEqual([])
        expect(during.length).toBeGreaterThan(0)
        expect([...new Set(during)]).toEqual(["MailboxConnectionError"])
        // Released: the locked ones extend again.
        const after = yield* Effect.forEach(locked, (m) => Effect.either(m.extendVisibility("5 seconds")))
        expect(after.map(tag)).toEqual(["ok", "ok", "ok"])
        yield* Effect.forEach(held, (m) => m.acknowledge, { discard: true })
      }).pipe(Effect.scoped),
    30_000
  )

  it.live(
    "a row locked and then deleted by another session: typed connection failure while locked, expired once committed",
    () =>
      Effect.gen(function*() {
        const backend = backends[1]
        const prefix = nextPrefix()
        const sql = backend.client()
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix }).pipe(
          Effect.provide(backend.context())
        )
        yield* jobs.send(1)
        yield* jobs.send(2)
        const held = yield* jobs.receive({ maxMessages: 2, visibilityTimeout: "20 seconds" })
        expect(held.length).toBe(2)
        const [victim, bystander] = held
        const deleted = yield* Deferred.make<void>()
        const commit = yield* Deferred.make<void>()
        const other = yield* Effect.fork(
          sql.withTransaction(
            Effect.gen(function*() {
              yield* sql.unsafe(
                `SELECT seq FROM ${prefix}mailbox_messages WHERE seq = ${Number(victim!.id)} FOR UPDATE`
              )
              yield* sql.unsafe(`DELETE FROM ${prefix}mailbox_messages WHERE seq = ${Number(victim!.id)}`)
              yield* Deferred.succeed(deleted, undefined)
              yield* Deferred.await(commit)
            })
          )
        )
        yield* Deferred.await(deleted)
        const whileLocked = yield* Effect.all([
          Effect.either(victim!.extendVisibility("20 seconds")),
          Effect.either(bystander!.extendVisibility("20 seconds"))
        ], { concurrency: "unbounded" }).pipe(Effect.timeout("3 seconds"))
        expect(whileLocked.map(tag)).toEqual(["MailboxConnectionError", "ok"])
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.join(other)
        expect(tag(yield* Effect.either(victim!.extendVisibility("20 seconds")))).toBe("ReceiptHandleExpiredError")
        // Its acknowledgement now: stale, and the bystander's still lands.
        expect(tag(yield* Effect.either(victim!.acknowledge))).toBe("ReceiptHandleExpiredError")
        expect(tag(yield* Effect.either(bystander!.acknowledge))).toBe("ok")
      }).pipe(Effect.scoped),
    30_000
  )

  it.live(
    "an operator's transaction rewrites a row's receipt handle and holds it: typed failure while held, expired after",
    () =>
      Effect.gen(function*() {
        const backend = backends[1]
        const prefix = nextPrefix()
        const sql = backend.client()
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix }).pipe(
          Effect.provide(backend.context())
        )
        yield* jobs.send(1)
        const [message] = yield* jobs.receive({ visibilityTimeout: "20 seconds" })
        const updated = yield* Deferred.make<void>()
        const commit = yield* Deferred.make<void>()
        const other = yield* Effect.fork(
          sql.withTransaction(
            Effect.gen(function*() {
              yield* sql.unsafe(
                `UPDATE ${prefix}mailbox_messages SET receipt_handle = 'operator' WHERE seq = ${Number(message!.id)}`
              )
              yield* Deferred.succeed(updated, undefined)
              yield* Deferred.await(commit)
            })
          )
        )
        yield* Deferred.await(updated)
        const whileHeld = yield* Effect.either(message!.extendVisibility("20 seconds")).pipe(
          Effect.timeout("3 seconds")
        )
        expect(tag(whileHeld)).toBe("MailboxConnectionError")
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.join(other)
        expect(tag(yield* Effect.either(message!.extendVisibility("20 seconds")))).toBe("ReceiptHandleExpiredError")
      }).pipe(Effect.scoped),
    30_000
  )
})

// ---------------------------------------------------------------------------
// 6. Per-message log annotations on forks and nested loops
// ---------------------------------------------------------------------------

/** Captures every log line's message and annotations. */
const annotatedLogs = () => {
  const lines: Array<{ readonly message: string; readonly annotations: Record<string, unknown> }> = []
  const logger = Logger.make(({ annotations, message }) => {
    const record: Record<string, unknown> = {}
    for (const [key, value] of annotations) record[key] = value
    lines.push({ message: Array.isArray(message) ? message.join(" ") : String(message), annotations: record })
  })
  return { lines, layer: Logger.replace(Logger.defaultLogger, logger) }
}

const annotatedWorker = <A>(
  mailbox: Mailbox.Mailbox<A, never>,
  name: string,
  annotations: (m: Mailbox.Message<A, never>) => Record<string, unknown>,
  handle: (m: Mailbox.Message<A, never>) => Effect.Effect<void>
) =>
  MailboxWorker.make({
    name,
    mailbox,
    handle,
    annotations,
    onSuccess: () => Effect.succeedNone,
    onFailure: (message) => Effect.orDie(message.nack(0))
  })

const pick = (line: { readonly annotations: Record<string, unknown> }, ...keys: Array<string>) =>
  keys.map((key) => line.annotations[key])

describe("session 48: log annotations", () => {
  it.scopedLive("a fiber forked while a message is in hand logs with that message's annotations after the loop moved on; none outside the run", () => {
    const logs = annotatedLogs()
    return Effect.gen(function*() {
      const jobs = yield* MailboxMemory.make<number>({ name: "jobs" })
      for (let n = 0; n < 4; n++) yield* jobs.send(n)
      const outlive = yield* Scope.make()
      const loop = yield* annotatedWorker(jobs, "w", (m) => ({ job: m.body }), (m) =>
        Effect.zipRight(
          Effect.logInfo(`in hand ${m.body}`),
          Effect.asVoid(Effect.forkIn(Effect.delay(Effect.logInfo(`late ${m.body}`), "150 millis"), outlive))
        ))
      yield* loop.run({ maxIterations: 5, waitTime: "20 millis" })
      yield* Effect.logInfo("after the run")
      yield* Effect.sleep("300 millis")
      yield* Scope.close(outlive, Exit.void)
      const inHand = logs.lines.filter((l) => l.message.startsWith("in hand"))
      const late = logs.lines.filter((l) => l.message.startsWith("late"))
      expect(inHand.map((l) => [l.message, ...pick(l, "job")])).toEqual([0, 1, 2, 3].map((n) => [`in hand ${n}`, n]))
      expect(late.map((l) => [l.message, ...pick(l, "job")])).toEqual([0, 1, 2, 3].map((n) => [`late ${n}`, n]))
      const after = logs.lines.find((l) => l.message === "after the run")!
      expect(pick(after, "job")).toEqual([undefined])
    }).pipe(Effect.provide(logs.layer))
  })

  it.scopedLive("nested loops: the inner annotations win, the outer ones stay, both gone after", () => {
    const logs = annotatedLogs()
    return Effect.gen(function*() {
      const outerBox = yield* MailboxMemory.make<number>({ name: "outer" })
      const innerBox = yield* MailboxMemory.make<number>({ name: "inner" })
      for (let n = 0; n < 2; n++) {
        yield* outerBox.send(n)
        yield* innerBox.send(10 + n)
      }
      const inner = yield* annotatedWorker(
        innerBox,
        "inner",
        (m) => ({ inner: m.body, shared: "inner" }),
        (m) => Effect.logInfo(`inner ${m.body}`)
      )
      const outer = yield* annotatedWorker(
        outerBox,
        "outer",
        (m) => ({ outer: m.body, shared: "outer" }),
        (m) =>
          Effect.gen(function*() {
            yield* Effect.logInfo(`outer before ${m.body}`)
            yield* Effect.orDie(inner.run({ maxIterations: 1, waitTime: "20 millis" }))
            yield* Effect.logInfo(`outer after ${m.body}`)
          })
      )
      yield* outer.run({ maxIterations: 3, waitTime: "20 millis" })
      const line = (message: string) => logs.lines.find((l) => l.message === message)!
      expect(pick(line("outer before 0"), "outer", "inner", "shared")).toEqual([0, undefined, "outer"])
      expect(pick(line("inner 10"), "outer", "inner", "shared")).toEqual([0, 10, "inner"])
      expect(pick(line("outer after 0"), "outer", "inner", "shared")).toEqual([0, undefined, "outer"])
      expect(pick(line("inner 11"), "outer", "inner", "shared")).toEqual([1, 11, "inner"])
      yield* Effect.logInfo("outside")
      expect(pick(line("outside"), "outer", "inner", "shared")).toEqual([undefined, undefined, undefined])
    }).pipe(Effect.provide(logs.layer))
  })

  // Found broken, now fixed: a fiber forked in the inner loop's handler copied the inner cell, whose `outer` was
  // the outer run's live cell: a late log carried whatever message the outer loop held by then. A run now chains
  // to a snapshot of the cells around it as it starts (internal/loops/annotations.ts).
  it.scopedLive("nested loops: a fiber forked in the inner handler keeps the outer message's annotations after the outer loop moved on", () => {
    const logs = annotatedLogs()
    return Effect.gen(function*() {
      const outerBox = yield* MailboxMemory.make<number>({ name: "outer" })
      const innerBox = yield* MailboxMemory.make<number>({ name: "inner" })
      for (let n = 0; n < 2; n++) {
        yield* outerBox.send(n)
        yield* innerBox.send(10 + n)
      }
      const outlive = yield* Scope.make()
      const inner = yield* annotatedWorker(
        innerBox,
        "inner",
        (m) => ({ inner: m.body }),
        (m) => Effect.asVoid(Effect.forkIn(Effect.delay(Effect.logInfo(`late inner ${m.body}`), "100 millis"), outlive))
      )
      const outer = yield* annotatedWorker(outerBox, "outer", (m) => ({ outer: m.body }), (m) =>
        m.body === 0
          ? Effect.orDie(inner.run({ maxIterations: 1, waitTime: "20 millis" }))
          : Effect.sleep("300 millis"))
      yield* outer.run({ maxIterations: 3, waitTime: "20 millis" })
      yield* Scope.close(outlive, Exit.void)
      const late = logs.lines.find((l) => l.message === "late inner 10")!
      expect(pick(late, "outer", "inner")).toEqual([0, 10])
    }).pipe(Effect.provide(logs.layer))
  })
})
