/**
 * The soak's checker: reads a run's histories (every process's `*.jsonl`, see history.ts) and what the
 * orchestrator read from the database after the drain (`db.json`, a `Dump`), and judges each property leasehold
 * promises, Jepsen-style — from the record of what happened, not from what the processes said about
 * themselves. It is a pure function of the directory, so a kept directory can be checked again
 * (`npm run soak -- --check DIR`) and its self-test (selfTest.ts) can feed it copies with bugs injected.
 *
 * The properties, and what "explained" means for a duplicate, are in docs/reliability.md; the rules are
 * written once here, next to each check.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import type { Event, EventOf, Kind } from "./history.js"
import * as History from "./history.js"

// ---------------------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------------------

/** A message left in a queue after the drain. */
export interface RemainingMessage {
  readonly queue: string
  readonly id: string
  readonly state: string
  readonly deliveryCount: number
  readonly requestId?: string | undefined
}

/** A row of the dead-letter table. */
export interface DeadLetterRow {
  readonly id: string
  readonly queue: string
  readonly requestId?: string | undefined
  readonly errorTag: string
  readonly deliveryCount: number
}

/** A merge-queue entry after the drain. */
export interface MergeEntry {
  readonly id: number
  readonly workspace: string
  readonly status: string
}

/** A row of the merge queue's audit log (the order of `id` is the order things happened in). */
export interface AuditRow {
  readonly id: number
  readonly at: number
  readonly action: string
  readonly agentId?: string | undefined
  readonly entryId?: number | undefined
  readonly fencingToken?: number | undefined
  readonly fromStatus?: string | undefined
  readonly toStatus?: string | undefined
  readonly detail?: string | undefined
}

/** A fenced write the resource table accepted (`seq`: commit order), and the resource rows at the end. */
export interface ResourceWrite {
  readonly seq: number
  readonly domain: string
  readonly offset: number
  readonly fencing: number
  readonly proc: string
}

/** What the orchestrator read from the database after the drain. */
export interface Dump {
  readonly remaining: ReadonlyArray<RemainingMessage>
  readonly deadLetters: ReadonlyArray<DeadLetterRow>
  readonly mergeEntries: ReadonlyArray<MergeEntry>
  readonly audit: ReadonlyArray<AuditRow>
  /** Work leases (property 7), when the run had them. */
  readonly leases?: {
    readonly writes: ReadonlyArray<ResourceWrite>
    readonly offsets: Readonly<Record<string, number>>
    /** Offsets per domain the lease table reports processed (terminal), and the ones still leased or queued. */
    readonly pending: Readonly<Record<string, number>>
  } | undefined
}

/** The run's settings the rules depend on (recorded by the orchestrator's `config` event). */
export interface Settings {
  readonly backend: string
  readonly seed: number
  readonly seconds: number
  readonly visibilityMs: number
  readonly extenderIntervalMs: number
  readonly extensionMs: number
  readonly shutdownTimeoutMs: number
  readonly maxDeliveryCount: number
  readonly leaseTimeoutMs?: number
  readonly leaseMaxRetries?: number
  readonly replay?: string
  readonly commit?: string
}

/** What a SIGTERM'd process may take beyond its shutdown timeout to exit (closing pools, Node's teardown). */
export const exitMarginMs = 3_000

// ---------------------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------------------

/** One property's verdict, with the figures behind it and (when it fails) the first pieces of evidence. */
export interface Verdict {
  readonly id: number
  readonly name: string
  readonly status: "PASS" | "FAIL" | "SKIP"
  readonly summary: string
  readonly evidence: ReadonlyArray<string>
}

/** The checker's answer. */
export interface Report {
  readonly settings: Settings
  readonly figures: ReadonlyArray<readonly [string, string]>
  readonly verdicts: ReadonlyArray<Verdict>
  readonly pass: boolean
}

const EVIDENCE = 8

const percentile = (values: ReadonlyArray<number>, p: number): number | undefined => {
  if (values.length === 0) return undefined
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]
}
const ms = (value: number | undefined) => (value === undefined ? "–" : `${Math.round(value)} ms`)
const spread = (values: ReadonlyArray<number>) =>
  values.length === 0
    ? "none"
    : `p50 ${ms(percentile(values, 50))}, p99 ${ms(percentile(values, 99))}, max ${
      ms(Math.max(...values))
    } (n=${values.length})`

// ---------------------------------------------------------------------------------------------------------
// The run's timeline: attempts, faults, outages
// ---------------------------------------------------------------------------------------------------------

/** One attempt of a request on one worker loop. */
interface Attempt {
  readonly proc: string
  readonly loop: number
  readonly requestId: string
  readonly attempt: number
  readonly kind: Kind
  readonly start: number
  readonly beats: Array<number>
  end?: { readonly t: number; readonly outcome: "success" | "failure" | "interrupted" } | undefined
}

interface Interval {
  readonly from: number
  readonly to: number
}

const overlaps = (a: Interval, b: Interval) => a.from <= b.to && b.from <= a.to

