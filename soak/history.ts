/**
 * The soak's history: what every process of a soak did, one JSON line per event, in a file of its own
 * (`<dir>/<proc>.jsonl`). The checker reads these files, never the processes' logs.
 *
 * Why one `write` per event on an `O_APPEND` descriptor: a process can be SIGKILLed at any instant; a line
 * written by a single `write(2)` to a regular file opened for appending is either in the file whole or not at
 * all (short of a full disk), and nothing is buffered in the process to be lost with it. So the history of a
 * killed worker ends with its last complete event. The reader still skips a line that does not parse (and
 * counts it), rather than trusting that.
 *
 * Every event has `t` (milliseconds since the epoch, fractional: this process's `performance.timeOrigin` plus
 * its monotonic clock, so events of one process never go back in time and events of processes on one machine
 * compare), `mono` (the process's own monotonic milliseconds), `pid`, `proc` (the name the orchestrator gave
 * the process: `w3`, `producer`, `m1`…) and `ev`, the event's kind; the other fields depend on the kind
 * (see `Event`).
 */
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs"
import { join } from "node:path"
import { performance } from "node:perf_hooks"

/** Fields every event carries. */
export interface Base {
  readonly t: number
  readonly mono: number
  readonly pid: number
  readonly proc: string
}

/** The kinds of request the producer sends (see protocol.ts). */
export type Kind = "fast" | "slow" | "poison" | "stubborn"

/** The faults the nemesis injects. */
export type FaultKind = "SIGKILL" | "SIGSTOP" | "SIGTERM" | "pg-restart" | "sqlite-lock"

/** What a process can record. The checker's rules are in checker.ts; docs/reliability.md explains them. */
export type Payload =
  // Every process: it is connected and serving (after its layers are built).
  | { readonly ev: "ready"; readonly role: string }
  // Request workers (worker.ts): an attempt of a request on one of the process's loops.
  | {
    readonly ev: "start"
    readonly requestId: string
    readonly attempt: number
    readonly kind: Kind
    readonly loop: number
  }
  | { readonly ev: "beat"; readonly requestId: string; readonly attempt: number; readonly loop: number }
  | {
    readonly ev: "end"
    readonly requestId: string
    readonly attempt: number
    readonly loop: number
    readonly outcome: "success" | "failure" | "interrupted"
    readonly error?: string
  }
  // Request workers: the shutdown coordinator heard the signal; the drain starts.
  | { readonly ev: "draining" }
  // Any leasehold process: a warning or an error the library logged (settle failures, store failures…).
  | { readonly ev: "log"; readonly level: string; readonly message: string }
  // Any process, from its `exit` handler (not written when SIGKILLed).
  | { readonly ev: "exit-self"; readonly code: number }
  // Producer (producer.ts): `send` is the intent, then `sent` (stored) or `send-failed` (maybe stored: the
  // store may have committed before the connection broke). A retry is a new request id.
  | {
    readonly ev: "send"
    readonly requestId: string
    readonly kind: Kind
    readonly wantsReply: boolean
    readonly workMs: number
    /** The request's key (its simulated tenant): the queue limits each key's live leases. */
    readonly key?: string
  }
  | { readonly ev: "sent"; readonly requestId: string; readonly messageId: string }
  | { readonly ev: "send-failed"; readonly requestId: string; readonly error: string }
  | {
    readonly ev: "reply"
    readonly requestId: string
    readonly messageId: string
    readonly success: boolean
    readonly errorTag?: string
  }
  | { readonly ev: "sending-done"; readonly sent: number }
  // Producer: merge-queue entries it enqueued (`entryId` unknown when a retry found it already queued).
  | { readonly ev: "enqueue"; readonly workspace: string; readonly entryId?: number }
  // Merge-queue workers (mergeQueueWorker.ts): a claim, each transition the queue accepted, one it refused.
  | { readonly ev: "claim"; readonly agentId: string; readonly entryId: number; readonly token: number }
  | {
    readonly ev: "transition"
    readonly agentId: string
    readonly entryId: number
    readonly token: number
    readonly status: string
  }
  | {
    readonly ev: "refused"
    readonly agentId: string
    readonly entryId: number
    readonly token: number
    readonly status: string
    readonly error: string
  }
  | {
    readonly ev: "released"
    readonly agentId: string
    readonly entryId: number
    readonly token: number
    readonly released: boolean
  }
  // Work-lease workers (workLeaseWorker.ts).
  | {
    readonly ev: "lease-acquired"
    readonly domain: string
    readonly offset: number
    readonly fencing: number
  }
  | { readonly ev: "lease-beat"; readonly domain: string; readonly offset: number; readonly fencing: number }
  | {
    readonly ev: "lease-write"
    readonly domain: string
    readonly offset: number
    readonly fencing: number
    readonly accepted: boolean
  }
  | {
    readonly ev: "lease-done"
    readonly domain: string
    readonly offset: number
    readonly fencing: number
    readonly outcome: "succeeded" | "refused" | "error"
    readonly error?: string
  }
  // The orchestrator (run.ts) and its nemesis (nemesis.ts).
  | { readonly ev: "config"; readonly config: Record<string, unknown> }
  | { readonly ev: "phase"; readonly phase: "setup" | "faults" | "drain" | "stop" | "done" }
  | { readonly ev: "spawn"; readonly target: string; readonly targetPid: number; readonly role: string }
  | {
    readonly ev: "signal"
    readonly signal: "SIGKILL" | "SIGSTOP" | "SIGCONT" | "SIGTERM"
    readonly target: string
    readonly targetPid: number
    /** `nemesis` for a fault, `stop` for the graceful stop at the end. */
    readonly cause: "nemesis" | "stop"
  }
  | {
    readonly ev: "exit"
    readonly target: string
    readonly targetPid: number
    readonly role: string
    readonly code: number | null
    readonly signal: string | null
    readonly ready: boolean
  }
  | { readonly ev: "fault"; readonly kind: FaultKind; readonly target?: string; readonly millis?: number }
  | { readonly ev: "pg-stop" }
  | { readonly ev: "pg-start"; readonly ok: boolean }
  // The SQLite lock holder (sqliteLock.ts), from its own process: the moment it holds the write lock, and
  // the moment it gave it back.
  | { readonly ev: "sqlite-lock-held" }
  | { readonly ev: "sqlite-lock-released" }
  | { readonly ev: "drained"; readonly ok: boolean; readonly millis: number; readonly detail: string }
  // The orchestrator: the requests queue's keys and the limit it set on them before the fleet started (the
  // queue's default, so every key has it), then, many times a second until the stop, each key's live leases
  // as one statement read them from the database: rows with a receipt handle whose visibility is still ahead
  // on the database's clock (`at`) — a lease counts from its claim until it is settled or its visibility
  // passes, so a killed or stopped worker's lease stops counting at its visibility, as the claim counts it.
  | { readonly ev: "keys"; readonly queue: string; readonly keys: ReadonlyArray<string>; readonly limit: number }
  | { readonly ev: "key-leases"; readonly at: number; readonly live: Readonly<Record<string, number>> }
  | { readonly ev: "key-leases-failed"; readonly error: string }

