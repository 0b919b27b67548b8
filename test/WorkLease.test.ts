import { describe, expect, it } from "@effect/vitest"
import { Clock, DateTime, Duration, Effect, FastCheck as fc, Logger, LogLevel, Metric, Option, TestClock } from "effect"
import * as Heartbeat from "../src/Heartbeat.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import * as WorkLease from "../src/WorkLease.js"
import { workLeaseContract } from "./contract/WorkLeaseContract.js"
import { captureLogs, refusedOptions } from "./helpers.js"

workLeaseContract("STM", (options) => WorkLease.make(options))

// ---------------------------------------------------------------------------
// Model-based property test
// ---------------------------------------------------------------------------

interface ModelDomain {
  lease: { offset: number; token: string; fencingToken: number; retryCount: number; expiresAt: number } | undefined
  backlog: Array<number>
  processed: Set<number>
  failed: Set<number>
  fencingToken: number
}

type Op =
  | { readonly kind: "acquire"; readonly domain: string; readonly offset: number }
  | { readonly kind: "retake"; readonly domain: string }
  | { readonly kind: "succeed" | "fail" | "renew"; readonly domain: string; readonly stale: boolean }
  | { readonly kind: "advance"; readonly millis: number }

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("acquire" as const),
      domain: fc.constantFrom("A", "B", "C"),
      offset: fc.nat(7)
    })
  },
  // An acquire of the offset in flight (0 when none): what an orchestrator does to take a stale lease over.
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("retake" as const), domain: fc.constantFrom("A", "B", "C") }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constantFrom("succeed" as const, "fail" as const, "renew" as const),
      domain: fc.constantFrom("A", "B", "C"),
      stale: fc.boolean()
    })
  },
  // Time passes: at LEASE_TIMEOUT and beyond, a lease nobody renewed is stale.
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("advance" as const),
      millis: fc.constantFrom(1, 3_000, 9_999, 10_000, 25_000)
    })
  }
)

const MAX_RETRIES = 2
const LEASE_TIMEOUT = 10_000

/**
 * Applies `op` to the model at time `now`, given the token used (or drawn, for an acquire); returns the
 * expected answer.
 */
const step = (
  model: Map<string, ModelDomain>,
  op: Exclude<Op, { kind: "advance" | "retake" }>,
  token: string,
  now: number
): Record<string, unknown> => {
  const d = model.get(op.domain) ??
    { lease: undefined, backlog: [], processed: new Set(), failed: new Set(), fencingToken: 0 }
  model.set(op.domain, d)
  if (op.kind === "acquire") {
    if (d.processed.has(op.offset)) return { _tag: "AlreadyProcessed" }
    if (d.failed.has(op.offset)) return { _tag: "AlreadyFailed" }
    if (d.lease !== undefined) {
      if (d.lease.offset === op.offset && now >= d.lease.expiresAt) {
        // Stale: a failed attempt, as fail would count it. Retries used up: given up; else a takeover with a new
        // token, the next fencing token and one more retry.
        if (d.lease.retryCount >= MAX_RETRIES) {
          d.failed.add(d.lease.offset)
          d.lease = undefined
          return { _tag: "AlreadyFailed" }
        }
        d.fencingToken++
        d.lease = {
          ...d.lease,
          token,
          fencingToken: d.fencingToken,
          retryCount: d.lease.retryCount + 1,
          expiresAt: now + LEASE_TIMEOUT
        }
        return { _tag: "Acquired", token, fencingToken: d.fencingToken }
      }
      if (d.lease.offset === op.offset) return { _tag: "AlreadyAcquired", token: d.lease.token }
      if (!d.backlog.includes(op.offset)) d.backlog.push(op.offset)
      return { _tag: "Enqueued" }
    }
    if (d.backlog.length > 0 && d.backlog[0] !== op.offset) {
      return { _tag: "BacklogOrderingError", expected: d.backlog[0], got: op.offset }
    }
    if (d.backlog.length > 0) d.backlog.shift()
    d.fencingToken++
    d.lease = { offset: op.offset, token, fencingToken: d.fencingToken, retryCount: 0, expiresAt: now + LEASE_TIMEOUT }
    return { _tag: "Acquired", token, fencingToken: d.fencingToken }
  }
  if (d.lease === undefined) return { _tag: "LeaseNotFoundError" }
  if (token !== d.lease.token) return { _tag: "TokenMismatchError" }
  if (op.kind === "renew") {
    d.lease.expiresAt = now + LEASE_TIMEOUT
    return { _tag: "Renewed" }
  }
  const hint = d.backlog[0]
  if (op.kind === "succeed") {
    d.processed.add(d.lease.offset)
    d.lease = undefined
    return hint === undefined ? { _tag: "NoBacklog" } : { _tag: "NextHint", offset: hint }
  }
  if (d.lease.retryCount >= MAX_RETRIES) {
    d.failed.add(d.lease.offset)
    d.lease = undefined
    return hint === undefined ? { _tag: "GiveUpNoBacklog" } : { _tag: "GiveUpNextHint", offset: hint }
  }
  d.lease.retryCount++
  d.lease.expiresAt = now + LEASE_TIMEOUT // the holder spoke: a retry renews the lease
  return { _tag: "RetryScheduled", retryCount: d.lease.retryCount }
}

