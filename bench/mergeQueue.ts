/**
 * MergeQueue throughput and recovery. A cycle is what a merge worker does
 * per entry: nextWithLock → five transitions (rebasing … merged) →
 * releaseProcessingLock, each call holding the lock row and writing its
 * audit rows in one round trip (a PL/pgSQL function on PostgreSQL, one
 * write transaction on SQLite). Baseline: the same cycle as bare autocommit
 * statements on an equivalent table — a claim with `UPDATE … RETURNING` and
 * five status updates, with no processing lock, fencing check, audit or
 * recovery — so the ratio is the price of those guarantees. It also writes
 * fewer pages per cycle (no audit rows, no unique index over the active
 * workspaces), which on SQLite sets how often the WAL is checkpointed; and
 * with several workers its cycles run side by side (on PostgreSQL on as many
 * connections), where the merge queue's single lock takes one entry at a time.
 * `bench/mergeQueue.main.ts` runs this file alone.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect, type Layer, Option } from "effect"
import { MergeQueue } from "leasehold"
import { spawn } from "node:child_process"
import { performance } from "node:perf_hooks"

const STEPS = ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const

/** Filled by a timed run when given: the process's CPU time (user + system) over the timed part, in µs. */
export interface RunStats {
  cpuMicros: number
}

const startTimer = () => ({ wall: performance.now(), cpu: process.cpuUsage() })

const stopTimer = (started: ReturnType<typeof startTimer>, entries: number, stats: RunStats | undefined) => {
  if (stats !== undefined) {
    const cpu = process.cpuUsage(started.cpu)
    stats.cpuMicros = cpu.user + cpu.system
  }
  return entries / ((performance.now() - started.wall) / 1000)
}

/** Cycles per second through MergeQueue with `workers` fibers contending for the lock. */
export const mergeQueueCycles = (
  database: Layer.Layer<SqlClient.SqlClient, unknown>,
  prefix: string,
  entries: number,
  workers: number,
  stats?: RunStats
): Effect.Effect<number, unknown> =>
  Effect.gen(function*() {
    const queue = yield* MergeQueue.make({ prefix })
    for (let i = 0; i < entries; i++) yield* queue.enqueue(`ws-${i}`)
    let merged = 0
    const started = startTimer()
    yield* Effect.all(
      Array.from({ length: workers }, (_, w) =>
        Effect.gen(function*() {
          const agent = `agent-${w}`
          while (merged < entries) {
            const next = yield* queue.nextWithLock(agent)
            if (Option.isNone(next)) {
              yield* Effect.sleep("20 millis") // an idle worker's poll, as in the crash test's workers
              continue
            }
            for (const status of STEPS) yield* queue.transition(next.value, status)
            merged++
            yield* queue.releaseProcessingLock(next.value)
          }
        })),
      { concurrency: "unbounded", discard: true }
    )
    return stopTimer(started, entries, stats)
  }).pipe(Effect.provide(database))

/** The baseline: the same cycle as bare statements, no lock, fencing or audit. */
export const bareCycles = (
  database: Layer.Layer<SqlClient.SqlClient, unknown>,
  prefix: string,
  entries: number,
  workers: number,
  stats?: RunStats
): Effect.Effect<number, unknown> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const table = sql(`${prefix}bare_queue`)
    const pg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
    yield* sql`CREATE TABLE ${table} (id INTEGER PRIMARY KEY, workspace TEXT NOT NULL, priority INTEGER NOT NULL,
      status TEXT NOT NULL, agent_id TEXT, state_changed_at BIGINT NOT NULL, created_at BIGINT NOT NULL)`
    yield* sql`CREATE INDEX ${sql(`${prefix}bare_queue_order`)} ON ${table} (status, priority, created_at, id)`
    for (let i = 0; i < entries; i++) {
      yield* sql`INSERT INTO ${table} VALUES (${i}, ${`ws-${i}`}, 2, 'pending', NULL, 0, 0)`
    }
    let merged = 0
    const started = startTimer()
    yield* Effect.all(
      Array.from({ length: workers }, (_, w) =>
        Effect.gen(function*() {
          const agent = `agent-${w}`
          while (merged < entries) {
            const claimed = yield* sql<{ id: number }>`UPDATE ${table} SET status = 'claimed', agent_id = ${agent}
              WHERE id = (SELECT id FROM ${table} WHERE status = 'pending' ORDER BY priority, created_at, id LIMIT 1
                ${pg ? sql`FOR UPDATE SKIP LOCKED` : sql``})
              RETURNING id`
            if (claimed[0] === undefined) {
              yield* Effect.sleep("20 millis")
              continue
            }
            for (const status of STEPS) {
              yield* sql`UPDATE ${table} SET status = ${status}, state_changed_at = 1 WHERE id = ${claimed[0].id}`
            }
            merged++
          }
        })),
      { concurrency: "unbounded", discard: true }
    )
    return stopTimer(started, entries, stats)
  }).pipe(Effect.provide(database))

/**
 * Recovery after a SIGKILL: a worker process (test/fixtures/merge-queue-worker.ts) works through the
 * queue; it is killed while it holds the lock, and a rescuer here polls `nextWithLock` every 10 ms.
 * Returns milliseconds from the kill to the rescuer's claim of the stuck entry, and from the lock's
 * expiry (read from the audit log) to that claim.
 */
export const recoveryAfterKill = (
  database: Layer.Layer<SqlClient.SqlClient, unknown>,
  target: string,
  prefix: string,
  lockTimeoutMs: number
): Effect.Effect<{ readonly fromKill: number; readonly fromExpiry: number }, unknown> =>
  Effect.gen(function*() {
    const queue = yield* MergeQueue.make({ prefix, lockTimeout: lockTimeoutMs })
    for (let i = 0; i < 2000; i++) yield* queue.enqueue(`ws-${i}`)
    const child = spawn(
      "node",
      ["--import", "tsx", "test/fixtures/merge-queue-worker.ts", target, prefix, "victim", `${lockTimeoutMs}`],
      { stdio: ["ignore", "pipe", "inherit"] }
    )
    let output = ""
    child.stdout.on("data", (chunk) => (output += chunk))
    while ((output.match(/^hold /gm) ?? []).length < 20) yield* Effect.sleep("10 millis")
    const killed = performance.now()
    child.kill("SIGKILL")
    yield* Effect.async<void>((resume) => void child.on("exit", () => resume(Effect.void)))
    const stuck = (yield* queue.list({ status: [...MergeQueue.inProgress] }))[0]
    if (stuck === undefined) return yield* Effect.dieMessage("killed between two entries; nothing was stuck")
    for (;;) {
      const next = yield* queue.nextWithLock("rescuer")
      if (Option.isSome(next)) {
        const fromKill = performance.now() - killed
        const audit = yield* queue.auditLog({ entryId: next.value.id })
        const reclaimed = audit.find((row) => row.action === "entry_reclaimed")
        const lockAudit = yield* queue.auditLog()
        const expired = [...lockAudit].reverse().find((row) => row.action === "lock_expired")
        const expiredAt = Number(/expired at (\d+)/.exec(Option.getOrElse(expired!.detail, () => ""))?.[1])
        if (next.value.id !== stuck.id || reclaimed === undefined) {
          return yield* Effect.dieMessage("the rescuer did not get the killed worker's entry")
        }
        return { fromKill, fromExpiry: reclaimed.at.epochMillis - expiredAt }
      }
      yield* Effect.sleep("10 millis")
    }
  }).pipe(Effect.provide(database))
