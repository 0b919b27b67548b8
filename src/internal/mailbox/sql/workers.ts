/**
 * The workers table (mailbox migration 13; 9 made the one of the previous release): one row per open store of a
 * worker process, keyed by the store's instance id (random, drawn when the store is made: two stores of one
 * process — two layers — or two containers with the same host name and pid each keep a row of their own) — its
 * process (`host:pid`, what a claim records in `received_by`), the name it was given (`LEASEHOLD_WORKER_NAME`), when it registered, its
 * leasehold version and its loops as JSON (name, queue, state, the message in hand, the heartbeat's age when the
 * row was written) — and when the row was last refreshed, on the database's clock.
 *
 * `keepRegistered` refreshes the row every `LEASEHOLD_WORKER_REFRESH` (default 5 s) on a fiber of the store's
 * open life, never the loops': one small upsert per process and interval, none per message, on the store's pool
 * (not the lane the claims use). It starts its timer once a loop is made on one of the store's mailboxes, and
 * writes nothing until a loop has run. A write that fails is logged (once
 * until one succeeds again) and tried again at the next interval: the loops never wait for it. The row is
 * deleted when the store's last mailbox closes (a graceful exit); a process that dies leaves its row behind.
 *
 * `list` judges the rows by the database's clock, as the store judges leases: a row not refreshed for longer
 * than `lostAfter` is a lost process; a loop's heartbeat age is its age when the row was written plus the time
 * since, so a loop that stopped beating grows old while its process's row stays fresh (the refresh does not come
 * from the loop), and a whole process that stopped (SIGSTOP) shows its loops growing old first and the process
 * lost after `lostAfter`. A loop older than `stalledAfter` (and not stopped) is stalled.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Config from "effect/Config"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { InvalidParameterError } from "../../../Errors.js"
import * as Durations from "../../duration.js"
import type { LoopPulse } from "../../registry.js"
import { missingTables } from "../../sql/common.js"
import * as StoredTime from "../../storedTime.js"
import { version } from "../../version.js"
import type * as Admin from "../admin/workersModel.js"
import { nowOf, statements } from "./statements.js"
import type { Store } from "./store.js"

/**
 * The workers table of migration 9, keyed by `host:pid`: processes of the previous release write their rows
 * there (and this release still lists them, with no instance); this release writes `instancesTable`.
 */
export const workersTable = (prefix: string) => `${prefix}mailbox_workers`

/** The workers table of migration 13, keyed by instance. */
export const instancesTable = (prefix: string) => `${prefix}mailbox_worker_instances`

/** Migration 9: the table keyed by `host:pid`. */
export const createTable = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  return Effect.asVoid(sql`CREATE TABLE IF NOT EXISTS ${sql(workersTable(store.prefix))} (
    process TEXT PRIMARY KEY,
    name TEXT,
    started_at BIGINT NOT NULL,
    version TEXT NOT NULL,
    loops TEXT NOT NULL,
    refreshed_at BIGINT NOT NULL)`)
}

/**
 * Migration 13: the table keyed by instance. A table of its own rather than a new key for 9's: a process of the
 * previous release upserts on `process` (its `ON CONFLICT (process)` needs that key), so it keeps 9's table.
 */
export const createInstancesTable = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  return Effect.asVoid(sql`CREATE TABLE IF NOT EXISTS ${sql(instancesTable(store.prefix))} (
    instance TEXT PRIMARY KEY,
    process TEXT NOT NULL,
    name TEXT,
    started_at BIGINT NOT NULL,
    version TEXT NOT NULL,
    loops TEXT NOT NULL,
    refreshed_at BIGINT NOT NULL)`)
}

/** A loop as its process's row stores it. */
const StoredLoop = Schema.Struct({
  name: Schema.String,
  queue: Schema.String,
  state: Schema.Literal("running", "draining", "stopped"),
  messageId: Schema.NullOr(Schema.String),
  /** Milliseconds since its heartbeat beat, when the row was written. */
  beatAgeMillis: Schema.Number
})
type StoredLoop = typeof StoredLoop.Type

