/**
 * A SQL service's schema version — the highest migration its migrations table (the Migrator's, one per
 * service under the prefix) records — and what a service opened with `create: false` does with it: no
 * migration runs, and a database behind this release is a `SchemaVersionError` at start rather than a
 * statement failing later on a column or function that is not there. `LEASEHOLD_MIGRATE` is the
 * environment's default for `create`, for workers an operator starts from the command line.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Config from "effect/Config"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import { SchemaVersionError } from "../../Errors.js"
import { missingTables } from "./common.js"

/** The environment variable that sets `create`'s default (true: migrate at start; false: check only). */
export const migrateEnv = "LEASEHOLD_MIGRATE"

/** The highest migration `table` records (0 when empty), or `None` when the database has no such table. */
export const versionOf = (
  sql: SqlClient.SqlClient,
  table: string
): Effect.Effect<Option.Option<number>, SqlError> =>
  Effect.flatMap(missingTables(sql, [table]), (missing) =>
    missing.length > 0
      ? Effect.succeed(Option.none())
      : Effect.map(
        sql<{ id: number | string | null }>`SELECT max(migration_id) AS id FROM ${sql(table)}`,
        (rows) => Option.some(Number(rows[0]?.id ?? 0))
      ))

/** One service's migrations table and the version this release needs of it. */
export interface Required {
  readonly service: string
  readonly prefix: string
  readonly table: string
  readonly required: number
}

/**
 * Checks, writing nothing, that the service's tables are at least at the version this release needs: a newer
 * database (a later release migrated it) is fine, as that release keeps what earlier ones call.
 */
export const requireVersion = (
  sql: SqlClient.SqlClient,
  required: Required
): Effect.Effect<void, SqlError | SchemaVersionError> =>
  Effect.flatMap(
    versionOf(sql, required.table),
    (current) =>
      Option.isSome(current) && current.value >= required.required
        ? Effect.void
        : Effect.fail(new SchemaVersionError({ ...required, current: Option.getOrNull(current) }))
  )

const envIssue = Schema.Unknown.annotations({ identifier: migrateEnv }).ast

/**
 * `options` with `create` from `LEASEHOLD_MIGRATE` when the caller left it out (default true): what the
 * caller gave wins. A value that is not a boolean (`true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`) is a
 * `ParseError` naming the variable, like any bad option.
 */
export const createFromEnv = <O>(options: O): Effect.Effect<O, ParseResult.ParseError> => {
  if (options !== undefined && options !== null && !Predicate.isRecord(options)) return Effect.succeed(options)
  if (options != null && (options as { readonly create?: unknown }).create !== undefined) {
    return Effect.succeed(options)
  }
  return Config.boolean(migrateEnv).pipe(
    Config.withDefault(true),
    Effect.map((create) => ({ ...options, create }) as O),
    Effect.catchAll(() =>
      Effect.fail(
        new ParseResult.ParseError({
          issue: new ParseResult.Type(
            envIssue,
            undefined,
            `${migrateEnv} must be true or false (also yes/no, on/off, 1/0)`
          )
        })
      )
    )
  )
}
