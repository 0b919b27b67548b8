/**
 * The WorkLease vocabulary: the results, errors, views and options, the
 * contract (`WorkLease`), what a storage gives `assemble` (`Backend`,
 * `Takeover`), and the takeover metrics. A leaf: the public module
 * (`WorkLease.ts`, which re-exports it all) and every backend (the STM one
 * here, `WorkLeaseSql.ts`) import it, and it imports none of them.
 */
import * as Data from "effect/Data"
import type * as DateTime from "effect/DateTime"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type { InvalidParameterError } from "../../Errors.js"
import type * as Heartbeat from "../../Heartbeat.js"
import type * as LeaseExtender from "../../LeaseExtender.js"
import { counter } from "../metrics.js"

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
