/**
 * How cost grows with the work: the durable mailbox's claim → acknowledge
 * throughput and its claim latency as the backlog grows (10 k, 100 k, 1 M
 * messages queued), among 1,000 queues of which 10 are busy, and after a burst
 * has left dead rows behind; and the memory of a worker process, idle and
 * holding 10,000 leases (measured in child processes: bench/support/workerMemory.ts).
 *
 * Queues are filled by one bulk `INSERT … SELECT` in the shape `send` stores
 * (the statement in `internal/mailbox/sql/statements.ts`: the queue, the body as
 * the codec writes it — JSON of the encoded value —, `visible_at` and
 * `enqueued_at` the database's time, no reply queue, no handle, 0 deliveries):
 * a million sends would take minutes, and every send of one group commit
 * shares its time as these rows do. Each measurement then drains the same
 * number of messages from the front of the queue with consumer fibers
 * (`receive` up to 10, then `Mailbox.settleAll` of the batch: acknowledgements
 * group-committed across fibers), so every size does the same work, and tops
 * the queue up again (untimed) for the next round. Sizes alternate round by
 * round; the figures are medians of the rounds after a warm-up round each.
 * Besides the rate and the claim latency, each drain counts the CPU time per
 * message of this process (which runs SQLite) and of the PostgreSQL cluster:
 * on a machine shared with other work the wall clock swings far more.
 *
 * Run alone (`SCALE_DATABASE=PostgreSQL` or `SQLite` for one of them; `raw` is the size case without ANALYZE):
 * `npm run build && node --import tsx bench/scale.ts [scale|raw|queues|dead|dead-autovacuum|memory]…` (the
 * compiled package; `node --conditions=leasehold-source --import tsx …` runs the sources instead, no build).
 * PostgreSQL is a throwaway cluster of its own (test/support/postgres.ts). `dead-autovacuum` is the dead-rows
 * case with autovacuum left on for the burst's table, reporting how often it ran; `SCALE_NAPTIME=5s` sets the
 * cluster's `autovacuum_naptime` for it (a server setting: 1 min by default, longer than the case).
 */
import type { SqlClient } from "@effect/sql/SqlClient"
import * as SqlClientTag from "@effect/sql/SqlClient"
import { Context, Effect, Either, Exit, Fiber, Layer, Option, Schema } from "effect"
import { Mailbox, MailboxSql } from "leasehold"
import { spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import * as Postgres from "../test/support/postgres.js"
import type { MemoryFigures, MemoryMode } from "./support/workerMemory.js"

/** Backlog sizes, messages drained per measurement, consumer fibers, measured rounds (after a warm-up). */
export const SIZES = [10_000, 100_000, 1_000_000] as const
export const DRAIN = 10_000
export const CONSUMERS = 8
export const SCALE_ROUNDS = 3
/** Many queues: how many, how many of them busy, what each idle one holds, drained per busy queue per round. */
export const QUEUES = 1_000
export const BUSY = 10
export const IDLE_BACKLOG = 100
export const BUSY_DRAIN = 1_000
/** Dead rows: the burst sent and acknowledged before the measurement. */
export const BURST = 100_000
/** Leases held by the memory case. */
export const LEASES = 10_000

/** The bodies: a small job, as JSON of `Job`'s encoding. */
const Job = Schema.Struct({ id: Schema.Number, payload: Schema.String })
type Job = typeof Job.Type
const PAYLOAD = "x".repeat(64)

export type DatabaseLabel = "PostgreSQL" | "SQLite"

/** Where a scenario's tables live: a PostgreSQL cluster (tables by prefix) or a directory of SQLite files. */
export interface Databases {
  readonly pgUrl: string
  readonly sqliteDir: string
}

/**
 * A drain's figures: messages per second, the 99th percentile of its `receive` calls, and the CPU time per
 * message (µs) of this process (SQLite's work included: it runs in it) and of the PostgreSQL server — which
 * the load of a shared machine disturbs far less than the wall clock.
 */
export interface Drained {
  readonly rate: number
  readonly p99Millis: number
  readonly nodeCpuMicros: number
  readonly serverCpuMicros: number | undefined
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

const percentile = (values: ReadonlyArray<number>, p: number) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.max(0, Math.ceil(p * sorted.length) - 1)] ?? Number.NaN
}

const medianOf = (runs: ReadonlyArray<Drained>): Drained => ({
  rate: median(runs.map((run) => run.rate)),
  p99Millis: median(runs.map((run) => run.p99Millis)),
  nodeCpuMicros: median(runs.map((run) => run.nodeCpuMicros)),
  serverCpuMicros: runs.some((run) => run.serverCpuMicros === undefined)
    ? undefined
    : median(runs.map((run) => run.serverCpuMicros!))
})

/**
 * Nanoseconds on CPU of one PostgreSQL cluster — its postmaster (found by the port on its command line) and
 * that process's children — from Linux `/proc`; `undefined` where it cannot be read. Other clusters on the
 * machine are not counted.
 */
