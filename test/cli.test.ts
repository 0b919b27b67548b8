/**
 * The `leasehold` command line, run as a child process (bundled from src/bin/leasehold.ts as the package does)
 * against a real SQLite file and a throwaway PostgreSQL: each `queue`
 * command, `--json` output, and the errors for bad arguments (exit 2) and a
 * missing or unreachable database (exit 1, naming the fix).
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, FastCheck as fc, Layer, Scope } from "effect"
import { Schema } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Health from "../src/Health.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MergeQueue from "../src/MergeQueue.js"
import { foreignSqlite, leasehold } from "./helpers.js"
import * as Postgres from "./support/postgres.js"
import { expectNoPassword, password } from "./support/secrets.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-cli-"))
const sqliteFile = join(directory, "queue.db")
const mailboxFile = join(directory, "mailbox.db")

/** A queue with five entries, one claimed by agent-1 under a 1 ms lock that has expired. */
const seed = (layer: Layer.Layer<MergeQueue.MergeQueue, unknown>) =>
  Effect.gen(function*() {
    const queue = yield* MergeQueue.MergeQueue
    for (let i = 0; i < 5; i++) yield* queue.enqueue(`ws-${i}`, { priority: i % 2 })
    yield* queue.nextWithLock("agent-1")
    yield* Effect.sleep("5 millis")
  }).pipe(Effect.provide(layer), Effect.runPromise)

/** A mailbox database: "jobs" with 2 queued, 1 in flight, 1 delayed, and 1 dead letter (a body that no longer decodes). */
const seedMailbox = (layer: Layer.Layer<MailboxSql.Services, unknown>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Struct({ n: Schema.Number }) })
    const corrupt = yield* jobs.send({ n: 0 })
    yield* sql`UPDATE leasehold_mailbox_messages SET body = '{"n":"zero"}' WHERE seq = ${Number(corrupt)}`
    yield* jobs.receive({ maxMessages: 10 }) // dead-letters the corrupt one; nothing else is queued yet
    for (let n = 1; n <= 3; n++) yield* jobs.send({ n }, { replyTo: "answers" })
    yield* jobs.send({ n: 4 }, { delay: "10 minutes" })
    yield* jobs.receive({ visibilityTimeout: "5 minutes" }) // in flight until before the delayed one shows
  }).pipe(Effect.scoped, Effect.provide(layer), Effect.runPromise)

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  await seed(MergeQueue.layerSqlite({ filename: sqliteFile, lockTimeout: 1 }))
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
  await seed(MergeQueue.layerPg({ url: pgUrl, lockTimeout: 1 }))
  await seedMailbox(MailboxSql.layerSqlite({ filename: mailboxFile }))
  await seedMailbox(MailboxSql.layerPg({ url: pgUrl }))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

