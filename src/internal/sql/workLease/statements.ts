/**
 * The work leases' statements, one set per dialect, each call answering with
 * a raw `Outcome` that `WorkLeaseSql` turns into results and typed errors.
 *
 * PostgreSQL: each coordination call is one function call (see `schema.ts`).
 * SQLite: better-sqlite3 runs statements synchronously, so their number is
 * the cost. Each call first runs the one guarded `UPDATE … RETURNING` that
 * answers the common case (an idle domain taking its next offset, a lease
 * settled in order, a retry left): one statement is a transaction of its
 * own, taking the file's write lock as `BEGIN IMMEDIATE` would. When the
 * guard does not hold, the general rules run in a `BEGIN IMMEDIATE`
 * transaction that reads the domain again, so they decide on what is there
 * by then, whatever another process did in between.
 *
 * Lease expiry: a lease expires at `expires_at` when `expires_fencing` is its
 * fencing token (see `schema.ts`); the time is the database's clock read by
 * the statement, or the test's. A takeover is rare, so on SQLite it runs by
 * the general rules — as does its give-up, the same steps as a `fail` that
 * gives up; a renewal is one `UPDATE` (and, when it finds nothing to renew,
 * one read that says why). */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Effect from "effect/Effect"
import * as Sql from "../common.js"
import { staleCondition, tables } from "./schema.js"

/** A column that drivers return as a number or, for `BIGINT` on PostgreSQL, a string. */
type Num = number | string

/** What a coordination call did: its tag (a result's or an error's) and the fields that go with it. */
export interface Outcome {
  readonly tag: string
  /** The lease's token (`Acquired`, `AlreadyAcquired`). */
  readonly token?: string | null | undefined
  /** The fencing token (`Acquired`), the backlog head (`BacklogOrderingError`, `Released`), the retry count. */
  readonly n?: Num | null | undefined
  /** A takeover's: the stale holder's fencing token. */
  readonly stale_fencing?: Num | null | undefined
  /** A takeover's: how long the lease had been stale, in milliseconds. */
  readonly stale_for?: Num | null | undefined
  /** A takeover's: the new lease's retry count, or the stale one's when it gave the offset up (`AlreadyFailed`). */
  readonly retries?: Num | null | undefined
}

/** A domain as `inspect` reads it in one statement; the domain's columns are null when it was never used. */
export interface DomainRow {
  readonly lease_offset: Num | null
  readonly lease_token: string | null
  readonly lease_fencing: Num | null
  readonly acquired_at: Num | null
  readonly retry_count: Num | null
  /** The lease's expiry, if it has one. */
  readonly expires_at: Num | null
  readonly low_water: Num | null
  /** The backlog's offsets in order, as a JSON array (null when empty on PostgreSQL). */
  readonly backlog: string | null
  readonly retained: Num
}

/**
 * When a statement runs. `undefined`: the database's clock, read as it runs (one clock for every machine);
 * a number: a test's `TestClock` time (see `Sql.testTime`).
 */
export type Now = number | undefined

export interface Statements {
  /** `tryAcquire` of a valid offset, with the token a new lease (or a takeover) gets. */
  readonly acquire: (domainId: string, offset: number, token: string, now: Now) => Effect.Effect<Outcome, SqlError>
  /** `succeed` (`fail` false) or `fail`. */
  readonly settle: (domainId: string, token: string, fail: boolean, now: Now) => Effect.Effect<Outcome, SqlError>
  /** `renew`: `Renewed`, or the error's tag. */
  readonly renew: (domainId: string, token: string, now: Now) => Effect.Effect<Outcome, SqlError>
  readonly inspect: (domainId: string) => Effect.Effect<DomainRow, SqlError>
  /** The current lease's fencing token, if any. */
  readonly fencing: (domainId: string) => Effect.Effect<Num | null | undefined, SqlError>
}

