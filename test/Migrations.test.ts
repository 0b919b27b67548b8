/**
 * Migrations as an operation, on SQLite and PostgreSQL: `Migrations.run` on an empty database then `status`
 * says current; a dry run changes nothing; services opened with `create: false` (or `LEASEHOLD_MIGRATE=false`)
 * on a database not migrated fail at start with a `SchemaVersionError` that says to run `leasehold migrate`;
 * a database as an earlier release left it is brought up to date and a worker works on what was in it. Then
 * `leasehold migrate` / `leasehold status` as child processes, and a worker process started with
 * `LEASEHOLD_MIGRATE=false`.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Exit, Option, Schema, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Sql from "../src/internal/sql/common.js"
import * as Registry from "../src/internal/sql/migrations.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as Migrations from "../src/Migrations.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { leasehold, refusedOptions, spawnTsx } from "./helpers.js"
import * as Postgres from "./support/postgres.js"
import { sqlBackends } from "./support/sqlBackends.js"

const Job = Schema.Struct({ n: Schema.Number })
const latest = { mailbox: 12, "work lease": 4, "merge queue": 3 } as const
/** How many migrations each service has. */
const known = latest

let prefixes = 0
const freshPrefix = () => `mig${++prefixes}_`

/** The tables and functions of `prefix` in the database (functions: PostgreSQL only). */
const objectsOf = (prefix: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql.onDialectOrElse({
        pg: () =>
          sql<{ name: string }>`SELECT tablename AS name FROM pg_tables WHERE tablename LIKE ${`${prefix}%`}
            UNION ALL SELECT proname AS name FROM pg_proc WHERE proname LIKE ${`${prefix}%`}`,
        orElse: () => sql<{ name: string }>`SELECT name FROM sqlite_master WHERE name LIKE ${`${prefix}%`}`
      }),
      (rows) => rows.map((row) => row.name)
    ))

/**
 * A database as an earlier release left it: each service's first `count[service]` migrations (the ones that
 * release shipped), recorded in its migrations table as that release's Migrator recorded them.
 */
const migrateFirst = (prefix: string, count: Record<Migrations.Service, number>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.forEach(Registry.all(sql, prefix), (entry) =>
      Sql.migrate(
        sql,
        entry.table,
        Object.fromEntries(Object.entries(entry.migrations).slice(0, count[entry.service]))
      ), { discard: true }))

/** Work an earlier release left in the database, written with the columns its first migrations made. */
const seedOldWork = (prefix: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.all([
      sql`INSERT INTO ${sql(`${prefix}mailbox_messages`)} (queue, body, visible_at, enqueued_at)
        VALUES ('jobs', ${JSON.stringify({ n: 1 })}, 0, 0)`,
      sql`INSERT INTO ${sql(`${prefix}work_lease_domains`)} (domain_id, lease_offset, lease_token, lease_fencing,
        acquired_at, fencing_token) VALUES ('repo', 0, 'old-0', 1, 0, 1)`,
      sql`INSERT INTO ${sql(`${prefix}work_lease_backlog`)} (domain_id, position, item) VALUES ('repo', 1, 1)`,
      sql`INSERT INTO ${sql(`${prefix}merge_queue`)} (workspace, priority, status, state_changed_at, created_at)
        VALUES ('ws-old', 0, 'pending', 0, 0)`
    ], { discard: true }))

/** The three services opened as workers started after a separate migration step open them. */
const openWorkers = (prefix: string) =>
  Effect.all({
    jobs: MailboxSql.make({ name: "jobs", schema: Job, prefix, create: false }),
    lease: WorkLeaseSql.make({ prefix, create: false }),
    queue: MergeQueue.make({ prefix, create: false })
  })

const expectCurrent = (statuses: ReadonlyArray<Migrations.ServiceStatus>) =>
  expect(statuses.map(({ current, pending, service, state }) => ({ service, current, state, pending }))).toEqual(
    Migrations.services.map((service) => ({ service, current: latest[service], state: "current", pending: [] }))
  )

