/**
 * MergeQueue on SQLite (a temporary file) and PostgreSQL (a throwaway
 * cluster): the seed's named scenarios, the two holes it left (entries stuck
 * in any in-progress status; a live, extended lock never reclaimed),
 * fencing of zombie agents, faults injected inside the database (a trigger
 * that fails a write, whichever statement or function makes it) and through a
 * wrapped `SqlClient` (a busy database), the upgrade of a database an earlier
 * version made, and bad input. Lock expiry is driven by `TestClock`.
 */
import { SqlClient } from "@effect/sql"
import { SqlError } from "@effect/sql/SqlError"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "@effect/vitest"
import {
  Context,
  DateTime,
  Duration,
  Effect,
  Either,
  Exit,
  Fiber,
  Layer,
  Metric,
  Option,
  Ref,
  Schema,
  Scope,
  TestClock,
  TestServices
} from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Heartbeat from "../src/Heartbeat.js"
import { look as lookAt } from "../src/internal/mergeQueue/look.js"
import * as Sql from "../src/internal/sql/common.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import * as MergeQueue from "../src/MergeQueue.js"
import { captureLogs, refusedOptions, skewedClock } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-merge-queue-"))
let tables = 0
let prefix = "q0_"
beforeEach(() => {
  prefix = `q${++tables}_`
})

const suiteScope = Effect.runSync(Scope.make())
let sqlite: SqlClient.SqlClient
let pg: SqlClient.SqlClient
const clientOf = (layer: Layer.Layer<SqlClient.SqlClient | MergeQueue.MergeQueue, unknown>) =>
  Effect.runPromise(Layer.buildWithScope(layer, suiteScope).pipe(Effect.map(Context.get(SqlClient.SqlClient))))
beforeAll(async () => {
  sqlite = await clientOf(MergeQueue.layerSqlite({ filename: join(directory, "queue.db"), prefix: "setup_" }))
  const cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))
  pg = await clientOf(MergeQueue.layerPg({ url: cluster.url, prefix: "setup_" }))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const TIMEOUT = 300_000
const queueOn = (sql: SqlClient.SqlClient, options?: MergeQueue.Options) =>
  MergeQueue.make({ prefix, ...options }).pipe(Effect.provideService(SqlClient.SqlClient, sql))

/** The seed's invariants, checked over every entry. */
const checkInvariants = (queue: MergeQueue.MergeQueueService) =>
  Effect.gen(function*() {
    for (const entry of yield* queue.list()) {
      const active = MergeQueue.inProgress.includes(entry.status)
      if (entry.status === "claimed") expect(Option.isSome(entry.startedAt)).toBe(true)
      if (Option.isSome(entry.startedAt)) {
        expect(DateTime.toEpochMillis(entry.startedAt.value)).toBeLessThanOrEqual(
          DateTime.toEpochMillis(entry.stateChangedAt)
        )
      }
      expect(Option.isSome(entry.agentId)).toBe(active)
      expect(Option.isSome(entry.fencingToken)).toBe(active)
    }
  })

/** Puts an entry in `status` for `agentId` under `token`, as a crashed worker would have left it. */
const leftBehind = (
  sql: SqlClient.SqlClient,
  id: number,
  status: MergeQueue.Status,
  agentId: string,
  token: number,
  at: number
) =>
  sql`UPDATE ${sql(`${prefix}merge_queue`)} SET status = ${status}, agent_id = ${agentId}, fencing_token = ${token},
    started_at = ${at}, state_changed_at = ${at}, attempt_count = 1 WHERE id = ${id}`

/**
 * A client whose statements fail when their SQL contains `marker`, as many times as `remaining` says
 * (counting down), with `message` as the driver's error text: statements run through the client (PostgreSQL's
 * calls) and statements run on a connection held for a call (SQLite's). Arm it (`remaining`) once the queue is
 * made: the migration's function bodies contain the statements' text too.
 */
const failing = (
  sql: SqlClient.SqlClient,
  marker: string,
  remaining: Ref.Ref<number>,
  message = "injected fault"
): SqlClient.SqlClient => {
  const pg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
  const fails = (text: string) =>
    text.includes(marker) && Effect.runSync(Ref.modify(remaining, (n) => [n > 0, Math.max(0, n - 1)]))
  const fault = () => Effect.fail(new SqlError({ cause: new Error(message), message }))
  return new Proxy(sql, {
    apply(target, thisArg, args: Array<unknown>) {
      const statement = Reflect.apply(target, thisArg, args)
      const strings = args[0]
      return pg && Array.isArray(strings) && "raw" in strings && fails(statement.compile()[0]) ? fault() : statement
    },
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver)
      // The connection keeps its other methods (its prototype's too: a transaction begins with `executeUnprepared`).
      return property !== "reserve" ?
        value :
        Effect.map(
          value as typeof sql.reserve,
          (connection) =>
            Object.assign(Object.create(connection) as typeof connection, {
              execute: (text: string, params: ReadonlyArray<unknown>, transform: undefined) =>
                fails(text) ? fault() : connection.execute(text, params, transform)
            })
        )
    }
  })
}

/**
 * A fault inside the database: a trigger that makes every write moving an entry to `status` fail, whichever
 * statement or function does it. The effect it returns removes it.
 */
