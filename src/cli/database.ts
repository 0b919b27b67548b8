/**
 * The options every data command takes: `--db` — a SQLite file or a
 * PostgreSQL URL (the forms `Database.layerFromEnv` takes), opened with the
 * same settings the library's layers use — `--prefix`, `--json` and a checked
 * `--limit`. A missing file or an unreachable server is a
 * `Database.DatabaseError` whose message says what to fix; a target that
 * names nothing leasehold opens (another scheme, a malformed URL, a missing
 * "file" that reads as a mistyped URL) is a usage error. No password ever
 * reaches a message. A SQLite file is opened as it is (its journal mode
 * untouched), and the commands open existing tables only, so looking never
 * changes a database.
 */
import * as HelpDoc from "@effect/cli/HelpDoc"
import * as Options from "@effect/cli/Options"
import * as ValidationError from "@effect/cli/ValidationError"
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
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

/** A `--db` (or database URL) that names nothing leasehold opens: a usage error. `database` is redacted. */
export class InvalidDatabaseError extends Schema.TaggedError<InvalidDatabaseError>()("InvalidDatabaseError", {
  database: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `Cannot use database ${this.database}: ${this.reason}`
  }
}

export const db = Options.text("db").pipe(
  Options.withDescription(
    "The database the workers use: a SQLite file (e.g. ./.leasehold/leasehold.db, sqlite:PATH, file:PATH) or a " +
      "postgres:// URL (percent-encode / ? # @ % and spaces in its password)."
  ),
  Options.optional
)

export const json = Options.boolean("json").pipe(Options.withDescription("Print JSON for scripts instead of a table."))

export const prefix = Options.text("prefix").pipe(
  Options.withDescription("Table name prefix the workers were configured with."),
  Options.withDefault("leasehold_")
)

/** The largest `--limit` (the operator's queries' own bound). */
const maxLimit = 100_000

/** `--limit`: an integer from 1 to 100000, else a usage error naming the option before anything is opened. */
export const limit = (description: string) =>
  Options.integer("limit").pipe(
    Options.withDescription(`${description} (1 to ${maxLimit}).`),
    Options.mapEffect((value) =>
      Number.isSafeInteger(value) && value >= 1 && value <= maxLimit
        ? Effect.succeed(value)
        : Effect.fail(
          ValidationError.invalidValue(
            HelpDoc.p(`--limit must be an integer from 1 to ${maxLimit}, got ${value}`)
          )
        )
    )
  )

/** Shows a database target without its secrets. */
export const redact = Target.redact

/** The first of `--db`, `LEASEHOLD_DATABASE_URL`, `DATABASE_URL` that is not blank: the target `client` opens. */
export const targetOf = (target: string | undefined): string | undefined =>
  [target, process.env.LEASEHOLD_DATABASE_URL, process.env.DATABASE_URL].find((value) =>
    value !== undefined && value.trim() !== ""
  )?.trim()

/** A name that reads as a mistyped URL (`postgres//host/db`, `me@host:5432/db`) rather than a file's. */
const urlLike = /^[a-z][a-z0-9+.-]*\/\/|^[^/]*@/i

/** The client for `--db` (falling back to `LEASEHOLD_DATABASE_URL` / `DATABASE_URL`). */
export const client = (
  target: string | undefined
): Layer.Layer<
  SqlClient.SqlClient,
  Database.DatabaseError | ParseResult.ParseError | MissingDatabaseError | InvalidDatabaseError
> => {
  const resolved = targetOf(target)
  if (resolved === undefined) return Layer.fail(new MissingDatabaseError())
  const parsed = Target.parse(resolved)
  if (Either.isLeft(parsed)) {
    return Layer.fail(new InvalidDatabaseError({ database: Target.redact(resolved), reason: parsed.left }))
  }
  if (parsed.right._tag === "Postgres") {
    return Database.layerPg({ url: parsed.right.url, maxConnections: 2, minConnections: 1 }).pipe(
      // A URL was given, so no configuration is read: a ConfigError cannot happen.
      Layer.catchAll((error) => error._tag === "ConfigError" ? Layer.die(error) : Layer.fail(error))
    )
  }
  const { filename } = parsed.right
  if (!existsSync(filename) && urlLike.test(filename)) {
    return Layer.fail(
      new InvalidDatabaseError({
        database: Target.redact(resolved),
        reason: "no file by that name, and not a URL leasehold takes: write PostgreSQL as " +
          "postgres://user:password@host:port/database"
      })
    )
  }
  if (!existsSync(filename)) {
    return Layer.fail(
      new Database.DatabaseError({
        database: Target.redact(resolved),
        reason: "no such file. Pass the SQLite file your workers were started with (leasehold demo uses " +
          "./.leasehold/demo.db).",
        cause: undefined
      })
    )
  }
  // An operator's look leaves the file's journal mode alone.
  return Database.layerSqlite({ filename, keepJournalMode: true })
}

/** Runs `effect` against `--db`. */
export const withDatabase = (target: string | undefined) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provide(effect, client(target))
