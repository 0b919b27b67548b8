/**
 * The two durable backends a test file runs on: a SQLite file in a temporary directory and a throwaway
 * PostgreSQL cluster (test/support/postgres.ts), each opened once for the file through `MailboxSql`'s layers
 * (`context` carries the layer's stores: mailboxes made in it share one per prefix) and closed after it. Call at the top of a test file; the clients are
 * there from the first test on.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MailboxResolver } from "../../src/Mailbox.js"
import * as MailboxSql from "../../src/MailboxSql.js"
import * as Postgres from "./postgres.js"

/** A backend of the file: its label (`SQLite`, `PostgreSQL`) and its client, once opened. */
export interface SqlBackend {
  readonly label: "SQLite" | "PostgreSQL"
  readonly client: () => SqlClient.SqlClient
  /** The client with the layer's stores (`MailboxSql.layer` owns them), without its resolver. */
  readonly context: () => Context.Context<SqlClient.SqlClient>
  /** What `leasehold --db` takes to reach it: the SQLite file's path, the cluster's URL. */
  readonly db: () => string
}

/** Opens both backends for the test file (`name` names its temporary directory and SQLite file). */
export const sqlBackends = (name: string): readonly [SqlBackend, SqlBackend] => {
  const directory = mkdtempSync(join(tmpdir(), `leasehold-${name}-`))
  const scope = Effect.runSync(Scope.make())
  const open = (layer: Layer.Layer<MailboxSql.Services, unknown>) =>
    Effect.runPromise(
      Layer.buildWithScope(layer, scope).pipe(Effect.map((context) => Context.omit(MailboxResolver)(context)))
    )
  let sqlite: Context.Context<SqlClient.SqlClient> | undefined
  let pg: Context.Context<SqlClient.SqlClient> | undefined
  let url = ""
  const filename = join(directory, `${name}.db`)
  beforeAll(async () => {
    sqlite = await open(MailboxSql.layerSqlite({ filename }))
    const cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, scope))
    url = cluster.url
    pg = await open(MailboxSql.layerPg({ url }))
  }, 120_000)
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const opened = (context: Context.Context<SqlClient.SqlClient> | undefined) => {
    if (context === undefined) return Effect.runSync(Effect.dieMessage("the backends open in beforeAll"))
    return context
  }
  return [
    {
      label: "SQLite",
      client: () => Context.get(opened(sqlite), SqlClient.SqlClient),
      context: () => opened(sqlite),
      db: () => filename
    },
    {
      label: "PostgreSQL",
      client: () => Context.get(opened(pg), SqlClient.SqlClient),
      context: () => opened(pg),
      db: () => url
    }
  ]
}
