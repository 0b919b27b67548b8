/**
 * The merge queue's coordination calls — claim, take the lock, release it, extend it, move an entry —
 * one `Statements` interface, one set per dialect, each call one round trip or one short transaction:
 *
 * - PostgreSQL: one call of a PL/pgSQL function (`schema.ts`) each.
 * - SQLite: one `BEGIN IMMEDIATE` transaction each, on a connection held for the call (`sqliteConnection.ts`),
 *   of two or three statements compiled once (`compiled.ts`): conditional writes with `RETURNING` instead of a
 *   read then a write (a refused transition pays one read more, to say why). A claim first looks at the lock outside any transaction
 *   (an idle poller must not queue for the file's write lock behind the agent at work), and its write is
 *   guarded by what it saw: the lock's token and holder unchanged, and no other agent's lock live. When
 *   the guard fails it looks again.
 *
 * Both hold the lock row (PostgreSQL: `FOR UPDATE`; SQLite: the file's write lock) for every write, so
 * writers are serialised and the audit log's order is the order things happened in. The rules themselves
 * are `conditions.ts`, shared by both. Plus the plain statements both dialects run alike (reads, recovery's).
 */
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import { compile, type Compiled, type Slots } from "./compiled.js"
import { live, type MoveInputs, moveSet, needsRecovery, statusIn, verdict } from "./conditions.js"
import type { Status } from "./model.js"
import { type AuditInsert, type EntryRow, isLive, type LockRow, type Numeric } from "./rows.js"
import type { Db } from "./schema.js"
import { type Held, withConnection } from "./sqliteConnection.js"
import * as Statuses from "./statuses.js"

/** What a claim found. */
export type ClaimOutcome =
  /** Another agent holds the lock live. */
  | { readonly outcome: "busy" }
  /** Something is stale: recover, then claim without the check. */
  | { readonly outcome: "recover" }
  /** Nothing pending (the lock was not taken). */
  | { readonly outcome: "none" }
  | { readonly outcome: "claimed"; readonly token: number; readonly entry: EntryRow }

/** Why a transition was refused. */
export type Refusal = "not_found" | "no_claim" | "unheld" | "stale_token" | "lock_lost" | "lock_expired" | "invalid"

/** A transition's outcome: the moved entry, or the refusal with what its message names. */
export type Verdict =
  | { readonly outcome: "ok"; readonly entry: EntryRow }
  | {
    readonly outcome: Refusal
    readonly status: string | null
    readonly fencing_token: Numeric | null
    readonly lock_expires_at: Numeric | null
  }

/** A transition asked for: the entry, the claim's token (none for an id alone), the target, the error to record. */
export interface Move {
  readonly id: number
  readonly token: number | undefined
  readonly to: Status
  readonly error: string | undefined
}

export interface Statements {
  /** Takes the lock and the next pending entry (or the agent's own entry under its live lock). */
  readonly claim: (agentId: string, checkStale: boolean) => Effect.Effect<ClaimOutcome, SqlError>
  /** Takes the lock, or refreshes the agent's own under its token; the token, or undefined while another holds it. */
  readonly acquire: (agentId: string) => Effect.Effect<number | undefined, SqlError>
  readonly release: (token: number) => Effect.Effect<boolean, SqlError>
  readonly extend: (token: number, extraMillis: number) => Effect.Effect<boolean, SqlError>
  readonly transition: (move: Move) => Effect.Effect<Verdict, SqlError>
}

/** The statement set of the queue's dialect. */
export const make = (db: Db): Statements => db.dialect === "pg" ? pg(db) : sqlite(db)

/** What a move's statement needs to know about the state machine, from the target alone. */
const moveFacts = (to: Status) => ({
  needsClaim: Statuses.inProgress.includes(to) || to === "merged",
  staysActive: Statuses.inProgress.includes(to),
  allowedFrom: Statuses.movesInto(to)
})