export const serverCpuNanos = (port: string) => (): number | undefined => {
  try {
    const pids = readdirSync("/proc").filter((pid) => /^\d+$/.test(pid))
    const read = (pid: string, file: string) => {
      try {
        return readFileSync(`/proc/${pid}/${file}`, "utf8")
      } catch {
        return "" // the process ended meanwhile
      }
    }
    const postmaster = pids.find((pid) => {
      const args = read(pid, "cmdline").split("\0")
      const at = args.indexOf("-p")
      return args[0]?.endsWith("postgres") === true && at >= 0 && args[at + 1] === port
    })
    if (postmaster === undefined) return undefined
    let total = 0
    for (const pid of pids) {
      // Field 4 of `stat` is the parent; the command (field 2) is in parentheses and may hold spaces.
      const stat = read(pid, "stat")
      const parent = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]
      if (pid === postmaster || parent === postmaster) total += Number(read(pid, "schedstat").split(" ")[0] ?? 0)
    }
    return total
  } catch {
    return undefined
  }
}

const now = Effect.sync(() => performance.now())

// --- Tables -----------------------------------------------------------------------------------

/** One store of a scenario: its client (and resolver), and the table of its messages. */
interface Opened {
  readonly context: Context.Context<MailboxSql.Services>
  /** The database server's CPU time so far (ns): PostgreSQL's; `undefined` for SQLite, which runs in this process. */
  readonly serverCpu: () => number | undefined
  readonly sql: SqlClient
  readonly prefix: string
  readonly table: string
}

/** Opens `name`'s store: on PostgreSQL tables prefixed `<name>_`, on SQLite a file of its own. */
const open = (database: DatabaseLabel, databases: Databases, name: string) =>
  Effect.gen(function*() {
    const layer = database === "PostgreSQL"
      ? MailboxSql.layerPg({ url: databases.pgUrl })
      : MailboxSql.layerSqlite({ filename: join(databases.sqliteDir, `${name}.db`) })
    const context = yield* Layer.build(Layer.fresh(layer)).pipe(Effect.orDie)
    const prefix = `${name}_`
    return {
      context,
      serverCpu: database === "PostgreSQL" ? serverCpuNanos(new URL(databases.pgUrl).port) : () => undefined,
      sql: Context.get(context, SqlClientTag.SqlClient),
      prefix,
      table: `${prefix}mailbox_messages`
    }
  })

/** A mailbox of jobs on an opened store (its tables created by the first). */
const mailboxOn = (opened: Opened, queue: string) =>
  MailboxSql.make({ name: queue, schema: Job, prefix: opened.prefix }).pipe(
    Effect.provide(opened.context),
    Effect.orDie
  )

/** Queue `k` of `base`: the names `fill` writes. */
const queueName = (base: string, k: number) => `${base}-${k}`

/**
 * Inserts `perQueue` messages into each of the queues `base-0` … `base-(queues - 1)`, round robin (as sends
 * to several queues arrive over time), in the shape `send` stores: the body `{"id":n,"payload":"…"}` as
 * JSON.stringify writes it, `visible_at` and `enqueued_at` the database's time in epoch milliseconds (the
 * expressions of `databaseNow` in internal/sql/common.ts), no reply queue. One statement: on SQLite one
 * transaction, a recursive CTE for the numbers.
 */
const fill = (opened: Opened, base: string, queues: number, perQueue: number) => {
  const { sql, table } = opened
  const total = queues * perQueue
  return sql.onDialectOrElse({
    pg: () =>
      sql`INSERT INTO ${sql(table)} (queue, body, visible_at, enqueued_at, reply_to)
        SELECT ${base}::text || '-' || (i % ${queues}::integer),
          '{"id":' || (i / ${queues}::integer) || ',"payload":"' || ${PAYLOAD}::text || '"}', c.now, c.now, NULL
        FROM generate_series(0, ${total - 1}::integer) AS i,
          (SELECT (floor(extract(epoch from statement_timestamp()) * 1000))::bigint AS now) AS c`,
    orElse: () =>
      // Numbers are bound as floating point (SQLite's REAL): cast, or `i % 1` names the queue "jobs-0.0".
      sql`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < CAST(${total - 1} AS INTEGER)),
          c(now) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
          k(queues) AS (SELECT CAST(${queues} AS INTEGER))
        INSERT INTO ${sql(table)} (queue, body, visible_at, enqueued_at, reply_to)
        SELECT ${base} || '-' || (i % queues), '{"id":' || (i / queues) || ',"payload":"' || ${PAYLOAD} || '"}',
          c.now, c.now, NULL
        FROM n, c, k`
  }).pipe(Effect.asVoid, Effect.orDie)
}

/** Updates the planner's statistics of the store's table (fair after a bulk fill: autovacuum would, later). */
const analyze = (opened: Opened) =>
  opened.sql.onDialectOrElse({
    pg: () => opened.sql`ANALYZE ${opened.sql(opened.table)}`,
    orElse: () => opened.sql`ANALYZE`
  }).pipe(Effect.asVoid, Effect.orDie)

/** Turns PostgreSQL's autovacuum off for the store's table, so dead rows stay until the measurement is done. */
const noAutovacuum = (opened: Opened) =>
  opened.sql.onDialectOrElse({
    pg: () =>
      opened.sql`ALTER TABLE ${
        opened.sql(opened.table)
      } SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)`,
    orElse: () => opened.sql`SELECT 1`
  }).pipe(Effect.asVoid, Effect.orDie)

/** Removes dead rows: PostgreSQL's VACUUM of the table; SQLite rebuilds the file (deleted rows leave free pages). */
const vacuum = (opened: Opened) =>
  opened.sql.onDialectOrElse({
    pg: () => opened.sql`VACUUM ${opened.sql(opened.table)}`,
    orElse: () => opened.sql`VACUUM`
  }).pipe(Effect.asVoid, Effect.orDie)

