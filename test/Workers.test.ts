/**
 * Worker processes in the mailbox's workers table (mailbox migration 9), on SQLite and PostgreSQL: a process
 * whose loops run on a SQL mailbox registers itself (name, version, each loop's queue, state and message in
 * hand), its row is refreshed by a fiber of its own, so a loop stuck in its handler shows STALLED while its
 * process stays alive and its other loop fresh; a loop being drained shows draining; the verdicts are the
 * database's clock's (a process clock an hour off changes nothing), a row not refreshed is a lost process;
 * a failing write (the table gone) does not stop the loop, and the row comes back; a graceful exit deletes it;
 * loops sharing a name (N loops over one queue) are each listed.
 * Real processes, SIGSTOP and SIGKILL: test/console.workers.test.ts.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Layer, Option, Schema } from "effect"
import { readFileSync } from "node:fs"
import { hostname } from "node:os"
import * as Sql from "../src/internal/sql/common.js"
import type { Mailbox } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import { leasehold, skewedClock } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

// Read by each store as it opens (every test's prefix is new, so its store opens in the test).
process.env.LEASEHOLD_WORKER_NAME = "unit-worker"
process.env.LEASEHOLD_WORKER_REFRESH = "100 millis"

const backends = sqlBackends("workers")

let tables = 0
let prefix = "w0_"
beforeEach(() => {
  prefix = `w${++tables}_`
})

const TIMEOUT = 60_000
const thisProcess = `${hostname()}:${process.pid}`
const hour = 3_600_000
/** What each process records as its version: the package's. */
const packageVersion = (JSON.parse(readFileSync("package.json", "utf8")) as { readonly version: string }).version

/** A real-time wait between two looks at what a background fiber did. */
const realPause = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 20)))

/** `effect` again until `done` holds (at most 20 s). */
const eventually = <A, E, R>(effect: Effect.Effect<A, E, R>, done: (a: A) => boolean, what: string) => {
  const attempt = (left: number): Effect.Effect<A, E | Error, R> =>
    Effect.flatMap(effect, (a) =>
      done(a)
        ? Effect.succeed(a)
        : left <= 0
        ? Effect.fail(new Error(`${what}: still ${JSON.stringify(a)}`))
        : Effect.zipRight(realPause, Effect.suspend(() => attempt(left - 1))))
  return attempt(1000)
}

/** This process's row, if listed. */
const mine = (workers: ReadonlyArray<MailboxSqlAdmin.WorkerProcess>) =>
  workers.find((worker) => worker.process === thisProcess)

const loopOf = (worker: MailboxSqlAdmin.WorkerProcess | undefined, name: string) =>
  worker?.loops.find((loop) => loop.name === name)

/** A loop over `mailbox` whose handler waits for `gate` without beating. */
const stuckLoop = (name: string, mailbox: Mailbox<number>, gate: Deferred.Deferred<void>) =>
  MailboxWorker.make({
    name,
    mailbox,
    handle: () => Deferred.await(gate),
    onSuccess: () => Effect.succeedNone,
    onFailure: (message) => Effect.ignore(message.nack(0))
  })

const thresholds = { stalledAfter: "700 millis", lostAfter: "5 seconds" } as const

