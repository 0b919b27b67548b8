/**
 * Durable mailbox throughput, end to end: requests are sent, then `concurrency`
 * MainLoops with a no-op `execute` receive them and acknowledge — in one of
 * two modes: "ack only" (the requests carry no `replyTo`, so the loop only
 * acknowledges: the work every peer does) or "reply + ack" (each reply goes to
 * a response queue and commits with the acknowledgement). Peers doing the same
 * no-op jobs with the same concurrency on the same PostgreSQL: graphile-worker
 * (defaults; local queue + batched completion) and pg-boss (defaults; largest
 * batch and shortest polling interval); BullMQ is in `bullmq.ts`. Each run
 * reports enqueue and processing rates separately; processing is timed from
 * the start of the workers until the last job's completion is committed, and
 * the CPU time spent meanwhile is reported per job: this process's (all its
 * threads: the event loop, and V8's garbage-collector helpers) and the
 * server's (the PostgreSQL processes' time on CPU, read from Linux `/proc`).
 * `npm run bench` runs each of these in a fresh process of its own, one round
 * per process (`system.ts`).
 */
import { Effect, Layer, Schema, type Scope } from "effect"
import { Logger, makeWorkerUtils, run as graphileRun } from "graphile-worker"
import { Mailbox, MailboxSql, MainLoop } from "leasehold"
import { readdirSync, readFileSync } from "node:fs"
import { performance } from "node:perf_hooks"
import pg from "pg"
import PgBoss from "pg-boss"
import { type Shares, startProfile } from "./support/profile.js"

/** Jobs per second, enqueueing and processing, and the CPU time processing took per job (µs). */
export interface Throughput {
  readonly enqueue: number
  readonly process: number
  readonly nodeCpu: number
  /** The database or queue server's CPU (PostgreSQL, Redis); `undefined` where `/proc` cannot be read (not Linux). */
  readonly serverCpu: number | undefined
  /** Where the Node CPU went, in a round run with `BENCH_PROFILE` set (bench/support/profile.ts). */
  readonly profile?: Shares | undefined
}

/** Jobs per second since `started` (a `performance.now()` reading). */
export const perSecond = (jobs: number, started: number) => jobs / ((performance.now() - started) / 1000)
const now = Effect.sync(() => performance.now())

/** The systems of the durable-mailbox comparison, by label, and the store each runs on. */
export const systems = {
  "leasehold SQLite, ack only": "sqlite",
  "leasehold SQLite, reply + ack": "sqlite",
  "leasehold PostgreSQL, ack only": "postgres",
  "leasehold PostgreSQL, reply + ack": "postgres",
  "graphile-worker defaults": "postgres",
  "graphile-worker batched": "postgres",
  "pg-boss best": "postgres",
  "pg-boss defaults": "postgres",
  "leasehold Redis, ack only": "redis",
  "BullMQ Redis defaults": "redis",
  "BullMQ Redis best": "redis",
  "BullMQ on PostgreSQL": "postgres"
} as const satisfies Record<string, "sqlite" | "postgres" | "redis">
export type System = keyof typeof systems
export const isSystem = (label: string): label is System => Object.hasOwn(systems, label)

/** pg-boss at its best: the largest batch and its shortest polling interval. */
export const PG_BOSS_BEST = { batchSize: 500, pollingIntervalSeconds: 0.5 } as const

/**
 * A server's CPU time so far, in nanoseconds per process (or thread) id, from Linux `/proc/<id>/schedstat`;
 * `undefined` where that cannot be read (not Linux).
 */
export type ServerCpu = () => ReadonlyMap<string, number> | undefined

/** The CPU nanoseconds of each of `ids` (`/proc/<id>/schedstat`, or `/proc/<pid>/task/<tid>/schedstat`). */
export const schedstats = (dir: string, ids: Iterable<string>): Map<string, number> => {
  const nanos = new Map<string, number>()
  for (const id of ids) {
    try {
      nanos.set(id, Number(readFileSync(`${dir}/${id}/schedstat`, "utf8").split(" ")[0]))
    } catch {
      // the process ended meanwhile
    }
  }
  return nanos
}

const comm = (pid: number | string) => {
  try {
    return readFileSync(`/proc/${pid}/comm`, "utf8").trim()
  } catch {
    return undefined
  }
}

/** The processes' ids (Linux `/proc`) that pass `keep`, or `undefined`. */
const processes = (keep: (pid: string) => boolean): Array<string> | undefined => {
  try {
    return readdirSync("/proc").filter((pid) => /^\d+$/.test(pid) && keep(pid))
  } catch {
    return undefined
  }
}

/** The CPU time of every `postgres` process on this machine, whichever cluster it serves. */
export const postgresCpu: ServerCpu = () => {
  const pids = processes((pid) => comm(pid) === "postgres")
  return pids === undefined ? undefined : schedstats("/proc", pids)
}

