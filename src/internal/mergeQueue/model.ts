/**
 * The MergeQueue vocabulary: statuses, entries, the lock, audit rows, errors, the config and the contract
 * (`MergeQueueService`, the `MergeQueue` tag). A leaf: the public module (`MergeQueue.ts`, which re-exports it
 * all) and every part of the service here import it, and it imports none of them.
 */
import * as Context from "effect/Context"
import type * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import type { InvalidParameterError } from "../../Errors.js"
import type { Extendable } from "../../LeaseExtender.js"
import * as Options_ from "../options.js"
import * as Sql from "../sql/common.js"
import {
  AlreadyQueuedError,
  EntryNotFoundError,
  InvalidTransitionError,
  LockLostError,
  MergeQueueStoreError
} from "./errors.js"
import * as Errors_ from "./errors.js"
import * as Statuses from "./statuses.js"

// ---------------------------------------------------------------------------
// Statuses
// ---------------------------------------------------------------------------

/**
 * Where an entry is in its life.
 *
 * @category schemas
 */
export const Status = Errors_.Status

/**
 * Where an entry is in its life.
 *
 * @category models
 */
export type Status = typeof Status.Type

/**
 * Statuses in which an agent works on the entry: it has an agent id and a fencing token.
 *
 * @category constants
 */
export const inProgress: ReadonlyArray<Status> = Statuses.inProgress

/**
 * Statuses an entry never leaves.
 *
 * @category constants
 */
export const terminal: ReadonlyArray<Status> = Statuses.terminal

/**
 * Whether `transition` allows `from → to` (`pending → claimed` happens only through `nextWithLock`).
 *
 * @category utils
 */
export const canTransition: (from: Status, to: Status) => boolean = Statuses.canTransition

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

/**
 * One entry of the queue.
 *
 * @category models
 */
export interface QueueEntry {
  readonly id: number
  readonly workspace: string
  readonly beadId: Option.Option<string>
  readonly priority: number
  readonly status: Status
  /** The agent working on it: present exactly in in-progress statuses. */
  readonly agentId: Option.Option<string>
  /** The token of the claim it is worked under (in-progress statuses only). */
  readonly fencingToken: Option.Option<number>
  readonly startedAt: Option.Option<DateTime.Utc>
  readonly stateChangedAt: DateTime.Utc
  readonly createdAt: DateTime.Utc
  /** How many times it was claimed. */
  readonly attemptCount: number
  readonly lastError: Option.Option<string>
}

/**
 * An entry claimed by `nextWithLock`, with `token`: the fencing token of the lock it was claimed under. The
 * calls that need the lock (`transition` of an in-progress entry, `extendLock`, `releaseProcessingLock`)
 * take the claim, and are refused once its token is not the lock's any more — whatever the agent id, so an
 * old incarnation of the same agent (a restarted pod with the same name, a second fiber) is refused too.
 *
 * @category models
 */
export interface Claim extends QueueEntry {
  readonly token: number
}

/**
 * Proof of holding the processing lock: a `Claim`, or what `acquireProcessingLock` returned.
 *
 * @category models
 */
export interface LockHold {
  readonly token: number
}

/**
 * The single processing lock.
 *
 * @category models
 */
export interface ProcessingLock {
  readonly agentId: string
  readonly acquiredAt: DateTime.Utc
  readonly expiresAt: DateTime.Utc
  readonly fencingToken: number
}

/**
 * What one recovery did (or, from `getRecoveryStats`, would do now).
 *
 * @category models
 */
export interface RecoveryStats {
  readonly locksCleaned: number
  readonly entriesReclaimed: number
  readonly recoveryTimestamp: DateTime.Utc
}

/**
 * Counts by status, the lock, and the age of the oldest pending entry.
 *
 * @category models
 */
export interface QueueStats {
  readonly total: number
  readonly byStatus: Readonly<Record<Status, number>>
  readonly lock: Option.Option<ProcessingLock>
  readonly oldestPendingAt: Option.Option<DateTime.Utc>
}

/**
 * One row of the audit log: a claim, transition, release, extension or self-healing action.
 *
 * @category models
 */
