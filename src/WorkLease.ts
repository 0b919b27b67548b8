/**
 * WorkLease: exclusive, FIFO processing per domain, with fencing tokens.
 *
 * For each `domainId` at most one offset is in flight under a lease; offsets
 * that arrive meanwhile wait in a de-duplicated FIFO backlog, and terminal
 * offsets (succeeded, or failed for good) are never acquired again. The
 * component does not hand work on: `succeed` and `fail` clear or keep the
 * lease and return a hint (the backlog head) for the external orchestrator,
 * which also owns timing (from `acquiredAt` and `retryCount`). Every
 * acquisition in a domain gets the next `fencingToken`, so storage can refuse
 * a zombie holder (`assertCurrent`). Misuse that the seed spec calls a hard
 * bug (out-of-order acquire, wrong token, no lease) is a typed failure.
 *
 * Beyond the seed, an optional `leaseTimeout`: a holder that dies or pauses
 * would otherwise stop its domain for good, and taking its offset again only
 * answered with its own token. With it, a lease not renewed within
 * `leaseTimeout` (`renew`, or `keepAlive` on a `Heartbeat`, or a `fail` that
 * schedules a retry) is stale, and `tryAcquire` of the same offset takes it
 * over: a new token, the next fencing token. A takeover counts as a failed
 * attempt, as `fail` would (work that kills its holder — out of memory, a
 * SIGKILL — must not be taken over and crash again for ever): the new lease's
 * `retryCount` is one more, and once the retries are used up the takeover
 * gives the offset up instead. Only a takeover ends a lease: a stale lease
 * nobody took over is still its holder's. Without `leaseTimeout`, the seed's
 * behaviour exactly.
 *
 * State lives in STM: a `TMap` from domain id to a `TRef` of the domain's
 * state, created once and never replaced — which is why a plain map of the
 * TRefs can serve lookups outside the transaction. Tokens and the clock are
 * read before the transaction, which stays pure.
 *
 * Bounded memory: processed offsets are kept as a low-water mark (every offset
 * below it is terminal) plus the processed offsets above it; failed offsets
 * (give-ups, which should be rare) are always kept, exactly. The mark
 * advances while the terminal offsets are contiguous, so a domain whose
 * offsets run 0, 1, 2, … keeps O(1) state with exact answers. Offsets that
 * finish out of order, or a domain that starts at a high offset, keep a set
 * that grows; the optional `retention.maxOutOfOrder` cap bounds it by raising
 * the mark past the smallest kept offsets (never past the lease or the
 * backlog head). The trade-off of the cap: an offset below the mark that was
 * never seen also answers `AlreadyProcessed`.
 */
import * as Clock from "effect/Clock"
import * as Data from "effect/Data"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberId from "effect/FiberId"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Order from "effect/Order"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as SortedSet from "effect/SortedSet"
import * as STM from "effect/STM"
import * as TMap from "effect/TMap"
import * as TRef from "effect/TRef"
import { randomUUID } from "node:crypto"
import type { InvalidParameterError } from "./Errors.js"
import type * as Heartbeat from "./Heartbeat.js"
import { counter } from "./internal/metrics.js"
import { refusedName } from "./internal/names.js"
import * as Options_ from "./internal/options.js"
import * as LeaseExtender from "./LeaseExtender.js"

/**
 * What `tryAcquire` found.
 *
 * @category models
 */
export type AcquireResult = Data.TaggedEnum<{
  Acquired: { readonly token: string; readonly fencingToken: number }
  AlreadyAcquired: { readonly token: string }
  Enqueued: {}
  AlreadyProcessed: {}
  AlreadyFailed: {}
}>

/**
 * Makes and matches `AcquireResult`s (`AcquireResult.Acquired({ token, fencingToken })`, `$match`…).
 *
 * @category constructors
 */
export const AcquireResult = Data.taggedEnum<AcquireResult>()

/**
 * What `succeed` leaves for the orchestrator.
 *
 * @category models
 */
