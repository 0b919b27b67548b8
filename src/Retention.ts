/**
 * Retention: deletes what leasehold's SQL tables would otherwise keep for ever, once it is older than a cutoff
 * — merge-queue entries in a terminal status (`merged`, `failed_terminal`, `cancelled`), the merge queue's
 * audit log, dead letters, the unread replies of the queues named as reply queues, and the step journals of
 * agent runs whose message is gone. Never a queued, delayed, in-flight or in-progress row.
 *
 * A step journal (`journals`) is deleted with its message when a delivery acknowledges it; what stays is the
 * journal of a request the loop dead-lettered (kept for the operator: `leasehold mailbox journal`), of a message
 * purged or deleted by hand, or of a process that acknowledged and crashed before it could say so. Retention
 * deletes those steps once they were recorded before the cutoff; a journal whose message is still in the
 * messages table (queued, delayed, in flight: its next delivery replays it) is never pruned, however old.
 *
 * `prune` runs once (the `leasehold prune` command uses it); `layer` runs it in the background on a schedule.
 * Rows go in batches of `batchSize`, each batch one short write transaction that reads at most that many rows
 * along an index, with a `pause` between batches: a mailbox or a merge queue working on the same tables waits
 * at most one batch. Several processes may prune the same database at once: a row is deleted once, by one of
 * them (each count is of rows that process deleted). Age is judged by the database's clock (on PostgreSQL,
 * every machine by one clock), or under `TestClock` by the test's time, as the mailbox and the merge queue do.
 *
 * Replies are the messages a worker's `reply` inserts into the queue a request's `replyTo` names, and any
 * queue can be one — in a pipeline, the next stage's request queue — so the store cannot tell a reply queue
 * from a work queue: retention prunes replies only on the queues given in `replyQueues`. Tables are never
 * created: a kind whose tables the database does not have (no merge queue on this prefix, say) is `skipped`.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import type * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { InvalidParameterError, TablesNotFoundError } from "./Errors.js"
import { QueueName } from "./internal/mailbox/validation.js"
import { names as mergeQueueNames } from "./internal/mergeQueue/schema.js"
import { counter } from "./internal/metrics.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import * as Statements from "./internal/sql/retention.js"

/**
 * What retention prunes: terminal merge-queue `entries`, `audit` rows, `deadLetters`, `replies`, orphaned step
 * `journals`.
 *
 * @category models
 */
export type Kind = Statements.Kind

/**
 * Every kind, in the order a prune takes them.
 *
 * @category constants
 */
export const kinds: ReadonlyArray<Kind> = Statements.kinds

/**
 * The longest age a prune takes: 100 years (36,500 days). No row leasehold writes is older than that, and every
 * cutoff stays a whole number of milliseconds both databases hold alike (a PostgreSQL `bigint`; past it, one
 * database refused the cutoff and the other answered 0).
 *
 * @category constants
 */
export const maxAge: Duration.Duration = Duration.days(36_500)

/**
 * The shortest age a prune takes: 1 millisecond, the unit ages are judged in (a shorter one would round to 0
 * and prune every row).
 *
 * @category constants
 */
export const minAge: Duration.Duration = Duration.millis(1)

/**
 * `olderThan` within `minAge`..`maxAge`, else an `InvalidParameterError` naming it and the bound it broke (the
 * same on every database, checked before one is asked).
 */
const checkAge = (olderThan: Duration.Duration, given: unknown): Effect.Effect<void, InvalidParameterError> =>
  Duration.lessThan(olderThan, minAge)
    ? Effect.fail(
      new InvalidParameterError({
        parameter: "olderThan",
        value: given,
        reason: "must be at least 1 millisecond (a shorter age would prune every row)"
      })
    )
    : Duration.greaterThan(olderThan, maxAge)
    ? Effect.fail(
      new InvalidParameterError({
        parameter: "olderThan",
        value: given,
        reason: "must be at most 36500 days (100 years)"
      })
    )
    : Effect.void

/**
 * What to prune, decoded from `Options` with its defaults.
 *
 * @category models
 */
