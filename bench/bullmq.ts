/**
 * BullMQ 6 next to the durable mailbox: the same no-op jobs, measured like the
 * peers of `mailboxSql.ts` (enqueue rate; processing timed from starting the
 * worker until the last job's completion is committed; CPU per job of this
 * process and of the server). One `Worker` whose `concurrency` is the number
 * of jobs it runs at once, on Redis (a throwaway `redis-server`, `redis.ts`)
 * or on BullMQ's PostgreSQL backend (`createPostgresBackend`, its own schema
 * on the benchmark's cluster). Completion is counted from the worker's
 * `completed` events, which it emits once `moveToCompleted` has returned.
 */
import { createPostgresBackend, type JobsOptions, Queue, withBackend, Worker } from "bullmq"
import { Effect } from "effect"
import { createRequire } from "node:module"
import { cpuMeter, perSecond, postgresCpu, type ServerCpu, type Throughput, waitUntil } from "./mailboxSql.js"
import type * as Redis from "./redis.js"

const require = createRequire(import.meta.url)

/** The installed versions of BullMQ and of the Redis client it loads. */
export const versions: { readonly bullmq: string; readonly ioredis: string } = {
  bullmq: require("bullmq/package.json").version,
  ioredis: require("ioredis/package.json").version
}

/** How BullMQ is run: worker concurrency, how jobs are added, and whether finished jobs are kept. */
export interface Settings {
  readonly concurrency: number
  /** `add`: one call per job, `concurrency` calls at a time; `addBulk`: one call for all jobs. */
  readonly enqueue: "add" | "addBulk"
  /** `removeOnComplete` and `removeOnFail` set to true (default: finished jobs are kept). */
  readonly removeFinished: boolean
}

/** The defaults, with the benchmark's concurrency. */
export const defaults = (concurrency: number): Settings => ({ concurrency, enqueue: "add", removeFinished: false })

/** On Redis at its best: concurrency 50 (the figure of BullMQ's concurrency guide), `addBulk`, finished jobs removed. */
export const REDIS_BEST: Settings = { concurrency: 50, enqueue: "addBulk", removeFinished: true }

/** On its PostgreSQL backend, with the benchmark's concurrency (50 was no faster there). */
export const postgres = (concurrency: number): Settings => ({ concurrency, enqueue: "addBulk", removeFinished: true })

/** What `run` needs of a queue and a worker, whatever their backend. */
interface QueueLike {
  waitUntilReady(): Promise<void>
  add(name: string, data: unknown, opts?: JobsOptions): Promise<unknown>
  addBulk(jobs: Array<{ name: string; data: unknown; opts?: JobsOptions }>): Promise<unknown>
  getJobCounts(...types: Array<"wait" | "active" | "delayed" | "failed" | "prioritized">): Promise<
    Record<string, number>
  >
  obliterate(opts?: { force?: boolean }): Promise<void>
  close(): Promise<void>
}
interface WorkerLike {
  waitUntilReady(): Promise<void>
  on(event: "completed" | "failed" | "error", listener: () => void): unknown
  run(): Promise<void>
  close(): Promise<void>
}

const run = (
  queue: QueueLike,
  /** A worker that is not started (`autorun: false`), running `processor` `concurrency` jobs at a time. */
  worker: (concurrency: number, processor: () => Promise<void>) => WorkerLike,
  jobs: number,
  settings: Settings,
  serverCpu: ServerCpu
): Effect.Effect<Throughput> =>
  Effect.flatMap(
    Effect.promise(async () => {
      await queue.waitUntilReady()
      const opts: JobsOptions = settings.removeFinished ? { removeOnComplete: true, removeOnFail: true } : {}
      const enqueueStarted = performance.now()
      if (settings.enqueue === "addBulk") {
        await queue.addBulk(Array.from({ length: jobs }, (_, i) => ({ name: "noop", data: { n: i }, opts })))
      } else {
        let next = 0
        await Promise.all(Array.from({ length: settings.concurrency }, async () => {
          while (next < jobs) await queue.add("noop", { n: next++ }, opts)
        }))
      }
      const enqueue = perSecond(jobs, enqueueStarted)
      let completed = 0
      let failed = 0
      // Not started: its connections open in `waitUntilReady`, before the timing, as pg-boss's do.
      const w = worker(settings.concurrency, async () => {})
      w.on("completed", () => completed++)
      w.on("failed", () => failed++)
      w.on("error", () => undefined)
      await w.waitUntilReady()
      const meter = cpuMeter(serverCpu)
      const processStarted = performance.now()
      const running = w.run()
      await Effect.runPromise(waitUntil(async () => completed + failed >= jobs))
      const process = perSecond(jobs, processStarted)
      const cpu = meter(jobs)
      await w.close()
      await running
      const left = await queue.getJobCounts("wait", "active", "delayed", "failed", "prioritized")
      await queue.obliterate({ force: true })
      await queue.close()
      return { throughput: { enqueue, process, ...cpu }, failed, left }
    }),
    ({ failed, left, throughput }) =>
      failed === 0 && Object.values(left).every((n) => n === 0)
        ? Effect.succeed(throughput)
        : Effect.dieMessage(`BullMQ: ${failed} jobs failed, left behind: ${JSON.stringify(left)}`)
  )

/**
 * BullMQ on Redis: `jobs` no-op jobs through one worker, in a fresh queue named `name`; `serverCpu` reads
 * the server's CPU time (`Redis.cpuAt`).
 */
export const onRedis = (
  server: Pick<Redis.Server, "host" | "port">,
  name: string,
  jobs: number,
  settings: Settings,
  serverCpu: ServerCpu
) =>
  Effect.suspend(() => {
    const connection = { host: server.host, port: server.port }
    return run(
      new Queue(name, { connection }),
      (concurrency, processor) => new Worker(name, processor, { autorun: false, concurrency, connection }),
      jobs,
      settings,
      serverCpu
    )
  })

/** BullMQ on its PostgreSQL backend: `jobs` no-op jobs through one worker, in a fresh schema. */
export const onPostgres = (
  url: string,
  schema: string,
  jobs: number,
  settings: Settings,
  serverCpu: ServerCpu = postgresCpu
) =>
  Effect.suspend(() => {
    const backend = withBackend(createPostgresBackend)
    const connection = { connectionString: url, schema, migrate: true }
    return run(
      new backend.Queue("noop", { connection }),
      (concurrency, processor) => new backend.Worker("noop", processor, { autorun: false, concurrency, connection }),
      jobs,
      settings,
      serverCpu
    )
  })