/** The parent process id of `pid` (Linux `/proc/<pid>/stat`), or `undefined`. */
const parentOf = (pid: number | string): number | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so read after its last `)`.
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1])
  } catch {
    return undefined
  }
}

/**
 * The CPU time of the PostgreSQL server at `url` alone — its postmaster and the postmaster's children, found
 * from the parent of this connection's backend (`pg_backend_pid()`) — where it runs on this machine: other
 * clusters on a shared machine are left out. Elsewhere (a remote server, another PID namespace), every
 * `postgres` process's, as `postgresCpu`.
 */
export const clusterCpu = async (url: string): Promise<ServerCpu> => {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  const backend = Number((await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid)
  await client.end()
  const postmaster = parentOf(backend)
  if (comm(backend) !== "postgres" || postmaster === undefined || comm(postmaster) !== "postgres") {
    return postgresCpu
  }
  return () => {
    const pids = processes((pid) => Number(pid) === postmaster || parentOf(pid) === postmaster)
    return pids === undefined ? undefined : schedstats("/proc", pids)
  }
}

/**
 * Starts counting CPU time, this process's and the server's (`serverCpu`, PostgreSQL's by default); the
 * result gives it per job (µs) for `jobs` jobs. Read outside the timed span. The server's is the sum over
 * its processes at the end of what each spent since the start (all of it for one started meanwhile): one
 * that ended meanwhile — a connection of an earlier round, closing — cannot be read, and is left out.
 */
export const cpuMeter = (serverCpu: ServerCpu = postgresCpu) => {
  // The server's first: reading `/proc` costs this process CPU that is not the work's.
  const server = serverCpu()
  const profiled = startProfile()
  const node = process.cpuUsage()
  return (jobs: number): Pick<Throughput, "nodeCpu" | "serverCpu" | "profile"> => {
    const nodeUsed = process.cpuUsage(node)
    const profile = profiled()
    const serverNow = serverCpu()
    let serverNanos = 0
    for (const [id, nanos] of serverNow ?? []) serverNanos += nanos - (server?.get(id) ?? 0)
    return {
      nodeCpu: (nodeUsed.user + nodeUsed.system) / jobs,
      serverCpu: server === undefined || serverNow === undefined ? undefined : serverNanos / 1000 / jobs,
      profile
    }
  }
}

/** What a leasehold worker does per request: acknowledge only, or reply and acknowledge (one commit). */
export type LeaseholdMode = "ack only" | "reply + ack"

/** Opens a leasehold mailbox of `name` with bodies of `schema` (a backend's `make`, its store provided). */
export type OpenMailbox<Env = never> = <A, I, R, RI>(
  name: string,
  schema: Schema.Schema<A, I, never>,
  replySchema: Schema.Schema<R, RI, never> | undefined
) => Effect.Effect<Mailbox.Mailbox<A, R>, unknown, Scope.Scope | Env>

/**
 * leasehold: `jobs` requests through `concurrency` MainLoops (maxMessages 10) on a fresh table prefix. In
 * "ack only" mode the requests carry no `replyTo`, so the loop only acknowledges; in "reply + ack" mode they
 * name a response queue, and each reply commits with the acknowledgement.
 */
export const leasehold = (
  database: Layer.Layer<MailboxSql.Services, unknown>,
  prefix: string,
  jobs: number,
  concurrency: number,
  mode: LeaseholdMode,
  serverCpu: ServerCpu = postgresCpu
): Effect.Effect<Throughput, unknown> =>
  leaseholdOn<MailboxSql.Services>(
    (name, schema, replySchema) =>
      MailboxSql.make({ name, schema, ...(replySchema === undefined ? {} : { replySchema }), prefix }),
    jobs,
    concurrency,
    mode,
    serverCpu
  ).pipe(Effect.provide(Layer.fresh(database)))

/** `leasehold`'s round on the mailboxes `open` makes (any backend). */
export const leaseholdOn = <Env = never>(
  open: OpenMailbox<Env>,
  jobs: number,
  concurrency: number,
  mode: LeaseholdMode,
  serverCpu: ServerCpu
): Effect.Effect<Throughput, unknown, Env> =>
  Effect.gen(function*() {
    const requests = yield* open(
      "requests",
      MainLoop.requestSchema(Schema.Number),
      MainLoop.resultSchema(Schema.Number)
    )
    const responses = mode === "reply + ack"
      ? yield* open("responses", MainLoop.resultSchema(Schema.Number), undefined)
      : undefined
    const sendOptions = responses === undefined ? undefined : { replyTo: responses.name }
    const enqueueStarted = yield* now
    yield* Effect.forEach(
      Array.from({ length: jobs }, (_, i) => i),
      (i) => requests.send(MainLoop.request(i), sendOptions),
      { concurrency, discard: true }
    )
    const enqueue = perSecond(jobs, enqueueStarted)
    let executed = 0
    const loops = yield* Effect.all(
      Array.from({ length: concurrency }, () =>
        MainLoop.make({
          requests,
          execute: (n: number) =>
            Effect.sync(() => {
              executed++
              return n
            })
        })),
      { concurrency: "unbounded" }
    )
    const meter = cpuMeter(serverCpu)
    const processStarted = yield* now
    yield* Effect.forEach(
      loops,
      (loop) => Effect.forkScoped(loop.run({ maxMessages: 10, waitTime: "1 second" })),
      { discard: true }
    )
    while (executed < jobs || (yield* requests.approximateCount) > 0) yield* Effect.sleep("5 millis")
    const process = perSecond(jobs, processStarted)
    const cpu = meter(jobs)
    yield* Effect.forEach(loops, (loop) => loop.shutdown(), { concurrency: "unbounded", discard: true })
    if (responses !== undefined && (yield* responses.approximateCount) !== jobs) {
      return yield* Effect.dieMessage("replies missing")
    }
    return { enqueue, process, ...cpu }
  }).pipe(Effect.scoped, Effect.provide(Mailbox.MailboxResolver.layer()))

/** Polls `check` every 5 ms until it holds. */
export const waitUntil = (check: () => Promise<boolean>): Effect.Effect<void> =>
  Effect.flatMap(
    Effect.promise(check),
    (done) => done ? Effect.void : Effect.zipRight(Effect.sleep("5 millis"), waitUntil(check))
  )

/** graphile-worker 0.17: `jobs` no-op jobs, `concurrency` concurrent jobs, in its own schema. */
export const graphileWorker = (
  url: string,
  schema: string,
  jobs: number,
  concurrency: number,
  batched: boolean,
  serverCpu: ServerCpu = postgresCpu
): Effect.Effect<Throughput> =>
  Effect.promise(async () => {
    const utils = await makeWorkerUtils({ connectionString: url, schema, logger: new Logger(() => () => undefined) })
    await utils.migrate()
    const enqueueStarted = performance.now()
    await utils.addJobs(Array.from({ length: jobs }, (_, i) => ({ identifier: "noop", payload: { n: i } })))
    const enqueue = perSecond(jobs, enqueueStarted)
    const pool = new pg.Pool({ connectionString: url, max: 1 })
    const remaining = async () =>
      Number((await pool.query(`SELECT count(*) AS n FROM ${schema}._private_jobs`)).rows[0].n)
    let executed = 0
    const meter = cpuMeter(serverCpu)
    const processStarted = performance.now()
    const runner = await graphileRun({
      connectionString: url,
      schema,
      concurrency,
      noHandleSignals: true,
      logger: new Logger(() => () => undefined),
      taskList: {
        noop: async () => {
          executed++
        }
      },
      ...(batched
        ? {
          preset: {
            worker: {
              localQueue: { size: 500 },
              completeJobBatchDelay: 0,
              failJobBatchDelay: 0,
              concurrentJobs: concurrency
            }
          }
        }
        : {})
    })
    await Effect.runPromise(waitUntil(async () => executed >= jobs && (await remaining()) === 0))
    const process = perSecond(jobs, processStarted)
    const cpu = meter(jobs)
    await runner.stop()
    await pool.end()
    await utils.release()
    return { enqueue, process, ...cpu }
  })

/** pg-boss 10: `jobs` no-op jobs, `concurrency` workers fetching `batchSize` each `pollingIntervalSeconds`. */
export const pgBoss = (
  url: string,
  schema: string,
  jobs: number,
  concurrency: number,
  options: { readonly batchSize?: number; readonly pollingIntervalSeconds?: number },
  serverCpu: ServerCpu = postgresCpu
): Effect.Effect<Throughput> =>
  Effect.promise(async () => {
    const boss = new PgBoss({ connectionString: url, schema, max: concurrency + 2 })
    boss.on("error", () => undefined)
    await boss.start()
    await boss.createQueue("noop")
    const enqueueStarted = performance.now()
    await boss.insert(Array.from({ length: jobs }, (_, i) => ({ name: "noop", data: { n: i } })))
    const enqueue = perSecond(jobs, enqueueStarted)
    const pool = new pg.Pool({ connectionString: url, max: 1 })
    const completed = async () =>
      Number(
        (await pool.query(`SELECT count(*) AS n FROM ${schema}.job WHERE name = 'noop' AND state = 'completed'`))
          .rows[0].n
      )
    const meter = cpuMeter(serverCpu)
    const processStarted = performance.now()
    for (let i = 0; i < concurrency; i++) await boss.work("noop", options, async () => undefined)
    await Effect.runPromise(waitUntil(async () => (await completed()) >= jobs))
    const process = perSecond(jobs, processStarted)
    const cpu = meter(jobs)
    await boss.stop({ graceful: false, wait: true })
    await pool.end()
    return { enqueue, process, ...cpu }
  })