const decodeLoops = Schema.decodeUnknownOption(Schema.parseJson(Schema.Array(StoredLoop)))

/** A duration from the environment variable `name`, or `fallback` (a bad value is logged and replaced). */
export const durationFromEnv = (name: string, fallback: Duration.Duration): Effect.Effect<Duration.Duration> =>
  Config.option(Config.string(name)).pipe(
    Effect.orElseSucceed(() => Option.none<string>()),
    Effect.flatMap(Option.match({
      onNone: () => Effect.succeed(fallback),
      onSome: (text) =>
        Either.match(Durations.parse(text.trim()), {
          onRight: (duration) =>
            Duration.isZero(duration) || !Duration.isFinite(duration)
              ? Effect.as(Effect.logWarning(`${name} must be a positive duration; using the default`), fallback)
              : Effect.succeed(duration),
          onLeft: (reason) =>
            Effect.as(
              Effect.logWarning(`${name} ${reason} (e.g. "5 seconds"); using ${Duration.format(fallback)}`),
              fallback
            )
        })
    }))
  )

/** How often a worker process refreshes its row (`LEASEHOLD_WORKER_REFRESH`). */
export const refreshEnv = "LEASEHOLD_WORKER_REFRESH"
/** The name a worker process records (`LEASEHOLD_WORKER_NAME`); none by default. */
export const nameEnv = "LEASEHOLD_WORKER_NAME"

/** The loops of the store that have run, as the row stores them now. */
const loopsNow = (store: Store): Effect.Effect<ReadonlyArray<StoredLoop>> =>
  Effect.forEach(
    [...store.loops.values()].flatMap((loop) => {
      const pulse: LoopPulse | undefined = loop.look()
      return pulse === undefined ? [] : [{ loop, pulse }]
    }),
    ({ loop, pulse }) =>
      Effect.map(loop.elapsed, (elapsed): StoredLoop => ({
        name: loop.name,
        queue: loop.queue,
        state: pulse.state,
        messageId: pulse.messageId ?? null,
        beatAgeMillis: Math.round(Duration.toMillis(elapsed))
      }))
  )

/** Rows of processes gone for longer than this are deleted by the next process to register. */
const forgetAfter = Duration.days(1)

/**
 * Refreshes this process's row while the store is open (see the module comment); forked by the store's open
 * life, and interrupted before `unregister`. Never fails.
 */
export const keepRegistered = (store: Store): Effect.Effect<never> =>
  Effect.gen(function*() {
    const { sql } = store
    const table = sql(instancesTable(store.prefix))
    const previous = sql(workersTable(store.prefix))
    const every = yield* durationFromEnv(refreshEnv, Duration.seconds(5))
    const name = yield* Config.option(Config.nonEmptyString(nameEnv)).pipe(
      Effect.orElseSucceed(() => Option.none<string>())
    )
    const clock = yield* Effect.clock
    const now = nowOf(clock)
    const at = statements(store).at
    const startedAt = clock.unsafeCurrentTimeMillis()
    let failing = false
    let forgotten = false
    const refresh = Effect.gen(function*() {
      const loops = yield* loopsNow(store)
      if (loops.length === 0) return
      if (!forgotten) {
        for (const old of [table, previous]) {
          yield* sql`DELETE FROM ${old} WHERE refreshed_at < ${at(now())} - ${Duration.toMillis(forgetAfter)}`
        }
        forgotten = true
      }
      yield* sql`INSERT INTO ${table} (instance, process, name, started_at, version, loops, refreshed_at)
        VALUES (${store.instance}, ${store.receiver}, ${Option.getOrNull(name)}, ${startedAt}, ${version},
          ${JSON.stringify(loops)}, ${at(now())})
        ON CONFLICT (instance) DO UPDATE SET process = excluded.process, name = excluded.name,
          started_at = excluded.started_at, version = excluded.version, loops = excluded.loops,
          refreshed_at = excluded.refreshed_at`
      store.registered = true
      if (failing) yield* Effect.logInfo("The worker's row is written again")
      failing = false
    }).pipe(
      Effect.catchAllCause((cause) =>
        failing ? Effect.void : Effect.zipRight(
          Effect.logWarning("Could not write the worker's row; trying again at the next refresh", cause),
          Effect.sync(() => {
            failing = true
          })
        )
      )
    )
    // No timer until a loop is tracked: a process that only sends runs none (nor does a test's TestClock see one).
    yield* Deferred.await(store.anyLoop)
    return yield* Effect.repeat(refresh, Schedule.fixed(every)).pipe(Effect.zipRight(Effect.never))
  }).pipe(Effect.annotateLogs({ module: "MailboxSql", fiber: "worker-registry" }))

