/**
 * One round of the scheduling-by-key bench (bench/keys.ts), alone in this process: bench/keys.ts spawns it
 * once per case per round and waits for it, so no case pays the heap, JIT state or garbage of another. It
 * prints its figures as one JSON line on stdout and exits; failures go to stderr with a non-zero exit.
 *
 * Queues are filled by one bulk `INSERT … SELECT` in the shape `send` stores (as bench/scale.ts fills them:
 * a million sends would take minutes), a keyed one with its key (`k00000` …, round robin: as sends of many
 * tenants arrive interleaved) and priority 0, and the keys' rows made beside them in the shape the first
 * keyed send makes them (`keys.ts`'s `prepareSend`: one row per key, active, share clock 0) — a bulk insert
 * does not go through `send`, so the queue is made scheduled through `MailboxSqlAdmin`'s `setKeySettings`,
 * which sets the queue's default limit too. Every fourth key has weight 2 (shares on).
 *
 * Cases (`--case`):
 * - `plain`: `--queued` messages with no key, then `--drain` of them drained (timed).
 * - `keyed`: the same over `--keys` keys, limit and weights on, then the same drain.
 * - `fill`: a keyed queue of `--queued` over `--keys` on a store kept for the rounds (`--prefix`), ANALYZEd.
 * - `backlog`: on a store `fill` made, `--drain` drained (timed), then every key topped up to
 *   `--queued / --keys` again (untimed), so each round drains the same backlog.
 *
 * Options: `--database PostgreSQL|SQLite`, `--url` (PostgreSQL) or `--sqlite <file>`, `--prefix` (fresh per
 * round but for `fill`/`backlog`), `--queued`, `--keys`, `--drain`, `--consumers` (8), `--limit` (the queue's
 * default per-key limit). The drain is bench/scale.ts's: consumer fibers `receive` up to 10 (never more than is
 * left to drain) and `Mailbox.settleAll` the batch. Only `plain` uses nothing of this change's API, so the
 * same bundle runs against an earlier build of the package (bench/keys.ts's "before" rounds).
 */
import type { SqlClient } from "@effect/sql/SqlClient"
import * as SqlClientTag from "@effect/sql/SqlClient"
import { Cause, Context, Effect, Either, Layer, Option, Schema } from "effect"
import { Mailbox, MailboxSql, MailboxSqlAdmin } from "leasehold"
import { readdirSync, readFileSync } from "node:fs"
import { performance } from "node:perf_hooks"
import { parseArgs } from "node:util"

const { values } = parseArgs({
  options: {
    case: { type: "string" },
    database: { type: "string" },
    url: { type: "string" },
    sqlite: { type: "string" },
    prefix: { type: "string" },
    queued: { type: "string", default: "20000" },
    keys: { type: "string", default: "1000" },
    drain: { type: "string", default: "10000" },
    consumers: { type: "string", default: "8" },
    limit: { type: "string", default: "2" }
  }
})

/** A drain's figures: messages per second, the 99th percentile of its receives, CPU per message (µs). */
export interface KeysRound {
  readonly rate: number
  readonly p99Millis: number
  readonly nodeCpuMicros: number
  readonly serverCpuMicros: number | undefined
  /** Seconds of the untimed part (the fill, or the top-up). */
  readonly setupSeconds: number
}

const Job = Schema.Struct({ id: Schema.Number, payload: Schema.String })
type Job = typeof Job.Type
const PAYLOAD = "x".repeat(64)
const QUEUE = "jobs"

const now = Effect.sync(() => performance.now())

const percentile = (values: ReadonlyArray<number>, p: number) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.max(0, Math.ceil(p * sorted.length) - 1)] ?? Number.NaN
}

