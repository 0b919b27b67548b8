/**
 * Self-healing: clearing an expired lock and returning in-progress entries that no live lock carries to
 * pending, with the audit rows, the counters and the warnings that say what was healed. Plain statements
 * in one write transaction on both dialects — rare work (after a crash), and what an operator's
 * `leasehold queue recover` runs on a database whatever version made it.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Metric from "effect/Metric"
import { staleEntry, statusIn } from "./conditions.js"
import * as Metrics from "./metrics.js"
import type { RecoveryStats, Status } from "./model.js"
import { type AuditInsert, type EntryRow, isLive, type LockRow } from "./rows.js"
import type { Db } from "./schema.js"
import { insertAudit, readLock } from "./statements.js"
import * as Statuses from "./statuses.js"

/** What a recovery healed (or, dry, would heal): for the counters and the log once it has committed. */
export interface Healed {
  readonly stats: RecoveryStats
  readonly now: number
  /** The expired lock it cleared, as it was. */
  readonly lock: LockRow | undefined
  /** The entries it returned to pending, as they were. */
  readonly entries: ReadonlyArray<EntryRow>
}

/**
 * Clears an expired lock and returns uncarried in-progress entries that started before `cutoff(now)` to
 * pending, in a write transaction that holds the lock row. `dryRun`: reads only, outside a transaction.
 */
export const recover = (
  db: Db,
  cutoff: (now: number) => number,
  dryRun: boolean
): Effect.Effect<Healed, SqlError> => {
  const { entries, lock, sql } = db
  const run = Effect.gen(function*() {
    const { lock: row, now } = yield* readLock(db, !dryRun)
    const liveLock = isLive(row, now)
    const expired = row.agent_id !== null && !liveLock
    const stale = yield* sql<EntryRow>`SELECT * FROM ${entries} WHERE ${
      staleEntry(sql, {
        inProgress: statusIn(sql, "status", Statuses.inProgress),
        liveToken: sql`${liveLock ? Number(row.fencing_token) : -1}`,
        cutoff: sql`${cutoff(now)}`
      })
    } ORDER BY id`
    const healed: Healed = {
      stats: {
        locksCleaned: expired ? 1 : 0,
        entriesReclaimed: stale.length,
        recoveryTimestamp: DateTime.unsafeMake(now)
      },
      now,
      lock: expired ? row : undefined,
      entries: stale
    }
    if (dryRun || (!expired && stale.length === 0)) return healed
    const audit: Array<AuditInsert> = []
    if (expired) {
      yield* sql`UPDATE ${lock} SET agent_id = NULL, acquired_at = NULL, expires_at = NULL WHERE id = 1`
      audit.push({
        at: now,
        action: "lock_expired",
        agent_id: row.agent_id,
        fencing_token: Number(row.fencing_token),
        detail: `expired at ${row.expires_at}`
      })
    }
    if (stale.length > 0) {
      yield* sql`UPDATE ${entries} SET status = 'pending', agent_id = NULL, fencing_token = NULL, started_at = NULL,
        state_changed_at = ${now} WHERE id IN ${sql.in(stale.map((entry) => Number(entry.id)))}`
      for (const entry of stale) {
        audit.push({
          at: now,
          action: "entry_reclaimed",
          agent_id: entry.agent_id,
          entry_id: Number(entry.id),
          fencing_token: entry.fencing_token === null ? null : Number(entry.fencing_token),
          from_status: entry.status as Status,
          to_status: "pending"
        })
      }
    }
    yield* insertAudit(db, audit)
    return healed
  })
  return dryRun ? run : db.writeTransaction(run)
}

/** Counts and logs (at warning level: work was lost or delayed) what a committed recovery healed. */
export const report = (healed: Healed): Effect.Effect<void> =>
  Effect.gen(function*() {
    const { entries, lock, now, stats } = healed
    yield* Metric.incrementBy(Metrics.locksCleaned, stats.locksCleaned)
    yield* Metric.incrementBy(Metrics.entriesReclaimed, stats.entriesReclaimed)
    const ago = (at: number | string | null) =>
      at === null ? "an unknown time" : Duration.format(Duration.millis(Math.max(0, now - Number(at))))
    if (lock !== undefined) {
      yield* Effect.logWarning(
        `Stale processing lock cleared: held by "${lock.agent_id}" (fencing token ${lock.fencing_token}) for ` +
          `${ago(lock.acquired_at)}, expired ${ago(lock.expires_at)} ago`
      )
    }
    for (const row of entries) {
      yield* Effect.logWarning(
        `Entry ${row.id} (${row.workspace}) returned to pending: ${row.status} by ` +
          `${row.agent_id === null ? "no agent" : `"${row.agent_id}"`} for ` +
          `${ago(row.started_at ?? row.state_changed_at)}, no live lock carries it`
      )
    }
  }).pipe(Effect.annotateLogs({ module: "MergeQueue" }))
