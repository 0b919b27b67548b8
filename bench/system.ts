/**
 * One round of one system of the durable-mailbox comparison, alone in this
 * process: `npm run bench` (bench/run.ts) spawns it once per system per round
 * and waits for it, so no system pays the heap, JIT state or garbage of
 * another, or of its own earlier rounds. It enqueues `--jobs` no-op jobs,
 * processes them (mailboxSql.ts, bullmq.ts: the processing is timed, and this
 * process's CPU time — `process.cpuUsage()` — and the server's are counted
 * over it), prints the round's figures as one JSON line on stdout
 * (`{"enqueue":…,"process":…,"nodeCpu":…,"serverCpu":…}`: jobs/s, jobs/s,
 * µs/job, µs/job) and exits. Failures go to stderr with a non-zero exit.
 *
 * By hand, e.g. for a CPU profile of one leasehold PostgreSQL ack-only round
 * (the compiled package, as `npm run bench` runs it; the URL is a server of
 * yours — `npm run bench` starts a throwaway cluster of its own,
 * test/support/postgres.ts; use a fresh prefix each run):
 *
 *   npm run build
 *   npx esbuild bench/system.ts --bundle --platform=node --format=esm --packages=external \
 *     --outfile=bench/.build/system.mjs
 *   node --cpu-prof --cpu-prof-dir=bench/.build/prof bench/.build/system.mjs \
 *     --system "leasehold PostgreSQL, ack only" --url postgres://postgres@127.0.0.1:5432/postgres \
 *     --jobs 10000 --concurrency 8 --prefix m1_
 *
 * The profile covers the whole process (setup and enqueueing too). Options:
 * `--system` one of the labels of `systems` (mailboxSql.ts); `--jobs` (10000);
 * `--concurrency` (8; BullMQ's best setting on Redis runs 50 whatever it is);
 * `--url` a PostgreSQL URL, for the systems on PostgreSQL; `--sqlite` a file,
 * for leasehold on SQLite; `--redis host:port`, for BullMQ on Redis;
 * `--prefix` the table prefix (leasehold), schema (graphile-worker, pg-boss,
 * BullMQ on PostgreSQL) or queue name (BullMQ on Redis) — fresh each round.
 * The server's CPU is its processes' (PostgreSQL: the postmaster of `--url`
 * and its children; Redis: the process `INFO server` names) from Linux
 * `/proc`, when the server runs on this machine.
 */
import { Cause, Effect, Option, type Schema } from "effect"
import { Redis as IORedis } from "ioredis"
import { MailboxSql } from "leasehold"
import { parseArgs } from "node:util"
// Not yet a module of the package (issue 46 goes on): the driver from the sources, bundled into this round.
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
import * as BullMQ from "./bullmq.js"
import {
  clusterCpu,
  graphileWorker,
  isSystem,
  leasehold,
  leaseholdOn,
  PG_BOSS_BEST,
  pgBoss,
  type System,
  systems,
  type Throughput
} from "./mailboxSql.js"
import * as Redis from "./redis.js"

const { values } = parseArgs({
  options: {
    system: { type: "string" },
    jobs: { type: "string", default: "10000" },
    concurrency: { type: "string", default: "8" },
    url: { type: "string" },
    sqlite: { type: "string" },
    redis: { type: "string" },
    prefix: { type: "string" }
  }
})

/** A command line that cannot run: printed without a stack trace. */
class Usage {
  readonly _tag = "Usage"
  constructor(readonly message: string) {}
}

const usage = (problem: string) =>
  Effect.fail(
    new Usage(
      `${problem}\nusage: system.mjs --system <label> --prefix <name> [--jobs 10000] [--concurrency 8] ` +
        `[--url postgres://…] [--sqlite <file>] [--redis host:port]\nlabels: ${Object.keys(systems).join("; ")}`
    )
  )

const positive = (name: string, text: string) => {
  const n = Number(text)
  return Number.isInteger(n) && n > 0 ? Effect.succeed(n) : usage(`--${name} must be a positive integer: ${text}`)
}

const required = (name: string, value: string | undefined) =>
  value === undefined || value === "" ? usage(`--${name} is required here`) : Effect.succeed(value)

