/**
 * The chaos soak (`npm run soak -- --backend sqlite|postgres --seconds N [--workers K] [--seed S]`): a fleet of
 * real processes running the compiled package — request workers (worker.ts), merge-queue workers
 * (mergeQueueWorker.ts), work-lease workers (workLeaseWorker.ts, when the build has lease timeouts) and a
 * producer that is also a requester (producer.ts) — on one database, while the nemesis (nemesis.ts) kills,
 * stops, terminates and starves them for `--seconds`. Then the queue drains, everyone is stopped with SIGTERM,
 * the orchestrator reads the database into `db.json`, and the checker (checker.ts) judges the histories every
 * process wrote (history.ts). Prints a table of figures and PASS/FAIL per property; exits 1 when one fails.
 * The history directory is kept (its path is printed) so the run can be checked again or inspected.
 *
 * Other modes: `--check DIR` judges a kept directory again; `--self-test [DIR]` runs the checker's self-test
 * (selfTest.ts) on copies of a recorded history (default: the committed one).
 *
 * The orchestrator is tooling, not library code: it uses Node's timers and child processes directly.
 */
import { SqlClient } from "@effect/sql"
import { Effect, Either, Layer, ManagedRuntime } from "effect"
import { MailboxSql, MailboxSqlAdmin, MainLoop, MergeQueue } from "leasehold"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { appendFileSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as Checker from "./checker.js"
import * as History from "./history.js"
import * as Nemesis from "./nemesis.js"
import * as Postgres from "./postgres.js"
import * as Protocol from "./protocol.js"
import * as Random from "./random.js"
import * as SelfTest from "./selfTest.js"
import * as WorkLeases from "./workLeases.js"

const here = dirname(fileURLToPath(import.meta.url))

/** The commit under test (with "-dirty" when the tree has changes), for the report; none outside a checkout. */
const commit = (): string | undefined => {
  try {
    return execFileSync("git", ["describe", "--always", "--dirty"], { cwd: here, encoding: "utf8", stdio: "pipe" })
      .trim()
  } catch {
    return undefined
  }
}
const sleep = (millis: number) => new Promise<void>((done) => setTimeout(done, millis))
const say = (line: string) => process.stdout.write(line + "\n")

// ---------------------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------------------

interface Options {
  readonly backend: "sqlite" | "postgres"
  readonly seconds: number
  readonly workers: number
  readonly seed: number
  readonly rate: number
  readonly loops: number
  readonly mergeWorkers: number
  readonly leaseWorkers: number | undefined
  readonly drainSeconds: number | undefined
  readonly dir: string | undefined
}

const usage = `usage: npm run soak -- --backend sqlite|postgres [--seconds N] [--workers K] [--seed S]
                     [--rate R] [--loops L] [--merge-workers M] [--lease-workers W] [--drain-seconds D] [--dir DIR]
       npm run soak -- --check DIR
       npm run soak -- --self-test [DIR]`

const fail = (message: string): never => {
  process.stderr.write(`${message}\n${usage}\n`)
  process.exit(2)
}

const parse = (argv: ReadonlyArray<string>) => {
  const flags = new Map<string, string>()
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith("--")) fail(`unexpected argument ${arg}`)
    const next = argv[i + 1]
    if (next === undefined || next.startsWith("--")) flags.set(arg.slice(2), "")
    else {
      flags.set(arg.slice(2), next)
      i++
    }
  }
  const int = (name: string, fallback: number, min: number, max: number) => {
    const raw = flags.get(name)
    if (raw === undefined) return fallback
    const value = Number(raw)
    if (!Number.isInteger(value) || value < min || value > max) fail(`--${name} must be an integer in ${min}..${max}`)
    return value
  }
  return { flags, int }
}

// ---------------------------------------------------------------------------------------------------------
// The fleet: child processes, their signals and exits, all recorded
// ---------------------------------------------------------------------------------------------------------

type Role = "worker" | "merge" | "lease" | "producer" | "lock"