/** The PostgreSQL cluster's CPU nanoseconds at `port` (its postmaster and children, Linux `/proc`). */
const serverCpuNanos = (port: string) => (): number | undefined => {
  try {
    const pids = readdirSync("/proc").filter((pid) => /^\d+$/.test(pid))
    const read = (pid: string, file: string) => {
      try {
        return readFileSync(`/proc/${pid}/${file}`, "utf8")
      } catch {
        return ""
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
      const stat = read(pid, "stat")
      const parent = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]
      if (pid === postmaster || parent === postmaster) total += Number(read(pid, "schedstat").split(" ")[0] ?? 0)
    }
    return total
  } catch {
    return undefined
  }
}

/** The store's tables, as `MailboxSql` names them under `prefix`. */
const tables = (prefix: string) => ({
  messages: `${prefix}mailbox_messages`,
  keys: `${prefix}mailbox_keys`
})

/**
 * `total` messages into the queue: with `keys`, key `i % keys` (round robin), else no key. One statement
 * (SQLite: a recursive CTE for the numbers), the database's time for `visible_at` and `enqueued_at`.
 */
const fill = (sql: SqlClient, prefix: string, total: number, keys: number | undefined) => {
  const table = sql(tables(prefix).messages)
  return sql.onDialectOrElse({
    pg: () =>
      keys === undefined
        ? sql`INSERT INTO ${table} (queue, body, visible_at, enqueued_at, reply_to)
          SELECT ${QUEUE}::text, '{"id":' || i || ',"payload":"' || ${PAYLOAD}::text || '"}', c.now, c.now, NULL
          FROM generate_series(0, ${total - 1}::integer) AS i,
            (SELECT (floor(extract(epoch from statement_timestamp()) * 1000))::bigint AS now) AS c`
        : sql`INSERT INTO ${table} (queue, body, visible_at, enqueued_at, reply_to, key, priority)
          SELECT ${QUEUE}::text, '{"id":' || i || ',"payload":"' || ${PAYLOAD}::text || '"}', c.now, c.now, NULL,
            'k' || lpad((i % ${keys}::integer)::text, 5, '0'), 0
          FROM generate_series(0, ${total - 1}::integer) AS i,
            (SELECT (floor(extract(epoch from statement_timestamp()) * 1000))::bigint AS now) AS c`,
    orElse: () =>
      sql`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < CAST(${total - 1} AS INTEGER)),
          c(now) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))
        INSERT INTO ${table} (queue, body, visible_at, enqueued_at, reply_to${keys === undefined ? sql`` : sql`, key`})
        SELECT ${QUEUE}, '{"id":' || i || ',"payload":"' || ${PAYLOAD} || '"}', c.now, c.now, NULL${
        keys === undefined ? sql`` : sql`, printf('k%05d', i % CAST(${keys} AS INTEGER))`
      }
        FROM n, c`
  }).pipe(Effect.asVoid)
}

/**
 * The keys' rows, as the first keyed send makes them (active, share clock 0), every fourth with weight 2; the
 * queue made scheduled, with its default per-key `limit`, through the admin API.
 */
const prepareKeys = (context: Context.Context<MailboxSql.Services>, prefix: string, keys: number, limit: number) =>
  Effect.gen(function*() {
    const admin = yield* MailboxSqlAdmin.queues({ prefix })
    yield* admin.setKeySettings(QUEUE, undefined, { limit })
    const sql = Context.get(context, SqlClientTag.SqlClient)
    const table = sql(tables(prefix).keys)
    yield* sql.onDialectOrElse({
      pg: () =>
        sql`INSERT INTO ${table} (queue, key, vtime, weight)
          SELECT ${QUEUE}::text, 'k' || lpad(j::text, 5, '0'), 0, CASE WHEN j % 4 = 0 THEN 2 ELSE NULL END
          FROM generate_series(0, ${keys - 1}::integer) AS j
          ON CONFLICT (queue, key) DO NOTHING`,
      orElse: () =>
        sql`WITH RECURSIVE n(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM n WHERE j < CAST(${keys - 1} AS INTEGER))
          INSERT INTO ${table} (queue, key, vtime, weight)
          SELECT ${QUEUE}, printf('k%05d', j), 0, CASE WHEN j % 4 = 0 THEN 2.0 ELSE NULL END FROM n WHERE true
          ON CONFLICT (queue, key) DO NOTHING`
    })
  }).pipe(Effect.provide(context))