/** An event as stored. */
export type Event = Base & Payload

/** An event of one kind. */
export type EventOf<K extends Payload["ev"]> = Base & Extract<Payload, { readonly ev: K }>

/** Milliseconds since the epoch on this machine, never going back within a process. */
export const now = (): number => performance.timeOrigin + performance.now()

/** Appends events to `<dir>/<proc>.jsonl`, one `writeSync` each on an `O_APPEND` descriptor. */
export interface History {
  readonly proc: string
  readonly append: (payload: Payload) => void
  readonly close: () => void
}

/** Opens (creating) the history file of process `proc` in `dir`. */
export const open = (dir: string, proc: string): History => {
  // "a": O_WRONLY | O_CREAT | O_APPEND — every write lands at the end, whoever else writes the file.
  const fd = openSync(join(dir, `${proc}.jsonl`), "a")
  let closed = false
  return {
    proc,
    append: (payload) => {
      if (closed) return
      const mono = performance.now()
      const line = JSON.stringify({ t: performance.timeOrigin + mono, mono, pid: process.pid, proc, ...payload })
      writeSync(fd, line + "\n")
    },
    close: () => {
      if (closed) return
      closed = true
      closeSync(fd)
    }
  }
}

/** A directory's histories: every event, ordered by time, and how many lines did not parse. */
export interface Histories {
  readonly events: ReadonlyArray<Event>
  readonly unreadable: number
  readonly files: ReadonlyArray<string>
}

/** Parses JSON lines; a line that is not a JSON object with `ev` and `t` is counted, not trusted. */
export const parseLines = (text: string): { readonly events: Array<Event>; readonly unreadable: number } => {
  const events: Array<Event> = []
  let unreadable = 0
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue
    try {
      const value = JSON.parse(line) as Partial<Event>
      if (typeof value === "object" && value !== null && typeof value.ev === "string" && typeof value.t === "number") {
        events.push(value as Event)
      } else unreadable++
    } catch {
      unreadable++
    }
  }
  return { events, unreadable }
}

/** Reads every `*.jsonl` of `dir`, merged in time order (ties keep file then line order). */
export const read = (dir: string): Histories => {
  const files = readdirSync(dir).filter((name) => name.endsWith(".jsonl")).sort()
  const events: Array<Event> = []
  let unreadable = 0
  for (const file of files) {
    const parsed = parseLines(readFileSync(join(dir, file), "utf8"))
    events.push(...parsed.events)
    unreadable += parsed.unreadable
  }
  // Array.prototype.sort is stable: equal times keep their file and line order.
  events.sort((a, b) => a.t - b.t)
  return { events, unreadable, files }
}
