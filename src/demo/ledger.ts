/**
 * The demo's accounting: every request id it sent is matched to what became
 * of it — its replies, its dead letters, or still being in the queue — rather
 * than counted by subtraction, where a request both answered and
 * dead-lettered would hide a lost one. Pure, so the rules are tested apart
 * from the processes.
 */

/** Some ids: how many, and the first few by name. */
export interface Ids {
  readonly count: number
  readonly ids: ReadonlyArray<string>
}

/** How many ids an `Ids` names. */
export const shown = 5

const ids = (all: ReadonlyArray<string>): Ids => ({ count: all.length, ids: all.slice(0, shown) })

/** Where each id was found once the workers stopped (an id may appear more than once in each). */
export interface Found {
  /** The request id of every reply read (one entry per reply). */
  readonly replies: ReadonlyArray<string>
  /** The request id of every dead letter of the requests queue (one entry per letter). */
  readonly deadLetters: ReadonlyArray<string>
  /** The request id of every message still in the requests queue, queued or in flight. */
  readonly queued: ReadonlyArray<string>
}

/** Every sent id accounted for. */
export interface Ledger {
  /** Ids with at least one reply. */
  readonly answered: Ids
  readonly deadLettered: Ids
  readonly leftQueued: Ids
  /** Sent, and neither answered, nor dead-lettered, nor still queued. */
  readonly lost: Ids
  /** Answered more than once (at-least-once allows it: reported, not a failure). */
  readonly duplicated: Ids
  /** Settled twice over: answered and dead-lettered, or dead-lettered more than once. */
  readonly doublySettled: Ids
  /** Replies or dead letters for ids that were never sent. */
  readonly unknown: Ids
}

const tally = (all: ReadonlyArray<string>): Map<string, number> => {
  const counts = new Map<string, number>()
  for (const id of all) counts.set(id, (counts.get(id) ?? 0) + 1)
  return counts
}

/** Matches every sent id (in the order sent) to what was found. */
export const reconcile = (sent: ReadonlyArray<string>, found: Found): Ledger => {
  const replies = tally(found.replies)
  const letters = tally(found.deadLetters)
  const queued = new Set(found.queued)
  const known = new Set(sent)
  const where = (predicate: (id: string) => boolean) => ids(sent.filter(predicate))
  const count = (map: Map<string, number>, id: string) => map.get(id) ?? 0
  return {
    answered: where((id) => count(replies, id) > 0),
    deadLettered: where((id) => count(letters, id) > 0),
    leftQueued: where((id) => queued.has(id)),
    lost: where((id) => count(replies, id) === 0 && count(letters, id) === 0 && !queued.has(id)),
    duplicated: where((id) => count(replies, id) > 1),
    doublySettled: where((id) => (count(replies, id) > 0 && count(letters, id) > 0) || count(letters, id) > 1),
    unknown: ids([...new Set([...replies.keys(), ...letters.keys()])].filter((id) => !known.has(id)))
  }
}

/** Nothing lost, nothing settled twice, nothing unexplained: what the demo's exit code stands for. */
export const accountedFor = (ledger: Ledger): boolean =>
  ledger.lost.count === 0 && ledger.doublySettled.count === 0 && ledger.unknown.count === 0

/** ` (r4, r9)`: the first few ids in brackets, `…` when there are more than `count` named; nothing for none. */
export const named = (all: ReadonlyArray<string>, count = all.length): string =>
  all.length === 0 ? "" : ` (${all.slice(0, shown).join(", ")}${count > Math.min(all.length, shown) ? ", …" : ""})`

/** `3 (r4, r9, r12)`, or `0`; with more than are named, `12 (r4, r9, r12, r13, r20, …)`. */
export const describe = (some: Ids): string => `${some.count}${named(some.ids, some.count)}`
