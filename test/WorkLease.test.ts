import { describe, expect, it } from "@effect/vitest"
import { Effect, FastCheck as fc, Option } from "effect"
import * as WorkLease from "../src/WorkLease.js"
import { workLeaseContract } from "./contract/WorkLeaseContract.js"
import { refusedOptions } from "./helpers.js"

workLeaseContract("STM", (options) => WorkLease.make(options))

// ---------------------------------------------------------------------------
// Model-based property test
// ---------------------------------------------------------------------------

interface ModelDomain {
  lease: { offset: number; token: string; fencingToken: number; retryCount: number } | undefined
  backlog: Array<number>
  processed: Set<number>
  failed: Set<number>
  fencingToken: number
}

type Op =
  | { readonly kind: "acquire"; readonly domain: string; readonly offset: number }
  | { readonly kind: "succeed" | "fail"; readonly domain: string; readonly stale: boolean }

const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constant("acquire" as const), domain: fc.constantFrom("A", "B", "C"), offset: fc.nat(7) }),
  fc.record({
    kind: fc.constantFrom("succeed" as const, "fail" as const),
    domain: fc.constantFrom("A", "B", "C"),
    stale: fc.boolean()
  })
)

const MAX_RETRIES = 2

/** Applies `op` to the model, given the token used (or drawn, for an acquire); returns the expected answer. */
const step = (model: Map<string, ModelDomain>, op: Op, token: string): Record<string, unknown> => {
  const d = model.get(op.domain) ??
    { lease: undefined, backlog: [], processed: new Set(), failed: new Set(), fencingToken: 0 }
  model.set(op.domain, d)
  if (op.kind === "acquire") {
    if (d.processed.has(op.offset)) return { _tag: "AlreadyProcessed" }
    if (d.failed.has(op.offset)) return { _tag: "AlreadyFailed" }
    if (d.lease !== undefined) {
      if (d.lease.offset === op.offset) return { _tag: "AlreadyAcquired", token: d.lease.token }
      if (!d.backlog.includes(op.offset)) d.backlog.push(op.offset)
      return { _tag: "Enqueued" }
    }
    if (d.backlog.length > 0 && d.backlog[0] !== op.offset) {
      return { _tag: "BacklogOrderingError", expected: d.backlog[0], got: op.offset }
    }
    if (d.backlog.length > 0) d.backlog.shift()
    d.fencingToken++
    d.lease = { offset: op.offset, token, fencingToken: d.fencingToken, retryCount: 0 }
    return { _tag: "Acquired", token, fencingToken: d.fencingToken }
  }
  if (d.lease === undefined) return { _tag: "LeaseNotFoundError" }
  if (token !== d.lease.token) return { _tag: "TokenMismatchError" }
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
  return { _tag: "RetryScheduled", retryCount: d.lease.retryCount }
}

const plain = (value: object): Record<string, unknown> => JSON.parse(JSON.stringify(value))

const runSequence = (ops: ReadonlyArray<Op>) =>
  Effect.gen(function*() {
    const lease = yield* WorkLease.make({ maxRetries: MAX_RETRIES })
    const model = new Map<string, ModelDomain>()
    const lastFencing = new Map<string, number>()
    for (const op of ops) {
      let actual: Record<string, unknown>
      let token: string
      if (op.kind === "acquire") {
        actual = plain(yield* Effect.merge(lease.tryAcquire(op.domain, op.offset)))
        token = typeof actual["token"] === "string" ? actual["token"] : ""
      } else {
        // A stale call uses a token that is not the current holder's (an old one, as a zombie would).
        token = op.stale ? "zombie-token" : model.get(op.domain)?.lease?.token ?? "no-lease"
        const settle = op.kind === "succeed" ? lease.succeed : lease.fail
        actual = plain(yield* Effect.merge(settle(op.domain, token) as Effect.Effect<object, object>))
      }
      const expected = step(model, op, token)
      const { message: _message, domainId: _domainId, ...comparable } = actual
      expect(comparable).toEqual(expected)

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
    "random tryAcquire / succeed / fail / stale-token sequences agree with a plain model; invariants hold",
    () =>
      Effect.promise(() =>
        fc.assert(
          fc.asyncProperty(fc.array(opArb, { maxLength: 40 }), (ops) => Effect.runPromise(runSequence(ops))),
          { numRuns: 3_000 }
        )
      ),
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

  it.effect("maxRetries is refused beyond what a SQL backend stores (a 32-bit integer): the same rule in memory", () =>
    Effect.gen(function*() {
      for (const maxRetries of [2 ** 31, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER + 2, Infinity]) {
        const error = yield* Effect.flip(WorkLease.make({ maxRetries }))
        expect(refusedOptions(error)).toEqual(["maxRetries"])
      }
      yield* WorkLease.make({ maxRetries: 2 ** 31 - 1 })
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
