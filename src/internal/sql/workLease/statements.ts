/**
 * The work leases' statements, one set per dialect, each call answering with
 * a raw `Outcome` that `WorkLeaseSql` turns into results and typed errors.
 * The statements of every call are compiled once, at construction
 * (`prepare`): a call only binds its values.
 *
 * PostgreSQL: each coordination call is one function call (see `schema.ts`),
 * `SELECT f(…)` of migration 4's functions, which answer a `text[]`.
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

/** A stand-in for a parameter of a statement that `prepare` compiles. */
type Slot = string & { readonly _Slot: unique symbol }

/** A value of a parameter. */
type Value = string | number | boolean | null

/**
 * Compiles a statement once, at construction, into a runner: `build` makes it with one stand-in per parameter
 * it declares, and each call runs the compiled text with its values bound where the stand-ins were (one value
 * may be used more than once; a parameter that is no stand-in is bound as it was given). A call then builds no
 * fragments and compiles no text — the statements' share of a call's cost that is ours. The text is the one
 * `sql` compiles (identifiers quoted, the dialect's placeholders), and `sql.unsafe` runs it as any statement
 * runs (a span, the connection, the driver's statement cache).
 */
const prepare = <Row extends object>(
  sql: SqlClient.SqlClient,
  build: (...slots: Array<Slot>) => Statement.Statement<Row>
): (...values: ReadonlyArray<Value>) => Statement.Statement<Row> => {
  const slots: ReadonlyArray<unknown> = Array.from({ length: build.length }, (_, i) => `\u0000slot ${i}`)
  const [text, params] = build(...slots as Array<Slot>).compile()
  const order = params.map((param) => slots.indexOf(param))
  return (...values) => sql.unsafe<Row>(text, order.map((index, i) => index < 0 ? params[i] : values[index]))
}

/**
 * The time `now` in a statement: the test's time when `now` is one, else (NULL) the database's clock as the
 * statement runs. One text for both, so a statement compiles once.
 */
const at = (sql: SqlClient.SqlClient, now: Now | Slot): Statement.Fragment =>
  sql`COALESCE(CAST(${now ?? null} AS BIGINT), ${Sql.databaseNow(sql)})`

/** When a lease renewed at `now` expires (NULL: never). `timeout` is a whole number of milliseconds we decoded. */
const expiry = (sql: SqlClient.SqlClient, now: Now | Slot, timeout: number | undefined): Statement.Fragment =>
  timeout === undefined ? sql`NULL` : sql`${at(sql, now)} + ${sql.literal(String(timeout))}`

/**
 * `renew` (both dialects): one `UPDATE` that moves the expiry of the lease that `token` holds; when it finds
 * none, one read that says why. Tokens never come back, so that read cannot find the token either. Without a
 * timeout, only the read: the token is checked and nothing changes.
 */
const renew = (sql: SqlClient.SqlClient, prefix: string, timeout: number | undefined): Statements["renew"] => {
  const domains = sql(tables(prefix).domains)
  const held = prepare(
    sql,
    (domainId) => sql<{ lease_token: string | null }>`SELECT lease_token FROM ${domains} WHERE domain_id = ${domainId}`
  )
  const why = (domainId: string, token: string) =>
    Effect.map(held(domainId), (rows): Outcome => {
      const holder = rows[0]?.lease_token
      if (holder === null || holder === undefined) return { tag: "LeaseNotFoundError" }
      return { tag: holder === token ? "Renewed" : "TokenMismatchError" }
    })
  if (timeout === undefined) return (domainId, token) => why(domainId, token)
  const extend = prepare(
    sql,
    (domainId, token, now) =>
      sql<{ expires_at: Num }>`UPDATE ${domains} SET expires_at = ${expiry(sql, now, timeout)},
        expires_fencing = lease_fencing
      WHERE domain_id = ${domainId} AND lease_token = ${token} RETURNING expires_at`
  )
  return (domainId, token, now) =>
    Effect.flatMap(
      extend(domainId, token, now ?? null),
      (rows) => rows.length > 0 ? Effect.succeed({ tag: "Renewed" }) : why(domainId, token)
    )
}

/** The lease's expiry as `inspect` shows it: only the lease's own. */
const expiresAt = (sql: SqlClient.SqlClient) =>
  sql`CASE WHEN d.expires_fencing = d.lease_fencing THEN d.expires_at END AS expires_at`