export type SucceedResult = Data.TaggedEnum<{
  NoBacklog: {}
  NextHint: { readonly offset: number }
}>

/**
 * Makes and matches `SucceedResult`s.
 *
 * @category constructors
 */
export const SucceedResult = Data.taggedEnum<SucceedResult>()

/**
 * What `fail` did.
 *
 * @category models
 */
export type FailResult = Data.TaggedEnum<{
  RetryScheduled: { readonly retryCount: number }
  GiveUpNoBacklog: {}
  GiveUpNextHint: { readonly offset: number }
}>

/**
 * Makes and matches `FailResult`s.
 *
 * @category constructors
 */
export const FailResult = Data.taggedEnum<FailResult>()

/**
 * `tryAcquire` of an offset that is not the backlog head while the domain is idle.
 *
 * @category errors
 */
export class BacklogOrderingError extends Schema.TaggedError<BacklogOrderingError>()("BacklogOrderingError", {
  domainId: Schema.String,
  expected: Schema.Number,
  got: Schema.Number
}) {
  override get message(): string {
    return `Domain "${this.domainId}": offset ${this.got} acquired out of order; the backlog head is ${this.expected}`
  }
}

/**
 * `succeed` / `fail` on a domain without a lease.
 *
 * @category errors
 */
export class LeaseNotFoundError extends Schema.TaggedError<LeaseNotFoundError>()("LeaseNotFoundError", {
  domainId: Schema.String
}) {
  override get message(): string {
    return `Domain "${this.domainId}" has no lease to settle`
  }
}

/**
 * `succeed` / `fail` with a token that is not the current lease's.
 *
 * @category errors
 */
export class TokenMismatchError extends Schema.TaggedError<TokenMismatchError>()("TokenMismatchError", {
  domainId: Schema.String
}) {
  override get message(): string {
    return `Domain "${this.domainId}": the token does not match the current lease (a stale holder?)`
  }
}

/**
 * A fencing token that is not the current holder's.
 *
 * @category errors
 */
export class StaleFencingTokenError extends Schema.TaggedError<StaleFencingTokenError>()("StaleFencingTokenError", {
  domainId: Schema.String,
  fencingToken: Schema.Number,
  current: Schema.optional(Schema.Number)
}) {
  override get message(): string {
    return `Domain "${this.domainId}": fencing token ${this.fencingToken} is stale (current: ${this.current ?? "none"})`
  }
}

/**
 * Offsets are non-negative safe integers.
 *
 * @category errors
 */
export class InvalidOffsetError extends Schema.TaggedError<InvalidOffsetError>()("InvalidOffsetError", {
  domainId: Schema.String,
  offset: Schema.Unknown
}) {
  override get message(): string {
    return `Domain "${this.domainId}": offset ${String(this.offset)} is not a non-negative safe integer`
  }
}

/**
 * The lease of a domain, as `inspect` shows it.
 *
 * @category models
 */
export interface LeaseView {
  readonly offset: number
  readonly token: string
  readonly fencingToken: number
  readonly acquiredAt: DateTime.Utc
  readonly retryCount: number
  /**
   * When the lease goes stale unless renewed (none without a `leaseTimeout`). Past it, `tryAcquire` of the same
   * offset takes the lease over; until then, or if nobody does, it is the holder's.
   */
  readonly expiresAt: Option.Option<DateTime.Utc>
}

/**
 * A domain as `inspect` shows it.
 *
 * @category models
 */
export interface DomainSnapshot {
  readonly lease: Option.Option<LeaseView>
  readonly backlog: ReadonlyArray<number>
  /** Every offset below it is terminal. */
  readonly lowWaterMark: number
  /** Terminal offsets kept above the mark (the retention policy's memory). */
  readonly retainedTerminal: number
}

/**
 * Options of `keepAlive`.
 *
 * @category models
 */
