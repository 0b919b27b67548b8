/**
 * The in-memory WorkLease backend (`WorkLease.make`): each domain's state in
 * a `TRef` under a `TMap`, the rules of acquire, settle and renew as pure
 * transactions, and the low-water-mark retention (`markTerminal`). Tokens
 * and the clock are read before each transaction, which stays pure; the
 * result goes through `assemble` like the SQL backend's.
 */
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Order from "effect/Order"
import * as SortedSet from "effect/SortedSet"
import * as STM from "effect/STM"
import * as TMap from "effect/TMap"
import * as TRef from "effect/TRef"
import { randomUUID } from "node:crypto"
import { assemble, timeoutMillis } from "./assemble.js"
import {
  AcquireResult,
  type Backend,
  BacklogOrderingError,
  FailResult,
  InvalidOffsetError,
  LeaseNotFoundError,
  StaleFencingTokenError,
  SucceedResult,
  type Takeover,
  TokenMismatchError,
  type WorkLease
} from "./model.js"

interface Lease {
  readonly offset: number
  readonly token: string
  readonly fencingToken: number
  readonly acquiredAt: number
  readonly retryCount: number
  /** Epoch milliseconds from which the lease is stale; undefined without a `leaseTimeout`. */
  readonly expiresAt: number | undefined
}

interface DomainState {
  readonly lease: Lease | undefined
  readonly backlog: ReadonlyArray<number>
  readonly lowWater: number
  readonly processed: SortedSet.SortedSet<number>
  readonly failed: SortedSet.SortedSet<number>
  /** The last fencing token issued (0 before the first acquisition). */
  readonly fencingToken: number
}

const emptyOffsets = SortedSet.empty<number>(Order.number)

const initialState: DomainState = {
  lease: undefined,
  backlog: [],
  lowWater: 0,
  processed: emptyOffsets,
  failed: emptyOffsets,
  fencingToken: 0
}

const first = (set: SortedSet.SortedSet<number>): number | undefined => {
  const next = SortedSet.values(set).next()
  return next.done === true ? undefined : next.value
}

/**
 * Records `offset` as terminal and applies the retention policy. Failed
 * offsets are always kept (so they keep answering `AlreadyFailed`); the mark
 * only absorbs processed ones and steps over failed ones.
 */
const markTerminal = (
  state: DomainState,
  offset: number,
  kind: "processed" | "failed",
  maxOutOfOrder: number | undefined
): DomainState => {
  let { lowWater, processed } = state
  const failed = kind === "failed" ? SortedSet.add(state.failed, offset) : state.failed
  // The common case, in-order processing, moves the mark without touching the set.
  if (kind === "processed" && offset === lowWater) lowWater++
  else if (kind === "processed") processed = SortedSet.add(processed, offset)
  const drainContiguous = () => {
    for (;;) {
      if (SortedSet.has(processed, lowWater)) processed = SortedSet.remove(processed, lowWater)
      else if (!SortedSet.has(failed, lowWater)) return
      lowWater++
    }
  }
  drainContiguous()
  if (maxOutOfOrder !== undefined) {
    // Never past pending work: the lease and the backlog must stay above the mark.
    const ceiling = Math.min(state.lease?.offset ?? Infinity, state.backlog[0] ?? Infinity)
    while (SortedSet.size(processed) > maxOutOfOrder) {
      const smallest = first(processed)!
      if (smallest + 1 > ceiling) break
      lowWater = smallest
      drainContiguous()
    }
  }
  return { ...state, processed, failed, lowWater }
}

const hint = (state: DomainState) => state.backlog[0]

/** `WorkLease.make`'s options, decoded: `maxRetries` with its default, the others as given. */
export interface Config {
  readonly maxRetries: number
  readonly maxOutOfOrder: number | undefined
  readonly leaseTimeout: Duration.Duration | undefined
}