describe("leasehold queue on SQLite", () => {
  it.live(
    "status shows the stale lock and what recovery would do; list shows queue order",
    () =>
      Effect.gen(function*() {
        const status = yield* leasehold("queue", "status", "--db", sqliteFile)
        expect(status.code).toBe(0)
        expect(status.stdout).toMatch(/lock\s+agent-1 \(token 1\), STALE: expired/)
        expect(status.stdout).toMatch(/stale\s+1 expired lock, 1 stuck entries/)
        const list = yield* leasehold("queue", "list", "--db", sqliteFile, "--json")
        expect(list.code).toBe(0)
        const entries = JSON.parse(list.stdout) as Array<{ workspace: string; status: string; agentId: string | null }>
        expect(entries.map((entry) => entry.workspace)).toEqual(["ws-0", "ws-2", "ws-4", "ws-1", "ws-3"])
        expect(entries[0]).toMatchObject({ status: "claimed", agentId: "agent-1" })
        const pending = yield* leasehold("queue", "list", "--db", sqliteFile, "--status", "pending", "--limit", "2")
        expect(pending.stdout.trim().split("\n")).toHaveLength(4)
        expect(pending.stdout).not.toContain("claimed")
      }),
    60_000
  )

  it.live("recover heals the queue once; stats counts by status", () =>
    Effect.gen(function*() {
      const recovered = yield* leasehold("queue", "recover", "--db", sqliteFile, "--json")
      expect(recovered.code).toBe(0)
      expect(JSON.parse(recovered.stdout)).toMatchObject({ locksCleaned: 1, entriesReclaimed: 1 })
      const again = yield* leasehold("queue", "recover", "--db", sqliteFile)
      expect(again.stdout).toContain("cleared 0 expired lock(s), returned 0 stuck entries to pending")
      const stats = yield* leasehold("queue", "stats", "--db", sqliteFile)
      expect(stats.stdout).toMatch(/pending\s+5/)
      expect(stats.stdout).toMatch(/total\s+5/)
    }), 60_000)

  it.live(
    "bad arguments exit 2 with the usage; a missing database exits 1 naming the fix",
    () =>
      Effect.gen(function*() {
        const unknown = yield* leasehold("queue", "frobnicate", "--db", sqliteFile)
        expect(unknown.code).toBe(2)
        const badStatus = yield* leasehold("queue", "list", "--db", sqliteFile, "--status", "shipped")
        expect(badStatus.code).toBe(2)
        expect(badStatus.stdout + badStatus.stderr).toContain("pending")
        const noDb = yield* leasehold("queue", "status")
        expect(noDb.code).toBe(2)
        expect(noDb.stderr).toContain("Pass --db")
        const missing = yield* leasehold("queue", "status", "--db", join(directory, "nope.db"))
        expect(missing.code).toBe(1)
        expect(missing.stderr).toContain("no such file")
        // A --prefix that breaks the prefix rule is configuration the library refuses (a ParseError): bad usage.
        for (const command of [["queue", "status"], ["mailbox", "stats"]]) {
          const badPrefix = yield* leasehold(...command, "--db", sqliteFile, "--prefix", "Bad-Prefix")
          expect(badPrefix.code).toBe(2)
          expect(badPrefix.stderr).toContain("[\"prefix\"]")
          expect(badPrefix.stderr).toContain("must be lower-case letters, digits and underscores")
        }
        const help = yield* leasehold("queue", "recover", "--help")
        expect(help.code).toBe(0)
        expect(help.stdout).toContain("Example: leasehold queue recover")
      }),
    60_000
  )
})

describe("leasehold queue on PostgreSQL", () => {
  it.live("status, recover and an unreachable server", () =>
    Effect.gen(function*() {
      const status = yield* leasehold("queue", "status", "--db", pgUrl, "--json")
      expect(status.code).toBe(0)
      expect(JSON.parse(status.stdout)).toMatchObject({ lock: { agentId: "agent-1", stale: true }, pending: 4 })
      const recovered = yield* leasehold("queue", "recover", "--db", pgUrl, "--json")
      expect(JSON.parse(recovered.stdout)).toMatchObject({ locksCleaned: 1, entriesReclaimed: 1 })
      const down = yield* leasehold("queue", "status", "--db", "postgres://me:secret@127.0.0.1:1/none")
      expect(down.code).toBe(1)
      expect(down.stderr).toContain("did not answer")
      expect(down.stderr).not.toContain("secret")
    }), 60_000)
})

