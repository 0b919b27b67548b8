/**
 * Database: the one SqlClient every durable service runs on. Bad options and databases that cannot be opened
 * are typed errors that say what to fix without showing a password; `layerFromEnv` picks the dialect from
 * the URL; and one pool serves MailboxSql, WorkLeaseSql and MergeQueue together.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Context, Effect, Exit, Layer, Schema, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Database from "../src/Database.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { refusedOptions } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-database-"))
const clusterScope = Effect.runSync(Scope.make())
let cluster: Postgres.Cluster
beforeAll(async () => {
  cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, clusterScope))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(clusterScope, Exit.void)))

const build = <E>(layer: Layer.Layer<SqlClient.SqlClient, E>) =>
  Effect.map(Layer.build(Layer.fresh(layer)), Context.get(SqlClient.SqlClient))

describe("Database", () => {
  it.scoped("bad options and unusable databases are typed errors naming the fix, never a password", () =>
    Effect.gen(function*() {
      const busy = yield* Effect.flip(
        build(Database.layerSqlite({ filename: join(directory, "x.db"), busyTimeout: -1 }))
      )
      expect(refusedOptions(busy)).toEqual(["busyTimeout"])
      expect(busy.message).toContain("Database.layerSqlite options")
      expect(busy.message).toContain("must not be negative")
      const long = yield* Effect.flip(
        build(Database.layerSqlite({ filename: join(directory, "x.db"), busyTimeout: "11 minutes" }))
      )
      expect(refusedOptions(long)).toEqual(["busyTimeout"])
      expect(long.message).toContain("must be at most 10 minutes")
      const pool = yield* Effect.flip(build(Database.layerPg({ url: cluster.url, maxConnections: 0 })))
      expect(refusedOptions(pool)).toEqual(["maxConnections"])
      const fewer = yield* Effect.flip(
        build(Database.layerPg({ url: cluster.url, maxConnections: 2, minConnections: 3 }))
      )
      expect(refusedOptions(fewer)).toEqual(["minConnections"])
      expect(fewer.message).toContain("must be an integer from 0 to maxConnections (2)")
      const file = yield* Effect.flip(
        build(Database.layerSqlite({ filename: join(directory, "no", "such", "dir.db") }))
      )
      expect(file._tag).toBe("DatabaseError")
      expect(file.message).toContain("SQLite could not open it")
      const down = yield* Effect.flip(build(Database.layerPg({ url: "postgres://me:secret@127.0.0.1:1/none" })))
      expect(down._tag).toBe("DatabaseError")
      expect(down.message).toContain(
        "Cannot use database postgres://me:***@127.0.0.1:1/none: the PostgreSQL server did not answer"
      )
      expect(down.message).not.toContain("secret")
    }))

  it.scoped("layerFromEnv: a PostgreSQL URL or a SQLite path from LEASEHOLD_DATABASE_URL; without one, a ConfigError", () =>
    Effect.gen(function*() {
      const fromEnv = (value: Record<string, string>) =>
        build(Database.layerFromEnv).pipe(
          Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(value))))
        )
      const pg = yield* fromEnv({ LEASEHOLD_DATABASE_URL: cluster.url })
      expect(pg.onDialectOrElse({ pg: () => "pg", orElse: () => "other" })).toBe("pg")
      const sqlite = yield* fromEnv({ DATABASE_URL: join(directory, "env.db") })
      expect(sqlite.onDialectOrElse({ sqlite: () => "sqlite", orElse: () => "other" })).toBe("sqlite")
      const missing = yield* Effect.flip(fromEnv({}))
      expect(missing._tag).toBe("ConfigError")
      expect(String(missing)).toContain("LEASEHOLD_DATABASE_URL")
    }))

  it.scoped("one pool for every durable service: mailboxes, work leases and the merge queue on one client", () =>
    Effect.gen(function*() {
      const application = "one_pool_test"
      const sql = yield* build(
        Database.layerPg({
          url: `${cluster.url}?application_name=${application}`,
          maxConnections: 3,
          minConnections: 1
        })
      )
      yield* Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix: "pool_" })
        // The services' layers require the client; they do not bring one of their own.
        const lease = yield* WorkLeaseSql.WorkLeaseSql
        const queue = yield* MergeQueue.MergeQueue
        yield* jobs.send(1)
        const [message] = yield* jobs.receive()
        yield* message!.acknowledge
        const acquired = yield* lease.tryAcquire("repo", 0)
        expect(acquired._tag).toBe("Acquired")
        yield* queue.enqueue("ws")
        expect((yield* queue.stats).total).toBe(1)
      }).pipe(
        Effect.provide(Layer.mergeAll(
          MailboxSql.layer(),
          WorkLeaseSql.layer({ prefix: "pool_" }),
          MergeQueue.layer({ prefix: "pool_" })
        )),
        Effect.provideService(SqlClient.SqlClient, sql)
      )
      // The pool's at most 3, the mailboxes' lane and their LISTEN: never a second pool.
      const sessions = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE application_name = ${application}`
      expect(sessions[0]!.n).toBeLessThanOrEqual(5)
    }))
})
