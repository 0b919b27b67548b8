/**
 * WorkLeaseSql: the WorkLease contract over `SqlClient`, for workers in several processes or on several
 * machines (SQLite in one file, PostgreSQL).
 *
 * Each call is one round trip, since everyone queued on a domain waits for it: on PostgreSQL a PL/pgSQL
 * function that locks the domain's row and applies the STM version's rules; on SQLite one guarded
 * `UPDATE … RETURNING` when the common case holds, else the general rules in a write transaction
 * (`Sql.writeTransaction`). Fencing tokens come from the domain row, so they grow across processes; times are
 * the database's clock (the test's under `TestClock`), read in the statement that judges them, so machines whose
 * clocks drift judge a lease alike. A lease's expiry is stored with it, so a process without `leaseTimeout` still
 * takes over a stale lease (a process on the previous release does not). Tables are created on first use under
 * `prefix`, or by `leasehold migrate` with `create: false`.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import type { SchemaVersionError } from "./Errors.js"
import { storableText } from "./internal/names.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import { createFromEnv } from "./internal/sql/version.js"
import * as Schema_ from "./internal/sql/workLease/schema.js"
import * as Statements from "./internal/sql/workLease/statements.js"
import { assemble, LeaseTimeout, timeoutMillis } from "./internal/workLease/assemble.js"
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
} from "./internal/workLease/model.js"

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

const num = (value: number | string | null | undefined): number => Number(value)

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
  /** `fail` gives up once `retryCount >= maxRetries` (default 3; an integer in 0..2147483647, what SQL stores). */
  readonly maxRetries?: number | undefined
  /** Table name prefix (default `leasehold_`). */
  readonly prefix?: string | undefined
  /**
   * A lease not renewed for this long, by the database's clock, is stale, and `tryAcquire` of its offset takes it
   * over (1 ms..24 h; none by default: a lease is its holder's until it settles, as in the seed).
   */
  readonly leaseTimeout?: Duration.DurationInput | undefined
  /**
   * Create or upgrade the tables at start (default true, or `LEASEHOLD_MIGRATE` when set). False runs no
   * migration: the tables must be at the version this release needs (`leasehold migrate` puts them there),
   * else `make` fails with a `SchemaVersionError` saying so.
   */
  readonly create?: boolean | undefined
}

const decodeOptions = Options_.decoder("WorkLeaseSql.make", {
  maxRetries: Schema.optionalWith(Options_.NonNegativeInt32, { exact: true, default: () => 3 }),
  prefix: Sql.Prefix,
  leaseTimeout: LeaseTimeout,
  create: Schema.optionalWith(Schema.Boolean, { exact: true, default: () => true })
})

/**
 * Makes a SQL WorkLease on the `SqlClient` in the context, creating its tables if needed (unless
 * `create: false`). Bad options are a `ParseError` naming them.
 *
 * @category constructors
 */