/** Makes the in-memory WorkLease of decoded options. */
export const make = ({ leaseTimeout, maxOutOfOrder, maxRetries }: Config): Effect.Effect<WorkLease> =>
  Effect.gen(function*() {
    const timeout = leaseTimeout === undefined ? undefined : timeoutMillis(leaseTimeout)
    const expiry = (now: number) => timeout === undefined ? undefined : now + timeout
    const domains = yield* STM.commit(TMap.empty<string, TRef.TRef<DomainState>>())
    // A domain's TRef is created once and never replaced, so this cache is always right.
    const known = new Map<string, TRef.TRef<DomainState>>()

    const domain = (domainId: string): Effect.Effect<TRef.TRef<DomainState>> => {
      const cached = known.get(domainId)
      if (cached !== undefined) return Effect.succeed(cached)
      return STM.commit(
        STM.flatMap(
          TMap.get(domains, domainId),
          Option.match({
            onSome: STM.succeed,
            onNone: () => STM.tap(TRef.make(initialState), (ref) => TMap.set(domains, domainId, ref))
          })
        )
      ).pipe(Effect.tap((ref) => Effect.sync(() => known.set(domainId, ref))))
    }

    const existing = (domainId: string): Effect.Effect<TRef.TRef<DomainState> | undefined> => {
      const cached = known.get(domainId)
      if (cached !== undefined) return Effect.succeed(cached)
      return Effect.map(STM.commit(TMap.get(domains, domainId)), Option.getOrUndefined)
    }

    type Acquisition = readonly [AcquireResult, Takeover | undefined]

    /** The lease's offset failed for good (its retries used up): terminal, and the lease cleared. */
    const giveUp = (state: DomainState, lease: Lease): DomainState => ({
      ...markTerminal(state, lease.offset, "failed", maxOutOfOrder),
      lease: undefined
    })

    const tryAcquire: Backend<never>["tryAcquire"] = (domainId, offset) =>
      Effect.gen(function*() {
        if (!Number.isSafeInteger(offset) || offset < 0) return yield* new InvalidOffsetError({ domainId, offset })
        const ref = yield* domain(domainId)
        const token = randomUUID()
        const now = yield* Clock.currentTimeMillis
        const answer = (result: AcquireResult): STM.STM<Acquisition> => STM.succeed([result, undefined])
        return yield* STM.commit(STM.flatMap(TRef.get(ref), (state): STM.STM<Acquisition, BacklogOrderingError> => {
          if (SortedSet.has(state.failed, offset)) return answer(AcquireResult.AlreadyFailed())
          if (offset < state.lowWater || SortedSet.has(state.processed, offset)) {
            return answer(AcquireResult.AlreadyProcessed())
          }
          const lease = state.lease
          if (lease !== undefined) {
            if (lease.offset === offset && lease.expiresAt !== undefined && lease.expiresAt <= now) {
              // Stale: the holder died or hung on it, which counts as a failed attempt, as its `fail` would.
              const stale = { offset, staleFencingToken: lease.fencingToken, staleForMillis: now - lease.expiresAt }
              if (lease.retryCount >= maxRetries) {
                return STM.as(
                  TRef.set(ref, giveUp(state, lease)),
                  [AcquireResult.AlreadyFailed(), {
                    ...stale,
                    retryCount: lease.retryCount,
                    fencingToken: undefined
                  }] as const
                )
              }
              // Taken over, with a new token and the next fencing token; `acquiredAt` stays the offset's first.
              const fencingToken = state.fencingToken + 1
              const retryCount = lease.retryCount + 1
              return STM.as(
                TRef.set(ref, {
                  ...state,
                  lease: { ...lease, token, fencingToken, retryCount, expiresAt: expiry(now) },
                  fencingToken
                }),
                [AcquireResult.Acquired({ token, fencingToken }), { ...stale, retryCount, fencingToken }] as const
              )
            }
            if (lease.offset === offset) return answer(AcquireResult.AlreadyAcquired({ token: lease.token }))
            if (state.backlog.includes(offset)) return answer(AcquireResult.Enqueued())
            return STM.as(
              TRef.set(ref, { ...state, backlog: [...state.backlog, offset] }),
              [AcquireResult.Enqueued(), undefined] as const
            )
          }
          const head = state.backlog[0]
          if (head !== undefined && head !== offset) {
            return STM.fail(new BacklogOrderingError({ domainId, expected: head, got: offset }))
          }
          const fencingToken = state.fencingToken + 1
          return STM.as(
            TRef.set(ref, {
              ...state,
              backlog: head === undefined ? state.backlog : state.backlog.slice(1),
              lease: { offset, token, fencingToken, acquiredAt: now, retryCount: 0, expiresAt: expiry(now) },
              fencingToken
            }),
            [AcquireResult.Acquired({ token, fencingToken }), undefined] as const
          )
        }))
      })

    /** Runs `f` on the domain's lease after the token checks. */
    const settle = <A>(
      domainId: string,
      token: string,
      f: (state: DomainState, lease: Lease, now: number) => readonly [A, DomainState]
    ): Effect.Effect<A, LeaseNotFoundError | TokenMismatchError> =>
      Effect.flatMap(Effect.zip(existing(domainId), Clock.currentTimeMillis), ([ref, now]) => {
        if (ref === undefined) return Effect.fail(new LeaseNotFoundError({ domainId }))
        return STM.commit(STM.flatMap(TRef.get(ref), (state): STM.STM<A, LeaseNotFoundError | TokenMismatchError> => {
          if (state.lease === undefined) return STM.fail(new LeaseNotFoundError({ domainId }))
          if (state.lease.token !== token) return STM.fail(new TokenMismatchError({ domainId }))
          const [result, next] = f(state, state.lease, now)
          return STM.as(TRef.set(ref, next), result)
        }))
      })

    const succeed: Backend<never>["succeed"] = (domainId, token) =>
      settle(domainId, token, (state, lease) => {
        const next = { ...markTerminal(state, lease.offset, "processed", maxOutOfOrder), lease: undefined }
        const head = hint(next)
        return [head === undefined ? SucceedResult.NoBacklog() : SucceedResult.NextHint({ offset: head }), next]
      })

    const fail: Backend<never>["fail"] = (domainId, token) =>
      settle(domainId, token, (state, lease, now): readonly [FailResult, DomainState] => {
        if (lease.retryCount >= maxRetries) {
          const next = giveUp(state, lease)
          const head = hint(next)
          return [head === undefined ? FailResult.GiveUpNoBacklog() : FailResult.GiveUpNextHint({ offset: head }), next]
        }
        // The holder spoke: a retry renews the lease too.
        const retryCount = lease.retryCount + 1
        return [
          FailResult.RetryScheduled({ retryCount }),
          { ...state, lease: { ...lease, retryCount, expiresAt: expiry(now) } }
        ]
      })

    const renew: Backend<never>["renew"] = (domainId, token) =>
      timeout === undefined
        ? settle(domainId, token, (state) => [undefined, state])
        : settle(domainId, token, (state, lease, now) => [undefined, {
          ...state,
          lease: { ...lease, expiresAt: now + timeout }
        }])

    const inspect: Backend<never>["inspect"] = (domainId) =>
      Effect.flatMap(existing(domainId), (ref) =>
        ref === undefined
          ? Effect.succeed({ lease: Option.none(), backlog: [], lowWaterMark: 0, retainedTerminal: 0 })
          : Effect.map(STM.commit(TRef.get(ref)), (state) => ({
            lease: Option.map(Option.fromNullable(state.lease), (lease) => ({
              offset: lease.offset,
              token: lease.token,
              fencingToken: lease.fencingToken,
              acquiredAt: DateTime.unsafeMake(lease.acquiredAt),
              retryCount: lease.retryCount,
              expiresAt: lease.expiresAt === undefined
                ? Option.none()
                : Option.some(DateTime.unsafeMake(lease.expiresAt))
            })),
            backlog: state.backlog,
            lowWaterMark: state.lowWater,
            retainedTerminal: SortedSet.size(state.processed) + SortedSet.size(state.failed)
          })))

    const assertCurrent: Backend<never>["assertCurrent"] = (domainId, fencingToken) =>
      Effect.flatMap(existing(domainId), (ref) =>
        Effect.flatMap(
          ref === undefined ? Effect.succeed(undefined) : Effect.map(STM.commit(TRef.get(ref)), (s) => s.lease),
          (lease) =>
            lease?.fencingToken === fencingToken
              ? Effect.void
              : Effect.fail(new StaleFencingTokenError({ domainId, fencingToken, current: lease?.fencingToken }))
        ))

    return assemble<never>({ tryAcquire, succeed, fail, renew, inspect, assertCurrent }, leaseTimeout)
  })
