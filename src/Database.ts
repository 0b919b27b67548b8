/**
 * Database: the `SqlClient` every durable service runs on — SQLite in a file
 * (the embedded default, one machine, several processes) or PostgreSQL
 * (several machines) — opened with the settings leasehold relies on.
 *
 * Provide one of these layers once and `MailboxSql`, `WorkLeaseSql` and
 * `MergeQueue` all run on it: one process, one pool (their own `layerSqlite`
 * / `layerPg` conveniences delegate here). SQLite: WAL journal, `synchronous
 * = NORMAL` (durable across process crashes; a power loss can drop the last
 * commits) and a busy timeout, so processes sharing the file wait for each
 * other. PostgreSQL: the URL kept `Redacted` (read from
 * `LEASEHOLD_DATABASE_URL`, else `DATABASE_URL`, when not given), and
 * `minConnections` opened at start so a worker's first calls do not pay for
 * new server processes. A database that cannot be opened is a
 * `DatabaseError` whose message says what to fix, never showing a password.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Config from "effect/Config"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { causeText } from "./internal/errors.js"
import * as Optional from "./internal/optional.js"
import * as Options from "./internal/options.js"
import * as PgPool from "./internal/sql/pgPool.js"
import * as Target from "./internal/sql/target.js"

/**
 * The drivers, loaded when a layer is built: they are optional peer dependencies (install the one you use),
 * and a missing one is a `DatabaseError` giving the line that installs it (`MissingPackageError`'s message).
 */
const driver = <M>(
  database: string,
  packageNames: ReadonlyArray<string>,
  neededBy: string,
  load: () => Promise<M>
) =>
  Optional.load(packageNames, neededBy, load).pipe(
    Effect.mapError((missing) => new DatabaseError({ database, reason: missing.message, cause: missing }))
  )

/**
 * The database could not be opened or reached, or the target names none leasehold opens. `database` is the
 * target without its secrets (the message redacts it again, whoever built the error).
 *
 * @category errors
 */
export class DatabaseError extends Schema.TaggedError<DatabaseError>()("DatabaseError", {
  database: Schema.String,
  reason: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `Cannot use database ${Target.redact(this.database)}: ${this.reason}`
  }
}

/** A target that names nothing leasehold opens: `reason` says why, never quoting it. */
const refused = (target: string, reason: string) =>
  new DatabaseError({ database: Target.redact(target), reason, cause: undefined })

/**
 * The environment variables `layerPg` reads when no `url` is given, and `layerFromEnv` reads.
 *
 * @category config
 */
export const databaseUrl: Config.Config<Redacted.Redacted> = Config.redacted("LEASEHOLD_DATABASE_URL").pipe(
  Config.orElse(() => Config.redacted("DATABASE_URL"))
)

/**
 * Options of `layerSqlite`.
 *
 * @category models
 */
export interface SqliteOptions {
  /** The database file (created if missing). */
  readonly filename: string
  /** How long a writer waits for another process's lock (default 5 s, at most 10 min). */
  readonly busyTimeout?: Duration.DurationInput | undefined
  /**
   * Leave the file's journal mode as it is instead of switching it to WAL (default false): what an operator's
   * look at someone else's file wants.
   */
  readonly keepJournalMode?: boolean | undefined
}

const decodeSqliteOptions = Options.decoder("Database.layerSqlite", {
  filename: Schema.String,
  busyTimeout: Schema.optionalWith(
    Options.duration({ max: Duration.minutes(10), range: "must be at most 10 minutes" }),
    { exact: true, default: () => Duration.seconds(5) }
  ),
  keepJournalMode: Schema.optionalWith(Schema.Boolean, { exact: true, default: () => false })
})

/**
 * SQLite in `filename` (created if missing). Bad options are a `ParseError` naming them.
 *
 * @category layers
 */
export const layerSqlite = (
  options: SqliteOptions
): Layer.Layer<SqlClient.SqlClient, DatabaseError | ParseResult.ParseError> =>
  Layer.unwrapEffect(Effect.map(decodeSqliteOptions(options), sqlite))