export class RetentionConfig extends Schema.Class<RetentionConfig>("leasehold/RetentionConfig")({
  /**
   * Rows older than this go (required; more than zero, finite; `prune` and `layer` refuse one under `minAge` or
   * over `maxAge` with an `InvalidParameterError`).
   */
  olderThan: Options_.duration({ positive: true }),
  /** The kinds to prune (default all). */
  kinds: Schema.optionalWith(
    Options_.worded(
      Schema.Array(Schema.Literal(...Statements.kinds)).pipe(Schema.minItems(1)),
      () => `must be a non-empty list of ${Statements.kinds.join(", ")}`
    ),
    { default: () => Statements.kinds }
  ),
  /** The queues whose unread replies go (default none: see the module's comment). */
  replyQueues: Schema.optionalWith(Schema.Array(QueueName), { default: () => [] }),
  /** Rows per batch, each batch its own transaction (default 500; 1..10000). */
  batchSize: Schema.optionalWith(Options_.intBetween(1, 10_000), { default: () => 500 }),
  /** How long to wait between two batches, so other writers get the tables (default 10 ms; 0..1 min). */
  pause: Schema.optionalWith(
    Options_.duration({ max: Duration.minutes(1), range: "must be between 0 and 1 minute" }),
    { default: () => Duration.millis(10) }
  ),
  /** Table name prefix (default `leasehold_`). */
  prefix: Sql.Prefix,
  /** Count what would go, deleting nothing (default false). */
  dryRun: Schema.optionalWith(Schema.Boolean, { default: () => false })
}) {}

/**
 * Options of `prune`, as callers write them (`RetentionConfig`'s encoded side).
 *
 * @category models
 */
export type Options = typeof RetentionConfig.Encoded

/**
 * Options of `layer`: `prune`'s and how often (`every`, more than zero, finite).
 *
 * @category models
 */
export interface ScheduleOptions extends Options {
  readonly every: Duration.DurationInput
}

/**
 * What a prune deleted (with `dryRun`, would delete) of each kind, and the kinds it skipped: their tables are
 * not in the database.
 *
 * @category models
 */
export interface PruneResult {
  readonly entries: number
  readonly audit: number
  readonly deadLetters: number
  readonly replies: number
  /** Steps of journals whose message is gone. */
  readonly journals: number
  readonly dryRun: boolean
  readonly skipped: ReadonlyArray<Kind>
}

/**
 * The database failed while pruning `kind`; what earlier batches deleted stays deleted.
 *
 * @category errors
 */
export class RetentionStoreError extends Schema.TaggedError<RetentionStoreError>()("RetentionStoreError", {
  kind: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `Retention: pruning ${this.kind} failed in the database: ${String(this.cause)}`
  }
}

/**
 * Rows deleted by retention, tagged by `kind`.
 *
 * @category metrics
 */
export const pruned = counter("leasehold_retention_pruned_total", "Rows deleted by retention, by kind")

const decodeOptions = Options_.classDecoder("Retention.prune", RetentionConfig)

const decodeLayerOptions = Options_.decoder("Retention.layer", {
  ...RetentionConfig.fields,
  every: Options_.duration({ positive: true })
})

/**
 * Prunes once, with `options` (bad ones are a `ParseError` naming them; an `olderThan` under 1 ms or over
 * `maxAge` an `InvalidParameterError` naming it and the bound). `TablesNotFoundError` when the database has none
 * of the tables of the kinds asked for.
 *
 * @category constructors
 */
export const prune = (
  options: Options
): Effect.Effect<
  PruneResult,
  ParseResult.ParseError | InvalidParameterError | RetentionStoreError | TablesNotFoundError,
  SqlClient.SqlClient
> =>
  Effect.flatMap(
    decodeOptions(options),
    (config) => Effect.zipRight(checkAge(config.olderThan, options.olderThan), run(config))
  )

/** Pauses between batches; a zero pause is no sleep at all (and so, under `TestClock`, no wait for `adjust`). */
const between = (pause: Duration.Duration) => Duration.isZero(pause) ? Effect.void : Effect.sleep(pause)