describe("leasehold mailbox", () => {
  it.live(
    "stats and peek on SQLite show queued, in flight, delayed and dead letters without receiving",
    () =>
      Effect.gen(function*() {
        const stats = yield* leasehold("mailbox", "stats", "--db", mailboxFile)
        expect(stats.code).toBe(0)
        expect(stats.stdout).toMatch(/jobs\s+2\s+1\s+1\s+1\s/)
        const peek = yield* leasehold("mailbox", "peek", "jobs", "--db", mailboxFile, "--json")
        const messages = JSON.parse(peek.stdout) as Array<
          { body: { n: number }; state: string; replyTo: string | null }
        >
        expect(messages.map((m) => [m.body.n, m.state])).toEqual([[2, "queued"], [3, "queued"], [1, "in flight"], [
          4,
          "delayed"
        ]])
        expect(messages[0]!.replyTo).toBe("answers")
        const again = yield* leasehold("mailbox", "stats", "--db", mailboxFile, "--json")
        expect(JSON.parse(again.stdout)).toMatchObject([{ queue: "jobs", queued: 2, inFlight: 1, delayed: 1 }])
      }),
    60_000
  )

  it.live("dlq list and redrive on SQLite; purge needs --yes", () =>
    Effect.gen(function*() {
      const list = yield* leasehold("mailbox", "dlq", "list", "--db", mailboxFile)
      expect(list.code).toBe(0)
      expect(list.stdout).toMatch(/jobs\s+1\s+.*SerializationError/)
      const redrive = yield* leasehold("mailbox", "dlq", "redrive", "--db", mailboxFile, "--queue", "jobs", "--json")
      expect(JSON.parse(redrive.stdout)).toEqual({ redriven: 1 })
      const empty = yield* leasehold("mailbox", "dlq", "list", "--db", mailboxFile)
      expect(empty.stdout).toContain("no dead letters")
      const refused = yield* leasehold("mailbox", "purge", "jobs", "--db", mailboxFile)
      expect(refused.code).toBe(2)
      expect(refused.stderr).toContain("purge would delete 5 message(s)")
      const purged = yield* leasehold("mailbox", "purge", "jobs", "--db", mailboxFile, "--yes")
      expect(purged.stdout).toContain("deleted 5 message(s) from jobs")
      const missingQueue = yield* leasehold("mailbox", "peek", "--db", mailboxFile)
      expect(missingQueue.code).toBe(2)
    }), 60_000)

  it.live("stats and dlq list on PostgreSQL", () =>
    Effect.gen(function*() {
      const stats = yield* leasehold("mailbox", "stats", "--db", pgUrl, "--json")
      expect(stats.code).toBe(0)
      expect(JSON.parse(stats.stdout)).toMatchObject([{
        queue: "jobs",
        queued: 2,
        inFlight: 1,
        delayed: 1,
        deadLetters: 1
      }])
      const list = yield* leasehold("mailbox", "dlq", "list", "--db", pgUrl, "--json")
      expect(JSON.parse(list.stdout)).toMatchObject([{ queue: "jobs", errorTag: "SerializationError" }])
    }), 60_000)
})

describe("leasehold health", () => {
  it.live("reports a live, ready worker with its metrics, and a missing one with exit 1", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const ok = yield* leasehold("health", "--url", health.url!, "--metrics")
      expect(ok.code).toBe(0)
      expect(ok.stdout).toMatch(/live\s+yes/)
      expect(ok.stdout).toMatch(/ready\s+yes/)
      yield* health.setShuttingDown
      const draining = yield* leasehold("health", "--url", health.url!, "--json")
      expect(draining.code).toBe(1)
      expect(JSON.parse(draining.stdout)).toMatchObject({ live: true, ready: false, reasons: ["shutting down"] })
      const missing = yield* leasehold("health", "--url", "http://127.0.0.1:1")
      expect(missing.code).toBe(1)
      expect(missing.stderr).toContain("Is the worker running with Health.layer")
    }).pipe(Effect.provide(Health.layer({ port: 0, host: "127.0.0.1" }))), 60_000)
})

