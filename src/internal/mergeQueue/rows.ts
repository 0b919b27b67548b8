/**
 * The merge queue's rows as the drivers return them (numbers may come back as strings: PostgreSQL's
 * BIGINT), and their decoding into the public models.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as DateTime from "effect/DateTime"
import * as Option from "effect/Option"
import type { AuditAction, AuditRecord, Claim, ProcessingLock, QueueEntry, Status } from "./model.js"

export type Numeric = number | string

export interface EntryRow {
  readonly id: Numeric
  readonly workspace: string
  readonly bead_id: string | null
  readonly priority: Numeric
  readonly status: string
  readonly agent_id: string | null
  readonly fencing_token: Numeric | null
  readonly started_at: Numeric | null
  readonly state_changed_at: Numeric
  readonly created_at: Numeric
  readonly attempt_count: Numeric
  readonly last_error: string | null
}

export interface LockRow {
  readonly agent_id: string | null
  readonly acquired_at: Numeric | null
  readonly expires_at: Numeric | null
  readonly fencing_token: Numeric
}

export interface AuditRow {
  readonly id: Numeric
  readonly at: Numeric
  readonly action: string
  readonly agent_id: string | null
  readonly entry_id: Numeric | null
  readonly fencing_token: Numeric | null
  readonly from_status: string | null
  readonly to_status: string | null
  readonly detail: string | null
}

/** An audit row to insert (its id and absent fields are the database's). */
export interface AuditInsert {
  readonly at: number
  readonly action: AuditAction
  readonly agent_id?: string | null
  readonly entry_id?: number | null
  readonly fencing_token?: number | null
  readonly from_status?: Status | null
  readonly to_status?: Status | null
  readonly detail?: string | null
}

export const millis = (value: Numeric) => DateTime.unsafeMake(Number(value))

export const optionalNumber = (value: Numeric | null | undefined): Option.Option<number> =>
  value === null || value === undefined ? Option.none() : Option.some(Number(value))

export const toEntry = (row: EntryRow): QueueEntry => ({
  id: Number(row.id),
  workspace: row.workspace,
  beadId: Option.fromNullable(row.bead_id),
  priority: Number(row.priority),
  status: row.status as Status,
  agentId: Option.fromNullable(row.agent_id),
  fencingToken: optionalNumber(row.fencing_token),
  startedAt: row.started_at === null ? Option.none() : Option.some(millis(row.started_at)),
  stateChangedAt: millis(row.state_changed_at),
  createdAt: millis(row.created_at),
  attemptCount: Number(row.attempt_count),
  lastError: Option.fromNullable(row.last_error)
})

export const toClaim = (row: EntryRow, token: number): Claim => ({ ...toEntry(row), token })

export const toLock = (row: LockRow | undefined): Option.Option<ProcessingLock> =>
  row === undefined || row.agent_id === null
    ? Option.none()
    : Option.some({
      agentId: row.agent_id,
      acquiredAt: millis(row.acquired_at!),
      expiresAt: millis(row.expires_at!),
      fencingToken: Number(row.fencing_token)
    })

export const toAudit = (row: AuditRow): AuditRecord => ({
  id: Number(row.id),
  at: millis(row.at),
  action: row.action as AuditAction,
  agentId: Option.fromNullable(row.agent_id),
  entryId: optionalNumber(row.entry_id),
  fencingToken: optionalNumber(row.fencing_token),
  fromStatus: Option.fromNullable(row.from_status as Status | null),
  toStatus: Option.fromNullable(row.to_status as Status | null),
  detail: Option.fromNullable(row.detail)
})

/** A lock that is held and has not passed its expiry (it expires at `expires_at`, not before). */
export const isLive = (lock: LockRow, now: number) =>
  lock.agent_id !== null && lock.expires_at !== null && Number(lock.expires_at) >= now

/** Busy databases, serialisation failures, deadlocks and unique conflicts are worth another try. */
export const retryable = (error: SqlError): boolean => {
  const cause = error.cause as { readonly code?: unknown; readonly message?: unknown } | undefined
  const code = String(cause?.code ?? "")
  const text = `${String(cause?.message ?? "")} ${error.message}`
  return ["40001", "40P01", "23505", "55P03", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CONSTRAINT_UNIQUE"].includes(
    code
  ) ||
    /database is locked|database table is locked|UNIQUE constraint|could not serialize|deadlock/i.test(text)
}
