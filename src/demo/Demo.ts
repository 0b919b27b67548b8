/**
 * `leasehold demo`: every capability working on the embedded default, in one
 * command. On a SQLite file it starts worker processes (each a `LoopGroup` of
 * `MainLoop.agent` loops, see worker.ts), enqueues requests and shows live
 * progress; part way through it SIGKILLs one worker, whose leased requests
 * come back after their visibility timeout and finish elsewhere; one request
 * carries a deadline too short for its work, and one stored body no longer
 * decodes and is dead-lettered. Then a `WorkLease` keeps
 * per-domain order across fibers and a `MergeQueue` drains with one crashed
 * agent healed. Ctrl-C (SIGINT) at any moment drains the workers and
 * reports what was left queued. It ends with a summary (or `--json`) and the
 * health URL it served.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { type ChildProcess, spawn } from "node:child_process"
import { mkdirSync, rmSync } from "node:fs"
import { resolve } from "node:path"
import * as Deadline from "../Deadline.js"
import * as Health from "../Health.js"
import * as MailboxSql from "../MailboxSql.js"
import * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import * as MainLoop from "../MainLoop.js"
import * as MergeQueue from "../MergeQueue.js"
import * as WorkLease from "../WorkLease.js"
import { DemoRequest, DemoResponse } from "./schema.js"

/** How big and how fast. */
export interface DemoOptions {
  readonly size: number
  readonly workers: number
  readonly workMs: number
  readonly dir: string
  /** Progress and messages go here (stderr under --json). */
  readonly print: (line: string) => void
  /** Redraws the progress line in place (a terminal); otherwise prints a line now and then. */
  readonly live: boolean
}

/** What the demo saw. */
export interface DemoSummary {
  readonly requests: number
  readonly answered: number
  readonly succeeded: number
  readonly deadlineErrors: number
  readonly otherErrors: number
  readonly deadLettered: number
  readonly redelivered: number
  readonly executedMoreThanOnce: number
  readonly lost: number
  readonly leftQueued: number
  readonly workers: number
  readonly killed: Option.Option<{ readonly worker: string; readonly pid: number }>
  readonly workLease: { readonly domains: number; readonly offsets: number; readonly inOrder: boolean }
  readonly mergeQueue: { readonly merged: number; readonly entries: number; readonly healed: number }
  readonly interrupted: boolean
  readonly healthUrl: string | undefined
  readonly database: string
  readonly seconds: number
}

interface Worker {
  readonly name: string
  readonly child: ChildProcess
  output: string
  readonly exited: Promise<number | null>
}

const startWorker = (name: string, filename: string): Worker => {
  // The command line's own entry (compiled, or source under tsx: its flags are in execArgv) runs the worker.
  const child = spawn(process.execPath, [...process.execArgv, process.argv[1]!, "demo-worker", filename, name], {
    stdio: ["ignore", "pipe", "pipe"]
  })
  const worker: Worker = {
    name,
    child,
    output: "",
    exited: new Promise((resolve) => child.on("exit", (code) => resolve(code)))
  }
  child.stdout!.on("data", (chunk) => (worker.output += chunk))
  child.stderr!.on("data", (chunk) => (worker.output += chunk))
  return worker
}

const bar = (done: number, total: number, width = 30) => {
  const filled = Math.round((done / Math.max(1, total)) * width)
  return `[${"#".repeat(filled)}${".".repeat(width - filled)}]`
}

