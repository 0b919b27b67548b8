/**
 * The merge queue service behind `MergeQueue.make`: checks each call's arguments, runs its statements
 * (`statements.ts`, `recovery.ts`), retries claims that meet a busy database, turns a refused transition
 * into its typed error, and counts and logs what happened.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { InvalidParameterError, type SchemaVersionError, type TablesNotFoundError } from "../../Errors.js"
import { DurationFromInput } from "../duration.js"
import { nameProblem, storableText } from "../names.js"
import * as Sql from "../sql/common.js"
import {
  AlreadyQueuedError,
  EntryNotFoundError,
  InvalidTransitionError,
  LockLostError,
  MergeQueueStoreError,
  Status
} from "./errors.js"
import * as Metrics from "./metrics.js"
import type {
  AuditRecord,
  LockHold,
  MergeQueueConfig,
  MergeQueueService,
  ProcessingLock,
  QueueStats,
  RecoveryStats,
  Status as StatusType
} from "./model.js"
import * as Recovery from "./recovery.js"
import { type AuditRow, type EntryRow, isLive, millis, retryable, toAudit, toClaim, toEntry, toLock } from "./rows.js"
import * as Schema_ from "./schema.js"
import * as Statements from "./statements.js"
import * as Statuses from "./statuses.js"

type Store<A> = Effect.Effect<A, MergeQueueStoreError>

/** A hold's token, checked: a safe non-negative integer. */
const tokenOf = (hold: LockHold): Either.Either<number, InvalidParameterError> =>
  typeof hold === "object" && hold !== null && Number.isSafeInteger(hold.token) && hold.token >= 0
    ? Either.right(hold.token)
    : Either.left(
      new InvalidParameterError({
        parameter: "token",
        value: (hold as Partial<LockHold> | null)?.token,
        reason: "must be the fencing token of a claim or a lock hold (a non-negative integer)"
      })
    )

/** Why `name` cannot name a workspace, bead or agent: the name rule (`internal/names.ts`), and not blank. */
const identifierProblem = (name: unknown): string | undefined =>
  nameProblem(name) ?? ((name as string).trim().length === 0 ? "must not be blank" : undefined)

/** `value` checked as the identifier `parameter` (a workspace, a bead id, an agent id). */
const identifier = (parameter: string, value: string): Either.Either<string, InvalidParameterError> => {
  const problem = identifierProblem(value)
  return problem === undefined
    ? Either.right(value)
    : Either.left(new InvalidParameterError({ parameter, value, reason: problem }))
}

const agent = (agentId: string) => identifier("agentId", agentId)

/** A duration argument: not negative (nor zero unless `allowZero`), and at most `max` (finite, so storable). */
const positiveDuration = (
  parameter: string,
  input: Duration.DurationInput,
  allowZero: boolean,
  max: Duration.Duration
) =>
  Either.flatMap(
    Either.mapLeft(
      Schema.decodeUnknownEither(DurationFromInput)(input),
      (error) =>
        new InvalidParameterError({ parameter, value: input, reason: ParseResult.TreeFormatter.formatErrorSync(error) })
    ),
    (duration) =>
      !allowZero && Duration.isZero(duration)
        ? Either.left(new InvalidParameterError({ parameter, value: input, reason: "must be greater than zero" }))
        : Duration.greaterThan(duration, max)
        ? Either.left(
          new InvalidParameterError({ parameter, value: input, reason: `must be at most ${Duration.format(max)}` })
        )
        : Either.right(duration)
  )

/**
 * The `limit` and `last` of a listing: integers in 1..100000 (SQLite reads `LIMIT -1` as no limit at all, and
 * PostgreSQL refuses a negative one as a store error).
 */
const checkLimits = (
  options: { readonly limit?: number | undefined; readonly last?: number | undefined } | undefined
): Effect.Effect<void, InvalidParameterError> => {
  for (const parameter of ["limit", "last"] as const) {
    const value = options?.[parameter]
    if (value !== undefined && !(Number.isSafeInteger(value) && value >= 1 && value <= 100_000)) {
      return Effect.fail(new InvalidParameterError({ parameter, value, reason: "must be an integer in 1..100000" }))
    }
  }
  return Effect.void
}

const statusSet: ReadonlySet<unknown> = new Set(Statuses.statuses)

/** Whether `status` is one (what `Schema.is(Status)` says, without a parse per call). */
const isStatus = (status: unknown): status is StatusType => statusSet.has(status)

