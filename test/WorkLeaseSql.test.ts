/**
 * The WorkLease contract on SQL: SQLite in a temporary file, and PostgreSQL
 * in a throwaway cluster started for this file.
 */
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { workLeaseContract } from "./contract/WorkLeaseContract.js"
import { refusedOptions, spawnTsx } from "./helpers.js"
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

interface Event {
  readonly domain: string
  readonly offset: number
  readonly event: "acquire" | "release"
  readonly fencing: number
  readonly at: number
}

/** Three worker processes on the same domains: holders never overlap, each offset is processed once. */
const hammer = (target: () => string) =>
  Effect.gen(function*() {
    const table = prefix()
    const DOMAINS = 2
    const OFFSETS = 25
    const startFile = join(mkdtempSync(join(tmpdir(), "leasehold-start-")), "go")
    const workers = yield* Effect.all(
      [1, 2, 3].map(() =>
        spawnTsx("test/fixtures/worklease-worker.ts", [target(), table, `${DOMAINS}`, `${OFFSETS}`, startFile])
      ),
      { concurrency: "unbounded" }
    )
    yield* Effect.forEach(workers, (w) => w.waitFor(/"event":"ready"/, 60_000), { discard: true })
    writeFileSync(startFile, "go")
    const exits = yield* Effect.all(workers.map((w) => w.exited), { concurrency: "unbounded" })
    expect(exits.map((e) => e.code)).toEqual([0, 0, 0])
    const events: Array<Event> = workers.flatMap((w) =>
      w.output().split("\n").filter((line) => line.startsWith("{\"domain")).map((line) => JSON.parse(line) as Event)
    )
    for (let d = 0; d < DOMAINS; d++) {
      const mine = events.filter((e) => e.domain === `domain-${d}`)
      const acquires = mine.filter((e) => e.event === "acquire").sort((a, b) => a.fencing - b.fencing)
      const releases = new Map(mine.filter((e) => e.event === "release").map((e) => [e.fencing, e]))
      expect(acquires.map((a) => a.offset)).toEqual(Array.from({ length: OFFSETS }, (_, i) => i)) // once each, in order
      expect(acquires.map((a) => a.fencing)).toEqual(Array.from({ length: OFFSETS }, (_, i) => i + 1))
      for (let i = 1; i < acquires.length; i++) {
        // The previous holder let go before the next one took over.
        expect(releases.get(acquires[i - 1]!.fencing)!.at).toBeLessThanOrEqual(acquires[i]!.at)
      }
    }
    // Each worker did some of the work: the processes really competed.
    expect(workers.filter((w) => w.output().includes("\"acquire\"")).length).toBeGreaterThan(1)
  }).pipe(Effect.scoped)

describe("WorkLeaseSql across processes", () => {
  it.live("SQLite: three processes hammering two domains", () => hammer(() => sqliteFile), 120_000)
  it.live("PostgreSQL: three processes hammering two domains", () => hammer(() => pgUrl), 120_000)
})

describe("WorkLeaseSql options", () => {
  it.scoped("a prefix that breaks the rule (capitals, too long, not an identifier) is a ParseError naming it", () =>
    Effect.gen(function*() {
      const context = yield* Layer.build(SqliteClient.layer({ filename: sqliteFile }))
      for (const bad of ["Lease_", "p".repeat(38), "x; DROP TABLE y"]) {
        const error = yield* Effect.flip(WorkLeaseSql.make({ prefix: bad }).pipe(Effect.provide(context)))
        expect(refusedOptions(error)).toEqual(["prefix"])
      }
      // And maxRetries is a count: `fail` would otherwise never give up (NaN) or give up at once (negative).
      for (const bad of [-1, 1.5, Number.NaN]) {
        const error = yield* Effect.flip(WorkLeaseSql.make({ maxRetries: bad }).pipe(Effect.provide(context)))
        expect(refusedOptions(error)).toEqual(["maxRetries"])
        expect(error.message).toContain("must be a non-negative integer")
      }
    }))
})

describe("WorkLeaseSql migrations", () => {
  it.scoped("a database made before migrations were recorded is adopted: its leases and state carry on", () =>
    Effect.gen(function*() {
      const context = yield* Layer.build(SqliteClient.layer({ filename: sqliteFile }))
      const sql = Context.get(context, SqlClient.SqlClient)
      const table = prefix()
      // The schema as WorkLeaseSql created it before it recorded migrations, with a domain in use.
      const before = yield* WorkLeaseSql.make({ prefix: table }).pipe(Effect.provide(context))
      const held = yield* before.tryAcquire("repo", 0)
      expect(held._tag).toBe("Acquired")
      yield* sql.unsafe(`DROP TABLE ${table}work_lease_migrations`)
      // Opened again: the migration adopts the tables, records itself, and the lease is still there.
      const after = yield* WorkLeaseSql.make({ prefix: table }).pipe(Effect.provide(context))
      const recorded = yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(`${table}work_lease_migrations`)}`
      expect(Number(recorded[0]!.n)).toBe(1)
      expect(yield* after.tryAcquire("repo", 0)).toMatchObject({ _tag: "AlreadyAcquired" })
      if (held._tag === "Acquired") expect((yield* after.succeed("repo", held.token))._tag).toBe("NoBacklog")
      expect((yield* after.tryAcquire("repo", 0))._tag).toBe("AlreadyProcessed")
    }))
})