for (const backend of sqlBackends("migrations")) {
  describe(`Migrations on ${backend.label}`, () => {
    const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.suspend(() => Effect.provideService(effect, SqlClient.SqlClient, backend.client()))

    it.effect("run on an empty database applies every migration; status then says current; a second run applies none", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const before = yield* Migrations.status({ prefix })
        expect(before.map((status) => [status.service, status.current, status.state])).toEqual([
          ["mailbox", null, "not created"],
          ["work lease", null, "not created"],
          ["merge queue", null, "not created"]
        ])
        const ran = yield* Migrations.run({ prefix })
        expect(ran.map(({ applied, from, service, to }) => ({ service, from, to, count: applied.length }))).toEqual(
          Migrations.services.map((service) => ({ service, from: null, to: latest[service], count: known[service] }))
        )
        expect(ran[0]!.applied[0]).toBe("1_create_mailbox")
        expectCurrent(yield* Migrations.status({ prefix }))
        const again = yield* Migrations.run({ prefix })
        expect(again.map((result) => [result.from, result.to, result.applied])).toEqual(
          Migrations.services.map((service) => [latest[service], latest[service], []])
        )
        // Workers that run no migration open on it and work.
        const { jobs, lease, queue } = yield* openWorkers(prefix)
        yield* jobs.send({ n: 7 })
        const [message] = yield* jobs.receive()
        expect(message?.body).toEqual({ n: 7 })
        yield* message!.acknowledge
        expect((yield* lease.tryAcquire("d", 0))._tag).toBe("Acquired")
        yield* queue.enqueue("ws")
        expect(Option.isSome(yield* queue.nextWithLock("agent"))).toBe(true)
      }).pipe(Effect.scoped, onDb))

    it.effect("a dry run lists what would run and changes nothing", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const dry = yield* Migrations.run({ prefix, dryRun: true })
        expect(dry.map((result) => [result.service, result.from, result.to, result.applied.length])).toEqual(
          Migrations.services.map((service) => [service, null, latest[service], known[service]])
        )
        expect(yield* objectsOf(prefix)).toEqual([])
        // On a database behind: the pending ones only, and still nothing changes.
        yield* migrateFirst(prefix, { mailbox: 8, "work lease": 3, "merge queue": 2 })
        const objects = (yield* objectsOf(prefix)).sort()
        const behind = yield* Migrations.run({ prefix, dryRun: true })
        expect(behind.map((result) => [result.from, result.to, result.applied])).toEqual([
          [8, 12, ["9_workers", "10_queues_and_pause", "11_journal", "12_journal_identity"]],
          [3, 4, ["4_array_answers"]],
          [2, 3, ["3_audit_pages"]]
        ])
        expect((yield* objectsOf(prefix)).sort()).toEqual(objects)
        expect((yield* Migrations.status({ prefix })).map((status) => status.current)).toEqual([8, 3, 2])
      }).pipe(onDb))

    it.scoped("create: false on a database not migrated fails at start, saying to run leasehold migrate", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const refusals = [
          yield* Effect.flip(MailboxSql.make({ name: "jobs", schema: Job, prefix, create: false })),
          yield* Effect.flip(WorkLeaseSql.make({ prefix, create: false })),
          yield* Effect.flip(MergeQueue.make({ prefix, create: false }))
        ]
        expect(refusals.map((error) => [error._tag, (error as { service?: string }).service])).toEqual([
          ["SchemaVersionError", "mailbox"],
          ["SchemaVersionError", "work lease"],
          ["SchemaVersionError", "merge queue"]
        ])
        expect(refusals[0]!.message).toBe(
          `the mailbox tables with prefix "${prefix}" have not been created (no table ${prefix}mailbox_migrations); ` +
            "this release needs version 12, and was started with create: false (no migrations at start). Run " +
            `\`leasehold migrate --db <the database> --prefix ${prefix}\` first.`
        )
        // Nothing was created by trying.
        expect(yield* objectsOf(prefix)).toEqual([])
        // Behind: the versions, both.
        yield* migrateFirst(prefix, { mailbox: 8, "work lease": 3, "merge queue": 2 })
        const behind = yield* Effect.flip(WorkLeaseSql.make({ prefix, create: false }))
        expect(behind).toMatchObject({ _tag: "SchemaVersionError", current: 3, required: 4, prefix })
        expect(behind.message).toContain(`are at schema version 3 (${prefix}work_lease_migrations)`)
        expect(behind.message).toContain("this release needs version 4")
        expect(behind.message).toContain("leasehold migrate")
        expect((yield* Effect.flip(MergeQueue.make({ prefix, create: false }))).message).toContain(
          "merge queue tables with prefix"
        )
        // LEASEHOLD_MIGRATE=false is create: false for a service not told otherwise; an explicit option wins.
        const fromEnv = (value: string) =>
          Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["LEASEHOLD_MIGRATE", value]])))
        const envRefusal = yield* Effect.flip(MailboxSql.make({ name: "jobs", schema: Job, prefix })).pipe(
          fromEnv("false")
        )
        expect(envRefusal).toMatchObject({ _tag: "SchemaVersionError", current: 8, required: 12 })
        expect(yield* Effect.flip(MergeQueue.make({ prefix })).pipe(fromEnv("0"))).toMatchObject({
          _tag: "SchemaVersionError",
          current: 2,
          required: 3
        })
        const bad = yield* Effect.flip(WorkLeaseSql.make({ prefix })).pipe(fromEnv("maybe"))
        expect(bad._tag).toBe("ParseError")
        expect(bad.message).toContain("LEASEHOLD_MIGRATE must be true or false")
        expect(
          yield* Effect.exit(MailboxSql.make({ name: "jobs", schema: Job, prefix, create: true })).pipe(
            fromEnv("false")
          )
        )
          .toMatchObject({ _tag: "Success" })
        // A bad option is still a ParseError naming it.
        expect(refusedOptions(yield* Effect.flip(WorkLeaseSql.make({ prefix, create: "no" as never })))).toEqual([
          "create"
        ])
        // Once migrated, they open; a database newer than this release (a later one migrated it) opens too.
        yield* Migrations.run({ prefix })
        yield* openWorkers(prefix)
        const sql = yield* SqlClient.SqlClient
        yield* sql`INSERT INTO ${sql(`${prefix}mailbox_migrations`)} (migration_id, name) VALUES (${
          latest.mailbox + 1
        }, 'from_later')`
        yield* openWorkers(prefix)
        const newer = yield* Migrations.status({ prefix })
        const later = latest.mailbox + 1
        expect(newer[0]).toMatchObject({ current: later, latest: latest.mailbox, state: "newer", pending: [] })
        expect((yield* Migrations.run({ prefix }))[0]).toMatchObject({
          from: later,
          to: later,
          applied: [],
          state: "newer"
        })
      }).pipe(onDb))

    for (
      const [label, count] of [
        ["its first schema (each service's first migration)", { mailbox: 1, "work lease": 1, "merge queue": 1 }],
        ["the release before (all but each service's last)", { mailbox: 9, "work lease": 3, "merge queue": 2 }]
      ] as const
    ) {
      it.scoped(`a database as ${label} left it is brought current, and a worker works on what was in it`, () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          yield* migrateFirst(prefix, count)
          yield* seedOldWork(prefix)
          const before = yield* Migrations.status({ prefix })
          expect(before.map((status) => [status.state, status.current, status.pending.length])).toEqual(
            Migrations.services.map((service) => ["behind", count[service], known[service] - count[service]])
          )
          const ran = yield* Migrations.run({ prefix })
          expect(ran.map((result) => [result.from, result.to, result.applied])).toEqual(
            before.map((status) => [status.current, status.latest, status.pending])
          )
          expectCurrent(yield* Migrations.status({ prefix }))
          const { jobs, lease, queue } = yield* openWorkers(prefix)
          const [old] = yield* jobs.receive()
          expect(old?.body).toEqual({ n: 1 })
          yield* old!.acknowledge
          expect(yield* jobs.approximateCount).toBe(0)
          expect(yield* lease.tryAcquire("repo", 0)).toEqual({ _tag: "AlreadyAcquired", token: "old-0" })
          expect(yield* lease.succeed("repo", "old-0")).toEqual({ _tag: "NextHint", offset: 1 })
          expect(yield* lease.tryAcquire("repo", 1)).toMatchObject({ _tag: "Acquired", fencingToken: 2 })
          const claim = Option.getOrThrow(yield* queue.nextWithLock("agent"))
          expect(claim.workspace).toBe("ws-old")
          expect((yield* queue.transition(claim, "rebasing")).status).toBe("rebasing")
        }).pipe(onDb))
    }
  })
}