export interface KeepAliveOptions {
  /**
   * Least time between two renewals, however often the heartbeat beats (default a third of `leaseTimeout`):
   * more than zero, at most half of `leaseTimeout`, and shorter than 12 hours. A renewal comes at the first beat
   * after `interval`, plus a round trip, so the work must beat well within `leaseTimeout − interval`.
   */
  readonly interval?: Duration.DurationInput | undefined
}

/**
 * A lease as `LeaseExtender.attach` takes it (`extendable`), which also tells whether it was lost.
 *
 * @category models
 */
export interface ExtendableLease extends LeaseExtender.Extendable {
  /**
   * True once a renewal found the lease lost — taken over (`TokenMismatchError`) or gone (`LeaseNotFoundError`).
   * That is final (tokens never come back): later extensions return at once, without a round trip.
   */
  readonly lost: Effect.Effect<boolean>
  /** Waits until a renewal finds the lease lost (for ever, while it holds). */
  readonly awaitLost: Effect.Effect<void>
}

/**
 * What `keepAlive` returns: whether the lease was found lost. A loss is seen at the next renewal (the first beat
 * `interval` after the last one); it is a hint for the work to stop early — what protects the data is the fenced
 * write, and the settle's `TokenMismatchError`.
 *
 * @category models
 */
export interface KeepAlive {
  /** True once a renewal found the lease taken over or gone: nothing renews it any more. */
  readonly lost: Effect.Effect<boolean>
  /** Waits until a renewal finds the lease lost (for ever, while it holds, or without a `leaseTimeout`). */
  readonly awaitLost: Effect.Effect<void>
}

/**
 * The contract, whatever the storage; a store that can fail adds its error as `StoreError`.
 *
 * @category models
 */
export interface WorkLease<StoreError = never> {
  readonly tryAcquire: (
    domainId: string,
    offset: number
  ) => Effect.Effect<AcquireResult, BacklogOrderingError | InvalidOffsetError | InvalidParameterError | StoreError>
  readonly succeed: (
    domainId: string,
    token: string
  ) => Effect.Effect<SucceedResult, LeaseNotFoundError | TokenMismatchError | InvalidParameterError | StoreError>
  readonly fail: (
    domainId: string,
    token: string
  ) => Effect.Effect<FailResult, LeaseNotFoundError | TokenMismatchError | InvalidParameterError | StoreError>
  /**
   * Resets the lease's expiry to now + `leaseTimeout` after the token checks (without a `leaseTimeout` there is
   * no expiry, and a renewal only checks the token). A stale lease nobody took over renews too.
   */
  readonly renew: (
    domainId: string,
    token: string
  ) => Effect.Effect<void, LeaseNotFoundError | TokenMismatchError | InvalidParameterError | StoreError>
  readonly inspect: (domainId: string) => Effect.Effect<DomainSnapshot, InvalidParameterError | StoreError>
  /** Fails unless `fencingToken` is the current lease's: storage calls it to refuse a zombie holder. */
  readonly assertCurrent: (
    domainId: string,
    fencingToken: number
  ) => Effect.Effect<void, StaleFencingTokenError | InvalidParameterError | StoreError>
  /**
   * The lease as `LeaseExtender.attach` takes it: each extension is a `renew` (by `leaseTimeout`, whatever
   * visibility the extender asks for). A renewal that finds the lease taken over or gone is final: logged once
   * as a warning, and later extensions do nothing (see `ExtendableLease.lost`).
   */
  readonly extendable: (domainId: string, token: string) => ExtendableLease
  /**
   * Renews the lease on `heartbeat`'s beats until the scope closes (a `LeaseExtender` on `extendable`): the
   * first beat renews, later ones at most once per `interval`. Work that stops beating lets the lease go stale.
   * Without a `leaseTimeout` it does nothing. A renewal that fails is logged, never raised; one that finds the
   * lease lost stops the renewals for good, and `lost` says so.
   */
  readonly keepAlive: (
    domainId: string,
    token: string,
    heartbeat: Heartbeat.Heartbeat,
    options?: KeepAliveOptions
  ) => Effect.Effect<KeepAlive, ParseResult.ParseError | InvalidParameterError, Scope.Scope>
}

