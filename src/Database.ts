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
import * as Config from "effect/Config"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import { causeText, InvalidParameterError } from "./Errors.js"
import * as Durations from "./internal/duration.js"
import * as Optional from "./internal/optional.js"

/**
 * The drivers, loaded when a layer is built: they are optional peer dependencies (install the one you use),
 * and a missing one is a `DatabaseError` naming the package to install.
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

/** The database could not be opened or reached. `database` is the file, or the URL without its password. */
export class DatabaseError extends Schema.TaggedError<DatabaseError>()("DatabaseError", {
  database: Schema.String,
  reason: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `Cannot use database ${this.database}: ${this.reason}`
  }
}

/** The environment variables `layerPg` reads when no `url` is given, and `layerFromEnv` reads. */
export const databaseUrl: Config.Config<Redacted.Redacted> = Config.redacted("LEASEHOLD_DATABASE_URL").pipe(
  Config.orElse(() => Config.redacted("DATABASE_URL"))
)

/** A PostgreSQL URL: `postgres://`, `postgresql://` or `pg://`, in any case. */
export const isPostgresUrl = (target: string): boolean => /^(postgres(ql)?|pg):\/\//i.test(target)

/**
 * A database target without its secrets: the password of a URL's user part (`//user:pw@`, `//:pw@`) and of
 * any `password=` query parameter, whatever the scheme. A file path is shown as it is.
 */
export const redact = (target: string): string =>
  /^[a-z][a-z0-9+.-]*:\/\//i.test(target)
    ? target
      .replace(/^([a-z][a-z0-9+.-]*:\/\/[^:@/?#]*):[^@/?#]*@/i, "$1:***@")
      .replace(/([?&][a-z_]*password=)[^&#]*/gi, "$1***")
    : target

/** SQLite in `filename` (created if missing). */
export const layerSqlite = (options: {
  readonly filename: string
  /** How long a writer waits for another process's lock (default 5 s, at most 10 min). */
  readonly busyTimeout?: Duration.DurationInput | undefined
  /**
   * Leave the file's journal mode as it is instead of switching it to WAL (default false): what an operator's
   * look at someone else's file wants.
   */
  readonly keepJournalMode?: boolean | undefined
}): Layer.Layer<SqlClient.SqlClient, DatabaseError | InvalidParameterError> => {
  const busy = Durations.parse(options.busyTimeout ?? Duration.seconds(5))
  if (Either.isLeft(busy) || Duration.greaterThan(busy.right, Duration.minutes(10))) {
    return Layer.fail(
      new InvalidParameterError({
        parameter: "busyTimeout",
        value: options.busyTimeout,
        reason: Either.isLeft(busy) ? busy.left : "must be at most 10 minutes"
      })
    )
  }
  const sqliteDriver = driver(
    options.filename,
    ["@effect/sql-sqlite-node", "better-sqlite3"],
    "Database.layerSqlite",
    () => import("@effect/sql-sqlite-node/SqliteClient")
  )
  return Layer.unwrapEffect(
    Effect.map(
      sqliteDriver,
      (SqliteClient) =>
        SqliteClient.layer({ filename: options.filename, disableWAL: options.keepJournalMode === true }).pipe(
          Layer.tap((context) => {
            const sql = Context.get(context, SqlClient.SqlClient)
            return Effect.all([
              sql.unsafe(`PRAGMA busy_timeout = ${Math.round(Duration.toMillis(busy.right))}`),
              sql`PRAGMA synchronous = NORMAL`
            ], { discard: true })
          }),
          // better-sqlite3 throws when the file cannot be opened: that is the failure's cause.
          Layer.catchAllCause((cause) => {
            const error = Cause.squash(cause)
            return Layer.fail(
              new DatabaseError({
                database: options.filename,
                reason: `SQLite could not open it (${causeText(error)})`,
                cause: error
              })
            )
          })
        )
    )
  )
}

/** PostgreSQL at `url`, else at `LEASEHOLD_DATABASE_URL` / `DATABASE_URL`. */
export const layerPg = (options?: {
  readonly url?: Redacted.Redacted | string | undefined
  /** Most connections the pool opens (default 10). */
  readonly maxConnections?: number | undefined
  /** Connections opened when the layer starts and kept open (default 4, or `maxConnections` if fewer). */
  readonly minConnections?: number | undefined
}): Layer.Layer<SqlClient.SqlClient, DatabaseError | InvalidParameterError | ConfigError.ConfigError> => {
  const maxConnections = options?.maxConnections ?? 10
  const minConnections = options?.minConnections ?? Math.min(4, maxConnections)
  if (!(Number.isSafeInteger(maxConnections) && maxConnections > 0)) {
    return Layer.fail(
      new InvalidParameterError({
        parameter: "maxConnections",
        value: maxConnections,
        reason: "must be a positive integer"
      })
    )
  }
  if (!(Number.isSafeInteger(minConnections) && minConnections >= 0 && minConnections <= maxConnections)) {
    return Layer.fail(
      new InvalidParameterError({
        parameter: "minConnections",
        value: minConnections,
        reason: `must be an integer from 0 to maxConnections (${maxConnections})`
      })
    )
  }
  const url = options?.url === undefined
    ? databaseUrl
    : Config.succeed(typeof options.url === "string" ? Redacted.make(options.url) : options.url)
  return Layer.unwrapEffect(Effect.gen(function*() {
    const resolved = yield* url
    const shown = redact(Redacted.value(resolved))
    const PgClient = yield* driver(
      shown,
      ["@effect/sql-pg", "pg"],
      "Database.layerPg",
      () => import("@effect/sql-pg/PgClient")
    )
    return PgClient.layerConfig({
      url: Config.succeed(resolved),
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
      }),
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "ConfigError" ? error : new DatabaseError({
            database: shown,
            reason: `the PostgreSQL server did not answer (${causeText(error)}). ` +
              "Check the host, port and credentials, and that the server is running.",
            cause: error
          })
        )
      )
    )
  }))
}

/**
 * The database `LEASEHOLD_DATABASE_URL` (else `DATABASE_URL`) names: a PostgreSQL URL, or the path of a SQLite
 * file. Without either, a `ConfigError` naming them.
 */
export const layerFromEnv: Layer.Layer<
  SqlClient.SqlClient,
  DatabaseError | InvalidParameterError | ConfigError.ConfigError
> = Layer.unwrapEffect(
  Effect.map(databaseUrl, (target) => {
    const value = Redacted.value(target).trim()
    return isPostgresUrl(value) ? layerPg({ url: target }) : layerSqlite({ filename: value })
  })
)
