/**
 * `leasehold queue …`: look at and repair a merge queue from the shell —
 * `status` (the lock and what recovery would do), `list` (entries in queue
 * order), `recover` (run self-healing now) and `stats` (counts by status).
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Statuses from "../internal/mergeQueue/statuses.js"
import type * as MergeQueue from "../MergeQueue.js"
import { db, json, limit as limitOption, prefix, withDatabase } from "./database.js"
import { print } from "./output.js"
import { ago, pairs, table } from "./table.js"

// Plain data, so that `--help` does not load the merge queue (its commands load it when they run).
const statuses = Statuses.statuses
const inProgress = Statuses.inProgress

const iso = (time: DateTime.Utc) => DateTime.formatIso(time)
const optional = <A, B>(option: Option.Option<A>, f: (a: A) => B) => Option.getOrNull(Option.map(option, f))

/** An entry as plain JSON. */
export const entryJson = (entry: MergeQueue.QueueEntry) => ({
  id: entry.id,
  workspace: entry.workspace,
  beadId: Option.getOrNull(entry.beadId),
  priority: entry.priority,
  status: entry.status,
  agentId: Option.getOrNull(entry.agentId),
  fencingToken: Option.getOrNull(entry.fencingToken),
  startedAt: optional(entry.startedAt, iso),
  stateChangedAt: iso(entry.stateChangedAt),
  createdAt: iso(entry.createdAt),
  attemptCount: entry.attemptCount,
  lastError: Option.getOrNull(entry.lastError)
})

const lockJson = (lock: Option.Option<MergeQueue.ProcessingLock>, now: number) =>
  optional(lock, (held) => ({
    agentId: held.agentId,
    fencingToken: held.fencingToken,
    acquiredAt: iso(held.acquiredAt),
    expiresAt: iso(held.expiresAt),
    stale: DateTime.toEpochMillis(held.expiresAt) < now
  }))

const recoveryJson = (stats: MergeQueue.RecoveryStats) => ({
  locksCleaned: stats.locksCleaned,
  entriesReclaimed: stats.entriesReclaimed,
  recoveryTimestamp: iso(stats.recoveryTimestamp)
})

const lockLine = (lock: Option.Option<MergeQueue.ProcessingLock>, now: number) =>
  Option.match(lock, {
    onNone: () => "free",
    onSome: (held) => {
      const expires = DateTime.toEpochMillis(held.expiresAt)
      return `${held.agentId} (token ${held.fencingToken}), ${expires < now ? "STALE: expired" : "expires"} ${
        ago(expires, now)
      }`
    }
  })

const common = { db, json, prefix }

const withQueue = <A, E>(
  options: { readonly db: Option.Option<string>; readonly prefix: string },
  body: (queue: MergeQueue.MergeQueueService) => Effect.Effect<A, E>
) =>
  // A look: a command opens the queue that is there, at whatever version, and never makes one (a wrong --db or
  // --prefix says so instead).
  Effect.promise(() => import("../internal/mergeQueue/look.js")).pipe(
    Effect.flatMap(({ look }) => look({ prefix: options.prefix })),
    Effect.flatMap(body),
    withDatabase(Option.getOrUndefined(options.db))
  )

const status = Command.make("status", common, (options) =>
  withQueue(options, (queue) =>
    Effect.gen(function*() {
      const stats = yield* queue.stats
      const recovery = yield* queue.getRecoveryStats
      const now = yield* Clock.currentTimeMillis
      const active = inProgress.reduce((sum, status) => sum + stats.byStatus[status], 0)
      yield* print(options.json, {
        lock: lockJson(stats.lock, now),
        pending: stats.byStatus.pending,
        inProgress: active,
        oldestPendingAt: optional(stats.oldestPendingAt, iso),
        wouldRecover: { locks: recovery.locksCleaned, entries: recovery.entriesReclaimed }
      }, () =>
        pairs([
          ["lock", lockLine(stats.lock, now)],
          ["pending", String(stats.byStatus.pending)],
          ["in progress", String(active)],
          [
            "oldest pending",
            Option.match(stats.oldestPendingAt, {
              onNone: () => "-",
              onSome: (at) => ago(DateTime.toEpochMillis(at), now)
            })
          ],
          [
            "stale",
            recovery.locksCleaned + recovery.entriesReclaimed === 0
              ? "nothing to recover"
              : `${recovery.locksCleaned} expired lock, ${recovery.entriesReclaimed} stuck entries ` +
                "(run `leasehold queue recover`, or let the next claim heal them)"
          ]
        ]))
    }))).pipe(
    Command.withDescription(
      "Who holds the processing lock, how much is waiting, and whether anything is stale.\n" +
        "Example: leasehold queue status --db ./.leasehold/demo.db"
    )
  )