/**
 * Every key of the queue back to `perKey` messages (the ones a drain took), and any key a claim found empty
 * woken level with the queue's share clock, as a send would (`prepareSend`).
 */
const topUp = (sql: SqlClient, prefix: string, perKey: number) => {
  const { keys, messages } = tables(prefix)
  const [k, m] = [sql(keys), sql(messages)]
  return sql.onDialectOrElse({
    pg: () =>
      Effect.all([
        sql`INSERT INTO ${m} (queue, body, visible_at, enqueued_at, reply_to, key, priority)
          SELECT ${QUEUE}::text, '{"id":' || g || ',"payload":"' || ${PAYLOAD}::text || '"}', c.now, c.now, NULL,
            w.key, 0
          FROM (SELECT k.key, ${perKey}::integer - (SELECT count(*) FROM ${m} x WHERE x.queue = ${QUEUE}
              AND x.key = k.key) AS missing
            FROM ${k} k WHERE k.queue = ${QUEUE} AND k.key <> '') AS w,
            generate_series(1, ${perKey}::integer) AS g,
            (SELECT (floor(extract(epoch from statement_timestamp()) * 1000))::bigint AS now) AS c
          WHERE g <= w.missing`,
        sql`UPDATE ${k} SET idle = 0, vtime = GREATEST(${k}.vtime, (SELECT q.vtime FROM ${k} q
            WHERE q.queue = ${QUEUE} AND q.key = ''))
          WHERE queue = ${QUEUE} AND idle <> 0`
      ], { discard: true }),
    orElse: () =>
      Effect.all([
        sql`WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < CAST(${perKey} AS INTEGER)),
            c(now) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
            w(key, missing) AS (SELECT k.key, CAST(${perKey} AS INTEGER) - (SELECT count(*) FROM ${m} x
              WHERE x.queue = ${QUEUE} AND x.key = k.key) FROM ${k} k WHERE k.queue = ${QUEUE} AND k.key <> '')
          INSERT INTO ${m} (queue, body, visible_at, enqueued_at, reply_to, key)
          SELECT ${QUEUE}, '{"id":' || g || ',"payload":"' || ${PAYLOAD} || '"}', c.now, c.now, NULL, w.key
          FROM w, n, c WHERE n.g <= w.missing`,
        sql`UPDATE ${k} SET idle = 0, vtime = max(vtime, (SELECT q.vtime FROM ${k} q
            WHERE q.queue = ${QUEUE} AND q.key = ''))
          WHERE queue = ${QUEUE} AND idle <> 0`
      ], { discard: true })
  })
}

const analyze = (sql: SqlClient, prefix: string) =>
  sql.onDialectOrElse({
    pg: () => sql`ANALYZE ${sql(tables(prefix).messages)}`,
    orElse: () => sql`ANALYZE`
  }).pipe(Effect.asVoid)

/** bench/scale.ts's drain: `consumers` fibers receive up to 10 and settle each batch, until `total` are done. */
const drain = (
  mailbox: Mailbox.Mailbox<Job>,
  total: number,
  consumers: number,
  serverCpu: () => number | undefined
) =>
  Effect.gen(function*() {
    const latencies: Array<number> = []
    const serverBefore = serverCpu()
    const nodeBefore = process.cpuUsage()
    const started = yield* now
    let reserved = 0
    const consumer = Effect.gen(function*() {
      while (reserved < total) {
        const wanted = Math.min(10, total - reserved)
        reserved += wanted
        const asked = yield* now
        const batch = yield* mailbox.receive({ maxMessages: wanted, waitTime: "1 second" })
        if (batch.length === 0) return yield* Effect.dieMessage(`${mailbox.name} ran dry`)
        latencies.push((yield* now) - asked)
        reserved -= wanted - batch.length
        const outcomes = yield* Mailbox.settleAll(batch.map((message) => ({ message, reply: Option.none<never>() })))
        if (outcomes.some(Either.isLeft)) return yield* Effect.dieMessage("an acknowledgement failed")
      }
    })
    yield* Effect.all(Array.from({ length: consumers }, () => consumer), { concurrency: "unbounded", discard: true })
    const seconds = ((yield* now) - started) / 1000
    const nodeUsed = process.cpuUsage(nodeBefore)
    const serverAfter = serverCpu()
    return {
      rate: total / seconds,
      p99Millis: percentile(latencies, 0.99),
      nodeCpuMicros: (nodeUsed.user + nodeUsed.system) / total,
      serverCpuMicros: serverBefore === undefined || serverAfter === undefined
        ? undefined
        : (serverAfter - serverBefore) / 1000 / total
    }
  })

