/**
 * The memory mailbox's store (MailboxMemory.ts is its front: messages, options, the public functions): its
 * entries, the ready lines they wait in — one for unkeyed entries, one per key — the heap of hidden ones, the
 * keys' scheduling state and the claim that walks them by the rules of `scheduling.ts`, the step journals, and
 * the signal sleeping receivers wait on. Every method is one synchronous step: fibers never see half a change.
 */
import type * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import { MinHeap } from "../heap.js"
import type { StoredStep } from "../journal.js"
import * as Scheduling from "./scheduling.js"

/** How many dead-lettered requests' journals a memory mailbox keeps. */
export const keptJournals = 1000

export interface Entry<A> {
  readonly id: string
  /**
   * Where the entry waits among its line's: its first enqueue, kept on every return for a keyed entry; an unkeyed
   * entry that comes back goes behind those already waiting, as before keys (MainLoop's redelivery relies on it).
   */
  seq: number
  readonly priority: number
  /** Its key's state, if it was sent with a key. */
  readonly key: KeyLine<A> | undefined
  readonly body: A
  readonly enqueuedAtMillis: number
  readonly replyTo: string | undefined
  /** The sender's W3C trace context (formatted from a span by the front end, so well-formed). */
  readonly traceparent: string | undefined
  deliveryCount: number
  state: "ready" | "hidden" | "deleted"
  /** While hidden: when it becomes visible again (epoch ms). */
  visibleAt: number
  /** While hidden by a receive: the current delivery's handle. */
  receiptHandle: string | undefined
  /** While leased (keyed entries): when the lease began, and up to when its key was charged for it. */
  leaseStart: number
  chargedUntil: number
  /** The key's weight when the lease began: every charge of the lease is divided by it, its correction too. */
  weight: number
}

/**
 * Entries waiting in (priority, first enqueue) order: a FIFO for fresh sends of priority 0 (already in order:
 * the common case stays a push and a shift) and a heap for the rest — other priorities, and entries coming
 * back (a lease ran out, a nack, a delay passed), which keep their first place. Holds only ready entries
 * (purge marks its entries deleted, and they are skipped).
 */
export class ReadyLine<A> {
  private fifo: Array<Entry<A>> = []
  private head = 0
  private heap = new MinHeap<Entry<A>>()
  size = 0

  push(entry: Entry<A>, fresh: boolean): void {
    this.size++
    if (fresh && entry.priority === 0) this.fifo.push(entry)
    else this.heap.push(entry.priority, entry, entry.seq)
  }

  /** The next entry, without taking it. */
  peek(): Entry<A> | undefined {
    while (this.head < this.fifo.length && this.fifo[this.head]!.state !== "ready") this.head++
    while (this.heap.size > 0 && this.heap.peek()!.state !== "ready") this.heap.pop()
    const first = this.head < this.fifo.length ? this.fifo[this.head] : undefined
    const top = this.heap.peek()
    if (first === undefined) return top
    if (top === undefined) return first
    return before(top, first) ? top : first
  }

  /** Takes the entry `peek` gave. */
  take(entry: Entry<A>): void {
    this.size--
    if (this.head < this.fifo.length && this.fifo[this.head] === entry) {
      this.head++
      if (this.head > 1024 && this.head * 2 > this.fifo.length) {
        this.fifo = this.fifo.slice(this.head)
        this.head = 0
      }
    } else this.heap.pop()
  }

  clear(): void {
    for (let i = this.head; i < this.fifo.length; i++) this.fifo[i]!.state = "deleted"
    this.heap.forEach((_, entry) => {
      entry.state = "deleted"
    })
    this.fifo = []
    this.head = 0
    this.heap.clear()
    this.size = 0
  }
}

/** Whether `a` goes before `b`: lower priority first, then first enqueued. */
export const before = (a: { readonly priority: number; readonly seq: number }, b: typeof a): boolean =>
  a.priority < b.priority || (a.priority === b.priority && a.seq < b.seq)

/** A key's line and its scheduling state (see `internal/mailbox/scheduling.ts`). */
export class KeyLine<A> {
  readonly ready = new ReadyLine<A>()
  /** Unsettled entries of the key. */
  pending = 0
  /** Live leases: hidden by a receive, visibility not yet passed (expired ones leave on `promote`). */
  readonly leases = new Set<Entry<A>>()
  vtime = 0
  /** The share clock at its last pick. */
  picked = 0
  /** Leased milliseconds in the current busy period. */
  leased = 0
  /** How long its leases were held, on average (recent ones weigh most); unknown before its first settle. */
  mean: number | undefined = undefined
  startsWindow = 0
  startsUsed = 0
  tokensWindow = 0
  tokensUsed = 0
  constructor(readonly name: string) {}
}