interface Member {
  readonly proc: string
  readonly role: Role
  readonly child: ChildProcess
  readonly pid: number
  ready: boolean
  paused: boolean
  terminating: boolean
  killed: boolean
  exited: boolean
  /** A replacement was started for it already (at its SIGKILL or SIGTERM). */
  replaced: boolean
  output: string
  readonly whenReady: Promise<void>
  readonly whenExited: Promise<void>
}

const bundles: Record<Role, string> = {
  worker: "worker.mjs",
  merge: "mergeQueueWorker.mjs",
  lease: "workLeaseWorker.mjs",
  producer: "producer.mjs",
  lock: "sqliteLock.mjs"
}
const names: Record<Role, string> = { worker: "w", merge: "m", lease: "l", producer: "producer", lock: "lock" }

const makeFleet = (config: Protocol.Config, history: History.History, cluster: Postgres.Cluster | undefined) => {
  const members = new Map<string, Member>()
  const counters: Record<string, number> = {}
  const json = JSON.stringify(config)
  let replacing = true

  const start = (role: Role, extra: ReadonlyArray<string> = []): Member => {
    counters[role] = (counters[role] ?? 0) + 1
    const proc = role === "producer" ? "producer" : `${names[role]}${counters[role]}`
    const log = join(config.dir, "logs", `${proc}.log`)
    const child = spawn(process.execPath, [join(here, bundles[role]), json, proc, ...extra], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, NO_COLOR: "1" }
    })
    let markReady: () => void = () => undefined
    let markExited: () => void = () => undefined
    const member: Member = {
      proc,
      role,
      child,
      pid: child.pid ?? -1,
      ready: false,
      paused: false,
      terminating: false,
      killed: false,
      exited: false,
      replaced: false,
      output: "",
      whenReady: new Promise<void>((resolve, reject) => {
        markReady = resolve
        child.on("exit", () => reject(new Error(`${proc} exited before it was ready`)))
      }),
      whenExited: new Promise<void>((resolve) => (markExited = resolve))
    }
    member.whenReady.catch(() => undefined)
    members.set(proc, member)
    history.append({ ev: "spawn", target: proc, targetPid: member.pid, role })
    child.stdout!.on("data", (chunk: Buffer) => {
      appendFileSync(log, chunk)
      member.output = (member.output + chunk.toString()).slice(-4000)
      if (!member.ready && /^ready$/m.test(member.output)) {
        member.ready = true
        markReady()
      }
    })
    child.stderr!.on("data", (chunk: Buffer) => appendFileSync(log, chunk))
    child.on("exit", (code, signal) => {
      member.exited = true
      members.delete(proc)
      if (role !== "lock") {
        history.append({
          ev: "exit",
          target: proc,
          targetPid: member.pid,
          role,
          code,
          signal,
          ready: member.ready
        })
      }
      markExited()
      // Keep the fleet at strength while faults and the drain go on; a process that died unasked (it could
      // not connect while the database was down) is restarted after a pause.
      if (replacing && !member.replaced && (role === "worker" || role === "merge" || role === "lease")) {
        const asked = member.killed || member.terminating
        setTimeout(() => {
          if (replacing) start(role)
        }, asked ? 0 : 1000)
      }
    })
    return member
  }

  const signal = (member: Member, name: "SIGKILL" | "SIGSTOP" | "SIGCONT" | "SIGTERM", cause: "nemesis" | "stop") => {
    if (member.exited) return
    // Recorded before it is sent: whatever the signal causes happens after this instant.
    history.append({ ev: "signal", signal: name, target: member.proc, targetPid: member.pid, cause })
    try {
      process.kill(member.pid, name)
    } catch {
      // It exited in between; its exit is recorded by its handler.
    }
  }

  const fleet: Nemesis.Fleet = {
    victims: () =>
      [...members.values()]
        .filter((m) =>
          (m.role === "worker" || m.role === "merge" || m.role === "lease") && m.ready && !m.paused &&
          !m.terminating && !m.killed && !m.exited
        )
        .map((m) => ({ proc: m.proc, role: m.role as Nemesis.Victim["role"] })),
    kill: (proc) => {
      const member = members.get(proc)
      if (member === undefined) return
      member.killed = true
      member.replaced = true
      signal(member, "SIGKILL", "nemesis")
      start(member.role)
    },
    terminate: (proc) => {
      const member = members.get(proc)
      if (member === undefined) return
      member.terminating = true
      member.replaced = true
      signal(member, "SIGTERM", "nemesis")
      start(member.role)
    },
    pause: async (proc, millis) => {
      const member = members.get(proc)
      if (member === undefined) return
      member.paused = true
      signal(member, "SIGSTOP", "nemesis")
      await sleep(millis)
      signal(member, "SIGCONT", "nemesis")
      member.paused = false
    },
    databaseFault: async (millis) => {
      if (cluster !== undefined) {
        history.append({ ev: "pg-stop" })
        await cluster.stop().catch((error) => say(`soak: pg_ctl stop failed: ${error}`))
        await sleep(millis)
        let ok = false
        for (let attempt = 0; attempt < 20 && !ok; attempt++) {
          ok = await cluster.start().then(() => true, () => false)
          if (!ok) await sleep(500)
        }
        history.append({ ev: "pg-start", ok })
      } else {
        // The holder records when it holds the lock and when it let go, in its own history.
        await start("lock", [String(millis)]).whenExited
      }
    },
    databaseFaultKind: config.backend === "postgres" ? "pg-restart" : "sqlite-lock"
  }

  /** SIGTERM to every process, then wait (bounded) for their exits; SIGKILL what is left. */
  const stopAll = async (timeoutMillis: number) => {
    replacing = false
    const live = [...members.values()].filter((m) => m.role !== "lock")
    for (const member of live) {
      if (member.paused) signal(member, "SIGCONT", "stop")
      member.terminating = true
      signal(member, "SIGTERM", "stop")
    }
    const all = Promise.all(live.map((m) => m.whenExited))
    const timedOut = await Promise.race([all.then(() => false), sleep(timeoutMillis).then(() => true)])
    if (timedOut) {
      for (const member of live) if (!member.exited) signal(member, "SIGKILL", "stop")
      await all
    }
  }

  /** SIGKILL to everything, unrecorded: the orchestrator itself is going away. */
  const killAll = () => {
    replacing = false
    for (const member of members.values()) {
      try {
        process.kill(member.pid, "SIGKILL")
      } catch {
        // gone already
      }
    }
  }

  return { members, start, fleet, stopAll, killAll, stopReplacing: () => (replacing = false) }
}

