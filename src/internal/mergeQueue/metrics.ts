/**
 * The merge queue's counters, made once here: the service increments them and `MergeQueue.ts` exports them.
 */
import { counter } from "../metrics.js"

export const claims = counter("leasehold_merge_queue_claims_total", "Entries claimed by nextWithLock")

export const locksCleaned = counter("leasehold_merge_queue_locks_cleaned_total", "Expired processing locks cleared")

export const entriesReclaimed = counter(
  "leasehold_merge_queue_entries_reclaimed_total",
  "In-progress entries returned to pending by recovery"
)

export const recoveryFailures = counter(
  "leasehold_merge_queue_recovery_failures_total",
  "Best-effort recoveries before a claim that failed (the claim went on)"
)