const faultOn = (sql: SqlClient.SqlClient, status: MergeQueue.Status) =>
  Effect.gen(function*() {
    const table = `${prefix}merge_queue`
    const name = `${prefix}fault_${status}`
    const pg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
    if (pg) {
      yield* sql.unsafe(`CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'injected fault'; END $$`)
      yield* sql.unsafe(`CREATE TRIGGER ${name} BEFORE UPDATE ON ${table} FOR EACH ROW
        WHEN (NEW.status = '${status}' AND OLD.status <> '${status}') EXECUTE FUNCTION ${name}()`)
    } else {
      yield* sql.unsafe(`CREATE TRIGGER ${name} BEFORE UPDATE OF status ON ${table} FOR EACH ROW
        WHEN NEW.status = '${status}' AND OLD.status <> '${status}' BEGIN SELECT RAISE(ABORT, 'injected fault'); END`)
    }
    return pg
      ? Effect.zipRight(sql.unsafe(`DROP TRIGGER ${name} ON ${table}`), sql.unsafe(`DROP FUNCTION ${name}()`))
      : sql.unsafe(`DROP TRIGGER ${name}`)
  }).pipe(Effect.orDie)

/** The marker of the claim's statement that takes the entry: the SQLite write, the PostgreSQL function call. */
const claimMarker = (sql: SqlClient.SqlClient) =>
  sql.onDialectOrElse({ pg: () => `${prefix}merge_queue_claim"(`, orElse: () => "SET status = 'claimed'" })

const backends = [
  { label: "SQLite", client: () => sqlite },
  { label: "PostgreSQL", client: () => pg }
] as const

