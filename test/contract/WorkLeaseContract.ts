/**
 * The WorkLease contract: the seed's six sanity scenarios and the error
 * policy, run against whatever `make` builds (STM now; SQL backends later).
 */
import { describe, expect, it } from "@effect/vitest"
import { DateTime, Effect, Option, type Scope, TestClock } from "effect"
import type * as WorkLease from "../../src/WorkLease.js"

export type MakeWorkLease = (options: { readonly maxRetries: number }) => Effect.Effect<
  WorkLease.WorkLease<{ readonly _tag: string }>,
  unknown,
  Scope.Scope
>

const acquired = (result: WorkLease.AcquireResult) => {
  expect(result._tag).toBe("Acquired")
  return result as Extract<WorkLease.AcquireResult, { _tag: "Acquired" }>
}

export const workLeaseContract = (label: string, make: MakeWorkLease) =>
  describe(`WorkLease contract: ${label}`, () => {
    it.scoped("1. happy path: Acquired, then succeed gives NoBacklog", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const { fencingToken, token } = acquired(yield* lease.tryAcquire("A", 1))
        expect(fencingToken).toBe(1)
        expect(token.length).toBeGreaterThanOrEqual(32)
        expect((yield* lease.succeed("A", token))._tag).toBe("NoBacklog")
        expect(Option.isNone((yield* lease.inspect("A")).lease)).toBe(true)
      }))

    it.scoped("2. queue then orchestrated hand-off: Enqueued, NextHint(2), then 2 is Acquired", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const first = acquired(yield* lease.tryAcquire("A", 1))
        expect((yield* lease.tryAcquire("A", 2))._tag).toBe("Enqueued")
        expect((yield* lease.tryAcquire("A", 2))._tag).toBe("Enqueued") // de-duplicated
        expect((yield* lease.inspect("A")).backlog).toEqual([2])
        expect(yield* lease.succeed("A", first.token)).toEqual({ _tag: "NextHint", offset: 2 })
        expect((yield* lease.inspect("A")).backlog).toEqual([2]) // a hint, not a hand-off
        const second = acquired(yield* lease.tryAcquire("A", 2))
        expect(second.fencingToken).toBe(2)
        expect((yield* lease.inspect("A")).backlog).toEqual([])
      }))

    it.scoped("3. out-of-order acquire while the backlog has a head: BacklogOrderingError", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const first = acquired(yield* lease.tryAcquire("A", 1))
        yield* lease.tryAcquire("A", 2)
        yield* lease.succeed("A", first.token)
        const error = yield* Effect.flip(lease.tryAcquire("A", 3))
        expect(error).toMatchObject({ _tag: "BacklogOrderingError", domainId: "A", expected: 2, got: 3 })
      }))

    it.scoped("4. retry: RetryScheduled(n), lease kept, acquiredAt unchanged", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        yield* TestClock.setTime(5_000)
        const { token } = acquired(yield* lease.tryAcquire("A", 1))
        yield* TestClock.adjust("1 minute")
        expect(yield* lease.fail("A", token)).toEqual({ _tag: "RetryScheduled", retryCount: 1 })
        expect(yield* lease.fail("A", token)).toEqual({ _tag: "RetryScheduled", retryCount: 2 })
        const view = Option.getOrThrow((yield* lease.inspect("A")).lease)
        expect(view.offset).toBe(1)
        expect(view.retryCount).toBe(2)
        expect(DateTime.toEpochMillis(view.acquiredAt)).toBe(5_000)
        expect(yield* lease.tryAcquire("A", 1)).toEqual({ _tag: "AlreadyAcquired", token })
      }))

    it.scoped("5. final give-up at retryCount >= maxRetries: lease cleared, offset failed", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 2 })
        const { token } = acquired(yield* lease.tryAcquire("A", 1))
        yield* lease.tryAcquire("A", 2)
        yield* lease.fail("A", token)
        yield* lease.fail("A", token)
        expect(yield* lease.fail("A", token)).toEqual({ _tag: "GiveUpNextHint", offset: 2 })
        expect(Option.isNone((yield* lease.inspect("A")).lease)).toBe(true)
        const next = acquired(yield* lease.tryAcquire("A", 2))
        yield* lease.fail("A", next.token)
        yield* lease.fail("A", next.token)
        expect((yield* lease.fail("A", next.token))._tag).toBe("GiveUpNoBacklog")
      }))

    it.scoped("6. idempotence: a terminal offset answers Already* and is never re-enqueued", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 0 })
        const one = acquired(yield* lease.tryAcquire("A", 0))
        yield* lease.succeed("A", one.token)
        const two = acquired(yield* lease.tryAcquire("A", 5))
        yield* lease.fail("A", two.token) // maxRetries 0: gives up at once
        expect((yield* lease.tryAcquire("A", 0))._tag).toBe("AlreadyProcessed")
        expect((yield* lease.tryAcquire("A", 5))._tag).toBe("AlreadyFailed")
        const three = acquired(yield* lease.tryAcquire("A", 6))
        expect((yield* lease.tryAcquire("A", 0))._tag).toBe("AlreadyProcessed")
        expect((yield* lease.tryAcquire("A", 5))._tag).toBe("AlreadyFailed")
        expect((yield* lease.inspect("A")).backlog).toEqual([])
        expect(three.fencingToken).toBe(3)
      }))

    it.scoped("settling without a lease, with a stale token, or an invalid offset fails with a typed error", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        expect((yield* Effect.flip(lease.succeed("nowhere", "t")))._tag).toBe("LeaseNotFoundError")
        const first = acquired(yield* lease.tryAcquire("A", 1))
        yield* lease.succeed("A", first.token)
        expect((yield* Effect.flip(lease.fail("A", first.token)))._tag).toBe("LeaseNotFoundError")
        yield* lease.tryAcquire("A", 2)
        expect((yield* Effect.flip(lease.succeed("A", first.token)))._tag).toBe("TokenMismatchError")
        for (const bad of [-1, 1.5, Number.NaN, 2 ** 60]) {
          expect((yield* Effect.flip(lease.tryAcquire("A", bad)))._tag).toBe("InvalidOffsetError")
        }
      }))

    it.scoped("assertCurrent refuses a zombie's fencing token; domains are independent", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const a1 = acquired(yield* lease.tryAcquire("A", 1))
        const b1 = acquired(yield* lease.tryAcquire("B", 1))
        expect(b1.fencingToken).toBe(1)
        yield* lease.assertCurrent("A", a1.fencingToken)
        yield* lease.succeed("A", a1.token)
        const a2 = acquired(yield* lease.tryAcquire("A", 2))
        const stale = yield* Effect.flip(lease.assertCurrent("A", a1.fencingToken))
        expect(stale).toMatchObject({ _tag: "StaleFencingTokenError", fencingToken: 1, current: 2 })
        yield* lease.assertCurrent("A", a2.fencingToken)
        expect((yield* Effect.flip(lease.assertCurrent("C", 1)))._tag).toBe("StaleFencingTokenError")
        expect(yield* lease.inspect("unknown")).toMatchObject({ backlog: [] })
      }))

    it.scoped("domain ids keep the name rule on every backend; different names are different domains", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const held = acquired(yield* lease.tryAcquire("\ufffd", 0))
        for (const bad of ["", "a\u0000b", "\ud800", "\udc00", "x".repeat(201), "new\nline"]) {
          const refusals = [
            lease.tryAcquire(bad, 0),
            lease.succeed(bad, held.token),
            lease.fail(bad, held.token),
            lease.inspect(bad),
            lease.assertCurrent(bad, held.fencingToken)
          ]
          for (const refused of refusals) {
            expect(yield* Effect.flip(refused)).toMatchObject({ _tag: "InvalidParameterError", parameter: "domainId" })
          }
        }
        // A lone surrogate was answered with U+FFFD's lease on PostgreSQL: refused above, and U+FFFD's is intact.
        expect((yield* lease.inspect("\ufffd")).lease.pipe(Option.map((l) => l.token))).toEqual(Option.some(held.token))
        const emoji = acquired(yield* lease.tryAcquire("\ud83d\ude00", 0))
        expect(emoji.fencingToken).toBe(1)
        // A token no lease can have is a mismatch, not a failure of the store.
        expect((yield* Effect.flip(lease.succeed("\ufffd", "t\u0000\ud800")))._tag).toBe("TokenMismatchError")
      }))
  })
