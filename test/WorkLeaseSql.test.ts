/**
 * The WorkLease contract on SQL: SQLite in a temporary file, and PostgreSQL
 * in a throwaway cluster started for this file.
 */
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { afterAll, beforeAll } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { workLeaseContract } from "./contract/WorkLeaseContract.js"
import * as Postgres from "./support/postgres.js"

let tables = 0
const prefix = () => `t${++tables}_`
const sqliteFile = join(mkdtempSync(join(tmpdir(), "leasehold-worklease-")), "lease.db")

workLeaseContract("SQL on SQLite", (options) =>
  Effect.flatMap(
    Layer.build(SqliteClient.layer({ filename: sqliteFile })),
    (context) => WorkLeaseSql.make({ ...options, prefix: prefix() }).pipe(Effect.provide(context))
  ))

const clusterScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, clusterScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(clusterScope, Exit.void)))

workLeaseContract("SQL on PostgreSQL", (options) =>
  Effect.flatMap(
    Layer.build(PgClient.layer({ url: Redacted.make(pgUrl) })),
    (context) => WorkLeaseSql.make({ ...options, prefix: prefix() }).pipe(Effect.provide(context))
  ))
