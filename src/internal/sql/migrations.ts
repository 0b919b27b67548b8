/**
 * Every SQL service's migrations in one list — the mailbox, the work leases, the merge queue, each with its
 * own migrations table under the prefix — for `Migrations` (and `leasehold migrate` / `leasehold status`),
 * which run or report them all at once instead of each service migrating itself on first use.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Effect from "effect/Effect"
import * as MailboxSchema from "../mailbox/sql/schema.js"
import * as MailboxStore from "../mailbox/sql/store.js"
import * as MergeQueueSchema from "../mergeQueue/schema.js"
import * as WorkLeaseSchema from "./workLease/schema.js"

/** The services, in the order they are migrated and reported. */
export const serviceNames = ["mailbox", "work lease", "merge queue"] as const

export type ServiceName = typeof serviceNames[number]

/** One service's migrations on one client and prefix. */
export interface ServiceMigrations {
  readonly service: ServiceName
  /** Its migrations table. */
  readonly table: string
  /** By name (`<id>_<what>`), in order: the latest id is the version this release needs. */
  readonly migrations: Record<string, Effect.Effect<void, SqlError>>
}

/** Every service's migrations on `sql` under `prefix` (nothing runs until one is run). */
export const all = (sql: SqlClient.SqlClient, prefix: string): ReadonlyArray<ServiceMigrations> => [
  {
    service: "mailbox",
    table: MailboxSchema.migrationsTable(prefix),
    migrations: MailboxSchema.migrations(MailboxStore.tablesOf(sql, prefix))
  },
  {
    service: "work lease",
    table: WorkLeaseSchema.tables(prefix).migrations,
    migrations: WorkLeaseSchema.migrations(sql, prefix)
  },
  {
    service: "merge queue",
    table: MergeQueueSchema.names(prefix).migrations,
    migrations: MergeQueueSchema.migrations(sql, prefix)
  }
]

/** A migration's id: the number its name starts with. */
export const idOf = (name: string): number => Number.parseInt(name, 10)