const pg = (db: Db): Statements => {
  const { names, now, sql } = db
  const inProgress = [...Statuses.inProgress]
  // Built when run, not when asked for: a retried call reads the time again.
  const call = <A>(statement: () => Effect.Effect<ReadonlyArray<{ readonly result: A }>, SqlError>) =>
    Effect.map(Effect.suspend(statement), (rows) => rows[0]!.result)
  return {
    claim: (agentId, checkStale) =>
      call(() =>
        sql<{ readonly result: ClaimOutcome }>`SELECT ${sql(names.claim)}(${agentId}::text, ${now()}::bigint,
        ${db.lockTimeoutMillis}::bigint, ${checkStale}::boolean, ${inProgress}::text[]) AS result`
      ),
    acquire: (agentId) =>
      Effect.map(
        call(() =>
          sql<{ readonly result: Numeric | null }>`SELECT ${sql(names.takeLock)}(${agentId}::text, ${now()}::bigint,
          ${db.lockTimeoutMillis}::bigint, false) AS result`
        ),
        (token) => token === null ? undefined : Number(token)
      ),
    release: (token) =>
      call(() =>
        sql<{ readonly result: boolean }>`SELECT ${sql(names.release)}(${token}::bigint, ${now()}::bigint) AS result`
      ),
    extend: (token, extraMillis) =>
      call(() => {
        const args = sql`${token}::bigint, ${now()}::bigint, ${extraMillis}::bigint`
        return sql<{ readonly result: boolean }>`SELECT ${sql(names.extend)}(${args}) AS result`
      }),
    transition: ({ error, id, to, token }) => {
      const facts = moveFacts(to)
      return call(() => {
        const move = sql`${id}::bigint, ${token ?? null}::bigint, ${to}::text, ${error ?? null}::text`
        const rules = sql`${[...facts.allowedFrom]}::text[], ${facts.needsClaim}::boolean, ${inProgress}::text[],
          ${facts.staysActive}::boolean`
        return sql<{ readonly result: Verdict }>`SELECT ${sql(names.transition)}(${move}, ${now()}::bigint, ${rules})
          AS result`
      })
    }
  }
}

/** A guarded write found the lock changed since the look (SQLite): look again. */
const conflict = Symbol("conflict")

/** How often a claim or an acquisition looks again after its guarded write lost a race, before giving up. */
const MAX_CONFLICTS = 20

/** Rolls back a claim whose pending entry went away between the look and the write. */
class NothingPending extends Data.TaggedError("NothingPending") {}

const truthy = (value: unknown) => Number(value ?? 0) !== 0

/** Runs `attempt` again while it meets `conflict`, at most `MAX_CONFLICTS` times, then settles for `otherwise`. */
const untilSettled = <A, E, R>(
  attempt: Effect.Effect<A | typeof conflict, E, R>,
  otherwise: Effect.Effect<A, E, R>
) => {
  const loop = (left: number): Effect.Effect<A, E, R> =>
    Effect.flatMap(
      attempt,
      (result) => result !== conflict ? Effect.succeed(result) : left > 0 ? loop(left - 1) : otherwise
    )
  return loop(MAX_CONFLICTS)
}

/** The claim's look at the lock (SQLite), with the agent's own entry under its live lock when it has one. */
interface Look extends Partial<Record<keyof EntryRow, unknown>> {
  readonly lock_agent_id: string | null
  readonly lock_acquired_at: Numeric | null
  readonly lock_expires_at: Numeric | null
  readonly lock_fencing_token: Numeric
  readonly now: Numeric
  /** Recovery has work. */
  readonly stale: unknown
  /** An entry is pending. */
  readonly pending: unknown
  readonly id: Numeric | null
}

