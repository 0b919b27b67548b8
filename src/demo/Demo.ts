/**
 * `leasehold demo`: every capability working on the embedded default, in one
 * command. On a SQLite file it starts worker processes (each a `LoopGroup` of
 * `MainLoop.agent` loops, see worker.ts), enqueues requests and shows live
 * progress; part way through it SIGKILLs one worker mid-work, whose leased
 * requests come back after their visibility timeout and finish elsewhere (a
 * run too small for that kills none, and says so); one request carries a
 * deadline too short for its work, and one stored body no longer decodes and
 * is dead-lettered. Then every request id is matched to its replies, dead
 * letters or place in the queue (collect.ts, ledger.ts): lost, duplicated and
 * doubly-settled ids are named, and the replies are acknowledged as they are
 * read. A `WorkLeaseSql` keeps per-domain order across fibers and a
 * `MergeQueue` drains with one crashed agent healed, on the same file, so the
 * operator's console shows every part. Ctrl-C (SIGINT) at any moment drains
 * the workers and reports what was left queued. It ends with a summary (or
 * `--json`) that states what the run proved, and the health URL it served.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import { type ChildProcess, spawn } from "node:child_process"
import { mkdirSync, rmSync } from "node:fs"
import { resolve } from "node:path"
import * as Deadline from "../Deadline.js"
import * as Health from "../Health.js"
import * as MailboxSql from "../MailboxSql.js"
import * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import * as MainLoop from "../MainLoop.js"
import * as Collect from "./collect.js"
import { mergeQueuePhase, workLeasePhase } from "./coordination.js"
import * as Faults from "./faults.js"
import * as Ledger from "./ledger.js"
import { corruptId, type DemoSummary, type Kill, plural, proof } from "./report.js"
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
  /** Faults the demo's tests inject (faults.ts); none by default. */
  readonly faults?: ReadonlyArray<Faults.Fault> | undefined
}

export type { DemoSummary, Kill } from "./report.js"
export { format } from "./report.js"

/** The kill happens once 30% is done; it needs a backlog left by then: at least 4 requests per loop (2 a worker). */
export const smallestToKill = (workers: number): number => 4 * 2 * workers

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