describe("leasehold console's arguments", () => {
  it.live(
    "--help shows an example; a bad port is a usage error; a missing or unreachable database exits 1",
    () =>
      Effect.gen(function*() {
        const help = yield* leasehold("console", "--help")
        expect(help.code).toBe(0)
        expect(help.stdout).toContain("Example: leasehold console --db ./.leasehold/demo.db")
        expect(help.stdout).toContain("--read-only")
        const port = yield* leasehold("console", "--db", sqliteFile, "--port", "70000")
        expect(port.code).toBe(2)
        expect(port.stderr).toContain("--port")
        const missing = yield* leasehold("console", "--db", join(directory, "nope.db"))
        expect(missing.code).toBe(1)
        expect(missing.stderr).toContain("no such file")
        const unreachable = yield* leasehold("console", "--db", "postgres://postgres:secret@127.0.0.1:1/x")
        expect(unreachable.code).toBe(1)
        expect(unreachable.stderr).toContain("127.0.0.1:1")
        expect(unreachable.stderr).not.toContain("secret")
      }),
    60_000
  )
})

describe("operator commands change nothing", () => {
  it.live(
    "queue and mailbox commands on a SQLite file that is not leasehold's: exit 1, and the file is unchanged",
    () =>
      Effect.gen(function*() {
        // Someone else's database, in rollback-journal mode.
        const foreign = join(directory, "foreign.db")
        yield* foreignSqlite(foreign)
        const before = readFileSync(foreign)
        for (
          const args of [["queue", "status"], ["queue", "recover"], ["mailbox", "stats"], ["mailbox", "dlq", "list"]]
        ) {
          const run = yield* leasehold(...args, "--db", foreign)
          expect(run.code, args.join(" ")).toBe(1)
          expect(run.stderr).toMatch(/no (merge queue|mailbox) tables with prefix "leasehold_" in this database/)
        }
        expect(readFileSync(foreign).equals(before)).toBe(true)
      }),
    60_000
  )

  it.live(
    "a mistyped --prefix on PostgreSQL says there is no such queue, and creates no table",
    () =>
      Effect.gen(function*() {
        const tables = Effect.map(
          Effect.flatMap(
            SqlClient.SqlClient,
            (sql) => sql<{ n: number | string }>`SELECT count(*) AS n FROM pg_tables`
          ),
          (rows) => Number(rows[0]!.n)
        ).pipe(Effect.provide(MailboxSql.layerPg({ url: pgUrl })), Effect.scoped)
        const before = yield* tables
        for (const args of [["queue", "status"], ["mailbox", "stats"]]) {
          const run = yield* leasehold(...args, "--db", pgUrl, "--prefix", "leasehodl_")
          expect(run.code).toBe(1)
          expect(run.stderr).toContain(`with prefix "leasehodl_"`)
        }
        expect(yield* tables).toBe(before)
      }),
    60_000
  )

  it.live("peek shows a stored body that is not JSON as it is", () =>
    Effect.gen(function*() {
      const file = join(directory, "raw.db")
      yield* Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const raw = yield* MailboxSql.make({ name: "raw", schema: Schema.String })
        const id = yield* raw.send("fine")
        yield* sql`UPDATE leasehold_mailbox_messages SET body = ${"not json {"} WHERE seq = ${Number(id)}`
      }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename: file })))
      const table = yield* leasehold("mailbox", "peek", "raw", "--db", file)
      expect(table.code).toBe(0)
      expect(table.stdout).toContain("not json {")
      const json = yield* leasehold("mailbox", "peek", "raw", "--db", file, "--json")
      expect(JSON.parse(json.stdout)).toMatchObject([{ body: "not json {", bodyIsJson: false }])
      // A limit the database would misread is a bad argument, not "cannot reach its store".
      const badLimit = yield* leasehold("mailbox", "peek", "raw", "--db", file, "--limit", "-1")
      expect(badLimit.code).toBe(2)
      expect(badLimit.stderr).toContain("--limit must be an integer from 1 to 100000, got -1")
    }), 60_000)
})

