/**
 * The checker's self-test: a checker that passes everything proves nothing. Each case copies a real history
 * (a directory a soak kept), injects one bug into the copy — the record of what that bug would look like —
 * and expects the checker to fail the property that bug breaks; the unmodified copy must pass.
 *
 * The bugs: a request whose only successful attempt is forgotten (`end` dropped → lost), a second attempt
 * that starts while the first holder is running unharmed (an overlapping `start` → unexplained duplicate), a
 * second reply, a merge transition by a fencing token older than one that already acted on the entry (a
 * zombie's write accepted after a takeover), a fenced work-lease write accepted out of fencing order, a
 * SIGTERM'd worker that exits 1, a message left in the queue after the drain, and a key sampled with one live
 * lease more than its limit.
 *
 * Used by test/soak.checker.test.ts (on the committed history soak/fixtures/history) and by
 * `npm run soak -- --self-test [DIR]`.
 */
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Checker from "./checker.js"
import type { Event, EventOf } from "./history.js"
import * as History from "./history.js"

/** A directory's files, to edit: events per history file, and the database dump. */
interface Copy {
  readonly files: Map<string, Array<Event>>
  dump: Checker.Dump
}

const load = (dir: string): Copy => {
  const files = new Map<string, Array<Event>>()
  for (const name of readdirSync(dir).filter((n) => n.endsWith(".jsonl"))) {
    files.set(name, History.parseLines(readFileSync(join(dir, name), "utf8")).events)
  }
  return { files, dump: JSON.parse(readFileSync(join(dir, "db.json"), "utf8")) as Checker.Dump }
}

const save = (dir: string, copy: Copy) => {
  for (const [name, events] of copy.files) {
    writeFileSync(join(dir, name), events.map((e) => JSON.stringify(e)).join("\n") + "\n")
  }
  writeFileSync(join(dir, "db.json"), JSON.stringify(copy.dump))
}

const all = (copy: Copy) => [...copy.files.values()].flat().sort((a, b) => a.t - b.t)
const ofKind = <K extends Event["ev"]>(copy: Copy, ev: K) => all(copy).filter((e): e is EventOf<K> => e.ev === ev)
const insert = (copy: Copy, file: string, event: Event) => {
  const events = copy.files.get(file) ?? []
  events.push(event)
  events.sort((a, b) => a.t - b.t)
  copy.files.set(file, events)
}

/** A bug to inject: edits the copy and says what it did, or says why the history has no place for it. */
interface Injection {
  readonly name: string
  /** The property it must make fail. */
  readonly property: number
  readonly inject: (copy: Copy) => string | { readonly skip: string }
}

/** Whether nothing the checker counts as a fault touched `proc` or the database within [from, to]. */
const quiet = (copy: Copy, proc: string, from: number, to: number) => {
  const events = all(copy)
  const signalled = events.some((e) => e.ev === "signal" && e.target === proc && e.t >= from - 1000 && e.t <= to)
  const down = events.some((e) =>
    (e.ev === "pg-stop" || e.ev === "pg-start" || e.ev === "sqlite-lock-held" || e.ev === "sqlite-lock-released") &&
    e.t >= from - 6000 && e.t <= to
  )
  return !signalled && !down
}

