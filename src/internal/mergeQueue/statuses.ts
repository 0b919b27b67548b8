/**
 * A merge-queue entry's statuses, as plain data: the `MergeQueue.Status` schema is made from them, and the
 * command line's options list them without loading the merge queue (its commands load it when they run).
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
