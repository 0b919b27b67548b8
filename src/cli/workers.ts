/**
 * `leasehold workers`: the worker processes of a database (the mailbox's workers table), each with its loops —
 * queue, state, the message in hand and the heartbeat's age — and the verdicts: a loop whose heartbeat is older
 * than `--stalled-after` is STALLED, a process whose row was not refreshed for longer than `--lost-after` is LOST
 * (both judged by the database's clock). Exit 0 whatever the verdicts: it reports, `leasehold health` judges.
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { InvalidParameterError } from "../Errors.js"
import * as StoredTime from "../internal/storedTime.js"
import type * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import { db, json, prefix, withDatabase } from "./database.js"
import { print } from "./output.js"
import { table } from "./table.js"

const stalledAfter = Options.text("stalled-after").pipe(
  Options.withDescription(
    "A loop whose heartbeat is older than this is STALLED, e.g. \"2 minutes\" (default " +
      "LEASEHOLD_WORKER_STALLED_AFTER, else 60 s)."
  ),
  Options.optional
)
const lostAfter = Options.text("lost-after").pipe(
  Options.withDescription(
    "A process not refreshed for longer than this is LOST (default LEASEHOLD_WORKER_LOST_AFTER, else 30 s)."
  ),
  Options.optional
)

/** Loaded when the command runs, so that `--help` does not load the SQL mailbox. */
const admin = Effect.promise(() => import("../MailboxSqlAdmin.js"))

const seconds = (duration: Duration.Duration) => `${(Duration.toMillis(duration) / 1000).toFixed(1)} s`

/** A process as plain JSON. */
export const workerJson = (worker: MailboxSqlAdmin.WorkerProcess) => ({
  process: worker.process,
  instance: Option.getOrNull(worker.instance),
  name: Option.getOrNull(worker.name),
  startedAt: StoredTime.json(worker.startedAt),
  version: worker.version,
  refreshedAt: StoredTime.json(worker.refreshedAt),
  lost: worker.lost,
  loops: worker.loops.map((loop) => ({
    name: loop.name,
    queue: loop.queue,
    state: loop.state,
    messageId: Option.getOrNull(loop.messageId),
    heartbeatAgeMillis: Duration.toMillis(loop.heartbeatAge),
    stalled: loop.stalled
  }))
})

const text = (workers: ReadonlyArray<MailboxSqlAdmin.WorkerProcess>) =>
  workers.length === 0 ? "no worker processes (workers register while a SQL mailbox of theirs is open)" : table(
    ["process", "instance", "name", "version", "loop", "queue", "state", "message", "heartbeat"],
    workers.flatMap((worker) => {
      const head = [
        worker.lost ? `${worker.process} LOST` : worker.process,
        // A row of the previous release has none (it is keyed by host:pid alone).
        Option.getOrElse(worker.instance, () => "-"),
        Option.getOrElse(worker.name, () => "-"),
        worker.version
      ]
      if (worker.loops.length === 0) return [[...head, "-", "-", "-", "-", "-"]]
      return worker.loops.map((loop, i) => [
        ...(i === 0 ? head : ["", "", "", ""]),
        loop.name,
        loop.queue,
        loop.state,
        Option.getOrElse(loop.messageId, () => "-"),
        loop.state === "stopped" ? "-" : `${seconds(loop.heartbeatAge)}${loop.stalled ? " STALLED" : ""}`
      ])
    })
  )

export const command = Command.make("workers", { db, json, prefix, stalledAfter, lostAfter }, (options) =>
  admin.pipe(
    Effect.flatMap((MailboxSqlAdmin) => MailboxSqlAdmin.workers({ prefix: options.prefix, create: false })),
    Effect.flatMap((workers) =>
      workers.list({
        // Checked by `list` (a bad one is an InvalidParameterError naming it: a usage error).
        stalledAfter: Option.getOrUndefined(options.stalledAfter) as Duration.DurationInput | undefined,
        lostAfter: Option.getOrUndefined(options.lostAfter) as Duration.DurationInput | undefined
      })
    ),
    // The thresholds came from the flags: named as the flags.
    Effect.mapError((error) =>
      error instanceof InvalidParameterError
        ? new InvalidParameterError({
          parameter: error.parameter === "stalledAfter" ? "--stalled-after" : "--lost-after",
          value: error.value,
          reason: error.reason
        })
        : error
    ),
    Effect.flatMap((workers) => print(options.json, workers.map(workerJson), () => text(workers))),
    withDatabase(Option.getOrUndefined(options.db))
  )).pipe(
    Command.withDescription(
      "The worker processes and their loops: queue, state, message in hand, heartbeat age (STALLED, LOST).\n" +
        "Example: leasehold workers --db ./.leasehold/demo.db"
    )
  )
