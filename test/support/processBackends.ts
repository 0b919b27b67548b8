/**
 * The two durable backends a test shares with the worker processes it starts: a SQLite file and a throwaway
 * PostgreSQL cluster, opened once for the file's tests (in `beforeAll`) and closed after them. `target` is what a
 * child process is given (the file's path, the cluster's URL), `client` the test's own connection.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import * as MailboxSql from "../../src/MailboxSql.js"
import * as Postgres from "./postgres.js"

export interface ProcessBackend {
  readonly label: "SQLite" | "PostgreSQL"
  readonly target: () => string
  readonly client: () => SqlClient.SqlClient
}

export const processBackends = (sqliteFile: string): readonly [ProcessBackend, ProcessBackend] => {
  const suiteScope = Effect.runSync(Scope.make())
  const clients: Partial<Record<ProcessBackend["label"], SqlClient.SqlClient>> = {}
  let pgUrl = ""
  beforeAll(async () => {
    const build = (layer: Layer.Layer<MailboxSql.Services, unknown>) =>
      Effect.runPromise(Layer.buildWithScope(layer, suiteScope).pipe(Effect.map(Context.get(SqlClient.SqlClient))))
    clients.SQLite = await build(MailboxSql.layerSqlite({ filename: sqliteFile }))
    pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
    clients.PostgreSQL = await build(MailboxSql.layerPg({ url: pgUrl }))
  }, 120_000)
  afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))
  const opened = (label: ProcessBackend["label"]) => () => {
    const client = clients[label]
    if (client === undefined) return Effect.runSync(Effect.dieMessage("the backends open in beforeAll"))
    return client
  }
  return [
    { label: "SQLite", target: () => sqliteFile, client: opened("SQLite") },
    { label: "PostgreSQL", target: () => pgUrl, client: opened("PostgreSQL") }
  ]
}