/** Settings as kept: a field absent is not set. */
export type Settings = { -readonly [K in keyof Scheduling.StoredSettings]?: number }

export const applySettings = (current: Settings, change: Scheduling.StoredSettings): Settings => {
  const next: Settings = { ...current }
  for (const [field, value] of Object.entries(change) as Array<[keyof Settings, number | null | undefined]>) {
    if (value === null) delete next[field]
    else if (value !== undefined) next[field] = value
  }
  return next
}

export class Store<A> {
  /** Unacknowledged entries: every one is either in a ready line or in `hidden`. */
  live = 0
  /** Hidden entries by visibility time; may hold stale nodes (see `promote`), compacted in `hide`. */
  private hidden = new MinHeap<Entry<A>>()
  /** Entries sent without a key. */
  private readonly unkeyed = new ReadyLine<A>()
  /** Keys with unsettled entries (a key leaves when its last entry is settled; its settings stay). */
  readonly keys = new Map<string, KeyLine<A>>()
  /** Settings by key, and the queue's defaults for keys without their own. */
  readonly settings = new Map<string, Settings>()
  defaults: Settings = {}
  private nextSeq = 0
  closed = false
  /** When this mailbox's claim last set its gauges (its clock's ms), and the keys its per-key gauge shows. */
  gaugesAt: number | undefined = undefined
  readonly gaugedKeys = new Set<string>()
  constructor(private readonly clock: Clock.Clock) {}

  /** The mailbox's time (its `Clock`'s: `TestClock` in a test). */
  clockMillis(): number {
    return this.clock.unsafeCurrentTimeMillis()
  }
  /** Paused (see `pause`): receivers get nothing, senders are unaffected. */
  paused = false
  private signal: Deferred.Deferred<void> | undefined
  /** The step journals of unacknowledged messages, by id. */
  readonly journals = new Map<string, Array<StoredStep>>()
  /** The journals of dead-lettered messages, oldest first, at most `keptJournals`. */
  readonly kept = new Map<string, ReadonlyArray<StoredStep>>()

  /** Drops the journal of an acknowledged message, or keeps it (the loop dead-lettered the request). */
  settleJournal(id: string, keep: boolean): void {
    const journal = this.journals.get(id)
    if (journal === undefined) return
    this.journals.delete(id)
    if (!keep) return
    this.kept.set(id, journal)
    if (this.kept.size > keptJournals) this.kept.delete(this.kept.keys().next().value!)
  }

  /** A fresh entry's first-enqueue order. */
  seq(): number {
    return this.nextSeq++
  }

  /** The key named `name`, made active (a busy period starts) when it had nothing unsettled. */
  activate(name: string): KeyLine<A> {
    let line = this.keys.get(name)
    if (line === undefined) {
      line = new KeyLine<A>(name)
      this.keys.set(name, line)
    }
    line.pending++
    return line
  }

  /**
   * A key with nothing ready and no live lease gets a ready entry: a busy period starts, at the queue's share
   * clock (the highest at which a busy key was last picked) — neither credit for the time it was idle (a message
   * parked by a long delay does not bank any) nor a debt.
   */
  private wakeKey(line: KeyLine<A>): void {
    if (line.ready.size > 0 || line.leases.size > 0) return
    let clock = 0
    for (const other of this.keys.values()) {
      if (other !== line && (other.ready.size > 0 || other.leases.size > 0) && other.picked > clock) {
        clock = other.picked
      }
    }
    if (clock > line.vtime) line.vtime = clock
    line.leased = 0
  }

  /** A setting of `line`: its own, else the queue's default. */
  setting(line: KeyLine<A>, field: keyof Settings): number | undefined {
    return this.settings.get(line.name)?.[field] ?? this.defaults[field]
  }

  weight(line: KeyLine<A>): number {
    return this.setting(line, "weight") ?? 1
  }

  /** Charges (or, negative, refunds) `millis` of leased time to the entry's key. */
  charge(entry: Entry<A>, millis: number): void {
    const line = entry.key
    if (line === undefined || millis === 0) return
    line.vtime += millis / entry.weight
    line.leased += millis
  }

