/**
 * What the SQL-backed services share: the prefix rule, self-migration that
 * tolerates several processes starting at once, the write-transaction
 * discipline, the database's clock, and the error mapping. No driver is
 * imported here (the clients are `Database`'s).
 */
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import * as Options from "../options.js"

/**
 * The table-prefix rule every SQL service applies. A prefix is spliced into identifiers, so: lower-case
 * letters, digits and underscores, not starting with a digit (PostgreSQL folds unquoted names to lower
 * case, and a prefix with capitals would name tables no statement finds). And short enough that the
 * longest name leasehold derives from it — the dead-letter queue index, `<prefix>mailbox_dead_letters_queue`
 * — fits PostgreSQL's 63 characters: past that PostgreSQL cuts names short, and two can come out the same.
 */
export const prefixRule = {
  pattern: /^[a-z_][a-z0-9_]*$/,
  maxLength: 63 - "mailbox_dead_letters_queue".length
} as const

/** Why `prefix` breaks the prefix rule, or `undefined` when it keeps it. */
export const prefixProblem = (prefix: unknown): string | undefined => {
  if (typeof prefix !== "string" || !prefixRule.pattern.test(prefix)) {
    return "must be lower-case letters, digits and underscores, not starting with a digit"
  }
  if (prefix.length > prefixRule.maxLength) {
    return `must be at most ${prefixRule.maxLength} characters (PostgreSQL cuts names past 63 characters)`
  }
  return undefined
}

/** The `prefix` option of every SQL service, decoded by the prefix rule (default `leasehold_`). */
export const Prefix = Schema.optionalWith(Options.ruledString(prefixProblem), {
  exact: true,
  default: () => "leasehold_"
})

/** Turns a driver's `SqlError` into the service's own error, leaving other failures as they are. */
export const mapSqlError =
  <F>(wrap: (cause: SqlError) => F) =>
  <A, E, R>(effect: Effect.Effect<A, E | SqlError, R>): Effect.Effect<A, Exclude<E, SqlError> | F, R> =>
    Effect.catchIf(
      effect,
      (error): error is SqlError => (error as { readonly _tag?: unknown } | undefined)?._tag === "SqlError",
      (cause) => Effect.fail(wrap(cause))
    ) as Effect.Effect<A, Exclude<E, SqlError> | F, R>

/**
 * Several processes running `CREATE … IF NOT EXISTS` at once can still collide in PostgreSQL's catalog
 * ("duplicate key … pg_type_typname_nsp_index", "relation already exists"); running the statement again
 * then finds the object and succeeds. Retries only that collision, a few times.
 */
export const retryCreateRace = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.retry(effect, {
    times: 5,
    schedule: Schedule.spaced("100 millis"),
    while: (error) => {
      const cause = error as { readonly _tag?: unknown; readonly cause?: { code?: unknown; message?: unknown } }
      if (cause?._tag !== "SqlError") return false
      const code = String(cause.cause?.code ?? "")
      return code === "23505" || code === "42P07" || /already exists|pg_type_typname_nsp_index/.test(
        String(cause.cause?.message ?? "")
      )
    }
  })

/** The two dialects leasehold writes statements for. */
export type Dialect = "pg" | "sqlite"

export const dialectOf = (sql: SqlClient.SqlClient): Dialect =>
  sql.onDialectOrElse({ pg: () => "pg" as const, orElse: () => "sqlite" as const })

/**
 * The row-lock clause of a `SELECT` that a write transaction reads before it writes: `FOR UPDATE` on
 * PostgreSQL; nothing on SQLite, whose `writeTransaction` holds the file's write lock already.
 */
export const forUpdate = (sql: SqlClient.SqlClient): Statement.Fragment =>
  dialectOf(sql) === "pg" ? sql`FOR UPDATE` : sql``

const immediateTransactions = new WeakMap<
  SqlClient.SqlClient,
  <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | SqlError, R>
>()

/**
 * Runs `effect` in a transaction that is going to write. On SQLite it begins with `BEGIN IMMEDIATE`: the
 * write lock is taken first and waited for (the busy timeout), where a plain `BEGIN` reads first and then
 * fails at once ("database is locked") when another process holds the lock by the time it writes — SQLite
 * does not wait to upgrade a read lock. On PostgreSQL a transaction as usual (the statements lock rows).
 * Nested calls become savepoints, as with `withTransaction`.
 */