export const make = (
  options?: Options
): Effect.Effect<
  SqlWorkLease,
  WorkLeaseStoreError | ParseResult.ParseError | SchemaVersionError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const { create, leaseTimeout, maxRetries, prefix } = yield* decodeOptions(yield* createFromEnv(options))
    const sql = yield* SqlClient.SqlClient
    const store = (operation: string) => Sql.mapSqlError((cause) => new WorkLeaseStoreError({ operation, cause }))
    const setupError = (cause: unknown) => new WorkLeaseStoreError({ operation: "setup", cause })
    yield* create
      ? Effect.mapError(Schema_.migrate(sql, prefix), setupError)
      : Effect.catchTag(Schema_.requireMigrated(sql, prefix), "SqlError", (cause) => Effect.fail(setupError(cause)))
    const statements = Statements.make(
      sql,
      prefix,
      maxRetries,
      leaseTimeout === undefined ? undefined : timeoutMillis(leaseTimeout)
    )
    // Under `TestClock` the test's time, else the database's clock (read by the statement as it runs).
    const testNow = Sql.testTime(yield* Effect.clock)

    type Acquisition = readonly [AcquireResult, Takeover | undefined]
    const answer = (result: AcquireResult): Effect.Effect<Acquisition> => Effect.succeed([result, undefined])

    const tryAcquire: Backend<WorkLeaseStoreError>["tryAcquire"] = (domainId, offset) =>
      Effect.suspend((): Effect.Effect<Acquisition, InvalidOffsetError | BacklogOrderingError | SqlError> => {
        if (!Number.isSafeInteger(offset) || offset < 0) {
          return Effect.fail(new InvalidOffsetError({ domainId, offset }))
        }
        return Effect.flatMap(
          statements.acquire(domainId, offset, randomUUID(), testNow?.()),
          (outcome): Effect.Effect<Acquisition, BacklogOrderingError> => {
            /** The takeover (or its give-up, without a fencing token) this outcome tells of, if any. */
            const takeover = (fencingToken: number | undefined): Takeover | undefined =>
              outcome.stale_fencing === null || outcome.stale_fencing === undefined ? undefined : {
                offset,
                staleFencingToken: num(outcome.stale_fencing),
                staleForMillis: num(outcome.stale_for),
                retryCount: num(outcome.retries),
                fencingToken
              }
            switch (outcome.tag) {
              case "Acquired": {
                const fencingToken = num(outcome.n)
                const acquired = AcquireResult.Acquired({ token: outcome.token!, fencingToken })
                return Effect.succeed([acquired, takeover(fencingToken)])
              }
              case "AlreadyAcquired":
                return answer(AcquireResult.AlreadyAcquired({ token: outcome.token! }))
              case "Enqueued":
                return answer(AcquireResult.Enqueued())
              case "AlreadyProcessed":
                return answer(AcquireResult.AlreadyProcessed())
              case "AlreadyFailed":
                return Effect.succeed([AcquireResult.AlreadyFailed(), takeover(undefined)])
              default:
                return Effect.fail(new BacklogOrderingError({ domainId, expected: num(outcome.n), got: offset }))
            }
          }
        )
      }).pipe(store("tryAcquire"))

    /** Settles the lease: `Released` (with the backlog head, if any) or `RetryScheduled`, after the token checks. */
    const settle = (operation: "succeed" | "fail", domainId: string, token: string) =>
      Effect.flatMap(
        // A token no lease can have (a NUL, a lone surrogate) mismatches, as in memory, not fails the statement.
        statements.settle(domainId, storableText(token, 200), operation === "fail", testNow?.()),
        (outcome): Effect.Effect<Statements.Outcome, LeaseNotFoundError | TokenMismatchError> => {
          if (outcome.tag === "LeaseNotFoundError") return Effect.fail(new LeaseNotFoundError({ domainId }))
          if (outcome.tag === "TokenMismatchError") return Effect.fail(new TokenMismatchError({ domainId }))
          return Effect.succeed(outcome)
        }
      ).pipe(store(operation))

    const hint = (outcome: Statements.Outcome) =>
      outcome.n === null || outcome.n === undefined ? undefined : num(outcome.n)

    const succeed: Backend<WorkLeaseStoreError>["succeed"] = (domainId, token) =>
      Effect.map(settle("succeed", domainId, token), (outcome): SucceedResult => {
        const next = hint(outcome)
        return next === undefined ? SucceedResult.NoBacklog() : SucceedResult.NextHint({ offset: next })
      })

    const fail: Backend<WorkLeaseStoreError>["fail"] = (domainId, token) =>
      Effect.map(settle("fail", domainId, token), (outcome): FailResult => {
        if (outcome.tag === "RetryScheduled") return FailResult.RetryScheduled({ retryCount: num(outcome.n) })
        const next = hint(outcome)
        return next === undefined ? FailResult.GiveUpNoBacklog() : FailResult.GiveUpNextHint({ offset: next })
      })

    const renew: Backend<WorkLeaseStoreError>["renew"] = (domainId, token) =>
      Effect.flatMap(
        statements.renew(domainId, storableText(token, 200), testNow?.()),
        (outcome): Effect.Effect<void, LeaseNotFoundError | TokenMismatchError> => {
          if (outcome.tag === "LeaseNotFoundError") return Effect.fail(new LeaseNotFoundError({ domainId }))
          if (outcome.tag === "TokenMismatchError") return Effect.fail(new TokenMismatchError({ domainId }))
          return Effect.void
        }
      ).pipe(store("renew"))

    const inspect: Backend<WorkLeaseStoreError>["inspect"] = (domainId) =>
      Effect.map(statements.inspect(domainId), (row) => ({
        lease: row.lease_token === null ? Option.none() : Option.some({
          offset: num(row.lease_offset),
          token: row.lease_token,
          fencingToken: num(row.lease_fencing),
          acquiredAt: DateTime.unsafeMake(num(row.acquired_at)),
          retryCount: num(row.retry_count),
          expiresAt: row.expires_at === null ? Option.none() : Option.some(DateTime.unsafeMake(num(row.expires_at)))
        }),
        backlog: row.backlog === null ? [] : (JSON.parse(row.backlog) as ReadonlyArray<number>),
        lowWaterMark: num(row.low_water ?? 0),
        retainedTerminal: num(row.retained)
      })).pipe(store("inspect"))

    const assertCurrent: Backend<WorkLeaseStoreError>["assertCurrent"] = (domainId, fencingToken) =>
      Effect.flatMap(
        statements.fencing(domainId),
        (current) =>
          current === null || current === undefined || num(current) !== fencingToken
            ? Effect.fail(
              new StaleFencingTokenError({
                domainId,
                fencingToken,
                ...(current !== null && current !== undefined ? { current: num(current) } : {})
              })
            )
            : Effect.void
      ).pipe(store("assertCurrent"))

    return assemble<WorkLeaseStoreError>({ tryAcquire, succeed, fail, renew, inspect, assertCurrent }, leaseTimeout)
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
): Layer.Layer<WorkLeaseSql, WorkLeaseStoreError | ParseResult.ParseError | SchemaVersionError, SqlClient.SqlClient> =>
  Layer.effect(WorkLeaseSql, make(options))