/** Rows in the dead-letter table: a body in the wrong shape would have gone there instead of to a consumer. */
const deadLettered = (opened: Opened) =>
  Effect.map(
    opened.sql<{ n: number | string }>`SELECT count(*) AS n FROM ${opened.sql(`${opened.prefix}mailbox_dead_letters`)}`,
    (rows) => Number(rows[0]?.n ?? 0)
  ).pipe(Effect.orDie)

const checkNoDeadLetters = (opened: Opened) =>
  Effect.flatMap(
    deadLettered(opened),
    (n) => n === 0 ? Effect.void : Effect.dieMessage(`${n} bodies of ${opened.table} did not decode`)
  )

// --- Draining ---------------------------------------------------------------------------------

/**
 * Drains `perQueue` messages from each mailbox with `consumers` fibers per mailbox: each receives up to 10
 * (never more than its mailbox has left to drain, so every drain does the same work) and acknowledges the
 * batch with `Mailbox.settleAll`. Times each `receive` that returned messages.
 */
const drain = (
  mailboxes: ReadonlyArray<Mailbox.Mailbox<Job>>,
  perQueue: number,
  consumers: number,
  serverCpu: () => number | undefined
): Effect.Effect<Drained, never, Mailbox.MailboxResolver> =>
  Effect.gen(function*() {
    const latencies: Array<number> = []
    const serverBefore = serverCpu()
    const nodeBefore = process.cpuUsage()
    const started = yield* now
    yield* Effect.forEach(mailboxes, (mailbox) => {
      let reserved = 0
      const consumer = Effect.gen(function*() {
        while (reserved < perQueue) {
          const wanted = Math.min(10, perQueue - reserved)
          reserved += wanted
          const asked = yield* now
          const batch = yield* mailbox.receive({ maxMessages: wanted, waitTime: "1 second" })
          // The queue holds what is to be drained: an empty receive means a fill went wrong (no hanging on it).
          if (batch.length === 0) return yield* Effect.dieMessage(`${mailbox.name} ran dry`)
          latencies.push((yield* now) - asked)
          reserved -= wanted - batch.length
          const outcomes = yield* Mailbox.settleAll(batch.map((message) => ({ message, reply: Option.none<never>() })))
          if (outcomes.some(Either.isLeft)) return yield* Effect.dieMessage("an acknowledgement failed")
        }
      })
      return Effect.all(Array.from({ length: consumers }, () => consumer), { concurrency: "unbounded", discard: true })
    }, { concurrency: "unbounded", discard: true })
    const seconds = ((yield* now) - started) / 1000
    const nodeUsed = process.cpuUsage(nodeBefore)
    const serverAfter = serverCpu()
    const messages = perQueue * mailboxes.length
    return {
      rate: messages / seconds,
      p99Millis: percentile(latencies, 0.99),
      nodeCpuMicros: (nodeUsed.user + nodeUsed.system) / messages,
      serverCpuMicros: serverBefore === undefined || serverAfter === undefined
        ? undefined
        : (serverAfter - serverBefore) / 1000 / messages
    }
  }).pipe(Effect.orDie)

const drainOn = (opened: Opened, mailboxes: ReadonlyArray<Mailbox.Mailbox<Job>>, perQueue: number, consumers: number) =>
  Effect.provide(drain(mailboxes, perQueue, consumers, opened.serverCpu), opened.context)

// --- 1. Backlog size --------------------------------------------------------------------------

export interface ScaleFigures {
  /** By backlog size. */
  readonly bySize: ReadonlyArray<
    { readonly size: number; readonly drained: Drained; readonly runs: ReadonlyArray<Drained> }
  >
  /** Seconds the fill of each size took (the bulk insert and ANALYZE). */
  readonly fillSeconds: ReadonlyArray<number>
}

/**
 * Each size in a store of its own, filled and analysed, then drained `DRAIN` from the front per round (sizes
 * alternating), topped up after each drain. `analyzed: false` skips ANALYZE (and, on PostgreSQL, keeps
 * autovacuum from running it) to see what the planner does on a table it knows nothing about.
 */
export const scale = (
  database: DatabaseLabel,
  databases: Databases,
  options: { readonly sizes?: ReadonlyArray<number>; readonly rounds?: number; readonly analyzed?: boolean } = {}
): Effect.Effect<ScaleFigures> =>
  Effect.scoped(Effect.gen(function*() {
    const sizes = options.sizes ?? SIZES
    const rounds = options.rounds ?? SCALE_ROUNDS
    const analyzed = options.analyzed ?? true
    const stores: Array<{ size: number; opened: Opened; mailbox: Mailbox.Mailbox<Job> }> = []
    const fillSeconds: Array<number> = []
    for (const size of sizes) {
      const opened = yield* open(database, databases, `scale${size}${analyzed ? "" : "_raw"}`)
      const mailbox = yield* mailboxOn(opened, queueName("jobs", 0))
      if (!analyzed) yield* noAutovacuum(opened)
      const started = yield* now
      yield* fill(opened, "jobs", 1, size)
      if (analyzed) yield* analyze(opened)
      fillSeconds.push(((yield* now) - started) / 1000)
      stores.push({ size, opened, mailbox })
    }
    const runs = stores.map(() => [] as Array<Drained>)
    for (let round = 0; round <= rounds; round++) {
      for (const [index, { mailbox, opened }] of stores.entries()) {
        const drained = yield* drainOn(opened, [mailbox], DRAIN, CONSUMERS)
        if (round > 0) runs[index]!.push(drained)
        yield* fill(opened, "jobs", 1, DRAIN)
      }
    }
    for (const { opened } of stores) yield* checkNoDeadLetters(opened)
    return {
      bySize: stores.map(({ size }, index) => ({ size, drained: medianOf(runs[index]!), runs: runs[index]! })),
      fillSeconds
    }
  }))

