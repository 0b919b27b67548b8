/**
 * An interrupted statement on `Database.layerPg` never fails another fiber's (src/internal/sql/pgPool.ts): the
 * driver's own pool sends `pg_cancel_backend` on another connection, which lands on whatever the interrupted
 * statement's connection runs next when that statement finished first (Effect-TS/effect#8068). With the
 * driver's cancel the first test failed 3 runs of 3 (bystanders' statements "canceling statement due to user
 * request"). Here the interrupted statement's connection is retired: cancelled from a connection of its own and
 * closed, never handed on, so bystanders never fail and the next caller does not wait for it.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import * as Database from "../src/Database.js"
import * as Postgres from "./support/postgres.js"

const clusterScope = Effect.runSync(Scope.make())
let cluster: Postgres.Cluster
beforeAll(async () => {
  cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, clusterScope))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(clusterScope, Exit.void)))

const client = (maxConnections: number) =>
  Effect.map(
    Layer.build(Layer.fresh(Database.layerPg({ url: cluster.url, maxConnections, minConnections: 1 }))),
    Context.get(SqlClient.SqlClient)
  )

describe("Database.layerPg: interrupted statements", () => {
  it.scopedLive(
    "8,000 statements interrupted beside 3 busy fibers: no bystander's statement is cancelled",
    () =>
      Effect.gen(function*() {
        const sql = yield* client(3)
        const failures: Array<string> = []
        let done = 0
        let stop = false
        const bystander = Effect.gen(function*() {
          while (!stop) {
            yield* sql`SELECT 1`.pipe(
              Effect.tap(() => Effect.sync(() => done++)),
              Effect.catchAll((error) => Effect.sync(() => failures.push(String(error.cause))))
            )
          }
        })
        const bystanders = yield* Effect.fork(
          Effect.all([bystander, bystander, bystander], { concurrency: "unbounded", discard: true })
        )
        for (let i = 0; i < 8_000; i++) {
          const statement = yield* Effect.fork(sql`SELECT 1`)
          // 0 to 0.6 ms: before the statement is sent, while it runs, and around its end.
          yield* Effect.sleep(`${(i % 4) * 0.2} millis`)
          yield* Fiber.interrupt(statement)
        }
        stop = true
        yield* Fiber.join(bystanders)
        expect(failures).toEqual([])
        expect(done).toBeGreaterThan(1_000)
      }),
    120_000
  )

  it.scopedLive(
    "a statement interrupted while it runs is cancelled, its connection retired: the next runs at once on a new one",
    () =>
      Effect.gen(function*() {
        const sql = yield* client(1)
        const [before] = yield* sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`
        const sleeper = yield* Effect.fork(sql`SELECT pg_sleep(5)`)
        yield* Effect.sleep("50 millis")
        const started = Date.now()
        yield* Fiber.interrupt(sleeper)
        const [row] = yield* sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`
        expect(Date.now() - started).toBeLessThan(2_000)
        expect(row!.pid).not.toBe(before!.pid)
        // The retired backend is gone (cancelled, then its connection closed), not sleeping on.
        yield* Effect.sleep("200 millis")
        const [left] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE query = 'SELECT pg_sleep(5)' AND pid <> pg_backend_pid()`
        expect(left!.n).toBe(0)
      }),
    30_000
  )

  it.scopedLive(
    "a transaction interrupted mid-statement is rolled back, and its connection is whole afterwards",
    () =>
      Effect.gen(function*() {
        const sql = yield* client(1)
        yield* sql`CREATE TABLE IF NOT EXISTS cancel_probe (n integer)`
        yield* sql`TRUNCATE cancel_probe`
        const writer = yield* Effect.fork(sql.withTransaction(Effect.gen(function*() {
          yield* sql`INSERT INTO cancel_probe VALUES (1)`
          yield* sql`SELECT pg_sleep(0.3)`
          yield* sql`INSERT INTO cancel_probe VALUES (2)`
        })))
        yield* Effect.sleep("100 millis")
        const exit = yield* Fiber.interrupt(writer)
        expect(Exit.isInterrupted(exit)).toBe(true)
        const rows = yield* sql<{ n: number }>`SELECT n FROM cancel_probe`
        expect(rows).toEqual([])
        const [state] = yield* sql<{ s: string }>`SELECT current_setting('transaction_isolation') AS s`
        expect(state!.s).toBe("read committed")
      }),
    30_000
  )
})
