/**
 * `leasehold mailbox keys | limit | weight | rate` (issue 45, "Operators see it"), each run as a child process
 * against a SQLite file and a throwaway PostgreSQL: the keys table of a queue with hostile key names (escaped in
 * the table, exact in `--json`), settings set for a key and for the queue's defaults (and cleared with `none`)
 * as the store then reports them, and bad input — a limit of -1, 1.5 or "abc", a weight of 0, a key or queue
 * breaking the name rule, a malformed or too long rate, no rate at all — refused as a usage error (exit 2)
 * naming what was wrong, with nothing written.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { span } from "../src/cli/keyText.js"
import { parseRate } from "../src/cli/mailboxKeys.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { leasehold } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("clikeys")

let tables = 0
let prefix = "k0_"
beforeEach(() => {
  prefix = `k${++tables}_`
})

const TIMEOUT = 180_000

/** Key names another party chose: markup, quotes, a terminal escape. */
const script = "<script>alert(1)</script>"
const quotes = "\"'&"
const escape = "evil\u202egpj"

describe("parseRate", () => {
  it("reads N/PER with the command line's intervals, and none", () => {
    expect(parseRate("100/1m")).toMatchObject({ _tag: "Right", right: { count: 100 } })
    expect(parseRate("none")).toMatchObject({ _tag: "Right", right: null })
    expect(parseRate("10 / 1 minute")._tag).toBe("Right")
    expect(parseRate("5/m")._tag).toBe("Right")
    expect(parseRate("5/500ms")._tag).toBe("Right")
    for (const bad of ["", "10", "10/", "/1m", "x/1m", "-1/1m", "1.5/1m", "10/x", "10/-1m", "10/1y"]) {
      expect(parseRate(bad)._tag).toBe("Left")
    }
  })
  it("shows spans", () => {
    expect(span(850)).toBe("850 ms")
    expect(span(12_500)).toBe("12.5 s")
    expect(span(7_200_000)).toBe("2.0 h")
  })
})