// ---------------------------------------------------------------------------------------------------------
// The database, seen from the orchestrator: setup, drain, dump
// ---------------------------------------------------------------------------------------------------------

const requestIdOf = (body: string): string | undefined => {
  try {
    const value = JSON.parse(body) as { requestId?: unknown }
    return typeof value.requestId === "string" ? value.requestId : undefined
  } catch {
    return undefined
  }
}

const layerOf = (config: Protocol.Config) =>
  Layer.provideMerge(
    MergeQueue.layer({ prefix: Protocol.prefix, lockTimeout: config.lockTimeoutMs }),
    Protocol.database(config)
  )

/** Creates every table before the fleet starts, so no process races another's migration. */
const setup = (config: Protocol.Config) =>
  Effect.gen(function*() {
    yield* MailboxSql.make({
      name: Protocol.requestsQueue,
      schema: MainLoop.requestSchema(Protocol.Body),
      prefix: Protocol.prefix
    })
    yield* MailboxSql.make({
      name: Protocol.repliesQueue,
      schema: MainLoop.resultSchema(Protocol.Output),
      prefix: Protocol.prefix
    })
    yield* MailboxSqlAdmin.deadLetters({ prefix: Protocol.prefix })
    // Keys: the queue's default limit, so every tenant's key has it (checker property 8).
    if (config.keyLimit !== undefined) {
      const queues = yield* MailboxSqlAdmin.queues({ prefix: Protocol.prefix })
      yield* queues.setKeySettings(Protocol.requestsQueue, undefined, { limit: config.keyLimit })
    }
    yield* MergeQueue.MergeQueue
    if (config.leaseWorkers > 0) yield* WorkLeases.setup(config)
  }).pipe(Effect.scoped)

