/**
 * The WorkLease contract: the seed's six sanity scenarios and the error
 * policy, run against whatever `make` builds (STM now; SQL backends later).
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, DateTime, Duration, Effect, Exit, Metric, Option, Ref, Scope, TestClock } from "effect"
import * as Heartbeat from "../../src/Heartbeat.js"
import * as LeaseExtender from "../../src/LeaseExtender.js"
import type * as WorkLease from "../../src/WorkLease.js"
import { captureLogs } from "../helpers.js"

export type MakeWorkLease = (
  options: { readonly maxRetries: number; readonly leaseTimeout?: Duration.DurationInput }
) => Effect.Effect<
  WorkLease.WorkLease<{ readonly _tag: string }>,
  unknown,
  Scope.Scope
>

const acquired = (result: WorkLease.AcquireResult) => {
  expect(result._tag).toBe("Acquired")
  return result as Extract<WorkLease.AcquireResult, { _tag: "Acquired" }>
}

const view = (lease: WorkLease.WorkLease<{ readonly _tag: string }>, domainId: string) =>
  Effect.map(lease.inspect(domainId), (snapshot) => Option.getOrThrow(snapshot.lease))

const expiresAtMillis = (lease: WorkLease.LeaseView) =>
  Option.getOrUndefined(Option.map(lease.expiresAt, DateTime.toEpochMillis))

/**
 * Storage guarded by fencing tokens, as the coordination guide shows: a row that remembers the highest fencing
 * token that wrote it and refuses a lower one, and checks `assertCurrent` before it writes.
 */
const fencedResource = (lease: WorkLease.WorkLease<{ readonly _tag: string }>, domainId: string) =>
  Effect.map(Ref.make({ value: "", fencing: 0 }), (row) => ({
    row,
    /** The compare alone: refuses a token lower than the highest it has seen. */
    compareAndWrite: (fencingToken: number, value: string) =>
      Ref.modify(row, (current) =>
        fencingToken < current.fencing
          ? ["refused" as const, current]
          : ["written" as const, { value, fencing: fencingToken }]),
    /** The check by the lease first, then the compare. */
    write: (fencingToken: number, value: string) =>
      Effect.flatMap(
        Effect.either(lease.assertCurrent(domainId, fencingToken)),
        (current) =>
          current._tag === "Left" ?
            Effect.succeed("refused" as const) :
            Ref.modify(row, (stored) =>
              fencingToken < stored.fencing
                ? ["refused" as const, stored]
                : ["written" as const, { value, fencing: fencingToken }])
      )
  }))