/** Everything the rules look up, built once from the events. */
const timeline = (events: ReadonlyArray<Event>, backend: string | undefined) => {
  const of = <K extends Event["ev"]>(ev: K) => events.filter((e): e is EventOf<K> => e.ev === ev)
  const attempts = new Map<string, Attempt>()
  const byRequest = new Map<string, Array<Attempt>>()
  const key = (e: { proc: string; loop: number; requestId: string; attempt: number }) =>
    `${e.proc}|${e.loop}|${e.requestId}|${e.attempt}`
  for (const e of events) {
    if (e.ev === "start") {
      const a: Attempt = { ...e, start: e.t, beats: [] }
      attempts.set(key(e), a)
      byRequest.set(e.requestId, [...(byRequest.get(e.requestId) ?? []), a])
    } else if (e.ev === "beat") attempts.get(key(e))?.beats.push(e.t)
    else if (e.ev === "end") {
      const a = attempts.get(key(e))
      if (a !== undefined && a.end === undefined) a.end = { t: e.t, outcome: e.outcome }
    }
  }
  // Claim order is the delivery count, not the time an attempt was logged: a worker stopped between its claim
  // and its `start` event logs the start late, possibly after the attempt that followed it.
  for (const list of byRequest.values()) list.sort((a, b) => a.attempt - b.attempt || a.start - b.start)

  // Signals the orchestrator sent, per target; SIGSTOP…SIGCONT intervals.
  const signals = of("signal")
  const signalsTo = (proc: string) => signals.filter((s) => s.target === proc)
  const stopped = new Map<string, Array<Interval>>()
  for (const s of signals) {
    if (s.signal !== "SIGSTOP") continue
    const cont = signals.find((c) => c.target === s.target && c.signal === "SIGCONT" && c.t >= s.t)
    stopped.set(s.target, [...(stopped.get(s.target) ?? []), { from: s.t, to: cont?.t ?? Infinity }])
  }
  const exits = of("exit")
  const exitOf = (proc: string) => exits.find((e) => e.target === proc)

  // Database outages: PostgreSQL stopped…started, the SQLite write lock held…released (from the holder's file).
  const outages: Array<
    Interval & { readonly kind: "pg-restart" | "sqlite-lock" | "sqlite-stopped-writer"; readonly by?: string }
  > = []
  for (const stop of of("pg-stop")) {
    const start = events.find((e) => e.ev === "pg-start" && e.t >= stop.t)
    outages.push({ kind: "pg-restart", from: stop.t, to: start?.t ?? Infinity })
  }
  for (const held of of("sqlite-lock-held")) {
    const released = events.find((e) => e.ev === "sqlite-lock-released" && e.proc === held.proc && e.t >= held.t)
    outages.push({ kind: "sqlite-lock", from: held.t, to: released?.t ?? Infinity })
  }
  // On SQLite every process of the fleet writes to the one file: one stopped (SIGSTOP) inside a write
  // transaction holds the file's write lock until it is resumed, which stalls every other writer — the
  // nemesis's lock held by a process nobody lets run. Whether it was inside one cannot be told from outside, so
  // each stop of any process counts as a possible outage for the others (the 10-minute SQLite run at c493e72
  // showed three such duplicates: holders blocked, their acknowledgements too late, while another worker sat
  // stopped in the middle of its write).
  if (backend === "sqlite") {
    for (const [target, intervals] of stopped) {
      for (const interval of intervals) outages.push({ kind: "sqlite-stopped-writer", ...interval, by: target })
    }
  }
  return { of, attempts, byRequest, signals, signalsTo, stopped, exits, exitOf, outages }
}

type Timeline = ReturnType<typeof timeline>

/** Milliseconds of [from, to] during which some outage lasted (overlapping outages counted once). */
const downtime = (outages: ReadonlyArray<Interval>, from: number, to: number): number => {
  const clipped = outages
    .map((o) => ({ from: Math.max(o.from, from), to: Math.min(o.to, to) }))
    .filter((o) => o.to > o.from)
    .sort((a, b) => a.from - b.from)
  let total = 0
  let reached = from
  for (const o of clipped) {
    const start = Math.max(o.from, reached)
    if (o.to > start) total += o.to - start
    reached = Math.max(reached, o.to)
  }
  return total
}

// ---------------------------------------------------------------------------------------------------------
// Property 3: duplicates and their explanations
// ---------------------------------------------------------------------------------------------------------

/**
 * Why a later attempt B of a request started after attempt A. Not duplicates: `retry` (A failed and the
 * policy retries: the loop nacked it with backoff) and `handed-back` (A was interrupted by its worker's
 * SIGTERM drain running out of time: the loop nacked it at once). Every other B is a duplicate.
 *
 * A held the request from its start until it was settled; a settle lands within the visibility after the
 * attempt ends (the loop replies and acknowledges at once, in the background), so A's *holding span* is
 * [A.start − visibility, min(B.start, A.end + visibility)] — up to B.start when A never ended (the claim
 * that began A's lease is not logged: it came at most a visibility timeout before A's start). A duplicate is explained
 * by the first that applies of:
 * - `SIGKILL`: A's worker was killed within the holding span;
 * - `SIGSTOP`: A's worker was stopped during the holding span;
 * - `pg-restart` / `sqlite-lock` / `sqlite-stopped-writer`: the database was down (PostgreSQL stopped, the
 *   SQLite write lock held by another process, or — on SQLite — another process of the fleet stopped, which
 *   holds the write lock if it was stopped inside a write) during the holding span, and B started after the
 *   outage began — the holder had to extend or acknowledge while it could not;
 * - `holder-silent`: A had not ended when B started and its last sign of life (start or beat) was at least
 *   `extension − interval` before B — the shortest lease a beat leaves, so the holder had stopped proving
 *   progress (its process starved of CPU);
 * else it is `unexplained`: a redelivery while the holder was alive, not stopped, beating, and the database up.
 */
export type Cause =
  | "retry"
  | "handed-back"
  | "SIGKILL"
  | "SIGSTOP"
  | "pg-restart"
  | "sqlite-lock"
  | "sqlite-stopped-writer"
  | "holder-silent"
  | "unexplained"

/** The span during which A held the request (see `Cause`). */
const holding = (settings: Settings, a: Attempt, b: Attempt): Interval => ({
  // A's start is logged after its claim, which is not logged: the lease began up to a visibility timeout before
  // (a claim further back would have lapsed before the work started: a stop between the claim and the start
  // — the 10-minute PostgreSQL run at c493e72 caught a SIGSTOP that ended 4 ms before the start was logged).
  // If A's worker was stopped in between, its start may even be logged after B's.
  from: Math.min(a.start - settings.visibilityMs, b.start),
  to: a.end === undefined ? b.start : Math.min(b.start, a.end.t + settings.visibilityMs)
})

