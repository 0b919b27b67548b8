/**
 * A merge-queue entry's statuses and its state machine, as plain data: the `MergeQueue.Status` schema is made
 * from them, a transition's statement is given the moves it may make, and the command line's options list
 * them without loading the merge queue (its commands load it when they run).
 */

/** Every status, in life order. */
export const statuses = [
  "pending",
  "claimed",
  "rebasing",
  "testing",
  "ready_to_merge",
  "merging",
  "merged",
  "failed_retryable",
  "failed_terminal",
  "cancelled"
] as const

/** A status. */
export type Status = typeof statuses[number]

/** The statuses of an entry someone is working on: what recovery reclaims when no live lock carries it. */
export const inProgress: ReadonlyArray<Status> = ["claimed", "rebasing", "testing", "ready_to_merge", "merging"]

/** The statuses an entry never leaves. */
export const terminal: ReadonlyArray<Status> = ["merged", "failed_terminal", "cancelled"]

const failed: ReadonlyArray<Status> = ["failed_retryable", "failed_terminal"]

/** The legal moves; `pending → claimed` happens only through `nextWithLock`. */
export const moves: Readonly<Record<Status, ReadonlyArray<Status>>> = {
  pending: ["cancelled"],
  claimed: ["rebasing", ...failed, "cancelled"],
  rebasing: ["testing", ...failed, "cancelled"],
  testing: ["ready_to_merge", ...failed, "cancelled"],
  ready_to_merge: ["merging", ...failed, "cancelled"],
  merging: ["merged", ...failed],
  merged: [],
  failed_retryable: ["pending", "cancelled"],
  failed_terminal: [],
  cancelled: []
}

/** Whether `from → to` is a legal move. */
export const canTransition = (from: Status, to: Status): boolean => moves[from].includes(to)

/** The statuses an entry can move to `to` from: what a transition's statement checks the entry's status against. */
export const movesInto = (to: Status): ReadonlyArray<Status> => statuses.filter((from) => moves[from].includes(to))