// --- 2. Many queues, few busy -----------------------------------------------------------------

export interface QueuesFigures {
  /** The 10 busy queues in a table that also holds 990 idle queues' messages. */
  readonly among: Drained
  /** The same 10 busy queues alone in their table. */
  readonly alone: Drained
}

/**
 * `QUEUES` queues hold `IDLE_BACKLOG` messages each (round robin, as sends to many queues arrive) and nobody
 * receives from 990 of them; the 10 busy ones each have a consumer fiber and drain `BUSY_DRAIN` per round,
 * topped up after. Baseline: the same 10 busy queues alone in a table of their own. Rounds alternate.
 */
export const manyQueues = (
  database: DatabaseLabel,
  databases: Databases,
  options: { readonly rounds?: number } = {}
): Effect.Effect<QueuesFigures> =>
  Effect.scoped(Effect.gen(function*() {
    const rounds = options.rounds ?? SCALE_ROUNDS
    const setups = yield* Effect.forEach(
      [["among", QUEUES], ["alone", BUSY]] as const,
      ([label, queues]) =>
        Effect.gen(function*() {
          const opened = yield* open(database, databases, `queues_${label}`)
          // The busy queues are the first 10 of the fill's names, so both tables hold them alike.
          const mailboxes = yield* Effect.forEach(
            Array.from({ length: BUSY }, (_, k) => queueName("q", k)),
            (queue) => mailboxOn(opened, queue)
          )
          yield* fill(opened, "q", queues, IDLE_BACKLOG)
          yield* analyze(opened)
          return { label, opened, mailboxes }
        })
    )
    const runs = { among: [] as Array<Drained>, alone: [] as Array<Drained> }
    for (let round = 0; round <= rounds; round++) {
      for (const { label, mailboxes, opened } of setups) {
        yield* fill(opened, "q", BUSY, BUSY_DRAIN)
        const drained = yield* drainOn(opened, mailboxes, BUSY_DRAIN, 1)
        if (round > 0) runs[label].push(drained)
      }
    }
    for (const { opened } of setups) yield* checkNoDeadLetters(opened)
    return { among: medianOf(runs.among), alone: medianOf(runs.alone) }
  }))

// --- 3. Dead rows -----------------------------------------------------------------------------

export interface DeadRowsFigures {
  /** The burst: `BURST` messages drained through the same consumers. */
  readonly burst: Drained
  /** A fresh `DRAIN` in the table the burst left, autovacuum off (on with the `autovacuum` option). */
  readonly afterBurst: Drained
  /** The same in a table vacuumed before each round. */
  readonly clean: Drained
  /** With the `autovacuum` option, on PostgreSQL: autovacuum's runs on the burst's table and its dead rows at the end. */
  readonly autovacuum?: { readonly runs: number; readonly deadRows: number }
}

/**
 * A burst of `BURST` messages is sent (bulk) and drained — claimed and acknowledged: on PostgreSQL each
 * leaves a dead row version per claim and per acknowledgement, with autovacuum off for the table — then
 * each round fills `DRAIN` fresh messages and drains them, beside a table that is vacuumed before each
 * round (autovacuum off too, so only the dead rows differ). Rounds alternate; the burst's table gains the
 * dead rows of each round's drain as it goes.
 *
 * `autovacuum` leaves autovacuum on for the burst's table (at the table's own settings), to see what it does
 * within the case; `naptime` sets the cluster's `autovacuum_naptime` meanwhile (reset after: a server setting,
 * which no table setting replaces). Both apply to PostgreSQL only.
 */
export const deadRows = (
  database: DatabaseLabel,
  databases: Databases,
  options: {
    readonly rounds?: number
    readonly burst?: number
    readonly autovacuum?: boolean
    readonly naptime?: string
  } = {}
): Effect.Effect<DeadRowsFigures> =>
  Effect.scoped(Effect.gen(function*() {
    const rounds = options.rounds ?? SCALE_ROUNDS
    const burst = options.burst ?? BURST
    const autovacuum = options.autovacuum === true && database === "PostgreSQL"
    const setups = yield* Effect.forEach(["afterBurst", "clean"] as const, (label) =>
      Effect.gen(function*() {
        const opened = yield* open(database, databases, `dead_${label.toLowerCase()}${autovacuum ? "_av" : ""}`)
        const mailbox = yield* mailboxOn(opened, queueName("jobs", 0))
        if (!(autovacuum && label === "afterBurst")) yield* noAutovacuum(opened)
        return { label, opened, mailbox }
      }))
    if (autovacuum && options.naptime !== undefined) yield* setNaptime(setups[0]!.opened, options.naptime)
    const [dirty] = setups
    yield* fill(dirty!.opened, "jobs", 1, burst)
    yield* analyze(dirty!.opened)
    const burstDrained = yield* drainOn(dirty!.opened, [dirty!.mailbox], burst, CONSUMERS)
    const runs = { afterBurst: [] as Array<Drained>, clean: [] as Array<Drained> }
    for (let round = 0; round <= rounds; round++) {
      for (const { label, mailbox, opened } of setups) {
        if (label === "clean") yield* vacuum(opened)
        yield* fill(opened, "jobs", 1, DRAIN)
        const drained = yield* drainOn(opened, [mailbox], DRAIN, CONSUMERS)
        if (round > 0) runs[label].push(drained)
      }
    }
    for (const { opened } of setups) yield* checkNoDeadLetters(opened)
    const figures = { burst: burstDrained, afterBurst: medianOf(runs.afterBurst), clean: medianOf(runs.clean) }
    return autovacuum ? { ...figures, autovacuum: yield* autovacuumOf(dirty!.opened) } : figures
  }))