/** How long a graceful exit waits for its row's deletion. */
const unregisterLimit = "2 seconds"

/** Deletes this process's row, if it wrote one: it is leaving gracefully. */
export const unregister = (store: Store): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (!store.registered) return Effect.void
    store.registered = false
    const { sql } = store
    return sql`DELETE FROM ${sql(instancesTable(store.prefix))} WHERE instance = ${store.instance}`.pipe(
      // A database that is gone must not hold the exit: the row is then reported lost, which is the truth.
      Effect.timeoutFail({ duration: unregisterLimit, onTimeout: () => `no answer within ${unregisterLimit}` }),
      Effect.asVoid,
      Effect.catchAllCause((cause) => Effect.logWarning("Could not delete the worker's row", cause))
    )
  })

/** A loop of a worker process, judged. */
export interface ListedLoop {
  readonly name: string
  readonly queue: string
  readonly state: "running" | "draining" | "stopped"
  readonly messageId: string | undefined
  /** Milliseconds since its heartbeat last beat, now (the database's clock). */
  readonly heartbeatAgeMillis: number
  /** Running or draining, and its heartbeat older than `stalledAfter`. */
  readonly stalled: boolean
}

/** A worker process's row, judged. */
export interface ListedWorker {
  readonly process: string
  /** The store's instance id; `undefined` for a row of the previous release (keyed by `process` alone). */
  readonly instance?: string | undefined
  readonly name: string | undefined
  readonly startedAt: number
  readonly version: string
  readonly refreshedAt: number
  /** Milliseconds since its row was refreshed, on the database's clock. */
  readonly sinceRefreshMillis: number
  /** Not refreshed for longer than `lostAfter`. */
  readonly lost: boolean
  readonly loops: ReadonlyArray<ListedLoop>
}

/** The thresholds of a listing. */
export interface Thresholds {
  readonly stalledAfter: Duration.Duration
  readonly lostAfter: Duration.Duration
}

/** `LEASEHOLD_WORKER_STALLED_AFTER` (default 60 s) and `LEASEHOLD_WORKER_LOST_AFTER` (default 30 s). */
export const thresholdsFromEnv: Effect.Effect<Thresholds> = Effect.zipWith(
  durationFromEnv("LEASEHOLD_WORKER_STALLED_AFTER", Duration.seconds(60)),
  durationFromEnv("LEASEHOLD_WORKER_LOST_AFTER", Duration.seconds(30)),
  (stalledAfter, lostAfter) => ({ stalledAfter, lostAfter })
)

interface Row {
  readonly instance: string | null
  readonly process: string
  readonly name: string | null
  readonly started_at: number | string
  readonly version: string
  readonly loops: string
  readonly refreshed_at: number | string
  readonly since: number | string
}

/**
 * The rows of both tables (13's by instance, and 9's that processes of the previous release write), by process
 * id then instance, at most `limit`, judged by the database's clock (or a test's `TestClock`). A database whose
 * mailbox tables predate migration 13 (an operator's look at an older database) lists 9's alone.
 */