/**
 * Stale leases taken over by `tryAcquire`.
 *
 * @category metrics
 */
export const takeovers = counter(
  "leasehold_work_lease_takeovers_total",
  "Stale work leases taken over by tryAcquire of the same offset"
)

/**
 * Offsets given up by `tryAcquire` of a stale lease whose retries were used up.
 *
 * @category metrics
 */
export const takeoverGiveUps = counter(
  "leasehold_work_lease_takeover_give_ups_total",
  "Offsets given up (failed) by tryAcquire of a stale lease whose retries were used up"
)

/** What a takeover replaced: the stale holder's fencing token, how long its lease had been stale, what came of it. */
export interface Takeover {
  readonly offset: number
  readonly staleFencingToken: number
  readonly staleForMillis: number
  /** The new lease's retry count, or, when the offset was given up, the stale lease's. */
  readonly retryCount: number
  /** The new lease's fencing token; undefined when the offset was given up instead (its retries were used up). */
  readonly fencingToken: number | undefined
}

/**
 * What a storage gives `assemble`: the operations on valid domain ids, `tryAcquire` telling of a takeover.
 *
 * @category models
 */
export interface Backend<StoreError> extends Omit<WorkLease<StoreError>, "tryAcquire" | "extendable" | "keepAlive"> {
  readonly tryAcquire: (
    domainId: string,
    offset: number
  ) => Effect.Effect<
    readonly [AcquireResult, Takeover | undefined],
    BacklogOrderingError | InvalidOffsetError | InvalidParameterError | StoreError
  >
}

/** The longest `leaseTimeout`: a day (a holder silent longer is not coming back). */
const maxLeaseTimeout = Duration.hours(24)

/** The `leaseTimeout` option of `make` (memory and SQL alike): 1 ms..24 h, finite. */
export const LeaseTimeout = Schema.optionalWith(
  Options_.duration({
    min: Duration.millis(1),
    max: maxLeaseTimeout,
    range: "must be at least 1 millisecond and at most 24 hours"
  }),
  { exact: true }
)

/** The longest renewal interval: what a `LeaseExtender` takes. */
const maxInterval = Duration.hours(12)

const logTakeover = (domainId: string, takeover: Takeover) => {
  const held = `offset ${takeover.offset} was held under fencing token ${takeover.staleFencingToken}, stale for ` +
    Duration.format(Duration.millis(takeover.staleForMillis))
  return Effect.zipRight(
    Metric.increment(takeover.fencingToken === undefined ? takeoverGiveUps : takeovers),
    Effect.logWarning(
      takeover.fencingToken === undefined
        ? `Work lease of domain "${domainId}" not taken over: ${held}, and its retries were used up ` +
          `(${takeover.retryCount}): the offset is given up (failed)`
        : `Work lease of domain "${domainId}" taken over: ${held}; now fencing token ${takeover.fencingToken}, ` +
          `retry ${takeover.retryCount}`
    ).pipe(
      Effect.annotateLogs({
        module: "WorkLease",
        domainId,
        offset: takeover.offset,
        staleFencingToken: takeover.staleFencingToken,
        staleForMillis: takeover.staleForMillis,
        retryCount: takeover.retryCount,
        ...(takeover.fencingToken === undefined ? { gaveUp: true } : { fencingToken: takeover.fencingToken })
      })
    )
  )
}

/** A renewal's failure that is final: the lease was taken over, or is gone. */
const isLoss = (error: { readonly _tag: string }): error is LeaseNotFoundError | TokenMismatchError =>
  error._tag === "LeaseNotFoundError" || error._tag === "TokenMismatchError"

