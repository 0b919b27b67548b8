/**
 * The WorkLease contract on SQL: SQLite in a temporary file, and PostgreSQL
 * in a throwaway cluster started for this file. The SQL rules are written
 * twice (SQLite statements, PL/pgSQL), so random sequences also check both
 * against the STM version, answer by answer and state by state.
 */
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import {
  Clock,
  Context,
  DateTime,
  Effect,
  Either,
  Exit,
  FastCheck as fc,
  Layer,
  Option,
  Redacted,
  Runtime,
  Scope,
  TestClock
} from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Sql from "../src/internal/sql/common.js"
import * as WorkLeaseSchema from "../src/internal/sql/workLease/schema.js"
import * as WorkLease from "../src/WorkLease.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { workLeaseContract } from "./contract/WorkLeaseContract.js"
import { refusedOptions, skewedClock, spawnTsx } from "./helpers.js"
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

/**
 * The zombie of issue 33 in real processes: worker A holds offset 0 under a 1 s leaseTimeout, kept alive by its
 * heartbeat while it writes a fenced row; SIGSTOP pauses it past the timeout, this process takes over as B and
 * writes; SIGCONT wakes A, whose writes and settle are refused.
 */
const zombieProcess = (target: () => string, client: () => Layer.Layer<SqlClient.SqlClient, unknown>) =>
  Effect.gen(function*() {
    const table = prefix()
    const sql = Context.get(yield* Layer.build(client()), SqlClient.SqlClient)
    const lease = yield* WorkLeaseSql.make({ prefix: table, leaseTimeout: "1 second" }).pipe(
      Effect.provideService(SqlClient.SqlClient, sql)
    )
    const resource = sql(`${table}resource`)
    yield* sql`CREATE TABLE ${resource} (id TEXT PRIMARY KEY, fencing BIGINT NOT NULL, writer TEXT NOT NULL)`
    yield* sql`INSERT INTO ${resource} (id, fencing, writer) VALUES ('doc', 0, 'none')`
    const stopFile = join(mkdtempSync(join(tmpdir(), "leasehold-zombie-")), "stop")
    const a = yield* spawnTsx("test/fixtures/worklease-worker.ts", ["zombie", target(), table, "1000", stopFile])
    yield* a.waitFor(/"event":"acquired","fencing":1/, 60_000)
    // A works and beats: three lease timeouts later its lease is still its own.
    yield* Effect.sleep("3 seconds")
    expect((yield* lease.tryAcquire("doc", 0))._tag).toBe("AlreadyAcquired")
    yield* a.signal("SIGSTOP")
    yield* Effect.sleep("1500 millis")
    const b = yield* lease.tryAcquire("doc", 0)
    expect(b).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
    if (b._tag !== "Acquired") return
    const written = yield* sql`UPDATE ${resource} SET fencing = ${b.fencingToken}, writer = 'B'
      WHERE id = 'doc' AND fencing <= ${b.fencingToken} RETURNING id`
    expect(written.length).toBe(1)
    const writesBefore = a.output().split("\n").filter((line) => line.includes("\"event\":\"write\"")).length
    yield* a.signal("SIGCONT")
    yield* a.waitFor(/"written":false/, 10_000)
    // The zombie works on for a while, beating every 50 ms: a second of beats that must not renew anything.
    const refusedWrites = () => a.output().split("\n").filter((line) => line.includes("\"written\":false")).length
    for (let i = 0; i < 200 && refusedWrites() < 20; i++) yield* Effect.sleep("50 millis")
    writeFileSync(stopFile, "stop")
    expect((yield* a.exited).code).toBe(0)
    const events = a.output().split("\n").filter((line) => line.startsWith("{")).map((line) =>
      JSON.parse(line) as { event: string; written?: boolean; result?: string }
    )
    // Before the pause every write went through; after it, none did, and the settle was refused. SIGSTOP can land
    // between a write and the line that reports it: that one write (made before the pause, under A's lease) is
    // printed after SIGCONT. So: every accepted write comes before every refused one, and at most one accepted
    // line arrived after the pause. B's row is still B's (checked below), so none of them overwrote B.
    const writes = events.filter((e) => e.event === "write")
    const accepted = writes.filter((e) => e.written === true).length
    expect(writes.slice(0, accepted).every((e) => e.written === true)).toBe(true)
    expect(writes.slice(accepted).every((e) => e.written === false)).toBe(true)
    expect(accepted).toBeGreaterThanOrEqual(writesBefore)
    expect(accepted).toBeLessThanOrEqual(writesBefore + 1)
    expect(events.find((e) => e.event === "succeed")?.result).toBe("TokenMismatchError")
    // Its keepAlive found the lease lost at its first beat after waking and renewed nothing after: one warning,
    // no failed extension (each beat of the woken zombie used to send a renewal and log its failure).
    expect(events.find((e) => e.event === "succeed")).toMatchObject({ lost: true, extensionFailures: 0 })
    expect(a.output().split("\n").filter((line) => line.includes("Lease extension failed"))).toEqual([])
    expect(a.output().split("\n").filter((line) => line.includes("no longer renewing")).length).toBe(1)
    expect(yield* sql`SELECT fencing, writer FROM ${resource} WHERE id = 'doc'`).toMatchObject([{ writer: "B" }])
    // B still holds the domain: the next offset waits until B settles.
    expect((yield* lease.tryAcquire("doc", 1))._tag).toBe("Enqueued")
    expect(yield* lease.succeed("doc", b.token)).toEqual({ _tag: "NextHint", offset: 1 })
    expect(yield* lease.tryAcquire("doc", 1)).toMatchObject({ _tag: "Acquired", fencingToken: 3 })
  }).pipe(Effect.scoped)

