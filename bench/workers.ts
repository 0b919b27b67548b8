/**
 * What the workers table costs the durable path: an A/B of leasehold's MainLoop (ack only, bench/mailboxSql.ts's
 * `leasehold` round) with the process's row refreshed as shipped (every 5 s), refreshed every 200 ms (25 times as
 * often: the stress case), and effectively never (`LEASEHOLD_WORKER_REFRESH` of 1000 days: no row is written),
 * in alternating rounds in this one process (each round a fresh prefix, so its store opens with the round's
 * setting). Prints each round and the ratios of the medians: throughput, and this process's CPU time per job
 * (`process.cpuUsage()`, which a machine shared with other work disturbs less than throughput). Light enough for a shared machine:
 *
 *   node --conditions=leasehold-source --import tsx bench/workers.ts --backend sqlite --rounds 5 --jobs 3000
 *   node --conditions=leasehold-source --import tsx bench/workers.ts --backend pg --rounds 5 --jobs 3000
 *
 * PostgreSQL is a throwaway cluster (test/support/postgres.ts). Figures go to BENCHMARKS.md, not here.
 */
import { Effect, Exit, Scope } from "effect"
import { MailboxSql } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"
import * as Postgres from "../test/support/postgres.js"
import { leasehold } from "./mailboxSql.js"

const { values } = parseArgs({
  options: {
    backend: { type: "string", default: "sqlite" },
    rounds: { type: "string", default: "5" },
    jobs: { type: "string", default: "3000" },
    concurrency: { type: "string", default: "8" }
  }
})
const rounds = Number(values.rounds)
const jobs = Number(values.jobs)
const concurrency = Number(values.concurrency)

const settings = { off: "1000 days", shipped: "5 seconds", stress: "200 millis" } as const
type Setting = keyof typeof settings

const median = (xs: ReadonlyArray<number>) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

const main = Effect.gen(function*() {
  const scope = yield* Scope.make()
  const database = values.backend === "pg"
    ? MailboxSql.layerPg({ url: (yield* Scope.extend(Postgres.cluster, scope)).url })
    : MailboxSql.layerSqlite({ filename: join(mkdtempSync(join(tmpdir(), "leasehold-bench-workers-")), "b.db") })
  const results: Record<Setting, Array<number>> = { off: [], shipped: [], stress: [] }
  const cpu: Record<Setting, Array<number>> = { off: [], shipped: [], stress: [] }
  let round = 0
  // A warm-up round, not counted.
  process.env.LEASEHOLD_WORKER_REFRESH = settings.off
  yield* leasehold(database, `warm_`, jobs, concurrency, "ack only", () => undefined)
  for (let i = 0; i < rounds; i++) {
    // The order rotates, so no setting always runs first (or last) in a round.
    const order: ReadonlyArray<Setting> = (["off", "shipped", "stress"] as const).map((_, j, all) =>
      all[(i + j) % all.length]!
    )
    for (const setting of order) {
      process.env.LEASEHOLD_WORKER_REFRESH = settings[setting]
      const result = yield* leasehold(database, `r${++round}_`, jobs, concurrency, "ack only", () => undefined)
      results[setting].push(result.process)
      cpu[setting].push(result.nodeCpu)
      console.log(
        `round ${i + 1} ${setting.padEnd(7)} ${result.process.toFixed(0)} jobs/s, ${
          result.nodeCpu.toFixed(1)
        } µs CPU/job`
      )
    }
  }
  const off = median(results.off)
  const offCpu = median(cpu.off)
  for (const setting of ["shipped", "stress"] as const) {
    const ratio = median(results[setting]) / off
    const cpuRatio = median(cpu[setting]) / offCpu
    console.log(
      `${setting}: ${ratio.toFixed(3)}x the throughput of off (medians ${median(results[setting]).toFixed(0)} / ${
        off.toFixed(0)
      } jobs/s), ${cpuRatio.toFixed(3)}x its CPU per job (${median(cpu[setting]).toFixed(1)} / ${offCpu.toFixed(1)} µs)`
    )
  }
  yield* Scope.close(scope, Exit.void)
})

Effect.runPromise(main as Effect.Effect<void, unknown>).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
