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
import { Context, Effect, Either, Exit, FastCheck as fc, Layer, Option, Redacted, Runtime, Scope } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as WorkLease from "../src/WorkLease.js"
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
      expect(Number(recorded[0]!.n)).toBe(2) // every migration, the adopting one first
      expect(yield* after.tryAcquire("repo", 0)).toMatchObject({ _tag: "AlreadyAcquired" })
      if (held._tag === "Acquired") expect((yield* after.succeed("repo", held.token))._tag).toBe("NoBacklog")
      expect((yield* after.tryAcquire("repo", 0))._tag).toBe("AlreadyProcessed")
    }))

  /** A database as the release before the one-statement calls left it: only the first migration recorded. */
  const upgrade = (label: string, client: () => Layer.Layer<SqlClient.SqlClient, unknown>) =>
    it.scoped(`${label}: a database at migration 1 (before the one-statement calls) is upgraded, its state carries on`, () =>
      Effect.gen(function*() {
        const context = yield* Layer.build(client())
        const sql = Context.get(context, SqlClient.SqlClient)
        const table = prefix()
        const before = yield* WorkLeaseSql.make({ prefix: table, maxRetries: 1 }).pipe(Effect.provide(context))
        const held = yield* before.tryAcquire("repo", 0)
        expect((yield* before.tryAcquire("repo", 1))._tag).toBe("Enqueued")
        // Undo migration 2: what it created goes, and it is no longer recorded.
        yield* sql.unsafe(`DROP INDEX ${table}work_lease_backlog_head`)
        yield* sql.onDialectOrElse({
          pg: () =>
            sql.unsafe(`DROP FUNCTION ${table}work_lease_acquire(text, bigint, text, bigint);
              DROP FUNCTION ${table}work_lease_settle(text, text, boolean, integer)`),
          orElse: () => Effect.void
        })
        yield* sql.unsafe(`DELETE FROM ${table}work_lease_migrations WHERE migration_id = 2`)
        const after = yield* WorkLeaseSql.make({ prefix: table, maxRetries: 1 }).pipe(Effect.provide(context))
        const recorded = yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(`${table}work_lease_migrations`)}`
        expect(Number(recorded[0]!.n)).toBe(2)
        if (held._tag !== "Acquired") return expect.fail(held._tag)
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
})

type Op =
  | { readonly kind: "acquire"; readonly domain: string; readonly offset: number }
  | { readonly kind: "succeed" | "fail"; readonly domain: string; readonly stale: boolean }
  | { readonly kind: "assertCurrent"; readonly domain: string; readonly fencingToken: number }

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("acquire" as const),
      domain: fc.constantFrom("A", "B"),
      offset: fc.nat(4)
    })
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constantFrom("succeed" as const, "fail" as const),
      domain: fc.constantFrom("A", "B"),
      stale: fc.boolean()
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

/** `ops` on the STM version and on `sql`, in domains of their own (`run`): same answers, same states. */
const sameAsStm = (sql: WorkLease.WorkLease<unknown>, ops: ReadonlyArray<Op>, run: string) =>
  Effect.gen(function*() {
    const stm = yield* WorkLease.make({ maxRetries: 2 })
    const tokens = new Map<string, readonly [string, string]>()
    for (const op of ops) {
      const domain = `${run}-${op.domain}`
      let answers: ReadonlyArray<Either.Either<object, unknown>>
      if (op.kind === "acquire") {
        answers = [
          yield* Effect.either(stm.tryAcquire(domain, op.offset)),
          yield* Effect.either(sql.tryAcquire(domain, op.offset))
        ]
        const [a, b] = answers.map((answer) => Either.getOrUndefined(answer) as WorkLease.AcquireResult | undefined)
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
        const [a, b] = op.stale ? ["zombie", "zombie"] : tokens.get(domain) ?? ["none", "none"]
        const settle = (lease: WorkLease.WorkLease<unknown>, token: string) =>
          Effect.either(
            (op.kind === "succeed" ? lease.succeed(domain, token) : lease.fail(domain, token)) as Effect.Effect<
              object,
              object
            >
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
      `${label}: random acquire / succeed / fail / stale / assertCurrent sequences answer alike and leave the same state`,
      () =>
        Effect.gen(function*() {
          const context = yield* Layer.build(client())
          const sql = yield* WorkLeaseSql.make({ prefix: prefix(), maxRetries: 2 }).pipe(Effect.provide(context))
          // The test's runtime, so both backends read its TestClock.
          const runtime = yield* Effect.runtime<never>()
          let run = 0
          yield* Effect.promise(() =>
            fc.assert(
              fc.asyncProperty(fc.array(opArb, { maxLength: 40, size: "max" }), (ops) =>
                Runtime.runPromise(runtime)(sameAsStm(sql, ops, `r${++run}`))),
              { numRuns: 50 }
            )
          )
        }),
      120_000
    )
  differential("SQLite", () => SqliteClient.layer({ filename: sqliteFile }))
  differential("PostgreSQL", () => PgClient.layer({ url: Redacted.make(pgUrl) }))
})