const fencing = (sql: SqlClient.SqlClient, prefix: string): Statements["fencing"] => {
  const select = prepare(
    sql,
    (domainId) =>
      sql<{ lease_fencing: Num | null }>`SELECT lease_fencing FROM ${
        sql(tables(prefix).domains)
      } WHERE domain_id = ${domainId}`
  )
  return (domainId) => Effect.map(select(domainId), (rows) => rows[0]?.lease_fencing)
}

const pg = (sql: SqlClient.SqlClient, prefix: string, maxRetries: number, timeout: number | undefined): Statements => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  /** A function's answer: its `text[]` (tag first), in the order its `schema.ts` comment gives. */
  type Answer = { readonly answer: ReadonlyArray<string | null> }
  // `p_now` NULL: the function reads the database's clock. The parameters are untyped: the function has one
  // signature, which types them, and the call plans for less than with casts.
  const acquire = prepare(
    sql,
    (domainId, offset, token, now, limit, retries) =>
      sql<Answer>`SELECT ${
        sql(names.acquireV4)
      }(${domainId}, ${offset}, ${token}, ${now}, ${limit}, ${retries}) AS answer`
  )
  const settle = prepare(
    sql,
    (domainId, token, fail, retries, now, limit) =>
      sql<Answer>`SELECT ${sql(names.settleV4)}(${domainId}, ${token}, ${fail}, ${retries}, ${now}, ${limit}) AS answer`
  )
  const inspect = prepare(
    sql,
    (domainId) =>
      sql<DomainRow>`SELECT d.lease_offset, d.lease_token, d.lease_fencing, d.acquired_at, d.retry_count,
          ${expiresAt(sql)}, d.low_water,
          (SELECT json_agg(b.item ORDER BY b.position) FROM ${backlog} b WHERE b.domain_id = ${domainId})::text
            AS backlog,
          (SELECT count(*) FROM ${terminal} t WHERE t.domain_id = ${domainId}) AS retained
        FROM (SELECT 1) AS one LEFT JOIN ${domains} d ON d.domain_id = ${domainId}`
  )
  return {
    acquire: (domainId, offset, token, now) =>
      Effect.map(acquire(domainId, offset, token, now ?? null, timeout ?? null, maxRetries), (rows): Outcome => {
        const [tag, held, n, staleFencing, staleFor, retries] = rows[0]!.answer
        return { tag: tag!, token: held, n, stale_fencing: staleFencing, stale_for: staleFor, retries }
      }),
    settle: (domainId, token, fail, now) =>
      Effect.map(settle(domainId, token, fail, maxRetries, now ?? null, timeout ?? null), (rows): Outcome => {
        const [tag, n] = rows[0]!.answer
        return { tag: tag!, n }
      }),
    renew: renew(sql, prefix, timeout),
    inspect: (domainId) => Effect.map(inspect(domainId), (rows) => rows[0]!),
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
  const transaction = Sql.writeTransaction(sql)
  const head = (domainId: Slot): Statement.Fragment =>
    sql`(SELECT item FROM ${backlog} WHERE domain_id = ${domainId} ORDER BY position LIMIT 1)`

  /** Takes the lease when `guard` holds (given the domain's row exists): its new fencing token, if taken. */
  const take = (domainId: Slot, offset: Slot, token: Slot, now: Slot, guard: Statement.Fragment) =>
    sql<{ fencing_token: Num }>`UPDATE ${domains} SET lease_offset = ${offset}, lease_token = ${token},
        lease_fencing = fencing_token + 1, acquired_at = ${at(sql, now)}, retry_count = 0,
        fencing_token = fencing_token + 1, expires_at = ${
      expiry(sql, now, timeout)
    }, expires_fencing = fencing_token + 1
      WHERE domain_id = ${domainId}${guard} RETURNING fencing_token`
  // Idle, nothing queued, the offset not terminal: taken at once.
  const takeIdle = prepare(sql, (domainId, offset, token, now) =>
    take(
      domainId,
      offset,
      token,
      now,
      sql` AND lease_token IS NULL AND low_water <= ${offset}
          AND NOT EXISTS (SELECT 1 FROM ${backlog} WHERE domain_id = ${domainId})
          AND NOT EXISTS (SELECT 1 FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset})`
    ))
  const takeAny = prepare(sql, (domainId, offset, token, now) => take(domainId, offset, token, now, sql``))

  /**
   * Takes a stale lease over: a new token and the next fencing token, one more retry (a failed attempt); the
   * offset and `acquired_at` kept.
   */
  const takeOver = prepare(
    sql,
    (domainId, token, now) =>
      sql<{ fencing_token: Num; retry_count: Num }>`UPDATE ${domains} SET lease_token = ${token},
        lease_fencing = fencing_token + 1, fencing_token = fencing_token + 1, retry_count = retry_count + 1,
        expires_at = ${expiry(sql, now, timeout)}, expires_fencing = fencing_token + 1
      WHERE domain_id = ${domainId} RETURNING fencing_token, retry_count`
  )

  /** The domain as the general rules of `acquire` read it, at `now`. */
  const readForAcquire = prepare(sql, (domainId, offset, now) =>
    sql<
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
        FROM ${domains} AS d, (SELECT ${at(sql, now)} AS t) AS clock WHERE domain_id = ${domainId}`)
  const insertDomain = prepare(
    sql,
    (domainId, offset, token, now) =>
      sql`INSERT INTO ${domains} (domain_id, lease_offset, lease_token, lease_fencing, acquired_at,
          fencing_token, expires_at, expires_fencing)
          VALUES (${domainId}, ${offset}, ${token}, 1, ${at(sql, now)}, 1, ${expiry(sql, now, timeout)}, 1)`
  )
  const enqueue = prepare(sql, (domainId, offset) =>
    sql`INSERT INTO ${backlog} (domain_id, position, item)
          SELECT ${domainId}, COALESCE(MAX(position), 0) + 1, ${offset} FROM ${backlog} WHERE domain_id = ${domainId}
          ON CONFLICT (domain_id, item) DO NOTHING`)
  const dequeue = prepare(
    sql,
    (domainId, offset) => sql`DELETE FROM ${backlog} WHERE domain_id = ${domainId} AND item = ${offset}`
  )

  const acquire: Statements["acquire"] = (domainId, offset, token, now) =>
    Effect.flatMap(
      takeIdle(domainId, offset, token, now ?? null),
      (rows) =>
        rows.length === 0
          ? acquireSlow(domainId, offset, token, now)
          : Effect.succeed({ tag: "Acquired", token, n: rows[0]!.fencing_token })
    )

  /** `acquire` by the general rules, once the common case's guard did not hold. */
  const acquireSlow = (
    domainId: string,
    offset: number,
    token: string,
    now: Now
  ): Effect.Effect<Outcome, SqlError> =>
    transaction(Effect.gen(function*() {
      const domain = (yield* readForAcquire(domainId, offset, now ?? null))[0]
      if (domain === undefined) {
        yield* insertDomain(domainId, offset, token, now ?? null)
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
          const taken = (yield* takeOver(domainId, token, now ?? null))[0]!
          return { tag: "Acquired", token, n: taken.fencing_token, ...stale, retries: taken.retry_count }
        }
        if (Number(domain.lease_offset) === offset) return { tag: "AlreadyAcquired", token: domain.lease_token }
        yield* enqueue(domainId, offset)
        return { tag: "Enqueued" }
      }
      if (domain.head !== null && Number(domain.head) !== offset) {
        return { tag: "BacklogOrderingError", n: domain.head }
      }
      if (domain.head !== null) yield* dequeue(domainId, offset)
      return { tag: "Acquired", token, n: (yield* takeAny(domainId, offset, token, now ?? null))[0]?.fencing_token }
    }))

  /** Clears the lease with the low-water mark at `lowWater` when `guard` holds: the backlog head, if cleared. */
  const release = (domainId: Slot, lowWater: Statement.Fragment, guard: Statement.Fragment) =>
    sql<{ head: Num | null }>`UPDATE ${domains} SET lease_offset = NULL, lease_token = NULL, lease_fencing = NULL,
        acquired_at = NULL, retry_count = 0, low_water = ${lowWater}, expires_at = NULL, expires_fencing = NULL
      WHERE domain_id = ${domainId}${guard} RETURNING ${head(domainId)} AS head`
  // Settled in order, the next offset not terminal already: the mark moves by one, nothing is kept.
  const releaseInOrder = prepare(sql, (domainId, token) =>
    release(
      domainId,
      sql`low_water + 1`,
      sql` AND lease_token = ${token} AND lease_offset = low_water
              AND NOT EXISTS (SELECT 1 FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${domains}.low_water + 1)`
    ))
  const releaseTo = prepare(sql, (domainId, lowWater) => release(domainId, sql`${lowWater}`, sql``))

  /** A retry when `guard` holds: counted, and the lease renewed (the holder spoke). */
  const retry = (domainId: Slot, now: Slot, guard: Statement.Fragment) =>
    sql<{ retry_count: Num }>`UPDATE ${domains} SET retry_count = retry_count + 1${
      timeout === undefined
        ? sql``
        : sql`, expires_at = ${expiry(sql, now, timeout)}, expires_fencing = lease_fencing`
    }
      WHERE domain_id = ${domainId}${guard} RETURNING retry_count`
  // A retry left.
  const retryIfLeft = prepare(
    sql,
    (domainId, now, token, retries) =>
      retry(domainId, now, sql` AND lease_token = ${token} AND retry_count < ${retries}`)
  )
  const retryAny = prepare(sql, (domainId, now) => retry(domainId, now, sql``))

  const settle: Statements["settle"] = (domainId, token, fail, now) =>
    Effect.flatMap(
      fail
        ? Effect.map(
          retryIfLeft(domainId, now ?? null, token, maxRetries),
          (rows): Outcome | undefined =>
            rows.length === 0 ? undefined : { tag: "RetryScheduled", n: rows[0]!.retry_count }
        )
        : Effect.map(
          releaseInOrder(domainId, token),
          (rows): Outcome | undefined => rows.length === 0 ? undefined : { tag: "Released", n: rows[0]!.head }
        ),
      (outcome) => outcome === undefined ? settleSlow(domainId, token, fail, now) : Effect.succeed(outcome)
    )

  const readForSettle = prepare(
    sql,
    (domainId) =>
      sql<SqliteDomain>`SELECT lease_offset, lease_token, retry_count, low_water
        FROM ${domains} WHERE domain_id = ${domainId}`
  )

  /** `settle` by the general rules, once the common case's guard did not hold. */
  const settleSlow = (
    domainId: string,
    token: string,
    fail: boolean,
    now: Now
  ): Effect.Effect<Outcome, SqlError> =>
    transaction(Effect.gen(function*() {
      const domain = (yield* readForSettle(domainId))[0]
      if (domain === undefined || domain.lease_token === null) return { tag: "LeaseNotFoundError" }
      if (domain.lease_token !== token) return { tag: "TokenMismatchError" }
      if (fail && Number(domain.retry_count) < maxRetries) {
        return { tag: "RetryScheduled", n: (yield* retryAny(domainId, now ?? null))[0]?.retry_count }
      }
      return { tag: "Released", n: yield* finish(domainId, domain, fail) }
    }))

  const keep = prepare(
    sql,
    (domainId, offset, kind) =>
      sql`INSERT INTO ${terminal} (domain_id, item, kind) VALUES (${domainId}, ${offset}, ${kind})`
  )
  const kindOf = prepare(
    sql,
    (domainId, offset) =>
      sql<{ kind: string }>`SELECT kind FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset}`
  )
  const drop = prepare(
    sql,
    (domainId, offset) => sql`DELETE FROM ${terminal} WHERE domain_id = ${domainId} AND item = ${offset}`
  )

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
        yield* keep(domainId, offset, fail ? "failed" : "processed")
      }
      // Over contiguous terminal offsets: the processed ones are dropped, the failed ones kept.
      for (;;) {
        const kinds = yield* kindOf(domainId, lowWater)
        if (kinds[0] === undefined) break
        if (kinds[0].kind === "processed") yield* drop(domainId, lowWater)
        lowWater++
      }
      return (yield* releaseTo(domainId, lowWater))[0]!.head
    })

  const inspect = prepare(
    sql,
    (domainId) =>
      sql<DomainRow>`SELECT d.lease_offset, d.lease_token, d.lease_fencing, d.acquired_at, d.retry_count,
          ${expiresAt(sql)}, d.low_water,
          (SELECT json_group_array(item ORDER BY position) FROM ${backlog} WHERE domain_id = ${domainId}) AS backlog,
          (SELECT count(*) FROM ${terminal} WHERE domain_id = ${domainId}) AS retained
        FROM (SELECT 1) AS one LEFT JOIN ${domains} d ON d.domain_id = ${domainId}`
  )

  return {
    acquire,
    settle,
    renew: renew(sql, prefix, timeout),
    inspect: (domainId) => Effect.map(inspect(domainId), (rows) => rows[0]!),
    fencing: fencing(sql, prefix)
  }
}
