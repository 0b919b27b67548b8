/**
 * WorkLeaseSql: the WorkLease contract over `SqlClient`, for workers in
 * several processes or on several machines (SQLite in one file, PostgreSQL).
 *
 * Every operation is one transaction that first locks the domain's row —
 * `SELECT … FOR UPDATE` on PostgreSQL; on SQLite the transaction begins with
 * `BEGIN IMMEDIATE`, which takes the file's write lock at once and waits for
 * it (so two processes never fail upgrading a read lock) — then applies the
 * same rules as the STM version. Fencing tokens
 * come from the domain row, so they grow across every process. Terminal
 * offsets use the same low-water-mark retention: processed offsets below the
 * mark are dropped, failed ones are kept. Tables are created on first use,
 * under `prefix` (default `leasehold_`).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import {
  AcquireResult,
  BacklogOrderingError,
  FailResult,
  InvalidOffsetError,
  LeaseNotFoundError,
  StaleFencingTokenError,
  SucceedResult,
  TokenMismatchError,
  type WorkLease
} from "./WorkLease.js"

/**
 * The database failed; the operation did nothing.
 *
 * @category errors
 */
export class WorkLeaseStoreError extends Schema.TaggedError<WorkLeaseStoreError>()("WorkLeaseStoreError", {
  operation: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `WorkLease ${this.operation} failed in the database: ${String(this.cause)}`
  }
}

interface DomainRow {
  readonly lease_offset: number | string | null
  readonly lease_token: string | null
  readonly lease_fencing: number | string | null
  readonly acquired_at: number | string | null
  readonly retry_count: number | string
  readonly fencing_token: number | string
  readonly low_water: number | string
}

const num = (value: number | string | null): number => Number(value)

/**
 * The SQL WorkLease: the contract's operations can also fail with `WorkLeaseStoreError`.
 *
 * @category models
 */
export type SqlWorkLease = WorkLease<WorkLeaseStoreError>

/**
 * Options of `make` and `layer`.
 *
 * @category models
 */
export interface Options {
  /** `fail` gives up once `retryCount >= maxRetries` (default 3; a non-negative integer). */
  readonly maxRetries?: number | undefined
  /** Table name prefix (default `leasehold_`). */
  readonly prefix?: string | undefined
}

const decodeOptions = Options_.decoder("WorkLeaseSql.make", {
  maxRetries: Schema.optionalWith(Options_.NonNegativeInt, { exact: true, default: () => 3 }),
  prefix: Sql.Prefix
})

/**
 * Makes a SQL WorkLease on the `SqlClient` in the context, creating its tables if needed. Bad options are a
 * `ParseError` naming them.
 *
 * @category constructors
 */