const plain = (value: object): Record<string, unknown> => JSON.parse(JSON.stringify(value))

/**
 * A clock that only `advance` moves: `TestClock.adjust` yields to a real timer each time, which made this test
 * ten times slower.
 */
const manualClock = () => {
  let millis = 1_000_000
  const clock: Clock.Clock = {
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: () => millis,
    currentTimeMillis: Effect.sync(() => millis),
    unsafeCurrentTimeNanos: () => BigInt(millis) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => BigInt(millis) * 1_000_000n),
    sleep: () => Effect.never
  }
  return { clock, advance: (by: number) => Effect.sync(() => void (millis += by)) }
}

/** How often the sequences took a lease over, and gave a stale offset up (a test that never does proves nothing). */
const seen = { takeovers: 0, giveUps: 0 }

const runSequence = (ops: ReadonlyArray<Op>) => {
  const time = manualClock()
  // Takeovers are logged as warnings: quiet here, as inside `it.effect`.
  return Effect.withClock(runOps(ops, time.advance), time.clock).pipe(Logger.withMinimumLogLevel(LogLevel.None))
}

const runOps = (ops: ReadonlyArray<Op>, advance: (by: number) => Effect.Effect<void>) =>
  Effect.gen(function*() {
    const lease = yield* WorkLease.make({ maxRetries: MAX_RETRIES, leaseTimeout: LEASE_TIMEOUT })
    const model = new Map<string, ModelDomain>()
    const lastFencing = new Map<string, number>()
    /** Each domain's tokens that were taken over: a zombie's. */
    const zombies = new Map<string, string>()
    for (const next of ops) {
      if (next.kind === "advance") {
        yield* advance(next.millis)
        continue
      }
      const op = next.kind === "retake"
        ? { kind: "acquire" as const, domain: next.domain, offset: model.get(next.domain)?.lease?.offset ?? 0 }
        : next
      const now = yield* Clock.currentTimeMillis
      let actual: Record<string, unknown>
      let token: string
      let holder: string | undefined
      if (op.kind === "acquire") {
        holder = model.get(op.domain)?.lease?.token
        actual = plain(yield* Effect.merge(lease.tryAcquire(op.domain, op.offset)))
        token = typeof actual["token"] === "string" ? actual["token"] : ""
      } else {
        // A stale call uses a token that is not the current holder's: one taken over if there is one (a zombie).
        token = op.stale
          ? zombies.get(op.domain) ?? "zombie-token"
          : model.get(op.domain)?.lease?.token ?? "no-lease"
        const call = op.kind === "succeed"
          ? lease.succeed(op.domain, token)
          : op.kind === "fail"
          ? lease.fail(op.domain, token)
          : Effect.as(lease.renew(op.domain, token), { _tag: "Renewed" })
        actual = plain(yield* Effect.merge(call as Effect.Effect<object, object>))
      }
      const expected = step(model, op, token, now)
      const { message: _message, domainId: _domainId, ...comparable } = actual
      expect(comparable).toEqual(expected)
      // A lease that an acquire ended — taken over, or given up — leaves its holder a zombie.
      if (holder !== undefined && model.get(op.domain)?.lease?.token !== holder) {
        zombies.set(op.domain, holder)
        if (expected["_tag"] === "Acquired") seen.takeovers++
        else seen.giveUps++
      }

      for (const [domainId, d] of model) {
        const snapshot = yield* lease.inspect(domainId)
        const view = Option.getOrUndefined(snapshot.lease)
        // 1. single in-flight unit, the model's
        expect(view?.offset).toBe(d.lease?.offset)
        // 2. disjointness: the lease is not in the backlog, nothing terminal is in the backlog
        if (view !== undefined) expect(snapshot.backlog).not.toContain(view.offset)
        for (const o of snapshot.backlog) expect(d.processed.has(o) || d.failed.has(o)).toBe(false)
        // 3. FIFO discipline: the same backlog in the same order
        expect(snapshot.backlog).toEqual(d.backlog)
        // 4. idempotence: terminal offsets answer Already* (and probing them changes nothing)
        for (const o of d.processed) expect((yield* lease.tryAcquire(domainId, o))._tag).toBe("AlreadyProcessed")
        for (const o of d.failed) expect((yield* lease.tryAcquire(domainId, o))._tag).toBe("AlreadyFailed")
        // 5. token fencing: only the model's current token is accepted (checked by the comparison above)
        expect(view?.token).toBe(d.lease?.token)
        expect(Option.map(view?.expiresAt ?? Option.none(), DateTime.toEpochMillis)).toEqual(
          Option.fromNullable(d.lease?.expiresAt)
        )
        // 6. monotonic fencing token
        if (view !== undefined) {
          expect(view.fencingToken).toBeGreaterThanOrEqual(lastFencing.get(domainId) ?? 0)
          lastFencing.set(domainId, view.fencingToken)
        }
      }
    }
  })

