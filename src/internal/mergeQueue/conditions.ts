/**
 * The merge queue's rules as SQL expressions, written once for both dialects: whether the lock is live,
 * what recovery reclaims, whether a transition may happen (and why not), and what a transition writes.
 * PostgreSQL's PL/pgSQL functions (`schema.ts`) and SQLite's statements (`statements.ts`) splice in the
 * same text, so the two backends cannot drift apart.
 *
 * They refer to the lock row as `v_lock` and to the entry as `v_entry`: record variables in a function
 * body, table aliases in a SQLite statement. Their inputs are fragments: in a function body the
 * function's parameters spliced in as text (a body cannot take bound parameters), in a SQLite statement
 * bound values.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type * as Statement from "@effect/sql/Statement"

type Fragment = Statement.Fragment

/** `column IN (…)` over bound values; false for an empty list (`IN ()` is not PostgreSQL). */
export const statusIn = (sql: SqlClient.SqlClient, column: string, values: ReadonlyArray<string>): Fragment =>
  values.length === 0 ? sql.literal("1 = 0") : sql`${sql.literal(column)} IN ${sql.in(values)}`

/** The lock is held and has not passed its expiry at `now` (it expires at `expires_at`, not before). */
export const live = (sql: SqlClient.SqlClient, now: Fragment): Fragment =>
  sql`(v_lock.agent_id IS NOT NULL AND v_lock.expires_at IS NOT NULL AND v_lock.expires_at >= ${now})`

/**
 * An in-progress entry (of the `entries` table in scope, columns unqualified) that no live lock carries and
 * that started before `cutoff`: what recovery returns to pending.
 */
export const staleEntry = (sql: SqlClient.SqlClient, inputs: {
  /** `status` is in progress: `status IN (…)` or `status = ANY(p_in_progress)`. */
  readonly inProgress: Fragment
  /** The live lock's token, or -1 when no lock is live. */
  readonly liveToken: Fragment
  readonly cutoff: Fragment
}): Fragment =>
  sql`${inputs.inProgress} AND (fencing_token IS NULL OR fencing_token <> ${inputs.liveToken})
    AND COALESCE(started_at, state_changed_at) < ${inputs.cutoff}`

/**
 * Whether `detectAndRecoverStale` would heal something now: the lock expired, or an in-progress entry is not
 * carried by the live lock. A claim that finds so recovers first.
 */
export const needsRecovery = (sql: SqlClient.SqlClient, entries: Statement.Identifier, inputs: {
  readonly now: Fragment
  readonly inProgress: Fragment
}): Fragment =>
  sql`((v_lock.agent_id IS NOT NULL AND NOT ${live(sql, inputs.now)}) OR EXISTS (SELECT 1 FROM ${entries} WHERE ${
    staleEntry(sql, {
      inProgress: inputs.inProgress,
      liveToken: sql`CASE WHEN ${live(sql, inputs.now)} THEN v_lock.fencing_token ELSE -1 END`,
      cutoff: sql`${inputs.now} + 1`
    })
  }))`

/** What a transition's statement is told; the rest it reads from `v_entry` and `v_lock`. */
export interface MoveInputs {
  readonly now: Fragment
  /** The claim's token, NULL for an entry id alone. */
  readonly token: Fragment
  /** The target status. */
  readonly to: Fragment
  /** The target needs the claim (it is in progress, or `merged`). */
  readonly needsClaim: Fragment
  /** The entry's status is in progress (so leaving it needs the claim too). */
  readonly fromInProgress: Fragment
  /** The entry's status may move to the target. */
  readonly fromAllowed: Fragment
  /** The target is in progress: the entry keeps its agent and token. */
  readonly staysActive: Fragment
  /** The error to record as the entry's last, NULL for none. */
  readonly error: Fragment
}

/**
 * Why a transition may not happen, or `'ok'`. Ownership is checked by token, not by agent id: an old
 * incarnation of the same agent holds an old token. The order is the order of the refusals' precedence.
 */
export const verdict = (sql: SqlClient.SqlClient, inputs: MoveInputs): Fragment => {
  const owned = sql`(${inputs.needsClaim} OR ${inputs.fromInProgress})`
  return sql`CASE
    WHEN v_entry.id IS NULL THEN 'not_found'
    WHEN ${owned} AND ${inputs.token} IS NULL THEN 'no_claim'
    WHEN ${owned} AND v_entry.fencing_token IS NULL THEN 'unheld'
    WHEN ${owned} AND v_entry.fencing_token <> ${inputs.token} THEN 'stale_token'
    WHEN ${owned} AND (v_lock.agent_id IS NULL OR v_lock.fencing_token <> ${inputs.token}) THEN 'lock_lost'
    WHEN ${owned} AND NOT ${live(sql, inputs.now)} THEN 'lock_expired'
    WHEN ${inputs.fromAllowed} THEN 'ok'
    ELSE 'invalid' END`
}

/**
 * The `SET` list of a transition's `UPDATE` of the entry (columns unqualified): an entry leaving the
 * in-progress statuses drops its agent and token, one going back to pending its start.
 */
export const moveSet = (sql: SqlClient.SqlClient, inputs: MoveInputs): Fragment =>
  sql`status = ${inputs.to}, state_changed_at = ${inputs.now},
    agent_id = CASE WHEN ${inputs.staysActive} THEN agent_id END,
    fencing_token = CASE WHEN ${inputs.staysActive} THEN fencing_token END,
    started_at = CASE WHEN ${inputs.to} = 'pending' THEN NULL ELSE started_at END,
    last_error = COALESCE(${inputs.error}, last_error)`
