/**
 * docs/production.md's recipes, run for real: the alert rules (parsed, every metric one a worker exports,
 * `promtool check rules` and `promtool test rules`), the roles script (a worker role that works and cannot
 * change the schema) and leasehold behind PgBouncer's transaction pooling.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Option, Schema, Scope } from "effect"
import { execFileSync } from "node:child_process"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { parse } from "yaml"
import * as Database from "../src/Database.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as Migrations from "../src/Migrations.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { pgbouncer } from "./support/pgbouncer.js"
import * as Postgres from "./support/postgres.js"

const root = join(import.meta.dirname, "..")
const production = readFileSync(join(root, "docs/production.md"), "utf8")

/** Every `leasehold_…` metric the source declares (a counter's or gauge's name in a string). */
const declaredMetrics = (dir: string): Set<string> => {
  const names = new Set<string>()
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !entry.name.endsWith(".ts")) continue
    const text = readFileSync(join(entry.parentPath, entry.name), "utf8")
    for (const match of text.matchAll(/"(leasehold_[a-z_]+_(?:total|seconds))"/g)) names.add(match[1]!)
  }
  return names
}

const promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].find((path) => existsSync(path))

describe("alert rules (docs/prometheus-rules.yml)", () => {
  const rules = parse(readFileSync(join(root, "docs/prometheus-rules.yml"), "utf8")) as {
    groups: ReadonlyArray<{ rules: ReadonlyArray<{ alert: string; expr: string; labels: { severity: string } }> }>
  }
  const all = rules.groups.flatMap((group) => group.rules)

  it("every rule alerts on metrics a worker exports, with a severity", () => {
    const declared = declaredMetrics(join(root, "src"))
    expect(declared.size).toBeGreaterThan(10)
    expect(all.length).toBeGreaterThan(8)
    for (const rule of all) {
      const used = [...rule.expr.matchAll(/leasehold_[a-z_]+/g)].map((match) => match[0])
      expect(used.length, rule.alert).toBeGreaterThan(0)
      for (const name of used) expect(declared, `${rule.alert} uses ${name}`).toContain(name)
      expect(["critical", "warning", "info"]).toContain(rule.labels.severity)
    }
  })

  it("every exported metric is listed in docs/operating.md", () => {
    const operating = readFileSync(join(root, "docs/operating.md"), "utf8")
    for (const name of declaredMetrics(join(root, "src"))) {
      // The list abbreviates a family after its first member: `leasehold_messages_processed_total`, `_failed_total`.
      const suffix = name.replace(/^leasehold_(messages|lease|merge_queue|work_lease|journal)_/, "_")
      expect(operating.includes(name) || operating.includes(`\`${suffix}\``), name).toBe(true)
    }
  })

  it("promtool checks the rules and their unit tests pass", () => {
    if (promtool === undefined) {
      // .ci/run installs Debian's prometheus package; elsewhere the parse above is the check.
      expect(process.env.CI, "promtool is missing: apt-get install prometheus (.ci/run does)").not.toBe("true")
      return
    }
    const check = execFileSync(promtool, ["check", "rules", join(root, "docs/prometheus-rules.yml")], {
      encoding: "utf8"
    })
    expect(check).toContain("SUCCESS")
    const unit = execFileSync(promtool, ["test", "rules", "prometheus-rules.test.yml"], {
      cwd: join(root, "test/fixtures"),
      encoding: "utf8"
    })
    expect(unit).toContain("SUCCESS")
  })
})

/** The SQL block docs/production.md marks `roles.sql`. */
const rolesScript = (): string => {
  const at = production.indexOf("<!-- roles.sql")
  expect(at, "docs/production.md has a roles.sql block").toBeGreaterThanOrEqual(0)
  return /```sql\n([\s\S]*?)```/.exec(production.slice(at))?.[1] ?? ""
}

/** Runs `effect` with a pool of its own on `url`. */
const on = <A, E>(
  url: string,
  effect: Effect.Effect<A, E, SqlClient.SqlClient | MailboxSql.Services | Scope.Scope>
) =>
  Effect.runPromise(
    effect.pipe(
      Effect.scoped,
      Effect.provide(
        MailboxSql.layer().pipe(
          Layer.provideMerge(Database.layerPg({ url, maxConnections: 3, minConnections: 1 }))
        )
      )
    ) as Effect.Effect<A, E | Database.DatabaseError | unknown>
  )