/** What is left to do: messages in the two queues, merge entries not merged, lease offsets not processed. */
const leftToDo = (config: Protocol.Config) =>
  Effect.gen(function*() {
    const stats = yield* (yield* MailboxSqlAdmin.queues({ prefix: Protocol.prefix })).stats
    const count = (queue: string) => {
      const s = stats.find((q) => q.queue === queue)
      return s === undefined ? 0 : s.queued + s.inFlight + s.delayed
    }
    const merge = yield* (yield* MergeQueue.MergeQueue).stats
    const leases = config.leaseWorkers > 0 ? yield* WorkLeases.pending(config) : 0
    return {
      requests: count(Protocol.requestsQueue),
      replies: count(Protocol.repliesQueue),
      merges: merge.total - merge.byStatus.merged,
      leases
    }
  })

/**
 * Each key's live leases of the requests queue, in one statement on the database's clock: rows with a receipt
 * handle whose visibility is still ahead — what the claim counts against a key's limit.
 */
const keyLeases = (config: Protocol.Config) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const now = sql.literal(
      config.backend === "postgres"
        ? "(floor(extract(epoch from statement_timestamp()) * 1000))::bigint"
        : "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    )
    const rows = yield* sql<{ key: string; live: number | string; at: number | string }>`SELECT key,
        COUNT(*) AS live, MAX(${now}) AS at
      FROM ${sql(`${Protocol.prefix}mailbox_messages`)}
      WHERE queue = ${Protocol.requestsQueue} AND key IS NOT NULL AND receipt_handle IS NOT NULL
        AND visible_at > ${now}
      GROUP BY key`
    return {
      at: rows.length === 0 ? Date.now() : Number(rows[0]!.at),
      live: Object.fromEntries(rows.map((row) => [row.key, Number(row.live)]))
    }
  })

/** The database after the drain, for the checker. */
const dump = (config: Protocol.Config) =>
  Effect.gen(function*() {
    const queues = yield* MailboxSqlAdmin.queues({ prefix: Protocol.prefix })
    const remaining: Array<Checker.RemainingMessage> = []
    for (const queue of [Protocol.requestsQueue, Protocol.repliesQueue]) {
      for (const m of yield* queues.peek(queue, { limit: 100_000 })) {
        remaining.push({
          queue,
          id: m.id,
          state: m.state,
          deliveryCount: m.deliveryCount,
          requestId: requestIdOf(m.body)
        })
      }
    }
    const letters = yield* (yield* MailboxSqlAdmin.deadLetters({ prefix: Protocol.prefix })).list({ limit: 100_000 })
    const queue = yield* MergeQueue.MergeQueue
    const entries = yield* queue.list({ limit: 100_000 })
    const audit = yield* queue.auditLog({ limit: 100_000 })
    const value = <A>(option: { readonly _tag: "Some"; readonly value: A } | { readonly _tag: "None" }) =>
      option._tag === "Some" ? option.value : undefined
    const result: Checker.Dump = {
      remaining,
      deadLetters: letters.map((l) => ({
        id: l.id,
        queue: l.queue,
        requestId: requestIdOf(l.body),
        errorTag: l.errorTag,
        deliveryCount: l.deliveryCount
      })),
      mergeEntries: entries.map((e) => ({ id: e.id, workspace: e.workspace, status: e.status })),
      audit: audit.map((row) => ({
        id: row.id,
        at: row.at.epochMillis,
        action: row.action,
        agentId: value(row.agentId),
        entryId: value(row.entryId),
        fencingToken: value(row.fencingToken),
        fromStatus: value(row.fromStatus),
        toStatus: value(row.toStatus),
        detail: value(row.detail)
      })),
      leases: config.leaseWorkers > 0 ? yield* WorkLeases.dump(config) : undefined
    }
    return result
  })

// ---------------------------------------------------------------------------------------------------------
// A soak
// ---------------------------------------------------------------------------------------------------------