describe("WorkLease model-based property", () => {
  it.effect(
    "random tryAcquire / succeed / fail / renew / stale-token / time-passing sequences agree with a plain model (expiry, takeover, a takeover counted as a failed attempt and its give-up included); invariants hold",
    () =>
      Effect.gen(function*() {
        yield* Effect.promise(() =>
          fc.assert(
            fc.asyncProperty(fc.array(opArb, { maxLength: 40, size: "max" }), (ops) =>
              Effect.runPromise(runSequence(ops))),
            { numRuns: 1_500 }
          )
        )
        expect(seen.takeovers).toBeGreaterThan(500)
        expect(seen.giveUps).toBeGreaterThan(20)
      }),
    300_000
  )
})

describe("WorkLease options", () => {
  it.effect("bad options are a ParseError naming them: maxRetries and retention.maxOutOfOrder are counts", () =>
    Effect.gen(function*() {
      for (const maxRetries of [-1, 0.5, Number.NaN]) {
        const error = yield* Effect.flip(WorkLease.make({ maxRetries }))
        expect(refusedOptions(error)).toEqual(["maxRetries"])
        expect(error.message).toContain("must be a non-negative integer")
      }
      const retention = yield* Effect.flip(WorkLease.make({ retention: { maxOutOfOrder: -3 } }))
      expect(refusedOptions(retention)).toEqual(["retention.maxOutOfOrder"])
      expect(retention.message).toContain("WorkLease.make options")
      yield* WorkLease.make({ maxRetries: 0, retention: { maxOutOfOrder: 0 } })
    }))

  it.effect("leaseTimeout is a finite duration from 1 ms to 24 h: anything else is a ParseError naming it", () =>
    Effect.gen(function*() {
      for (
        const leaseTimeout of [0, -1, Number.NaN, Infinity, "25 hours", "0 seconds", "soon", [1, -1], "0.5 millis"]
      ) {
        const error = yield* Effect.flip(WorkLease.make({ leaseTimeout: leaseTimeout as never }))
        expect(refusedOptions(error)).toEqual(["leaseTimeout"])
      }
      yield* WorkLease.make({ leaseTimeout: "24 hours" })
      yield* WorkLease.make({ leaseTimeout: 1 })
    }))

  it.scoped("keepAlive's interval is more than zero and at most half of leaseTimeout (and below 12 h): a ParseError naming it", () =>
    Effect.gen(function*() {
      const lease = yield* WorkLease.make({ leaseTimeout: "30 seconds" })
      const held = yield* lease.tryAcquire("A", 0)
      if (held._tag !== "Acquired") return expect.fail(held._tag)
      const heartbeat = yield* Heartbeat.make
      for (const interval of [0, -1, Number.NaN, "30 seconds", "29 seconds", "15001 millis", "1 hour"]) {
        const error = yield* Effect.flip(lease.keepAlive("A", held.token, heartbeat, { interval: interval as never }))
        expect(refusedOptions(error)).toEqual(["interval"])
      }
      yield* lease.keepAlive("A", held.token, heartbeat, { interval: "15 seconds" })
      // Just below leaseTimeout, a holder beating every 100 ms went stale for part of nearly every cycle.
      const second = yield* WorkLease.make({ leaseTimeout: "1 second" })
      const other = yield* second.tryAcquire("A", 0)
      if (other._tag !== "Acquired") return expect.fail(other._tag)
      const error = yield* Effect.flip(second.keepAlive("A", other.token, heartbeat, { interval: "999 millis" }))
      expect(refusedOptions(error)).toEqual(["interval"])
      expect(error.message).toContain("at most half of leaseTimeout")
      // And at 24 h, half is 12 h: what an extender refuses (its extension, 12 h at most, must be longer).
      const day = yield* WorkLease.make({ leaseTimeout: "24 hours" })
      const third = yield* day.tryAcquire("A", 0)
      if (third._tag !== "Acquired") return expect.fail(third._tag)
      const twelve = yield* Effect.flip(day.keepAlive("A", third.token, heartbeat, { interval: "12 hours" }))
      expect(refusedOptions(twelve)).toEqual(["interval"])
      yield* day.keepAlive("A", third.token, yield* Heartbeat.make, { interval: "11 hours" })
      // The edges of the default interval (a third of leaseTimeout) are an extender's to accept, never a defect.
      for (const leaseTimeout of [1, "24 hours"] as const) {
        const edge = yield* WorkLease.make({ leaseTimeout })
        const acquired = yield* edge.tryAcquire("A", 0)
        if (acquired._tag !== "Acquired") return expect.fail(acquired._tag)
        const kept = yield* edge.keepAlive("A", acquired.token, yield* Heartbeat.make)
        expect(yield* kept.lost).toBe(false)
      }
    }))

  it.effect("maxRetries is refused beyond what a SQL backend stores (a 32-bit integer): the same rule in memory", () =>
    Effect.gen(function*() {
      for (const maxRetries of [2 ** 31, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER + 2, Infinity]) {
        const error = yield* Effect.flip(WorkLease.make({ maxRetries }))
        expect(refusedOptions(error)).toEqual(["maxRetries"])
      }
      yield* WorkLease.make({ maxRetries: 2 ** 31 - 1 })
    }))
})

