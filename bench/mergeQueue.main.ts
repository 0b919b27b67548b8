/**
 * The merge-queue benchmark alone (`bench/run.ts` runs it with everything else): MergeQueue cycles against
 * the bare statements, rounds alternating (and which side goes first), each round's ratio, the medians, and
 * the process's CPU time per cycle of each side — on a shared machine a steadier figure than the rate, since
 * time spent waiting for a core does not count. Run it compiled, as the real bench is (tsx runs Effect code
 * several times slower); bundling the sources with esbuild compiles them as the package build does:
 *
 *   npx esbuild bench/mergeQueue.main.ts --bundle --platform=node --format=esm --packages=external \
 *     --alias:leasehold=./src/index.ts --outfile=bench/.build/mergeQueue.mjs
 *   node bench/.build/mergeQueue.mjs [--db sqlite|pg|both] [--rounds 5] [--warmup 2] [--entries 200]
 *     [--workers 1,8] [--file PATH|:memory:] [--only mq|bare]
 *
 * `--db pg` starts a throwaway PostgreSQL cluster (test/support/postgres.ts). `--only` runs one side, for
 * `node --cpu-prof`; `--file :memory:` leaves the disk out.
 */
import type { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Effect, Exit, type Layer, Redacted, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"
import * as Postgres from "../test/support/postgres.js"
import { bareCycles, mergeQueueCycles, type RunStats } from "./mergeQueue.js"

const { values } = parseArgs({
  options: {
    db: { type: "string", default: "sqlite" },
    rounds: { type: "string", default: "5" },
    /** Rounds run first and not counted (the real bench runs after others have warmed the JIT up). */
    warmup: { type: "string", default: "2" },
    entries: { type: "string", default: "200" },
    workers: { type: "string", default: "1,8" },
    /** The SQLite file (default: a new one in a temporary directory); `:memory:` leaves the disk out. */
    file: { type: "string" },
    /** Run one side only (`mq` or `bare`), for a profile of it. */
    only: { type: "string" }
  }
})
const rounds = Number(values.rounds)
const warmup = Number(values.warmup)
const entries = Number(values.entries)
const workerCounts = values.workers.split(",").map(Number)

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const fmt = (n: number) => Math.round(n).toLocaleString("en-US")

let schemas = 0
const only = async (label: string, layer: Layer.Layer<SqlClient.SqlClient, unknown>, side: string) => {
  for (const workers of workerCounts) {
    const rates: Array<number> = []
    for (let round = 1 - warmup; round <= rounds; round++) {
      rates.push(
        await Effect.runPromise(
          (side === "mq" ? mergeQueueCycles : bareCycles)(layer, `mq${++schemas}_`, entries, workers)
        )
      )
    }
    console.log(`${label} ${workers}w ${side}: ${rates.slice(warmup).map(fmt).join(", ")} cycles/s`)
  }
}

const measure = async (label: string, layer: Layer.Layer<SqlClient.SqlClient, unknown>) => {
  for (const workers of workerCounts) {
    const rows: Array<{ subject: number; baseline: number; subjectCpu: number; baselineCpu: number }> = []
    // The first rounds warm up; the order alternates so neither side always runs on a hotter (or more loaded)
    // machine.
    for (let round = 1 - warmup; round <= rounds; round++) {
      const subjectFirst = round % 2 === 0
      const run = async (subject: boolean) => {
        const stats: RunStats = { cpuMicros: 0 }
        const rate = await Effect.runPromise(
          (subject ? mergeQueueCycles : bareCycles)(layer, `mq${++schemas}_`, entries, workers, stats)
        )
        return { rate, cpu: stats.cpuMicros / entries }
      }
      const first = await run(subjectFirst)
      const second = await run(!subjectFirst)
      const [subject, baseline] = subjectFirst ? [first, second] : [second, first]
      if (round < 1) continue
      rows.push({ subject: subject.rate, baseline: baseline.rate, subjectCpu: subject.cpu, baselineCpu: baseline.cpu })
      console.log(
        `${label} ${workers}w round ${round}: MergeQueue ${fmt(subject.rate)}/s, bare ${fmt(baseline.rate)}/s, ${
          (baseline.rate / subject.rate).toFixed(2)
        }×; CPU per cycle ${subject.cpu.toFixed(0)} µs vs ${baseline.cpu.toFixed(0)} µs, ${
          (subject.cpu / baseline.cpu).toFixed(2)
        }×`
      )
    }
    const ratios = rows.map((row) => row.baseline / row.subject)
    const subject = median(rows.map((row) => row.subject))
    const baseline = median(rows.map((row) => row.baseline))
    console.log(
      `${label} ${workers}w median: MergeQueue ${fmt(subject)}/s, bare ${fmt(baseline)}/s, ${
        (baseline / subject).toFixed(2)
      }× (median of the rounds' ratios ${median(ratios).toFixed(2)}×, range ${Math.min(...ratios).toFixed(2)}–${
        Math.max(...ratios).toFixed(2)
      }×); CPU per cycle ${median(rows.map((row) => row.subjectCpu)).toFixed(0)} µs vs ${
        median(rows.map((row) => row.baselineCpu)).toFixed(0)
      } µs, ratio ${median(rows.map((row) => row.subjectCpu / row.baselineCpu)).toFixed(2)}×`
    )
  }
}

const main = async () => {
  if (values.db === "sqlite" || values.db === "both") {
    const file = values.file ?? join(mkdtempSync(join(tmpdir(), "leasehold-mq-bench-")), "bench.db")
    const layer = SqliteClient.layer({ filename: file })
    await (values.only === undefined ? measure("SQLite", layer) : only("SQLite", layer, values.only))
  }
  if (values.db === "pg" || values.db === "both") {
    const scope = Effect.runSync(Scope.make())
    try {
      const { url } = await Effect.runPromise(Scope.extend(Postgres.cluster, scope))
      const layer = PgClient.layer({ url: Redacted.make(url) })
      await (values.only === undefined ? measure("PostgreSQL", layer) : only("PostgreSQL", layer, values.only))
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  }
}

main().catch((error) => {
  console.error(error)
  process.exit(1)
})