export const list = (
  store: Store,
  thresholds: Thresholds,
  limit: number
): Effect.Effect<ReadonlyArray<ListedWorker>, SqlError> =>
  Effect.flatMap(Effect.clock, (clock) => {
    const { sql } = store
    const at = statements(store).at(nowOf(clock)())
    const stalledAfter = Duration.toMillis(thresholds.stalledAfter)
    const lostAfter = Duration.toMillis(thresholds.lostAfter)
    const columns = sql`process, name, started_at, version, loops, refreshed_at, ${at} - refreshed_at AS since`
    const previous = sql`SELECT CAST(NULL AS TEXT) AS instance, ${columns} FROM ${sql(workersTable(store.prefix))}`
    const select = Effect.flatMap(
      missingTables(sql, [instancesTable(store.prefix)]),
      (missing) =>
        missing.length > 0
          ? sql<Row>`${previous} ORDER BY process LIMIT ${limit}`
          : sql<Row>`SELECT instance, ${columns} FROM ${sql(instancesTable(store.prefix))}
            UNION ALL ${previous} ORDER BY process, instance LIMIT ${limit}`
    )
    return Effect.map(
      select,
      (rows) =>
        rows.map((row): ListedWorker => {
          const since = Math.max(0, Number(row.since))
          return {
            process: row.process,
            instance: row.instance ?? undefined,
            name: row.name ?? undefined,
            startedAt: Number(row.started_at),
            version: row.version,
            refreshedAt: Number(row.refreshed_at),
            sinceRefreshMillis: since,
            lost: since > lostAfter,
            loops: Option.getOrElse(decodeLoops(row.loops), () => []).map((loop): ListedLoop => {
              const age = loop.beatAgeMillis + since
              return {
                name: loop.name,
                queue: loop.queue,
                state: loop.state,
                messageId: loop.messageId ?? undefined,
                heartbeatAgeMillis: age,
                stalled: loop.state !== "stopped" && age > stalledAfter
              }
            })
          }
        })
    )
  })

/** The most processes a listing returns. */
const maxWorkers = 10_000

/** A threshold of `Workers.list`, if given: a positive finite duration, else an `InvalidParameterError` naming it. */
const threshold = (
  parameter: "stalledAfter" | "lostAfter",
  value: Duration.DurationInput | undefined
): Either.Either<Duration.Duration | undefined, InvalidParameterError> => {
  if (value === undefined) return Either.right(undefined)
  const parsed = Either.flatMap(
    Durations.parse(value),
    (duration) =>
      Duration.isZero(duration) || !Duration.isFinite(duration)
        ? Either.left("must be a positive finite duration")
        : Either.right(duration)
  )
  return Either.mapLeft(parsed, (reason) => new InvalidParameterError({ parameter, value, reason }))
}

/**
 * The processes of the workers table as `MailboxSqlAdmin.workers().list` answers them: the thresholds checked
 * (`InvalidParameterError` naming one that is not a positive finite duration), else taken from the environment.
 */
export const listProcesses = (
  store: Store,
  options: Admin.WorkersOptions | undefined
): Effect.Effect<ReadonlyArray<Admin.WorkerProcess>, SqlError | InvalidParameterError> =>
  Effect.gen(function*() {
    const stalledAfter = yield* threshold("stalledAfter", options?.stalledAfter)
    const lostAfter = yield* threshold("lostAfter", options?.lostAfter)
    const defaults = yield* thresholdsFromEnv
    const rows = yield* list(store, {
      stalledAfter: stalledAfter ?? defaults.stalledAfter,
      lostAfter: lostAfter ?? defaults.lostAfter
    }, maxWorkers)
    return rows.map((row): Admin.WorkerProcess => ({
      process: row.process,
      instance: Option.fromNullable(row.instance),
      name: Option.fromNullable(row.name),
      startedAt: StoredTime.decode(row.startedAt),
      version: row.version,
      refreshedAt: StoredTime.decode(row.refreshedAt),
      lost: row.lost,
      loops: row.loops.map((loop): Admin.WorkerLoop => ({
        name: loop.name,
        queue: loop.queue,
        state: loop.state,
        messageId: Option.fromNullable(loop.messageId),
        heartbeatAge: Duration.millis(loop.heartbeatAgeMillis),
        stalled: loop.stalled
      }))
    }))
  })