/** Waits (yielding, without moving the TestClock) until `check` holds: a heartbeat's extension runs on a fiber of its own. */
const eventually = <E>(check: Effect.Effect<boolean, E>) =>
  Effect.gen(function*() {
    for (let i = 0; i < 2_000; i++) {
      if (yield* check) return
      yield* Effect.yieldNow()
      if (i > 100) yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
    }
    expect.fail("the condition never held")
  })

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
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "1 minute" })
        const heartbeat = yield* Heartbeat.make
        const held = acquired(yield* lease.tryAcquire("\ufffd", 0))
        for (const bad of ["", "a\u0000b", "\ud800", "\udc00", "x".repeat(201), "new\nline"]) {
          const refusals: ReadonlyArray<Effect.Effect<unknown, unknown, Scope.Scope>> = [
            lease.tryAcquire(bad, 0),
            lease.succeed(bad, held.token),
            lease.fail(bad, held.token),
            lease.renew(bad, held.token),
            lease.keepAlive(bad, held.token, heartbeat),
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

    it.scoped("without leaseTimeout: the seed's behaviour — the holder keeps its lease for ever; renew checks the token", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3 })
        const held = acquired(yield* lease.tryAcquire("A", 0))
        expect(Option.isNone((yield* view(lease, "A")).expiresAt)).toBe(true)
        yield* TestClock.adjust("3650 days")
        expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
        yield* lease.renew("A", held.token) // nothing to renew: a success after the token checks
        expect(Option.isNone((yield* view(lease, "A")).expiresAt)).toBe(true)
        expect((yield* Effect.flip(lease.renew("A", "not-the-token")))._tag).toBe("TokenMismatchError")
        expect((yield* Effect.flip(lease.renew("nowhere", held.token)))._tag).toBe("LeaseNotFoundError")
        yield* lease.assertCurrent("A", held.fencingToken)
        expect((yield* lease.succeed("A", held.token))._tag).toBe("NoBacklog")
        expect((yield* Effect.flip(lease.renew("A", held.token)))._tag).toBe("LeaseNotFoundError")
      }))

    it.scoped("with leaseTimeout: inspect shows the expiry; renewals keep the lease however long the work takes", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "30 seconds" })
        yield* TestClock.setTime(1_000_000)
        const held = acquired(yield* lease.tryAcquire("A", 0))
        expect(expiresAtMillis(yield* view(lease, "A"))).toBe(1_030_000)
        for (let i = 0; i < 10; i++) {
          yield* TestClock.adjust("29 seconds")
          yield* lease.renew("A", held.token)
          expect(expiresAtMillis(yield* view(lease, "A"))).toBe((yield* Clock.currentTimeMillis) + 30_000)
          expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
        }
        // 29.999 s after the last renewal it is still the holder's.
        yield* TestClock.adjust("29999 millis")
        expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
        yield* lease.assertCurrent("A", held.fencingToken)
        expect((yield* lease.succeed("A", held.token))._tag).toBe("NoBacklog")
        expect((yield* Effect.flip(lease.renew("A", held.token)))._tag).toBe("LeaseNotFoundError")
      }))

    it.scoped("a lease not renewed within leaseTimeout is taken over by tryAcquire of the same offset: new token, next fencing token, one more retry; the old token is refused everywhere", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "30 seconds" })
        yield* TestClock.setTime(5_000)
        const old = acquired(yield* lease.tryAcquire("A", 7))
        expect(yield* lease.fail("A", old.token)).toEqual({ _tag: "RetryScheduled", retryCount: 1 }) // renews too
        yield* TestClock.adjust("30 seconds") // exactly leaseTimeout since the holder last spoke: stale
        const taken = acquired(yield* lease.tryAcquire("A", 7))
        expect(taken.token).not.toBe(old.token)
        expect(taken.fencingToken).toBe(old.fencingToken + 1)
        const now = yield* Clock.currentTimeMillis
        const lv = yield* view(lease, "A")
        // The takeover counts as a failed attempt: one retry by fail, one by the takeover.
        expect(lv).toMatchObject({ offset: 7, token: taken.token, fencingToken: taken.fencingToken, retryCount: 2 })
        expect(DateTime.toEpochMillis(lv.acquiredAt)).toBe(5_000) // the offset's first acquisition, as for retries
        expect(expiresAtMillis(lv)).toBe(now + 30_000)
        // The old holder is a zombie now: every call with its token or fencing token is refused.
        expect((yield* Effect.flip(lease.succeed("A", old.token)))._tag).toBe("TokenMismatchError")
        expect((yield* Effect.flip(lease.fail("A", old.token)))._tag).toBe("TokenMismatchError")
        expect((yield* Effect.flip(lease.renew("A", old.token)))._tag).toBe("TokenMismatchError")
        expect(yield* Effect.flip(lease.assertCurrent("A", old.fencingToken))).toMatchObject({
          _tag: "StaleFencingTokenError",
          fencingToken: old.fencingToken,
          current: taken.fencingToken
        })
        yield* lease.assertCurrent("A", taken.fencingToken)
        // The new holder works under the lease: the same offset is its own, the next one waits.
        expect(yield* lease.tryAcquire("A", 7)).toEqual({ _tag: "AlreadyAcquired", token: taken.token })
        expect((yield* lease.tryAcquire("A", 8))._tag).toBe("Enqueued")
        expect(yield* lease.fail("A", taken.token)).toEqual({ _tag: "RetryScheduled", retryCount: 3 })
        expect(yield* lease.succeed("A", taken.token)).toEqual({ _tag: "NextHint", offset: 8 })
        expect((yield* Effect.flip(lease.succeed("A", old.token)))._tag).toBe("LeaseNotFoundError")
        expect(acquired(yield* lease.tryAcquire("A", 8)).fencingToken).toBe(taken.fencingToken + 1)
        expect((yield* lease.tryAcquire("A", 7))._tag).toBe("AlreadyProcessed")
      }))

    it.scoped("a stale lease nobody took over is still its holder's: it renews and settles; another offset does not take it over", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 0, leaseTimeout: "10 seconds" })
        const held = acquired(yield* lease.tryAcquire("A", 0))
        yield* TestClock.adjust("1 hour")
        expect(expiresAtMillis(yield* view(lease, "A"))).toBeLessThan(yield* Clock.currentTimeMillis)
        expect((yield* lease.tryAcquire("A", 1))._tag).toBe("Enqueued") // only the same offset takes over
        yield* lease.assertCurrent("A", held.fencingToken)
        yield* lease.renew("A", held.token)
        expect(expiresAtMillis(yield* view(lease, "A"))).toBe((yield* Clock.currentTimeMillis) + 10_000)
        yield* TestClock.adjust("1 hour")
        expect(yield* lease.succeed("A", held.token)).toEqual({ _tag: "NextHint", offset: 1 })
        const next = acquired(yield* lease.tryAcquire("A", 1))
        yield* TestClock.adjust("1 hour")
        expect((yield* lease.fail("A", next.token))._tag).toBe("GiveUpNoBacklog") // maxRetries 0
        expect(next.fencingToken).toBe(2)
      }))

    it.scoped("a takeover counts as a failed attempt: once the retries are used up (takeovers and fails alike), the takeover gives the offset up as fail would — AlreadyFailed, lease cleared, the backlog head next", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 2, leaseTimeout: "10 seconds" })
        yield* TestClock.setTime(1_000)
        // Offset 0 kills every holder (out of memory, SIGKILL): nobody ever settles it.
        const first = acquired(yield* lease.tryAcquire("A", 0))
        expect((yield* lease.tryAcquire("A", 1))._tag).toBe("Enqueued")
        yield* TestClock.adjust("10 seconds")
        const second = acquired(yield* lease.tryAcquire("A", 0))
        expect(yield* view(lease, "A")).toMatchObject({ retryCount: 1, fencingToken: second.fencingToken })
        yield* TestClock.adjust("10 seconds")
        const third = acquired(yield* lease.tryAcquire("A", 0))
        expect(yield* view(lease, "A")).toMatchObject({ retryCount: 2, fencingToken: third.fencingToken })
        expect(DateTime.toEpochMillis((yield* view(lease, "A")).acquiredAt)).toBe(1_000)
        // Fresh, it is still its holder's; stale with its retries used up, it is given up.
        yield* TestClock.adjust("9999 millis")
        expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: third.token })
        yield* TestClock.adjust("1 millis")
        expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyFailed" })
        const snapshot = yield* lease.inspect("A")
        expect(Option.isNone(snapshot.lease)).toBe(true)
        expect(snapshot.backlog).toEqual([1])
        expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyFailed" }) // for ever, like a give-up
        // Every holder of offset 0 is refused; the domain goes on with the backlog's head.
        for (const zombie of [first, second, third]) {
          expect((yield* Effect.flip(lease.succeed("A", zombie.token)))._tag).toBe("LeaseNotFoundError")
          expect((yield* Effect.flip(lease.assertCurrent("A", zombie.fencingToken)))._tag).toBe(
            "StaleFencingTokenError"
          )
        }
        const next = acquired(yield* lease.tryAcquire("A", 1))
        expect(next.fencingToken).toBe(third.fencingToken + 1)
        expect(yield* view(lease, "A")).toMatchObject({ offset: 1, retryCount: 0 })
        expect(yield* lease.succeed("A", next.token)).toEqual({ _tag: "NoBacklog" })
        expect(yield* lease.inspect("A")).toMatchObject({ lowWaterMark: 2, retainedTerminal: 1 })
        expect((yield* lease.tryAcquire("A", 0))._tag).toBe("AlreadyFailed")

        // Fails and takeovers count together: one fail, one takeover, then the next takeover gives up.
        const b = acquired(yield* lease.tryAcquire("B", 5))
        expect(yield* lease.fail("B", b.token)).toEqual({ _tag: "RetryScheduled", retryCount: 1 })
        yield* TestClock.adjust("10 seconds")
        const b2 = acquired(yield* lease.tryAcquire("B", 5))
        expect(yield* view(lease, "B")).toMatchObject({ retryCount: 2 })
        yield* TestClock.adjust("10 seconds")
        expect(yield* lease.tryAcquire("B", 5)).toEqual({ _tag: "AlreadyFailed" })
        expect((yield* Effect.flip(lease.fail("B", b2.token)))._tag).toBe("LeaseNotFoundError")
        // With maxRetries 0 the first takeover gives up already.
        const none = yield* make({ maxRetries: 0, leaseTimeout: "10 seconds" })
        acquired(yield* none.tryAcquire("C", 0))
        yield* TestClock.adjust("10 seconds")
        expect(yield* none.tryAcquire("C", 0)).toEqual({ _tag: "AlreadyFailed" })
        expect(acquired(yield* none.tryAcquire("C", 1)).fencingToken).toBe(2)
      }))

    it.scoped("the zombie of issue 33: A pauses past leaseTimeout, B takes over, A wakes — A's settle and fenced writes are refused, and offset 1 waits for B", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "1 minute" })
        const resource = yield* fencedResource(lease, "repo")
        const a = acquired(yield* lease.tryAcquire("repo", 0))
        expect(yield* resource.write(a.fencingToken, "A: half of offset 0")).toBe("written")
        // A pauses (a GC pause, a stopped VM) for longer than leaseTimeout; the orchestrator tries offset 0 again.
        yield* TestClock.adjust("5 minutes")
        const b = acquired(yield* lease.tryAcquire("repo", 0))
        expect(b.fencingToken).toBe(a.fencingToken + 1)
        // A wakes before B wrote: its write checked by the lease is refused (the compare alone would not see it).
        expect(yield* resource.write(a.fencingToken, "A: the rest of offset 0")).toBe("refused")
        expect(yield* resource.write(b.fencingToken, "B: offset 0")).toBe("written")
        // Once B wrote, even a write that skips the check is refused by the compare.
        expect(yield* resource.compareAndWrite(a.fencingToken, "A: late")).toBe("refused")
        expect(yield* Ref.get(resource.row)).toEqual({ value: "B: offset 0", fencing: b.fencingToken })
        // A's settle is refused: it cannot end the lease B works under.
        expect((yield* Effect.flip(lease.succeed("repo", a.token)))._tag).toBe("TokenMismatchError")
        expect((yield* Effect.flip(lease.fail("repo", a.token)))._tag).toBe("TokenMismatchError")
        // A goes on to offset 1: it waits while B works — never two offsets of the domain in flight.
        expect((yield* lease.tryAcquire("repo", 1))._tag).toBe("Enqueued")
        expect(yield* lease.tryAcquire("repo", 0)).toEqual({ _tag: "AlreadyAcquired", token: b.token })
        expect(yield* lease.succeed("repo", b.token)).toEqual({ _tag: "NextHint", offset: 1 })
        const next = acquired(yield* lease.tryAcquire("repo", 1))
        expect(next.fencingToken).toBe(b.fencingToken + 1)
        expect(yield* resource.write(next.fencingToken, "offset 1")).toBe("written")
      }))

    it.scoped("keepAlive: a beating heartbeat keeps the lease past many leaseTimeouts; once beats stop it goes stale and is taken over", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "30 seconds" })
        const held = acquired(yield* lease.tryAcquire("A", 0))
        const heartbeat = yield* Heartbeat.make
        const scope = yield* Scope.make()
        yield* lease.keepAlive("A", held.token, heartbeat).pipe(Scope.extend(scope))
        for (let i = 0; i < 12; i++) { // 2 minutes: four leaseTimeouts
          yield* TestClock.adjust("10 seconds")
          yield* heartbeat.beat
          const renewedTo = (yield* Clock.currentTimeMillis) + 30_000
          yield* eventually(Effect.map(view(lease, "A"), (lv) => expiresAtMillis(lv) === renewedTo))
          expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
        }
        // The work hangs: no more beats, the lease runs out and is taken over.
        yield* TestClock.adjust("30 seconds")
        const taken = acquired(yield* lease.tryAcquire("A", 0))
        expect(taken.fencingToken).toBe(held.fencingToken + 1)
        // A late beat of the hung work cannot renew the lease it lost.
        yield* TestClock.adjust("10 seconds")
        yield* heartbeat.beat
        yield* Scope.close(scope, Exit.void)
        expect((yield* view(lease, "A")).token).toBe(taken.token)
        expect((yield* Effect.flip(lease.renew("A", held.token)))._tag).toBe("TokenMismatchError")
      }))

    it.scoped("keepAlive of a lease taken over: the zombie's first beat finds it lost — one warning, lost is true — and its later beats renew nothing, log nothing, count no failure", () => {
      const logs = captureLogs()
      return Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "30 seconds" })
        const held = acquired(yield* lease.tryAcquire("A", 0))
        const heartbeat = yield* Heartbeat.make
        const kept = yield* lease.keepAlive("A", held.token, heartbeat)
        yield* heartbeat.beat
        yield* TestClock.adjust("1 minute") // the holder pauses
        const taken = acquired(yield* lease.tryAcquire("A", 0))
        const failures = (yield* Metric.value(LeaseExtender.extensionFailures)).count
        const extensions = (yield* Metric.value(LeaseExtender.extensions)).count
        // The first renewal after the takeover has landed: it failed, or it found the lease lost.
        const landed = Effect.map(
          Metric.value(LeaseExtender.extensionFailures),
          (now) => now.count > failures || logs.lines.some((line) => line.message.includes("no longer renewing"))
        )
        // The zombie wakes and beats on, each beat due (10 s apart, the default interval).
        for (let i = 0; i < 100; i++) {
          yield* TestClock.adjust("10 seconds")
          yield* heartbeat.beat
          yield* i === 0 ? eventually(landed) : Effect.yieldNow()
        }
        yield* eventually(landed)
        expect((yield* Metric.value(LeaseExtender.extensionFailures)).count - failures).toBe(0)
        expect((yield* Metric.value(LeaseExtender.extensions)).count - extensions).toBeLessThanOrEqual(1)
        expect(logs.lines.filter((line) => line.level === "ERROR")).toEqual([])
        const lost = logs.lines.filter((line) => line.message.includes("no longer renewing"))
        expect(lost.length).toBe(1)
        expect(lost[0]).toMatchObject({ level: "WARN" })
        expect(lost[0]!.message).toContain(`taken over (fencing token ${taken.fencingToken})`)
        expect((yield* view(lease, "A")).token).toBe(taken.token)
        expect(yield* kept.lost).toBe(true)
        yield* kept.awaitLost // already lost: returns at once
      }).pipe(Effect.provide(logs.layer))
    })

    it.scoped("keepAlive's longest interval (half of leaseTimeout) keeps the lease of a holder that beats every tenth of it, whenever a takeover is tried", () =>
      Effect.gen(function*() {
        const lease = yield* make({ maxRetries: 3, leaseTimeout: "1 second" })
        const held = acquired(yield* lease.tryAcquire("A", 0))
        const heartbeat = yield* Heartbeat.make
        yield* lease.keepAlive("A", held.token, heartbeat, { interval: "500 millis" })
        let renewedAt: number | undefined
        for (let i = 0; i < 100; i++) { // ten leaseTimeouts
          // A takeover tried just before the beat, when the lease is closest to going stale.
          expect(yield* lease.tryAcquire("A", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
          yield* heartbeat.beat
          const now = yield* Clock.currentTimeMillis
          // A beat that is due renews: wait for the renewal to land before time moves on.
          if (renewedAt === undefined || now - renewedAt >= 500) {
            yield* eventually(Effect.map(view(lease, "A"), (lv) => expiresAtMillis(lv) === now + 1_000))
            renewedAt = now
          }
          yield* TestClock.adjust("100 millis")
        }
      }))

    it.scoped("extendable: what LeaseExtender.attach takes; keepAlive without a leaseTimeout does nothing", () =>
      Effect.gen(function*() {
        const timed = yield* make({ maxRetries: 3, leaseTimeout: "30 seconds" })
        const held = acquired(yield* timed.tryAcquire("A", 0))
        const target = timed.extendable("A", held.token)
        expect(target.id).toContain("A")
        yield* TestClock.adjust("20 seconds")
        yield* target.extendVisibility(Duration.minutes(5)) // renews by leaseTimeout, whatever it is asked
        expect(expiresAtMillis(yield* view(timed, "A"))).toBe((yield* Clock.currentTimeMillis) + 30_000)
        expect(yield* target.lost).toBe(false)
        // Another token's renewal finds the lease lost: final, and said once; later ones make no round trip.
        const zombie = timed.extendable("A", "other")
        yield* zombie.extendVisibility(Duration.seconds(1))
        expect(yield* zombie.lost).toBe(true)
        yield* TestClock.adjust("5 seconds")
        yield* zombie.extendVisibility(Duration.seconds(1))
        expect(expiresAtMillis(yield* view(timed, "A"))).toBe((yield* Clock.currentTimeMillis) + 25_000)
        // A holder that settled while still attached finds its lease gone: lost too.
        yield* timed.succeed("A", held.token)
        yield* target.extendVisibility(Duration.seconds(1))
        expect(yield* target.lost).toBe(true)
        const untimed = yield* make({ maxRetries: 3 })
        const other = acquired(yield* untimed.tryAcquire("A", 0))
        const kept = yield* untimed.keepAlive("A", other.token, yield* Heartbeat.make)
        expect(Option.isNone((yield* view(untimed, "A")).expiresAt)).toBe(true)
        expect(yield* kept.lost).toBe(false)
      }))
  })