export interface AuditRecord {
  readonly id: number
  readonly at: DateTime.Utc
  readonly action: AuditAction
  readonly agentId: Option.Option<string>
  readonly entryId: Option.Option<number>
  readonly fencingToken: Option.Option<number>
  readonly fromStatus: Option.Option<Status>
  readonly toStatus: Option.Option<Status>
  readonly detail: Option.Option<string>
}

/**
 * What an audit row records. `lock_expired` and `entry_reclaimed` are self-healing actions.
 *
 * @category models
 */
export type AuditAction =
  | "enqueued"
  | "lock_acquired"
  | "claimed"
  | "transition"
  | "lock_released"
  | "lock_extended"
  | "lock_expired"
  | "entry_reclaimed"

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// `MergeQueueStoreError` (the database failed; nothing changed), `EntryNotFoundError`, `InvalidTransitionError`
// (the state machine refuses the move), `LockLostError` (the agent no longer owns the entry: its lock expired,
// was released, or was taken over with a newer fencing token; nothing changed) and `AlreadyQueuedError` (the
// workspace has an entry that is not final). Defined in `internal/mergeQueue/errors.ts`, which the service raising
// them imports too.
export { AlreadyQueuedError, EntryNotFoundError, InvalidTransitionError, LockLostError, MergeQueueStoreError }

// ---------------------------------------------------------------------------
// Config and metrics
// ---------------------------------------------------------------------------

/** A claim's retry delay: bounded, as a claim waits through up to `maxAttempts` of them. */
const Backoff = Options_.duration({ max: Duration.minutes(1), range: "must be between 0 and 1 minute" })

/**
 * How the queue behaves, decoded from `Options` with its defaults.
 *
 * @category models
 */
export class MergeQueueConfig extends Schema.Class<MergeQueueConfig>("leasehold/MergeQueueConfig")({
  /**
   * How long a lock lives without an extension (default 300 s, like the seed): from 1 ms (the database counts in
   * milliseconds) to 24 h. Never infinite: recovery must be able to take a crashed agent's lock back.
   */
  lockTimeout: Schema.optionalWith(
    Options_.duration({
      min: Duration.millis(1),
      max: Duration.hours(24),
      range: "must be greater than zero: from 1 millisecond to 24 hours"
    }),
    { default: () => Duration.seconds(300) }
  ),
  /** Table name prefix (default `leasehold_`). */
  prefix: Sql.Prefix,
  /** Attempts of a claim that meets a busy database or a conflict (default 5, at most 100). */
  maxAttempts: Schema.optionalWith(Options_.intBetween(1, 100), { default: () => 5 }),
  /** First retry delay of a claim, doubled each time (default 50 ms; 0..1 min). */
  initialBackoff: Schema.optionalWith(Backoff, { default: () => Duration.millis(50) }),
  /** Longest retry delay of a claim (default 2 s; 0..1 min, at least `initialBackoff`). */
  maxBackoff: Schema.optionalWith(Backoff, { default: () => Duration.seconds(2) }),
  /**
   * Create or upgrade the tables when they are missing or older (default true, or `LEASEHOLD_MIGRATE` when
   * set). False runs no migration and writes nothing while opening: the tables must be at the version this
   * release needs (`leasehold migrate` puts them there), else a `SchemaVersionError` saying so — what workers
   * started after a separate migration step want. (The operator's commands and console open the queue as it
   * is, even at an earlier version: their reads and `detectAndRecoverStale` work on any version's tables.)
   */
  create: Schema.optionalWith(Schema.Boolean, { default: () => true })
}) {}

/**
 * Options of `make` and `layer`, as callers write them (`MergeQueueConfig`'s encoded side).
 *
 * @category models
 */
export type Options = typeof MergeQueueConfig.Encoded

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

type Store<A> = Effect.Effect<A, MergeQueueStoreError>

/**
 * The merge queue's operations. Times come from `Clock`.
 *
 * @category models
 */