/** SQLite with decoded options. */
const sqlite = (options: {
  readonly filename: string
  readonly busyTimeout: Duration.Duration
  readonly keepJournalMode: boolean
}): Layer.Layer<SqlClient.SqlClient, DatabaseError> => {
  const shown = Target.redact(options.filename)
  const sqliteDriver = driver(
    shown,
    ["@effect/sql-sqlite-node", "better-sqlite3"],
    "Database.layerSqlite",
    () => import("@effect/sql-sqlite-node/SqliteClient")
  )
  return Layer.unwrapEffect(
    Effect.map(
      Effect.zip(sqliteDriver, Clock.currentTimeMillis),
      ([SqliteClient, startedAt]) => {
        const open = SqliteClient.layer({ filename: options.filename, disableWAL: options.keepJournalMode }).pipe(
          Layer.tap((context) => {
            const sql = Context.get(context, SqlClient.SqlClient)
            return Effect.all([
              sql.unsafe(`PRAGMA busy_timeout = ${Math.round(Duration.toMillis(options.busyTimeout))}`),
              sql`PRAGMA synchronous = NORMAL`
            ], { discard: true })
          })
        )
        // Opening switches the file to WAL, which needs the file to itself. The driver waits for another process's
        // lock (its own 5 s), but when two processes open a new file at once, each holding the read lock the other
        // must wait out, SQLite fails one "database is locked" at once rather than deadlock (seen once in CI: four
        // processes opening one new file). Opened again until `busyTimeout` has passed since the first try.
        const opened: Layer.Layer<SqlClient.SqlClient, unknown> = Layer.catchAllCause(
          open,
          (cause) =>
            Layer.unwrapEffect(
              Effect.flatMap(Clock.currentTimeMillis, (now) =>
                /database is locked|SQLITE_BUSY/.test(causeText(Cause.squash(cause))) &&
                  now - startedAt < Duration.toMillis(options.busyTimeout)
                  ? Effect.as(Effect.sleep("20 millis"), opened)
                  : Effect.succeed(Layer.failCause(cause)))
            )
        )
        return opened.pipe(
          // better-sqlite3 throws when the file cannot be opened: that is the failure's cause.
          Layer.catchAllCause((cause) => {
            const error = Cause.squash(cause)
            return Layer.fail(
              new DatabaseError({
                database: shown,
                reason: `SQLite could not open it (${Target.scrub(causeText(error), options.filename)})`,
                cause: error
              })
            )
          })
        )
      }
    )
  )
}

/**
 * Options of `layerPg`.
 *
 * @category models
 */
export interface PgOptions {
  /** The server's URL (default: `LEASEHOLD_DATABASE_URL`, else `DATABASE_URL`). */
  readonly url?: Redacted.Redacted | string | undefined
  /** Most connections the pool opens (default 10). */
  readonly maxConnections?: number | undefined
  /** Connections opened when the layer starts and kept open (default 4, or `maxConnections` if fewer). */
  readonly minConnections?: number | undefined
}

const decodePgOptions = Options.decoder(
  "Database.layerPg",
  {
    maxConnections: Schema.optionalWith(Options.PositiveInt, { exact: true, default: () => 10 }),
    minConnections: Schema.optionalWith(
      Options.worded(Schema.Int.pipe(Schema.nonNegative()), () => "must be an integer from 0 to maxConnections"),
      { exact: true }
    )
  },
  ({ maxConnections, minConnections }) =>
    minConnections !== undefined && minConnections > maxConnections
      ? { field: "minConnections", message: `must be an integer from 0 to maxConnections (${maxConnections})` }
      : undefined
)

/**
 * PostgreSQL at `url`, else at `LEASEHOLD_DATABASE_URL` / `DATABASE_URL`. Bad options are a `ParseError`
 * naming them. The URL must be `postgres://`, `postgresql://` or `pg://` and read alike by the driver and by
 * the redaction: percent-encode `/ ? #`, spaces and `%` in the user and password, and `@` after the host; any
 * other URL, or a key=value connection string, is a `DatabaseError` saying so before anything connects.
 *
 * @category layers
 */
export const layerPg = (
  options?: PgOptions
): Layer.Layer<SqlClient.SqlClient, DatabaseError | ParseResult.ParseError | ConfigError.ConfigError> =>
  Layer.unwrapEffect(Effect.map(decodePgOptions(options), ({ maxConnections, minConnections }) =>
    pg({
      url: options?.url,
      maxConnections,
      minConnections: minConnections ?? Math.min(4, maxConnections)
    })))