/** Per-domain order with a WorkLease: offsets arrive in order; one holder per domain at a time works them in order. */
const workLeasePhase = Effect.gen(function*() {
  const leases = yield* WorkLease.make({ maxRetries: 3 })
  const domains = ["repo-a", "repo-b"]
  const offsets = 6
  const processed = new Map<string, Array<number>>(domains.map((domain) => [domain, []]))
  const work = (domain: string, first: { token: string }, offset: number): Effect.Effect<void> =>
    Effect.gen(function*() {
      let token = first.token
      let current = offset
      for (;;) {
        processed.get(domain)!.push(current)
        yield* Effect.sleep("5 millis")
        const next = yield* Effect.orDie(leases.succeed(domain, token))
        if (next._tag === "NoBacklog") return
        const acquired = yield* Effect.orDie(leases.tryAcquire(domain, next.offset))
        if (acquired._tag !== "Acquired") return
        token = acquired.token
        current = next.offset
      }
    })
  // Offsets arrive in order; whoever acquires one works through the backlog behind it on its own fiber.
  // An arrival while the next holder is being handed the backlog head is told to wait (BacklogOrderingError).
  const deliver = (domain: string) =>
    Effect.gen(function*() {
      const holders: Array<Fiber.RuntimeFiber<void>> = []
      for (let offset = 0; offset < offsets; offset++) {
        const result = yield* leases.tryAcquire(domain, offset).pipe(
          Effect.retry({ schedule: Schedule.spaced("1 millis"), while: (e) => e._tag === "BacklogOrderingError" }),
          Effect.orDie
        )
        if (result._tag === "Acquired") holders.push(yield* Effect.fork(work(domain, result, offset)))
        yield* Effect.sleep("2 millis")
      }
      yield* Fiber.joinAll(holders)
    })
  yield* Effect.forEach(domains, deliver, { concurrency: "unbounded", discard: true })
  const inOrder = domains.every((domain) =>
    processed.get(domain)!.join(",") === Array.from({ length: offsets }, (_, i) => i).join(",")
  )
  return { domains: domains.length, offsets: domains.length * offsets, inOrder, processed }
})

/** A merge queue drains while one agent crashes holding the lock: its entry heals back after the lock timeout. */
const mergeQueuePhase = Effect.gen(function*() {
  const queue = yield* MergeQueue.make({ lockTimeout: "1 second" })
  const entries = 5
  for (let i = 1; i <= entries; i++) yield* queue.enqueue(`feature/${i}`, { priority: i === 3 ? 0 : 2 })
  const crashed = Option.getOrThrow(yield* queue.nextWithLock("merger-1"))
  yield* queue.transition(crashed, "rebasing") // …and merger-1 dies here, holding the lock
  let last: MergeQueue.Claim | undefined
  for (;;) {
    const next = yield* queue.nextWithLock("merger-2")
    if (Option.isNone(next)) {
      const stats = yield* queue.stats
      if (stats.byStatus.merged === entries) break
      yield* Effect.sleep("100 millis")
      continue
    }
    last = next.value
    for (const status of ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const) {
      yield* queue.transition(next.value, status)
    }
  }
  if (last !== undefined) yield* queue.releaseProcessingLock(last)
  const healed = (yield* queue.auditLog()).filter((row) => row.action === "entry_reclaimed").length
  return { merged: (yield* queue.stats).byStatus.merged, entries, healed }
})