describe("leasehold's numeric options", () => {
  it.live(
    "every --limit out of 1..100000 is a usage error (exit 2) naming the option, before any database is opened",
    () =>
      Effect.gen(function*() {
        for (
          const args of [
            ["queue", "list", "--limit", "0"],
            ["queue", "list", "--limit", "-1"],
            ["queue", "list", "--limit", "100001"],
            ["mailbox", "peek", "jobs", "--limit", "0"],
            ["mailbox", "dlq", "list", "--limit", "-5"]
          ]
        ) {
          // The database does not exist: the limit is refused first.
          const run = yield* leasehold(...args, "--db", join(directory, "never.db"))
          expect(run.code, args.join(" ")).toBe(2)
          expect(run.stdout + run.stderr, args.join(" ")).toContain(
            `--limit must be an integer from 1 to 100000, got ${args.at(-1)}`
          )
        }
        const ok = yield* leasehold("queue", "list", "--db", sqliteFile, "--limit", "1", "--json")
        expect(ok.code).toBe(0)
        expect(JSON.parse(ok.stdout)).toHaveLength(1)
      }),
    60_000
  )
})

describe("leasehold --db", () => {
  it.live(
    "takes a path, sqlite:PATH, sqlite://PATH, file:PATH and file:///PATH; a missing file is 'no such file'",
    () =>
      Effect.gen(function*() {
        for (const target of [sqliteFile, `sqlite:${sqliteFile}`, `sqlite://${sqliteFile}`, `file://${sqliteFile}`]) {
          const run = yield* leasehold("queue", "stats", "--db", target, "--json")
          expect(run.code, target).toBe(0)
          expect(JSON.parse(run.stdout), target).toMatchObject({ total: 5 })
        }
        const missing = yield* leasehold("queue", "stats", "--db", `sqlite:${join(directory, "nope.db")}`)
        expect(missing.code).toBe(1)
        expect(missing.stderr).toContain(`Cannot use database sqlite:${join(directory, "nope.db")}: no such file`)
      }),
    60_000
  )

  it.live(
    "an unsupported scheme, a key=value string or a malformed URL is a usage error saying so",
    () =>
      Effect.gen(function*() {
        for (
          const [target, reason] of [
            ["mysql://root:hunter22@127.0.0.1/app", `unsupported scheme "mysql:"`],
            ["host=127.0.0.1 password=hunter22", "key=value connection string"],
            ["postgres://me:hunter22@127.0.0.1:port/app", "not a valid URL"],
            ["postgres://me:hunter/22@127.0.0.1/app", "percent-encode"]
          ] as const
        ) {
          const run = yield* leasehold("mailbox", "stats", "--db", target)
          expect(run.code, target).toBe(2)
          expect(run.stderr, target).toContain(reason)
          expect(run.stderr, target).not.toContain("no such file")
          expect(run.stderr + run.stdout, target).not.toContain("hunter")
        }
      }),
    60_000
  )

  it.live(
    "never prints a password, whatever it holds (a few random ones, through every kind of failure)",
    () =>
      Effect.gen(function*() {
        for (const secret of fc.sample(password, { numRuns: 3 })) {
          const encoded = encodeURIComponent(secret)
          for (
            const [written, target, command] of [
              [secret, `postgres://me:${secret}@127.0.0.1:1/app`, ["queue", "status"]],
              [encoded, `postgres://me:${encoded}@127.0.0.1:1/app`, ["mailbox", "stats"]],
              [secret, `mysql://root:${secret}@127.0.0.1/app`, ["queue", "list"]],
              [secret, `host=127.0.0.1 password=${secret}`, ["mailbox", "dlq", "list"]],
              [encoded, `postgres://127.0.0.1:1/app?password=${encoded}`, ["console"]],
              [encoded, `http://me:${encoded}@127.0.0.1:1`, ["health", "--url"]]
            ] as const
          ) {
            const run = command[0] === "health"
              ? yield* leasehold(...command, target)
              : yield* leasehold(...command, "--db", target)
            expect(run.code, target).not.toBe(0)
            expectNoPassword(run.stdout + run.stderr, target, written, secret)
          }
        }
      }),
    120_000
  )
})