describe("WorkLease takeovers are visible", () => {
  it.effect("each takeover counts in leasehold_work_lease_takeovers_total and is logged as a warning with the stale holder's fencing token and how long it was stale", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const lease = yield* WorkLease.make({ leaseTimeout: "1 minute" })
      const before = (yield* Metric.value(WorkLease.takeovers)).count
      const held = yield* lease.tryAcquire("repo", 3)
      if (held._tag !== "Acquired") return expect.fail(held._tag)
      yield* TestClock.adjust("90 seconds")
      expect(yield* lease.tryAcquire("repo", 3)).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
      expect((yield* Metric.value(WorkLease.takeovers)).count).toBe(before + 1)
      const warning = logs.lines.filter((line) => line.level === "WARN")
      expect(warning.length).toBe(1)
      expect(warning[0]!.message).toContain("fencing token 1")
      expect(warning[0]!.message).toContain("30s") // stale for 30 s: 90 s since the acquisition, 60 s of lease
      expect(warning[0]!.message).toContain("repo")
      expect(warning[0]!.message).toContain("retry 1")
    }).pipe(Effect.provide(logs.layer))
  })

  it.effect("a takeover that gives the offset up is counted in leasehold_work_lease_takeover_give_ups_total and logged as a warning saying so", () => {
    const logs = captureLogs()
    return Effect.gen(function*() {
      const lease = yield* WorkLease.make({ maxRetries: 1, leaseTimeout: "1 minute" })
      const takeovers = (yield* Metric.value(WorkLease.takeovers)).count
      const giveUps = (yield* Metric.value(WorkLease.takeoverGiveUps)).count
      yield* lease.tryAcquire("repo", 3)
      yield* TestClock.adjust("1 minute")
      expect(yield* lease.tryAcquire("repo", 3)).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
      yield* TestClock.adjust("2 minutes")
      expect(yield* lease.tryAcquire("repo", 3)).toEqual({ _tag: "AlreadyFailed" })
      expect((yield* Metric.value(WorkLease.takeovers)).count).toBe(takeovers + 1)
      expect((yield* Metric.value(WorkLease.takeoverGiveUps)).count).toBe(giveUps + 1)
      const warning = logs.lines.filter((line) => line.level === "WARN")
      expect(warning.length).toBe(2)
      expect(warning[1]!.message).toContain("fencing token 2")
      expect(warning[1]!.message).toContain("1m") // stale for a minute
      expect(warning[1]!.message).toContain("given up")
    }).pipe(Effect.provide(logs.layer))
  })
})

