/**
 * Leases at scale: one process runs 10,000 MainLoops on one mailbox, each holding a job that beats every
 * 100 ms for 60 s (wall clock) under a 30 s visibility and the lease extender's documented defaults — on
 * PostgreSQL and SQLite, alone and beside a CPU hog (a child process spinning). Reported: leases lost by a
 * live, beating worker (a job delivered again, an extension that found its handle expired; target 0), the
 * extension rows per statement (the batcher's histogram), and the database's CPU per extension (the
 * PostgreSQL cluster's processes from Linux `/proc`; SQLite runs in this process, whose CPU is reported).
 *
 * Run alone: `npm run build && node --import tsx bench/leases.ts` (`LEASES_DATABASE=PostgreSQL|SQLite` for one,
 * `LEASES_JOBS` and `LEASES_SECONDS` to shorten it; `node --conditions=leasehold-source --import tsx …` runs the
 * sources, no build). PostgreSQL is a throwaway cluster of its own (test/support/postgres.ts).
 */
import { Effect, Exit, Fiber, Metric, Schema } from "effect"
import { Heartbeat, LeaseExtender, Mailbox, MailboxSql, MainLoop } from "leasehold"
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import * as Postgres from "../test/support/postgres.js"
import { serverCpuNanos } from "./scale.js"

export const JOBS = Number(process.env.LEASES_JOBS ?? 10_000)
export const SECONDS = Number(process.env.LEASES_SECONDS ?? 60)
export const VISIBILITY_SECONDS = 30

type Database = "PostgreSQL" | "SQLite"

export interface LeasesFigures {
  readonly database: Database
  readonly hog: boolean
  readonly jobs: number
  /** Jobs delivered more than once while their first worker was alive and beating. */
  readonly redelivered: number
  /** Extensions that failed (a handle found expired, or the store's error). */
  readonly failed: number
  readonly extended: number
  readonly statements: number
  readonly meanRows: number
  readonly maxRows: number
  /** Microseconds of the database's CPU per extension (PostgreSQL's cluster; this process on SQLite). */
  readonly dbCpuMicrosPerExtension: number | undefined
  readonly seconds: number
}

const batchRows = MailboxSql.extensionBatchRows

const hogging = Effect.acquireRelease(
  Effect.sync(() => spawn(process.execPath, ["-e", "for(;;){}"], { stdio: "ignore" })),
  (child) => Effect.sync(() => child.kill("SIGKILL"))
)

let prefixes = 0

const run = (database: Database, target: string, hog: boolean): Effect.Effect<LeasesFigures, unknown> =>
  Effect.gen(function*() {
    const prefix = `lb${++prefixes}_`
    const requests = yield* MailboxSql.make({
      name: "jobs",
      schema: MainLoop.requestSchema(Schema.Number),
      replySchema: MainLoop.resultSchema(Schema.Void),
      prefix
    })
    yield* Effect.forEach(Array.from({ length: JOBS }, (_, n) => n), (n) => requests.send(MainLoop.request(n)), {
      concurrency: 64,
      discard: true
    })
    if (hog) yield* hogging
    const before = {
      rows: yield* Metric.value(batchRows),
      extended: (yield* Metric.value(LeaseExtender.extensions)).count,
      failed: (yield* Metric.value(LeaseExtender.extensionFailures)).count
    }
    const serverCpu = database === "PostgreSQL" ? serverCpuNanos(new URL(target).port) : () => undefined
    const cpu0 = serverCpu()
    const process0 = process.cpuUsage()
    const started = performance.now()
    let redelivered = 0
    let done = 0
    const job = Effect.suspend(() => {
      const until = performance.now() + SECONDS * 1000
      return Effect.zipRight(Heartbeat.beat, Effect.sleep("100 millis")).pipe(
        Effect.repeat({ while: () => performance.now() < until })
      )
    })
    const loops = yield* Effect.all(
      Array.from({ length: JOBS }, () =>
        MainLoop.make({
          requests,
          execute: (_n: number, { runContext }) =>
            Effect.suspend(() => {
              if (runContext.attempt > 1) redelivered++
              return Effect.zipRight(job, Effect.sync(() => void done++))
            })
        })),
      { concurrency: "unbounded" }
    )
    const fibers = yield* Effect.forEach(
      loops,
      (loop) => Effect.forkScoped(loop.run({ maxMessages: 1, visibilityTimeout: `${VISIBILITY_SECONDS} seconds` })),
      { concurrency: "unbounded" }
    )
    while (done < JOBS && performance.now() - started < (SECONDS * 4 + 120) * 1000) yield* Effect.sleep("200 millis")
    const seconds = (performance.now() - started) / 1000
    const cpu1 = serverCpu()
    const processUsed = process.cpuUsage(process0)
    yield* Effect.forEach(fibers, Fiber.interrupt, { concurrency: "unbounded", discard: true })
    const rows = yield* Metric.value(batchRows)
    const extended = (yield* Metric.value(LeaseExtender.extensions)).count - before.extended
    const statements = rows.count - before.rows.count
    const dbNanos = database === "PostgreSQL"
      ? (cpu0 === undefined || cpu1 === undefined ? undefined : cpu1 - cpu0)
      : (processUsed.user + processUsed.system) * 1000
    return {
      database,
      hog,
      jobs: JOBS,
      redelivered,
      failed: (yield* Metric.value(LeaseExtender.extensionFailures)).count - before.failed,
      extended,
      statements,
      meanRows: statements === 0 ? 0 : (rows.sum - before.rows.sum) / statements,
      // The histogram's max is over the process's life: the largest batch of any case so far.
      maxRows: statements === 0 ? 0 : rows.max,
      dbCpuMicrosPerExtension: dbNanos === undefined || extended === 0 ? undefined : dbNanos / 1000 / extended,
      seconds
    }
  }).pipe(
    Effect.provide(Mailbox.MailboxResolver.layer()),
    Effect.provide(
      database === "PostgreSQL" ? MailboxSql.layerPg({ url: target }) : MailboxSql.layerSqlite({ filename: target })
    ),
    Effect.scoped
  )

