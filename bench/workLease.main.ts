/**
 * The WorkLeaseSql pairs alone (`bench/run.ts` runs them with everything else): one domain from one fiber and
 * many domains from 8 fibers, on SQLite and on a throwaway PostgreSQL cluster (test/support/postgres.ts) over
 * TCP and over its Unix socket, rounds alternating after a warm-up of each; the medians, and the Node CPU
 * per pair. Run it compiled, as the real bench is (tsx runs Effect code several times slower):
 *
 *   npx esbuild bench/workLease.main.ts --bundle --platform=node --format=esm --packages=external \
 *     --alias:leasehold=./src/index.ts --alias:leasehold/WorkLeaseSql=./src/WorkLeaseSql.ts \
 *     --outfile=bench/.build/workLease.mjs
 *   node bench/.build/workLease.mjs [--db sqlite|pg|both] [--rounds 5]
 *
 * Add `node --cpu-prof` for a profile of the whole run.
 */
import type { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Effect, Exit, type Layer, Redacted, Scope } from "effect"
import { Database } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"
import * as Postgres from "../test/support/postgres.js"
import { pgOverUnixSocket, sqlManyDomains, sqlPairs } from "./workLease.js"

const { values } = parseArgs({
  options: { db: { type: "string", default: "both" }, rounds: { type: "string", default: "5" } }
})
const rounds = Number(values.rounds)

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const fmt = (n: number) => Math.round(n).toLocaleString("en-US")

type Case = () => Effect.Effect<{ readonly operations: number; readonly millis: number }>

/** Pairs per second and Node CPU (µs) per pair of one round of `round`. */
const measureOne = async (round: Case) => {
  const cpu = process.cpuUsage()
  const { millis, operations } = await Effect.runPromise(round())
  const used = process.cpuUsage(cpu)
  // The rate times the pairs alone; the CPU counts the whole round (opening the client too).
  return { rate: operations / (millis / 1000), cpu: (used.user + used.system) / operations }
}

const measure = async (cases: Record<string, Case>) => {
  const rows: Record<string, Array<{ rate: number; cpu: number }>> = {}
  for (const [name, round] of Object.entries(cases)) {
    await measureOne(round)
    rows[name] = []
  }
  for (let i = 0; i < rounds; i++) {
    for (const [name, round] of Object.entries(cases)) rows[name]!.push(await measureOne(round))
  }
  for (const [name, results] of Object.entries(rows)) {
    console.log(
      `${name}: ${fmt(median(results.map((r) => r.rate)))} pairs/s (rounds ${
        results.map((r) => fmt(r.rate)).join(", ")
      }), Node CPU ${median(results.map((r) => r.cpu)).toFixed(0)} µs per pair`
    )
  }
}

const both = (label: string, client: Layer.Layer<SqlClient.SqlClient, unknown>) => ({
  [`${label}, one domain`]: sqlPairs(client, "bench_"),
  [`${label}, many domains`]: sqlManyDomains(client, "bench_")
})

const main = async () => {
  if (values.db === "sqlite" || values.db === "both") {
    const file = join(mkdtempSync(join(tmpdir(), "leasehold-lease-bench-")), "bench.db")
    await measure(both("SQLite", Database.layerSqlite({ filename: file })))
  }
  if (values.db === "pg" || values.db === "both") {
    const scope = Effect.runSync(Scope.make())
    try {
      const { url } = await Effect.runPromise(Scope.extend(Postgres.cluster, scope))
      await measure({
        ...both("PostgreSQL over TCP", PgClient.layer({ url: Redacted.make(url) })),
        ...both("PostgreSQL over its Unix socket", await pgOverUnixSocket(url))
      })
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  }
}

main().catch((error) => {
  console.error(error)
  process.exit(1)
})