const run = (config: RetentionConfig) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const mergeQueue = mergeQueueNames(config.prefix)
    const tables: Statements.Tables = {
      entries: mergeQueue.entries,
      audit: mergeQueue.audit,
      messages: `${config.prefix}mailbox_messages`,
      deadLetters: `${config.prefix}mailbox_dead_letters`,
      journal: `${config.prefix}mailbox_journal`
    }
    const needs: Record<Kind, string> = {
      entries: tables.entries,
      audit: tables.audit,
      deadLetters: tables.deadLetters,
      replies: tables.messages,
      journals: tables.journal
    }
    const missing = yield* Sql.missingTables(sql, config.kinds.map((kind) => needs[kind])).pipe(
      Effect.mapError((cause) => new RetentionStoreError({ kind: "tables", cause }))
    )
    const skipped = config.kinds.filter((kind) => missing.includes(needs[kind]))
    if (skipped.length === config.kinds.length) {
      return yield* new TablesNotFoundError({ what: "leasehold tables", prefix: config.prefix, missing })
    }
    const statements = Statements.make(
      sql,
      tables,
      // At least 1 (`checkAge`): an age is never rounded down to "everything".
      Math.max(1, Math.round(Duration.toMillis(config.olderThan))),
      Sql.testTime(yield* Effect.clock)
    )
    const limit = config.batchSize
    /** Every row of `kind` (of `queue`) that may go: counted, or deleted batch by batch until a batch comes short. */
    const one = (kind: Kind, queue: string | undefined): Effect.Effect<number, RetentionStoreError> => {
      const store = Sql.mapSqlError((cause) => new RetentionStoreError({ kind, cause }))
      if (config.dryRun) return store(statements.count(kind, queue))
      const loop = (total: number): Effect.Effect<number, RetentionStoreError> =>
        Effect.flatMap(store(statements.prune(kind, queue, limit)), (deleted) =>
          Effect.zipRight(
            Metric.incrementBy(Metric.tagged(pruned, "kind", kind), deleted),
            deleted < limit ? Effect.succeed(total + deleted) : Effect.zipRight(
              between(config.pause),
              Effect.suspend(() => loop(total + deleted))
            )
          ))
      return loop(0)
    }
    const queuesOf = (kind: Kind): Effect.Effect<ReadonlyArray<string | undefined>, RetentionStoreError> =>
      kind === "deadLetters"
        ? Sql.mapSqlError((cause) => new RetentionStoreError({ kind, cause }))(statements.deadLetterQueues)
        : kind === "replies"
        ? Effect.succeed([...new Set(config.replyQueues)])
        : Effect.succeed([undefined])
    const counts: Record<Kind, number> = { entries: 0, audit: 0, deadLetters: 0, replies: 0, journals: 0 }
    for (const kind of config.kinds) {
      if (skipped.includes(kind)) continue
      for (const queue of yield* queuesOf(kind)) counts[kind] += yield* one(kind, queue)
    }
    return { ...counts, dryRun: config.dryRun, skipped } satisfies PruneResult
  }).pipe(Effect.withSpan("Retention.prune", { attributes: { dryRun: config.dryRun } }))

/**
 * Prunes with `options` at start and then every `every`, in the layer's scope (closing it stops the fiber).
 * A failed pass is logged as a warning and the next one runs on time; a pass that deleted something is logged
 * at info with its counts. A database without the tables yet (the services make them when they start) is
 * logged at debug, not as a failure. Bad options are a `ParseError` when the layer is built (an `olderThan`
 * out of `minAge`..`maxAge` an `InvalidParameterError`, as for `prune`).
 *
 * @category layers
 */
export const layer = (
  options: ScheduleOptions
): Layer.Layer<never, ParseResult.ParseError | InvalidParameterError, SqlClient.SqlClient> =>
  Layer.scopedDiscard(Effect.gen(function*() {
    const { every, ...fields } = yield* decodeLayerOptions(options)
    yield* checkAge(fields.olderThan, options.olderThan)
    const config = new RetentionConfig(fields, true)
    const pass = run(config).pipe(
      Effect.flatMap((result) => {
        const total = result.entries + result.audit + result.deadLetters + result.replies + result.journals
        return total === 0 ? Effect.void : Effect.logInfo("Retention pruned old rows").pipe(
          Effect.annotateLogs({
            entries: result.entries,
            audit: result.audit,
            deadLetters: result.deadLetters,
            replies: result.replies,
            journals: result.journals
          })
        )
      }),
      Effect.catchTag("TablesNotFoundError", (error) => Effect.logDebug(error.message)),
      Effect.catchAllCause((cause) => Effect.logWarning("Retention pass failed; the next one runs on schedule", cause))
    )
    yield* pass.pipe(
      Effect.repeat(Schedule.spaced(every)),
      Effect.annotateLogs({ module: "Retention", fiber: "retention" }),
      Effect.interruptible,
      Effect.forkScoped
    )
  }))
