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
 *
 * Where it lives: this module is the API; `internal/workLease/` holds the
 * rest — `model.ts` (the results, errors, views, the contract and the
 * metrics, re-exported here; the leaf every backend imports), `assemble.ts`
 * (what every backend shares: the `domainId` rule, takeover logs,
 * `extendable` and `keepAlive`) and `stm.ts` (the in-memory backend).
 * `WorkLeaseSql.ts` is the other backend, over the same `assemble`.
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