for (const backend of backends) {
  // With the layer's stores: the mailboxes of a test share one store (one row for the process).
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provide(effect, backend.context())

  describe(`worker processes on ${backend.label}`, () => {
    it.live(
      "register with their loops; a stuck loop is STALLED in a live process; the database's clock judges; a graceful exit deletes the row",
      () =>
        Effect.gen(function*() {
          const admin = yield* MailboxSqlAdmin.workers({ prefix })
          yield* Effect.scoped(Effect.gen(function*() {
            const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix })
            const other = yield* MailboxSql.make({ name: "other", schema: Schema.Number, prefix })
            const gate = yield* Deferred.make<void>()
            const busy = yield* stuckLoop("busy", jobs, gate)
            const idle = yield* stuckLoop("idle", other, gate)
            yield* busy.run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
            yield* idle.run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
            const id = yield* jobs.send(1)

            // Registered: the name, the version, both loops, the message in the busy one's hand.
            const seen = yield* eventually(
              admin.list(thresholds),
              (workers) => Option.getOrUndefined(loopOf(mine(workers), "busy")?.messageId ?? Option.none()) === id,
              "the busy loop holding the message"
            )
            const row = mine(seen)!
            expect(Option.getOrUndefined(row.name)).toBe("unit-worker")
            expect(row.version).toBe(packageVersion)
            expect(row.lost).toBe(false)
            expect(row.loops.map((loop) => [loop.name, loop.queue, loop.state]).sort()).toEqual([
              ["busy", "jobs", "running"],
              ["idle", "other", "running"]
            ])

            // The busy loop stops beating: STALLED, while the idle loop (beating on each poll) and the process are fresh.
            const stalled = yield* eventually(
              admin.list(thresholds),
              (workers) => loopOf(mine(workers), "busy")?.stalled === true,
              "the busy loop stalled"
            )
            expect(mine(stalled)!.lost).toBe(false)
            expect(loopOf(mine(stalled), "idle")!.stalled).toBe(false)
            // The row keeps being refreshed.
            yield* eventually(
              admin.list(thresholds),
              (workers) => mine(workers)!.refreshedAt.epochMillis > row.refreshedAt.epochMillis,
              "a later refresh"
            )

            // The database's clock judges: a process clock an hour ahead or behind sees the same verdicts.
            for (const skew of [hour, -hour]) {
              const skewed = yield* admin.list(thresholds).pipe(Effect.withClock(skewedClock(skew)))
              expect(mine(skewed)!.lost).toBe(false)
              expect(loopOf(mine(skewed), "idle")!.stalled).toBe(false)
              expect(Duration.toMillis(loopOf(mine(skewed), "idle")!.heartbeatAge)).toBeLessThan(hour / 2)
            }

            // A shutdown waiting for the stuck handler: draining.
            const stopping = yield* busy.shutdown({ timeout: "1 minute" }).pipe(Effect.fork)
            yield* eventually(
              admin.list(thresholds),
              (workers) => loopOf(mine(workers), "busy")?.state === "draining",
              "the busy loop draining"
            )
            yield* Deferred.succeed(gate, undefined)
            expect(yield* Fiber.join(stopping)).toBe(true)
            yield* eventually(
              admin.list(thresholds),
              (workers) => loopOf(mine(workers), "busy")?.state === "stopped",
              "the busy loop stopped"
            )
          }))
          // The last mailbox of the store closed: the row is gone.
          expect(mine(yield* admin.list(thresholds))).toBeUndefined()
        }).pipe(onDb),
      TIMEOUT
    )

    it.live("several loops of one name over one queue are each listed", () =>
      Effect.gen(function*() {
        const admin = yield* MailboxSqlAdmin.workers({ prefix })
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix })
        const gate = yield* Deferred.make<void>()
        yield* Effect.addFinalizer(() => Deferred.succeed(gate, undefined))
        for (let i = 0; i < 3; i++) {
          yield* (yield* stuckLoop("twin", jobs, gate)).run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
        }
        yield* eventually(
          admin.list(thresholds),
          (workers) => mine(workers)?.loops.filter((loop) => loop.name === "twin").length === 3,
          "three twins"
        )
      }).pipe(Effect.scoped, onDb), TIMEOUT)

    it.live(
      "a row not refreshed is a lost process, by the database's clock; its loops' ages keep growing",
      () =>
        Effect.gen(function*() {
          const admin = yield* MailboxSqlAdmin.workers({ prefix })
          const sql = yield* SqlClient.SqlClient
          const loops = JSON.stringify([
            { name: "main", queue: "jobs", state: "running", messageId: "42", beatAgeMillis: 1000 }
          ])
          yield* sql`INSERT INTO ${sql(`${prefix}mailbox_workers`)}
          (process, name, started_at, version, loops, refreshed_at)
          VALUES ('gone:1', NULL, 0, '0.1.0', ${loops}, ${Sql.databaseNow(sql)} - 60000)`
          for (const skew of [0, hour, -hour]) {
            const [gone] = yield* admin.list({ stalledAfter: "1 minute", lostAfter: "30 seconds" }).pipe(
              Effect.withClock(skewedClock(skew))
            )
            expect(gone!.process).toBe("gone:1")
            // A row of the previous release (9's table, keyed by host:pid): listed, with no instance.
            expect(Option.isNone(gone!.instance)).toBe(true)
            expect(gone!.lost).toBe(true)
            expect(Option.isNone(gone!.name)).toBe(true)
            const age = Duration.toMillis(gone!.loops[0]!.heartbeatAge)
            expect(age).toBeGreaterThanOrEqual(61_000)
            expect(age).toBeLessThan(hour / 2)
            expect(gone!.loops[0]!.stalled).toBe(true)
          }
          const [fresh] = yield* admin.list({ stalledAfter: "1 hour", lostAfter: "1 hour" })
          expect(fresh!.lost).toBe(false)
          expect(fresh!.loops[0]!.stalled).toBe(false)
          // Bad thresholds are refused, naming them.
          const refused = yield* Effect.flip(admin.list({ stalledAfter: "-1 seconds" }))
          expect(refused._tag).toBe("InvalidParameterError")
        }).pipe(onDb),
      TIMEOUT
    )

    it.live(
      "a write that fails (the table gone) does not stop the loop; the row comes back with the table",
      () =>
        Effect.gen(function*() {
          const admin = yield* MailboxSqlAdmin.workers({ prefix })
          const sql = yield* SqlClient.SqlClient
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix })
          const done = yield* Deferred.make<number>()
          const loop = yield* MailboxWorker.make({
            name: "steady",
            mailbox: jobs,
            handle: (message) => Deferred.succeed(done, message.body),
            onSuccess: () => Effect.succeedNone,
            onFailure: (message) => Effect.ignore(message.nack(0))
          })
          yield* loop.run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
          yield* eventually(admin.list(thresholds), (workers) => mine(workers) !== undefined, "registered")
          const table = `${prefix}mailbox_worker_instances`
          yield* sql`DROP TABLE ${sql(table)}`
          yield* Effect.sleep("300 millis") // a few refreshes fail meanwhile
          yield* jobs.send(7)
          expect(yield* Deferred.await(done)).toBe(7)
          expect(yield* loop.running).toBe(true)
          yield* sql`CREATE TABLE ${sql(table)} (instance TEXT PRIMARY KEY, process TEXT NOT NULL, name TEXT,
          started_at BIGINT NOT NULL, version TEXT NOT NULL, loops TEXT NOT NULL, refreshed_at BIGINT NOT NULL)`
          yield* eventually(admin.list(thresholds), (workers) => mine(workers) !== undefined, "registered again")
        }).pipe(Effect.scoped, onDb),
      TIMEOUT
    )
    it.live(
      "two stores with one host:pid (two layers in one process) keep a row each, keyed by instance; neither overwrites the other",
      () =>
        Effect.gen(function*() {
          const admin = yield* MailboxSqlAdmin.workers({ prefix })
          const gate = yield* Deferred.make<void>()
          yield* Effect.addFinalizer(() => Deferred.succeed(gate, undefined))
          // The first layer: the file's client. The second: a layer of its own on the same database.
          const first = yield* MailboxSql.make({ name: "left", schema: Schema.Number, prefix })
          yield* (yield* stuckLoop("left-loop", first, gate)).run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
          const second = yield* Layer.build(
            backend.label === "SQLite"
              ? MailboxSql.layerSqlite({ filename: backend.db() })
              : MailboxSql.layerPg({ url: backend.db() })
          )
          const other = yield* MailboxSql.make({ name: "right", schema: Schema.Number, prefix }).pipe(
            Effect.provide(second)
          )
          yield* (yield* stuckLoop("right-loop", other, gate)).run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
          const ours = (workers: ReadonlyArray<MailboxSqlAdmin.WorkerProcess>) =>
            workers.filter((worker) => worker.process === thisProcess)
          const both = yield* eventually(
            admin.list(thresholds),
            (workers) => ours(workers).length === 2,
            "two rows of this process"
          )
          const instances = ours(both).map((worker) => Option.getOrThrow(worker.instance))
          expect(new Set(instances).size).toBe(2)
          for (const instance of instances) expect(instance).toMatch(/^[0-9a-f]{16}$/)
          expect(ours(both).map((worker) => worker.loops.map((loop) => loop.name)).sort()).toEqual([
            ["left-loop"],
            ["right-loop"]
          ])
          // Refresh after refresh, both stay listed, each with its own loops: no flipping between them.
          for (let look = 0; look < 8; look++) {
            yield* Effect.sleep("60 millis")
            const rows = ours(yield* admin.list(thresholds))
            expect(rows.map((worker) => [Option.getOrThrow(worker.instance), worker.loops[0]?.name]).sort()).toEqual(
              ours(both).map((worker) => [Option.getOrThrow(worker.instance), worker.loops[0]?.name]).sort()
            )
          }
          // The command line shows the instance beside host:pid.
          const text = yield* leasehold("workers", "--db", backend.db(), "--prefix", prefix)
          expect(text.code).toBe(0)
          expect(text.stdout).toMatch(/^process\s+instance\s+name/m)
          for (const instance of instances) {
            expect(text.stdout).toContain(instance)
            expect(text.stdout).toMatch(new RegExp(`${thisProcess.replace(/[.]/g, "\\.")}\\s+${instance}\\s`))
          }
          const json = JSON.parse(
            (yield* leasehold("workers", "--db", backend.db(), "--prefix", prefix, "--json"))
              .stdout
          ) as ReadonlyArray<{ process: string; instance: string | null }>
          expect(json.filter((row) => row.process === thisProcess).map((row) => row.instance).sort()).toEqual(
            [...instances].sort()
          )
        }).pipe(Effect.scoped, onDb),
      TIMEOUT
    )

    it.live(
      "a database with the previous release's rows (9's table) lists them beside this release's; an old database (before 13) lists its rows",
      () =>
        Effect.gen(function*() {
          const admin = yield* MailboxSqlAdmin.workers({ prefix })
          const sql = yield* SqlClient.SqlClient
          const loops = JSON.stringify([
            { name: "old", queue: "jobs", state: "running", messageId: null, beatAgeMillis: 10 }
          ])
          // A process of the previous release, with this very host:pid (it wrote before this one started).
          yield* sql`INSERT INTO ${sql(`${prefix}mailbox_workers`)}
          (process, name, started_at, version, loops, refreshed_at)
          VALUES (${thisProcess}, 'previous', 0, '0.0.9', ${loops}, ${Sql.databaseNow(sql)})`
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix })
          const gate = yield* Deferred.make<void>()
          yield* Effect.addFinalizer(() => Deferred.succeed(gate, undefined))
          yield* (yield* stuckLoop("new", jobs, gate)).run({ waitTime: "100 millis" }).pipe(Effect.forkScoped)
          const rows = yield* eventually(
            admin.list(thresholds),
            (workers) => workers.filter((worker) => worker.process === thisProcess).length === 2,
            "the old row and the new one"
          )
          const mineNow = rows.filter((worker) => worker.process === thisProcess)
          expect(mineNow.map((worker) => [Option.isSome(worker.instance), worker.loops[0]?.name]).sort()).toEqual([
            [false, "old"],
            [true, "new"]
          ])
          // Before migration 13 (an operator's look at an older database): 9's rows alone, no failure.
          yield* sql`DROP TABLE ${sql(`${prefix}mailbox_worker_instances`)}`
          const older = yield* admin.list(thresholds)
          expect(older.filter((worker) => worker.process === thisProcess).map((worker) => worker.loops[0]?.name))
            .toEqual(["old"])
        }).pipe(Effect.scoped, onDb),
      TIMEOUT
    )
  })
}