// ---------------------------------------------------------------------------
// The command line and a worker process
// ---------------------------------------------------------------------------

const directory = mkdtempSync(join(tmpdir(), "leasehold-migrate-cli-"))
const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

describe("leasehold migrate and leasehold status", () => {
  for (const [label, target] of [["SQLite", () => join(directory, "cli.db")], ["PostgreSQL", () => pgUrl]] as const) {
    it.live(`on ${label}: status exits 3 until migrate; a dry run changes nothing; --json for scripts`, () =>
      Effect.gen(function*() {
        const db = target()
        const prefix = `cli${label === "SQLite" ? "s" : "p"}_`
        if (label === "SQLite") {
          // A dry run does not make the file; migrate does (a deploy's first step on a new machine).
          const missing = yield* leasehold("migrate", "--db", db, "--dry-run")
          expect([missing.code, missing.stderr]).toEqual([1, expect.stringContaining("no such file")])
          expect((yield* leasehold("migrate", "--db", db, "--prefix", "other_")).code).toBe(0)
        }
        const planned = yield* leasehold("migrate", "--db", db, "--prefix", prefix, "--dry-run", "--json")
        expect(planned.code).toBe(0)
        const plan = JSON.parse(planned.stdout) as {
          dryRun: boolean
          services: ReadonlyArray<Migrations.ServiceMigration>
        }
        expect(plan.dryRun).toBe(true)
        expect(plan.services.map((service) => [service.service, service.from, service.to, service.applied.length]))
          .toEqual([["mailbox", null, 12, 12], ["work lease", null, 4, 4], ["merge queue", null, 3, 3]])
        const text = yield* leasehold("migrate", "--db", db, "--prefix", prefix, "--dry-run")
        expect(text.stdout).toContain("dry run: 19 migrations would run; nothing was changed.")

        const behind = yield* leasehold("status", "--db", db, "--prefix", prefix)
        expect(behind.code).toBe(3)
        expect(behind.stdout).toMatch(/mailbox\s+none\s+12\s+not created/)
        expect(behind.stdout).toContain(
          `Run \`leasehold migrate --db ${db} --prefix ${prefix}\` to bring it up to date.`
        )

        const migrated = yield* leasehold("migrate", "--db", db, "--prefix", prefix)
        expect(migrated.code).toBe(0)
        expect(migrated.stdout).toMatch(/mailbox\s+none\s+12\s+1_create_mailbox/)
        expect(migrated.stdout).toMatch(/^\s+12_journal_identity$/m)
        expect(migrated.stdout).toMatch(/merge queue\s+none\s+3\s+1_create_merge_queue/)
        expect(migrated.stdout).toContain("19 migrations applied.")

        const current = yield* leasehold("status", "--db", db, "--prefix", prefix, "--json")
        expect(current.code).toBe(0)
        const status = JSON.parse(current.stdout) as {
          upToDate: boolean
          services: ReadonlyArray<Migrations.ServiceStatus>
        }
        expect(status.upToDate).toBe(true)
        expect(status.services.map((service) => [service.service, service.current, service.latest, service.state]))
          .toEqual([["mailbox", 12, 12, "current"], ["work lease", 4, 4, "current"], ["merge queue", 3, 3, "current"]])
        const again = yield* leasehold("migrate", "--db", db, "--prefix", prefix)
        expect(again.stdout).toContain("0 migrations applied.")
        expect(again.stdout).toMatch(/work lease\s+4\s+4\s+none: up to date/)
      }))
  }

  it.live("never prints the password of --db (the cluster trusts any: the advice line shows the URL redacted)", () =>
    Effect.gen(function*() {
      const secret = "s3cret-Pa55"
      const url = pgUrl.replace("postgres://postgres@", `postgres://postgres:${secret}@`)
      for (const args of [["status"], ["migrate", "--dry-run"], ["status", "--json"]]) {
        const result = yield* leasehold(...args, "--db", url, "--prefix", "secret_")
        expect(result.code).toBe(args[0] === "status" ? 3 : 0)
        expect(`${result.stdout}${result.stderr}`).not.toContain(secret)
      }
      const status = yield* leasehold("status", "--db", url, "--prefix", "secret_")
      expect(status.stdout).toMatch(
        /Run `leasehold migrate --db postgres:\/\/postgres:\S+@127\.0\.0\.1:\d+\/postgres --prefix secret_`/
      )
    }))

  it.live("a bad --prefix is a usage error (exit 2)", () =>
    Effect.gen(function*() {
      const result = yield* leasehold("status", "--db", pgUrl, "--prefix", "Bad-Prefix")
      expect(result.code).toBe(2)
      expect(result.stderr).toContain("prefix")
    }))
})

