/**
 * `leasehold migrate` and `leasehold status`: the database schema as a deploy
 * step. `migrate` applies every service's pending migrations (the mailbox,
 * the work leases, the merge queue) and prints, per service, the version
 * before and after and the migrations applied; `--dry-run` lists them and
 * changes nothing. `status` prints each service's version against the one
 * this release needs and writes nothing. Exit codes: 0 done (`status`: every
 * service current), 3 `status` found a service not current — behind, not
 * created, or migrated by a newer release —, 1 the database failed, 2 bad
 * arguments.
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { existsSync } from "node:fs"
import * as Database from "../Database.js"
import * as Target from "../internal/sql/target.js"
import type * as Migrations from "../Migrations.js"
import { client, db, json, prefix, redact, targetOf, withDatabase } from "./database.js"
import { print, say, sayJson } from "./output.js"
import { table } from "./table.js"

/** The exit code of `leasehold status` when a service's schema is not the one this release needs. */
export const notCurrentExitCode = 3

/** Loaded when a command runs, so that `--help` does not load the SQL services. */
const module = Effect.promise(() => import("../Migrations.js"))

const version = (value: number | null) => value === null ? "none" : String(value)

/** The command that brings `--db` and `--prefix` up to date, as the operator would type it (no password). */
const migrateLine = (target: Option.Option<string>, tablePrefix: string) => {
  const resolved = targetOf(Option.getOrUndefined(target))
  return `leasehold migrate --db ${resolved === undefined ? "<database>" : redact(resolved)}` +
    (tablePrefix === "leasehold_" ? "" : ` --prefix ${tablePrefix}`)
}

const dryRun = Options.boolean("dry-run").pipe(
  Options.withDescription("List the migrations that would run, and change nothing.")
)

/**
 * The client `migrate` runs on: `--db` as every command opens it, except that a SQLite file that does not
 * exist yet is made (WAL, as a worker's `Database.layerSqlite` makes it) — migrating a new database is a
 * deploy's first step. A dry run never makes one.
 */
const migrationClient = (target: string | undefined, dry: boolean) => {
  const resolved = targetOf(target)
  const parsed = resolved === undefined ? undefined : Target.parse(resolved)
  return !dry && parsed !== undefined && Either.isRight(parsed) && parsed.right._tag === "Sqlite" &&
      !existsSync(parsed.right.filename)
    ? Database.layerSqlite({ filename: parsed.right.filename })
    : client(target)
}

const migrate = Command.make("migrate", { db, json, prefix, dryRun }, (options) =>
  module.pipe(
    Effect.flatMap((Migrations) => Migrations.run({ prefix: options.prefix, dryRun: options.dryRun })),
    Effect.flatMap((results) =>
      options.json
        ? sayJson({ dryRun: options.dryRun, prefix: options.prefix, services: results })
        : say(migrateText(results, options.dryRun))
    ),
    Effect.provide(migrationClient(Option.getOrUndefined(options.db), options.dryRun))
  )).pipe(
    Command.withDescription(
      "Apply every service's pending migrations (mailbox, work lease, merge queue): a deploy step before\n" +
        "starting workers with create: false (LEASEHOLD_MIGRATE=false). --dry-run lists them only."
    )
  )

const migrateText = (results: ReadonlyArray<Migrations.ServiceMigration>, dry: boolean) => {
  // One migration a line: the service's row, then one row for each further migration.
  const rows = results.flatMap((result) => {
    const applied = result.state === "newer"
      ? ["none: migrated by a newer release"]
      : result.applied.length === 0
      ? ["none: up to date"]
      : result.applied
    return applied.map((migration, i) =>
      i === 0 ? [result.service, version(result.from), version(result.to), migration] : ["", "", "", migration]
    )
  })
  const total = results.reduce((sum, result) => sum + result.applied.length, 0)
  const summary = dry
    ? `dry run: ${total} migration${total === 1 ? "" : "s"} would run; nothing was changed.`
    : `${total} migration${total === 1 ? "" : "s"} applied.`
  return `${table(["service", "from", "to", dry ? "would apply" : "applied"], rows)}\n${summary}`
}

const stateText = (status: Migrations.ServiceStatus) => {
  switch (status.state) {
    case "current":
      return "current"
    case "behind":
      return `behind: ${status.pending.length} pending (${status.pending.join(", ")})`
    case "not created":
      return "not created"
    case "newer":
      return `newer than this release (it knows up to ${status.latest})`
  }
}

const status = Command.make("status", { db, json, prefix }, (options) =>
  module.pipe(
    Effect.flatMap((Migrations) => Migrations.status({ prefix: options.prefix })),
    Effect.flatMap((statuses) => {
      const behind = statuses.some((status) => status.state === "behind" || status.state === "not created")
      const newer = statuses.some((status) => status.state === "newer")
      const advice = [
        ...(behind ? [`Run \`${migrateLine(options.db, options.prefix)}\` to bring it up to date.`] : []),
        ...(newer
          ? ["A newer leasehold release migrated this database: upgrade this command to manage its schema."]
          : [])
      ]
      const text = () =>
        [
          table(
            ["service", "version", "latest", "state"],
            statuses.map((
              status
            ) => [status.service, version(status.current), String(status.latest), stateText(status)])
          ),
          ...advice
        ].join("\n")
      return Effect.zipRight(
        print(options.json, { prefix: options.prefix, upToDate: !behind && !newer, services: statuses, advice }, text),
        Effect.sync(() => {
          if (behind || newer) process.exitCode = notCurrentExitCode
        })
      )
    }),
    withDatabase(Option.getOrUndefined(options.db))
  )).pipe(
    Command.withDescription(
      "Each service's schema version against the one this release needs; writes nothing. Exit code 0 when all\n" +
        `are current, ${notCurrentExitCode} when one is behind, not created or newer than this release.`
    )
  )

/** `leasehold migrate`. */
export const migrateCommand = migrate

/** `leasehold status`. */
export const statusCommand = status
