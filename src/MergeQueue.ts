/**
 * MergeQueue: a merge queue in SQL (SQLite or PostgreSQL) whose stale
 * processing locks heal themselves, and that never lets a zombie worker write.
 *
 * Entries wait as `pending`, ordered by priority (lower first) then age. One
 * processing lock serialises the work: `nextWithLock(agentId)` takes the lock
 * and claims the next entry in one transaction, and every claim draws a
 * fencing token that only grows. An entry stays the agent's while the lock
 * that carries its token is live; the agent keeps it live with `extendLock`
 * (driven by a `Heartbeat` through `LeaseExtender` with `extendable`), so a
 * working agent keeps its entry however long the work takes and a stuck or
 * killed one loses it once the lock expires.
 *
 * Self-healing (`detectAndRecoverStale`, run best-effort before every claim):
 * an expired lock is cleared and every entry in an in-progress status whose
 * token is not carried by the live lock goes back to `pending`, keeping its
 * workspace, bead id and priority. State changes check ownership in the same
 * transaction as the write, so an agent whose lock was reclaimed is refused
 * with `LockLostError` and changes nothing.
 *
 * Every write first locks the single lock row (`SELECT … FOR UPDATE` on
 * PostgreSQL; a write as the first statement on SQLite, which takes the
 * database's write lock at once), so writers are serialised and the audit
 * log's order is the order things happened in. Tables are created on first
 * use under `prefix` (default `leasehold_`).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import type * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Database from "./Database.js"
import { InvalidParameterError, TablesNotFoundError } from "./Errors.js"
import { DurationFromInput } from "./internal/duration.js"
import * as Statuses from "./internal/mergeQueue/statuses.js"
import { counter } from "./internal/metrics.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import type { Extendable } from "./LeaseExtender.js"

// ---------------------------------------------------------------------------
// Statuses
// ---------------------------------------------------------------------------

/**
 * Where an entry is in its life.
 *
 * @category schemas
 */
export const Status = Schema.Literal(...Statuses.statuses)

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
export const terminal: ReadonlyArray<Status> = ["merged", "failed_terminal", "cancelled"]

const failed: ReadonlyArray<Status> = ["failed_retryable", "failed_terminal"]

/** The legal moves; `pending → claimed` happens only through `nextWithLock`. */
const moves: Record<Status, ReadonlyArray<Status>> = {
  pending: ["cancelled"],
  claimed: ["rebasing", ...failed, "cancelled"],
  rebasing: ["testing", ...failed, "cancelled"],
  testing: ["ready_to_merge", ...failed, "cancelled"],
  ready_to_merge: ["merging", ...failed, "cancelled"],
  merging: ["merged", ...failed],
  merged: [],
  failed_retryable: ["pending", "cancelled"],
  failed_terminal: [],
  cancelled: []
}

/**
 * Whether `transition` allows `from → to`.
 *
 * @category utils
 */
export const canTransition = (from: Status, to: Status): boolean => moves[from].includes(to)

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

/**
 * The database failed; the operation changed nothing (its transaction rolled back).
 *
 * @category errors
 */
export class MergeQueueStoreError extends Schema.TaggedError<MergeQueueStoreError>()("MergeQueueStoreError", {
  operation: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `MergeQueue ${this.operation} failed in the database: ${String(this.cause)}`
  }
}

/**
 * No entry has this id.
 *
 * @category errors
 */
export class EntryNotFoundError extends Schema.TaggedError<EntryNotFoundError>()("EntryNotFoundError", {
  entryId: Schema.Number
}) {
  override get message(): string {
    return `Merge queue entry ${this.entryId} does not exist`
  }
}

/**
 * The state machine does not allow this move.
 *
 * @category errors
 */
export class InvalidTransitionError extends Schema.TaggedError<InvalidTransitionError>()("InvalidTransitionError", {
  entryId: Schema.Number,
  from: Status,
  to: Status
}) {
  override get message(): string {
    const allowed = moves[this.from]
    return `Merge queue entry ${this.entryId} cannot go from ${this.from} to ${this.to}` +
      (allowed.length === 0 ? ` (${this.from} is final)` : ` (allowed: ${allowed.join(", ")})`)
  }
}

/**
 * The agent no longer owns the entry: its lock expired, was released, or
 * was taken over with a newer fencing token. Nothing was changed.
 *
 * @category errors
 */
export class LockLostError extends Schema.TaggedError<LockLostError>()("LockLostError", {
  entryId: Schema.Number,
  /** The fencing token presented; absent when none was (an entry id alone). */
  token: Schema.optional(Schema.Number),
  reason: Schema.String
}) {
  override get message(): string {
    const under = this.token === undefined ? "without a claim" : `under fencing token ${this.token}`
    return `Merge queue entry ${this.entryId} cannot be changed ${under}: ${this.reason}`
  }
}

/**
 * The workspace already has an entry that is not final.
 *
 * @category errors
 */
