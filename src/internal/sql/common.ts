/**
 * What the SQL-backed services share: the prefix rule, self-migration that
 * tolerates several processes starting at once, the write-transaction
 * discipline, the database's clock, and the error mapping. No driver is
 * imported here (the clients are `Database`'s).
 */
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
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

/** Whether `value` is a driver's `SqlError` (by tag: the class may come from another copy of the package). */
export const isSqlError = (value: unknown): value is SqlError =>
  (value as { readonly _tag?: unknown } | undefined)?._tag === "SqlError"

/**
 * Turns a driver's `SqlError` into the service's own error, leaving other failures as they are. A `SqlError`
 * that arrives as a defect is wrapped too: `@effect/sql` dies when a COMMIT or a ROLLBACK fails (a full disk, a
 * dropped connection) and the migrator commits through it; a sick store is a failure to retry, never the
 * death of the loop that met it.
 */
export const mapSqlError =
  <F>(wrap: (cause: SqlError) => F) =>
  <A, E, R>(effect: Effect.Effect<A, E | SqlError, R>): Effect.Effect<A, Exclude<E, SqlError> | F, R> =>
    Effect.catchAllCause(effect, (cause): Effect.Effect<never, Exclude<E, SqlError> | F> => {
      // One branch per shape rather than `Cause.failureOrCause`: this runs on every failed statement only.
      if (cause._tag === "Fail" && isSqlError(cause.error)) return Effect.fail(wrap(cause.error))
      if (cause._tag === "Die" && isSqlError(cause.defect)) return Effect.fail(wrap(cause.defect))
      const failure = Cause.find(
        cause,
        (reason) =>
          (reason._tag === "Fail" && isSqlError(reason.error)) || (reason._tag === "Die" && isSqlError(reason.defect))
            ? Option.some(reason._tag === "Fail" ? reason.error as SqlError : reason.defect as SqlError)
            : Option.none()
      )
      // Interruption stays interruption (a composite cause with a store error in it is that store error).
      return Option.isSome(failure) && !Cause.isInterruptedOnly(cause)
        ? Effect.fail(wrap(failure.value))
        : Effect.failCause(cause as Cause.Cause<Exclude<E, SqlError>>)
    }) as Effect.Effect<A, Exclude<E, SqlError> | F, R>

/**
 * Whether the database refused a statement for its data — what one item of a batched statement can cause, and
 * what nothing of the statement was written after — so its items are worth trying one by one: PostgreSQL's data,
 * integrity, syntax-or-access, limit and PL/pgSQL errors (SQLSTATE classes 22, 23, 42, 54, P0: "unsupported
 * Unicode escape sequence" is 22P05); SQLite's constraint, type, size and generic errors. Never a store that
 * is down, full, busy or locked (one by one would only repeat the wait, or the timeout, per item), nor a
 * connection lost mid-statement (its outcome is unknown: trying again could write twice).
 */
export const isDataError = (error: SqlError): boolean => {
  const code = (error.cause as { readonly code?: unknown } | undefined)?.code
  if (typeof code !== "string") return false
  if (code.startsWith("SQLITE_")) return /^SQLITE_(CONSTRAINT|MISMATCH|TOOBIG|RANGE|ERROR)(_|$)/.test(code)
  return /^(22|23|42|54|P0)[0-9A-Z]{3}$/.test(code)
}

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

/** The statements that open, close and undo a transaction, by dialect. */
const topLevel = {
  pg: { begin: "BEGIN", commit: "COMMIT", undo: ["ROLLBACK"] },
  sqlite: { begin: "BEGIN IMMEDIATE", commit: "COMMIT", undo: ["ROLLBACK"] }
} as const

/** The statements that open, close and undo a savepoint at `depth` (1 and more) inside a transaction. */
const savepointStatements = (depth: number) => ({
  begin: `SAVEPOINT leasehold_${depth}`,
  commit: `RELEASE SAVEPOINT leasehold_${depth}`,
  undo: [`ROLLBACK TO SAVEPOINT leasehold_${depth}`, `RELEASE SAVEPOINT leasehold_${depth}`]
})

