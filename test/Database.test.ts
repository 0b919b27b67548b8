/**
 * Database: the one SqlClient every durable service runs on. Bad options and databases that cannot be opened
 * are typed errors that say what to fix without showing a password; `layerFromEnv` picks the dialect from
 * the URL; and one pool serves MailboxSql, WorkLeaseSql and MergeQueue together.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Context, Effect, Exit, Layer, Schema, Scope } from "effect"
import { existsSync, mkdtempSync, readdirSync } from "node:fs"
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

const fromEnv = (value: Record<string, string>) =>
  build(Database.layerFromEnv).pipe(
    Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(value))))
  )

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
      const pg = yield* fromEnv({ LEASEHOLD_DATABASE_URL: cluster.url })
      expect(pg.onDialectOrElse({ pg: () => "pg", orElse: () => "other" })).toBe("pg")
      const sqlite = yield* fromEnv({ DATABASE_URL: join(directory, "env.db") })
      expect(sqlite.onDialectOrElse({ sqlite: () => "sqlite", orElse: () => "other" })).toBe("sqlite")
      const missing = yield* Effect.flip(fromEnv({}))
      expect(missing._tag).toBe("ConfigError")
      expect(String(missing)).toContain("LEASEHOLD_DATABASE_URL")
    }))

  it.scoped("layerFromEnv opens the SQLite URL forms it documents as the file they name", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [string, string]> = [
        [`sqlite:${directory}/a.db`, join(directory, "a.db")],
        [`SQLITE://${directory}/b.db`, join(directory, "b.db")],
        [`file:${directory}/c.db`, join(directory, "c.db")],
        [`file://${directory}/d.db`, join(directory, "d.db")],
        [`file://localhost${directory}/e.db`, join(directory, "e.db")],
        [`sqlite:${directory}/my%20f.db`, join(directory, "my f.db")],
        [`  ${directory}/g.db  `, join(directory, "g.db")]
      ]
      for (const [value, file] of cases) {
        const sql = yield* fromEnv({ LEASEHOLD_DATABASE_URL: value })
        expect(sql.onDialectOrElse({ sqlite: () => "sqlite", orElse: () => "other" }), value).toBe("sqlite")
        expect(existsSync(file), `${value} opens ${file}`).toBe(true)
      }
      // Nothing named after the URL itself was made.
      expect(readdirSync(directory).filter((name) => name.includes(":"))).toEqual([])
      expect(existsSync("sqlite:app.db")).toBe(false)
    }))

  it.scoped("layerFromEnv refuses what it cannot open, saying why, never as 'no such file' and never a password", () =>
    Effect.gen(function*() {
      const refused = (value: string) => Effect.flip(fromEnv({ LEASEHOLD_DATABASE_URL: value }))
      const cases: ReadonlyArray<readonly [string, string]> = [
        ["mysql://root:hunter22@db/app", `unsupported scheme "mysql:"`],
        ["http://root:hunter22@db/app", `unsupported scheme "http:"`],
        ["backup:2024.db", `unsupported scheme "backup:"`],
        ["host=db password=hunter22 dbname=app", "key=value connection string"],
        ["postgres://me:hunter22@db:port/app", "not a valid URL"],
        ["postgres://me:hun/ter22@db/app", "percent-encode"],
        ["postgres://me:hunter22@db/app?application_name=a@b", "percent-encode"],
        ["postgres://me:hunter22%@db/app", "malformed percent-escape"],
        [`file://elsewhere${directory}/x.db`, "names a host"],
        [`sqlite:${directory}/x.db?mode=ro`, "query"],
        [`sqlite:${directory}/50%.db`, "malformed percent-escape"],
        ["sqlite:", "names no file"],
        ["   ", "empty"]
      ]
      for (const [value, reason] of cases) {
        const error = yield* refused(value)
        expect(error._tag, value).toBe("DatabaseError")
        expect(error.message, value).toContain(reason)
        expect(error.message, value).not.toContain("hunter22")
        expect(error.message, value).not.toContain("no such file")
      }
      expect(existsSync(join(directory, "x.db"))).toBe(false)
    }))

  it.scoped("layerPg refuses a URL of another scheme or a malformed one before connecting", () =>
    Effect.gen(function*() {
      for (
        const [url, reason] of [
          ["mysql://root:hunter22@127.0.0.1:1/app", `unsupported scheme "mysql:"`],
          ["postgres://me:hun#ter22@127.0.0.1:1/app", "percent-encode"],
          ["host=127.0.0.1 port=1 password=hunter22", "key=value connection string"]
        ] as const
      ) {
        const error = yield* Effect.flip(build(Database.layerPg({ url })))
        expect(error._tag, url).toBe("DatabaseError")
        expect(error.message, url).toContain(reason)
        expect(error.message, url).not.toContain("hunter22")
      }
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