const classify = (
  line: Timeline,
  settings: Settings,
  a: Attempt,
  b: Attempt
): Cause => {
  if (a.end !== undefined && a.end.t <= b.start) {
    if (a.end.outcome === "failure") {
      // The policy: poison is dead-lettered at once (its tag is included); anything else below maxDeliveryCount
      // is nacked with backoff. A dead-lettered request that comes back is a duplicate, not a retry.
      const deadLettered = a.kind === "poison" || a.attempt >= settings.maxDeliveryCount
      if (!deadLettered) return "retry"
    }
    if (a.end.outcome === "interrupted") {
      const terminated = line.signalsTo(a.proc).some((s) => s.signal === "SIGTERM" && s.t <= a.end!.t)
      if (terminated) return "handed-back"
    }
  }
  const span = holding(settings, a, b)
  const signals = line.signalsTo(a.proc)
  if (signals.some((s) => s.signal === "SIGKILL" && s.t >= span.from && s.t <= span.to)) return "SIGKILL"
  if ((line.stopped.get(a.proc) ?? []).some((stop) => overlaps(stop, span))) return "SIGSTOP"
  const outage = line.outages.find((o) => overlaps(o, span) && b.start >= o.from)
  if (outage !== undefined) return outage.kind
  if (a.end === undefined || a.end.t > b.start) {
    const life = [a.start, ...a.beats.filter((t) => t <= b.start)]
    const last = Math.max(...life)
    if (b.start - last >= settings.extensionMs - settings.extenderIntervalMs) return "holder-silent"
  }
  return "unexplained"
}

// ---------------------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------------------