const sqlite = (db: Db): Statements => {
  const { audit, entries, lock, sql } = db
  const held = withConnection(sql, db.testNow)
  const inProgress = (column: string) => statusIn(sql, column, Statuses.inProgress)

  // Every statement is compiled here, once (`compiled.ts`); a call binds its values.

  // An idle poller's look (another agent's lock is live) reads the lock row and stops there.
  const look = compile<{ agentId: string }, Look>(db, (p, now) => {
    const isLiveNow = live(sql, now)
    const busy = sql`(${isLiveNow} AND v_lock.agent_id <> ${p.agentId})`
    const stale = needsRecovery(sql, entries, { now, inProgress: inProgress("status") })
    return sql<Look>`SELECT v_lock.agent_id AS lock_agent_id, v_lock.acquired_at AS lock_acquired_at,
        v_lock.expires_at AS lock_expires_at, v_lock.fencing_token AS lock_fencing_token, ${now} AS now,
        CASE WHEN ${busy} THEN 0 ELSE ${stale} END AS stale,
        CASE WHEN ${busy} THEN 0 ELSE EXISTS (SELECT 1 FROM ${entries} WHERE status = 'pending') END AS pending,
        own.*
      FROM ${lock} AS v_lock LEFT JOIN ${entries} AS own ON ${isLiveNow} AND v_lock.agent_id = ${p.agentId}
        AND ${inProgress("own.status")} AND own.fencing_token = v_lock.fencing_token
      WHERE v_lock.id = 1 LIMIT 1`
  })

  const readLock = compile<Record<never, never>, LockRow & { now: Numeric }>(
    db,
    (_, now) => sql`SELECT agent_id, acquired_at, expires_at, fencing_token, ${now} AS now FROM ${lock} WHERE id = 1`
  )

  // Takes the lock the look saw — same token and holder, and no other agent's lock live now.
  const takeLockStatement = compile<
    { agentId: string; token: number; seenToken: number; seenAgent: string | null },
    { at: Numeric }
  >(db, (p, now) =>
    sql`UPDATE ${lock} AS v_lock SET agent_id = ${p.agentId}, acquired_at = ${now},
        expires_at = ${now} + ${db.lockTimeoutMillis}, fencing_token = ${p.token}
      WHERE id = 1 AND fencing_token = ${p.seenToken} AND agent_id IS ${p.seenAgent}
        AND NOT (${live(sql, now)} AND v_lock.agent_id <> ${p.agentId})
      RETURNING acquired_at AS at`)

  const claimEntry = compile<{ agentId: string; token: number; at: number }, EntryRow>(
    db,
    (p) =>
      sql`UPDATE ${entries} SET status = 'claimed', agent_id = ${p.agentId}, fencing_token = ${p.token},
        started_at = ${p.at}, state_changed_at = ${p.at}, attempt_count = attempt_count + 1
      WHERE id = (SELECT id FROM ${entries} WHERE status = 'pending' ORDER BY priority, created_at, id LIMIT 1)
      RETURNING *`
  )

  const releaseAudit = compile<{ token: number }, { id: Numeric }>(
    db,
    (p, now) =>
      sql`INSERT INTO ${audit} (at, action, agent_id, fencing_token)
      SELECT ${now}, 'lock_released', agent_id, fencing_token FROM ${lock}
      WHERE id = 1 AND agent_id IS NOT NULL AND fencing_token = ${p.token}
      RETURNING id`
  )

  const releaseLock = compile(
    db,
    () => sql`UPDATE ${lock} SET agent_id = NULL, acquired_at = NULL, expires_at = NULL WHERE id = 1`
  )

  const extendStatement = compile<
    { token: number; extraMillis: number },
    { agent_id: string; expires_at: Numeric; at: Numeric }
  >(db, (p, now) =>
    sql`UPDATE ${lock} AS v_lock SET expires_at = max(expires_at, ${now} + ${p.extraMillis})
      WHERE id = 1 AND fencing_token = ${p.token} AND ${live(sql, now)}
      RETURNING agent_id, expires_at, ${now} AS at`)

  // Audit rows in one statement, a text per number of rows (a call writes one to three).
  const auditInserts: Array<Compiled<{ rows: ReadonlyArray<AuditInsert> }, object>> = []
  const insertAuditRows = (connection: Held, rows: ReadonlyArray<AuditInsert>) => {
    const compiled = auditInserts[rows.length] ??= compileAuditInsert(db, rows.length)
    return connection.run(compiled, { rows })
  }

  // A transition's three statements, compiled per target status (its rules are constants of the text).
  interface MoveStatements {
    /** Writes the audit row only when the move is allowed (it records the entry as it was). */
    readonly audit: Compiled<MoveParams, { at: Numeric }>
    /** The move, at the audit row's time. */
    readonly update: Compiled<MoveParams & { at: number }, EntryRow>
    /** Why it was refused (only a refused move pays for this read). */
    readonly why: Compiled<MoveParams, Exclude<Verdict, { outcome: "ok" }> | { readonly outcome: "ok" }>
  }
  type MoveParams = { id: number; token: number | null; error: string | null }
  const compileMove = (to: Status): MoveStatements => {
    const facts = moveFacts(to)
    const inputs = (p: Slots<MoveParams>, at: Statement.Fragment) => ({
      now: at,
      token: sql`${p.token}`,
      to: sql`${to}`,
      needsClaim: sql`${facts.needsClaim ? 1 : 0}`,
      fromInProgress: inProgress("v_entry.status"),
      fromAllowed: statusIn(sql, "v_entry.status", facts.allowedFrom),
      staysActive: sql`${facts.staysActive ? 1 : 0}`,
      error: sql`${p.error}`
    } satisfies MoveInputs)
    return {
      audit: compile(
        db,
        (p, now) =>
          sql`INSERT INTO ${audit} (at, action, agent_id, entry_id, fencing_token, from_status, to_status, detail)
          SELECT ${now}, 'transition', v_entry.agent_id, v_entry.id, v_entry.fencing_token, v_entry.status,
            ${to}, ${p.error}
          FROM ${lock} AS v_lock JOIN ${entries} AS v_entry ON v_entry.id = ${p.id}
          WHERE v_lock.id = 1 AND ${verdict(sql, inputs(p, now))} = 'ok'
          RETURNING at`
      ),
      update: compile(
        db,
        (p) => sql`UPDATE ${entries} SET ${moveSet(sql, inputs(p, sql`${p.at}`))} WHERE id = ${p.id} RETURNING *`
      ),
      why: compile(db, (p, now) =>
        sql`SELECT ${verdict(sql, inputs(p, now))} AS outcome, v_entry.status AS status,
            v_entry.fencing_token AS fencing_token, v_lock.expires_at AS lock_expires_at
          FROM ${lock} AS v_lock LEFT JOIN ${entries} AS v_entry ON v_entry.id = ${p.id} WHERE v_lock.id = 1`)
    }
  }
  const moves = new Map<Status, MoveStatements>()
  const moveStatements = (to: Status) => {
    let found = moves.get(to)
    if (found === undefined) moves.set(to, found = compileMove(to))
    return found
  }

  /** The lock as a write took it, the time it took it at, and the audit rows that taking it writes. */
  interface Taken {
    readonly token: number
    readonly at: number
    readonly audit: ReadonlyArray<AuditInsert>
  }

  /**
   * Inside a write transaction, takes the lock that `seen` showed — same token and holder, and no other
   * agent's lock live now — for `agentId`; `conflict` when it is not that lock any more. The caller
   * inserts `audit`.
   */
  const takeLock = (
    connection: Held,
    seen: LockRow,
    agentId: string,
    newToken: boolean
  ): Effect.Effect<Taken | typeof conflict, SqlError> => {
    const seenToken = Number(seen.fencing_token)
    const token = newToken || seen.agent_id !== agentId ? seenToken + 1 : seenToken
    return Effect.map(
      connection.run(takeLockStatement, { agentId, token, seenToken, seenAgent: seen.agent_id }),
      (rows) => {
        if (rows[0] === undefined) return conflict
        const at = Number(rows[0].at)
        const takeover: Array<AuditInsert> = seen.agent_id !== null && seen.agent_id !== agentId
          ? [{
            at,
            action: "lock_expired",
            agent_id: seen.agent_id,
            fencing_token: seenToken,
            detail: `expired at ${seen.expires_at}; taken over by ${agentId}`
          }]
          : []
        return {
          token,
          at,
          audit: [...takeover, { at, action: "lock_acquired", agent_id: agentId, fencing_token: token }]
        }
      }
    )
  }

  type Claimed = Effect.Effect<ClaimOutcome | typeof conflict, SqlError>

  const claimOnce = (connection: Held, agentId: string, checkStale: boolean): Claimed =>
    Effect.flatMap(connection.run(look, { agentId }), (rows): Claimed => {
      const seen = rows[0]!
      const lockRow: LockRow = {
        agent_id: seen.lock_agent_id,
        acquired_at: seen.lock_acquired_at,
        expires_at: seen.lock_expires_at,
        fencing_token: seen.lock_fencing_token
      }
      const liveLock = isLive(lockRow, Number(seen.now))
      if (liveLock && lockRow.agent_id !== agentId) return Effect.succeed({ outcome: "busy" })
      if (checkStale && truthy(seen.stale)) return Effect.succeed({ outcome: "recover" })
      if (liveLock && seen.id !== null) {
        return Effect.succeed({
          outcome: "claimed",
          token: Number(lockRow.fencing_token),
          entry: seen as unknown as EntryRow
        })
      }
      if (!truthy(seen.pending)) return Effect.succeed({ outcome: "none" })
      return connection.write(Effect.gen(function*() {
        const taken = yield* takeLock(connection, lockRow, agentId, true)
        if (taken === conflict) return conflict
        const claimed = yield* connection.run(claimEntry, { agentId, token: taken.token, at: taken.at })
        const entry = claimed[0]
        if (entry === undefined) return yield* new NothingPending()
        yield* insertAuditRows(connection, [...taken.audit, {
          at: taken.at,
          action: "claimed",
          agent_id: agentId,
          entry_id: Number(entry.id),
          fencing_token: taken.token,
          from_status: "pending",
          to_status: "claimed"
        }])
        return { outcome: "claimed" as const, token: taken.token, entry }
      })).pipe(Effect.catchTag("NothingPending", () => Effect.succeed({ outcome: "none" as const })))
    })

  const transitionOnce = (connection: Held, move: Move): Effect.Effect<Verdict | typeof conflict, SqlError> => {
    const statements = moveStatements(move.to)
    const params: MoveParams = { id: move.id, token: move.token ?? null, error: move.error ?? null }
    // The audit row first, written only when the move is allowed, then the move itself, at the same time.
    return connection.write(
      Effect.flatMap(connection.run(statements.audit, params), (audited) =>
        audited[0] !== undefined
          ? Effect.map(
            connection.run(statements.update, { ...params, at: Number(audited[0].at) }),
            (moved): Verdict => ({ outcome: "ok", entry: moved[0]! })
          )
          : Effect.map(
            connection.run(statements.why, params),
            // Allowed now but not a moment ago: the clock moved back between the statements. Try again.
            ([why]) => why!.outcome === "ok" ? conflict : why as Verdict
          ))
    )
  }

  return {
    // Every lost race is another process's write to the lock: after many in a row, it is someone else's turn.
    claim: (agentId, checkStale) =>
      held((connection) =>
        untilSettled(claimOnce(connection, agentId, checkStale), Effect.succeed({ outcome: "busy" as const }))
      ),
    acquire: (agentId) =>
      held((connection) =>
        untilSettled(
          Effect.flatMap(connection.run(readLock, {}), ([seen]) =>
            isLive(seen!, Number(seen!.now)) && seen!.agent_id !== agentId
              ? Effect.succeed(undefined)
              : connection.write(Effect.gen(function*() {
                const taken = yield* takeLock(connection, seen!, agentId, false)
                if (taken === conflict) return conflict
                yield* insertAuditRows(connection, taken.audit)
                return taken.token
              }))),
          Effect.succeed(undefined)
        )
      ),
    release: (token) =>
      held((connection) =>
        connection.write(Effect.flatMap(connection.run(releaseAudit, { token }), (released) =>
          released.length === 0
            ? Effect.succeed(false)
            : Effect.as(connection.run(releaseLock, {}), true)))
      ),
    extend: (token, extraMillis) =>
      held((connection) =>
        connection.write(Effect.gen(function*() {
          const extended = yield* connection.run(extendStatement, { token, extraMillis })
          const row = extended[0]
          if (row === undefined) return false
          yield* insertAuditRows(connection, [{
            at: Number(row.at),
            action: "lock_extended",
            agent_id: row.agent_id,
            fencing_token: token,
            detail: `until ${row.expires_at}`
          }])
          return true
        }))
      ),
    transition: (move) =>
      held((connection) =>
        untilSettled(
          transitionOnce(connection, move),
          Effect.dieMessage("MergeQueue: the database's clock keeps moving back")
        )
      )
  }
}