  /** The entry's lease ended at `now` (settled, nacked): its key pays exactly the time it was held. */
  endLease(entry: Entry<A>, now: number): void {
    const line = entry.key
    if (line === undefined || !line.leases.delete(entry)) return
    this.charge(entry, now - entry.chargedUntil)
    const held = now - entry.leaseStart
    line.mean = line.mean === undefined ? held : line.mean + (held - line.mean) * Scheduling.meanWeight
  }

  /**
   * The entry's lease is still held at `now` (an extension): a lease is expected to run at least as long again
   * as it has (so a key whose first runs are long is not taken for a key of short ones), and pays up to that.
   */
  extended(entry: Entry<A>, now: number): void {
    if (entry.key === undefined) return
    const expected = entry.leaseStart + Scheduling.expectedLength(now - entry.leaseStart)
    if (expected <= entry.chargedUntil) return
    this.charge(entry, expected - entry.chargedUntil)
    entry.chargedUntil = expected
  }

  /** The entry is settled for good: its key forgets it (and the key leaves when it was its last). */
  settled(entry: Entry<A>): void {
    const line = entry.key
    if (line === undefined) return
    line.pending--
    // An idle key is forgotten unless it has rates: its windows (and a charge after its last settle) must hold.
    if (line.pending === 0 && !this.rated(line)) this.keys.delete(line.name)
    // A key held at its limit may take another now.
    if (this.setting(line, "limit") !== undefined) this.wake()
  }

  enqueueReady(entry: Entry<A>, fresh = false): void {
    entry.state = "ready"
    entry.receiptHandle = undefined
    if (entry.key === undefined) {
      if (!fresh) entry.seq = this.seq()
      this.unkeyed.push(entry, fresh)
    } else {
      this.wakeKey(entry.key)
      entry.key.ready.push(entry, fresh)
    }
  }

  hide(entry: Entry<A>, visibleAt: number): void {
    entry.state = "hidden"
    entry.visibleAt = visibleAt
    this.hidden.push(visibleAt, entry)
    // Acknowledged, extended and nacked entries leave stale nodes behind; rebuild before they dominate.
    if (this.hidden.size > 1024 && this.hidden.size > 4 * this.live) this.compact()
  }

  private compact(): void {
    const heap = new MinHeap<Entry<A>>()
    this.hidden.forEach((key, entry) => {
      if (entry.state === "hidden" && entry.visibleAt === key) heap.push(key, entry)
    })
    this.hidden = heap
  }

  delete(entry: Entry<A>): void {
    entry.state = "deleted"
    this.live--
  }

  /** When the next hidden entry may become visible (epoch ms), if any. */
  nextVisibleAt(): number | undefined {
    return this.hidden.peekKey()
  }

  /** Moves every hidden entry whose time has come back to its line, in its first place. */
  promote(now: number): void {
    for (let key = this.hidden.peekKey(); key !== undefined && key <= now; key = this.hidden.peekKey()) {
      const entry = this.hidden.pop()!
      // Stale heap node: the entry was extended, nacked, received again or deleted since.
      if (entry.state === "hidden" && entry.visibleAt <= now) {
        // A lease that ran out stops counting against its key's limit, and was held until its visibility passed.
        if (entry.key?.leases.delete(entry) === true) this.charge(entry, entry.visibleAt - entry.chargedUntil)
        this.enqueueReady(entry)
      }
    }
  }

  /** Whether `line` has a start or token rate (its own or the queue's default). */
  rated(line: KeyLine<A>): boolean {
    return this.setting(line, "startIntervalMillis") !== undefined ||
      this.setting(line, "tokenIntervalMillis") !== undefined
  }

  /** Whether `line` may start another entry now: under its limit and its rates. */
  eligible(line: KeyLine<A>, now: number): boolean {
    return this.heldBack(line, now) === undefined
  }

  /** Why `line` may not start another entry now (at its limit, over a rate), or `undefined` if it may. */
  heldBack(line: KeyLine<A>, now: number): Scheduling.HeldBack | undefined {
    const limit = this.setting(line, "limit")
    if (limit !== undefined && line.leases.size >= limit) return "limit"
    const starts = this.setting(line, "startLimit")
    const startsPer = this.setting(line, "startIntervalMillis")
    if (starts !== undefined && startsPer !== undefined) {
      // A clock set back inside (or before) the window counts in it: only a later window starts afresh.
      const used = Scheduling.windowStart(now, startsPer) <= line.startsWindow ? line.startsUsed : 0
      if (used >= starts) return "starts"
    }
    const tokens = this.setting(line, "tokenLimit")
    const tokensPer = this.setting(line, "tokenIntervalMillis")
    if (tokens !== undefined && tokensPer !== undefined) {
      const used = Scheduling.windowStart(now, tokensPer) <= line.tokensWindow ? line.tokensUsed : 0
      if (used >= tokens) return "tokens"
    }
    return undefined
  }

