/**
 * MergeQueue across real processes, on SQLite and PostgreSQL: 8 worker
 * processes contend for 500 entries while a controller SIGKILLs whichever
 * worker holds the processing lock and starts a replacement. Afterwards,
 * from the database and its audit log: every entry merged exactly once, the
 * lock's holders never overlapped (each claim, transition and extension was
 * made under the live lock's own fencing token), and no entry stayed stuck
 * longer than the lock timeout plus one claim attempt.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, DateTime, Effect, Exit, Layer, Option, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MergeQueue from "../src/MergeQueue.js"
import { type Child, spawnBundled } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-merge-crash-"))
const sqliteFile = join(directory, "queue.db")
let tables = 0

const suiteScope = Effect.runSync(Scope.make())
const clients: Record<string, SqlClient.SqlClient> = {}
let pgUrl = ""
beforeAll(async () => {
  const build = (layer: Layer.Layer<MergeQueue.MergeQueue | SqlClient.SqlClient, unknown>) =>
    Effect.runPromise(Layer.buildWithScope(layer, suiteScope).pipe(Effect.map(Context.get(SqlClient.SqlClient))))
  clients.SQLite = await build(MergeQueue.layerSqlite({ filename: sqliteFile, prefix: "setup_" }))
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
  clients.PostgreSQL = await build(MergeQueue.layerPg({ url: pgUrl, prefix: "setup_" }))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const ENTRIES = 500
const WORKERS = 8
const KILLS = 8
const LOCK_TIMEOUT_MS = 1000
/** One claim attempt after expiry: idle workers poll every 20 ms; the rest is slack for a loaded 2-core machine. */
const CLAIM_ATTEMPT_MS = 1000
const WORKER = "test/fixtures/merge-queue-worker.ts"

/** Replays the audit log; fails the test on any overlap, and returns how long reclaimed entries were stuck. */
const replayAudit = (rows: ReadonlyArray<MergeQueue.AuditRecord>, lockTimeoutMs: number) => {
  let holder: { readonly agent: string; readonly token: number } | undefined
  let lastToken = 0
  const expiry = new Map<number, number>()
  const stuck: Array<number> = []
  const at = (row: MergeQueue.AuditRecord) => DateTime.toEpochMillis(row.at)
  for (const row of rows) {
    const agent = Option.getOrUndefined(row.agentId)
    const token = Option.getOrUndefined(row.fencingToken)
    switch (row.action) {
      case "lock_acquired": {
        if (holder !== undefined) expect(holder.agent).toBe(agent)
        expect(token).toBeGreaterThanOrEqual(lastToken)
        if (holder === undefined) expect(token).toBeGreaterThan(lastToken)
        holder = { agent: agent!, token: token! }
        lastToken = token!
        expiry.set(token!, at(row) + lockTimeoutMs)
        break
      }
      case "lock_released":
      case "lock_expired": {
        expect(holder).toEqual({ agent, token })
        holder = undefined
        break
      }
      case "lock_extended": {
        expect(holder).toEqual({ agent, token })
        const until = Number(/until (\d+)/.exec(Option.getOrElse(row.detail, () => ""))?.[1])
        expiry.set(token!, Math.max(expiry.get(token!) ?? 0, until))
        break
      }
      case "claimed":
      case "transition": {
        expect(holder).toEqual({ agent, token })
        break
      }
      case "entry_reclaimed": {
        stuck.push(at(row) - expiry.get(token!)!)
        break
      }
      case "enqueued":
        break
    }
  }
  return stuck
}

const backends = [
  { label: "SQLite", target: () => sqliteFile },
  { label: "PostgreSQL", target: () => pgUrl }
] as const

for (const backend of backends) {
  describe(`MergeQueue processes on ${backend.label}`, () => {
    it.live(
      `${WORKERS} workers, ${ENTRIES} entries, the lock holder SIGKILLed ${KILLS} times: each merged once, no overlap`,
      () =>
        Effect.gen(function*() {
          const prefix = `c${++tables}_`
          const queue = yield* MergeQueue.make({ prefix, lockTimeout: LOCK_TIMEOUT_MS })
          for (let i = 0; i < ENTRIES; i++) yield* queue.enqueue(`ws-${i}`, { priority: i % 3 })
          let agents = 0
          const spawn = () => {
            const agent = `agent-${++agents}`
            return Effect.map(
              spawnBundled(WORKER, [backend.target(), prefix, agent, `${LOCK_TIMEOUT_MS}`]),
              (child) => ({ agent, child })
            )
          }
          const live: Array<{ readonly agent: string; readonly child: Child }> = []
          for (let i = 0; i < WORKERS; i++) live.push(yield* spawn())
          yield* Effect.all(live.map(({ child }) => child.waitFor(/^ready$/m)), { concurrency: "unbounded" })

          let kills = 0
          for (let round = 0; (yield* queue.stats).byStatus.merged < ENTRIES; round++) {
            if (round >= 1500) {
              return yield* Effect.dieMessage(`stalled: ${JSON.stringify((yield* queue.stats).byStatus)}`)
            }
            yield* Effect.sleep(`${100 + Math.floor(Math.random() * 100)} millis`)
            if (kills >= KILLS || round % 5 !== 4) continue
            // Kill the worker that holds the lock while it holds it.
            const lock = yield* queue.getProcessingLock
            const victim = live.find((worker) => Option.isSome(lock) && worker.agent === lock.value.agentId)
            if (victim === undefined || !/^hold /m.test(victim.child.output())) continue
            live.splice(live.indexOf(victim), 1)
            yield* victim.child.signal("SIGKILL")
            yield* victim.child.exited
            kills++
            const replacement = yield* spawn()
            live.push(replacement)
          }
          const exits = yield* Effect.all(live.map(({ child }) => child.exited))
          expect(exits.map((exit) => exit.code)).toEqual(live.map(() => 0))

          const entries = yield* queue.list()
          expect(entries.length).toBe(ENTRIES)
          expect(entries.filter((entry) => entry.status !== "merged")).toEqual([])
          const audit = yield* queue.auditLog()
          const merges = audit.filter((row) => row.action === "transition" && Option.contains(row.toStatus, "merged"))
          expect(new Set(merges.map((row) => Option.getOrThrow(row.entryId))).size).toBe(ENTRIES)
          expect(merges.length).toBe(ENTRIES)
          const stuck = replayAudit(audit, LOCK_TIMEOUT_MS)
          expect(kills).toBe(KILLS)
          expect(stuck.length).toBeGreaterThanOrEqual(1)
          expect(Math.max(...stuck)).toBeLessThanOrEqual(CLAIM_ATTEMPT_MS)
          yield* Effect.logInfo(
            `${backend.label}: ${ENTRIES} entries merged once each by ${agents} agents, ${kills} lock holders killed, ` +
              `${stuck.length} entries reclaimed, stuck after lock expiry at most ${Math.max(...stuck)} ms`
          )
        }).pipe(Effect.provideService(SqlClient.SqlClient, clients[backend.label]!), Effect.scoped),
      240_000
    )
  })
}