/** Audit rows inserted by one statement, `count` of them: the text `insertAudit` makes, compiled once. */
const compileAuditInsert = (db: Db, count: number): Compiled<{ rows: ReadonlyArray<AuditInsert> }, object> => {
  const empty: AuditInsert = { at: 0, action: "claimed" }
  const text = insertAudit(db, Array.from({ length: count }, () => empty)).compile()[0]
  return {
    text,
    values: ({ rows }) => rows.flatMap((row) => Object.values(auditRow(row)))
  }
}

/** Every column of an audit row to insert (multi-row inserts take their columns from the first row). */
const auditRow = (row: AuditInsert) => ({
  at: row.at,
  action: row.action,
  agent_id: row.agent_id ?? null,
  entry_id: row.entry_id ?? null,
  fencing_token: row.fencing_token ?? null,
  from_status: row.from_status ?? null,
  to_status: row.to_status ?? null,
  detail: row.detail ?? null
})

/** Inserts audit rows, in order, in one statement. */
export const insertAudit = (db: Db, rows: ReadonlyArray<AuditInsert>) =>
  db.sql`INSERT INTO ${db.audit} ${db.sql.insert(rows.map(auditRow))}`

/** The lock row with the time it was read at; `forUpdate`: holding the row (PostgreSQL, in a transaction). */
const readLockStatement = (db: Db, forUpdate: boolean) =>
  db.sql<LockRow & { now: Numeric }>`SELECT agent_id, acquired_at, expires_at, fencing_token, ${db.now()} AS now
    FROM ${db.lock} WHERE id = 1 ${forUpdate && db.dialect === "pg" ? db.sql`FOR UPDATE` : db.sql``}`

/**
 * The lock row with the time it was read at. `forUpdate`: inside a write transaction, holding the row
 * (PostgreSQL; SQLite's transaction holds the file already).
 */
export const readLock = (db: Db, forUpdate: boolean): Effect.Effect<{ lock: LockRow; now: number }, SqlError> =>
  Effect.suspend(() =>
    Effect.map(readLockStatement(db, forUpdate), (rows) => ({ lock: rows[0]!, now: Number(rows[0]!.now) }))
  )