describe("WorkLeaseSql across processes", () => {
  it.live("SQLite: three processes hammering two domains", () => hammer(() => sqliteFile), 120_000)
  it.live("PostgreSQL: three processes hammering two domains", () => hammer(() => pgUrl), 120_000)
  it.live(
    "SQLite: a worker paused past its leaseTimeout is taken over; woken, its fenced writes and its settle are refused",
    () => zombieProcess(() => sqliteFile, () => SqliteClient.layer({ filename: sqliteFile })),
    120_000
  )
  it.live(
    "PostgreSQL: a worker paused past its leaseTimeout is taken over; woken, its fenced writes and its settle are refused",
    () => zombieProcess(() => pgUrl, () => PgClient.layer({ url: Redacted.make(pgUrl) })),
    120_000
  )
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
      // leaseTimeout: a finite duration from 1 ms to 24 h, as in memory.
      for (const bad of [0, -1, Number.NaN, Infinity, "25 hours"]) {
        const error = yield* Effect.flip(
          WorkLeaseSql.make({ leaseTimeout: bad as never }).pipe(Effect.provide(context))
        )
        expect(refusedOptions(error)).toEqual(["leaseTimeout"])
      }
    }))
  it.scoped("maxRetries beyond a 32-bit integer is refused at make: on PostgreSQL every fail would be a store error", () =>
    Effect.gen(function*() {
      const pg = yield* Layer.build(PgClient.layer({ url: Redacted.make(pgUrl) }))
      const error = yield* Effect.flip(
        WorkLeaseSql.make({ prefix: prefix(), maxRetries: 2 ** 31 }).pipe(Effect.provide(pg))
      )
      expect(refusedOptions(error)).toEqual(["maxRetries"])
      expect(error.message).toContain("at most 2147483647")
      // The largest allowed works on PostgreSQL: a failure is retried.
      const lease = yield* WorkLeaseSql.make({ prefix: prefix(), maxRetries: 2 ** 31 - 1 }).pipe(Effect.provide(pg))
      const acquired = yield* lease.tryAcquire("d", 0)
      if (acquired._tag !== "Acquired") return expect.fail(`not acquired: ${acquired._tag}`)
      expect(yield* lease.fail("d", acquired.token)).toMatchObject({ _tag: "RetryScheduled", retryCount: 1 })
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
      expect(Number(recorded[0]!.n)).toBe(4) // every migration, the adopting one first
      expect(yield* after.tryAcquire("repo", 0)).toMatchObject({ _tag: "AlreadyAcquired" })
      if (held._tag === "Acquired") expect((yield* after.succeed("repo", held.token))._tag).toBe("NoBacklog")
      expect((yield* after.tryAcquire("repo", 0))._tag).toBe("AlreadyProcessed")
    }))

  /**
   * A database as the release before the one-statement calls left it: made by the first migration alone, with a
   * lease on offset 0 and offset 1 waiting.
   */
  const upgrade = (label: string, client: () => Layer.Layer<SqlClient.SqlClient, unknown>) =>
    it.scoped(`${label}: a database at migration 1 (before the one-statement calls) is upgraded, its state carries on`, () =>
      Effect.gen(function*() {
        const context = yield* Layer.build(client())
        const sql = Context.get(context, SqlClient.SqlClient)
        const table = prefix()
        const names = WorkLeaseSchema.tables(table)
        const first = Object.fromEntries(Object.entries(WorkLeaseSchema.migrations(sql, table)).slice(0, 1))
        yield* Sql.migrate(sql, names.migrations, first)
        yield* sql`INSERT INTO ${sql(names.domains)} (domain_id, lease_offset, lease_token, lease_fencing, acquired_at,
          fencing_token) VALUES ('repo', 0, 'held-0', 1, 0, 1)`
        yield* sql`INSERT INTO ${sql(names.backlog)} (domain_id, position, item) VALUES ('repo', 1, 1)`
        const held = { token: "held-0" }
        const after = yield* WorkLeaseSql.make({ prefix: table, maxRetries: 1 }).pipe(Effect.provide(context))
        const recorded = yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(`${table}work_lease_migrations`)}`
        expect(Number(recorded[0]!.n)).toBe(4)
        expect(yield* after.tryAcquire("repo", 0)).toEqual({ _tag: "AlreadyAcquired", token: held.token })
        expect(yield* after.fail("repo", held.token)).toEqual({ _tag: "RetryScheduled", retryCount: 1 })
        expect(yield* after.fail("repo", held.token)).toEqual({ _tag: "GiveUpNextHint", offset: 1 })
        const next = yield* after.tryAcquire("repo", 1)
        expect(next).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
        if (next._tag === "Acquired") expect(yield* after.succeed("repo", next.token)).toEqual({ _tag: "NoBacklog" })
        expect((yield* after.tryAcquire("repo", 0))._tag).toBe("AlreadyFailed")
        expect(yield* after.inspect("repo")).toMatchObject({ backlog: [], lowWaterMark: 2, retainedTerminal: 1 })
      }))
  upgrade("SQLite", () => SqliteClient.layer({ filename: sqliteFile }))
  upgrade("PostgreSQL", () => PgClient.layer({ url: Redacted.make(pgUrl) }))

  /**
   * A database as the release before lease expiry left it (migrations 1 and 2, by their own code), with a lease
   * in it; then the new release opens it with a leaseTimeout while a process of the previous release keeps
   * working beside it — on PostgreSQL through the previous functions, on SQLite with the previous statements.
   */
  const expiryUpgrade = (label: string, client: () => Layer.Layer<SqlClient.SqlClient, unknown>) =>
    it.scoped(`${label}: a database at migration 2 (before lease expiry) is upgraded; a process still on the previous version keeps working beside the new one`, () =>
      Effect.gen(function*() {
        const context = yield* Layer.build(client())
        const sql = Context.get(context, SqlClient.SqlClient)
        const table = prefix()
        const names = WorkLeaseSchema.tables(table)
        const previous = Object.fromEntries(Object.entries(WorkLeaseSchema.migrations(sql, table)).slice(0, 2))
        yield* Sql.migrate(sql, names.migrations, previous)
        const domains = sql(names.domains)
        yield* TestClock.setTime(1_000_000)
        // The previous release's lease on offset 0, offset 1 waiting.
        yield* sql`INSERT INTO ${domains} (domain_id, lease_offset, lease_token, lease_fencing, acquired_at,
          fencing_token) VALUES ('repo', 0, 'old-0', 1, 1000000, 1)`
        yield* sql`INSERT INTO ${sql(names.backlog)} (domain_id, position, item) VALUES ('repo', 1, 1)`
        // What the previous release runs for `succeed` (in order) and `tryAcquire` of an idle domain.
        const oldSucceed = (token: string) =>
          sql.onDialectOrElse({
            pg: () => sql`SELECT * FROM ${sql(names.settle)}('repo'::text, ${token}::text, false, 3)`,
            orElse: () =>
              sql`UPDATE ${domains} SET lease_offset = NULL, lease_token = NULL, lease_fencing = NULL,
                acquired_at = NULL, retry_count = 0, low_water = low_water + 1
              WHERE domain_id = 'repo' AND lease_token = ${token} AND lease_offset = low_water`
          })
        const oldAcquire = (offset: number, token: string) =>
          sql.onDialectOrElse({
            pg: () =>
              sql`SELECT * FROM ${
                sql(names.acquire)
              }('repo'::text, ${offset}::bigint, ${token}::text, ${1_000_000}::bigint)`,
            orElse: () =>
              sql`UPDATE ${domains} SET lease_offset = ${offset}, lease_token = ${token},
                lease_fencing = fencing_token + 1, acquired_at = 1000000, retry_count = 0,
                fencing_token = fencing_token + 1
              WHERE domain_id = 'repo' AND lease_token IS NULL`
          })

        const lease = yield* WorkLeaseSql.make({ prefix: table, leaseTimeout: "1 minute" }).pipe(
          Effect.provide(context)
        )
        const recorded = yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(names.migrations)}`
        expect(Number(recorded[0]!.n)).toBe(4)
        // The previous release's lease has no expiry: it is never taken over, until it is renewed.
        yield* TestClock.adjust("1 day")
        expect(yield* lease.tryAcquire("repo", 0)).toEqual({ _tag: "AlreadyAcquired", token: "old-0" })
        expect(Option.getOrThrow((yield* lease.inspect("repo")).lease).expiresAt).toEqual(Option.none())
        yield* lease.renew("repo", "old-0")
        const now = yield* Clock.currentTimeMillis
        expect(Option.getOrThrow((yield* lease.inspect("repo")).lease).expiresAt).toEqual(
          Option.some(DateTime.unsafeMake(now + 60_000))
        )
        expect(yield* lease.succeed("repo", "old-0")).toEqual({ _tag: "NextHint", offset: 1 })
        // The new release takes offset 1 with an expiry; the previous one settles it and takes offset 2 its way,
        // leaving the expiry of the lease on 1 in the row: it must not make the lease on 2 stale.
        const one = yield* lease.tryAcquire("repo", 1)
        expect(one).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
        if (one._tag !== "Acquired") return
        yield* oldSucceed(one.token)
        yield* oldAcquire(2, "old-2")
        yield* TestClock.adjust("1 day")
        expect(yield* lease.tryAcquire("repo", 2)).toEqual({ _tag: "AlreadyAcquired", token: "old-2" })
        expect(Option.getOrThrow((yield* lease.inspect("repo")).lease)).toMatchObject({
          offset: 2,
          fencingToken: 3,
          expiresAt: Option.none()
        })
        yield* lease.assertCurrent("repo", 3)
        // And the previous release settles what the new one took, which then goes on.
        yield* oldSucceed("old-2")
        const three = yield* lease.tryAcquire("repo", 3)
        expect(three).toMatchObject({ _tag: "Acquired", fencingToken: 4 })
        if (three._tag === "Acquired") yield* oldSucceed(three.token)
        expect(yield* lease.inspect("repo")).toMatchObject({ lease: Option.none(), lowWaterMark: 4 })
        expect((yield* lease.tryAcquire("repo", 3))._tag).toBe("AlreadyProcessed")
      }))
  expiryUpgrade("SQLite", () => SqliteClient.layer({ filename: sqliteFile }))
  expiryUpgrade("PostgreSQL", () => PgClient.layer({ url: Redacted.make(pgUrl) }))

  /**
   * A PostgreSQL database as the release before the array-answering functions left it (migrations 1 to 3), with a
   * lease in it; the new release opens it while a process of the previous release keeps calling migration 3's
   * functions beside it: they share the rows, the fencing tokens and the takeover rules.
   */
  it.scoped("PostgreSQL: a database at migration 3 is upgraded to the array-answering functions; a process still calling migration 3's functions keeps working beside the new one", () =>
    Effect.gen(function*() {
      const context = yield* Layer.build(PgClient.layer({ url: Redacted.make(pgUrl) }))
      const sql = Context.get(context, SqlClient.SqlClient)
      const table = prefix()
      const names = WorkLeaseSchema.tables(table)
      const previous = Object.fromEntries(Object.entries(WorkLeaseSchema.migrations(sql, table)).slice(0, 3))
      yield* Sql.migrate(sql, names.migrations, previous)
      yield* TestClock.setTime(1_000_000)
      // What the previous release runs: migration 3's functions, a 1 minute leaseTimeout, maxRetries 1.
      const oldAcquire = (offset: number, token: string) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.map(
            sql<{ o_tag: string; o_number: string | null }>`SELECT * FROM ${sql(names.acquire)}('repo'::text,
              ${offset}::bigint, ${token}::text, ${now}::bigint, 60000::bigint, 1)`,
            (rows) => rows[0]!
          ))
      const oldSettle = (token: string, fail: boolean) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.map(
            sql<{ o_tag: string; o_number: string | null }>`SELECT * FROM ${sql(names.settle)}('repo'::text,
              ${token}::text, ${fail}::boolean, 1, ${now}::bigint, 60000::bigint)`,
            (rows) => rows[0]!
          ))
      expect(yield* oldAcquire(0, "old-0")).toMatchObject({ o_tag: "Acquired", o_number: "1" })

      const lease = yield* WorkLeaseSql.make({ prefix: table, leaseTimeout: "1 minute", maxRetries: 1 }).pipe(
        Effect.provide(context)
      )
      const recorded = yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(names.migrations)}`
      expect(Number(recorded[0]!.n)).toBe(4)
      // The previous release's lease is seen, and another offset waits behind it.
      expect(yield* lease.tryAcquire("repo", 0)).toEqual({ _tag: "AlreadyAcquired", token: "old-0" })
      expect(yield* lease.tryAcquire("repo", 1)).toEqual({ _tag: "Enqueued" })
      // Stale by the same rules: the new release takes it over, with the next fencing token, and the zombie is
      // refused by the previous release's function too.
      yield* TestClock.adjust("61 seconds")
      const taken = yield* lease.tryAcquire("repo", 0)
      expect(taken).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
      if (taken._tag !== "Acquired") return
      expect(yield* oldSettle("old-0", false)).toMatchObject({ o_tag: "TokenMismatchError" })
      // The previous release settles what the new one took; the backlog head is next, for either.
      expect(yield* oldSettle(taken.token, false)).toEqual({ o_tag: "Released", o_number: "1" })
      expect(yield* oldAcquire(1, "old-1")).toMatchObject({ o_tag: "Acquired", o_number: "3" })
      // Its lease goes stale; the previous release takes it over and, stale again with its retry used, the
      // new release gives it up.
      yield* TestClock.adjust("61 seconds")
      expect(yield* oldAcquire(1, "old-1b")).toMatchObject({ o_tag: "Acquired", o_number: "4" })
      yield* TestClock.adjust("61 seconds")
      expect(yield* lease.tryAcquire("repo", 1)).toEqual({ _tag: "AlreadyFailed" })
      expect(yield* lease.fail("repo", "old-1b").pipe(Effect.flip)).toMatchObject({ _tag: "LeaseNotFoundError" })
      expect(yield* lease.inspect("repo")).toMatchObject({ lease: Option.none(), lowWaterMark: 2, retainedTerminal: 1 })
      const next = yield* lease.tryAcquire("repo", 2)
      expect(next).toMatchObject({ _tag: "Acquired", fencingToken: 5 })
      yield* lease.assertCurrent("repo", 5)
    }))
})

describe("WorkLeaseSql on PostgreSQL judges staleness by the database's clock", () => {
  it.live(
    "a client 2 minutes ahead does not see a fresh lease as stale; one 2 minutes behind still takes over a stale one",
    () =>
      Effect.gen(function*() {
        const pg = yield* Layer.build(PgClient.layer({ url: Redacted.make(pgUrl) }))
        const table = prefix()
        const open = (skew: number) =>
          WorkLeaseSql.make({ prefix: table, leaseTimeout: "2 seconds" }).pipe(
            Effect.provide(pg),
            Effect.withClock(skewedClock(skew))
          )
        const behind = yield* open(-2 * 60_000)
        const ahead = yield* open(2 * 60_000)
        // Taken by the client 2 minutes behind: by its clock the lease expires in 2 s, by the ahead one's clock it
        // expired 4 minutes ago. By the database's, it is fresh.
        const fresh = yield* behind.tryAcquire("fresh", 0)
        if (fresh._tag !== "Acquired") return expect.fail(fresh._tag)
        expect(yield* ahead.tryAcquire("fresh", 0)).toEqual({ _tag: "AlreadyAcquired", token: fresh.token })
        yield* ahead.renew("fresh", fresh.token)
        // The expiry shown is the database's: about 2 s from the real now, not 2 minutes off.
        const expiresAt = Option.getOrThrow(Option.getOrThrow((yield* ahead.inspect("fresh")).lease).expiresAt)
        const real = Date.now()
        expect(Math.abs(DateTime.toEpochMillis(expiresAt) - (real + 2_000))).toBeLessThan(1_500)
        // Taken by the client ahead, then left: by the behind client's clock it has 2 min 2 s to go; by the
        // database's it is stale after 2 s, and the behind client takes it over.
        const stale = yield* ahead.tryAcquire("stale", 0)
        if (stale._tag !== "Acquired") return expect.fail(stale._tag)
        expect(yield* behind.tryAcquire("stale", 0)).toEqual({ _tag: "AlreadyAcquired", token: stale.token })
        yield* Effect.sleep("2500 millis")
        const taken = yield* behind.tryAcquire("stale", 0)
        expect(taken).toMatchObject({ _tag: "Acquired", fencingToken: stale.fencingToken + 1 })
        expect((yield* Effect.flip(ahead.succeed("stale", stale.token)))._tag).toBe("TokenMismatchError")
        // The fresh one went stale during the sleep, but nobody took it over: its holder renews it and keeps it.
        yield* behind.renew("fresh", fresh.token)
        expect(yield* ahead.tryAcquire("fresh", 0)).toEqual({ _tag: "AlreadyAcquired", token: fresh.token })
      }).pipe(Effect.scoped),
    30_000
  )
})

type Op =
  | { readonly kind: "acquire"; readonly domain: string; readonly offset: number }
  | { readonly kind: "retake"; readonly domain: string }
  | { readonly kind: "succeed" | "fail" | "renew"; readonly domain: string; readonly stale: boolean }
  | { readonly kind: "assertCurrent"; readonly domain: string; readonly fencingToken: number }
  | { readonly kind: "advance"; readonly millis: number }

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("acquire" as const),
      domain: fc.constantFrom("A", "B"),
      offset: fc.nat(4)
    })
  },
  // An acquire of the offset in flight (0 when none): what an orchestrator does to take a stale lease over.
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("retake" as const), domain: fc.constantFrom("A", "B") }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constantFrom("succeed" as const, "fail" as const, "renew" as const),
      domain: fc.constantFrom("A", "B"),
      stale: fc.boolean()
    })
  },
  {
    // Time passes: at LEASE_TIMEOUT and beyond, a lease nobody renewed is stale.
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("advance" as const),
      millis: fc.constantFrom(1, 4_000, 9_999, 10_000, 30_000)
    })
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("assertCurrent" as const),
      domain: fc.constantFrom("A", "B"),
      fencingToken: fc.nat(4)
    })
  }
)

/** An answer without its token (each backend draws its own) and without an error's message. */
const comparable = (answer: Either.Either<object, unknown>) => {
  const { message: _message, token: _token, domainId: _domainId, ...rest } = JSON.parse(
    JSON.stringify(Either.merge(answer))
  ) as Record<string, unknown>
  return { ok: Either.isRight(answer), ...rest }
}

const snapshot = (lease: WorkLease.WorkLease<unknown>, domainId: string) =>
  Effect.map(lease.inspect(domainId), (view) => ({
    ...view,
    lease: Option.map(view.lease, ({ token: _token, ...rest }) => rest)
  }))

const LEASE_TIMEOUT = 10_000

/**
 * A sequence that surely gives an offset up by takeovers (maxRetries 2): held, stale, taken over twice, stale
 * again — then its zombies speak, and the domain goes on.
 */
const giveUpByTakeovers: ReadonlyArray<Op> = [
  { kind: "acquire", domain: "A", offset: 0 },
  { kind: "acquire", domain: "A", offset: 1 },
  ...[1, 2, 3].flatMap((): ReadonlyArray<Op> => [
    { kind: "advance", millis: 10_000 },
    { kind: "retake", domain: "A" }
  ]),
  { kind: "succeed", domain: "A", stale: true },
  { kind: "renew", domain: "A", stale: false },
  { kind: "acquire", domain: "A", offset: 1 },
  { kind: "acquire", domain: "A", offset: 0 }
]

/** How often the sequences took a lease over, and gave a stale offset up (a test that never does proves nothing). */
const seen = { takeovers: 0, giveUps: 0 }

/**
 * `ops` on the STM version and on `sql`, in domains of their own (`run`): same answers, same states. Both read
 * the test's clock, which `advance` moves.
 */
const sameAsStm = (sql: WorkLease.WorkLease<unknown>, ops: ReadonlyArray<Op>, run: string) =>
  Effect.gen(function*() {
    const stm = yield* WorkLease.make({ maxRetries: 2, leaseTimeout: LEASE_TIMEOUT })
    const tokens = new Map<string, readonly [string, string]>()
    /** The tokens of each domain's last holder that was taken over (a zombie's), each backend's. */
    const zombies = new Map<string, readonly [string, string]>()
    for (const next of ops) {
      if (next.kind === "advance") {
        yield* TestClock.adjust(next.millis)
        continue
      }
      const domain = `${run}-${next.domain}`
      const held = Option.getOrUndefined((yield* stm.inspect(domain)).lease)
      const op = next.kind === "retake"
        ? { kind: "acquire" as const, domain: next.domain, offset: held?.offset ?? 0 }
        : next
      let answers: ReadonlyArray<Either.Either<object, unknown>>
      if (op.kind === "acquire") {
        answers = [
          yield* Effect.either(stm.tryAcquire(domain, op.offset)),
          yield* Effect.either(sql.tryAcquire(domain, op.offset))
        ]
        const [a, b] = answers.map((answer) => Either.getOrUndefined(answer) as WorkLease.AcquireResult | undefined)
        // Acquired while a lease was held is a takeover, AlreadyFailed its give-up: the holder's tokens become a
        // zombie's.
        const previous = tokens.get(domain)
        if (held?.offset === op.offset && previous !== undefined && a?._tag === b?._tag) {
          if (a?._tag === "Acquired") seen.takeovers++
          if (a?._tag === "AlreadyFailed") seen.giveUps++
          if (a?._tag === "Acquired" || a?._tag === "AlreadyFailed") zombies.set(domain, previous)
        }
        if (a?._tag === "Acquired" && b?._tag === "Acquired") tokens.set(domain, [a.token, b.token])
        // A lease taken again answers with the holder's token, each backend its own.
        if (a?._tag === "AlreadyAcquired" && b?._tag === "AlreadyAcquired") {
          expect([a.token, b.token]).toEqual(tokens.get(domain))
        }
      } else if (op.kind === "assertCurrent") {
        answers = [
          yield* Effect.either(Effect.as(stm.assertCurrent(domain, op.fencingToken), {})),
          yield* Effect.either(Effect.as(sql.assertCurrent(domain, op.fencingToken), {}))
        ]
      } else {
        const [a, b] = op.stale ? zombies.get(domain) ?? ["zombie", "zombie"] : tokens.get(domain) ?? ["none", "none"]
        const settle = (lease: WorkLease.WorkLease<unknown>, token: string) =>
          Effect.either(
            (op.kind === "succeed"
              ? lease.succeed(domain, token)
              : op.kind === "fail"
              ? lease.fail(domain, token)
              : Effect.as(lease.renew(domain, token), { _tag: "Renewed" })) as Effect.Effect<object, object>
          )
        answers = [yield* settle(stm, a), yield* settle(sql, b)]
      }
      expect({ op, answer: comparable(answers[1]!) }).toEqual({ op, answer: comparable(answers[0]!) })
      for (const name of ["A", "B"]) {
        expect(yield* snapshot(sql, `${run}-${name}`)).toEqual(yield* snapshot(stm, `${run}-${name}`))
      }
    }
  })

describe("WorkLeaseSql against the STM version", () => {
  const differential = (label: string, client: () => Layer.Layer<SqlClient.SqlClient, unknown>) =>
    it.scoped(
      `${label}: random acquire / succeed / fail / renew / stale / assertCurrent / time-passing sequences (expiry and takeover) answer alike and leave the same state (a takeover counted as a failed attempt, and its give-up, included)`,
      () =>
        Effect.gen(function*() {
          const context = yield* Layer.build(client())
          const sql = yield* WorkLeaseSql.make({ prefix: prefix(), maxRetries: 2, leaseTimeout: LEASE_TIMEOUT }).pipe(
            Effect.provide(context)
          )
          // The test's runtime, so both backends read its TestClock.
          const runtime = yield* Effect.runtime<never>()
          seen.takeovers = 0
          seen.giveUps = 0
          let run = 0
          yield* Effect.promise(() =>
            fc.assert(
              fc.asyncProperty(fc.array(opArb, { maxLength: 40, size: "max" }), (ops) =>
                Runtime.runPromise(runtime)(sameAsStm(sql, ops, `r${++run}`))),
              { numRuns: 100, examples: [[giveUpByTakeovers]] }
            )
          )
          expect(seen.takeovers).toBeGreaterThan(10)
          expect(seen.giveUps).toBeGreaterThan(0)
        }),
      120_000
    )
  differential("SQLite", () => SqliteClient.layer({ filename: sqliteFile }))
  differential("PostgreSQL", () => PgClient.layer({ url: Redacted.make(pgUrl) }))
})