/**
 * Statements of `prefix` on `sql`'s dialect; `fail` gives up once the retry count reaches `maxRetries`; leases
 * expire `timeout` milliseconds after they were last renewed (never when `undefined`).
 */
export const make = (
  sql: SqlClient.SqlClient,
  prefix: string,
  maxRetries: number,
  timeout: number | undefined
): Statements =>
  Sql.dialectOf(sql) === "pg" ? pg(sql, prefix, maxRetries, timeout) : sqlite(sql, prefix, maxRetries, timeout)

/** The time `now` in a statement: the database's clock as the statement runs, or the test's. */
const at = (sql: SqlClient.SqlClient, now: Now): Statement.Fragment =>
  now === undefined ? sql`${Sql.databaseNow(sql)}` : sql`CAST(${now} AS BIGINT)`

/** When a lease renewed at `now` expires (NULL: never). `timeout` is a whole number of milliseconds we decoded. */
const expiry = (sql: SqlClient.SqlClient, now: Now, timeout: number | undefined): Statement.Fragment =>
  timeout === undefined ? sql`NULL` : sql`${at(sql, now)} + ${sql.literal(String(timeout))}`

/**
 * `renew` (both dialects): one `UPDATE` that moves the expiry of the lease that `token` holds; when it finds
 * none, one read that says why. Tokens never come back, so that read cannot find the token either. Without a
 * timeout, only the read: the token is checked and nothing changes.
 */
const renew = (sql: SqlClient.SqlClient, prefix: string, timeout: number | undefined): Statements["renew"] => {
  const domains = sql(tables(prefix).domains)
  const why = (domainId: string, token: string) =>
    Effect.map(
      sql<{ lease_token: string | null }>`SELECT lease_token FROM ${domains} WHERE domain_id = ${domainId}`,
      (rows): Outcome => {
        const held = rows[0]?.lease_token
        if (held === null || held === undefined) return { tag: "LeaseNotFoundError" }
        return { tag: held === token ? "Renewed" : "TokenMismatchError" }
      }
    )
  if (timeout === undefined) return (domainId, token) => why(domainId, token)
  return (domainId, token, now) =>
    Effect.flatMap(
      sql<{ expires_at: Num }>`UPDATE ${domains} SET expires_at = ${expiry(sql, now, timeout)},
        expires_fencing = lease_fencing
      WHERE domain_id = ${domainId} AND lease_token = ${token} RETURNING expires_at`,
      (rows) => rows.length > 0 ? Effect.succeed({ tag: "Renewed" }) : why(domainId, token)
    )
}

/** The lease's expiry as `inspect` shows it: only the lease's own. */
const expiresAt = (sql: SqlClient.SqlClient) =>
  sql`CASE WHEN d.expires_fencing = d.lease_fencing THEN d.expires_at END AS expires_at`

const fencing = (sql: SqlClient.SqlClient, prefix: string): Statements["fencing"] => (domainId) =>
  Effect.map(
    sql<{ lease_fencing: Num | null }>`SELECT lease_fencing FROM ${
      sql(tables(prefix).domains)
    } WHERE domain_id = ${domainId}`,
    (rows) => rows[0]?.lease_fencing
  )