const round = (system: System, jobs: number, concurrency: number, prefix: string): Effect.Effect<Throughput, unknown> =>
  Effect.gen(function*() {
    switch (systems[system]) {
      case "sqlite": {
        const filename = yield* required("sqlite", values.sqlite)
        const mode = system === "leasehold SQLite, reply + ack" ? "reply + ack" : "ack only"
        // SQLite runs inside this process: its CPU is in the Node figure, and no server has any.
        const throughput = yield* leasehold(MailboxSql.layerSqlite({ filename }), prefix, jobs, concurrency, mode)
        return { ...throughput, serverCpu: undefined }
      }
      case "redis": {
        const address = yield* required("redis", values.redis)
        const [host, port] = [address.slice(0, address.lastIndexOf(":")), Number(address.split(":").pop())]
        if (host === "" || !Number.isInteger(port)) return yield* usage(`--redis must be host:port: ${address}`)
        const serverCpu = yield* Effect.promise(() => Redis.cpuAt(host, port))
        if (system === "leasehold Redis, ack only") {
          return yield* Effect.scoped(Effect.flatMap(
            Effect.acquireRelease(
              Effect.sync(() => new IORedis({ host, port })),
              (client) => Effect.promise(() => client.quit())
            ),
            (client) =>
              leaseholdOn(
                <A, I, R, RI>(name: string, schema: Schema.Schema<A, I>, _replies?: Schema.Schema<R, RI>) =>
                  MailboxRedis.make<A, I, R>(client, { name, schema, prefix: `${prefix}:` }),
                jobs,
                concurrency,
                "ack only",
                serverCpu
              )
          ))
        }
        const settings = system === "BullMQ Redis best" ? BullMQ.REDIS_BEST : BullMQ.defaults(concurrency)
        return yield* BullMQ.onRedis({ host, port }, prefix, jobs, settings, serverCpu)
      }
      case "postgres": {
        const url = yield* required("url", values.url)
        const serverCpu = yield* Effect.promise(() => clusterCpu(url))
        switch (system) {
          case "leasehold PostgreSQL, ack only":
          case "leasehold PostgreSQL, reply + ack":
            return yield* leasehold(
              MailboxSql.layerPg({ url }),
              prefix,
              jobs,
              concurrency,
              system === "leasehold PostgreSQL, ack only" ? "ack only" : "reply + ack",
              serverCpu
            )
          case "graphile-worker defaults":
          case "graphile-worker batched":
            return yield* graphileWorker(
              url,
              prefix,
              jobs,
              concurrency,
              system === "graphile-worker batched",
              serverCpu
            )
          case "pg-boss best":
            return yield* pgBoss(url, prefix, jobs, concurrency, PG_BOSS_BEST, serverCpu)
          case "pg-boss defaults":
            return yield* pgBoss(url, prefix, jobs, concurrency, {}, serverCpu)
          case "BullMQ on PostgreSQL":
            return yield* BullMQ.onPostgres(url, prefix, jobs, BullMQ.postgres(concurrency), serverCpu)
          default:
            return yield* usage(`not a system on PostgreSQL: ${system}`)
        }
      }
    }
  })

const main: Effect.Effect<Throughput, unknown> = Effect.gen(function*() {
  const system = yield* required("system", values.system)
  if (!isSystem(system)) return yield* usage(`unknown system: ${system}`)
  const prefix = yield* required("prefix", values.prefix)
  const jobs = yield* positive("jobs", values.jobs)
  const concurrency = yield* positive("concurrency", values.concurrency)
  return yield* round(system, jobs, concurrency, prefix)
})

Effect.runPromiseExit(main).then((exit) => {
  // Exit at once, whatever handles the systems' clients leave open (a CPU profile is still written).
  if (exit._tag === "Success") process.stdout.write(JSON.stringify(exit.value) + "\n", () => process.exit(0))
  else {
    const failure = Option.getOrUndefined(Cause.failureOption(exit.cause))
    const message = failure instanceof Usage ? failure.message : Cause.pretty(exit.cause)
    process.stderr.write(`${message}\n`, () => process.exit(1))
  }
})
