/**
 * The `--db` option every data command takes: a SQLite file or a
 * `postgres://` URL, opened with the same settings the library's layers use.
 * A missing file or an unreachable server is a `Database.DatabaseError`
 * whose message says what to fix; the URL's password never reaches it. A
 * SQLite file is opened as it is (its journal mode untouched), and the
 * commands open existing tables only, so looking never changes a database.
 */
import * as Options from "@effect/cli/Options"
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { existsSync } from "node:fs"
import * as Database from "../Database.js"
import * as Target from "../internal/sql/target.js"

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

/** Shows a database target without its secrets. */
export const redact = Target.redact

/** The client for `--db` (falling back to `LEASEHOLD_DATABASE_URL` / `DATABASE_URL`). */
export const client = (
  target: string | undefined
): Layer.Layer<SqlClient.SqlClient, Database.DatabaseError | ParseResult.ParseError | MissingDatabaseError> => {
  const resolved = target ?? process.env.LEASEHOLD_DATABASE_URL ?? process.env.DATABASE_URL
  if (resolved === undefined || resolved.trim() === "") {
    return Layer.fail(new MissingDatabaseError())
  }
  if (Target.isPostgresUrl(resolved)) {
    return Database.layerPg({ url: resolved, maxConnections: 2, minConnections: 1 }).pipe(
      // A URL was given, so no configuration is read: a ConfigError cannot happen.
      Layer.catchAll((error) => error._tag === "ConfigError" ? Layer.die(error) : Layer.fail(error))
    )
  }
  if (!existsSync(resolved)) {
    return Layer.fail(
      new Database.DatabaseError({
        database: resolved,
        reason: "no such file. Pass the SQLite file your workers were started with (leasehold demo uses " +
          "./.leasehold/demo.db).",
        cause: undefined
      })
    )
  }
  // An operator's look leaves the file's journal mode alone.
  return Database.layerSqlite({ filename: resolved, keepJournalMode: true })
}

/** Runs `effect` against `--db`. */
export const withDatabase = (target: string | undefined) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provide(effect, client(target))