export const injections: ReadonlyArray<Injection> = [
  {
    name: "drop the end of a request's only successful attempt (the work is forgotten: lost)",
    property: 1,
    inject: (copy) => {
      const starts = ofKind(copy, "start")
      const counts = new Map<string, number>()
      for (const s of starts) counts.set(s.requestId, (counts.get(s.requestId) ?? 0) + 1)
      const end = ofKind(copy, "end").find((e) => e.outcome === "success" && counts.get(e.requestId) === 1)
      if (end === undefined) return { skip: "no request with a single successful attempt" }
      const file = `${end.proc}.jsonl`
      copy.files.set(file, copy.files.get(file)!.filter((e) => e !== end))
      return `dropped the end of ${end.requestId} on ${end.proc}`
    }
  },
  {
    name: "a second attempt starts while the first holder runs unharmed (an unexplained duplicate)",
    property: 3,
    inject: (copy) => {
      const workers = [...new Set(ofKind(copy, "start").map((s) => s.proc))]
      const ends = ofKind(copy, "end")
      for (const start of ofKind(copy, "start")) {
        const end = ends.find((e) =>
          e.proc === start.proc && e.requestId === start.requestId && e.attempt === start.attempt
        )
        if (end === undefined || end.outcome !== "success" || start.kind !== "fast") continue
        if (!quiet(copy, start.proc, start.t, end.t + 3000)) continue
        const other = workers.find((w) => w !== start.proc)
        if (other === undefined) break
        const pid = all(copy).find((e) => e.proc === other)?.pid ?? 0
        const t = start.t + 2
        const base = { pid, proc: other, mono: 0, requestId: start.requestId, attempt: start.attempt + 1, loop: 0 }
        insert(copy, `${other}.jsonl`, { ...base, t, ev: "start", kind: start.kind })
        insert(copy, `${other}.jsonl`, { ...base, t: t + 5, ev: "end", outcome: "success" })
        return `a second start of ${start.requestId} on ${other} 2 ms after the first on ${start.proc}`
      }
      return { skip: "no fast attempt far from every fault" }
    }
  },
  {
    name: "a second reply to a request",
    property: 2,
    inject: (copy) => {
      const reply = ofKind(copy, "reply")[0]
      if (reply === undefined) return { skip: "no reply" }
      insert(copy, `${reply.proc}.jsonl`, { ...reply, t: reply.t + 10, messageId: `${reply.messageId}-again` })
      return `a second reply to ${reply.requestId}`
    }
  },
  {
    name: "a merge transition by an older fencing token after a newer one acted (a zombie's write accepted)",
    property: 6,
    inject: (copy) => {
      const audit = [...copy.dump.audit].sort((a, b) => a.id - b.id)
      // A claim, and the first row after it under a newer token: the lock has passed on (a takeover, or the
      // next claim). The zombie is the old claim's holder, moving its entry once more after that.
      for (const claim of audit.filter((r) => r.action === "claimed")) {
        const newer = audit.find((r) => r.id > claim.id && (r.fencingToken ?? 0) > (claim.fencingToken ?? 0))
        if (newer === undefined) continue
        const zombie: Checker.AuditRow = {
          id: newer.id + 0.5,
          at: newer.at,
          action: "transition",
          agentId: claim.agentId,
          entryId: claim.entryId,
          fencingToken: claim.fencingToken,
          fromStatus: "rebasing",
          toStatus: "testing"
        }
        copy.dump = { ...copy.dump, audit: [...copy.dump.audit, zombie] }
        return `a transition of entry ${claim.entryId} by ${claim.agentId} (token ${claim.fencingToken}) after ` +
          `token ${newer.fencingToken} took the lock`
      }
      return { skip: "no merge claim followed by a newer token" }
    }
  },
  {
    name: "a fenced work-lease write accepted after a newer holder's write (a zombie's write accepted)",
    property: 7,
    inject: (copy) => {
      const leases = copy.dump.leases
      if (leases === undefined || leases.writes.length < 2) return { skip: "the history has no work leases" }
      const last = [...leases.writes].sort((a, b) => a.seq - b.seq).find((w) => w.fencing > 1)
      if (last === undefined) return { skip: "no write under a fencing token above 1" }
      const zombie = { ...last, seq: last.seq + 0.5, fencing: last.fencing - 1, proc: "zombie" }
      copy.dump = { ...copy.dump, leases: { ...leases, writes: [...leases.writes, zombie] } }
      return `a write to ${last.domain} under fencing ${zombie.fencing} after ${last.fencing}`
    }
  },
  {
    name: "a SIGTERM'd worker exits 1",
    property: 5,
    inject: (copy) => {
      const terms = ofKind(copy, "signal").filter((s) => s.signal === "SIGTERM")
      const file = copy.files.get("orchestrator.jsonl") ?? []
      for (const term of terms) {
        const index = file.findIndex((e) => e.ev === "exit" && e.target === term.target)
        if (index === -1) continue
        file[index] = { ...(file[index] as EventOf<"exit">), code: 1 }
        return `${term.target} exits 1 after its SIGTERM`
      }
      return { skip: "no SIGTERM'd process" }
    }
  },
  {
    name: "a key holds one live lease more than its limit (a claim that ignored the limit)",
    property: 8,
    inject: (copy) => {
      const keys = ofKind(copy, "keys")[0]
      if (keys === undefined) return { skip: "the history has no keys" }
      // A sample with a key at its limit, that key one lease over: what a claim that did not count the key's
      // live leases in its transaction (or counted an expired lease as gone too late, or a live one too early)
      // would leave in the database.
      const file = copy.files.get("orchestrator.jsonl") ?? []
      const index = file.findIndex((e) =>
        e.ev === "key-leases" && Object.values(e.live).some((live) => live === keys.limit)
      )
      if (index === -1) return { skip: "no sample with a key at its limit" }
      const sample = file[index] as EventOf<"key-leases">
      const [key] = Object.entries(sample.live).find(([, live]) => live === keys.limit)!
      file[index] = { ...sample, live: { ...sample.live, [key]: keys.limit + 1 } }
      return `${key} with ${keys.limit + 1} live leases in the sample at ${sample.at} (limit ${keys.limit})`
    }
  },
  {
    name: "a request left in flight after the drain",
    property: 4,
    inject: (copy) => {
      const sent = ofKind(copy, "sent")[0]
      if (sent === undefined) return { skip: "nothing sent" }
      copy.dump = {
        ...copy.dump,
        remaining: [...copy.dump.remaining, {
          queue: "soak_requests",
          id: sent.messageId,
          state: "in flight",
          deliveryCount: 1,
          requestId: sent.requestId
        }]
      }
      return `${sent.requestId} left in flight`
    }
  }
]