const soak = async (options: Options): Promise<number> => {
  const leaseWorkers = options.leaseWorkers ?? 3
  const replay = [
    "npm run soak --",
    `--backend ${options.backend}`,
    `--seconds ${options.seconds}`,
    `--workers ${options.workers}`,
    `--seed ${options.seed}`,
    ...(options.rate === 20 ? [] : [`--rate ${options.rate}`]),
    ...(options.loops === 2 ? [] : [`--loops ${options.loops}`]),
    ...(options.mergeWorkers === 2 ? [] : [`--merge-workers ${options.mergeWorkers}`]),
    ...(options.leaseWorkers === undefined ? [] : [`--lease-workers ${options.leaseWorkers}`])
  ].join(" ")
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), `leasehold-soak-${options.backend}-${options.seed}-`))
  mkdirSync(join(dir, "logs"), { recursive: true })
  say(
    `soak: backend ${options.backend}, ${options.seconds} s of faults, ${options.workers} workers, seed ${options.seed}`
  )
  say(`soak: replay with: ${replay}`)
  say(`soak: history in ${dir}`)

  const cluster = options.backend === "postgres" ? await Postgres.start() : undefined
  const stubborn = options.seconds >= 300
  const config: Protocol.Config = {
    backend: options.backend,
    target: cluster?.url ?? join(dir, "soak.db"),
    dir,
    seed: options.seed,
    seconds: options.seconds,
    rate: options.rate,
    workers: options.workers,
    loops: options.loops,
    visibilityMs: 2000,
    extenderIntervalMs: 500,
    extensionMs: 2000,
    beatEveryMs: 100,
    shutdownTimeoutMs: 5000,
    maxDeliveryCount: 3,
    stubborn,
    mergeWorkers: options.mergeWorkers,
    lockTimeoutMs: 2000,
    mergeEveryMs: options.mergeWorkers > 0 ? 2000 : 0,
    leaseWorkers,
    leaseDomains: 3,
    leaseTimeoutMs: 2000,
    leaseOffsetEveryMs: 400,
    leaseMaxRetries: 3,
    tenants: ["t0", "t1", "t2", "t3"],
    keyLimit: 2
  }
  const history = History.open(dir, "orchestrator")
  history.append({ ev: "config", config: { ...config, replay, commit: commit() } })
  history.append({ ev: "phase", phase: "setup" })
  const runtime = ManagedRuntime.make(layerOf(config))
  const fleet = makeFleet(config, history, cluster)
  const cleanup = async () => {
    fleet.killAll()
    await runtime.dispose().catch(() => undefined)
    await cluster?.destroy().catch(() => undefined)
  }
  process.once("SIGINT", () => {
    say("soak: interrupted; stopping everything (the history is kept)")
    void cleanup().finally(() => process.exit(130))
  })

  let sampling = false
  let sampler: Promise<void> = Promise.resolve()
  try {
    await runtime.runPromise(setup(config))
    if (config.tenants !== undefined && config.keyLimit !== undefined) {
      history.append({ ev: "keys", queue: Protocol.requestsQueue, keys: config.tenants, limit: config.keyLimit })
    }
    // Each key's live leases, sampled every 50 ms from the fleet's start until the stop (property 8). A sample
    // that fails (the database down) is recorded as such; the next one tries again.
    sampling = config.keyLimit !== undefined
    sampler = (async () => {
      while (sampling) {
        const sample = await runtime.runPromise(Effect.either(keyLeases(config)))
          .catch((error: unknown) => Either.left(error))
        if (!sampling) break
        if (Either.isRight(sample)) history.append({ ev: "key-leases", ...sample.right })
        else history.append({ ev: "key-leases-failed", error: String(sample.left).slice(0, 300) })
        await sleep(50)
      }
    })()
    const producer = fleet.start("producer")
    for (let i = 0; i < options.workers; i++) fleet.start("worker")
    for (let i = 0; i < options.mergeWorkers; i++) fleet.start("merge")
    for (let i = 0; i < leaseWorkers; i++) fleet.start("lease")
    await Promise.race([
      Promise.all([...fleet.members.values()].map((m) => m.whenReady)),
      sleep(60_000).then(() => Promise.reject(new Error("the fleet was not ready within 60 s")))
    ])

    history.append({ ev: "phase", phase: "faults" })
    say(`soak: fleet ready; ${options.seconds} s of faults`)
    const counts = await Nemesis.run({
      fleet: fleet.fleet,
      random: Random.make(options.seed, 2),
      history,
      seconds: options.seconds
    })
    say(`soak: faults done: ${JSON.stringify(counts)}`)
    // The producer stops sending on its own clock; wait for it (it started a little before the nemesis).
    const deadline = performance.now() + 30_000
    while (!/sending-done/.test(producer.output) && performance.now() < deadline) await sleep(100)

    history.append({ ev: "phase", phase: "drain" })
    const drainMillis = (options.drainSeconds ?? (stubborn ? 260 : 60)) * 1000
    const drainStarted = performance.now()
    let left = await runtime.runPromise(leftToDo(config))
    while (
      left.requests + left.replies + left.merges + left.leases > 0 && performance.now() - drainStarted < drainMillis
    ) {
      await sleep(500)
      left = await runtime.runPromise(leftToDo(config)).catch(() => left)
    }
    const drained = left.requests + left.replies + left.merges + left.leases === 0
    history.append({
      ev: "drained",
      ok: drained,
      millis: performance.now() - drainStarted,
      detail: JSON.stringify(left)
    })
    say(
      `soak: drain ${drained ? "done" : "timed out"} in ${Math.round(performance.now() - drainStarted)} ms ${
        JSON.stringify(left)
      }`
    )

    sampling = false
    await sampler
    history.append({ ev: "phase", phase: "stop" })
    await fleet.stopAll(config.shutdownTimeoutMs + 15_000)
    const database = await runtime.runPromise(dump(config))
    writeFileSync(join(dir, "db.json"), JSON.stringify(database))
    history.append({ ev: "phase", phase: "done" })
    history.close()
  } catch (error) {
    sampling = false
    await sampler
    say(`soak: the run failed: ${error instanceof Error ? error.stack : String(error)}`)
    await cleanup()
    say(`soak: history kept in ${dir}`)
    return 1
  }
  await cleanup()

  const report = Checker.check(dir)
  const text = Checker.format(report)
  writeFileSync(join(dir, "report.txt"), text + "\n")
  say("")
  say(text)
  say(`history: ${dir}`)
  return report.pass ? 0 : 1
}