export class AlreadyQueuedError extends Schema.TaggedError<AlreadyQueuedError>()("AlreadyQueuedError", {
  workspace: Schema.String,
  entryId: Schema.Number
}) {
  override get message(): string {
    return `Workspace ${JSON.stringify(this.workspace)} is already queued as entry ${this.entryId}`
  }
}

// ---------------------------------------------------------------------------
// Config and metrics
// ---------------------------------------------------------------------------

/**
 * How the queue behaves, decoded from `Options` with its defaults.
 *
 * @category models
 */
export class MergeQueueConfig extends Schema.Class<MergeQueueConfig>("leasehold/MergeQueueConfig")({
  /** How long a lock lives without an extension (default 300 s, like the seed; more than zero). */
  lockTimeout: Schema.optionalWith(Options_.duration({ positive: true }), { default: () => Duration.seconds(300) }),
  /** Table name prefix (default `leasehold_`). */
  prefix: Sql.Prefix,
  /** Attempts of a claim that meets a busy database or a conflict (default 5, at most 100). */
  maxAttempts: Schema.optionalWith(Options_.intBetween(1, 100), { default: () => 5 }),
  /** First retry delay of a claim, doubled each time (default 50 ms). */
  initialBackoff: Schema.optionalWith(DurationFromInput, { default: () => Duration.millis(50) }),
  /** Longest retry delay of a claim (default 2 s). */
  maxBackoff: Schema.optionalWith(DurationFromInput, { default: () => Duration.seconds(2) }),
  /**
   * Create the tables when they are missing (default true). False opens existing tables only and writes
   * nothing while opening (`TablesNotFoundError` without them): what an operator's inspection wants.
   */
  create: Schema.optionalWith(Schema.Boolean, { default: () => true })
}) {}

/**
 * Options of `make` and `layer`, as callers write them (`MergeQueueConfig`'s encoded side).
 *
 * @category models
 */
export type Options = typeof MergeQueueConfig.Encoded

const decodeOptions = Options_.classDecoder("MergeQueue.make", MergeQueueConfig)

/**
 * Entries claimed by `nextWithLock`.
 *
 * @category metrics
 */
export const claims = counter("leasehold_merge_queue_claims_total", "Entries claimed by nextWithLock")

/**
 * Expired processing locks cleared by recovery.
 *
 * @category metrics
 */
export const locksCleaned = counter("leasehold_merge_queue_locks_cleaned_total", "Expired processing locks cleared")

/**
 * In-progress entries returned to pending by recovery.
 *
 * @category metrics
 */
export const entriesReclaimed = counter(
  "leasehold_merge_queue_entries_reclaimed_total",
  "In-progress entries returned to pending by recovery"
)

/**
 * Best-effort recoveries before a claim that failed (the claim went on).
 *
 * @category metrics
 */
export const recoveryFailures = counter(
  "leasehold_merge_queue_recovery_failures_total",
  "Best-effort recoveries before a claim that failed (the claim went on)"
)

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
   * Recovers stale work (best effort: a failure is logged and counted), then
   * takes the lock and claims the next pending entry. `None` when the lock is
   * held by another live agent (found with one read, no write) or nothing is
   * pending. An agent that still owns
   * an in-progress entry under its live lock gets that entry back. Busy
   * databases and conflicts are retried with capped exponential backoff.
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
  /** Entries in queue order (priority, then age), optionally of some statuses only. */
  readonly list: (options?: {
    readonly status?: ReadonlyArray<Status> | undefined
    readonly limit?: number | undefined
  }) => Store<ReadonlyArray<QueueEntry>>
  readonly stats: Store<QueueStats>
  /** Audit rows in the order they happened, optionally for one entry. */
  readonly auditLog: (options?: {
    readonly entryId?: number | undefined
    readonly limit?: number | undefined
  }) => Store<ReadonlyArray<AuditRecord>>
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

interface EntryRow {
  readonly id: number | string
  readonly workspace: string
  readonly bead_id: string | null
  readonly priority: number | string
  readonly status: string
  readonly agent_id: string | null
  readonly fencing_token: number | string | null
  readonly started_at: number | string | null
  readonly state_changed_at: number | string
  readonly created_at: number | string
  readonly attempt_count: number | string
  readonly last_error: string | null
}

interface LockRow {
  readonly agent_id: string | null
  readonly acquired_at: number | string | null
  readonly expires_at: number | string | null
  readonly fencing_token: number | string
}

interface AuditRow {
  readonly id: number | string
  readonly at: number | string
  readonly action: string
  readonly agent_id: string | null
  readonly entry_id: number | string | null
  readonly fencing_token: number | string | null
  readonly from_status: string | null
  readonly to_status: string | null
  readonly detail: string | null
}

const millis = (value: number | string) => DateTime.unsafeMake(Number(value))
const optionalNumber = (value: number | string | null) => value === null ? Option.none() : Option.some(Number(value))