for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  /** The keys table's rows of `queue` and the queues table's, as stored: what "nothing written" compares. */
  const stored = (queue: string) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const keys = yield* sql`SELECT key, max_leases, weight, start_limit, start_interval, token_limit, token_interval
        FROM ${sql(`${prefix}mailbox_keys`)} WHERE queue = ${queue} ORDER BY key`
      const queues = yield* sql`SELECT name FROM ${sql(`${prefix}mailbox_queues`)} ORDER BY name`
      return JSON.stringify({ keys, queues })
    })

  describe(`leasehold mailbox keys, limit, weight, rate on ${backend.label}`, () => {
    it.live(
      "lists a queue's keys (escaped; --json exact) and sets limits, weights and rates",
      () =>
        Effect.gen(function*() {
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, prefix })
          for (const key of ["acme", script, quotes, escape]) {
            yield* jobs.send(`a ${key}`, { key })
            yield* jobs.send(`b ${key}`, { key })
          }
          yield* jobs.send("no key")
          yield* jobs.receive({ visibilityTimeout: "10 minutes", maxMessages: 2 })
          const args = ["--db", backend.db(), "--prefix", prefix]

          const [limit, defaults, weight, rate] = yield* Effect.all([
            leasehold("mailbox", "limit", "jobs", "3", "--key", "acme", ...args),
            leasehold("mailbox", "limit", "jobs", "7", ...args),
            leasehold("mailbox", "weight", "jobs", "2.5", "--key", script, ...args),
            leasehold("mailbox", "rate", "jobs", "--starts", "10/1m", "--tokens", "90000/10s", "--key", quotes, ...args)
          ], { concurrency: 1 })
          for (const run of [limit, defaults, weight, rate]) expect(run.stderr).toBe("")
          expect(limit.code).toBe(0)
          expect(limit.stdout).toContain(`jobs: at most 3 in flight for key "acme"`)
          expect(defaults.stdout).toContain("jobs: at most 7 in flight for keys without their own")
          expect(weight.stdout).toContain("weight 2.5")
          expect(rate.stdout).toContain("at most 10 starts per 1m, at most 90000 tokens per 10s")

          const table = yield* leasehold("mailbox", "keys", "jobs", ...args)
          expect(table.code).toBe(0)
          expect(table.stdout).toMatch(/^key\s+ready\s+in flight\s+pending\s+limit\s+weight\s+leased\s+starts\s+tokens/)
          expect(table.stdout).toContain(script)
          expect(table.stdout).toContain("evil\\u202egpj")
          expect(table.stdout).not.toContain("\u202e")
          const acme = table.stdout.split("\n").find((row) => row.startsWith("acme"))!
          expect(acme.split(/\s{2,}/).slice(0, 6)).toEqual([
            "acme",
            expect.any(String),
            expect.any(String),
            "2",
            "3",
            "1"
          ])
          expect(table.stdout.split("\n").find((row) => row.startsWith(quotes))).toContain("0/10 per 1m")

          const json = yield* leasehold("mailbox", "keys", "jobs", "--json", ...args)
          const listed = JSON.parse(json.stdout) as ReadonlyArray<Record<string, unknown>>
          expect(listed.map((state) => state.key).sort()).toEqual(["acme", script, quotes, escape].sort())
          const byKey = new Map(listed.map((state) => [state.key, state]))
          expect(byKey.get("acme")).toMatchObject({ pending: 2, limit: 3, weight: 1, starts: null })
          expect(byKey.get(script)).toMatchObject({ limit: 7, weight: 2.5 })
          expect(byKey.get(quotes)).toMatchObject({
            limit: 7,
            starts: { used: 0, count: 10, perMillis: 60_000 },
            tokens: { used: 0, count: 90_000, perMillis: 10_000 }
          })
          // What the command line set is what the store reports.
          const admin = yield* MailboxSqlAdmin.queues({ prefix })
          const states = new Map((yield* admin.keys("jobs")).map((state) => [state.key, state]))
          expect(states.get("acme")?.limit).toBe(3)
          expect(states.get(escape)?.limit).toBe(7)

          // `none` clears: the key's own limit falls back to the default, then the default goes too.
          const cleared = yield* Effect.all([
            leasehold("mailbox", "limit", "jobs", "none", "--key", "acme", ...args),
            leasehold("mailbox", "limit", "jobs", "none", ...args),
            leasehold("mailbox", "weight", "jobs", "none", "--key", script, ...args),
            leasehold("mailbox", "rate", "jobs", "--starts", "none", "--key", quotes, "--json", ...args)
          ], { concurrency: 1 })
          for (const run of cleared) expect(run.code).toBe(0)
          expect(JSON.parse(cleared[3]!.stdout)).toEqual({ queue: "jobs", key: quotes, starts: null })
          const after = new Map((yield* admin.keys("jobs")).map((state) => [state.key, state]))
          expect(after.get("acme")?.limit).toBeUndefined()
          expect(after.get(script)?.weight).toBe(1)
          expect(after.get(quotes)?.starts).toBeUndefined()
          expect(after.get(quotes)?.tokens).toMatchObject({ count: 90_000 })

          // A queue with nothing stored: as peek, exit 1 naming it.
          const none = yield* leasehold("mailbox", "keys", "nosuch", ...args)
          expect(none.code).toBe(1)
          expect(none.stderr).toContain(`no queue "nosuch"`)
        }).pipe(Effect.scoped, onDb),
      TIMEOUT
    )

    it.live("refuses bad input as a usage error naming it, writing nothing", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, prefix })
        yield* jobs.send("a", { key: "acme" })
        const args = ["--db", backend.db(), "--prefix", prefix]
        const before = yield* stored("jobs")
        const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
          [["limit", "jobs", "-1"], `Invalid limit "-1"`],
          [["limit", "jobs", "1.5", "--key", "acme"], `Invalid limit "1.5"`],
          [["limit", "jobs", "abc"], `Invalid limit "abc"`],
          [["limit", "jobs", "1000001"], "Invalid limit 1000001: must be an integer between 0 and 1000000, or none"],
          [["weight", "jobs", "0", "--key", "acme"], "Invalid weight 0: must be a number between 0.001 and 1000"],
          [["weight", "jobs", "-2"], `Invalid weight "-2"`],
          [["weight", "jobs", "NaN"], `Invalid weight "NaN"`],
          [["limit", "jobs", "3", "--key", "a\nb"], `Invalid key "a\\nb": must not contain control characters`],
          [["limit", "jobs", "3", "--key", ""], "Invalid key \"\": must be a non-empty string"],
          [["limit", "jo\u0001bs", "3"], "Invalid queue \"jo\\u0001bs\": must not contain control characters"],
          [["limit", "x".repeat(201), "3"], "Invalid queue"],
          [["rate", "jobs", "--starts", "10/x"], `Invalid --starts "10/x": its interval "x" is not a duration`],
          [["rate", "jobs", "--starts", "ten/1m"], `Invalid --starts "ten/1m": must be N/PER`],
          [["rate", "jobs", "--tokens", "5/2d", "--key", "acme"], "Invalid --tokens interval 2d: must be between"],
          [["rate", "jobs", "--starts", "10/1m", "--tokens", "1/0s"], "Invalid --tokens interval"],
          [["rate", "jobs"], "give --starts N/PER, --tokens N/PER, or both"]
        ]
        const runs = yield* Effect.all(
          cases.map(([command]) => leasehold("mailbox", ...command, ...args)),
          { concurrency: 4 }
        )
        runs.forEach((run, i) => {
          const [command, said] = cases[i]!
          expect({ command, code: run.code }).toEqual({ command, code: 2 })
          expect(run.stderr).toContain(said)
          expect(run.stdout).toBe("")
        })
        expect(yield* stored("jobs")).toBe(before)
      }).pipe(Effect.scoped, onDb), TIMEOUT)
  })
}

describe("leasehold mailbox --help", () => {
  it.live("lists keys, limit, weight and rate", () =>
    Effect.gen(function*() {
      const help = yield* leasehold("mailbox", "--help")
      expect(help.code).toBe(0)
      for (const command of ["keys", "limit", "weight", "rate"]) expect(help.stdout).toContain(`mailbox ${command}`)
      const rate = yield* leasehold("mailbox", "rate", "--help")
      expect(rate.stdout).toContain("--starts")
      expect(rate.stdout).toContain("--tokens")
    }), TIMEOUT)
})