/**
 * Sets the cluster's `autovacuum_naptime` (a server setting, reloaded at once) until the scope closes. ALTER SYSTEM
 * takes no parameters: the value must look like a duration (`5s`, `500ms`, `1min`).
 */
const setNaptime = (opened: Opened, naptime: string) =>
  Effect.acquireRelease(
    /^\d+(ms|s|min)$/.test(naptime)
      ? Effect.zipRight(
        opened.sql.unsafe(`ALTER SYSTEM SET autovacuum_naptime = '${naptime}'`),
        opened.sql`SELECT pg_reload_conf()`
      ).pipe(Effect.orDie)
      : Effect.dieMessage(`SCALE_NAPTIME=${naptime} is not a duration like 5s, 500ms or 1min`),
    () =>
      Effect.zipRight(opened.sql`ALTER SYSTEM RESET autovacuum_naptime`, opened.sql`SELECT pg_reload_conf()`).pipe(
        Effect.ignore
      )
  )

/** Autovacuum's runs on the store's table so far, and its dead rows (PostgreSQL's statistics, a moment behind). */
const autovacuumOf = (opened: Opened) =>
  Effect.map(
    opened.sql<{ runs: number | string; dead: number | string }>`SELECT autovacuum_count AS runs,
      n_dead_tup AS dead FROM pg_stat_user_tables WHERE relname = ${opened.table}`,
    (rows) => ({ runs: Number(rows[0]?.runs ?? 0), deadRows: Number(rows[0]?.dead ?? 0) })
  ).pipe(Effect.orDie)

// --- 5. Memory --------------------------------------------------------------------------------

/** The memory cases: the child's modes, and `bare` — Node importing `effect` without tsx, for scale. */
export type MemoryCase = MemoryMode | "bare"

/**
 * Each case's memory, in processes of its own (bench/support/workerMemory.ts): medians of `rounds` processes,
 * cases alternating — but one process for the `LEASES` loops, which takes tens of seconds to set up.
 */
export const memory = (dir: string, rounds = 3): Effect.Effect<Record<MemoryCase, MemoryFigures>> =>
  Effect.gen(function*() {
    const cases: ReadonlyArray<MemoryCase> = ["bare", "baseline", "idle", "received", "loops"]
    const runs = Object.fromEntries(cases.map((mode) => [mode, [] as Array<MemoryFigures>])) as Record<
      MemoryCase,
      Array<MemoryFigures>
    >
    for (let round = 0; round < rounds; round++) {
      for (const mode of cases) {
        if (mode === "loops" && round > 0) continue
        runs[mode].push(yield* child(mode, join(dir, `memory-${mode}-${round}.db`)))
      }
    }
    return Object.fromEntries(cases.map((mode) => [mode, {
      rss: median(runs[mode].map((run) => run.rss)),
      heapUsed: median(runs[mode].map((run) => run.heapUsed)),
      external: median(runs[mode].map((run) => run.external))
    }])) as Record<MemoryCase, MemoryFigures>
  })

/** What `bare` runs: `effect` imported by plain Node, an empty program that waits, then the same report. */
const bareProgram = `
const { Effect } = await import("effect")
Effect.runFork(Effect.never)
await Effect.runPromise(Effect.sleep("500 millis"))
for (let i = 0; i < 2; i++) { gc(); await new Promise((resolve) => setImmediate(resolve)) }
const { external, heapUsed, rss } = process.memoryUsage()
console.log(JSON.stringify({ rss, heapUsed, external }))
process.exit(0)`

/** Runs the memory child in `mode`; its figures, printed as its last line of output. */
const child = (mode: MemoryCase, filename: string) =>
  Effect.async<MemoryFigures>((resume) => {
    const args = mode === "bare"
      ? ["--expose-gc", "--input-type=module", "-e", bareProgram]
      : [
        // The compiled package (dist, built by `npm run bench`), as users run it; tsx only loads the child.
        "--expose-gc",
        "--import",
        "tsx",
        join(process.cwd(), "bench", "support", "workerMemory.ts"),
        mode,
        filename,
        String(LEASES)
      ]
    // From the repository (the bench runs there, bundled or not), where `effect` resolves for the bare case too.
    const process_ = spawn("node", args, { cwd: process.cwd(), stdio: ["ignore", "pipe", "pipe"] })
    let output = ""
    process_.stdout.on("data", (chunk: Buffer) => (output += chunk))
    process_.stderr.on("data", (chunk: Buffer) => (output += chunk))
    process_.on("exit", (code) => {
      const last = output.trim().split("\n").at(-1) ?? ""
      resume(
        code === 0 && last.startsWith("{")
          ? Effect.succeed(JSON.parse(last) as MemoryFigures)
          : Effect.dieMessage(`memory child ${mode} exited ${code}: ${output}`)
      )
    })
    return Effect.sync(() => process_.kill("SIGKILL"))
  })