/** Judges a run from its events and its database dump. */
export const judge = (events: ReadonlyArray<Event>, dump: Dump, unreadable = 0): Report => {
  const configEvent = events.find((e): e is EventOf<"config"> => e.ev === "config")
  const settings = (configEvent?.config ?? {}) as unknown as Settings
  const line = timeline(events, settings.backend)
  const figures: Array<readonly [string, string]> = []
  const verdicts: Array<Verdict> = []
  const verdict = (id: number, name: string, failures: ReadonlyArray<string>, summary: string, skip = false) =>
    verdicts.push({
      id,
      name,
      status: skip ? "SKIP" : failures.length === 0 ? "PASS" : "FAIL",
      summary: failures.length === 0 ? summary : `${summary}; ${failures.length} failure(s)`,
      evidence: failures.slice(0, EVIDENCE)
    })

  // Requests the producer sent (stored), and the ones whose send failed (maybe stored).
  const sends = new Map(line.of("send").map((e) => [e.requestId, e]))
  const sent = new Map(line.of("sent").map((e) => [e.requestId, e]))
  const ambiguous = new Set(line.of("send-failed").map((e) => e.requestId))
  const replies = new Map<string, Map<string, EventOf<"reply">>>()
  for (const r of line.of("reply")) {
    const byMessage = replies.get(r.requestId) ?? new Map<string, EventOf<"reply">>()
    byMessage.set(r.messageId, r)
    replies.set(r.requestId, byMessage)
  }
  const deadLettered = new Map<string, Array<DeadLetterRow>>()
  for (const row of dump.deadLetters) {
    if (row.requestId === undefined) continue
    deadLettered.set(row.requestId, [...(deadLettered.get(row.requestId) ?? []), row])
  }
  const remainingRequests = new Set(dump.remaining.flatMap((m) => (m.requestId === undefined ? [] : [m.requestId])))

  // --- 1. No loss ------------------------------------------------------------------------------------------
  {
    const failures: Array<string> = []
    let completed = 0
    let meantDead = 0
    let lost = 0
    const kinds: Record<string, number> = {}
    for (const [requestId] of sent) {
      const send = sends.get(requestId)
      const kind = send?.kind ?? "fast"
      kinds[kind] = (kinds[kind] ?? 0) + 1
      const attempts = line.byRequest.get(requestId) ?? []
      const succeeded = attempts.some((a) => a.end?.outcome === "success")
      const dead = deadLettered.has(requestId)
      const meant = kind === "poison" || kind === "stubborn"
      if ((deadLettered.get(requestId)?.length ?? 0) > 1) {
        failures.push(`${requestId} (${kind}): dead-lettered ${deadLettered.get(requestId)!.length}×`)
      }
      if (meant) {
        if (dead) meantDead++
        else if (!remainingRequests.has(requestId)) {
          lost++
          failures.push(`${requestId} (${kind}): not in the dead letters and not in the queue — lost`)
        }
      } else if (dead) {
        failures.push(`${requestId} (${kind}): dead-lettered, though it was not meant to be`)
      } else if (succeeded) completed++
      else if (!remainingRequests.has(requestId)) {
        lost++
        failures.push(
          `${requestId} (${kind}): no attempt succeeded and it is not in the queue — lost ` +
            `(attempts: ${
              attempts.map((a) => `${a.proc}#${a.attempt} ${a.end?.outcome ?? "no end"}`).join(", ") || "none"
            })`
        )
      }
    }
    figures.push(["sent (stored)", `${sent.size} (${Object.entries(kinds).map(([k, n]) => `${k} ${n}`).join(", ")})`])
    const storedAnyway = [...ambiguous].filter((id) => line.byRequest.has(id) || replies.has(id)).length
    figures.push([
      "sends that failed (maybe stored, retried under a new id)",
      `${ambiguous.size} (${storedAnyway} of them stored after all: a worker ran them)`
    ])
    figures.push(["completed", `${completed}`])
    figures.push(["dead-lettered as meant (poison, stubborn)", `${meantDead}`])
    figures.push(["lost", `${lost}`])
    verdict(
      1,
      "no loss: every request completed, or is in the dead letters because it was meant to be",
      failures,
      `${sent.size} sent, ${completed} completed, ${meantDead} dead-lettered as meant, ${lost} lost`
    )
  }

  // --- 2. Exactly one reply per request that asked for one -----------------------------------------------
  {
    const failures: Array<string> = []
    let expected = 0
    let received = 0
    for (const [requestId] of sent) {
      const send = sends.get(requestId)
      const got = [...(replies.get(requestId)?.values() ?? [])]
      received += got.length
      if (send?.wantsReply !== true) {
        if (got.length > 0) failures.push(`${requestId}: ${got.length} reply(ies), though it asked for none`)
        continue
      }
      expected++
      if (got.length === 0) {
        if (!remainingRequests.has(requestId)) failures.push(`${requestId} (${send.kind}): no reply`)
      } else if (got.length > 1) {
        failures.push(
          `${requestId} (${send.kind}): ${got.length} replies (${
            got.map((r) => `${r.success ? "ok" : `error ${r.errorTag ?? ""}`} ${r.messageId}`).join(", ")
          })`
        )
      } else {
        const meantToFail = send.kind === "poison" || send.kind === "stubborn"
        if (got[0]!.success === meantToFail) {
          failures.push(`${requestId} (${send.kind}): a ${got[0]!.success ? "success" : "error"} reply`)
        }
      }
    }
    for (const [requestId, got] of replies) {
      if (sent.has(requestId)) continue
      if (ambiguous.has(requestId) && got.size <= 1) continue
      failures.push(`${requestId}: ${got.size} reply(ies) to a request the producer did not send`)
    }
    figures.push(["replies expected / received", `${expected} / ${received}`])
    verdict(
      2,
      "exactly one reply per request that asked for one",
      failures,
      `${expected} expected, ${received} received`
    )
  }

  // --- 3. No redelivery while the holder was alive, not stopped and beating -----------------------------
  {
    const failures: Array<string> = []
    const causes: Record<string, number> = {}
    let attempts = 0
    for (const [requestId, list] of line.byRequest) {
      attempts += list.length
      for (let i = 1; i < list.length; i++) {
        const a = list[i - 1]!
        const b = list[i]!
        const cause = classify(line, settings, a, b)
        causes[cause] = (causes[cause] ?? 0) + 1
        if (cause === "unexplained") {
          const lastBeat = Math.max(a.start, ...a.beats.filter((t) => t <= b.start))
          failures.push(
            `${requestId} (${a.kind}): attempt ${b.attempt} on ${b.proc} started ${
              Math.round(b.start - a.start)
            } ms after attempt ${a.attempt} on ${a.proc}, whose last beat was ${Math.round(b.start - lastBeat)} ms ` +
              `before, ended ${
                a.end === undefined ? "never" : `${a.end.outcome} ${Math.round(a.end.t - b.start)} ms after B's start`
              }; ` +
              "no fault on the holder, the database up"
          )
        }
      }
    }
    const explained = ["SIGKILL", "SIGSTOP", "pg-restart", "sqlite-lock", "sqlite-stopped-writer", "holder-silent"]
      .reduce((sum, cause) => sum + (causes[cause] ?? 0), 0)
    figures.push(["attempts", `${attempts}`])
    figures.push([
      "retries by the policy / handed back on SIGTERM",
      `${causes.retry ?? 0} / ${causes["handed-back"] ?? 0}`
    ])
    figures.push([
      "duplicates explained",
      `${explained} (${
        ["SIGKILL", "SIGSTOP", "pg-restart", "sqlite-lock", "sqlite-stopped-writer", "holder-silent"]
          .filter((c) => causes[c] !== undefined).map((c) => `${c} ${causes[c]}`).join(", ") || "none"
      })`
    ])
    figures.push(["duplicates unexplained", `${causes.unexplained ?? 0}`])
    verdict(
      3,
      "no redelivery while the holder was alive, not stopped and beating",
      failures,
      `${explained} duplicate(s), all explained by a fault on the earlier holder`.replace(
        "all explained",
        failures.length === 0 ? "all explained" : "not all explained"
      )
    )
  }

  // --- 4. Nothing stuck after the drain -----------------------------------------------------------------
  {
    const failures: Array<string> = []
    for (const m of dump.remaining) {
      failures.push(
        `${m.queue}: message ${m.id}${
          m.requestId === undefined ? "" : ` (${m.requestId})`
        } ${m.state}, delivered ${m.deliveryCount}×`
      )
    }
    for (const entry of dump.mergeEntries) {
      if (entry.status !== "merged") failures.push(`merge entry ${entry.id} (${entry.workspace}) is ${entry.status}`)
    }
    const leases = dump.leases
    if (leases !== undefined) {
      for (const [domain, count] of Object.entries(leases.pending)) {
        if (count > 0) failures.push(`work-lease domain ${domain}: ${count} offset(s) not processed`)
      }
    }
    const drained = line.of("drained")[0]
    if (drained !== undefined) figures.push(["drain", `${drained.ok ? "done" : "timed out"} in ${ms(drained.millis)}`])
    if (drained !== undefined && !drained.ok) failures.push(`the drain timed out: ${drained.detail}`)
    verdict(
      4,
      "nothing stuck after the drain",
      failures,
      `${dump.remaining.length} message(s) left, ${
        dump.mergeEntries.filter((e) => e.status !== "merged").length
      } merge entr(ies) not merged`
    )
  }

  // --- 5. Every SIGTERM'd worker exited 0 within its shutdown timeout, its work finished or handed back ---
  {
    const failures: Array<string> = []
    const drains: Array<number> = []
    const codes: Record<string, number> = {}
    let finished = 0
    let handedBack = 0
    let drainsWithOutage = 0
    const terms = line.signals.filter((s) => s.signal === "SIGTERM")
    for (const term of terms) {
      const exit = line.exitOf(term.target)
      if (exit === undefined) {
        failures.push(`${term.target} (pid ${term.targetPid}): SIGTERM (${term.cause}) and no exit recorded`)
        continue
      }
      const drain = exit.t - term.t
      drains.push(drain)
      // Time the database was unavailable during the drain does not count against it: the worker cannot settle
      // then, and on SQLite a write waiting for another process's lock blocks its whole process (better-sqlite3
      // is synchronous), its shutdown timer included.
      const down = downtime(line.outages, term.t, exit.t)
      codes[String(exit.code ?? exit.signal)] = (codes[String(exit.code ?? exit.signal)] ?? 0) + 1
      if (exit.code !== 0) {
        failures.push(
          `${term.target} (pid ${term.targetPid}): SIGTERM (${term.cause}) → exit ${exit.code ?? exit.signal}`
        )
      }
      if (down > 0) drainsWithOutage++
      if (drain - down > settings.shutdownTimeoutMs + exitMarginMs) {
        failures.push(
          `${term.target}: exited ${ms(drain)} after SIGTERM (timeout ${ms(settings.shutdownTimeoutMs)}` +
            `${down > 0 ? `; the database was down ${ms(down)} of it` : ""})`
        )
      }
      if (line.signalsTo(term.target).some((s) => s.signal === "SIGKILL" && s.t > term.t)) {
        failures.push(`${term.target}: SIGKILLed after its SIGTERM (it did not stop)`)
      }
      // The attempts in flight at the signal: each must have ended (finished, or interrupted and handed back).
      for (const attempt of line.attempts.values()) {
        if (attempt.proc !== term.target || attempt.start > term.t) continue
        if (attempt.end !== undefined && attempt.end.t <= term.t) continue
        if (attempt.end === undefined || attempt.end.t > exit.t) {
          failures.push(`${term.target}: ${attempt.requestId} was in flight at SIGTERM and never ended`)
        } else if (attempt.end.outcome === "interrupted") handedBack++
        else finished++
      }
    }
    // A process that exits by itself after it was ready, unasked, died.
    for (const exit of line.exits) {
      const asked = line.signalsTo(exit.target).some((s) => s.signal === "SIGTERM" || s.signal === "SIGKILL")
      const fleet = ["worker", "merge", "lease", "producer"].includes(exit.role)
      if (fleet && !asked && exit.ready) {
        failures.push(`${exit.target} (${exit.role}) exited ${exit.code ?? exit.signal} unasked`)
      }
    }
    const neverReady = line.exits.filter((e) => !e.ready && e.code !== 0).length
    figures.push(["SIGTERMs (nemesis + final stop)", `${terms.length}; exits ${JSON.stringify(codes)}`])
    figures.push([
      "drain time after SIGTERM",
      `${spread(drains)}${drainsWithOutage > 0 ? `; ${drainsWithOutage} overlapped a database outage` : ""}`
    ])
    figures.push(["in flight at SIGTERM: finished / handed back", `${finished} / ${handedBack}`])
    figures.push(["processes that failed to start (database down), restarted", `${neverReady}`])
    verdict(
      5,
      "every SIGTERM'd worker exited 0 within its shutdown timeout, its in-flight work finished or handed back",
      failures,
      `${terms.length} SIGTERM(s), max drain ${ms(drains.length === 0 ? undefined : Math.max(...drains))}`
    )
  }

  // --- 6. Merge queue ---------------------------------------------------------------------------------
  {
    const failures: Array<string> = []
    const enqueued = line.of("enqueue")
    const entries = new Map(dump.mergeEntries.map((e) => [e.workspace, e]))
    for (const e of enqueued) {
      if (!entries.has(e.workspace)) failures.push(`${e.workspace}: enqueued, not in the queue`)
    }
    const audit = [...dump.audit].sort((a, b) => a.id - b.id)
    // Each entry merged exactly once.
    const merges = new Map<number, number>()
    for (const row of audit) {
      if (row.action === "transition" && row.toStatus === "merged" && row.entryId !== undefined) {
        merges.set(row.entryId, (merges.get(row.entryId) ?? 0) + 1)
      }
    }
    for (const entry of dump.mergeEntries) {
      const n = merges.get(entry.id) ?? 0
      if (n !== 1) failures.push(`entry ${entry.id} (${entry.workspace}) merged ${n}×`)
    }
    // Replay the lock: each claim, transition and extension under the live lock's own holder and token.
    let holder: { readonly agent: string | undefined; readonly token: number | undefined } | undefined
    let lastToken = 0
    const lastTokenOf = new Map<number, number>()
    for (const row of audit) {
      const who = `${row.agentId ?? "?"} token ${row.fencingToken ?? "?"}`
      switch (row.action) {
        case "lock_acquired": {
          if (holder !== undefined && holder.agent !== row.agentId) {
            failures.push(`audit ${row.id}: lock acquired by ${who} while ${holder.agent} held it`)
          }
          if ((row.fencingToken ?? 0) < lastToken) failures.push(`audit ${row.id}: fencing token went back (${who})`)
          holder = { agent: row.agentId, token: row.fencingToken }
          lastToken = Math.max(lastToken, row.fencingToken ?? 0)
          break
        }
        case "lock_released":
        case "lock_expired":
          if (holder?.agent !== row.agentId || holder?.token !== row.fencingToken) {
            failures.push(
              `audit ${row.id}: ${row.action} by ${who}, the holder was ${holder?.agent} token ${holder?.token}`
            )
          }
          holder = undefined
          break
        case "claimed":
        case "transition":
        case "lock_extended":
          if (holder?.agent !== row.agentId || holder?.token !== row.fencingToken) {
            failures.push(
              `audit ${row.id}: ${row.action} of entry ${row.entryId} by ${who} while the lock was ${
                holder === undefined ? "free" : `${holder.agent} token ${holder.token}`
              } — interleaved holders`
            )
          }
          if (row.entryId !== undefined && row.fencingToken !== undefined && row.action !== "lock_extended") {
            const last = lastTokenOf.get(row.entryId) ?? 0
            if (row.fencingToken < last) {
              failures.push(
                `audit ${row.id}: entry ${row.entryId} changed under token ${row.fencingToken} after token ${last} had it (a zombie's transition accepted)`
              )
            }
            lastTokenOf.set(row.entryId, Math.max(last, row.fencingToken))
          }
          break
      }
    }
    // What the workers saw agrees with the log: accepted transitions are in it, refused ones are not.
    const logged = new Set(
      audit.filter((r) => r.action === "transition").map((r) => `${r.entryId}|${r.fencingToken}|${r.toStatus}`)
    )
    const accepted = line.of("transition")
    for (const t of accepted) {
      if (!logged.has(`${t.entryId}|${t.token}|${t.status}`)) {
        failures.push(
          `${t.proc}: transition ${t.entryId} → ${t.status} (token ${t.token}) accepted but not in the audit log`
        )
      }
    }
    const refused = line.of("refused")
    for (const r of refused) {
      if (logged.has(`${r.entryId}|${r.token}|${r.status}`)) {
        failures.push(
          `${r.proc}: transition ${r.entryId} → ${r.status} (token ${r.token}) refused, yet in the audit log`
        )
      }
    }
    const reclaimed = audit.filter((r) => r.action === "entry_reclaimed").length
    const expired = audit.filter((r) => r.action === "lock_expired").length
    const claims = line.of("claim").length
    figures.push([
      "merge queue",
      `${dump.mergeEntries.length} entries, ${merges.size} merged; ${claims} claims, ${expired} locks expired, ` +
      `${reclaimed} entries reclaimed, ${refused.length} zombie transitions refused`
    ])
    verdict(
      6,
      "merge queue: each entry merged once, holders never interleaved, zombie transitions refused",
      failures,
      `${dump.mergeEntries.length} entries, ${refused.length} zombie transition(s) refused`,
      dump.mergeEntries.length === 0 && enqueued.length === 0
    )
  }

  // --- 7. Work leases ---------------------------------------------------------------------------------
  {
    const leases = dump.leases
    if (leases === undefined) {
      verdict(7, "work leases: fenced writes in order, offsets FIFO, none completed twice", [], "not run", true)
    } else {
      const failures: Array<string> = []
      // Accepted fenced writes, per domain in commit order: fencing tokens and offsets never go back.
      const byDomain = new Map<string, Array<ResourceWrite>>()
      for (const w of [...leases.writes].sort((a, b) => a.seq - b.seq)) {
        byDomain.set(w.domain, [...(byDomain.get(w.domain) ?? []), w])
      }
      for (const [domain, list] of byDomain) {
        let fencing = 0
        let offset = -1
        for (const w of list) {
          if (w.fencing < fencing) {
            failures.push(
              `${domain}: offset ${w.offset} written by ${w.proc} under fencing ${w.fencing} after fencing ${fencing} ` +
                "(a zombie's write accepted)"
            )
          }
          if (w.offset < offset) {
            failures.push(`${domain}: offset ${w.offset} written after offset ${offset} (not FIFO)`)
          }
          fencing = Math.max(fencing, w.fencing)
          offset = Math.max(offset, w.offset)
        }
      }
      // Each offset completed at most once, and only by a holder whose write was accepted.
      const done = line.of("lease-done")
      const completions = new Map<string, number>()
      for (const d of done.filter((d) => d.outcome === "succeeded")) {
        const k = `${d.domain} offset ${d.offset}`
        completions.set(k, (completions.get(k) ?? 0) + 1)
      }
      for (const [k, n] of completions) if (n > 1) failures.push(`${k} completed ${n}×`)
      // Every offset made available completed, or given up by the policy: a takeover counts as a failed attempt,
      // and the one after maxRetries of them gives the offset up (so it was acquired maxRetries + 1 times).
      const acquiredTimes = new Map<string, number>()
      for (const a of line.of("lease-acquired")) {
        acquiredTimes.set(
          `${a.domain} offset ${a.offset}`,
          (acquiredTimes.get(`${a.domain} offset ${a.offset}`) ?? 0) + 1
        )
      }
      let givenUp = 0
      for (const [domain, offered] of Object.entries(leases.offsets)) {
        for (let offset = 0; offset < offered; offset++) {
          const k = `${domain} offset ${offset}`
          if (completions.has(k)) continue
          const times = acquiredTimes.get(k) ?? 0
          if (settings.leaseMaxRetries !== undefined && times >= settings.leaseMaxRetries + 1) givenUp++
          else failures.push(`${k}: neither completed nor given up by the policy (acquired ${times}×) — lost`)
        }
      }
      // Takeovers: an offset acquired again before its holder settled it. Explained like property 3's
      // duplicates, by a fault on the earlier holder between its acquisition and the takeover — SIGKILL,
      // SIGSTOP, a database outage, SIGTERM (a lease worker stops at once) — or its silence (no beat for at
      // least leaseTimeout − the keep-alive interval).
      const acquisitions = line.of("lease-acquired")
      const beats = line.of("lease-beat")
      const takeoverCauses: Record<string, number> = {}
      for (const x of acquisitions) {
        // The holder it took over from: the same offset's acquisition under the next lower fencing token (a
        // holder stopped right after acquiring logs its acquisition late, after the takeover).
        const earlier = acquisitions
          .filter((y) => y.domain === x.domain && y.offset === x.offset && y.fencing < x.fencing)
          .sort((a, b) => a.fencing - b.fencing)
          .at(-1)
        if (earlier === undefined) continue
        const span: Interval = { from: Math.min(earlier.t, x.t), to: x.t }
        const signals = line.signalsTo(earlier.proc)
        const silentFor = x.t - Math.max(
          earlier.t,
          ...beats.filter((b) => b.proc === earlier.proc && b.fencing === earlier.fencing && b.t <= x.t).map((b) => b.t)
        )
        const cause = signals.some((s) => s.signal === "SIGKILL" && s.t >= span.from && s.t <= span.to)
          ? "SIGKILL"
          : (line.stopped.get(earlier.proc) ?? []).some((stop) => overlaps(stop, span))
          ? "SIGSTOP"
          : line.outages.find((o) => overlaps(o, span) && x.t >= o.from)?.kind ??
            // A SIGTERM'd lease worker stops at once (it has nothing to drain): its lease is left to go stale.
            (signals.some((s) => s.signal === "SIGTERM" && s.t >= span.from && s.t <= span.to)
              ? "SIGTERM"
              : silentFor >= (settings.leaseTimeoutMs ?? 0) - settings.extenderIntervalMs
              ? "holder-silent"
              : "unexplained")
        takeoverCauses[cause] = (takeoverCauses[cause] ?? 0) + 1
        if (cause === "unexplained") {
          failures.push(
            `${x.domain} offset ${x.offset}: taken over by ${x.proc} (fencing ${x.fencing}) from ${earlier.proc} ` +
              `(fencing ${earlier.fencing}), which beat ${Math.round(silentFor)} ms before, unharmed`
          )
        }
      }
      const tokens = new Map<string, EventOf<"lease-acquired">>()
      for (const x of acquisitions) {
        const other = tokens.get(`${x.domain}|${x.fencing}`)
        if (other !== undefined) {
          failures.push(`${x.domain}: fencing token ${x.fencing} handed out twice (${other.proc}, ${x.proc})`)
        }
        tokens.set(`${x.domain}|${x.fencing}`, x)
      }
      const writes = leases.writes.length
      const refusedWrites = line.of("lease-write").filter((w) => !w.accepted).length
      const refusedDone = done.filter((d) => d.outcome === "refused").length
      const takeovers = Object.values(takeoverCauses).reduce((a, b) => a + b, 0)
      figures.push([
        "work leases",
        `${Object.keys(leases.offsets).length} domains, ${
          Object.values(leases.offsets).reduce((a, b) => a + b, 0)
        } offsets, ${completions.size} completed, ${givenUp} given up after ${
          settings.leaseMaxRetries ?? "?"
        } takeovers; ` +
        `${writes} fenced writes accepted, ${refusedWrites} refused; ` +
        `${takeovers} takeovers (${
          Object.entries(takeoverCauses).map(([k, n]) => `${k} ${n}`).join(", ") || "none"
        }), ${refusedDone} zombie completions refused`
      ])
      verdict(
        7,
        "work leases: fenced writes in order, offsets FIFO, none completed twice",
        failures,
        `${writes} fenced writes, ${completions.size} offsets completed, ${takeovers} takeover(s), ${
          refusedWrites + refusedDone
        } zombie step(s) refused`
      )
    }
  }

  // --- 8. Keys: no key over its limit, every key progressed -------------------------------------------
  // The limit is the claim's promise across processes: a key never has more than `limit` live leases — a
  // lease live from its claim until it is settled or its visibility passes (so a killed or stopped worker's
  // lease stops counting at its visibility, as the claim counts it). The orchestrator's samples read exactly
  // that from the database, one statement each, many times a second through faults and drain.
  {
    const keys = line.of("keys")[0]
    const name = "keys: no key over its limit of live leases, every key progressed, none lost"
    if (keys === undefined) verdict(8, name, [], "not run (the run sent no keys)", true)
    else {
      const failures: Array<string> = []
      const samples = line.of("key-leases")
      const failed = line.of("key-leases-failed").length
      const phase = line.of("phase")
      const from = phase.find((p) => p.phase === "faults")?.t ?? -Infinity
      const to = phase.find((p) => p.phase === "stop")?.t ?? Infinity
      const during = samples.filter((sample) => sample.t >= from && sample.t <= to)
      if (during.length === 0) failures.push("no sample of the keys' live leases during the run")
      const highest = new Map<string, number>(keys.keys.map((key) => [key, 0]))
      let atLimit = 0
      for (const sample of samples) {
        let full = false
        for (const [key, live] of Object.entries(sample.live)) {
          highest.set(key, Math.max(highest.get(key) ?? 0, live))
          if (live >= keys.limit) full = true
          if (live > keys.limit) {
            failures.push(
              `at ${new Date(sample.at).toISOString()} (database clock): key ${key} had ${live} live leases, ` +
                `its limit is ${keys.limit}`
            )
          }
        }
        if (full) atLimit++
      }
      // Progress: every key's requests that were meant to complete did (a key the limit held for good, or a
      // lease counted forever, would leave them undone), and every key completed some.
      const perKey = new Map<string, { sent: number; completed: number; undone: Array<string> }>(
        keys.keys.map((key) => [key, { sent: 0, completed: 0, undone: [] }])
      )
      for (const [requestId] of sent) {
        const send = sends.get(requestId)
        if (send?.key === undefined) continue
        const entry = perKey.get(send.key)
        if (entry === undefined) {
          failures.push(`${requestId}: sent with key ${send.key}, which is none of the run's keys`)
          continue
        }
        if (send.kind === "poison" || send.kind === "stubborn") continue
        entry.sent++
        const done = (line.byRequest.get(requestId) ?? []).some((a) => a.end?.outcome === "success")
        if (done) entry.completed++
        else entry.undone.push(requestId)
      }
      for (const [key, entry] of perKey) {
        if (entry.sent > 0 && entry.completed === 0) failures.push(`key ${key}: ${entry.sent} sent, none completed`)
        if (entry.undone.length > 0) {
          failures.push(
            `key ${key}: ${entry.undone.length} of ${entry.sent} never completed (${
              entry.undone.slice(0, 5).join(", ")
            })`
          )
        }
      }
      figures.push([
        "keys (limit, completed/sent, highest live)",
        `limit ${keys.limit}; ${
          [...perKey].map(([key, entry]) => `${key} ${entry.completed}/${entry.sent} ≤${highest.get(key) ?? 0}`).join(
            ", "
          )
        }; ${samples.length} samples (${atLimit} with a key at its limit, ${failed} failed)`
      ])
      verdict(
        8,
        name,
        failures,
        `${keys.keys.length} keys at limit ${keys.limit}, ${samples.length} samples, highest ${
          Math.max(0, ...highest.values())
        } live`
      )
    }
  }

  // --- Figures of the faults ----------------------------------------------------------------------------
  {
    const faults = line.of("fault")
    const byKind: Record<string, number> = {}
    for (const f of faults) byKind[f.kind] = (byKind[f.kind] ?? 0) + 1
    figures.push(["faults", `${faults.length} (${Object.entries(byKind).map(([k, n]) => `${k} ${n}`).join(", ")})`])

    // Fault → picked up elsewhere: for each attempt whose worker was killed, stopped or terminated while it was
    // in flight, the time from the fault to the next attempt of the request on another process.
    const pickups: Array<number> = []
    for (const s of line.signals) {
      if (s.cause !== "nemesis" || s.signal === "SIGCONT") continue
      for (const attempt of line.attempts.values()) {
        if (attempt.proc !== s.target || attempt.start > s.t) continue
        if (attempt.end !== undefined && attempt.end.t <= s.t) continue
        if (s.signal === "SIGTERM" && attempt.end?.outcome !== "interrupted") continue
        const next = (line.byRequest.get(attempt.requestId) ?? []).find((b) => b.start > s.t && b.proc !== s.target)
        if (next !== undefined) pickups.push(next.start - s.t)
      }
    }
    figures.push(["fault → picked up elsewhere", spread(pickups)])

    // Throughput: completions per second inside fault windows and outside them, during the fault phase.
    const phase = line.of("phase")
    const from = phase.find((p) => p.phase === "faults")?.t
    const to = phase.find((p) => p.phase === "drain")?.t
    if (from !== undefined && to !== undefined) {
      const windows: Array<Interval> = [...line.outages]
      for (const stops of line.stopped.values()) windows.push(...stops)
      for (const s of line.signals) {
        if (s.cause === "nemesis" && (s.signal === "SIGKILL" || s.signal === "SIGTERM")) {
          windows.push({ from: s.t, to: s.t + settings.visibilityMs })
        }
      }
      const clipped = windows
        .map((w) => ({ from: Math.max(w.from, from), to: Math.min(w.to, to) }))
        .filter((w) => w.to > w.from)
        .sort((a, b) => a.from - b.from)
      const merged: Array<{ from: number; to: number }> = []
      for (const w of clipped) {
        const last = merged.at(-1)
        if (last !== undefined && w.from <= last.to) last.to = Math.max(last.to, w.to)
        else merged.push({ ...w })
      }
      const inside = merged.reduce((sum, w) => sum + (w.to - w.from), 0)
      const ends = line.of("end").filter((e) => e.outcome === "success" && e.t >= from && e.t <= to)
      const during = ends.filter((e) => merged.some((w) => e.t >= w.from && e.t <= w.to)).length
      const rate = (n: number, millis: number) => (millis <= 0 ? "–" : `${(n / (millis / 1000)).toFixed(1)}/s`)
      figures.push([
        "throughput during faults / outside",
        `${rate(during, inside)} over ${(inside / 1000).toFixed(0)} s / ${
          rate(ends.length - during, to - from - inside)
        } over ${((to - from - inside) / 1000).toFixed(0)} s`
      ])
    }
    // The poison path logs two warnings per request by design; the rest are worth a look.
    const expected = /^Request \S+ failed: (PoisonError|StubbornError)|^Request dead-lettered/
    const logs = line.of("log")
    const unexpected = logs.filter((l) => !expected.test(l.message))
    figures.push([
      "warnings and errors logged (besides the poison path's)",
      `${unexpected.length} (${logs.filter((l) => l.level !== "WARN").length} errors)`
    ])
    if (unreadable > 0) figures.push(["history lines that did not parse", `${unreadable}`])
  }

  return { settings, figures, verdicts, pass: verdicts.every((v) => v.status !== "FAIL") }
}