/** Runs the demo. Interrupting it (or SIGINT) drains the workers and still returns a summary. */
export const run = (
  options: DemoOptions
): Effect.Effect<DemoSummary, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const started = yield* Clock.currentTimeMillis
    mkdirSync(options.dir, { recursive: true })
    const filename = resolve(options.dir, "demo.db")
    for (const suffix of ["", "-wal", "-shm"]) rmSync(filename + suffix, { force: true })
    const database = yield* Layer.build(Layer.merge(MailboxSql.layerSqlite({ filename }), Health.layer({ port: 0 })))
    const sql = yield* Effect.provide(SqlClient.SqlClient, database)
    const health = yield* Effect.provide(Health.Health, database)

    const stop = yield* Deferred.make<void>()
    const onSignal = () => Deferred.unsafeDone(stop, Effect.void)
    process.once("SIGINT", onSignal)
    process.once("SIGTERM", onSignal)
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        process.off("SIGINT", onSignal)
        process.off("SIGTERM", onSignal)
      })
    )

    const requests = yield* MailboxSql.make({ name: "requests", schema: MainLoop.requestSchema(DemoRequest) }).pipe(
      Effect.provide(database)
    )
    const responses = yield* MailboxSql.make({ name: "responses", schema: MainLoop.resultSchema(DemoResponse) }).pipe(
      Effect.provide(database)
    )
    // One request whose deadline is far shorter than its work: it ends as a deadline error.
    yield* requests.send(
      MainLoop.request({ task: "too-slow", workMs: 10_000 }, {
        requestId: "deadline-demo",
        deadline: yield* Deadline.after("2 seconds")
      }),
      { replyTo: "responses" }
    )
    // One request written by an older version of the app: its body no longer decodes, so it is dead-lettered.
    const stale = yield* requests.send(
      MainLoop.request({ task: "from-v1", workMs: options.workMs }, { requestId: "corrupt-demo" }),
      { replyTo: "responses" }
    )
    yield* sql`UPDATE leasehold_mailbox_messages SET body = ${
      JSON.stringify({ requestId: "corrupt-demo", request: { task: 1 } })
    } WHERE seq = ${Number(stale)}`
    for (let i = 2; i < options.size; i++) {
      yield* requests.send(MainLoop.request({ task: `task-${i}`, workMs: options.workMs }, { requestId: `r${i}` }), {
        replyTo: "responses"
      })
    }
    options.print(
      `leasehold demo: ${options.size} requests on ${filename}, ${options.workers} worker processes × 2 loops; ` +
        `health and metrics at ${health.url ?? "(none)"}`
    )

    const workers: Array<Worker> = []
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        for (const worker of workers) if (worker.child.exitCode === null) worker.child.kill("SIGKILL")
      })
    )
    for (let i = 1; i <= options.workers; i++) workers.push(startWorker(`worker-${i}`, filename))

    const queues = yield* Effect.provide(MailboxSqlAdmin.queues(), database)
    const counts = Effect.gen(function*() {
      const stats = yield* queues.stats
      const of = (queue: string) => stats.find((row) => row.queue === queue)
      const executions = workers.flatMap((worker) => [...worker.output.matchAll(/^start (\S+) (\d+)$/gm)])
      const requestsNow = of("requests")
      const responsesNow = of("responses")
      return {
        queued: requestsNow?.queued ?? 0,
        inFlight: (requestsNow?.inFlight ?? 0) + (requestsNow?.delayed ?? 0),
        done: (responsesNow?.queued ?? 0) + (responsesNow?.inFlight ?? 0) + (responsesNow?.delayed ?? 0),
        deadLettered: requestsNow?.deadLetters ?? 0,
        redelivered: executions.filter((match) => Number(match[2]) > 1).length
      }
    })

    let killed: Option.Option<{ readonly worker: string; readonly pid: number }> = Option.none()
    let lastPrinted = 0
    let interrupted = false
    for (;;) {
      const now = yield* counts
      const line =
        `${bar(now.done + now.deadLettered, options.size)} queued ${now.queued} | in flight ${now.inFlight}` +
        ` | done ${now.done} | redelivered ${now.redelivered} | dead-lettered ${now.deadLettered}`
      if (options.live) process.stderr.write(`\r${line}`)
      else if ((yield* Clock.currentTimeMillis) - lastPrinted > 1000) {
        options.print(line)
        lastPrinted = yield* Clock.currentTimeMillis
      }
      if (now.done + now.deadLettered >= options.size) break
      const victim = workers[0]!
      // Mid-work (compiling), so the kill really takes a leased request with it.
      const working = (victim.output.match(/^compiling$/gm)?.length ?? 0) >
        (victim.output.match(/^compiled$/gm)?.length ?? 0)
      if (Option.isNone(killed) && now.done >= options.size * 0.3 && working) {
        victim.child.kill("SIGKILL")
        killed = Option.some({ worker: victim.name, pid: victim.child.pid! })
        if (options.live) process.stderr.write("\n")
        options.print(
          `killed ${victim.name} (pid ${victim.child.pid}) with SIGKILL mid-work: its leased requests come back ` +
            "after their 2 s visibility timeout and finish on the other workers"
        )
      }
      if (yield* Deferred.isDone(stop)) {
        interrupted = true
        break
      }
      yield* Effect.sleep("200 millis")
    }
    if (options.live) process.stderr.write("\n")
    if (interrupted) {
      options.print("interrupted: draining the workers (in-flight requests finish, the rest stay queued)")
    }

    // Drain: SIGTERM lets every worker finish what it holds and stop.
    for (const worker of workers) if (worker.child.exitCode === null) worker.child.kill("SIGTERM")
    const exits = yield* Effect.promise(() => Promise.all(workers.map((worker) => worker.exited)))
    // A worker stopped before it was ready had claimed nothing; one killed on purpose is the crash.
    const unclean = workers.filter((worker, i) =>
      exits[i] !== 0 && /^ready$/m.test(worker.output) &&
      !(Option.isSome(killed) && killed.value.worker === worker.name)
    )
    if (unclean.length > 0) {
      options.print(`workers that did not exit cleanly: ${unclean.map((worker) => worker.name).join(", ")}`)
    }

    const replies = new Map<string, MainLoop.MainLoopResult<DemoResponse>>()
    for (;;) {
      const batch = yield* responses.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })
      if (batch.length === 0) break
      for (const reply of batch) replies.set(reply.body.requestId, reply.body)
    }
    const letters = (yield* counts).deadLettered
    const leftQueued = yield* requests.approximateCount
    const executions = new Map<string, number>()
    for (const worker of workers) {
      for (const match of worker.output.matchAll(/^start (\S+) \d+$/gm)) {
        executions.set(match[1]!, (executions.get(match[1]!) ?? 0) + 1)
      }
    }
    const results = [...replies.values()]
    const deadlineErrors = results.filter((result) => /deadline/i.test(result.error?.message ?? "")).length

    let workLease: DemoSummary["workLease"] = { domains: 0, offsets: 0, inOrder: false }
    let mergeQueue: DemoSummary["mergeQueue"] = { merged: 0, entries: 0, healed: 0 }
    if (!interrupted) {
      const lease = yield* workLeasePhase
      workLease = { domains: lease.domains, offsets: lease.offsets, inOrder: lease.inOrder }
      options.print(
        `WorkLease: ${[...lease.processed].map(([domain, order]) => `${domain} ${order.join(" → ")}`).join("; ")} (${
          lease.inOrder ? "per-domain order kept" : "ORDER BROKEN"
        })`
      )
      const merge = yield* Effect.provide(mergeQueuePhase, database)
      mergeQueue = merge
      options.print(
        `MergeQueue: merger-1 crashed holding the lock; merger-2 merged ${merge.merged} of ${merge.entries} ` +
          `after ${merge.healed} entry healed back to pending`
      )
    }

    return {
      requests: options.size,
      answered: replies.size,
      succeeded: results.filter((result) => result.success).length,
      deadlineErrors,
      otherErrors: results.filter((result) => !result.success).length - deadlineErrors,
      deadLettered: letters,
      redelivered: results.filter((result) => result.runContext.attempt > 1).length,
      executedMoreThanOnce: [...executions.values()].filter((count) => count > 1).length,
      lost: options.size - replies.size - letters - leftQueued,
      leftQueued,
      workers: options.workers,
      killed,
      workLease,
      mergeQueue,
      interrupted,
      healthUrl: health.url,
      database: filename,
      seconds: Math.round(((yield* Clock.currentTimeMillis) - started) / 100) / 10
    } satisfies DemoSummary
  })