/**
 * Runs `effect` in a transaction that is going to write. On SQLite it begins with `BEGIN IMMEDIATE`: the
 * write lock is taken first and waited for (the busy timeout), where a plain `BEGIN` reads first and then
 * fails at once ("database is locked") when another process holds the lock by the time it writes — SQLite
 * does not wait to upgrade a read lock. On PostgreSQL a transaction as usual (the statements lock rows).
 * Nested calls become savepoints, as with `withTransaction`.
 *
 * Unlike `withTransaction`, a COMMIT that fails (a full disk, an I/O error, the connection gone) is the
 * transaction's failure, a `SqlError` — `@effect/sql` makes it a defect, which killed whatever loop met it —
 * and a ROLLBACK is sent after it: SQLite may leave the transaction open after a failed COMMIT, and on its one
 * connection every later statement would then join a transaction nobody commits. A ROLLBACK that fails
 * itself (the transaction was rolled back already, the connection is gone) changes nothing and is ignored.
 *
 * The dialect is read once, when applied to `sql`: a hot path applies it once and keeps the function.
 */
export const writeTransaction = (sql: SqlClient.SqlClient) => {
  const dialect = dialectOf(sql)
  return <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> =>
    Effect.flatMap(
      Effect.serviceOption(SqlClient.TransactionConnection),
      (outer): Effect.Effect<A, E | SqlError, R> =>
        Option.isSome(outer)
          ? writeTransactionOn(dialect, outer.value[0], outer.value[1] + 1)(effect)
          : Effect.scoped(
            Effect.flatMap(sql.reserve, (connection) => writeTransactionOn(dialect, connection, 0)(effect))
          )
    )
}

/**
 * `writeTransaction` on a connection the caller holds already, at `depth` (0: a transaction, more: a savepoint
 * inside the caller's): for code that runs its statements on the connection itself (the merge queue's SQLite
 * calls). `effect` sees the connection as the `TransactionConnection`, so nested writes become savepoints.
 */
export const writeTransactionOn =
  (dialect: Dialect, connection: Connection, depth: number) =>
  <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> => {
    const { begin, commit, undo } = depth === 0 ? topLevel[dialect] : savepointStatements(depth)
    // The driver throws while it builds the statement when its connection is closed (a layer closed under a
    // mailbox still in use): a `SqlError` too, not a defect.
    const run = (text: string) =>
      Effect.flatten(Effect.try({
        try: () => connection.executeUnprepared(text, [], undefined),
        catch: (cause) => new SqlError({ cause, message: "the connection is not open" })
      }))
    const rollback = Effect.ignore(Effect.forEach(undo, run, { discard: true }))
    return Effect.uninterruptibleMask((restore) =>
      Effect.zipRight(
        run(begin),
        Effect.flatMap(
          Effect.exit(restore(Effect.provideService(effect, SqlClient.TransactionConnection, [connection, depth]))),
          (exit): Effect.Effect<A, E | SqlError> =>
            Exit.isSuccess(exit)
              ? Effect.as(Effect.tapError(run(commit), () => rollback), exit.value)
              : Effect.zipRight(rollback, exit)
        )
      )
    )
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
    ? () => Math.round(clock.unsafeCurrentTimeMillis()) // whole milliseconds, as the database's clock gives
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
 * Runs `migrations` (by name, in order) recorded in `table`; answers those this call applied (`[id, name]`).
 * When another process holds the migration, waits until its work is visible instead of failing (and answers
 * none), so processes may start together on an empty database.
 */
export const migrate = (
  sql: SqlClient.SqlClient,
  table: string,
  migrations: Record<string, Effect.Effect<void, SqlError>>
): Effect.Effect<ReadonlyArray<readonly [id: number, name: string]>, SqlError | Migrator.MigrationError> => {
  const expected = Object.keys(migrations).length
  const run = Migrator.make({})({ table, loader: Migrator.fromRecord(migrations) })
  const latest = sql<{ id: number | string | null }>`SELECT max(migration_id) AS id FROM ${sql(table)}`.pipe(
    Effect.map((rows) => Number(rows[0]?.id ?? 0)),
    Effect.orElseSucceed(() => 0)
  )
  // The migrator commits through `withTransaction`, which dies when the COMMIT fails: a failure here.
  const migrated = Effect.catchSomeDefect(
    Effect.provideService(run, SqlClient.SqlClient, sql),
    (defect) => isSqlError(defect) ? Option.some(Effect.fail(defect)) : Option.none()
  )
  return Effect.zipLeft(
    retryCreateRace(migrated),
    Effect.flatMap(latest, (id) => id >= expected ? Effect.void : Effect.fail("pending" as const)).pipe(
      Effect.retry({ times: 50, schedule: Schedule.spaced("100 millis") }),
      Effect.orElse(() => Effect.void)
    )
  )
}
