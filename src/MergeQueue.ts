/**
 * MergeQueue: a merge queue in SQL (SQLite or PostgreSQL) whose stale processing locks heal themselves, and that
 * never lets a zombie worker write.
 *
 * Entries wait as `pending`, by priority then age. One processing lock serialises the work: `nextWithLock` takes
 * it and claims the next entry atomically, under a fencing token that only grows. An entry stays its agent's
 * while the lock carrying its token is live (`extendLock`, driven by a `Heartbeat` through `LeaseExtender` with
 * `extendable`); a stuck or killed agent loses it when the lock expires, by the database's clock. Recovery
 * (`detectAndRecoverStale`, best effort before a claim) clears an expired lock and returns every in-progress
 * entry not carried by the live lock to `pending`. Ownership is checked in the transaction that writes, so an
 * agent whose lock was reclaimed gets `LockLostError` and changes nothing.
 *
 * Every call is one round trip (a PL/pgSQL function; on SQLite one write transaction), holding the single lock
 * row first, so the audit log's order is the order things happened in. Tables are created on first use under
 * `prefix`, or by `leasehold migrate` with `create: false`.
 *
 * `internal/mergeQueue/`: `model.ts` (the vocabulary and contract, re-exported here), `service.ts` (arguments,
 * retries, errors, metrics), `statements.ts` (one set per dialect; SQLite's compiled once, `compiled.ts`, run on
 * a held connection, `sqliteConnection.ts`), `conditions.ts` (the rules as SQL), `schema.ts`, `recovery.ts`,
 * `rows.ts`, and the leaves `errors.ts`, `metrics.ts`, `statuses.ts`.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type * as ConfigError from "effect/ConfigError"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import type * as Redacted from "effect/Redacted"
import * as Database from "./Database.js"
import type { SchemaVersionError, TablesNotFoundError } from "./Errors.js"
import * as Metrics from "./internal/mergeQueue/metrics.js"
import {
  MergeQueue,
  MergeQueueConfig,
  type MergeQueueService,
  MergeQueueStoreError,
  type Options
} from "./internal/mergeQueue/model.js"
import * as Service from "./internal/mergeQueue/service.js"
import * as Options_ from "./internal/options.js"
import { createFromEnv } from "./internal/sql/version.js"

// The vocabulary and the contract, with their documentation, live in `internal/mergeQueue/model.ts`, a leaf that
// every part of the service imports too.
export {
  AlreadyQueuedError,
  canTransition,
  EntryNotFoundError,
  inProgress,
  InvalidTransitionError,
  LockLostError,
  MergeQueue,
  MergeQueueConfig,
  MergeQueueStoreError,
  Status,
  terminal
} from "./internal/mergeQueue/model.js"
export type {
  AuditAction,
  AuditRecord,
  Claim,
  LockHold,
  MergeQueueService,
  Options,
  ProcessingLock,
  QueueEntry,
  QueueStats,
  RecoveryStats
} from "./internal/mergeQueue/model.js"

const decodeOptions = Options_.classDecoder(
  "MergeQueue.make",
  MergeQueueConfig,
  ({ initialBackoff, maxBackoff }) =>
    Duration.lessThan(maxBackoff, initialBackoff)
      ? { field: "maxBackoff", message: `must be at least initialBackoff (${Duration.format(initialBackoff)})` }
      : undefined
)

/**
 * Entries claimed by `nextWithLock`.
 *
 * @category metrics
 */
export const claims = Metrics.claims

/**
 * Expired processing locks cleared by recovery.
 *
 * @category metrics
 */
export const locksCleaned = Metrics.locksCleaned

/**
 * In-progress entries returned to pending by recovery.
 *
 * @category metrics
 */
export const entriesReclaimed = Metrics.entriesReclaimed

/**
 * Best-effort recoveries before a claim that failed (the claim went on).
 *
 * @category metrics
 */
export const recoveryFailures = Metrics.recoveryFailures

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
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError | SchemaVersionError,
  SqlClient.SqlClient
> => Effect.flatMap(Effect.flatMap(createFromEnv(options), decodeOptions), (config) => Service.make(config))

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
): Layer.Layer<
  MergeQueue,
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError | SchemaVersionError,
  SqlClient.SqlClient
> => Layer.effect(MergeQueue, make(options))

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
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError | SchemaVersionError
> => {
  const { busyTimeout, filename, ...rest } = options ?? {} as SqliteOptions
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
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError | SchemaVersionError | ConfigError.ConfigError
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