describe("WorkLease keepAlive after a takeover", () => {
  it.scoped("a zombie beating on sends one renewal, not one per beat (the renewals counted at the backend)", () =>
    Effect.gen(function*() {
      const memory = yield* WorkLease.make({ leaseTimeout: "1 second" })
      let renewals = 0
      const lease = WorkLease.assemble({
        ...memory,
        tryAcquire: (domainId, offset) =>
          Effect.map(memory.tryAcquire(domainId, offset), (r) => [r, undefined] as const),
        renew: (domainId, token) =>
          Effect.suspend(() => {
            renewals++
            return memory.renew(domainId, token)
          })
      }, Duration.seconds(1))
      const held = yield* lease.tryAcquire("doc", 0)
      if (held._tag !== "Acquired") return expect.fail(held._tag)
      const heartbeat = yield* Heartbeat.make
      const kept = yield* lease.keepAlive("doc", held.token, heartbeat, { interval: "50 millis" })
      yield* TestClock.adjust("2 seconds") // paused past the timeout
      const taken = yield* lease.tryAcquire("doc", 0)
      expect(taken._tag).toBe("Acquired")
      const failures = (yield* Metric.value(LeaseExtender.extensionFailures)).count
      const before = renewals
      for (let i = 0; i < 100; i++) { // the zombie fixture's pace: a beat every 50 ms
        yield* TestClock.adjust("50 millis")
        yield* heartbeat.beat
        for (let y = 0; y < 5; y++) yield* Effect.yieldNow()
      }
      expect(renewals - before).toBe(1)
      expect((yield* Metric.value(LeaseExtender.extensionFailures)).count).toBe(failures)
      expect(yield* kept.lost).toBe(true)
    }))
})