/** The typed error of a refused transition. */
const refusal = (
  move: Statements.Move,
  refused: Exclude<Statements.Verdict, { readonly outcome: "ok" }>
): EntryNotFoundError | InvalidTransitionError | LockLostError => {
  const { id, to, token } = move
  const from = refused.status as StatusType
  const lost = (reason: string) => new LockLostError({ entryId: id, ...(token === undefined ? {} : { token }), reason })
  switch (refused.outcome) {
    case "not_found":
      return new EntryNotFoundError({ entryId: id })
    case "no_claim":
      return lost(`moving a ${from} entry to ${to} needs its claim (the entry and its token)`)
    case "unheld":
      return lost(`the entry is ${from} and held by no claim`)
    case "stale_token":
      return lost(`the claim's fencing token ${token} is stale (the entry is claimed under ${refused.fencing_token})`)
    case "lock_lost":
      return lost("its processing lock was released or taken over")
    case "lock_expired":
      return lost(`its processing lock expired at ${refused.lock_expires_at}`)
    case "invalid":
      return new InvalidTransitionError({ entryId: id, from, to })
  }
}

/**
 * Makes the service on the `SqlClient` in the context, opening its tables as `mode` says (by default as
 * `config.create` says: created, or checked at this release's version).
 */
export const make = (
  config: MergeQueueConfig,
  mode?: Schema_.OpenMode
): Effect.Effect<
  MergeQueueService,
  MergeQueueStoreError | TablesNotFoundError | SchemaVersionError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const db = yield* Schema_.open(sql, config, mode)
    const statements = Statements.make(db)
    const { entries } = db
    // Written out as the workspace index's condition is (migration 1), not bound: SQLite uses a partial index
    // only for a query that repeats its condition, and with bound values it read every entry instead.
    const finalStatuses = sql.literal(`(${Statuses.terminal.map((status) => `'${status}'`).join(", ")})`)

    const store = (operation: string) => Sql.mapSqlError((cause) => new MergeQueueStoreError({ operation, cause }))

    const detectAndRecoverStale: Store<RecoveryStats> = Recovery.recover(db, (now) => now + 1, false).pipe(
      Effect.tap(Recovery.report),
      Effect.map((healed) => healed.stats),
      store("detectAndRecoverStale"),
      Effect.withSpan("MergeQueue.detectAndRecoverStale")
    )

    const getRecoveryStats: Store<RecoveryStats> = Recovery.recover(db, (now) => now + 1, true).pipe(
      Effect.map((healed) => healed.stats),
      store("getRecoveryStats")
    )

    const reclaimStale: MergeQueueService["reclaimStale"] = (threshold) =>
      Either.match(positiveDuration("threshold", threshold, true, Duration.days(365)), {
        onLeft: Effect.fail,
        onRight: (duration) =>
          Recovery.recover(db, (now) => now - Duration.toMillis(duration), false).pipe(
            Effect.tap(Recovery.report),
            Effect.map((healed) => healed.stats.entriesReclaimed),
            store("reclaimStale")
          )
      })

    // Best effort before a claim: a failed recovery is logged and counted, and the claim goes on.
    const recoverBeforeClaim = detectAndRecoverStale.pipe(
      Effect.asVoid,
      Effect.catchAll((error) =>
        Effect.zipRight(
          Metric.increment(Metrics.recoveryFailures),
          Effect.logWarning("Automatic merge queue recovery failed; claiming anyway", error)
        )
      )
    )

    const claimSchedule = Schedule.exponential(config.initialBackoff, 2).pipe(
      Schedule.union(Schedule.spaced(config.maxBackoff)),
      Schedule.intersect(Schedule.recurs(config.maxAttempts - 1))
    )

    const nextWithLock: MergeQueueService["nextWithLock"] = (agentId) =>
      Either.match(agent(agentId), {
        onLeft: Effect.fail,
        onRight: () => {
          // One statement (PostgreSQL) or one look and one transaction (SQLite) when nothing is stale; when
          // something is, the claim stops before taking anything, recovery runs, and the claim runs again.
          const attempt = Effect.flatMap(statements.claim(agentId, true), (found) =>
            found.outcome === "recover"
              ? Effect.zipRight(recoverBeforeClaim, statements.claim(agentId, false))
              : Effect.succeed(found))
          // The retry schedule starts only after a failure (a claim that succeeds, nearly every one, does not
          // pay for a schedule's driver); the retries count from that failure, the first waiting the first delay.
          const retried = Effect.catchAll(attempt, (failure) => {
            if (!retryable(failure)) return Effect.fail(failure)
            let seen = false
            const again = Effect.suspend(() => {
              if (seen) return attempt
              seen = true
              return Effect.fail(failure)
            })
            return Effect.retry(again, { schedule: claimSchedule, while: retryable })
          })
          return Effect.map(
            retried,
            (found) =>
              found.outcome === "claimed" ? Option.some(toClaim(found.entry, Number(found.token))) : Option.none()
          ).pipe(
            Effect.tap((claimed) => Option.isSome(claimed) ? Metric.increment(Metrics.claims) : Effect.void),
            store("nextWithLock"),
            Effect.withSpan("MergeQueue.nextWithLock", { attributes: { agentId }, captureStackTrace: false })
          )
        }
      })

    const acquireProcessingLock: MergeQueueService["acquireProcessingLock"] = (agentId) =>
      Either.match(agent(agentId), {
        onLeft: Effect.fail,
        onRight: () =>
          Effect.map(
            statements.acquire(agentId),
            (token): Option.Option<LockHold> => token === undefined ? Option.none() : Option.some({ token })
          ).pipe(store("acquireProcessingLock"))
      })

    const releaseProcessingLock: MergeQueueService["releaseProcessingLock"] = (hold) =>
      Either.match(tokenOf(hold), {
        onLeft: Effect.fail,
        onRight: (token) => statements.release(token).pipe(store("releaseProcessingLock"))
      })

    const extendLock: MergeQueueService["extendLock"] = (hold, extra) =>
      Either.match(
        Either.flatMap(
          tokenOf(hold),
          (token) =>
            Either.map(positiveDuration("extra", extra, false, Duration.hours(24)), (duration) => ({ token, duration }))
        ),
        {
          onLeft: Effect.fail,
          onRight: ({ duration, token }) =>
            statements.extend(token, Math.round(Duration.toMillis(duration))).pipe(store("extendLock"))
        }
      )

    const readLock = Statements.readLock(db, false)

    const getProcessingLock: Store<Option.Option<ProcessingLock>> = Effect.map(readLock, ({ lock }) => toLock(lock))
      .pipe(store("getProcessingLock"))

    const isLockStale: Store<boolean> = Effect.map(
      readLock,
      ({ lock, now }) => lock.agent_id !== null && lock.expires_at !== null && !isLive(lock, now)
    ).pipe(store("isLockStale"))

    const storeTransition = store("transition")

    // No generator: a transition is the hot path of a merge worker, and every step here is paid per call.
    const transition: MergeQueueService["transition"] = (entry, status, options) =>
      Effect.suspend((): ReturnType<MergeQueueService["transition"]> => {
        const id = typeof entry === "number" ? entry : entry.id
        const token = typeof entry === "number" ? Either.right(undefined) : tokenOf(entry)
        if (Either.isLeft(token)) return Effect.fail(token.left)
        if (!isStatus(status)) {
          return Effect.fail(
            new InvalidParameterError({
              parameter: "status",
              value: status,
              reason: `must be one of ${Status.literals.join(", ")}`
            })
          )
        }
        // Free text, stored: made storable (no NUL or lone surrogate, at most 64 KiB) rather than refused.
        const error = options?.error === undefined ? undefined : storableText(String(options.error), 64 * 1024)
        const move: Statements.Move = { id, token: token.right, to: status, error }
        return Effect.flatMap(
          storeTransition(statements.transition(move)),
          (verdict) =>
            verdict.outcome === "ok" ? Effect.succeed(toEntry(verdict.entry)) : Effect.fail(refusal(move, verdict))
        )
      })

    const entryById = (id: number) =>
      Effect.map(sql<EntryRow>`SELECT * FROM ${entries} WHERE id = ${id}`, (rows) => rows[0])

    const activeFor = (workspace: string) =>
      sql<{ id: number | string }>`SELECT id FROM ${entries}
        WHERE workspace = ${workspace} AND status NOT IN ${finalStatuses}`

    const enqueue: MergeQueueService["enqueue"] = (workspace, options) =>
      Effect.gen(function*() {
        yield* identifier("workspace", workspace)
        if (options?.beadId !== undefined) yield* identifier("beadId", options.beadId)
        const priority = options?.priority ?? 2
        if (!Number.isSafeInteger(priority)) {
          return yield* new InvalidParameterError({
            parameter: "priority",
            value: priority,
            reason: "must be an integer"
          })
        }
        // A write transaction: on SQLite it waits for the file's write lock rather than read first and fail
        // "database is locked" when another process writes meanwhile.
        return yield* db.writeTransaction(Effect.gen(function*() {
          const existing = yield* activeFor(workspace)
          if (existing[0] !== undefined) {
            return yield* new AlreadyQueuedError({ workspace, entryId: Number(existing[0].id) })
          }
          const rows = yield* sql<EntryRow>`INSERT INTO ${entries}
            (workspace, bead_id, priority, status, state_changed_at, created_at)
            VALUES (${workspace}, ${options?.beadId ?? null}, ${priority}, 'pending', ${db.now()}, ${db.now()})
            RETURNING *`
          const row = rows[0]!
          yield* Statements.insertAudit(db, [{
            at: Number(row.created_at),
            action: "enqueued",
            entry_id: Number(row.id),
            to_status: "pending",
            detail: workspace
          }])
          return toEntry(row)
        })).pipe(
          // Two processes enqueueing the same workspace at once: the unique index turns the loser away.
          Effect.catchTag("SqlError", (error): Effect.Effect<never, AlreadyQueuedError | SqlError> =>
            retryable(error)
              ? Effect.flatMap(
                activeFor(workspace),
                (rows): Effect.Effect<never, AlreadyQueuedError | SqlError> =>
                  rows[0] === undefined
                    ? Effect.fail(error)
                    : Effect.fail(new AlreadyQueuedError({ workspace, entryId: Number(rows[0].id) }))
              )
              : Effect.fail(error)),
          store("enqueue")
        )
      })

    const get = (id: number) =>
      Effect.map(entryById(id), (row) => Option.map(Option.fromNullable(row), toEntry)).pipe(store("get"))

    const list: MergeQueueService["list"] = (options) =>
      Effect.zipRight(
        checkLimits(options),
        Effect.map(
          sql<EntryRow>`SELECT * FROM ${entries}
          ${options?.status === undefined ? sql`` : sql`WHERE status IN ${sql.in([...options.status])}`}
          ORDER BY priority, created_at, id
          ${options?.limit === undefined ? sql`` : sql`LIMIT ${options.limit}`}`,
          (rows) => rows.map(toEntry)
        ).pipe(store("list"))
      )

    const stats: Store<QueueStats> = Effect.gen(function*() {
      const counts = yield* sql<{ status: string; n: number | string }>`SELECT status, count(*) AS n
        FROM ${entries} GROUP BY status`
      const oldest = yield* sql<{ at: number | string | null }>`SELECT min(created_at) AS at
        FROM ${entries} WHERE status = 'pending'`
      const byStatus = Object.fromEntries(Status.literals.map((status) => [status, 0])) as Record<StatusType, number>
      for (const row of counts) byStatus[row.status as StatusType] = Number(row.n)
      return {
        total: counts.reduce((sum, row) => sum + Number(row.n), 0),
        byStatus,
        lock: toLock((yield* readLock).lock),
        oldestPendingAt: oldest[0]?.at === null || oldest[0] === undefined
          ? Option.none()
          : Option.some(millis(oldest[0].at))
      }
    }).pipe(store("stats"))

    const auditLog: MergeQueueService["auditLog"] = (options) =>
      Effect.zipRight(
        checkLimits(options),
        Effect.map(
          sql<AuditRow>`SELECT * FROM ${db.audit}
          ${options?.entryId === undefined ? sql`` : sql`WHERE entry_id = ${options.entryId}`}
          ORDER BY id ${
            options?.last !== undefined
              ? sql`DESC LIMIT ${options.last}`
              : options?.limit !== undefined
              ? sql`LIMIT ${options.limit}`
              : sql``
          }`,
          (rows): ReadonlyArray<AuditRecord> => (options?.last === undefined ? rows : [...rows].reverse()).map(toAudit)
        ).pipe(store("auditLog"))
      )

    const extendable: MergeQueueService["extendable"] = (claim) => ({
      id: String(claim.id),
      extendVisibility: (timeout) =>
        Effect.flatMap(
          extendLock(claim, timeout),
          (extended) =>
            extended ? Effect.void : Effect.fail(
              new LockLostError({ entryId: claim.id, token: claim.token, reason: "its processing lock is gone" })
            )
        )
    })

    return {
      config,
      enqueue,
      nextWithLock,
      acquireProcessingLock,
      releaseProcessingLock,
      getProcessingLock,
      extendLock,
      reclaimStale,
      detectAndRecoverStale,
      getRecoveryStats,
      isLockStale,
      transition,
      get,
      list,
      stats,
      auditLog,
      extendable
    } satisfies MergeQueueService
  })