/** Logs, once per lease, that a renewal found it lost; says who holds the domain now if it can tell. */
const logLost = (
  domainId: string,
  error: LeaseNotFoundError | TokenMismatchError,
  current: Effect.Effect<Option.Option<LeaseView>, unknown>
) =>
  Effect.flatMap(
    Effect.orElseSucceed(current, () => Option.none<LeaseView>()),
    (lease) =>
      Effect.logWarning(
        error._tag === "TokenMismatchError"
          ? `Work lease of domain "${domainId}" was taken over (${
            Option.match(lease, {
              onNone: () => "and settled since",
              onSome: (held) => `fencing token ${held.fencingToken}`
            })
          }); no longer renewing`
          : `Work lease of domain "${domainId}" is no longer held (settled, given up, or taken over and settled since); no longer renewing`
      ).pipe(Effect.annotateLogs({ module: "WorkLease", domainId }))
  )

/**
 * The WorkLease of a `backend`: every operation refuses a `domainId` that breaks the name rule
 * (`InvalidParameterError`), on every backend alike and before anything is stored — a lone surrogate has no
 * UTF-8 form, and PostgreSQL's driver sent U+FFFD in its place, so `"\udc00"` was answered with the lease of
 * domain `"\ufffd"`; a takeover is counted and logged; `extendable` and `keepAlive` renew through `renew`.
 * Used by `make` and `WorkLeaseSql.make`.
 */