  /**
   * Takes the next entry to deliver: the eligible key with the lowest share clock (ties by name) against the
   * unkeyed line, the one whose head goes first by (priority, first enqueue).
   */
  takeNext(now: number, held?: Record<Scheduling.HeldBack, Set<string>>): Entry<A> | undefined {
    let pick: KeyLine<A> | undefined
    for (const line of this.keys.values()) {
      if (line.ready.size === 0) continue
      const reason = this.heldBack(line, now)
      if (reason !== undefined) {
        held?.[reason].add(line.name)
        continue
      }
      if (pick === undefined || line.vtime < pick.vtime || (line.vtime === pick.vtime && line.name < pick.name)) {
        pick = line
      }
    }
    const keyed = pick?.ready.peek()
    const unkeyed = this.unkeyed.peek()
    // Priority orders a line's own entries only: between the unkeyed line and the fair pick, the first sent.
    if (unkeyed !== undefined && (keyed === undefined || unkeyed.seq < keyed.seq)) {
      this.unkeyed.take(unkeyed)
      return unkeyed
    }
    if (keyed === undefined) return undefined
    pick!.ready.take(keyed)
    return keyed
  }

  /**
   * Charges a claim of `entry` to its key — the lease's expected length (the key's mean, or the visibility
   * before it has one), corrected when the lease ends — and counts the start.
   */
  started(entry: Entry<A>, now: number, visibilityMillis: number): void {
    const line = entry.key
    if (line === undefined) return
    line.picked = line.vtime
    // Before its first settle a key's mean starts at the visibility (a prior that one instant settle only moves
    // a quarter of the way: a key cannot make itself look free by acknowledging one message at once).
    line.mean ??= visibilityMillis
    const estimate = line.mean
    entry.weight = this.weight(line)
    entry.leaseStart = now
    entry.chargedUntil = now + estimate
    this.charge(entry, estimate)
    line.leases.add(entry)
    const per = this.setting(line, "startIntervalMillis")
    if (per !== undefined) {
      const window = Scheduling.windowStart(now, per)
      if (window > line.startsWindow) {
        line.startsWindow = window
        line.startsUsed = 0
      }
      line.startsUsed++
    }
  }

  /** A key line that left (idle, no rates then) taken back, so a charge made after its last settle holds. */
  keptLine(line: KeyLine<A>): KeyLine<A> {
    if (this.rated(line)) this.keys.set(line.name, line)
    return line
  }

  /** Charges `tokens` to the key's token window. */
  chargeTokens(line: KeyLine<A>, now: number, tokens: number): void {
    const per = this.setting(line, "tokenIntervalMillis")
    if (per === undefined) return
    const window = Scheduling.windowStart(now, per)
    if (window > line.tokensWindow) {
      line.tokensWindow = window
      line.tokensUsed = 0
    }
    line.tokensUsed += tokens
  }

  /** When a key held back by a rate gets its next window (epoch ms), if any waits with ready entries. */
  nextWindowAt(now: number): number | undefined {
    let next: number | undefined
    for (const line of this.keys.values()) {
      if (line.ready.size === 0 || this.eligible(line, now)) continue
      for (const per of [this.setting(line, "startIntervalMillis"), this.setting(line, "tokenIntervalMillis")]) {
        if (per === undefined) continue
        const turn = Scheduling.windowStart(now, per) + per
        if (next === undefined || turn < next) next = turn
      }
    }
    return next
  }

  purge(): number {
    const count = this.live
    this.journals.clear()
    this.unkeyed.clear()
    for (const line of this.keys.values()) line.ready.clear()
    this.keys.clear()
    this.hidden.forEach((_, entry) => {
      entry.state = "deleted"
    })
    this.live = 0
    this.hidden.clear()
    return count
  }

  /** The signal a waiting receiver sleeps on; armed in the same step that found nothing. */
  arm(): Deferred.Deferred<void> {
    return this.signal ??= Deferred.unsafeMake<void>(FiberId.none)
  }

  wake(): void {
    if (this.signal !== undefined) {
      Deferred.unsafeDone(this.signal, Exit.void)
      this.signal = undefined
    }
  }
}
