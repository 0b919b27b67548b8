/**
 * The `--db` option every data command takes: a SQLite file or a
 * `postgres://` URL, opened with the same settings the library's layers use.
 * A missing file or an unreachable server is a `DatabaseUnavailableError`
 * whose message says what to fix; the URL's password never reaches it. A
 * SQLite file is opened as it is (its journal mode untouched), and the
 * commands open existing tables only, so looking never changes a database.
 */
import { Options } from "@effect/cli"
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import { existsSync } from "node:fs"
import * as Sql from "../internal/sql.js"

/** The database could not be opened or reached. */
export class DatabaseUnavailableError extends Schema.TaggedError<DatabaseUnavailableError>()(
  "DatabaseUnavailableError",
  { database: Schema.String, reason: Schema.String }
) {
  override get message(): string {
    return `Cannot use database ${this.database}: ${this.reason}`
  }
}

/** No `--db` and no database URL in the environment: a usage error. */
export class MissingDatabaseError extends Schema.TaggedError<MissingDatabaseError>()("MissingDatabaseError", {}) {
  override get message(): string {
    return "no database given. Pass --db <sqlite file | postgres://…> or set LEASEHOLD_DATABASE_URL."
  }
}

export const db = Options.text("db").pipe(
  Options.withDescription(
    "The database the workers use: a SQLite file (e.g. ./.leasehold/leasehold.db) or a postgres:// URL."
  ),
  Options.optional
)

export const json = Options.boolean("json").pipe(Options.withDescription("Print JSON for scripts instead of a table."))

export const prefix = Options.text("prefix").pipe(
  Options.withDescription("Table name prefix the workers were configured with."),
  Options.withDefault("leasehold_")
)

/** A PostgreSQL URL (the scheme in any case; `pg://` too, as libpq-style tools accept it). */
const isPostgres = (target: string) => /^(postgres(ql)?|pg):\/\//i.test(target)

/**
 * Shows a database target without its secrets: the password of a URL's user part (`//user:pw@`, `//:pw@`)
 * and of any `password=` query parameter, whatever the scheme.
 */
export const redact = (target: string) =>
  /^[a-z][a-z0-9+.-]*:\/\//i.test(target)
    ? target
      .replace(/^([a-z][a-z0-9+.-]*:\/\/[^:@/?#]*):[^@/?#]*@/i, "$1:***@")
      .replace(/([?&][a-z_]*password=)[^&#]*/gi, "$1***")
    : target

/** The client for `--db` (falling back to `LEASEHOLD_DATABASE_URL` / `DATABASE_URL`). */
export const client = (
  target: string | undefined
): Layer.Layer<SqlClient.SqlClient, DatabaseUnavailableError | MissingDatabaseError> => {
  const resolved = target ?? process.env.LEASEHOLD_DATABASE_URL ?? process.env.DATABASE_URL
  if (resolved === undefined || resolved.trim() === "") {
    return Layer.fail(new MissingDatabaseError())
  }
  if (isPostgres(resolved)) {
    return Sql.pgClient(resolved, 2, 1).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          new DatabaseUnavailableError({
            database: redact(resolved),
            reason: `the PostgreSQL server did not answer (${
              String("cause" in error ? (error.cause as Error)?.message ?? error.cause : error)
            }). Check the host, port and credentials, and that the server is running.`
          })
        )
      )
    )
  }
  if (!existsSync(resolved)) {
    return Layer.fail(
      new DatabaseUnavailableError({
        database: resolved,
        reason: "no such file. Pass the SQLite file your workers were started with (leasehold demo uses " +
          "./.leasehold/demo.db)."
      })
    )
  }
  return Sql.sqliteClient(
    resolved,
    5000,
    (cause) =>
      new DatabaseUnavailableError({ database: resolved, reason: `SQLite could not open it (${String(cause)})` }),
    true // an operator's look leaves the file's journal mode alone
  )
}

/** Runs `effect` against `--db`. */
export const withDatabase = (target: string | undefined) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provide(effect, client(target))