export const assemble = <E extends { readonly _tag: string }>(
  backend: Backend<E>,
  leaseTimeout: Duration.Duration | undefined
): WorkLease<E> => {
  const guarded = <A, X>(
    domainId: string,
    effect: () => Effect.Effect<A, X>
  ): Effect.Effect<A, X | InvalidParameterError> => {
    const refused = refusedName("domainId", domainId)
    return refused === undefined ? effect() : Effect.fail(refused)
  }
  const renew: WorkLease<E>["renew"] = (domainId, token) => guarded(domainId, () => backend.renew(domainId, token))
  const extendable = (domainId: string, token: string): ExtendableLease => {
    // A loss is final — tokens never come back — so a zombie's later beats cost nothing: no round trip, no log.
    // Without this every beat sent a renewal and logged its failure (the extender only rate-limits successes).
    const lost = Deferred.unsafeMake<void>(FiberId.none)
    const loses = (error: LeaseNotFoundError | TokenMismatchError) =>
      Effect.flatMap(
        Deferred.succeed(lost, undefined),
        (first) => first ? logLost(domainId, error, Effect.map(backend.inspect(domainId), (d) => d.lease)) : Effect.void
      )
    return {
      id: `work-lease:${domainId}`,
      extendVisibility: () =>
        Effect.flatMap(
          Deferred.isDone(lost),
          (done) => done ? Effect.void : Effect.catchIf(renew(domainId, token), isLoss, loses)
        ),
      lost: Deferred.isDone(lost),
      awaitLost: Deferred.await(lost)
    }
  }
  // A renewal renews by `leaseTimeout`: the extension the extender asks for is never used, only bounded by its rules.
  const extension = leaseTimeout === undefined ? maxInterval : Duration.min(leaseTimeout, maxInterval)
  const decodeKeepAlive = Options_.decoder(
    "WorkLease.keepAlive",
    {
      interval: Schema.optionalWith(
        Options_.duration({ positive: true, max: maxInterval, range: "must be more than 0 and at most 12 hours" }),
        { exact: true }
      )
    },
    // At most half: a renewal comes at the first beat after `interval`, plus a round trip, so an interval just
    // below `leaseTimeout` let a holder that beats steadily go stale for part of nearly every cycle.
    ({ interval }) =>
      interval !== undefined && leaseTimeout !== undefined &&
        (Duration.greaterThan(Duration.times(interval, 2), leaseTimeout) ||
          Duration.greaterThanOrEqualTo(interval, extension))
        ? {
          field: "interval",
          message: `must be at most half of leaseTimeout (${Duration.format(leaseTimeout)}) and shorter than ` +
            "12 hours: a renewal comes at the first beat after interval, and the lease must not go stale meanwhile"
        }
        : undefined
  )
  const notKept: KeepAlive = { lost: Effect.succeed(false), awaitLost: Effect.never }
  const keepAlive: WorkLease<E>["keepAlive"] = (domainId, token, heartbeat, options) =>
    Effect.gen(function*() {
      const refused = refusedName("domainId", domainId)
      if (refused !== undefined) return yield* refused
      const { interval } = yield* decodeKeepAlive(options)
      if (leaseTimeout === undefined) return notKept
      // Valid by the checks above (interval below extension, both within 12 h): the extender cannot refuse them,
      // and a fresh extender is never attached already.
      const extender = yield* Effect.orDie(LeaseExtender.make({
        interval: interval ?? Duration.millis(Duration.toMillis(leaseTimeout) / 3),
        extension
      }))
      const lease = extendable(domainId, token)
      const detach = yield* Effect.uninterruptible(
        Effect.tap(
          Effect.orDie(extender.attachUnscoped(lease, heartbeat)),
          (detach) => Effect.addFinalizer(() => detach)
        )
      )
      // Once lost, stop listening to the heartbeat (detaching twice is harmless): later beats do nothing at all.
      yield* Effect.forkScoped(Effect.interruptible(Effect.zipRight(lease.awaitLost, detach)))
      return { lost: lease.lost, awaitLost: lease.awaitLost }
    })
  return {
    tryAcquire: (domainId, offset) =>
      guarded(
        domainId,
        () =>
          Effect.flatMap(backend.tryAcquire(domainId, offset), ([result, takeover]) =>
            takeover === undefined ? Effect.succeed(result) : Effect.as(logTakeover(domainId, takeover), result))
      ),
    succeed: (domainId, token) => guarded(domainId, () => backend.succeed(domainId, token)),
    fail: (domainId, token) => guarded(domainId, () => backend.fail(domainId, token)),
    renew,
    inspect: (domainId) => guarded(domainId, () => backend.inspect(domainId)),
    assertCurrent: (domainId, fencingToken) => guarded(domainId, () => backend.assertCurrent(domainId, fencingToken)),
    extendable,
    keepAlive
  }
}

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

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options {
  /** `fail` gives up once `retryCount >= maxRetries` (default 3; an integer in 0..2147483647, what SQL stores). */
  readonly maxRetries?: number | undefined
  readonly retention?: {
    /**
     * Most processed offsets kept above the low-water mark (a non-negative integer; unbounded by default):
     * past it the mark rises, and an offset below the mark that was never seen also answers `AlreadyProcessed`.
     */
    readonly maxOutOfOrder?: number | undefined
  } | undefined
  /**
   * A lease not renewed for this long is stale, and `tryAcquire` of its offset takes it over (1 ms..24 h; none
   * by default: a lease is its holder's until it settles, as in the seed).
   */
  readonly leaseTimeout?: Duration.DurationInput | undefined
}

const decodeOptions = Options_.decoder("WorkLease.make", {
  maxRetries: Schema.optionalWith(Options_.NonNegativeInt32, { exact: true, default: () => 3 }),
  retention: Schema.optionalWith(
    Schema.Struct({ maxOutOfOrder: Schema.optionalWith(Options_.NonNegativeInt, { exact: true }) }).annotations({
      identifier: "retention"
    }),
    { exact: true }
  ),
  leaseTimeout: LeaseTimeout
})

/** Milliseconds of `timeout`, whole (a lease expires on a millisecond, as in SQL). */
export const timeoutMillis = (timeout: Duration.Duration): number => Math.ceil(Duration.toMillis(timeout))

/**
 * Makes an in-memory WorkLease. Bad options are a `ParseError` naming them.
 *
 * @category constructors
 */
export const make = (options?: Options): Effect.Effect<WorkLease, ParseResult.ParseError> =>
  Effect.gen(function*() {
    const { leaseTimeout, maxRetries, retention } = yield* decodeOptions(options)
    const maxOutOfOrder = retention?.maxOutOfOrder
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