// --- All of it --------------------------------------------------------------------------------

export interface ScaleReport {
  readonly scale: Record<DatabaseLabel, ScaleFigures>
  readonly queues: Record<DatabaseLabel, QueuesFigures>
  readonly dead: Record<DatabaseLabel, DeadRowsFigures>
  readonly memory: Record<MemoryCase, MemoryFigures>
  readonly seconds: number
}

const databaseLabels: ReadonlyArray<DatabaseLabel> = ["PostgreSQL", "SQLite"]

/** Every case of the section, on the cluster at `pgUrl` and SQLite files in a temporary directory. */
export const measureScale = (pgUrl: string, log: (line: string) => void): Promise<ScaleReport> =>
  Effect.runPromise(
    Effect.gen(function*() {
      const started = yield* now
      const sqliteDir = mkdtempSync(join(tmpdir(), "leasehold-scale-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(sqliteDir, { recursive: true, force: true })))
      const databases = { pgUrl, sqliteDir }
      const scaleFigures = {} as Record<DatabaseLabel, ScaleFigures>
      const queues = {} as Record<DatabaseLabel, QueuesFigures>
      const dead = {} as Record<DatabaseLabel, DeadRowsFigures>
      for (const database of databaseLabels) {
        scaleFigures[database] = yield* scale(database, databases)
        for (const { drained, size } of scaleFigures[database].bySize) {
          log(`scale ${database} ${size}: ${show(drained)}`)
        }
        queues[database] = yield* manyQueues(database, databases)
        log(`queues ${database}: among ${show(queues[database].among)}, alone ${show(queues[database].alone)}`)
        dead[database] = yield* deadRows(database, databases)
        log(
          `dead rows ${database}: burst ${show(dead[database].burst)}, after ${show(dead[database].afterBurst)}, ` +
            `clean ${show(dead[database].clean)}`
        )
      }
      const memoryFigures = yield* memory(sqliteDir)
      for (const [mode, figures] of Object.entries(memoryFigures)) {
        log(`memory ${mode}: rss ${mib(figures.rss)} MiB, heap ${mib(figures.heapUsed)} MiB`)
      }
      return {
        scale: scaleFigures,
        queues,
        dead,
        memory: memoryFigures,
        seconds: ((yield* now) - started) / 1000
      }
    }).pipe(Effect.scoped)
  )

const fmt = (n: number) => Math.round(n).toLocaleString("en-US")
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1)
const cpuText = (drained: Drained) =>
  `${drained.nodeCpuMicros.toFixed(0)}${
    drained.serverCpuMicros === undefined ? "" : ` + ${drained.serverCpuMicros.toFixed(0)}`
  } µs/msg`
const show = (drained: Drained) =>
  `${fmt(drained.rate)} msg/s, p99 ${drained.p99Millis.toFixed(1)} ms, ${cpuText(drained)}`

const cpuCell = (micros: number | undefined) => micros === undefined ? "–" : micros.toFixed(0)

/** The figures the wave's targets table reads: SQLite's largest backlog ÷ 10 k (throughput), heap per loop. */
export const scaleTargets = (report: ScaleReport) => {
  const sizes = report.scale.SQLite.bySize
  const { idle, loops } = report.memory
  return {
    sqlite1MRatio: sizes[sizes.length - 1]!.drained.rate / sizes[0]!.drained.rate,
    heapPerLoopKiB: (loops.heapUsed - idle.heapUsed) / LEASES / 1024
  }
}

/** The section of BENCHMARKS.md. */
export const scaleSection = (report: ScaleReport): ReadonlyArray<string> => {
  const scaleRows = databaseLabels.flatMap((database) => {
    const [first] = report.scale[database].bySize
    return report.scale[database].bySize.map(({ drained, size }) =>
      `| ${database} | ${fmt(size)} | ${fmt(drained.rate)} | ${(drained.rate / first!.drained.rate).toFixed(2)} | ${
        drained.p99Millis.toFixed(1)
      } | ${(drained.p99Millis / first!.drained.p99Millis).toFixed(2)}× | ${cpuCell(drained.nodeCpuMicros)} | ${
        cpuCell(drained.serverCpuMicros)
      } |`
    )
  })
  const pair = (label: string, subject: Drained, baseline: Drained) =>
    `| ${label} | ${fmt(subject.rate)} | ${fmt(baseline.rate)} | ${(subject.rate / baseline.rate).toFixed(2)} | ${
      subject.p99Millis.toFixed(1)
    } | ${baseline.p99Millis.toFixed(1)} | ${cpuCell(subject.nodeCpuMicros)} / ${cpuCell(baseline.nodeCpuMicros)} | ${
      cpuCell(subject.serverCpuMicros)
    } / ${cpuCell(baseline.serverCpuMicros)} |`
  const queueRows = databaseLabels.map((database) =>
    pair(database, report.queues[database].among, report.queues[database].alone)
  )
  const deadRows_ = databaseLabels.map((database) =>
    pair(database, report.dead[database].afterBurst, report.dead[database].clean)
  )
  const burstRows = databaseLabels.map((database) => {
    const { burst } = report.dead[database]
    return `| ${database} | ${fmt(burst.rate)} | ${burst.p99Millis.toFixed(1)} | ${cpuCell(burst.nodeCpuMicros)} | ${
      cpuCell(burst.serverCpuMicros)
    } |`
  })
  const { baseline, idle } = report.memory
  const memoryRow = (mode: MemoryCase, label: string, perLease: boolean) => {
    const figures = report.memory[mode]
    // The bare row is below the baseline by what tsx adds: no "over" figures for it.
    const over = (bytes: number) => mode === "bare" ? "" : `+${mib(bytes)}`
    return `| ${label} | ${mib(figures.rss)} | ${over(figures.rss - baseline.rss)} | ${mib(figures.heapUsed)} | ${
      over(figures.heapUsed - baseline.heapUsed)
    } | ${perLease ? ((figures.heapUsed - idle.heapUsed) / LEASES / 1024).toFixed(1) : ""} |`
  }
  return [
    "## How cost grows with the work",
    "",
    "The durable mailbox as its backlog grows (bench/scale.ts). Queues are filled by one bulk `INSERT … SELECT`",
    "in the shape `send` stores (bodies as the codec writes them: a check that no body was dead-lettered proves",
    "they decode), then `ANALYZE` — fair: autovacuum analyses a table soon after such a fill, and it changes no",
    "plan: PostgreSQL's claim function pins its plan (no bitmap scan, no sort), SQLite's claim walks the index",
    `with or without statistics. Each measurement drains ${
      fmt(DRAIN)
    } messages from the front with ${CONSUMERS} consumer`,
    "fibers — `receive` up to 10 (1 s long poll), then `Mailbox.settleAll` of the batch (acknowledgements",
    "group-committed across fibers) — and the queue is topped up after, untimed, so every size does the same work",
    "on the same backlog. Each size has a table (SQLite: a file) of its own; sizes alternate round by round;",
    `medians of ${SCALE_ROUNDS} rounds after a warm-up. p99 is the 99th percentile of the \`receive\` calls (the claim,`,
    "with the wait for another fiber's claim already running). CPU is per message, in µs: this Node process's (which",
    "runs SQLite) and the PostgreSQL cluster's (its processes' time on CPU from Linux `/proc`) — steadier than the",
    "wall clock on a shared machine. PostgreSQL: the throwaway cluster of the other sections, autovacuum on as by",
    "default; SQLite: WAL files, synchronous=NORMAL. Target: at 1 M queued, ≥ 0.80 of the 10 k throughput and",
    "p99 ≤ 2×.",
    "",
    "| database | queued | msg/s | ÷ 10 k | p99 receive (ms) | ÷ 10 k | Node CPU µs/msg | server CPU µs/msg |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...scaleRows,
    "",
    `${
      fmt(QUEUES)
    } queues in one table, each holding ${IDLE_BACKLOG} messages (sent round robin), nobody receiving from`,
    `${fmt(QUEUES - BUSY)} of them (the harder case than empty ones: their rows fill the table and its index). The`,
    `${BUSY} busy ones have a mailbox and one consumer fiber each (receive up to 10, settleAll) and drain`,
    `${
      fmt(BUSY_DRAIN)
    } messages each per round, topped up before it. Baseline: the same ${BUSY} busy queues alone in a`,
    "table. Rounds alternate. (Claims and acknowledgements are grouped per mailbox, so ten mailboxes of one",
    "consumer each run statements of at most 10 rows: compare with the baseline, not with the single queue above.)",
    "",
    "| database | 10 busy among 1,000: msg/s | alone: msg/s | among ÷ alone | p99 among (ms) | p99 alone (ms) | Node CPU µs/msg among / alone | server CPU µs/msg among / alone |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...queueRows,
    "",
    `Dead rows: ${fmt(BURST)} messages sent (bulk) and drained by the consumers above, then each round fills`,
    `${fmt(DRAIN)} fresh messages and drains them, beside a table vacuumed before each round. On PostgreSQL each`,
    "claim and each acknowledgement leaves a dead row version, and autovacuum is off for both tables: the queue's",
    "index keeps an entry for every dead version at the front of the queue (older `visible_at`), and each claim",
    "reads past them — skipping those an earlier scan marked dead, but still reading their index pages — until",
    "VACUUM removes them. The burst's table also keeps the dead rows of each round's drain. SQLite has no dead",
    "versions (a delete removes the index entry); deleted rows leave free pages, which the clean file's VACUUM",
    "removes.",
    "",
    "| database | after the burst: msg/s | vacuumed: msg/s | after ÷ vacuumed | p99 after (ms) | p99 vacuumed (ms) | Node CPU µs/msg after / vacuumed | server CPU µs/msg after / vacuumed |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...deadRows_,
    "",
    "The burst itself, one drain:",
    "",
    "| database | msg/s | p99 receive (ms) | Node CPU µs/msg | server CPU µs/msg |",
    "| --- | ---: | ---: | ---: | ---: |",
    ...burstRows,
    "",
    "Memory of a worker process (bench/support/workerMemory.ts over the compiled package, run as `node",
    "--expose-gc --import tsx`; tsx only loads the child): `process.memoryUsage()` after two",
    "full garbage collections. Baseline: the same way, a process that only imports `effect` and runs an empty",
    "program that waits; tsx's compiler and the compiled sources' maps are part of every process run this way, so",
    "the bare-Node row (no tsx) is given for scale. Idle: a MainLoop on a SQLite MailboxSql in its 20 s long poll",
    `on an empty queue. ${fmt(LEASES)} received: one mailbox, ${fmt(LEASES)} messages received (10 a call) and`,
    `held unacknowledged. ${fmt(LEASES)} loops: ${fmt(LEASES)} MainLoops on one mailbox, each in the middle of a`,
    "request (`execute` waits), its lease extender attached (no extension has run: the loop beats before it",
    "attaches the message, and `execute` does not beat; one more beat inside `execute`, and so an extension,",
    "adds about 0.5 KiB a loop) — a MainLoop handles one",
    `message at a time, so this is what a worker running ${fmt(LEASES)} requests at once holds. Medians of 3`,
    "processes, the loops' one process (it takes tens of seconds to set up). The last column is the heap over",
    "the idle worker's, per lease. Target for the loops: ≤ 16 KiB each (45.1 KiB before this round's changes: a",
    "loop now sets its context, heartbeat and loggers once on its fiber rather than holding a frame for each,",
    "and starts its settler fiber only when a batch has something to settle in the background).",
    "",
    "| process | RSS (MiB) | over baseline | heap used (MiB) | over baseline | heap per lease (KiB) |",
    "| --- | ---: | ---: | ---: | ---: | ---: |",
    memoryRow("bare", "bare Node importing effect (no tsx)", false),
    memoryRow("baseline", "baseline: empty Effect program", false),
    memoryRow("idle", "idle worker (MainLoop, SQLite)", false),
    memoryRow("received", `${fmt(LEASES)} messages received, unacknowledged`, true),
    memoryRow("loops", `${fmt(LEASES)} MainLoops, each holding a request`, true),
    "",
    `The section took ${report.seconds.toFixed(0)} s.`,
    ""
  ]
}

// --- Standalone -------------------------------------------------------------------------------

const standalone = (parts: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const only = process.env.SCALE_DATABASE as DatabaseLabel | undefined
    const pgUrl = only === "SQLite" ? "" : (yield* Postgres.cluster).url
    const sqliteDir = mkdtempSync(join(tmpdir(), "leasehold-scale-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(sqliteDir, { recursive: true, force: true })))
    const databases = { pgUrl, sqliteDir }
    const log = (line: string) => Effect.sync(() => process.stdout.write(line + "\n"))
    for (const database of databaseLabels.filter((label) => only === undefined || label === only)) {
      if (parts.includes("scale")) {
        const figures = yield* scale(database, databases)
        for (const { runs, size } of figures.bySize) {
          yield* log(`scale ${database} ${size}: ${runs.map(show).join(" | ")}`)
        }
        yield* log(`fill seconds: ${figures.fillSeconds.map((s) => s.toFixed(1)).join(", ")}`)
      }
      if (parts.includes("raw")) {
        const figures = yield* scale(database, databases, { sizes: [10_000, 1_000_000], analyzed: false })
        for (const { runs, size } of figures.bySize) {
          yield* log(`scale without ANALYZE ${database} ${size}: ${runs.map(show).join(" | ")}`)
        }
      }
      if (parts.includes("queues")) {
        const figures = yield* manyQueues(database, databases)
        yield* log(`queues ${database}: among ${show(figures.among)}, alone ${show(figures.alone)}`)
      }
      for (const part of ["dead", "dead-autovacuum"] as const) {
        if (!parts.includes(part)) continue
        const naptime = process.env.SCALE_NAPTIME
        const figures = yield* deadRows(database, databases, {
          autovacuum: part === "dead-autovacuum",
          ...(naptime === undefined ? {} : { naptime })
        })
        const { autovacuum } = figures
        yield* log(
          `${part} ${database}: burst ${show(figures.burst)}, after ${show(figures.afterBurst)}, clean ${
            show(figures.clean)
          }, after ÷ clean ${(figures.afterBurst.rate / figures.clean.rate).toFixed(2)}${
            autovacuum === undefined
              ? ""
              : `; autovacuum ran ${autovacuum.runs} times on the burst's table, ${
                fmt(autovacuum.deadRows)
              } dead rows left`
          }`
        )
      }
    }
    if (parts.includes("memory")) {
      const figures = yield* memory(sqliteDir)
      for (const [mode, f] of Object.entries(figures)) {
        yield* log(`memory ${mode}: rss ${mib(f.rss)} MiB, heap ${mib(f.heapUsed)} MiB, external ${mib(f.external)}`)
      }
    }
  }).pipe(Effect.scoped)

// Run as a script (not when bundled into `npm run bench`'s run.mjs, whose own URL `import.meta.url` then is).
if (/scale\.ts$/.test(process.argv[1] ?? "")) {
  const started = performance.now()
  const fiber = Effect.runFork(standalone(process.argv.slice(2)))
  // Ctrl-C or a timeout's SIGTERM: interrupt, so the throwaway cluster is stopped and the files removed.
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => Effect.runFork(Fiber.interrupt(fiber)))
  }
  fiber.addObserver((exit) => {
    process.stdout.write(`took ${((performance.now() - started) / 1000).toFixed(0)} s\n`)
    if (Exit.isFailure(exit)) {
      process.stderr.write(String(exit.cause) + "\n")
      process.exitCode = 1
    }
  })
}
