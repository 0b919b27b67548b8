/**
 * What the demo reports: the summary it returns (and prints under `--json`),
 * the sentence saying what the run proved, and the summary as a table.
 */
import * as Option from "effect/Option"
import * as Ledger from "./ledger.js"

/** The worker killed mid-run, and what became of the requests it held. */
export interface Kill {
  readonly worker: string
  readonly pid: number
  /** The requests it held leased when it died (read from the database once it was gone). */
  readonly held: Ledger.Ids
  /** How many of them other workers answered or dead-lettered. */
  readonly finishedElsewhere: number
}

/** What the demo saw: every sent request id is in exactly one of answered, dead-lettered, left queued or lost. */
export interface DemoSummary {
  readonly requests: number
  /** Replies read (and acknowledged): more than `answered.count` when a request was answered twice. */
  readonly replies: number
  readonly answered: Ledger.Ids
  /** Of the answered requests (their first reply): succeeded, ended by a deadline, failed otherwise. */
  readonly succeeded: number
  readonly deadlineErrors: number
  readonly otherErrors: number
  readonly deadLettered: Ledger.Ids
  readonly leftQueued: Ledger.Ids
  readonly lost: Ledger.Ids
  readonly duplicated: Ledger.Ids
  readonly doublySettled: Ledger.Ids
  readonly unknown: Ledger.Ids
  /** Nothing lost, nothing settled twice, no reply for an id never sent: the exit code's verdict. */
  readonly accountedFor: boolean
  readonly redelivered: number
  readonly executedMoreThanOnce: number
  readonly workers: number
  readonly killed: Option.Option<Kill>
  /** Why no worker was killed, when none was. */
  readonly notKilled: Option.Option<string>
  readonly workLease: { readonly domains: number; readonly offsets: number; readonly inOrder: boolean }
  readonly mergeQueue: { readonly merged: number; readonly entries: number; readonly healed: number }
  readonly interrupted: boolean
  readonly healthUrl: string | undefined
  readonly database: string
  readonly seconds: number
  /** What the run proved, in a sentence (or what it failed to). */
  readonly proved: string
}

/** The dead letter the demo files on purpose: a body an older version wrote, which no longer decodes. */
export const corruptId = "corrupt-demo"

/** `1 request`, `2 requests`. */
export const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`

/** What the run proved, or, when something is unaccounted for, what went wrong, by id. */
export const proof = (summary: Omit<DemoSummary, "proved">): string => {
  if (!summary.accountedFor) {
    const wrong = [
      summary.lost.count > 0 ? `${Ledger.describe(summary.lost)} lost` : undefined,
      summary.doublySettled.count > 0
        ? `${Ledger.describe(summary.doublySettled)} settled twice`
        : undefined,
      summary.unknown.count > 0 ? `${Ledger.describe(summary.unknown)} settled but never sent` : undefined
    ].filter((part) => part !== undefined)
    return `NOT PROVED: of ${summary.requests} requests, ${wrong.join("; ")}.`
  }
  const answered = summary.duplicated.count === 0
    ? "answered exactly once"
    : `answered (${Ledger.describe(summary.duplicated)} more than once, which at-least-once allows)`
  const unplanned = summary.deadLettered.ids.filter((id) => id !== corruptId)
  const letters = unplanned.length === 0 && summary.deadLettered.count <= 1
    ? `dead-lettered on purpose${Ledger.named(summary.deadLettered.ids)}`
    : `dead-lettered (${Ledger.describe(summary.deadLettered)}, not all on purpose)`
  const queued = summary.leftQueued.count > 0 ? `, or left queued by the interruption` : ""
  const crash = Option.match(summary.killed, {
    onNone: () =>
      `no worker was killed, so this run shows no crash survived: ${Option.getOrElse(summary.notKilled, () => "")}`,
    onSome: (kill) =>
      kill.held.count === 0
        ? `${kill.worker} was SIGKILLed but held no request at that instant, so no crash recovery was exercised`
        : `${kill.worker} was SIGKILLed with ${plural(kill.held.count, "request")} leased${
          Ledger.named(kill.held.ids, kill.held.count)
        }, ${
          kill.finishedElsewhere === kill.held.count
            ? kill.held.count === 1 ? "finished elsewhere" : "all finished elsewhere"
            : `${kill.finishedElsewhere} finished elsewhere, the rest left queued`
        }`
  })
  return `Proved: every one of ${summary.requests} requests was ${answered} or ${letters}${queued}; ${crash}.`
}

/** The summary as a table, then what it proved. */
export const format = (summary: DemoSummary): string => {
  const rows: Array<[string, string]> = [
    ["requests", `${summary.requests}, each matched by id to its replies, dead letters or place in the queue`],
    [
      "answered",
      `${summary.answered.count} (${summary.succeeded} ok, ${summary.deadlineErrors} deadline error, ` +
      `${summary.otherErrors} other errors); ${summary.replies} replies read and acknowledged`
    ],
    ["dead-lettered", Ledger.describe(summary.deadLettered)],
    ["left queued", Ledger.describe(summary.leftQueued)],
    ["lost", Ledger.describe(summary.lost)],
    ["answered more than once", `${Ledger.describe(summary.duplicated)} (at-least-once allows it)`],
    ["settled twice", `${Ledger.describe(summary.doublySettled)} (answered and dead-lettered, or dead-lettered twice)`],
    ...(summary.unknown.count > 0
      ? [["settled, never sent", Ledger.describe(summary.unknown)] as [string, string]]
      : []),
    ["redelivered after the crash", `${summary.redelivered} answered on a later delivery`],
    ["executed more than once", `${summary.executedMoreThanOnce} (at-least-once: allowed, never lost)`],
    [
      "workers",
      `${summary.workers}, ${
        Option.match(summary.killed, {
          onNone: () => `none killed: ${Option.getOrElse(summary.notKilled, () => "")}`,
          onSome: (k) =>
            `${k.worker} killed with SIGKILL holding ${plural(k.held.count, "request")}${
              Ledger.named(k.held.ids, k.held.count)
            }, ${k.finishedElsewhere} finished elsewhere`
        })
      }`
    ],
    [
      "work lease",
      summary.interrupted
        ? "skipped (interrupted)"
        : `${summary.workLease.offsets} offsets over ${summary.workLease.domains} domains, order ${
          summary.workLease.inOrder ? "kept" : "BROKEN"
        } (WorkLeaseSql on the database)`
    ],
    [
      "merge queue",
      summary.interrupted
        ? "skipped (interrupted)"
        : `${summary.mergeQueue.merged}/${summary.mergeQueue.entries} merged, ${summary.mergeQueue.healed} healed after a crash`
    ],
    ["database", summary.database],
    ["health served at", `${summary.healthUrl ?? "-"} (/health/live, /health/ready, /metrics)`],
    ["time", `${summary.seconds} s`]
  ]
  const width = Math.max(...rows.map(([label]) => label.length))
  return `${rows.map(([label, value]) => `${label.padEnd(width)}  ${value}`).join("\n")}\n\n${summary.proved}`
}