/** Reads `dir` (histories and db.json) and judges it. */
export const check = (dir: string): Report => {
  const histories = History.read(dir)
  const dumpFile = join(dir, "db.json")
  const dump: Dump = existsSync(dumpFile)
    ? (JSON.parse(readFileSync(dumpFile, "utf8")) as Dump)
    : { remaining: [], deadLetters: [], mergeEntries: [], audit: [] }
  return judge(histories.events, dump, histories.unreadable)
}

/** The report as a plain-text table: figures, then one PASS/FAIL line per property with its evidence. */
export const format = (report: Report): string => {
  const width = Math.max(...report.figures.map(([label]) => label.length))
  const lines = [
    `backend ${report.settings.backend}, seed ${report.settings.seed}, ${report.settings.seconds} s of faults` +
    (report.settings.commit === undefined ? "" : `, commit ${report.settings.commit}`),
    "",
    ...report.figures.map(([label, value]) => `  ${label.padEnd(width)}  ${value}`),
    ""
  ]
  for (const v of report.verdicts) {
    lines.push(`${v.status}  ${v.id}. ${v.name} — ${v.summary}`)
    for (const e of v.evidence) lines.push(`        ${e}`)
  }
  lines.push("", report.pass ? "ALL PROPERTIES HOLD" : "SOME PROPERTY FAILED")
  if (report.settings.replay !== undefined) lines.push(`replay: ${report.settings.replay}`)
  return lines.join("\n")
}