export interface MergeQueueService {
  readonly config: MergeQueueConfig
  /** Queues `workspace`; fails `AlreadyQueuedError` while an earlier entry for it is not final. */
  readonly enqueue: (
    workspace: string,
    options?: { readonly beadId?: string | undefined; readonly priority?: number | undefined }
  ) => Effect.Effect<QueueEntry, AlreadyQueuedError | InvalidParameterError | MergeQueueStoreError>
  /**
   * Recovers stale work when there is any (best effort: a failure is logged
   * and counted), then takes the lock and claims the next pending entry.
   * `None` when the lock is held by another live agent (found with one read,
   * no write) or nothing is pending. An agent that still owns an in-progress
   * entry under its live lock gets that entry back. Busy databases and
   * conflicts are retried with capped exponential backoff.
   */
  readonly nextWithLock: (agentId: string) => Effect.Effect<
    Option.Option<Claim>,
    InvalidParameterError | MergeQueueStoreError
  >
  /**
   * Takes the lock if it is free, expired, or already the agent's (then it is refreshed); the hold (its
   * fencing token), or `None` while another agent holds it.
   */
  readonly acquireProcessingLock: (
    agentId: string
  ) => Effect.Effect<Option.Option<LockHold>, InvalidParameterError | MergeQueueStoreError>
  /** Releases the lock `hold` holds; false, not an error, when the lock is not held under its token any more. */
  readonly releaseProcessingLock: (
    hold: LockHold
  ) => Effect.Effect<boolean, InvalidParameterError | MergeQueueStoreError>
  /** The lock, live or expired. */
  readonly getProcessingLock: Store<Option.Option<ProcessingLock>>
  /** Moves a live lock's expiry to at least now + `extra`; false when the lock is gone, expired or not `hold`'s. */
  readonly extendLock: (
    hold: LockHold,
    extra: Duration.DurationInput
  ) => Effect.Effect<boolean, InvalidParameterError | MergeQueueStoreError>
  /** Clears an expired lock and returns in-progress entries not carried by the live lock and older than `threshold` to pending. */
  readonly reclaimStale: (
    threshold: Duration.DurationInput
  ) => Effect.Effect<number, InvalidParameterError | MergeQueueStoreError>
  /** Clears an expired lock and returns every in-progress entry not carried by the live lock to pending. */
  readonly detectAndRecoverStale: Store<RecoveryStats>
  /** What `detectAndRecoverStale` would do now, changing nothing. */
  readonly getRecoveryStats: Store<RecoveryStats>
  /** Whether there is a lock and it has expired. */
  readonly isLockStale: Store<boolean>
  /**
   * Moves an entry along the state machine. Leaving or entering an
   * in-progress status (and `merged`) needs the entry's claim (`{ id, token }`):
   * the entry must still be under that claim and the lock live under its
   * token, checked in the same transaction as the write. Other moves (an
   * operator cancelling a pending entry) take the entry's id alone.
   * `error` is recorded as the entry's last error.
   */
  readonly transition: (
    entry: number | { readonly id: number; readonly token: number },
    status: Status,
    options?: { readonly error?: string | undefined }
  ) => Effect.Effect<
    QueueEntry,
    EntryNotFoundError | InvalidTransitionError | LockLostError | InvalidParameterError | MergeQueueStoreError
  >
  readonly get: (id: number) => Store<Option.Option<QueueEntry>>
  /** Entries in queue order (priority, then age), optionally of some statuses only; `limit` 1..100000. */
  readonly list: (options?: {
    readonly status?: ReadonlyArray<Status> | undefined
    readonly limit?: number | undefined
  }) => Effect.Effect<ReadonlyArray<QueueEntry>, InvalidParameterError | MergeQueueStoreError>
  readonly stats: Store<QueueStats>
  /**
   * Audit rows in the order they happened, optionally for one entry: the first `limit`, or with `last` the
   * newest `last` (the log's tail, still oldest first; `limit` is then ignored).
   */
  readonly auditLog: (options?: {
    readonly entryId?: number | undefined
    readonly limit?: number | undefined
    readonly last?: number | undefined
  }) => Effect.Effect<ReadonlyArray<AuditRecord>, InvalidParameterError | MergeQueueStoreError>
  /**
   * A claim's lock as something `LeaseExtender` can extend: attach it with
   * the worker's `Heartbeat` so the lock lives exactly as long as work happens.
   */
  readonly extendable: (claim: Claim) => Extendable
}

/**
 * The merge queue service.
 *
 * @category services
 */
export class MergeQueue extends Context.Tag("leasehold/MergeQueue")<MergeQueue, MergeQueueService>() {}