/** One of everything a worker does: a request sent, received and acknowledged, a work lease, a merge cycle. */
const workerCycle = Effect.gen(function*() {
  const box = yield* MailboxSql.make({ name: "production-jobs", schema: Schema.String, create: false })
  yield* box.send("job")
  const received = yield* box.receive({ maxMessages: 1, waitTime: "5 seconds" })
  for (const message of received) yield* message.acknowledge
  const leases = yield* WorkLeaseSql.make({ create: false })
  const domain = `domain-${Math.random()}`
  const lease = yield* leases.tryAcquire(domain, 0)
  if (lease._tag === "Acquired") yield* leases.succeed(domain, lease.token)
  const queue = yield* MergeQueue.make({ create: false })
  yield* queue.enqueue(`workspace-${Math.random()}`, {})
  const claim = yield* queue.nextWithLock("worker")
  if (Option.isSome(claim)) {
    yield* queue.transition(claim.value, "cancelled")
    yield* queue.releaseProcessingLock(claim.value)
  }
  return { received: received.map((message) => message.body), lease: lease._tag, claimed: Option.isSome(claim) }
})

describe("PostgreSQL recipes (a throwaway cluster)", () => {
  const scope = Effect.runSync(Scope.make())
  let cluster: Postgres.Cluster
  const as = (user: string, port = cluster.port) => `postgres://${user}:change-me@127.0.0.1:${port}/postgres`

  beforeAll(async () => {
    cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, scope))
    await on(cluster.url, Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(rolesScript())))
  }, 120_000)
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

  it("the roles script: the owner migrates, the worker works and cannot change the schema", async () => {
    // Migrations, as the owner (every service creates its tables under the owner's search_path: the schema).
    await on(as("leasehold_owner"), Migrations.run())
    const tables = await on(
      cluster.url,
      Effect.flatMap(
        SqlClient.SqlClient,
        (sql) =>
          sql<{ schemaname: string; tableowner: string }>`SELECT schemaname, tableowner FROM pg_tables
          WHERE tablename LIKE 'leasehold_%'`
      )
    )
    expect(tables.length).toBeGreaterThan(5)
    expect(new Set(tables.map((row) => `${row.schemaname}/${row.tableowner}`))).toEqual(
      new Set(["leasehold/leasehold_owner"])
    )

    // The worker: everything a worker does works.
    expect(await on(as("leasehold_worker"), workerCycle)).toEqual({
      received: ["job"],
      lease: "Acquired",
      claimed: true
    })

    // And nothing that changes the schema does: a service under a new prefix would create tables.
    const refused = await on(
      as("leasehold_worker"),
      Effect.flip(MailboxSql.make({ name: "elsewhere", schema: Schema.String, prefix: "other_" }))
    )
    expect(String(refused)).toMatch(/permission denied/)
    const created = await on(
      cluster.url,
      Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1 FROM pg_tables WHERE tablename LIKE 'other_%'`)
    )
    expect(created).toEqual([])
  })

  it("behind PgBouncer in transaction mode every operation works and a waiting receiver still gets a message", async () => {
    const bouncer = await Effect.runPromise(
      Scope.extend(
        pgbouncer({ serverPort: cluster.port, mode: "transaction", users: ["leasehold_owner", "leasehold_worker"] }),
        scope
      )
    )
    const url = as("leasehold_worker", bouncer.port)
    expect(await on(url, workerCycle)).toEqual({ received: ["job"], lease: "Acquired", claimed: true })

    // A receiver and a sender with pools of their own: the send's NOTIFY may reach no listener through
    // transaction pooling, and the receiver finds the message by polling.
    const waiting = on(
      url,
      Effect.flatMap(
        MailboxSql.make({ name: "production-wake", schema: Schema.String, create: false }),
        (box) =>
          Effect.flatMap(
            box.receive({ maxMessages: 1, waitTime: "20 seconds" }),
            (messages) =>
              Effect.as(Effect.forEach(messages, (message) => message.acknowledge), messages.map((m) => m.body))
          )
      )
    )
    await Effect.runPromise(Effect.sleep("500 millis"))
    await on(
      url,
      Effect.flatMap(
        MailboxSql.make({ name: "production-wake", schema: Schema.String, create: false }),
        (box) => box.send("wake")
      )
    )
    expect(await waiting).toEqual(["wake"])
  })
})
