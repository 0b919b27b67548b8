/**
 * What the SQL-backed services share: table prefixes, self-migration that
 * tolerates several processes starting at once, and the two database
 * clients with the settings leasehold relies on (SQLite: WAL, `synchronous =
 * NORMAL`, a busy timeout; PostgreSQL: a URL kept `Redacted`, read from the
 * environment when not given).
 */
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import * as Config from "effect/Config"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"

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

/**
 * A SQLite client on `filename` (created if missing) with WAL, `synchronous
 * = NORMAL` (durable across process crashes; a power loss can drop the last
 * commits) and a busy timeout, so processes sharing the file wait for each
 * other. better-sqlite3 throws when the file cannot be opened: that becomes
 * the layer's failure cause.
 */
export const sqliteClient = <E>(
  filename: string,
  busyMillis: number,
  onError: (cause: unknown) => E,
  /** Leave the file's journal mode as it is (an operator's look must not switch a file to WAL). */
  keepJournalMode = false
): Layer.Layer<SqlClient.SqlClient, E> =>
  SqliteClient.layer({ filename, disableWAL: keepJournalMode }).pipe(
    Layer.tap((context) => {
      const sql = Context.get(context, SqlClient.SqlClient)
      return Effect.all([
        sql.unsafe(`PRAGMA busy_timeout = ${Math.round(busyMillis)}`),
        sql`PRAGMA synchronous = NORMAL`
      ], { discard: true })
    }),
    Layer.catchAllCause((cause) => Layer.fail(onError(Cause.squash(cause))))
  )

/** The environment variables a PostgreSQL layer reads when no `url` is given. */
export const databaseUrl: Config.Config<Redacted.Redacted> = Config.redacted("LEASEHOLD_DATABASE_URL").pipe(
  Config.orElse(() => Config.redacted("DATABASE_URL"))
)

/**
 * A PostgreSQL client at `url`, else at `databaseUrl`, whose pool opens
 * `minConnections` connections when the layer starts and keeps them: a new
 * server process costs milliseconds (and its first calls of the mailbox's
 * functions compile them), which a worker pays at start rather than on the
 * first burst of messages.
 */
export const pgClient = (
  url: Redacted.Redacted | string | undefined,
  maxConnections: number,
  minConnections: number
): Layer.Layer<SqlClient.SqlClient, SqlError | ConfigError.ConfigError> =>
  PgClient.layerConfig({
    url: url === undefined ? databaseUrl : Config.succeed(typeof url === "string" ? Redacted.make(url) : url),
    maxConnections: Config.succeed(maxConnections),
    minConnections: Config.succeed(minConnections)
  }).pipe(
    Layer.tap((context) => {
      const sql = Context.get(context, SqlClient.SqlClient)
      // Asked for all at once, so the pool has no idle connection to reuse and opens each.
      return Effect.all(Array.from({ length: minConnections }, () => sql`SELECT 1`), {
        concurrency: "unbounded",
        discard: true
      })
    })
  )