// ---------------------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------------------

const main = async (): Promise<number> => {
  const { flags, int } = parse(process.argv.slice(2))
  if (flags.has("self-test")) {
    const source = flags.get("self-test") || join(here, "..", "fixtures", "history")
    const results = SelfTest.run(resolve(source))
    say(SelfTest.format(results))
    return results.every((r) => r.ok) ? 0 : 1
  }
  if (flags.has("check")) {
    const dir = flags.get("check")!
    if (dir === "") fail("--check needs a directory")
    const report = Checker.check(resolve(dir))
    say(Checker.format(report))
    return report.pass ? 0 : 1
  }
  const backend = flags.get("backend")
  if (backend !== "sqlite" && backend !== "postgres") return fail("--backend must be sqlite or postgres")
  const options: Options = {
    backend,
    seconds: int("seconds", 60, 5, 24 * 3600),
    workers: int("workers", 4, 1, 32),
    seed: int("seed", Random.freshSeed(), 0, 2 ** 31 - 1),
    rate: int("rate", 20, 1, 1000),
    loops: int("loops", 2, 1, 8),
    mergeWorkers: int("merge-workers", 2, 0, 8),
    leaseWorkers: flags.has("lease-workers") ? int("lease-workers", 3, 0, 8) : undefined,
    drainSeconds: flags.has("drain-seconds") ? int("drain-seconds", 60, 1, 3600) : undefined,
    dir: flags.get("dir") === undefined ? undefined : resolve(flags.get("dir")!)
  }
  return soak(options)
}

main().then((code) => process.exit(code), (error) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`)
  process.exit(1)
})