const statusFilter = Options.choice("status", statuses).pipe(
  Options.withDescription("Only entries in this status (repeatable)."),
  Options.repeated,
  // Optional: shown as such in the usage.
  Options.withDefault([])
)
const limit = limitOption("At most this many entries").pipe(Options.optional)

const list = Command.make(
  "list",
  { ...common, status: statusFilter, limit },
  (options) =>
    withQueue(options, (queue) =>
      Effect.gen(function*() {
        const entries = yield* queue.list({
          status: options.status.length === 0 ? undefined : options.status,
          limit: Option.getOrUndefined(options.limit)
        })
        const now = yield* Clock.currentTimeMillis
        yield* print(options.json, entries.map(entryJson), () =>
          entries.length === 0 ? "no entries" : table(
            ["id", "workspace", "priority", "status", "agent", "token", "attempts", "changed"],
            entries.map((entry) => [
              String(entry.id),
              entry.workspace,
              String(entry.priority),
              entry.status,
              Option.getOrElse(entry.agentId, () => "-"),
              Option.match(entry.fencingToken, { onNone: () => "-", onSome: String }),
              String(entry.attemptCount),
              ago(DateTime.toEpochMillis(entry.stateChangedAt), now)
            ])
          ))
      }))
).pipe(
  Command.withDescription(
    "Entries in the order they will be served (priority, then age).\n" +
      "Example: leasehold queue list --db ./.leasehold/demo.db --status pending --limit 20"
  )
)

const recover = Command.make(
  "recover",
  common,
  (options) =>
    withQueue(
      options,
      (queue) =>
        Effect.flatMap(queue.detectAndRecoverStale, (stats) =>
          print(options.json, recoveryJson(stats), () =>
            `cleared ${stats.locksCleaned} expired lock(s), returned ${stats.entriesReclaimed} stuck entr${
              stats.entriesReclaimed === 1 ? "y" : "ies"
            } to pending`))
    )
).pipe(
  Command.withDescription(
    "Self-heal now: clear an expired lock and return stuck in-progress entries to pending. Safe to repeat; " +
      "never touches an entry whose agent still holds a live lock.\n" +
      "Example: leasehold queue recover --db postgres://user@host/db"
  )
)

const stats = Command.make("stats", common, (options) =>
  withQueue(options, (queue) =>
    Effect.gen(function*() {
      const stats = yield* queue.stats
      const recovery = yield* queue.getRecoveryStats
      const now = yield* Clock.currentTimeMillis
      yield* print(options.json, {
        total: stats.total,
        byStatus: stats.byStatus,
        lock: lockJson(stats.lock, now),
        recovery: recoveryJson(recovery)
      }, () =>
        table(
          ["status", "entries"],
          [...statuses.map((status) => [status, String(stats.byStatus[status])]), [
            "total",
            String(stats.total)
          ]]
        ))
    }))).pipe(
    Command.withDescription(
      "Entry counts by status.\nExample: leasehold queue stats --db ./.leasehold/demo.db --json"
    )
  )

/** `leasehold queue`. */
export const command = Command.make("queue").pipe(
  Command.withDescription("Inspect and repair a merge queue (SQLite file or PostgreSQL)."),
  Command.withSubcommands([status, list, recover, stats])
)