const pg = (sql: SqlClient.SqlClient, prefix: string, maxRetries: number, timeout: number | undefined): Statements => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  const databaseNow = Sql.databaseNow(sql)
  const one = (rows: ReadonlyArray<Outcome>) => rows[0]!
  return {
    acquire: (domainId, offset, token, now) =>
      Effect.map(
        sql<Outcome>`SELECT o_tag AS tag, o_token AS token, o_number AS n, o_stale_fencing AS stale_fencing,
          o_stale_for AS stale_for, o_retries AS retries
        FROM ${sql(names.acquire)}(${domainId}::text, ${offset}::bigint, ${token}::text,
          ${now === undefined ? databaseNow : now}::bigint, ${timeout ?? null}::bigint, ${maxRetries}::integer)`,
        one
      ),
    settle: (domainId, token, fail, now) =>
      Effect.map(
        sql<Outcome>`SELECT o_tag AS tag, o_number AS n FROM ${sql(names.settle)}(
          ${domainId}::text, ${token}::text, ${fail}::boolean, ${maxRetries}::integer,
          ${now === undefined ? databaseNow : now}::bigint, ${timeout ?? null}::bigint)`,
        one
      ),
    renew: renew(sql, prefix, timeout),
    inspect: (domainId) =>
      Effect.map(
        sql<DomainRow>`SELECT d.lease_offset, d.lease_token, d.lease_fencing, d.acquired_at, d.retry_count,
          ${expiresAt(sql)}, d.low_water,
          (SELECT json_agg(b.item ORDER BY b.position) FROM ${backlog} b WHERE b.domain_id = ${domainId})::text
            AS backlog,
          (SELECT count(*) FROM ${terminal} t WHERE t.domain_id = ${domainId}) AS retained
        FROM (SELECT 1) AS one LEFT JOIN ${domains} d ON d.domain_id = ${domainId}`,
        (rows) => rows[0]!
      ),
    fencing: fencing(sql, prefix)
  }
}

interface SqliteDomain {
  readonly lease_offset: Num | null
  readonly lease_token: string | null
  readonly retry_count: Num
  readonly low_water: Num
}