/** The summary as a table. */
export const format = (summary: DemoSummary): string => {
  const rows: Array<[string, string]> = [
    ["requests", String(summary.requests)],
    [
      "answered",
      `${summary.answered} (${summary.succeeded} ok, ${summary.deadlineErrors} deadline error, ${summary.otherErrors} other errors)`
    ],
    ["dead-lettered", String(summary.deadLettered)],
    ["redelivered after the crash", `${summary.redelivered} answered on a later delivery`],
    ["executed more than once", `${summary.executedMoreThanOnce} (at-least-once: allowed, never lost)`],
    ["left queued", String(summary.leftQueued)],
    ["lost", String(summary.lost)],
    [
      "workers",
      `${summary.workers}${
        Option.match(summary.killed, { onNone: () => "", onSome: (k) => `, ${k.worker} killed with SIGKILL` })
      }`
    ],
    [
      "work lease",
      summary.interrupted
        ? "skipped (interrupted)"
        : `${summary.workLease.offsets} offsets over ${summary.workLease.domains} domains, order ${
          summary.workLease.inOrder ? "kept" : "BROKEN"
        }`
    ],
    [
      "merge queue",
      summary.interrupted
        ? "skipped (interrupted)"
        : `${summary.mergeQueue.merged}/${summary.mergeQueue.entries} merged, ${summary.mergeQueue.healed} healed after a crash`
    ],
    ["database", summary.database],
    ["health served at", `${summary.healthUrl ?? "-"} (/health/live, /health/ready, /metrics)`],
    ["time", `${summary.seconds} s`]
  ]
  const width = Math.max(...rows.map(([label]) => label.length))
  return rows.map(([label, value]) => `${label.padEnd(width)}  ${value}`).join("\n")
}