/** PostgreSQL with decoded options. */
const pg = (options: {
  readonly url: Redacted.Redacted | string | undefined
  readonly maxConnections: number
  readonly minConnections: number
}): Layer.Layer<SqlClient.SqlClient, DatabaseError | ConfigError.ConfigError> => {
  const { maxConnections, minConnections } = options
  const url = options.url === undefined
    ? databaseUrl
    : Config.succeed(typeof options.url === "string" ? Redacted.make(options.url) : options.url)
  return Layer.unwrapEffect(Effect.gen(function*() {
    const resolved = yield* url
    const target = Redacted.value(resolved)
    const shown = Target.redact(target)
    const parsed = Target.parse(target)
    if (Either.isLeft(parsed) || parsed.right._tag !== "Postgres") {
      return yield* refused(
        target,
        Either.isLeft(parsed)
          ? parsed.left
          : "not a PostgreSQL URL: give postgres://user:password@host:port/database (a SQLite file opens with " +
            "Database.layerSqlite)"
      )
    }
    const drivers = yield* driver(shown, ["@effect/sql-pg", "pg"], "Database.layerPg", PgPool.load)
    // The driver's client on a pool of its own whose interrupted statements cancel nothing (`pgPool.ts`).
    return PgPool.layer(drivers, {
      // The URL as checked (without surrounding whitespace).
      url: Redacted.make(parsed.right.url),
      maxConnections,
      minConnections
    }).pipe(
      Layer.tap((context) => {
        const sql = Context.get(context, SqlClient.SqlClient)
        // Asked for all at once, so the pool has no idle connection to reuse and opens each.
        return Effect.all(Array.from({ length: minConnections }, () => sql`SELECT 1`), {
          concurrency: "unbounded",
          discard: true
        })
      }),
      Layer.catchAll((error) =>
        Layer.fail(
          new DatabaseError({
            database: shown,
            reason: `the PostgreSQL server did not answer (${Target.scrub(causeText(error), target)}). ` +
              "Check the host, port and credentials, and that the server is running.",
            cause: error
          })
        )
      )
    )
  }))
}

/**
 * The database `LEASEHOLD_DATABASE_URL` (else `DATABASE_URL`) names, with the default settings (surrounding
 * whitespace ignored):
 *
 * - `postgres://…`, `postgresql://…`, `pg://…`: PostgreSQL (as `layerPg` takes it);
 * - `sqlite:PATH` or `sqlite://PATH`: the SQLite file PATH as written — `sqlite:app.db` and `sqlite://app.db`
 *   are `app.db` in the working directory, `sqlite:///var/lib/app.db` is `/var/lib/app.db`;
 * - `file:PATH`, `file:///PATH`, `file://localhost/PATH` (RFC 8089): the SQLite file PATH;
 * - in both URL forms PATH is percent-decoded (`%20` is a space); a query (`?mode=ro`) or fragment, a
 *   malformed escape, an empty PATH and a `file://` URL naming another host are refused;
 * - anything without a scheme: the path of a SQLite file, as it is (`./backup:1.db` for a name with a colon).
 *
 * Another scheme (`mysql://`, `http://`), a key=value connection string (`host=… password=…`) or a malformed
 * URL is a `DatabaseError` naming the problem (the scheme, say) and never the password. Without either
 * variable, a `ConfigError` naming them.
 *
 * @category layers
 */
export const layerFromEnv: Layer.Layer<SqlClient.SqlClient, DatabaseError | ConfigError.ConfigError> = Layer
  .unwrapEffect(
    Effect.map(databaseUrl, (target) => {
      const value = Redacted.value(target)
      return Either.match(Target.parse(value), {
        onLeft: (reason) => Layer.fail(refused(value, reason)),
        onRight: (parsed) =>
          parsed._tag === "Postgres"
            ? pg({ url: Redacted.make(parsed.url), maxConnections: 10, minConnections: 4 })
            : sqlite({ filename: parsed.filename, busyTimeout: Duration.seconds(5), keepJournalMode: false })
      })
    })
  )