describe("a worker started with LEASEHOLD_MIGRATE=false", () => {
  it.live(
    "fails at start on a database not migrated, naming leasehold migrate; after it, works",
    () =>
      Effect.gen(function*() {
        const filename = join(mkdtempSync(join(tmpdir(), "leasehold-migrate-worker-")), "mailbox.db")
        /** examples/worker.ts with LEASEHOLD_MIGRATE=false in its environment (read when it is spawned). */
        const worker = Effect.acquireUseRelease(
          Effect.sync(() => {
            process.env.LEASEHOLD_MIGRATE = "false"
          }),
          () => spawnTsx("examples/worker.ts", [filename]),
          () =>
            Effect.sync(() => {
              delete process.env.LEASEHOLD_MIGRATE
            })
        )
        const refused = yield* worker
        const exit = yield* refused.exited
        expect(exit.code).not.toBe(0)
        expect(refused.output()).toContain("SchemaVersionError")
        expect(refused.output()).toContain("leasehold migrate")
        expect((yield* leasehold("migrate", "--db", filename)).code).toBe(0)
        const started = yield* worker
        yield* started.waitFor(/reply r1: HELLO/)
        yield* started.signal("SIGTERM")
        expect((yield* started.exited).code).toBe(0)
      }).pipe(Effect.scoped),
    120_000
  )
})