const sqlite = (
  sql: SqlClient.SqlClient,
  prefix: string,
  maxRetries: number,
  timeout: number | undefined
): Statements => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  const databaseNow = Sql.databaseNow(sql)
  const transaction = Sql.writeTransaction(sql)
  const head = (domainId: string): Statement.Fragment =>
    sql`(SELECT item FROM ${backlog} WHERE domain_id = ${domainId} ORDER BY position LIMIT 1)`

  /** Takes the lease when `guard` holds (given the domain's row exists): its new fencing token, if taken. */
  const take = (domainId: string, offset: number, token: string, now: Now, guard: Statement.Fragment) =>
    Effect.map(
      sql<{ fencing_token: Num }>`UPDATE ${domains} SET lease_offset = ${offset}, lease_token = ${token},
        lease_fencing = fencing_token + 1, acquired_at = ${now === undefined ? databaseNow : now}, retry_count = 0,
        fencing_token = fencing_token + 1, expires_at = ${
        expiry(sql, now, timeout)
      }, expires_fencing = fencing_token + 1
      WHERE domain_id = ${domainId}${guard} RETURNING fencing_token`,
      (rows) => rows[0]?.fencing_token
    )

  /**
   * Takes a stale lease over: a new token and the next fencing token, one more retry (a failed attempt); the
   * offset and `acquired_at` kept.
   */
  const takeOver = (domainId: string, token: string, now: Now) =>
    Effect.map(
      sql<{ fencing_token: Num; retry_count: Num }>`UPDATE ${domains} SET lease_token = ${token},
        lease_fencing = fencing_token + 1, fencing_token = fencing_token + 1, retry_count = retry_count + 1,
        expires_at = ${expiry(sql, now, timeout)}, expires_fencing = fencing_token + 1
      WHERE domain_id = ${domainId} RETURNING fencing_token, retry_count`,
      (rows) => rows[0]!
    )

  const acquire: Statements["acquire"] = (domainId, offset, token, now) =>
    Effect.flatMap(
      // Idle, nothing queued, the offset not terminal: taken at once.
      take(
        domainId,
        offset,
        token,
        now,
        sql` AND lease_token IS NULL AND low_water <= ${offset}
          AND NOT EXISTS (SELECT 1 FROM ${backlog} WHERE domain_id = ${domainId})
          AND NOT EXISTS (SELECT 1 FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset})`
      ),
      (taken) =>
        taken === undefined
          ? acquireSlow(domainId, offset, token, now)
          : Effect.succeed({ tag: "Acquired", token, n: taken })
    )

  /** `acquire` by the general rules, once the common case's guard did not hold. */
  const acquireSlow = (
    domainId: string,
    offset: number,
    token: string,
    now: Now
  ): Effect.Effect<Outcome, SqlError> =>
    transaction(Effect.gen(function*() {
      const rows = yield* sql<
        SqliteDomain & {
          kind: string | null
          head: Num | null
          lease_fencing: Num | null
          stale: Num | null
          stale_for: Num | null
        }
      >`
        SELECT lease_offset, lease_token, lease_fencing, retry_count, low_water, ${head(domainId)} AS head,
          (SELECT kind FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset}) AS kind,
          ${sql.literal(staleCondition("d", "clock.t"))} AS stale, clock.t - expires_at AS stale_for
        FROM ${domains} AS d, (SELECT ${at(sql, now)} AS t) AS clock WHERE domain_id = ${domainId}`
      const domain = rows[0]
      if (domain === undefined) {
        yield* sql`INSERT INTO ${domains} (domain_id, lease_offset, lease_token, lease_fencing, acquired_at,
          fencing_token, expires_at, expires_fencing)
          VALUES (${domainId}, ${offset}, ${token}, 1, ${now === undefined ? databaseNow : now}, 1, ${
          expiry(sql, now, timeout)
        }, 1)`
        return { tag: "Acquired", token, n: 1 }
      }
      if (domain.kind === "failed") return { tag: "AlreadyFailed" }
      if (domain.kind === "processed" || offset < Number(domain.low_water)) return { tag: "AlreadyProcessed" }
      if (domain.lease_token !== null) {
        if (Number(domain.lease_offset) === offset && Number(domain.stale) === 1) {
          const stale = { stale_fencing: domain.lease_fencing, stale_for: domain.stale_for }
          // Its retries used up: given up, as the stale holder's `fail` would.
          if (Number(domain.retry_count) >= maxRetries) {
            yield* finish(domainId, domain, true)
            return { tag: "AlreadyFailed", ...stale, retries: domain.retry_count }
          }
          const taken = yield* takeOver(domainId, token, now)
          return { tag: "Acquired", token, n: taken.fencing_token, ...stale, retries: taken.retry_count }
        }
        if (Number(domain.lease_offset) === offset) return { tag: "AlreadyAcquired", token: domain.lease_token }
        yield* sql`INSERT INTO ${backlog} (domain_id, position, item)
          SELECT ${domainId}, COALESCE(MAX(position), 0) + 1, ${offset} FROM ${backlog} WHERE domain_id = ${domainId}
          ON CONFLICT (domain_id, item) DO NOTHING`
        return { tag: "Enqueued" }
      }
      if (domain.head !== null && Number(domain.head) !== offset) {
        return { tag: "BacklogOrderingError", n: domain.head }
      }
      if (domain.head !== null) yield* sql`DELETE FROM ${backlog} WHERE domain_id = ${domainId} AND item = ${offset}`
      return { tag: "Acquired", token, n: yield* take(domainId, offset, token, now, sql``) }
    }))

  /** Clears the lease with the low-water mark at `lowWater`: the backlog head. */
  const release = (domainId: string, lowWater: Statement.Fragment, guard: Statement.Fragment) =>
    Effect.map(
      sql<{ head: Num | null }>`UPDATE ${domains} SET lease_offset = NULL, lease_token = NULL, lease_fencing = NULL,
        acquired_at = NULL, retry_count = 0, low_water = ${lowWater}, expires_at = NULL, expires_fencing = NULL
      WHERE domain_id = ${domainId}${guard} RETURNING ${head(domainId)} AS head`,
      (rows) => rows[0]
    )

  /** A retry: counted, and the lease renewed (the holder spoke). */
  const retry = (domainId: string, now: Now, guard: Statement.Fragment) =>
    Effect.map(
      sql<{ retry_count: Num }>`UPDATE ${domains} SET retry_count = retry_count + 1${
        timeout === undefined
          ? sql``
          : sql`, expires_at = ${expiry(sql, now, timeout)}, expires_fencing = lease_fencing`
      }
      WHERE domain_id = ${domainId}${guard} RETURNING retry_count`,
      (rows) => rows[0]?.retry_count
    )

  const settle: Statements["settle"] = (domainId, token, fail, now) =>
    Effect.flatMap(
      fail
        // A retry left.
        ? Effect.map(
          retry(domainId, now, sql` AND lease_token = ${token} AND retry_count < ${maxRetries}`),
          (n): Outcome | undefined => n === undefined ? undefined : { tag: "RetryScheduled", n }
        )
        // Settled in order, the next offset not terminal already: the mark moves by one, nothing is kept.
        : Effect.map(
          release(
            domainId,
            sql`low_water + 1`,
            sql` AND lease_token = ${token} AND lease_offset = low_water
              AND NOT EXISTS (SELECT 1 FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${domains}.low_water + 1)`
          ),
          (released): Outcome | undefined => released === undefined ? undefined : { tag: "Released", n: released.head }
        ),
      (outcome) => outcome === undefined ? settleSlow(domainId, token, fail, now) : Effect.succeed(outcome)
    )

  /** `settle` by the general rules, once the common case's guard did not hold. */
  const settleSlow = (
    domainId: string,
    token: string,
    fail: boolean,
    now: Now
  ): Effect.Effect<Outcome, SqlError> =>
    transaction(Effect.gen(function*() {
      const rows = yield* sql<SqliteDomain>`SELECT lease_offset, lease_token, retry_count, low_water
        FROM ${domains} WHERE domain_id = ${domainId}`
      const domain = rows[0]
      if (domain === undefined || domain.lease_token === null) return { tag: "LeaseNotFoundError" }
      if (domain.lease_token !== token) return { tag: "TokenMismatchError" }
      if (fail && Number(domain.retry_count) < maxRetries) {
        return { tag: "RetryScheduled", n: yield* retry(domainId, now, sql``) }
      }
      return { tag: "Released", n: yield* finish(domainId, domain, fail) }
    }))

  /**
   * Ends `domain`'s lease for good (inside a transaction): its offset processed, or failed when `fail`; the
   * low-water mark moved over contiguous terminal offsets. Returns the backlog head.
   */
  const finish = (domainId: string, domain: SqliteDomain, fail: boolean) =>
    Effect.gen(function*() {
      const offset = Number(domain.lease_offset)
      let lowWater = Number(domain.low_water)
      if (!fail && offset === lowWater) {
        lowWater++
      } else {
        yield* sql`INSERT INTO ${terminal} (domain_id, item, kind)
          VALUES (${domainId}, ${offset}, ${fail ? "failed" : "processed"})`
      }
      // Over contiguous terminal offsets: the processed ones are dropped, the failed ones kept.
      for (;;) {
        const kinds = yield* sql<{ kind: string }>`
          SELECT kind FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${lowWater}`
        if (kinds[0] === undefined) break
        if (kinds[0].kind === "processed") {
          yield* sql`DELETE FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${lowWater}`
        }
        lowWater++
      }
      return (yield* release(domainId, sql`${lowWater}`, sql``))!.head
    })

  return {
    acquire,
    settle,
    renew: renew(sql, prefix, timeout),
    inspect: (domainId) =>
      Effect.map(
        sql<DomainRow>`SELECT d.lease_offset, d.lease_token, d.lease_fencing, d.acquired_at, d.retry_count,
          ${expiresAt(sql)}, d.low_water,
          (SELECT json_group_array(item ORDER BY position) FROM ${backlog} WHERE domain_id = ${domainId}) AS backlog,
          (SELECT count(*) FROM ${terminal} WHERE domain_id = ${domainId}) AS retained
        FROM (SELECT 1) AS one LEFT JOIN ${domains} d ON d.domain_id = ${domainId}`,
        (rows) => rows[0]!
      ),
    fencing: fencing(sql, prefix)
  }
}