/** Runs the demo. Interrupting it (or SIGINT) drains the workers and still returns a summary. */
export const run = (
  options: DemoOptions
): Effect.Effect<DemoSummary, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const started = yield* Clock.currentTimeMillis
    const faults = options.faults ?? []
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
    // Every request id sent, in order, with its message id: what the accounting matches against.
    const sent = new Map<string, string>()
    const send = (requestId: string, body: DemoRequest, deadline?: Deadline.Deadline) =>
      Effect.map(
        requests.send(MainLoop.request(body, { requestId, ...(deadline === undefined ? {} : { deadline }) }), {
          replyTo: "responses"
        }),
        (seq) => void sent.set(requestId, seq)
      )
    // One request whose deadline is far shorter than its work: it ends as a deadline error.
    yield* send("deadline-demo", { task: "too-slow", workMs: 10_000 }, yield* Deadline.after("2 seconds"))
    // One request written by an older version of the app: its body no longer decodes, so it is dead-lettered.
    yield* send(corruptId, { task: "from-v1", workMs: options.workMs })
    yield* sql`UPDATE leasehold_mailbox_messages SET body = ${
      JSON.stringify({ requestId: corruptId, request: { task: 1 } })
    } WHERE seq = ${Number(sent.get(corruptId))}`
    for (let i = 2; i < options.size; i++) yield* send(`r${i}`, { task: `task-${i}`, workMs: options.workMs })
    yield* Faults.afterSend(sql, faults, sent)
    const killPlanned = options.size >= smallestToKill(options.workers)
    options.print(
      `leasehold demo: ${options.size} requests on ${filename}, ${options.workers} worker processes × 2 loops; ` +
        `health and metrics at ${health.url ?? "(none)"}`
    )
    if (!killPlanned) {
      options.print(
        `no worker will be killed: --size ${options.size} is too small to kill one of ${options.workers} workers ` +
          `mid-run (that takes at least ${smallestToKill(options.workers)} requests)`
      )
    }

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

    let kill: { readonly worker: Worker; readonly held: ReadonlyArray<string> } | undefined
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
      // Done when the requests queue is empty (waiting for replies and letters to reach --size would wait for ever
      // on a lost request); what became of each is then read from the file, by id.
      if (now.queued + now.inFlight === 0) break
      const victim = workers[0]!
      // Mid-work (compiling), so the kill really takes a leased request with it.
      const working = (victim.output.match(/^compiling$/gm)?.length ?? 0) >
        (victim.output.match(/^compiled$/gm)?.length ?? 0)
      if (killPlanned && kill === undefined && now.done >= options.size * 0.3 && working) {
        victim.child.kill("SIGKILL")
        yield* Effect.promise(() => victim.exited)
        const held = yield* Collect.heldBy(sql, "requests", victim.child.pid!)
        kill = { worker: victim, held }
        if (options.live) process.stderr.write("\n")
        options.print(
          `killed ${victim.name} (pid ${victim.child.pid}) with SIGKILL mid-work, ` + (held.length === 0
            ? "but it held no request at that instant"
            : `holding ${plural(held.length, "leased request")}${Ledger.named(held)}: they come back after ` +
              "their 2 s visibility timeout and finish on the other workers")
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
      exits[i] !== 0 && /^ready$/m.test(worker.output) && worker !== kill?.worker
    )
    if (unclean.length > 0) {
      options.print(`workers that did not exit cleanly: ${unclean.map((worker) => worker.name).join(", ")}`)
    }

    // What became of every request, by id.
    yield* Faults.beforeReading(sql, faults, "responses")
    const replies = yield* Effect.provide(Collect.replies(responses), database)
    const letters = yield* Effect.provide(Collect.deadLetters("requests"), database)
    const ledger = Ledger.reconcile([...sent.keys()], {
      replies: replies.map((reply) => reply.requestId),
      deadLetters: letters,
      queued: yield* Effect.provide(Collect.queued("requests"), database)
    })
    const repliesOf = new Map<string, Array<MainLoop.MainLoopResult<DemoResponse>>>()
    for (const reply of replies) repliesOf.set(reply.requestId, [...(repliesOf.get(reply.requestId) ?? []), reply])
    const first = [...repliesOf.values()].map((all) => all[0]!)
    const deadlineErrors = first.filter((result) => /deadline/i.test(result.error?.message ?? "")).length
    const executions = new Map<string, number>()
    for (const worker of workers) {
      for (const match of worker.output.matchAll(/^start (\S+) \d+$/gm)) {
        executions.set(match[1]!, (executions.get(match[1]!) ?? 0) + 1)
      }
    }
    const killed = Option.fromNullable(kill).pipe(Option.map(({ held, worker }): Kill => ({
      worker: worker.name,
      pid: worker.child.pid!,
      held: { count: held.length, ids: held.slice(0, Ledger.shown) },
      finishedElsewhere: held.filter((id) =>
        letters.includes(id) ||
        (repliesOf.get(id) ?? []).some((reply) => reply.runContext.workerId !== worker.name)
      ).length
    })))
    const notKilled = Option.isSome(killed) ? Option.none() : Option.some(
      !killPlanned
        ? `--size ${options.size} is too small to kill one of ${options.workers} workers mid-run, ` +
          `which takes at least ${smallestToKill(options.workers)} requests`
        : interrupted
        ? "the run was interrupted before the kill"
        : `every request was settled before ${workers[0]!.name} was caught mid-work (the kill waits for 30% done)`
    )

    let workLease: DemoSummary["workLease"] = { domains: 0, offsets: 0, inOrder: false }
    let mergeQueue: DemoSummary["mergeQueue"] = { merged: 0, entries: 0, healed: 0 }
    if (!interrupted) {
      const lease = yield* Effect.provide(workLeasePhase, database)
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

    const summary: Omit<DemoSummary, "proved"> = {
      requests: sent.size,
      replies: replies.length,
      answered: ledger.answered,
      succeeded: first.filter((result) => result.error === undefined).length,
      deadlineErrors,
      otherErrors: first.filter((result) => result.error !== undefined).length - deadlineErrors,
      deadLettered: ledger.deadLettered,
      leftQueued: ledger.leftQueued,
      lost: ledger.lost,
      duplicated: ledger.duplicated,
      doublySettled: ledger.doublySettled,
      unknown: ledger.unknown,
      accountedFor: Ledger.accountedFor(ledger),
      redelivered: replies.filter((result) => result.runContext.attempt > 1).length,
      executedMoreThanOnce: [...executions.values()].filter((count) => count > 1).length,
      workers: options.workers,
      killed,
      notKilled,
      workLease,
      mergeQueue,
      interrupted,
      healthUrl: health.url,
      database: filename,
      seconds: Math.round(((yield* Clock.currentTimeMillis) - started) / 100) / 10
    }
    return { ...summary, proved: proof(summary) } satisfies DemoSummary
  })