export const writeTransaction =
  (sql: SqlClient.SqlClient) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> => {
    if (dialectOf(sql) === "pg") return sql.withTransaction(effect)
    let immediate = immediateTransactions.get(sql)
    if (immediate === undefined) {
      immediate = SqlClient.makeWithTransaction({
        transactionTag: SqlClient.TransactionConnection,
        spanAttributes: [],
        acquireConnection: Effect.flatMap(
          Scope.make(),
          (scope) => Effect.map(Scope.extend(sql.reserve, scope), (conn) => [scope, conn] as const)
        ),
        begin: (conn) => conn.executeUnprepared("BEGIN IMMEDIATE", [], undefined),
        savepoint: (conn, id) => conn.executeUnprepared(`SAVEPOINT effect_sql_${id}`, [], undefined),
        commit: (conn) => conn.executeUnprepared("COMMIT", [], undefined),
        rollback: (conn) => conn.executeUnprepared("ROLLBACK", [], undefined),
        rollbackSavepoint: (conn, id) => conn.executeUnprepared(`ROLLBACK TO SAVEPOINT effect_sql_${id}`, [], undefined)
      })
      immediateTransactions.set(sql, immediate)
    }
    return immediate(effect)
  }

/**
 * The database's clock in epoch milliseconds as a statement runs: PostgreSQL's statement time (one value for
 * the whole statement), SQLite's 'now' (one value per statement step). Leases, visibility and lock expiry on a
 * database several machines share are judged by it, never by a client's clock, which drifts.
 */
export const databaseNow = (sql: SqlClient.SqlClient) =>
  dialectOf(sql) === "pg"
    ? sql.literal("(floor(extract(epoch from statement_timestamp()) * 1000))::bigint")
    : sql.literal("CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)")

/**
 * The test's time when `clock` is a `TestClock` (tests drive expiry with `TestClock.adjust` on every backend
 * alike), else `undefined`: the statements then read the database's clock. A clock that is merely wrong (a
 * machine running ahead) is no reason to trust it.
 */
export const testTime = (clock: Clock.Clock): (() => number) | undefined =>
  typeof (clock as { readonly adjust?: unknown }).adjust === "function"
    ? () => clock.unsafeCurrentTimeMillis()
    : undefined

/** Which of `tables` the database does not have (in the current schema on PostgreSQL). */
export const missingTables = (
  sql: SqlClient.SqlClient,
  tables: ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, SqlError> =>
  Effect.map(
    sql.onDialectOrElse({
      pg: () =>
        sql<{ name: string }>`SELECT tablename AS name FROM pg_tables
          WHERE schemaname = current_schema() AND ${sql.in("tablename", tables)}`,
      orElse: () =>
        sql<{ name: string }>`SELECT name FROM sqlite_master WHERE type = 'table' AND ${sql.in("name", tables)}`
    }),
    (rows) => {
      const present = new Set(rows.map((row) => row.name))
      return tables.filter((table) => !present.has(table))
    }
  )

/** An auto-numbered primary key column in either dialect. */
export const identityColumn = (sql: SqlClient.SqlClient) =>
  sql.literal(
    dialectOf(sql) === "pg"
      ? "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
      : "INTEGER PRIMARY KEY AUTOINCREMENT"
  )

/**
 * Runs `migrations` (by name, in order) recorded in `table`. When another
 * process holds the migration, waits until its work is visible instead of
 * failing, so processes may start together on an empty database.
 */
export const migrate = (
  sql: SqlClient.SqlClient,
  table: string,
  migrations: Record<string, Effect.Effect<void, SqlError>>
): Effect.Effect<void, SqlError | Migrator.MigrationError> => {
  const expected = Object.keys(migrations).length
  const run = Migrator.make({})({ table, loader: Migrator.fromRecord(migrations) })
  const latest = sql<{ id: number | string | null }>`SELECT max(migration_id) AS id FROM ${sql(table)}`.pipe(
    Effect.map((rows) => Number(rows[0]?.id ?? 0)),
    Effect.orElseSucceed(() => 0)
  )
  return Effect.zipRight(
    retryCreateRace(Effect.provideService(run, SqlClient.SqlClient, sql)),
    Effect.flatMap(latest, (id) => id >= expected ? Effect.void : Effect.fail("pending" as const)).pipe(
      Effect.retry({ times: 50, schedule: Schedule.spaced("100 millis") }),
      Effect.orElse(() => Effect.void)
    )
  )
}