describe("WorkLease retention (bounded memory)", () => {
  it.effect("sequential offsets keep O(1) state with exact answers; failed offsets are kept and still answer AlreadyFailed", () =>
    Effect.gen(function*() {
      const lease = yield* WorkLease.make({ maxRetries: 0 })
      for (let offset = 0; offset < 5_000; offset++) {
        const result = yield* lease.tryAcquire("A", offset)
        if (result._tag !== "Acquired") return expect.fail(`offset ${offset}: ${result._tag}`)
        if (offset === 42) yield* lease.fail("A", result.token) // maxRetries 0: gives up at once
        else yield* lease.succeed("A", result.token)
      }
      const snapshot = yield* lease.inspect("A")
      expect(snapshot.lowWaterMark).toBe(5_000)
      expect(snapshot.retainedTerminal).toBe(1) // just the failed 42
      expect((yield* lease.tryAcquire("A", 42))._tag).toBe("AlreadyFailed")
      expect((yield* lease.tryAcquire("A", 41))._tag).toBe("AlreadyProcessed")
    }))

  it.effect("out-of-order terminal offsets grow the set; maxOutOfOrder caps it (an unseen offset below the mark then counts as processed)", () =>
    Effect.gen(function*() {
      const run = (retention?: { maxOutOfOrder: number }) =>
        Effect.gen(function*() {
          const lease = yield* WorkLease.make(retention === undefined ? {} : { retention })
          for (let offset = 1; offset <= 1_000; offset++) { // offset 0 never arrives
            const result = yield* lease.tryAcquire("A", offset)
            if (result._tag === "Acquired") yield* lease.succeed("A", result.token)
          }
          return { lease, snapshot: yield* lease.inspect("A") }
        })
      const exact = yield* run()
      expect(exact.snapshot.retainedTerminal).toBe(1_000)
      expect((yield* exact.lease.tryAcquire("A", 0))._tag).toBe("Acquired") // exact: 0 is still new
      const capped = yield* run({ maxOutOfOrder: 100 })
      expect(capped.snapshot.retainedTerminal).toBeLessThanOrEqual(100)
      expect((yield* capped.lease.tryAcquire("A", 0))._tag).toBe("AlreadyProcessed") // the documented trade-off
      expect((yield* capped.lease.tryAcquire("A", 1_000))._tag).toBe("AlreadyProcessed")
    }))

  it.effect("the cap never raises the mark past the lease or the backlog head", () =>
    Effect.gen(function*() {
      const lease = yield* WorkLease.make({ retention: { maxOutOfOrder: 1 } })
      const five = yield* lease.tryAcquire("A", 5)
      yield* lease.succeed("A", (five as Extract<WorkLease.AcquireResult, { _tag: "Acquired" }>).token)
      const seven = yield* lease.tryAcquire("A", 7)
      yield* lease.tryAcquire("A", 6) // backlog [6]
      yield* lease.succeed("A", (seven as Extract<WorkLease.AcquireResult, { _tag: "Acquired" }>).token)
      expect((yield* lease.inspect("A")).lowWaterMark).toBeLessThanOrEqual(6)
      expect((yield* lease.tryAcquire("A", 6))._tag).toBe("Acquired")
    }))
})

describe("WorkLease under concurrent fibers", () => {
  it.effect("8 fibers hammering 3 domains: holders never overlap, fencing tokens rise by one, every offset ends terminal once", () =>
    Effect.gen(function*() {
      const lease = yield* WorkLease.make()
      const OFFSETS = 40
      const log: Array<{ domain: string; offset: number; event: "acquire" | "release"; fencing: number }> = []
      const worker = Effect.gen(function*() {
        for (const domain of ["A", "B", "C"]) {
          for (let offset = 0; offset < OFFSETS;) {
            const result = yield* lease.tryAcquire(domain, offset)
            if (result._tag === "Acquired") {
              log.push({ domain, offset, event: "acquire", fencing: result.fencingToken })
              yield* Effect.yieldNow() // work, during which others try
              log.push({ domain, offset, event: "release", fencing: result.fencingToken })
              yield* lease.succeed(domain, result.token)
              offset++
            } else if (result._tag === "AlreadyProcessed") {
              offset++
            } else {
              yield* Effect.yieldNow() // held or queued by someone else: try again
            }
          }
        }
      })
      yield* Effect.all(Array.from({ length: 8 }, () => worker), { concurrency: "unbounded", discard: true })
      for (const domain of ["A", "B", "C"]) {
        const events = log.filter((e) => e.domain === domain)
        expect(events.length).toBe(2 * OFFSETS)
        events.forEach((event, i) => {
          const pair = Math.floor(i / 2)
          expect(event.event).toBe(i % 2 === 0 ? "acquire" : "release") // never two holders at once
          expect(event.offset).toBe(pair) // FIFO, each offset exactly once
          expect(event.fencing).toBe(pair + 1) // +1 per acquisition
        })
      }
    }))
})