export const make = (
  options?: Options
): Effect.Effect<SqlWorkLease, WorkLeaseStoreError | ParseResult.ParseError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const { maxRetries, prefix } = yield* decodeOptions(options)
    const sql = yield* SqlClient.SqlClient
    const domains = sql(`${prefix}work_lease_domains`)
    const backlog = sql(`${prefix}work_lease_backlog`)
    const terminal = sql(`${prefix}work_lease_terminal`)
    const store = (operation: string) => Sql.mapSqlError((cause) => new WorkLeaseStoreError({ operation, cause }))

    // Migrations, recorded in `<prefix>work_lease_migrations` like the other services' (one upgrade path). The
    // first is the schema as it was before migrations were recorded: `IF NOT EXISTS` adopts those tables.
    yield* Sql.migrate(sql, `${prefix}work_lease_migrations`, {
      "1_create_work_lease": Effect.all([
        sql`CREATE TABLE IF NOT EXISTS ${domains} (
        domain_id TEXT PRIMARY KEY,
        lease_offset BIGINT, lease_token TEXT, lease_fencing BIGINT, acquired_at BIGINT,
        retry_count INTEGER NOT NULL DEFAULT 0,
        fencing_token BIGINT NOT NULL DEFAULT 0,
        low_water BIGINT NOT NULL DEFAULT 0)`,
        sql`CREATE TABLE IF NOT EXISTS ${backlog} (
        domain_id TEXT NOT NULL, position BIGINT NOT NULL, item BIGINT NOT NULL,
        PRIMARY KEY (domain_id, item))`,
        sql`CREATE TABLE IF NOT EXISTS ${terminal} (
        domain_id TEXT NOT NULL, item BIGINT NOT NULL, kind TEXT NOT NULL,
        PRIMARY KEY (domain_id, item))`
      ], { discard: true })
    }).pipe(Effect.mapError((cause) => new WorkLeaseStoreError({ operation: "setup", cause })))

    const rowLock = Sql.forUpdate(sql)
    /** Runs `body` in a write transaction holding the domain's row lock (SQLite: the file's write lock). */
    const locked = <A, E>(domainId: string, body: (row: DomainRow) => Effect.Effect<A, E | SqlError>) =>
      Sql.writeTransaction(sql)(Effect.gen(function*() {
        yield* sql`INSERT INTO ${domains} (domain_id) VALUES (${domainId}) ON CONFLICT (domain_id) DO NOTHING`
        const rows = yield* sql<DomainRow>`SELECT * FROM ${domains} WHERE domain_id = ${domainId} ${rowLock}`
        return yield* body(rows[0]!)
      }))

    const head = (domainId: string) =>
      Effect.map(
        sql<
          { item: number | string }
        >`SELECT item FROM ${backlog} WHERE domain_id = ${domainId} ORDER BY position LIMIT 1`,
        (rows) => rows[0] === undefined ? undefined : num(rows[0].item)
      )

    const terminalKind = (domainId: string, offset: number, row: DomainRow) =>
      Effect.map(
        sql<{ kind: string }>`SELECT kind FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset}`,
        (rows) => rows[0]?.kind ?? (offset < num(row.low_water) ? "processed" : undefined)
      )

    /** Records `offset` as terminal, then advances the low-water mark over contiguous terminal offsets. */
    const markTerminal = (domainId: string, offset: number, kind: "processed" | "failed", row: DomainRow) =>
      Effect.gen(function*() {
        yield* sql`INSERT INTO ${terminal} (domain_id, item, kind) VALUES (${domainId}, ${offset}, ${kind})`
        let lowWater = num(row.low_water)
        for (;;) {
          const rows = yield* sql<{ kind: string }>`
            SELECT kind FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${lowWater}`
          if (rows[0] === undefined) break
          if (rows[0].kind === "processed") {
            yield* sql`DELETE FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${lowWater}`
          }
          lowWater++
        }
        return lowWater
      })

    const tryAcquire: SqlWorkLease["tryAcquire"] = (domainId, offset) =>
      Effect.gen(function*() {
        if (!Number.isSafeInteger(offset) || offset < 0) return yield* new InvalidOffsetError({ domainId, offset })
        const token = randomUUID()
        const now = yield* Clock.currentTimeMillis
        return yield* locked(domainId, (row) =>
          Effect.gen(function*() {
            const kind = yield* terminalKind(domainId, offset, row)
            if (kind === "failed") return AcquireResult.AlreadyFailed()
            if (kind === "processed") return AcquireResult.AlreadyProcessed()
            if (row.lease_token !== null) {
              if (num(row.lease_offset) === offset) return AcquireResult.AlreadyAcquired({ token: row.lease_token })
              yield* sql`INSERT INTO ${backlog} (domain_id, position, item)
                SELECT ${domainId}, COALESCE(MAX(position), 0) + 1, ${offset} FROM ${backlog} WHERE domain_id = ${domainId}
                ON CONFLICT (domain_id, item) DO NOTHING`
              return AcquireResult.Enqueued()
            }
            const first = yield* head(domainId)
            if (first !== undefined && first !== offset) {
              return yield* new BacklogOrderingError({ domainId, expected: first, got: offset })
            }
            if (first !== undefined) {
              yield* sql`DELETE FROM ${backlog} WHERE domain_id = ${domainId} AND item = ${offset}`
            }
            const fencingToken = num(row.fencing_token) + 1
            yield* sql`UPDATE ${domains} SET lease_offset = ${offset}, lease_token = ${token},
              lease_fencing = ${fencingToken}, acquired_at = ${now}, retry_count = 0, fencing_token = ${fencingToken}
              WHERE domain_id = ${domainId}`
            return AcquireResult.Acquired({ token, fencingToken })
          }))
      }).pipe(store("tryAcquire"))

    const settle = <A>(
      operation: string,
      domainId: string,
      token: string,
      body: (row: DomainRow, offset: number) => Effect.Effect<A, SqlError>
    ) =>
      locked(domainId, (row): Effect.Effect<A, SqlError | LeaseNotFoundError | TokenMismatchError> => {
        if (row.lease_token === null) return Effect.fail(new LeaseNotFoundError({ domainId }))
        if (row.lease_token !== token) return Effect.fail(new TokenMismatchError({ domainId }))
        return body(row, num(row.lease_offset))
      }).pipe(store(operation))

    const clearLease = (domainId: string, lowWater: number) =>
      sql`UPDATE ${domains} SET lease_offset = NULL, lease_token = NULL, lease_fencing = NULL, acquired_at = NULL,
        retry_count = 0, low_water = ${lowWater} WHERE domain_id = ${domainId}`

    const succeed: SqlWorkLease["succeed"] = (domainId, token) =>
      settle("succeed", domainId, token, (row, offset) =>
        Effect.gen(function*() {
          yield* clearLease(domainId, yield* markTerminal(domainId, offset, "processed", row))
          const next = yield* head(domainId)
          return (next === undefined
            ? SucceedResult.NoBacklog()
            : SucceedResult.NextHint({ offset: next })) as SucceedResult
        }))

    const fail: SqlWorkLease["fail"] = (domainId, token) =>
      settle("fail", domainId, token, (row, offset) =>
        Effect.gen(function*() {
          const retryCount = num(row.retry_count)
          if (retryCount >= maxRetries) {
            yield* clearLease(domainId, yield* markTerminal(domainId, offset, "failed", row))
            const next = yield* head(domainId)
            return (next === undefined
              ? FailResult.GiveUpNoBacklog()
              : FailResult.GiveUpNextHint({ offset: next })) as FailResult
          }
          yield* sql`UPDATE ${domains} SET retry_count = ${retryCount + 1} WHERE domain_id = ${domainId}`
          return FailResult.RetryScheduled({ retryCount: retryCount + 1 }) as FailResult
        }))

    const inspect: SqlWorkLease["inspect"] = (domainId) =>
      Effect.gen(function*() {
        const rows = yield* sql<DomainRow>`SELECT * FROM ${domains} WHERE domain_id = ${domainId}`
        const items = yield* sql<{ item: number | string }>`
          SELECT item FROM ${backlog} WHERE domain_id = ${domainId} ORDER BY position`
        const retained = yield* sql<{ n: number | string }>`
          SELECT COUNT(*) AS n FROM ${terminal} WHERE domain_id = ${domainId}`
        const row = rows[0]
        return {
          lease: row === undefined || row.lease_token === null ? Option.none() : Option.some({
            offset: num(row.lease_offset),
            token: row.lease_token,
            fencingToken: num(row.lease_fencing),
            acquiredAt: DateTime.unsafeMake(num(row.acquired_at)),
            retryCount: num(row.retry_count)
          }),
          backlog: items.map((r) => num(r.item)),
          lowWaterMark: row === undefined ? 0 : num(row.low_water),
          retainedTerminal: num(retained[0]?.n ?? 0)
        }
      }).pipe(store("inspect"))

    const assertCurrent: SqlWorkLease["assertCurrent"] = (domainId, fencingToken) =>
      Effect.gen(function*() {
        const rows = yield* sql<{ lease_fencing: number | string | null }>`
          SELECT lease_fencing FROM ${domains} WHERE domain_id = ${domainId}`
        const current = rows[0]?.lease_fencing
        if (current === null || current === undefined || num(current) !== fencingToken) {
          return yield* new StaleFencingTokenError({
            domainId,
            fencingToken,
            ...(current !== null && current !== undefined ? { current: num(current) } : {})
          })
        }
      }).pipe(store("assertCurrent"))

    return { tryAcquire, succeed, fail, inspect, assertCurrent }
  })

/**
 * The SQL work leases as a service (`layer`).
 *
 * @category services
 */
export class WorkLeaseSql extends Context.Tag("leasehold/WorkLeaseSql")<WorkLeaseSql, SqlWorkLease>() {}

/**
 * The work leases on the `SqlClient` in the context: provide `Database.layerSqlite` / `layerPg` once, and
 * this service shares its pool with the mailboxes and the merge queue.
 *
 * @category layers
 */
export const layer = (
  options?: Options
): Layer.Layer<WorkLeaseSql, WorkLeaseStoreError | ParseResult.ParseError, SqlClient.SqlClient> =>
  Layer.effect(WorkLeaseSql, make(options))