/** One case's outcome. */
export interface Result {
  readonly name: string
  readonly property: number
  readonly ok: boolean
  readonly detail: string
}

/** Runs the unmodified copy and every injection on copies of `source`. */
export const run = (source: string): ReadonlyArray<Result> => {
  const results: Array<Result> = []
  const scratch = mkdtempSync(join(tmpdir(), "leasehold-soak-selftest-"))
  try {
    const failing = (report: Checker.Report) => report.verdicts.filter((v) => v.status === "FAIL").map((v) => v.id)
    const baseline = Checker.check(source)
    results.push({
      name: "the history as recorded passes",
      property: 0,
      ok: baseline.pass,
      detail: baseline.pass ? "every property holds" : `properties ${failing(baseline).join(", ")} fail`
    })
    injections.forEach((injection, i) => {
      const dir = join(scratch, String(i))
      cpSync(source, dir, { recursive: true })
      const copy = load(dir)
      const what = injection.inject(copy)
      if (typeof what !== "string") {
        results.push({ name: injection.name, property: injection.property, ok: true, detail: `skipped: ${what.skip}` })
        return
      }
      save(dir, copy)
      const report = Checker.check(dir)
      const verdict = report.verdicts.find((v) => v.id === injection.property)!
      results.push({
        name: injection.name,
        property: injection.property,
        ok: verdict.status === "FAIL",
        detail: `${what} → property ${injection.property} ${verdict.status}${
          verdict.evidence[0] === undefined ? "" : `: ${verdict.evidence[0]}`
        }`
      })
    })
  } finally {
    rmSync(scratch, { recursive: true, force: true })
  }
  return results
}

/** The results, one line each. */
export const format = (results: ReadonlyArray<Result>): string =>
  [
    ...results.map((r) => `${r.ok ? "ok  " : "FAIL"}  ${r.name}\n        ${r.detail}`),
    "",
    results.every((r) => r.ok) ? "the checker reports every injected bug" : "the checker MISSED an injected bug"
  ].join("\n")