for (const backend of backends) {
  describe(`MergeQueue on ${backend.label}`, () => {
    it.effect("serves entries by priority then age, and walks the state machine to merged", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const low = yield* queue.enqueue("ws-low", { priority: 3 })
        yield* TestClock.adjust("1 second")
        const urgent = yield* queue.enqueue("ws-urgent", { priority: 0, beadId: "bd-1" })
        yield* TestClock.adjust("1 second")
        const urgentLater = yield* queue.enqueue("ws-urgent-2", { priority: 0 })
        expect((yield* queue.list()).map((entry) => entry.id)).toEqual([urgent.id, urgentLater.id, low.id])

        const claimed = Option.getOrThrow(yield* queue.nextWithLock("agent-a"))
        expect(claimed).toMatchObject({ id: urgent.id, status: "claimed", attemptCount: 1 })
        expect(Option.getOrThrow(claimed.agentId)).toBe("agent-a")
        yield* checkInvariants(queue)
        for (const status of ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const) {
          const moved = yield* queue.transition(claimed, status)
          expect(moved.status).toBe(status)
          yield* checkInvariants(queue)
        }
        expect(yield* queue.releaseProcessingLock(claimed)).toBe(true)
        const next = Option.getOrThrow(yield* queue.nextWithLock("agent-b"))
        expect(next.id).toBe(urgentLater.id)
        expect(Option.getOrThrow(next.fencingToken)).toBeGreaterThan(Option.getOrThrow(claimed.fencingToken))
        const stats = yield* queue.stats
        expect(stats.byStatus).toMatchObject({ merged: 1, claimed: 1, pending: 1 })
        expect(Option.getOrThrow(stats.lock).agentId).toBe("agent-b")
      }).pipe(Effect.orDie))

    it.effect("inside a caller's write transaction its writes are the caller's: undone with it, kept with it", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const entry = yield* queue.enqueue("ws-tx")
        // Two levels deep (a savepoint inside the caller's transaction), then the caller fails: nothing stays.
        const undone = yield* Effect.flip(
          Sql.writeTransaction(sql)(
            Sql.writeTransaction(sql)(
              Effect.zipRight(queue.nextWithLock("agent-tx"), Effect.fail("caller gives up" as const))
            )
          )
        )
        expect(undone).toBe("caller gives up")
        expect(Option.getOrThrow(yield* queue.get(entry.id)).status).toBe("pending")
        expect(Option.isNone(yield* queue.getProcessingLock)).toBe(true)
        // The same claim in a caller's transaction that commits: the claim and the lock are there after it.
        const claimed = yield* Sql.writeTransaction(sql)(queue.nextWithLock("agent-tx"))
        expect(Option.getOrThrow(claimed).id).toBe(entry.id)
        expect(Option.getOrThrow(yield* queue.get(entry.id)).status).toBe("claimed")
        expect(Option.getOrThrow(yield* queue.getProcessingLock).agentId).toBe("agent-tx")
      }).pipe(Effect.orDie))

    it.effect("refuses illegal transitions and unknown statuses, changing nothing", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const entry = yield* queue.enqueue("ws")
        const unclaimed = yield* Effect.flip(queue.transition(entry.id, "rebasing"))
        expect(unclaimed._tag).toBe("LockLostError")
        expect(unclaimed.message).toContain("moving a pending entry to rebasing needs its claim")
        const skip = yield* Effect.flip(queue.transition(entry.id, "failed_retryable"))
        expect(skip._tag).toBe("InvalidTransitionError")
        const claim = Option.getOrThrow(yield* queue.nextWithLock("agent-a"))
        const illegal = yield* Effect.flip(queue.transition(claim, "merged"))
        expect(illegal).toMatchObject({ _tag: "InvalidTransitionError", from: "claimed", to: "merged" })
        expect(illegal.message).toContain("allowed: rebasing")
        // Exactly what the Status schema refuses (the check is a set lookup, not a parse).
        for (const status of ["shipped", "toString", "constructor", "Merged", "", 1, null, undefined]) {
          expect(Schema.is(MergeQueue.Status)(status)).toBe(false)
          const unknown = yield* Effect.flip(queue.transition(claim, status as MergeQueue.Status))
          expect(unknown).toMatchObject({ _tag: "InvalidParameterError", parameter: "status" })
        }
        const badToken = yield* Effect.flip(queue.transition({ id: entry.id, token: -1 }, "rebasing"))
        expect(badToken).toMatchObject({ _tag: "InvalidParameterError", parameter: "token" })
        const missing = yield* Effect.flip(queue.transition(9_999, "rebasing"))
        expect(missing._tag).toBe("EntryNotFoundError")
        yield* queue.transition(claim, "cancelled")
        const final = yield* Effect.flip(queue.transition(entry.id, "pending"))
        expect(final.message).toContain("cancelled is final")
        expect(Option.getOrThrow(yield* queue.get(entry.id)).status).toBe("cancelled")
        yield* checkInvariants(queue)
      }))

    it.effect("a move under a released lock, or of an entry no claim holds, is refused and changes nothing", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const entry = yield* queue.enqueue("ws")
        const claim = Option.getOrThrow(yield* queue.nextWithLock("agent-a"))
        expect(yield* queue.releaseProcessingLock(claim)).toBe(true)
        const audit = (yield* queue.auditLog()).length
        const released = yield* Effect.flip(queue.transition(claim, "rebasing"))
        expect(released).toMatchObject({ _tag: "LockLostError", entryId: entry.id, token: claim.token })
        expect(released.message).toContain("its processing lock was released or taken over")
        // An in-progress entry that lost its token (no claim carries it): refused whatever the token.
        yield* sql`UPDATE ${sql(`${prefix}merge_queue`)} SET fencing_token = NULL WHERE id = ${entry.id}`
        const unheld = yield* Effect.flip(queue.transition(claim, "rebasing"))
        expect(unheld.message).toContain("the entry is claimed and held by no claim")
        expect(Option.getOrThrow(yield* queue.get(entry.id)).status).toBe("claimed")
        expect((yield* queue.auditLog()).length).toBe(audit)
      }))

    it.effect("automatic recovery on claim: a crashed agent's entry comes back to the next claimer", () => {
      const logs = captureLogs()
      return Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const entry = yield* queue.enqueue("ws", { beadId: "bd-7", priority: 1 })
        const first = Option.getOrThrow(yield* queue.nextWithLock("crashed"))
        // It crashes mid-rebase: entries stuck in any in-progress status come back, not only claimed ones.
        yield* queue.transition(first, "rebasing")
        expect(yield* queue.nextWithLock("agent-b")).toEqual(Option.none())
        yield* TestClock.adjust(TIMEOUT + 1)
        expect(yield* queue.isLockStale).toBe(true)
        const taken = Option.getOrThrow(yield* queue.nextWithLock("agent-b"))
        expect(taken).toMatchObject({ id: entry.id, status: "claimed", workspace: "ws", priority: 1, attemptCount: 2 })
        expect(taken.beadId).toEqual(Option.some("bd-7"))
        expect(Option.getOrThrow(taken.fencingToken)).toBeGreaterThan(Option.getOrThrow(first.fencingToken))
        const actions = (yield* queue.auditLog()).map((row) => row.action)
        expect(actions).toContain("lock_expired")
        expect(actions).toContain("entry_reclaimed")
        // The tail: the newest rows, still in the order they happened.
        const all = yield* queue.auditLog()
        expect((yield* queue.auditLog({ last: 3 })).map((row) => row.id)).toEqual(all.slice(-3).map((row) => row.id))
        expect((yield* queue.auditLog({ limit: 2 })).map((row) => row.id)).toEqual(all.slice(0, 2).map((row) => row.id))
        yield* checkInvariants(queue)
        // The healing is logged at warning level, saying who held what and for how long.
        const warnings = logs.lines.filter((line) => line.level === "WARN").map((line) => line.message)
        expect(warnings).toContainEqual(
          expect.stringMatching(
            /^Stale processing lock cleared: held by "crashed" \(fencing token \d+\) for 5m 1ms, expired 1ms ago$/
          )
        )
        expect(warnings).toContainEqual(
          expect.stringMatching(
            new RegExp(
              `^Entry ${entry.id} \\(ws\\) returned to pending: rebasing by "crashed" for 5m 1ms, no live lock carries it`
            )
          )
        )
      }).pipe(Effect.provide(logs.layer))
    })

    it.effect("recovery stats are exact: what getRecoveryStats counts is what recovery then does", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const ids = []
        for (let i = 0; i < 6; i++) ids.push((yield* queue.enqueue(`ws-${i}`)).id)
        yield* queue.acquireProcessingLock("crashed")
        // Entries left in every in-progress status, not only claimed (the seed's first hole).
        const statuses = ["claimed", "rebasing", "testing", "ready_to_merge", "merging"] as const
        for (const [i, status] of statuses.entries()) yield* leftBehind(sql, ids[i]!, status, "crashed", 1, 0)
        yield* TestClock.adjust(TIMEOUT + 1)
        const before = yield* queue.getRecoveryStats
        expect(before).toMatchObject({ locksCleaned: 1, entriesReclaimed: 5 })
        expect(yield* queue.getRecoveryStats).toMatchObject({ locksCleaned: 1, entriesReclaimed: 5 })
        const done = yield* queue.detectAndRecoverStale
        expect(done).toMatchObject({ locksCleaned: before.locksCleaned, entriesReclaimed: before.entriesReclaimed })
        expect(yield* queue.getRecoveryStats).toMatchObject({ locksCleaned: 0, entriesReclaimed: 0 })
        expect(yield* queue.detectAndRecoverStale).toMatchObject({ locksCleaned: 0, entriesReclaimed: 0 })
        expect((yield* queue.stats).byStatus.pending).toBe(6)
        yield* checkInvariants(queue)
      }))

    it.effect("concurrent automatic recovery: each stale entry is reclaimed exactly once and the counts add up", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const ids = []
        for (let i = 0; i < 12; i++) ids.push((yield* queue.enqueue(`ws-${i}`)).id)
        yield* queue.acquireProcessingLock("crashed")
        for (const id of ids) yield* leftBehind(sql, id, "testing", "crashed", 1, 0)
        yield* TestClock.adjust(TIMEOUT + 1)
        const results = yield* Effect.all(Array.from({ length: 8 }, () => queue.detectAndRecoverStale), {
          concurrency: "unbounded"
        })
        expect(results.reduce((sum, stats) => sum + stats.entriesReclaimed, 0)).toBe(12)
        expect(results.reduce((sum, stats) => sum + stats.locksCleaned, 0)).toBe(1)
        const reclaimed = (yield* queue.auditLog()).filter((row) => row.action === "entry_reclaimed")
        expect(reclaimed.map((row) => Option.getOrThrow(row.entryId)).sort((a, b) => a - b)).toEqual(ids)
        const claims = yield* Effect.all(
          Array.from({ length: 8 }, (_, i) => queue.nextWithLock(`agent-${i}`)),
          { concurrency: "unbounded" }
        )
        expect(claims.filter(Option.isSome)).toHaveLength(1)
      }))

    it.effect("a stale processing lock allows new claims; an active one is never stolen", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        expect(Option.isSome(yield* queue.acquireProcessingLock("agent-a"))).toBe(true)
        expect(yield* queue.acquireProcessingLock("agent-b")).toEqual(Option.none())
        yield* TestClock.adjust(TIMEOUT)
        // It expires at expires_at, not before.
        expect(yield* queue.isLockStale).toBe(false)
        expect(yield* queue.acquireProcessingLock("agent-b")).toEqual(Option.none())
        yield* TestClock.adjust(1)
        expect(yield* queue.isLockStale).toBe(true)
        const before = Option.getOrThrow(yield* queue.getProcessingLock)
        expect(Option.getOrThrow(yield* queue.acquireProcessingLock("agent-b")).token).toBe(before.fencingToken + 1)
        const after = Option.getOrThrow(yield* queue.getProcessingLock)
        expect(after.agentId).toBe("agent-b")
        expect(after.fencingToken).toBeGreaterThan(before.fencingToken)
        yield* queue.enqueue("ws")
        expect(yield* queue.nextWithLock("agent-a")).toEqual(Option.none())
      }))

    it.effect("manual reclaimStale still works, by age, and never takes an entry carried by a live lock", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const old = yield* queue.enqueue("ws-old")
        const young = yield* queue.enqueue("ws-young")
        yield* leftBehind(sql, old.id, "rebasing", "gone", 99, 0)
        yield* TestClock.adjust("10 minutes")
        yield* leftBehind(sql, young.id, "claimed", "gone", 98, 600_000)
        expect(yield* queue.reclaimStale("5 minutes")).toBe(1)
        expect(Option.getOrThrow(yield* queue.get(old.id)).status).toBe("pending")
        expect(Option.getOrThrow(yield* queue.get(young.id)).status).toBe("claimed")
        yield* TestClock.adjust(1)
        expect(yield* queue.reclaimStale(0)).toBe(1)

        const live = Option.getOrThrow(yield* queue.nextWithLock("worker"))
        yield* TestClock.adjust("1 hour")
        expect(yield* queue.extendLock(live, "1 hour")).toBe(false)
        const worker = Option.getOrThrow(yield* queue.nextWithLock("worker"))
        expect(worker.id).toBe(live.id)
        yield* TestClock.adjust("2 minutes")
        expect(yield* queue.reclaimStale(0)).toBe(0)
        expect(Option.getOrThrow(yield* queue.get(worker.id)).status).toBe("claimed")
      }))

    it.effect("releasing an already released lock returns false, and so does a zombie's release", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        expect(yield* queue.releaseProcessingLock({ token: 0 })).toBe(false)
        const first = Option.getOrThrow(yield* queue.acquireProcessingLock("agent-a"))
        expect(yield* queue.releaseProcessingLock(first)).toBe(true)
        expect(yield* queue.releaseProcessingLock(first)).toBe(false)
        const second = Option.getOrThrow(yield* queue.acquireProcessingLock("agent-a"))
        yield* TestClock.adjust(TIMEOUT + 1)
        yield* queue.acquireProcessingLock("agent-b")
        expect(yield* queue.releaseProcessingLock(second)).toBe(false)
        expect(Option.getOrThrow(yield* queue.getProcessingLock).agentId).toBe("agent-b")
      }))

    it.effect("a live worker extending its lock for 3× the lock timeout keeps its entry; the zombie is refused", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const entry = yield* queue.enqueue("ws")
        const claim = Option.getOrThrow(yield* queue.nextWithLock("worker"))
        for (let i = 0; i < 6; i++) {
          yield* TestClock.adjust(TIMEOUT / 2)
          expect(yield* queue.extendLock(claim, TIMEOUT)).toBe(true)
          expect(yield* queue.nextWithLock("rival")).toEqual(Option.none())
          expect((yield* queue.getRecoveryStats).entriesReclaimed).toBe(0)
        }
        expect((yield* queue.transition(claim, "rebasing")).status).toBe("rebasing")

        // The worker stops extending: it becomes a zombie once a rival reclaims.
        yield* TestClock.adjust(TIMEOUT + 1)
        const rival = Option.getOrThrow(yield* queue.nextWithLock("rival"))
        expect(rival.id).toBe(entry.id)
        const refused = yield* Effect.flip(queue.transition(claim, "testing"))
        expect(refused).toMatchObject({ _tag: "LockLostError", token: claim.token })
        expect(refused.message).toContain(`fencing token ${claim.token} is stale`)
        expect(yield* queue.extendLock(claim, TIMEOUT)).toBe(false)
        expect(Option.getOrThrow(yield* queue.get(entry.id))).toMatchObject({ status: "claimed" })
        expect(Option.getOrThrow(yield* queue.get(entry.id)).agentId).toEqual(Option.some("rival"))
      }))

    it.effect("a worker whose own lock expired unclaimed is refused too (fencing checks expiry)", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        yield* queue.enqueue("ws")
        const claim = Option.getOrThrow(yield* queue.nextWithLock("worker"))
        yield* TestClock.adjust(TIMEOUT + 1)
        const refused = yield* Effect.flip(queue.transition(claim, "rebasing"))
        expect(refused.message).toContain("expired")
      }))

    it.effect("a zombie with the same agent id is fenced by its token: an old incarnation cannot move or extend", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const entry = yield* queue.enqueue("ws")
        // "merger" claims, starts rebasing, and hangs; its pod is restarted under the same name.
        const old = Option.getOrThrow(yield* queue.nextWithLock("merger"))
        yield* queue.transition(old, "rebasing")
        yield* TestClock.adjust(TIMEOUT + 1)
        const reborn = Option.getOrThrow(yield* queue.nextWithLock("merger"))
        expect(reborn.id).toBe(entry.id)
        expect(reborn.token).toBeGreaterThan(old.token)
        yield* queue.transition(reborn, "rebasing")
        // The old incarnation wakes up: same agent id, old token. Refused, and nothing changes.
        const moved = yield* Effect.flip(queue.transition(old, "testing"))
        expect(moved).toMatchObject({ _tag: "LockLostError", token: old.token })
        expect(yield* queue.extendLock(old, TIMEOUT)).toBe(false)
        expect(yield* queue.releaseProcessingLock(old)).toBe(false)
        const now = Option.getOrThrow(yield* queue.get(entry.id))
        expect([now.status, Option.getOrThrow(now.fencingToken)]).toEqual(["rebasing", reborn.token])
        expect(Option.getOrThrow(yield* queue.getProcessingLock).fencingToken).toBe(reborn.token)
        // The new incarnation goes on.
        expect((yield* queue.transition(reborn, "testing")).status).toBe("testing")
      }))

    it.scoped("a heartbeat drives extendLock through LeaseExtender: working keeps the lock, stalling loses it", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        const entry = yield* queue.enqueue("ws")
        const claimed = Option.getOrThrow(yield* queue.nextWithLock("worker"))
        const heartbeat = yield* Heartbeat.make
        const extender = yield* LeaseExtender.make({ interval: "1 minute", extension: "5 minutes" })
        yield* extender.attach(queue.extendable(claimed), heartbeat)
        for (let minute = 0; minute < 15; minute++) {
          yield* TestClock.adjust("1 minute")
          yield* heartbeat.beat
          yield* Effect.yieldNow()
        }
        // 15 minutes of work (3× the lock timeout): still the worker's.
        yield* Effect.sleep("10 millis").pipe(Effect.fork, Effect.zipRight(TestClock.adjust("10 millis")))
        expect(yield* queue.nextWithLock("rival")).toEqual(Option.none())
        expect((yield* queue.transition(claimed, "rebasing")).status).toBe("rebasing")
        // No more beats: the lock runs out and a rival gets the entry.
        yield* TestClock.adjust("6 minutes")
        expect(Option.getOrThrow(yield* queue.nextWithLock("rival")).id).toBe(entry.id)
      }))

    it.effect("fault injection: a failing recovery does not stop claims; the next one heals", () => {
      const logs = captureLogs()
      return Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const stuck = yield* queue.enqueue("ws-1")
        const other = yield* queue.enqueue("ws-2")
        const crashed = Option.getOrThrow(yield* queue.nextWithLock("crashed"))
        expect(crashed.id).toBe(stuck.id)
        yield* TestClock.adjust(TIMEOUT + 1)
        // Returning an entry to pending fails inside the database: recovery rolls back.
        const removeFault = yield* faultOn(sql, "pending")
        const failures = (yield* Metric.value(MergeQueue.recoveryFailures)).count
        expect(Either.isLeft(yield* Effect.either(queue.detectAndRecoverStale))).toBe(true)
        // The claim goes on: it takes the expired lock over and claims what is pending.
        const claimed = Option.getOrThrow(yield* queue.nextWithLock("agent-b"))
        expect(claimed.id).toBe(other.id)
        expect(claimed.token).toBeGreaterThan(crashed.token)
        expect((yield* Metric.value(MergeQueue.recoveryFailures)).count).toBe(failures + 1)
        expect(logs.lines.map((line) => line.message)).toContainEqual(
          expect.stringContaining("Automatic merge queue recovery failed; claiming anyway")
        )
        const takeover = (yield* queue.auditLog()).filter((row) => row.action === "lock_expired")
        expect(takeover.map((row) => Option.getOrThrow(row.detail))).toEqual([
          expect.stringMatching(/^expired at \d+; taken over by agent-b$/)
        ])
        expect(Option.getOrThrow(yield* queue.get(stuck.id)).status).toBe("claimed")
        // Without the fault, agent-b's next claim heals the stuck entry and gives agent-b its own entry back.
        yield* removeFault
        expect(Option.getOrThrow(yield* queue.nextWithLock("agent-b")).id).toBe(other.id)
        expect(Option.getOrThrow(yield* queue.get(stuck.id)).status).toBe("pending")
        yield* checkInvariants(queue)
      }).pipe(Effect.provide(logs.layer))
    })

    it.effect("fault injection: a failure mid-claim leaves nothing half-written", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const queue = yield* queueOn(sql)
        const entry = yield* queue.enqueue("ws")
        const auditBefore = (yield* queue.auditLog()).length
        // Claiming the entry fails inside the database, after the lock was taken and audited.
        const removeFault = yield* faultOn(sql, "claimed")
        const failure = yield* Effect.flip(queue.nextWithLock("agent-a"))
        expect(failure._tag).toBe("MergeQueueStoreError")
        expect(String((failure as MergeQueue.MergeQueueStoreError & { cause: SqlError }).cause.cause)).toContain(
          "injected fault"
        )
        // All of it rolled back.
        expect(yield* queue.getProcessingLock).toEqual(Option.none())
        expect(Option.getOrThrow(yield* queue.get(entry.id)).status).toBe("pending")
        expect((yield* queue.auditLog()).length).toBe(auditBefore)
        yield* removeFault
        const claimed = Option.getOrThrow(yield* queue.nextWithLock("agent-a"))
        expect(Option.getOrThrow(claimed.fencingToken)).toBe(1)
      }))

    it.effect("a claim that meets a busy database is retried with backoff, then succeeds", () =>
      Effect.gen(function*() {
        const failures = yield* Ref.make(0)
        const busy = failing(backend.client(), claimMarker(backend.client()), failures, "database is locked")
        const queue = yield* queueOn(busy)
        yield* queue.enqueue("ws")
        yield* Ref.set(failures, 2)
        const claim = yield* Effect.fork(queue.nextWithLock("agent-a"))
        // The statements run on real I/O; the backoff sleeps run on the test clock.
        const live = (millis: number) => TestServices.provideLive(Effect.sleep(millis))
        while ((yield* Ref.get(failures)) === 2) yield* live(5)
        yield* live(20)
        expect(yield* Ref.get(failures)).toBe(1) // the first retry waits 50 ms of test time
        let claimed = yield* Fiber.poll(claim)
        while (Option.isNone(claimed)) {
          yield* TestClock.adjust("50 millis")
          yield* live(10)
          claimed = yield* Fiber.poll(claim)
        }
        const exit = claimed.value
        expect(Exit.isSuccess(exit)).toBe(true)
        const got = Option.getOrThrow(yield* exit)
        expect(got.status).toBe("claimed")
        expect(yield* Ref.get(failures)).toBe(0)
        // Not retryable: the error surfaces at once, and nothing was written.
        yield* queue.releaseProcessingLock(got)
        const armed = yield* Ref.make(0)
        const always = yield* queueOn(failing(backend.client(), claimMarker(backend.client()), armed))
        yield* Ref.set(armed, 99)
        expect((yield* Effect.flip(always.nextWithLock("agent-b")))._tag).toBe("MergeQueueStoreError")
        expect(yield* always.getProcessingLock).toEqual(Option.none())
      }))

    it.effect("a database made before the coordination functions is upgraded on open, its work carrying on", () =>
      Effect.gen(function*() {
        const sql = backend.client()
        const before = yield* queueOn(sql)
        const first = yield* before.enqueue("ws-1")
        const second = yield* before.enqueue("ws-2")
        const claim = Option.getOrThrow(yield* before.nextWithLock("old-agent"))
        const auditBefore = yield* before.auditLog()
        // Back to what the earlier version left: its one migration, no functions (PostgreSQL), and on SQLite
        // the audit table as migration 1 made it (AUTOINCREMENT, every row in the entry index), rows kept.
        if (sql.onDialectOrElse({ pg: () => true, orElse: () => false })) {
          for (const name of ["claim", "take_lock", "transition", "release", "extend"]) {
            yield* sql.unsafe(`DROP FUNCTION ${prefix}merge_queue_${name}`)
          }
        } else {
          const audit = `${prefix}merge_queue_audit`
          yield* sql.unsafe(`ALTER TABLE ${audit} RENAME TO ${audit}_old`)
          yield* sql.unsafe(`DROP INDEX ${audit}_entry`)
          yield* sql.unsafe(`CREATE TABLE ${audit} (id INTEGER PRIMARY KEY AUTOINCREMENT, at BIGINT NOT NULL,
            action TEXT NOT NULL, agent_id TEXT, entry_id BIGINT, fencing_token BIGINT, from_status TEXT,
            to_status TEXT, detail TEXT)`)
          yield* sql.unsafe(`CREATE INDEX ${audit}_entry ON ${audit} (entry_id, id)`)
          yield* sql.unsafe(`INSERT INTO ${audit} SELECT * FROM ${audit}_old`)
          yield* sql.unsafe(`DROP TABLE ${audit}_old`)
        }
        yield* sql`DELETE FROM ${sql(`${prefix}merge_queue_migrations`)} WHERE migration_id > 1`
        // A worker that runs no migration (`create: false`) refuses it, naming the versions and the command.
        const refused = yield* Effect.flip(queueOn(sql, { create: false }))
        expect(refused).toMatchObject({ _tag: "SchemaVersionError", current: 1, required: 3 })
        expect(refused.message).toContain("leasehold migrate")
        // An operator's look (the CLI's, the console's) writes nothing, and its reads and recovery work on it as
        // it is.
        const look = yield* lookAt({ prefix }).pipe(Effect.provideService(SqlClient.SqlClient, sql))
        expect(yield* look.getRecoveryStats).toMatchObject({ locksCleaned: 0, entriesReclaimed: 0 })
        expect(yield* look.detectAndRecoverStale).toMatchObject({ locksCleaned: 0, entriesReclaimed: 0 })
        expect((yield* look.stats).byStatus).toMatchObject({ claimed: 1, pending: 1 })
        // A worker's open migrates it; the claim made before goes on under its lock.
        const after = yield* queueOn(sql)
        const migrations = yield* sql<{ id: number | string }>`SELECT max(migration_id) AS id
          FROM ${sql(`${prefix}merge_queue_migrations`)}`
        expect(Number(migrations[0]!.id)).toBe(3)
        // The audit log is as it was, and goes on from where it was (SQLite: its table was rebuilt).
        expect(yield* after.auditLog()).toEqual(auditBefore)
        expect(claim.id).toBe(first.id)
        expect((yield* after.transition(claim, "rebasing")).status).toBe("rebasing")
        expect(yield* after.extendLock(claim, "1 minute")).toBe(true)
        expect(yield* after.nextWithLock("new-agent")).toEqual(Option.none())
        expect(yield* after.releaseProcessingLock(claim)).toBe(true)
        const next = Option.getOrThrow(yield* after.nextWithLock("new-agent"))
        // The released entry is still "rebasing" under the old token: recovery returns it, then the queue order.
        expect(next.id).toBe(first.id)
        expect(next.token).toBeGreaterThan(claim.token)
        expect(Option.getOrThrow(yield* after.get(second.id)).status).toBe("pending")
        const auditAfter = yield* after.auditLog()
        expect(auditAfter.slice(0, auditBefore.length)).toEqual(auditBefore)
        expect(auditAfter.map((row) => row.id)).toEqual(
          auditAfter.map((_, i) => auditBefore[0]!.id + i)
        )
        expect(auditAfter.slice(auditBefore.length).map((row) => row.action)).toEqual([
          "transition",
          "lock_extended",
          "lock_released",
          "entry_reclaimed",
          "lock_acquired",
          "claimed"
        ])
        yield* checkInvariants(after)
      }))

    it.effect("bad input gets a typed error naming what was wrong", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        expect(yield* Effect.flip(queue.enqueue(""))).toMatchObject({ parameter: "workspace" })
        expect(yield* Effect.flip(queue.enqueue("ws", { priority: 1.5 }))).toMatchObject({ parameter: "priority" })
        expect(yield* Effect.flip(queue.nextWithLock(" "))).toMatchObject({ parameter: "agentId" })
        expect(yield* Effect.flip(queue.extendLock({ token: 1 }, 0))).toMatchObject({ parameter: "extra" })
        expect(yield* Effect.flip(queue.extendLock({ token: 1.5 }, "1 second"))).toMatchObject({ parameter: "token" })
        expect(yield* Effect.flip(queue.reclaimStale("-1 seconds"))).toMatchObject({ parameter: "threshold" })
        const first = yield* queue.enqueue("ws")
        const duplicate = yield* Effect.flip(queue.enqueue("ws"))
        expect(duplicate).toMatchObject({ _tag: "AlreadyQueuedError", entryId: first.id })
        expect(yield* queue.get(12_345)).toEqual(Option.none())
        // Bad configuration is a ParseError naming the option (operations' arguments, above, are not).
        const badTimeout = yield* Effect.flip(queueOn(backend.client(), { lockTimeout: "0 seconds" }))
        expect(refusedOptions(badTimeout)).toEqual(["lockTimeout"])
        expect(badTimeout.message).toContain("must be greater than zero")
        for (const prefix of ["x; DROP", "Queue_", "q".repeat(38)]) {
          const badPrefix = yield* Effect.flip(queueOn(backend.client(), { prefix }))
          expect(refusedOptions(badPrefix)).toEqual(["prefix"])
        }
        const several = yield* Effect.flip(queueOn(backend.client(), { maxAttempts: 0, maxBackoff: -1 }))
        expect(refusedOptions(several)).toEqual(["maxAttempts", "maxBackoff"])
        expect(several.message).toContain("MergeQueue.make options")
      }))

    it.effect("workspaces, bead and agent ids keep the name rule; stored error text is made storable", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        for (const bad of ["a\u0000b", "\ud800", "\udc00", "x".repeat(201), "tab\t"]) {
          expect(yield* Effect.flip(queue.enqueue(bad))).toMatchObject({ parameter: "workspace" })
          expect(yield* Effect.flip(queue.enqueue("ws", { beadId: bad }))).toMatchObject({ parameter: "beadId" })
          expect(yield* Effect.flip(queue.nextWithLock(bad))).toMatchObject({ parameter: "agentId" })
          expect(yield* Effect.flip(queue.acquireProcessingLock(bad))).toMatchObject({ parameter: "agentId" })
        }
        expect((yield* queue.stats).total).toBe(0)
        // Two workspaces a lone surrogate would merge on PostgreSQL stay two (the surrogate is refused above).
        yield* queue.enqueue("\ufffd")
        yield* queue.enqueue("\ud83d\ude00")
        expect((yield* queue.list()).map((entry) => entry.workspace)).toEqual(["\ufffd", "\ud83d\ude00"])
        const claim = Option.getOrThrow(yield* queue.nextWithLock("agent"))
        const failed = yield* queue.transition(claim, "failed_retryable", {
          error: "bad \u0000 and \ud800 " + "x".repeat(70_000)
        })
        expect(failed.lastError.pipe(Option.map((error) => error.slice(0, 12)))).toEqual(
          Option.some("bad \ufffd and \ufffd ")
        )
        expect(Option.getOrThrow(failed.lastError).length).toBe(64 * 1024)
      }))

    it.effect("listings take a limit of 1..100000, and a lock extension or a stale threshold has a finite bound", () =>
      Effect.gen(function*() {
        const queue = yield* queueOn(backend.client())
        for (const limit of [0, -1, 1.5, Number.NaN, 100_001]) {
          expect(yield* Effect.flip(queue.list({ limit }))).toMatchObject({ parameter: "limit" })
          expect(yield* Effect.flip(queue.auditLog({ limit }))).toMatchObject({ parameter: "limit" })
          expect(yield* Effect.flip(queue.auditLog({ last: limit }))).toMatchObject({ parameter: "last" })
        }
        yield* queue.enqueue("ws")
        const claim = Option.getOrThrow(yield* queue.nextWithLock("agent"))
        for (const extra of [Number.POSITIVE_INFINITY, 1e300, "25 hours"] as const) {
          expect(yield* Effect.flip(queue.extendLock(claim, extra))).toMatchObject({ parameter: "extra" })
        }
        expect(yield* Effect.flip(queue.reclaimStale(Number.POSITIVE_INFINITY))).toMatchObject({
          parameter: "threshold"
        })
        // The lock is still readable (an infinite expiry made every read of it die).
        expect(yield* queue.extendLock(claim, "24 hours")).toBe(true)
        expect(Option.isSome(yield* queue.getProcessingLock)).toBe(true)
        expect((yield* queue.list({ limit: 1 })).length).toBe(1)
      }))

    it.effect("refuses options that cannot work: an infinite lock, NaN in any form, backoff capped below its start", () =>
      Effect.gen(function*() {
        const refused = (options: MergeQueue.Options) =>
          Effect.map(Effect.flip(queueOn(backend.client(), options)), (error) => ({
            fields: refusedOptions(error),
            message: error.message
          }))
        // A lock that never expires is one a crashed agent holds for ever: recovery could never heal it.
        for (const forever of [Infinity, Duration.infinity, "25 hours", 1e300] as const) {
          expect((yield* refused({ lockTimeout: forever })).fields).toEqual(["lockTimeout"])
        }
        // Shorter than the millisecond the database counts in: the lock would be stale as it is taken.
        expect((yield* refused({ lockTimeout: "0.5 millis" })).fields).toEqual(["lockTimeout"])
        for (const nan of [NaN, [NaN, 0], [0, NaN]] as const) {
          expect((yield* refused({ lockTimeout: nan, initialBackoff: nan, maxBackoff: nan })).fields).toEqual([
            "lockTimeout",
            "initialBackoff",
            "maxBackoff"
          ])
        }
        expect((yield* refused({ initialBackoff: Infinity, maxBackoff: "2 minutes" })).fields).toEqual([
          "initialBackoff",
          "maxBackoff"
        ])
        // The cap below the first delay: the doubling would never happen.
        const inverted = yield* refused({ initialBackoff: "1 second", maxBackoff: "100 millis" })
        expect(inverted.fields).toEqual(["maxBackoff"])
        expect(inverted.message).toContain("at least initialBackoff")
        expect((yield* refused({ initialBackoff: "3 seconds" })).fields).toEqual(["maxBackoff"]) // the default 2 s
        // The bounds themselves are fine.
        const edge = yield* queueOn(backend.client(), {
          lockTimeout: "24 hours",
          initialBackoff: "1 minute",
          maxBackoff: "1 minute"
        })
        expect(yield* edge.stats).toMatchObject({ total: 0 })
        yield* queueOn(backend.client(), { lockTimeout: 1, initialBackoff: 0, maxBackoff: 0 })
      }))
  })
}

