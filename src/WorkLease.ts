/**
 * WorkLease: exclusive, FIFO processing per domain, with fencing tokens.
 *
 * Per `domainId` at most one offset is in flight under a lease; offsets that arrive meanwhile wait in a
 * de-duplicated FIFO backlog, and terminal offsets are never acquired again. `succeed` and `fail` return a hint
 * (the backlog head) for the orchestrator, which owns timing. Each acquisition draws the domain's next
 * `fencingToken`, so storage can refuse a zombie (`assertCurrent`); what the seed calls a hard bug is a typed
 * failure.
 *
 * Beyond the seed, an optional `leaseTimeout`: a lease not renewed in time (`renew`, `keepAlive` on a
 * `Heartbeat`, a `fail` that schedules a retry) is stale, and `tryAcquire` of the same offset takes it over with
 * a new token and the next fencing token, counting a failed attempt (work that kills its holder must not be
 * retried for ever). Only a takeover ends a lease. Without `leaseTimeout`, the seed's behaviour exactly.
 *
 * State lives in STM (a `TMap` of per-domain `TRef`s, created once and never replaced, so lookups can skip the
 * transaction); tokens and the clock are read before it. Memory is bounded by a low-water mark below which every
 * offset is terminal (O(1) for offsets that finish in order); `retention.maxOutOfOrder` caps the rest, at the
 * price that an unseen offset below the mark answers `AlreadyProcessed`.
 *
 * `internal/workLease/model.ts` (the vocabulary and contract, re-exported here; the leaf every backend imports),
 * `assemble.ts` (what the backends share) and `stm.ts` (this backend); `WorkLeaseSql.ts` is the other.
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Options_ from "./internal/options.js"
import { LeaseTimeout } from "./internal/workLease/assemble.js"
import type { WorkLease } from "./internal/workLease/model.js"
import * as Stm from "./internal/workLease/stm.js"

// ---------------------------------------------------------------------------
// Models, errors and metrics
// ---------------------------------------------------------------------------

// The results (`AcquireResult`, `SucceedResult`, `FailResult`: types and their constructors), the errors, what
// `inspect` and `keepAlive` show, the contract (`WorkLease`) and the takeover counters. Defined, with their
// documentation, in `internal/workLease/model.ts`, which every backend imports too.
export {
  AcquireResult,
  BacklogOrderingError,
  FailResult,
  InvalidOffsetError,
  LeaseNotFoundError,
  StaleFencingTokenError,
  SucceedResult,
  takeoverGiveUps,
  takeovers,
  TokenMismatchError
} from "./internal/workLease/model.js"
export type {
  DomainSnapshot,
  ExtendableLease,
  KeepAlive,
  KeepAliveOptions,
  LeaseView,
  WorkLease
} from "./internal/workLease/model.js"

// ---------------------------------------------------------------------------
// For backends (`WorkLeaseSql`): what a storage provides, and the WorkLease made of it
// ---------------------------------------------------------------------------

export { assemble, LeaseTimeout, timeoutMillis } from "./internal/workLease/assemble.js"
export type { Backend, Takeover } from "./internal/workLease/model.js"

// ---------------------------------------------------------------------------
// The in-memory WorkLease
// ---------------------------------------------------------------------------

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

/**
 * Makes an in-memory WorkLease. Bad options are a `ParseError` naming them.
 *
 * @category constructors
 */
export const make = (options?: Options): Effect.Effect<WorkLease, ParseResult.ParseError> =>
  Effect.flatMap(
    decodeOptions(options),
    ({ leaseTimeout, maxRetries, retention }) =>
      Stm.make({ maxRetries, maxOutOfOrder: retention?.maxOutOfOrder, leaseTimeout })
  )