class Usage {
  readonly _tag = "Usage"
  constructor(readonly message: string) {}
}

const positive = (name: string, text: string) => {
  const n = Number(text)
  return Number.isInteger(n) && n > 0 ? Effect.succeed(n) : Effect.fail(new Usage(`--${name}: ${text}`))
}

const main = Effect.gen(function*() {
  const which = values.case
  const prefix = values.prefix
  if (prefix === undefined || !/^[a-z][a-z0-9_]*$/.test(prefix)) return yield* Effect.fail(new Usage("--prefix"))
  const [queued, keys, toDrain, consumers, limit] = yield* Effect.all([
    positive("queued", values.queued),
    positive("keys", values.keys),
    positive("drain", values.drain),
    positive("consumers", values.consumers),
    positive("limit", values.limit)
  ])
  const pg = values.database === "PostgreSQL"
  const layer = pg
    ? MailboxSql.layerPg({ url: values.url ?? "" })
    : MailboxSql.layerSqlite({ filename: values.sqlite ?? "" })
  const context = yield* Layer.build(layer)
  const sql = Context.get(context, SqlClientTag.SqlClient)
  const serverCpu = pg ? serverCpuNanos(new URL(values.url!).port) : () => undefined
  const mailbox = yield* MailboxSql.make({ name: QUEUE, schema: Job, prefix }).pipe(Effect.provide(context))
  const setupStarted = yield* now
  switch (which) {
    case "plain":
    case "keyed": {
      if (which === "keyed") yield* prepareKeys(context, prefix, keys, limit)
      yield* fill(sql, prefix, queued, which === "keyed" ? keys : undefined)
      yield* analyze(sql, prefix)
      const setupSeconds = ((yield* now) - setupStarted) / 1000
      const drained = yield* drain(mailbox, toDrain, consumers, serverCpu).pipe(Effect.provide(context))
      return { ...drained, setupSeconds }
    }
    case "fill": {
      yield* prepareKeys(context, prefix, keys, limit)
      yield* fill(sql, prefix, queued, keys)
      yield* analyze(sql, prefix)
      const setupSeconds = ((yield* now) - setupStarted) / 1000
      return { rate: 0, p99Millis: 0, nodeCpuMicros: 0, serverCpuMicros: undefined, setupSeconds }
    }
    case "backlog": {
      const drained = yield* drain(mailbox, toDrain, consumers, serverCpu).pipe(Effect.provide(context))
      const topUpStarted = yield* now
      yield* topUp(sql, prefix, Math.ceil(queued / keys))
      return { ...drained, setupSeconds: ((yield* now) - topUpStarted) / 1000 }
    }
    default:
      return yield* Effect.fail(new Usage(`--case plain|keyed|fill|backlog, not ${which}`))
  }
}).pipe(Effect.scoped)

Effect.runPromiseExit(main).then((exit) => {
  if (exit._tag === "Success") process.stdout.write(JSON.stringify(exit.value) + "\n", () => process.exit(0))
  else {
    const failure = Option.getOrUndefined(Cause.failureOption(exit.cause))
    const message = failure instanceof Usage ? `usage: ${failure.message}` : Cause.pretty(exit.cause)
    process.stderr.write(`${message}\n`, () => process.exit(1))
  }
})