const toEntry = (row: EntryRow): QueueEntry => ({
  id: Number(row.id),
  workspace: row.workspace,
  beadId: Option.fromNullable(row.bead_id),
  priority: Number(row.priority),
  status: row.status as Status,
  agentId: Option.fromNullable(row.agent_id),
  fencingToken: optionalNumber(row.fencing_token),
  startedAt: row.started_at === null ? Option.none() : Option.some(millis(row.started_at)),
  stateChangedAt: millis(row.state_changed_at),
  createdAt: millis(row.created_at),
  attemptCount: Number(row.attempt_count),
  lastError: Option.fromNullable(row.last_error)
})

const toClaim = (row: EntryRow, token: number): Claim => ({ ...toEntry(row), token })

/** A hold's token, checked: a safe non-negative integer. */
const tokenOf = (hold: LockHold): Either.Either<number, InvalidParameterError> =>
  typeof hold === "object" && hold !== null && Number.isSafeInteger(hold.token) && hold.token >= 0
    ? Either.right(hold.token)
    : Either.left(
      new InvalidParameterError({
        parameter: "token",
        value: (hold as Partial<LockHold> | null)?.token,
        reason: "must be the fencing token of a claim or a lock hold (a non-negative integer)"
      })
    )

const toLock = (row: LockRow | undefined): Option.Option<ProcessingLock> =>
  row === undefined || row.agent_id === null
    ? Option.none()
    : Option.some({
      agentId: row.agent_id,
      acquiredAt: millis(row.acquired_at!),
      expiresAt: millis(row.expires_at!),
      fencingToken: Number(row.fencing_token)
    })

const toAudit = (row: AuditRow): AuditRecord => ({
  id: Number(row.id),
  at: millis(row.at),
  action: row.action as AuditAction,
  agentId: Option.fromNullable(row.agent_id),
  entryId: optionalNumber(row.entry_id),
  fencingToken: optionalNumber(row.fencing_token),
  fromStatus: Option.fromNullable(row.from_status as Status | null),
  toStatus: Option.fromNullable(row.to_status as Status | null),
  detail: Option.fromNullable(row.detail)
})

/** A lock that is held and has not passed its expiry (it expires at `expires_at`, not before). */
const isLive = (lock: LockRow, now: number) =>
  lock.agent_id !== null && lock.expires_at !== null && Number(lock.expires_at) >= now

/** Busy databases, serialisation failures, deadlocks and unique conflicts are worth another try. */
const retryable = (error: SqlError): boolean => {
  const cause = error.cause as { readonly code?: unknown; readonly message?: unknown } | undefined
  const code = String(cause?.code ?? "")
  const text = `${String(cause?.message ?? "")} ${error.message}`
  return ["40001", "40P01", "23505", "55P03", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CONSTRAINT_UNIQUE"].includes(
    code
  ) ||
    /database is locked|database table is locked|UNIQUE constraint|could not serialize|deadlock/i.test(text)
}

const agent = (agentId: string): Either.Either<string, InvalidParameterError> =>
  typeof agentId === "string" && agentId.trim().length > 0
    ? Either.right(agentId)
    : Either.left(
      new InvalidParameterError({ parameter: "agentId", value: agentId, reason: "must be a non-empty string" })
    )

const positiveDuration = (parameter: string, input: Duration.DurationInput, allowZero: boolean) =>
  Either.flatMap(
    Either.mapLeft(
      Schema.decodeUnknownEither(DurationFromInput)(input),
      (error) =>
        new InvalidParameterError({ parameter, value: input, reason: ParseResult.TreeFormatter.formatErrorSync(error) })
    ),
    (duration) =>
      !allowZero && Duration.isZero(duration)
        ? Either.left(new InvalidParameterError({ parameter, value: input, reason: "must be greater than zero" }))
        : Either.right(duration)
  )

/**
 * Makes a merge queue on the `SqlClient` in the context, creating its tables if needed. Bad options are a
 * `ParseError` naming them.
 *
 * @category constructors
 */