describe("MergeQueue on PostgreSQL judges the lock by the database's clock", () => {
  it.live("an agent 10 minutes behind cannot lose its live lock to one on time, nor one ahead steal it", () =>
    Effect.gen(function*() {
      const open = (skew: number) => queueOn(pg).pipe(Effect.withClock(skewedClock(skew)))
      const behind = yield* open(-10 * 60_000)
      const onTime = yield* open(0)
      const ahead = yield* open(10 * 60_000)
      const entry = yield* behind.enqueue("ws")
      // Claimed by the agent whose clock is 10 minutes behind: by its own clock the lock expires in 5 minutes,
      // by the others' it expired 5 minutes ago. By the database's, it is live.
      const claim = Option.getOrThrow(yield* behind.nextWithLock("slow-clock"))
      expect(claim.id).toBe(entry.id)
      expect(yield* onTime.nextWithLock("rival")).toEqual(Option.none())
      expect(yield* ahead.nextWithLock("rival-ahead")).toEqual(Option.none())
      expect(yield* ahead.isLockStale).toBe(false)
      expect((yield* ahead.getRecoveryStats).entriesReclaimed).toBe(0)
      expect((yield* behind.transition(claim, "rebasing")).status).toBe("rebasing")
      expect(yield* behind.releaseProcessingLock(claim)).toBe(true)
    }))
})

describe("MergeQueue layers", () => {
  it.live("an unreadable SQLite path and an unreachable PostgreSQL fail with MergeQueueStoreError", () =>
    Effect.gen(function*() {
      const sqliteError = yield* Effect.flip(
        Layer.build(MergeQueue.layerSqlite({ filename: join(directory, "missing", "dir", "q.db") })).pipe(Effect.scoped)
      )
      expect(sqliteError).toMatchObject({ _tag: "MergeQueueStoreError" })
      expect(sqliteError.message).toContain("missing")
      const pgError = yield* Effect.flip(
        Layer.build(MergeQueue.layerPg({ url: "postgres://postgres@127.0.0.1:1/none" })).pipe(Effect.scoped)
      )
      expect(pgError).toMatchObject({ _tag: "MergeQueueStoreError" })
    }))
})