const show = (f: LeasesFigures) =>
  `leases ${f.database}${f.hog ? " + CPU hog" : ""}: ${f.jobs} jobs, ${f.redelivered} redelivered, ${f.failed} ` +
  `extensions failed, ${f.extended} extended in ${f.statements} statements (mean ${
    f.meanRows.toFixed(1)
  }, max ${f.maxRows} rows), db CPU ${f.dbCpuMicrosPerExtension?.toFixed(0) ?? "–"} µs/extension, ${
    f.seconds.toFixed(0)
  } s`

/** Every case, on the cluster at `pgUrl` (none: no PostgreSQL case) and a SQLite file of its own. */
export const measureLeases = (
  pgUrl: string | undefined,
  log: (line: string) => void,
  only?: Database
): Promise<ReadonlyArray<LeasesFigures>> =>
  Effect.runPromise(
    Effect.gen(function*() {
      const directory = mkdtempSync(join(tmpdir(), "leasehold-leases-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(directory, { recursive: true, force: true })))
      const figures: Array<LeasesFigures> = []
      for (const database of ["PostgreSQL", "SQLite"] as const) {
        if (only !== undefined && only !== database) continue
        if (database === "PostgreSQL" && pgUrl === undefined) continue
        for (const hog of [false, true]) {
          const target = database === "PostgreSQL" ? pgUrl! : join(directory, `leases-${hog ? "hog" : "alone"}.db`)
          const result = yield* run(database, target, hog)
          log(show(result))
          figures.push(result)
        }
      }
      return figures
    }).pipe(Effect.scoped)
  )

/** The section of BENCHMARKS.md. */
export const leasesSection = (figures: ReadonlyArray<LeasesFigures>): ReadonlyArray<string> => [
  "## Leases at scale: many long jobs beating in one process",
  "",
  `${figures[0]?.jobs ?? JOBS} MainLoops in one process on one mailbox, each job beating every 100 ms for ${SECONDS} s`,
  `(wall clock), visibility ${VISIBILITY_SECONDS} s, the lease extender's defaults (the first beat extends, then at`,
  "most once a minute). Extensions group-commit ahead of claims (internal/mailbox/sql/extensions.ts). Lost: jobs",
  "delivered again while their first worker was alive and beating, and extensions that failed (target 0; with every",
  "loop busy no receiver is free to take an expired lease again, so a lost lease shows as a failed extension). Database",
  "CPU per extension: the PostgreSQL cluster's processes (Linux `/proc`), over the whole run (claims and",
  "acknowledgements included); on SQLite the worker process's own CPU, which runs the database and everything else.",
  "The CPU hog is a child process spinning on one of the machine's cores beside the worker.",
  "",
  "| database | CPU hog | jobs | redelivered | extensions failed | extensions | statements | rows/statement mean | max | db CPU µs/extension | s |",
  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ...figures.map((f) =>
    `| ${f.database} | ${
      f.hog ? "yes" : "no"
    } | ${f.jobs} | ${f.redelivered} | ${f.failed} | ${f.extended} | ${f.statements} | ${
      f.meanRows.toFixed(1)
    } | ${f.maxRows} | ${f.dbCpuMicrosPerExtension?.toFixed(0) ?? "–"} | ${f.seconds.toFixed(0)} |`
  ),
  ""
]

// Run as a script (not when bundled into `npm run bench`'s run.mjs).
if (/leases\.ts$/.test(process.argv[1] ?? "")) {
  const only = process.env.LEASES_DATABASE as Database | undefined
  const program = Effect.gen(function*() {
    const url = only === "SQLite" ? undefined : (yield* Postgres.cluster).url
    const figures = yield* Effect.promise(() => measureLeases(url, (line) => process.stdout.write(line + "\n"), only))
    process.stdout.write(leasesSection(figures).join("\n") + "\n")
  }).pipe(Effect.scoped)
  const fiber = Effect.runFork(program)
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => Effect.runFork(Fiber.interrupt(fiber)))
  }
  fiber.addObserver((exit) => {
    if (Exit.isFailure(exit)) {
      process.stderr.write(String(exit.cause) + "\n")
      process.exitCode = 1
    }
  })
}