export const make = (
  options?: Options
): Effect.Effect<
  MergeQueueService,
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const config = yield* decodeOptions(options)
    const sql = yield* SqlClient.SqlClient
    const pg = Sql.dialectOf(sql) === "pg"
    const writeTransaction = Sql.writeTransaction(sql)
    const entries = sql(`${config.prefix}merge_queue`)
    const lockTable = sql(`${config.prefix}merge_queue_lock`)
    const audit = sql(`${config.prefix}merge_queue_audit`)
    const lockTimeoutMillis = Duration.toMillis(config.lockTimeout)
    const activeStatuses = sql.in([...inProgress])
    const finalStatuses = sql.in([...terminal])

    const store = (operation: string) => Sql.mapSqlError((cause) => new MergeQueueStoreError({ operation, cause }))

    const migrate = Sql.migrate(sql, `${config.prefix}merge_queue_migrations`, {
      "1_create_merge_queue": Effect.all([
        sql`CREATE TABLE IF NOT EXISTS ${entries} (
          id ${Sql.identityColumn(sql)},
          workspace TEXT NOT NULL,
          bead_id TEXT,
          priority INTEGER NOT NULL,
          status TEXT NOT NULL,
          agent_id TEXT,
          fencing_token BIGINT,
          started_at BIGINT,
          state_changed_at BIGINT NOT NULL,
          created_at BIGINT NOT NULL,
          attempt_count INTEGER NOT NULL DEFAULT 0,
          last_error TEXT)`,
        sql`CREATE INDEX IF NOT EXISTS ${sql(`${config.prefix}merge_queue_order`)}
          ON ${entries} (status, priority, created_at, id)`,
        sql`CREATE UNIQUE INDEX IF NOT EXISTS ${sql(`${config.prefix}merge_queue_workspace`)}
          ON ${entries} (workspace) WHERE status NOT IN ('merged', 'failed_terminal', 'cancelled')`,
        sql`CREATE TABLE IF NOT EXISTS ${lockTable} (
          id INTEGER PRIMARY KEY CHECK (id = 1),
          agent_id TEXT,
          acquired_at BIGINT,
          expires_at BIGINT,
          fencing_token BIGINT NOT NULL DEFAULT 0)`,
        sql`INSERT INTO ${lockTable} (id, fencing_token) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`,
        sql`CREATE TABLE IF NOT EXISTS ${audit} (
          id ${Sql.identityColumn(sql)},
          at BIGINT NOT NULL,
          action TEXT NOT NULL,
          agent_id TEXT,
          entry_id BIGINT,
          fencing_token BIGINT,
          from_status TEXT,
          to_status TEXT,
          detail TEXT)`,
        sql`CREATE INDEX IF NOT EXISTS ${sql(`${config.prefix}merge_queue_audit_entry`)} ON ${audit} (entry_id, id)`
      ], { discard: true })
    }).pipe(
      Effect.mapError((cause) => new MergeQueueStoreError({ operation: "setup", cause })),
      Effect.withSpan("MergeQueue.migrate")
    )
    // An operator's look (`create: false`) writes nothing: the tables must be there already.
    const tables = [
      `${config.prefix}merge_queue`,
      `${config.prefix}merge_queue_lock`,
      `${config.prefix}merge_queue_audit`
    ]
    yield* config.create ? migrate : Effect.flatMap(
      Sql.missingTables(sql, tables).pipe(
        Effect.mapError((cause) => new MergeQueueStoreError({ operation: "setup", cause }))
      ),
      (missing) =>
        missing.length === 0
          ? Effect.void
          : Effect.fail(new TablesNotFoundError({ what: "merge queue tables", prefix: config.prefix, missing }))
    )

    // Lock expiry is judged by the database's clock, read in the statement that reads the lock (every agent,
    // on every machine, by one clock); under TestClock by the test's time.
    const testNow = Sql.testTime(yield* Effect.clock)
    const databaseNow = Sql.databaseNow(sql)
    const nowColumn = () => testNow === undefined ? databaseNow : sql`${testNow()}`

    /** The lock row as it is (no row lock taken), with the time it was read. */
    const readLock = Effect.suspend(() =>
      Effect.map(
        sql<LockRow & { now: number | string }>`SELECT agent_id, acquired_at, expires_at, fencing_token,
          ${nowColumn()} AS now FROM ${lockTable} WHERE id = 1`,
        (rows) => ({ lock: rows[0]!, now: Number(rows[0]!.now) })
      )
    )

    /**
     * Runs `body` in a write transaction that holds the lock row (SQLite: the file's write lock, taken first),
     * with the time read once the lock is held.
     */
    const locked = <A, E>(body: (lock: LockRow, now: number) => Effect.Effect<A, E | SqlError>) =>
      writeTransaction(Effect.gen(function*() {
        const rows = pg
          ? yield* sql<LockRow & { now: number | string }>`SELECT agent_id, acquired_at, expires_at, fencing_token,
              ${nowColumn()} AS now FROM ${lockTable} WHERE id = 1 FOR UPDATE`
          : [(yield* readLock).lock as LockRow & { now: number | string }]
        const row = rows[0]!
        return yield* body(row, Number(row.now))
      }))

    const record = (now: number, action: AuditAction, fields: {
      readonly agentId?: string | null
      readonly entryId?: number | null
      readonly fencingToken?: number | null
      readonly from?: Status | null
      readonly to?: Status | null
      readonly detail?: string | null
    }) =>
      sql`INSERT INTO ${audit} (at, action, agent_id, entry_id, fencing_token, from_status, to_status, detail)
        VALUES (${now}, ${action}, ${fields.agentId ?? null}, ${fields.entryId ?? null}, ${fields.fencingToken ?? null},
          ${fields.from ?? null}, ${fields.to ?? null}, ${fields.detail ?? null})`

    const entryById = (id: number) =>
      Effect.map(sql<EntryRow>`SELECT * FROM ${entries} WHERE id = ${id}`, (rows) => rows[0])

    /**
     * Clears an expired lock and returns uncarried in-progress entries older than `cutoff` to pending. Says what
     * it healed, for the log once the transaction has committed (a rolled-back recovery healed nothing).
     */
    const recover = (lock: LockRow, now: number, cutoff: number, dryRun: boolean) =>
      Effect.gen(function*() {
        const expired = lock.agent_id !== null && !isLive(lock, now)
        const liveToken = isLive(lock, now) ? Number(lock.fencing_token) : -1
        const stale = yield* sql<EntryRow>`SELECT * FROM ${entries}
          WHERE status IN ${activeStatuses} AND (fencing_token IS NULL OR fencing_token <> ${liveToken})
            AND COALESCE(started_at, state_changed_at) < ${cutoff}
          ORDER BY id`
        const stats: RecoveryStats = {
          locksCleaned: expired ? 1 : 0,
          entriesReclaimed: stale.length,
          recoveryTimestamp: DateTime.unsafeMake(now)
        }
        const healed = { stats, now, lock: expired ? lock : undefined, entries: stale }
        if (dryRun) return healed
        if (expired) {
          yield* sql`UPDATE ${lockTable} SET agent_id = NULL, acquired_at = NULL, expires_at = NULL WHERE id = 1`
          yield* record(now, "lock_expired", {
            agentId: lock.agent_id,
            fencingToken: Number(lock.fencing_token),
            detail: `expired at ${lock.expires_at}`
          })
        }
        for (const row of stale) {
          yield* sql`UPDATE ${entries} SET status = 'pending', agent_id = NULL, fencing_token = NULL,
            started_at = NULL, state_changed_at = ${now} WHERE id = ${Number(row.id)}`
          yield* record(now, "entry_reclaimed", {
            agentId: row.agent_id,
            entryId: Number(row.id),
            fencingToken: optionalNumber(row.fencing_token).pipe(Option.getOrNull),
            from: row.status as Status,
            to: "pending"
          })
        }
        return healed
      })

    /** Counts and logs (at warning level: work was lost or delayed) what a committed recovery healed. */
    const reportRecovery = (healed: Effect.Effect.Success<ReturnType<typeof recover>>) =>
      Effect.gen(function*() {
        const { entries: reclaimed, lock, now, stats } = healed
        yield* Metric.incrementBy(locksCleaned, stats.locksCleaned)
        yield* Metric.incrementBy(entriesReclaimed, stats.entriesReclaimed)
        const ago = (at: number | string | null) =>
          at === null ? "an unknown time" : Duration.format(Duration.millis(Math.max(0, now - Number(at))))
        if (lock !== undefined) {
          yield* Effect.logWarning(
            `Stale processing lock cleared: held by "${lock.agent_id}" (fencing token ${lock.fencing_token}) for ` +
              `${ago(lock.acquired_at)}, expired ${ago(lock.expires_at)} ago`
          )
        }
        for (const row of reclaimed) {
          yield* Effect.logWarning(
            `Entry ${row.id} (${row.workspace}) returned to pending: ${row.status} by ` +
              `${row.agent_id === null ? "no agent" : `"${row.agent_id}"`} for ` +
              `${ago(row.started_at ?? row.state_changed_at)}, no live lock carries it`
          )
        }
      }).pipe(Effect.annotateLogs({ module: "MergeQueue" }))

    const detectAndRecoverStale: Store<RecoveryStats> = locked((lock, now) => recover(lock, now, now + 1, false)).pipe(
      Effect.tap(reportRecovery),
      Effect.map((healed) => healed.stats),
      store("detectAndRecoverStale"),
      Effect.withSpan("MergeQueue.detectAndRecoverStale")
    )

    const getRecoveryStats: Store<RecoveryStats> = Effect.gen(function*() {
      const { lock, now } = yield* readLock
      return (yield* recover(lock, now, now + 1, true)).stats
    }).pipe(store("getRecoveryStats"))

    const reclaimStale: MergeQueueService["reclaimStale"] = (threshold) =>
      Either.match(positiveDuration("threshold", threshold, true), {
        onLeft: Effect.fail,
        onRight: (duration) =>
          locked((lock, now) => recover(lock, now, now - Duration.toMillis(duration), false)).pipe(
            Effect.tap(reportRecovery),
            Effect.map((healed) => healed.stats.entriesReclaimed),
            store("reclaimStale")
          )
      })

    /** Takes the lock for `agentId` inside a `locked` transaction; the new token, or undefined when another holds it. */
    const takeLock = (lock: LockRow, now: number, agentId: string, newToken: boolean) =>
      Effect.gen(function*() {
        if (isLive(lock, now) && lock.agent_id !== agentId) return undefined
        const token = newToken || lock.agent_id !== agentId
          ? Number(lock.fencing_token) + 1
          : Number(lock.fencing_token)
        if (lock.agent_id !== null && lock.agent_id !== agentId) {
          yield* record(now, "lock_expired", {
            agentId: lock.agent_id,
            fencingToken: Number(lock.fencing_token),
            detail: `expired at ${lock.expires_at}; taken over by ${agentId}`
          })
        }
        yield* sql`UPDATE ${lockTable} SET agent_id = ${agentId}, acquired_at = ${now},
          expires_at = ${now + lockTimeoutMillis}, fencing_token = ${token} WHERE id = 1`
        yield* record(now, "lock_acquired", { agentId, fencingToken: token })
        return token
      })

    const acquireProcessingLock: MergeQueueService["acquireProcessingLock"] = (agentId) =>
      Either.match(agent(agentId), {
        onLeft: Effect.fail,
        onRight: () =>
          locked((lock, now) =>
            Effect.map(
              takeLock(lock, now, agentId, false),
              (token): Option.Option<LockHold> => token === undefined ? Option.none() : Option.some({ token })
            )
          ).pipe(store("acquireProcessingLock"))
      })

    const claimNext = (agentId: string) =>
      locked((lock, now) =>
        Effect.gen(function*() {
          if (isLive(lock, now) && lock.agent_id === agentId) {
            const own = yield* sql<EntryRow>`SELECT * FROM ${entries}
              WHERE status IN ${activeStatuses} AND fencing_token = ${Number(lock.fencing_token)}`
            if (own[0] !== undefined) return Option.some(toClaim(own[0], Number(lock.fencing_token)))
          } else if (isLive(lock, now)) {
            return Option.none()
          }
          const next = yield* sql<EntryRow>`SELECT * FROM ${entries} WHERE status = 'pending'
            ORDER BY priority, created_at, id LIMIT 1`
          if (next[0] === undefined) return Option.none()
          const token = (yield* takeLock(lock, now, agentId, true))!
          const id = Number(next[0].id)
          const claimed = yield* sql<EntryRow>`UPDATE ${entries} SET status = 'claimed', agent_id = ${agentId},
            fencing_token = ${token}, started_at = ${now}, state_changed_at = ${now},
            attempt_count = attempt_count + 1
            WHERE id = ${id} AND status = 'pending' RETURNING *`
          yield* record(now, "claimed", { agentId, entryId: id, fencingToken: token, from: "pending", to: "claimed" })
          return Option.some(toClaim(claimed[0]!, token))
        })
      )

    const nextWithLock: MergeQueueService["nextWithLock"] = (agentId) =>
      Either.match(agent(agentId), {
        onLeft: Effect.fail,
        onRight: () => {
          const recovery = detectAndRecoverStale.pipe(
            Effect.catchAll((error) =>
              Effect.zipRight(
                Metric.increment(recoveryFailures),
                Effect.logWarning("Automatic merge queue recovery failed; claiming anyway", error)
              )
            )
          )
          const schedule = Schedule.exponential(config.initialBackoff, 2).pipe(
            Schedule.union(Schedule.spaced(config.maxBackoff)),
            Schedule.intersect(Schedule.recurs(config.maxAttempts - 1))
          )
          // While another agent holds a live lock there is nothing to claim: one read, no write (idle pollers
          // would otherwise queue for SQLite's write lock behind the agent that works).
          const busy = Effect.map(readLock, ({ lock, now }) => isLive(lock, now) && lock.agent_id !== agentId)
          const attempt = Effect.flatMap(
            busy,
            (held) => held ? Effect.succeedNone : Effect.zipRight(recovery, claimNext(agentId))
          )
          return attempt.pipe(
            Effect.retry({ schedule, while: retryable }),
            Effect.tap((claimed) => Option.isSome(claimed) ? Metric.increment(claims) : Effect.void),
            store("nextWithLock"),
            Effect.withSpan("MergeQueue.nextWithLock", { attributes: { agentId } })
          )
        }
      })

    const releaseProcessingLock: MergeQueueService["releaseProcessingLock"] = (hold) =>
      Either.match(tokenOf(hold), {
        onLeft: Effect.fail,
        onRight: (token) =>
          locked((lock, now) =>
            Effect.gen(function*() {
              if (lock.agent_id === null || Number(lock.fencing_token) !== token) return false
              yield* sql`UPDATE ${lockTable} SET agent_id = NULL, acquired_at = NULL, expires_at = NULL WHERE id = 1`
              yield* record(now, "lock_released", { agentId: lock.agent_id, fencingToken: token })
              return true
            })
          ).pipe(store("releaseProcessingLock"))
      })

    const extendLock: MergeQueueService["extendLock"] = (hold, extra) =>
      Either.match(
        Either.flatMap(
          tokenOf(hold),
          (token) => Either.map(positiveDuration("extra", extra, false), (duration) => ({ token, duration }))
        ),
        {
          onLeft: Effect.fail,
          onRight: ({ duration, token }) =>
            locked((lock, now) =>
              Effect.gen(function*() {
                if (Number(lock.fencing_token) !== token || !isLive(lock, now)) return false
                const expiresAt = Math.max(Number(lock.expires_at), now + Duration.toMillis(duration))
                yield* sql`UPDATE ${lockTable} SET expires_at = ${expiresAt} WHERE id = 1`
                yield* record(now, "lock_extended", {
                  agentId: lock.agent_id,
                  fencingToken: token,
                  detail: `until ${expiresAt}`
                })
                return true
              })
            ).pipe(store("extendLock"))
        }
      )

    const getProcessingLock: Store<Option.Option<ProcessingLock>> = Effect.map(readLock, ({ lock }) => toLock(lock))
      .pipe(store("getProcessingLock"))

    const isLockStale: Store<boolean> = Effect.map(
      readLock,
      ({ lock, now }) => lock.agent_id !== null && lock.expires_at !== null && Number(lock.expires_at) < now
    ).pipe(store("isLockStale"))

    const transition: MergeQueueService["transition"] = (entry, status, options) =>
      Effect.gen(function*() {
        const id = typeof entry === "number" ? entry : entry.id
        const claimToken = typeof entry === "number" ? undefined : yield* tokenOf(entry)
        if (!Schema.is(Status)(status)) {
          return yield* new InvalidParameterError({
            parameter: "status",
            value: status,
            reason: `must be one of ${Status.literals.join(", ")}`
          })
        }
        return yield* locked((lock, now) =>
          Effect.gen(function*() {
            const row = yield* entryById(id)
            if (row === undefined) return yield* new EntryNotFoundError({ entryId: id })
            const from = row.status as Status
            const owned = inProgress.includes(from) || inProgress.includes(status) || status === "merged"
            if (owned) {
              // By token, not by agent id: an old incarnation of the same agent holds an old token.
              const lost = (reason: string) =>
                new LockLostError({ entryId: id, ...(claimToken === undefined ? {} : { token: claimToken }), reason })
              if (claimToken === undefined) {
                return yield* lost(`moving a ${from} entry to ${status} needs its claim (the entry and its token)`)
              }
              if (row.fencing_token === null) return yield* lost(`the entry is ${from} and held by no claim`)
              if (Number(row.fencing_token) !== claimToken) {
                return yield* lost(
                  `the claim's fencing token ${claimToken} is stale (the entry is claimed under ${row.fencing_token})`
                )
              }
              if (lock.agent_id === null || Number(lock.fencing_token) !== claimToken) {
                return yield* lost("its processing lock was released or taken over")
              }
              if (!isLive(lock, now)) return yield* lost(`its processing lock expired at ${lock.expires_at}`)
            }
            if (!canTransition(from, status)) {
              return yield* new InvalidTransitionError({ entryId: id, from, to: status })
            }
            const stillActive = inProgress.includes(status)
            const keepStart = status === "pending" ? null : row.started_at
            const moved = yield* sql<EntryRow>`UPDATE ${entries} SET status = ${status}, state_changed_at = ${now},
              agent_id = ${stillActive ? row.agent_id : null},
              fencing_token = ${stillActive ? row.fencing_token : null},
              started_at = ${keepStart === null ? null : Number(keepStart)},
              last_error = ${options?.error ?? row.last_error}
              WHERE id = ${id} RETURNING *`
            yield* record(now, "transition", {
              agentId: row.agent_id,
              entryId: id,
              fencingToken: optionalNumber(row.fencing_token).pipe(Option.getOrNull),
              from,
              to: status,
              detail: options?.error ?? null
            })
            return toEntry(moved[0]!)
          })
        ).pipe(store("transition"))
      })

    const enqueue: MergeQueueService["enqueue"] = (workspace, options) =>
      Effect.gen(function*() {
        if (typeof workspace !== "string" || workspace.trim().length === 0) {
          return yield* new InvalidParameterError({
            parameter: "workspace",
            value: workspace,
            reason: "must be a non-empty string"
          })
        }
        const priority = options?.priority ?? 2
        if (!Number.isSafeInteger(priority)) {
          return yield* new InvalidParameterError({
            parameter: "priority",
            value: priority,
            reason: "must be an integer"
          })
        }
        // A write transaction: on SQLite it waits for the file's write lock rather than read first and fail
        // "database is locked" when another process writes meanwhile.
        return yield* writeTransaction(Effect.gen(function*() {
          const existing = yield* sql<{ id: number | string }>`SELECT id FROM ${entries}
            WHERE workspace = ${workspace} AND status NOT IN ${finalStatuses}`
          if (existing[0] !== undefined) {
            return yield* new AlreadyQueuedError({ workspace, entryId: Number(existing[0].id) })
          }
          const now = Number((yield* sql<{ now: number | string }>`SELECT ${nowColumn()} AS now`)[0]!.now)
          const rows = yield* sql<EntryRow>`INSERT INTO ${entries}
            (workspace, bead_id, priority, status, state_changed_at, created_at)
            VALUES (${workspace}, ${options?.beadId ?? null}, ${priority}, 'pending', ${now}, ${now}) RETURNING *`
          yield* record(now, "enqueued", { entryId: Number(rows[0]!.id), to: "pending", detail: workspace })
          return toEntry(rows[0]!)
        })).pipe(
          // Two processes enqueueing the same workspace at once: the unique index turns the loser away.
          Effect.catchTag("SqlError", (error): Effect.Effect<never, AlreadyQueuedError | SqlError> =>
            retryable(error)
              ? Effect.flatMap(
                sql<{ id: number | string }>`SELECT id FROM ${entries}
                  WHERE workspace = ${workspace} AND status NOT IN ${finalStatuses}`,
                (rows): Effect.Effect<never, AlreadyQueuedError | SqlError> =>
                  rows[0] === undefined
                    ? Effect.fail(error)
                    : Effect.fail(new AlreadyQueuedError({ workspace, entryId: Number(rows[0].id) }))
              )
              : Effect.fail(error)),
          store("enqueue")
        )
      })

    const get = (id: number) =>
      Effect.map(entryById(id), (row) => Option.map(Option.fromNullable(row), toEntry)).pipe(
        store("get")
      )

    const list: MergeQueueService["list"] = (options) =>
      Effect.map(
        sql<EntryRow>`SELECT * FROM ${entries}
          ${options?.status === undefined ? sql`` : sql`WHERE status IN ${sql.in([...options.status])}`}
          ORDER BY priority, created_at, id
          ${options?.limit === undefined ? sql`` : sql`LIMIT ${options.limit}`}`,
        (rows) => rows.map(toEntry)
      ).pipe(store("list"))

    const stats: Store<QueueStats> = Effect.gen(function*() {
      const counts = yield* sql<{ status: string; n: number | string }>`SELECT status, count(*) AS n
        FROM ${entries} GROUP BY status`
      const oldest = yield* sql<{ at: number | string | null }>`SELECT min(created_at) AS at
        FROM ${entries} WHERE status = 'pending'`
      const byStatus = Object.fromEntries(Status.literals.map((status) => [status, 0])) as Record<Status, number>
      for (const row of counts) byStatus[row.status as Status] = Number(row.n)
      return {
        total: counts.reduce((sum, row) => sum + Number(row.n), 0),
        byStatus,
        lock: yield* getProcessingLock,
        oldestPendingAt: oldest[0]?.at === null || oldest[0] === undefined
          ? Option.none()
          : Option.some(millis(oldest[0].at))
      }
    }).pipe(store("stats"))

    const auditLog: MergeQueueService["auditLog"] = (options) =>
      Effect.map(
        sql<AuditRow>`SELECT * FROM ${audit}
          ${options?.entryId === undefined ? sql`` : sql`WHERE entry_id = ${options.entryId}`}
          ORDER BY id
          ${options?.limit === undefined ? sql`` : sql`LIMIT ${options.limit}`}`,
        (rows) => rows.map(toAudit)
      ).pipe(store("auditLog"))

    const extendable = (claim: Claim): Extendable => ({
      id: String(claim.id),
      extendVisibility: (timeout) =>
        Effect.flatMap(
          extendLock(claim, timeout),
          (extended) =>
            extended ? Effect.void : Effect.fail(
              new LockLostError({ entryId: claim.id, token: claim.token, reason: "its processing lock is gone" })
            )
        )
    })

    return {
      config,
      enqueue,
      nextWithLock,
      acquireProcessingLock,
      releaseProcessingLock,
      getProcessingLock,
      extendLock,
      reclaimStale,
      detectAndRecoverStale,
      getRecoveryStats,
      isLockStale,
      transition,
      get,
      list,
      stats,
      auditLog,
      extendable
    } satisfies MergeQueueService
  })

