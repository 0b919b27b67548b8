/**
 * Migrations: the database schema of every SQL service — `MailboxSql`,
 * `WorkLeaseSql`, `MergeQueue` — as an operation of its own, for a deploy
 * step (`leasehold migrate`, or a team's own deploy code) rather than each
 * service migrating itself on first use.
 *
 * Each service keeps its migrations in a table of its own under the prefix
 * (`<prefix>mailbox_migrations`, `<prefix>work_lease_migrations`,
 * `<prefix>merge_queue_migrations`); its schema version is the highest
 * migration that table records, and a release needs the latest one it
 * knows. `run` applies what is pending, service by service (several
 * processes may run it at once: one applies, the others wait for it);
 * `status` reports each service's version and writes nothing. Services
 * opened with `create: false` (or `LEASEHOLD_MIGRATE=false`) run no
 * migration and fail at start with a `SchemaVersionError` when their tables
 * are behind. A database migrated by a newer release is reported as such;
 * processes of this release keep working on it, since migrations keep the
 * functions and columns earlier releases call (docs/operating.md,
 * "Migrations").
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { causeText } from "./internal/errors.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import * as Registry from "./internal/sql/migrations.js"
import { versionOf } from "./internal/sql/version.js"

/**
 * A service whose schema leasehold migrates.
 *
 * @category models
 */
export type Service = Registry.ServiceName

/**
 * The services, in the order `run` migrates them and `status` reports them.
 *
 * @category constants
 */
export const services: ReadonlyArray<Service> = Registry.serviceNames

/**
 * Where a service's schema stands against this release: `current`, `behind` (migrations pending),
 * `not created` (no migrations table), or `newer` (migrated by a later release than this one).
 *
 * @category models
 */
export type State = "current" | "behind" | "not created" | "newer"

/**
 * One service's schema version.
 *
 * @category models
 */
export interface ServiceStatus {
  readonly service: Service
  /** Its migrations table. */
  readonly table: string
  /** The highest migration the table records; null when there is no such table. */
  readonly current: number | null
  /** The latest migration this release knows: the version it needs. */
  readonly latest: number
  readonly state: State
  /** The migrations `run` would apply (`<id>_<what>`), oldest first. */
  readonly pending: ReadonlyArray<string>
}

/**
 * What `run` did (or, with `dryRun`, would do) to one service.
 *
 * @category models
 */
export interface ServiceMigration {
  readonly service: Service
  readonly table: string
  /** The version before (null: not created). */
  readonly from: number | null
  /** The version after (with `dryRun`, the version it would reach). */
  readonly to: number | null
  /** The migrations applied (with `dryRun`, those that would be), oldest first. */
  readonly applied: ReadonlyArray<string>
  /** The state before. */
  readonly state: State
}

/**
 * Options of `run` and `status`.
 *
 * @category models
 */
export interface Options {
  /** Table name prefix (default `leasehold_`): the one the workers use. */
  readonly prefix?: string | undefined
}

/**
 * Options of `run`.
 *
 * @category models
 */
export interface RunOptions extends Options {
  /** List what would be applied and change nothing (default false). */
  readonly dryRun?: boolean | undefined
}

/**
 * The database failed while a service's schema was read or migrated. Migrations that had committed stay
 * (each service's pending migrations run in one transaction), and running again goes on from there.
 *
 * @category errors
 */
export class MigrationStoreError extends Schema.TaggedError<MigrationStoreError>()("MigrationStoreError", {
  service: Schema.String,
  operation: Schema.Literal("status", "migrate"),
  cause: Schema.Defect
}) {
  override get message(): string {
    return `could not ${this.operation === "status" ? "read" : "migrate"} the ${this.service} schema: ${
      causeText(this.cause)
    }`
  }
}

const decodeOptions = Options_.decoder("Migrations.run", {
  prefix: Sql.Prefix,
  dryRun: Schema.optionalWith(Schema.Boolean, { exact: true, default: () => false })
})

const stateOf = (current: number | null, latest: number): State =>
  current === null ? "not created" : current < latest ? "behind" : current > latest ? "newer" : "current"

const statusOf = (sql: SqlClient.SqlClient, entry: Registry.ServiceMigrations) => {
  const names = Object.keys(entry.migrations)
  const latest = Math.max(0, ...names.map(Registry.idOf))
  return versionOf(sql, entry.table).pipe(
    Effect.map((version): ServiceStatus => {
      const current = Option.getOrNull(version)
      return {
        service: entry.service,
        table: entry.table,
        current,
        latest,
        state: stateOf(current, latest),
        pending: names.filter((name) => Registry.idOf(name) > (current ?? 0))
      }
    }),
    Effect.mapError((cause) => new MigrationStoreError({ service: entry.service, operation: "status", cause }))
  )
}

/**
 * Each service's schema version on the `SqlClient` in the context; writes nothing.
 *
 * @category constructors
 */
export const status = (
  options?: Options
): Effect.Effect<ReadonlyArray<ServiceStatus>, MigrationStoreError | ParseResult.ParseError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const { prefix } = yield* decodeOptions(options)
    const sql = yield* SqlClient.SqlClient
    return yield* Effect.forEach(Registry.all(sql, prefix), (entry) => statusOf(sql, entry))
  })

/**
 * Applies every service's pending migrations on the `SqlClient` in the context, in `services` order, and
 * says what it applied; with `dryRun`, what it would apply, changing nothing. A service the database has at
 * a newer version than this release knows is left as it is.
 *
 * @category constructors
 */
export const run = (
  options?: RunOptions
): Effect.Effect<
  ReadonlyArray<ServiceMigration>,
  MigrationStoreError | ParseResult.ParseError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const { dryRun, prefix } = yield* decodeOptions(options)
    const sql = yield* SqlClient.SqlClient
    return yield* Effect.forEach(Registry.all(sql, prefix), (entry) =>
      Effect.gen(function*() {
        const before = yield* statusOf(sql, entry)
        const planned: ServiceMigration = {
          service: entry.service,
          table: entry.table,
          from: before.current,
          to: before.pending.length > 0 ? before.latest : before.current,
          applied: before.pending,
          state: before.state
        }
        if (dryRun || before.pending.length === 0) return planned
        const applied = yield* Sql.migrate(sql, entry.table, entry.migrations).pipe(
          Effect.mapError((cause) => new MigrationStoreError({ service: entry.service, operation: "migrate", cause }))
        )
        const after = yield* statusOf(sql, entry)
        return { ...planned, to: after.current, applied: applied.map(([id, name]) => `${id}_${name}`) }
      }))
  })