// ---------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------

/**
 * The merge queue on the `SqlClient` in the context.
 *
 * @category layers
 */
export const layer = (
  options?: Options
): Layer.Layer<MergeQueue, MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError, SqlClient.SqlClient> =>
  Layer.effect(MergeQueue, make(options))

/**
 * Options of `layerSqlite`: the queue's and `Database.layerSqlite`'s.
 *
 * @category models
 */
export interface SqliteOptions extends Options {
  readonly filename: string
  /** How long a writer waits for another process's lock (default 5 s, at most 10 min). */
  readonly busyTimeout?: Duration.DurationInput | undefined
}

/**
 * The merge queue in the SQLite file `filename` (`Database.layerSqlite`); also provides the client.
 *
 * @category layers
 */
export const layerSqlite = (
  options: SqliteOptions
): Layer.Layer<
  MergeQueue | SqlClient.SqlClient,
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError
> => {
  const { busyTimeout, filename, ...rest } = options
  return Layer.provideMerge(
    layer(rest),
    Database.layerSqlite({ filename, busyTimeout }).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "DatabaseError"
            ? new MergeQueueStoreError({ operation: `open ${filename}`, cause: error })
            : error
        )
      )
    )
  )
}

/**
 * Options of `layerPg`: the queue's and the server's URL.
 *
 * @category models
 */
export interface PgOptions extends Options {
  /** The server's URL (default: `LEASEHOLD_DATABASE_URL`, else `DATABASE_URL`). */
  readonly url?: Redacted.Redacted | string | undefined
}

/**
 * The merge queue on PostgreSQL at `url`, else `LEASEHOLD_DATABASE_URL` / `DATABASE_URL` (`Database.layerPg`).
 *
 * @category layers
 */
export const layerPg = (
  options?: PgOptions
): Layer.Layer<
  MergeQueue | SqlClient.SqlClient,
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError | ConfigError.ConfigError
> => {
  const { url, ...rest } = options ?? {}
  return Layer.provideMerge(
    layer(rest),
    Database.layerPg({ url, maxConnections: 10, minConnections: 1 }).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "DatabaseError" ? new MergeQueueStoreError({ operation: "connect", cause: error }) : error
        )
      )
    )
  )
}
