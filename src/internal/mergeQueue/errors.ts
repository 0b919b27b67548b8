/**
 * The merge queue's errors and the `Status` schema they carry: the leaf that the public module
 * (`MergeQueue.ts`, which re-exports them) and the service that raises them (`service.ts`) both import.
 */
import * as Schema from "effect/Schema"
import * as Statuses from "./statuses.js"

/**
 * Where an entry is in its life.
 *
 * @category schemas
 */
export const Status = Schema.Literal(...Statuses.statuses)

/**
 * The database failed; the operation changed nothing (its transaction rolled back).
 *
 * @category errors
 */
export class MergeQueueStoreError extends Schema.TaggedError<MergeQueueStoreError>()("MergeQueueStoreError", {
  operation: Schema.String,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `MergeQueue ${this.operation} failed in the database: ${String(this.cause)}`
  }
}

/**
 * No entry has this id.
 *
 * @category errors
 */
export class EntryNotFoundError extends Schema.TaggedError<EntryNotFoundError>()("EntryNotFoundError", {
  entryId: Schema.Number
}) {
  override get message(): string {
    return `Merge queue entry ${this.entryId} does not exist`
  }
}

/**
 * The state machine does not allow this move.
 *
 * @category errors
 */
export class InvalidTransitionError extends Schema.TaggedError<InvalidTransitionError>()("InvalidTransitionError", {
  entryId: Schema.Number,
  from: Status,
  to: Status
}) {
  override get message(): string {
    const allowed = Statuses.moves[this.from]
    return `Merge queue entry ${this.entryId} cannot go from ${this.from} to ${this.to}` +
      (allowed.length === 0 ? ` (${this.from} is final)` : ` (allowed: ${allowed.join(", ")})`)
  }
}

/**
 * The agent no longer owns the entry: its lock expired, was released, or
 * was taken over with a newer fencing token. Nothing was changed.
 *
 * @category errors
 */
export class LockLostError extends Schema.TaggedError<LockLostError>()("LockLostError", {
  entryId: Schema.Number,
  /** The fencing token presented; absent when none was (an entry id alone). */
  token: Schema.optional(Schema.Number),
  reason: Schema.String
}) {
  override get message(): string {
    const under = this.token === undefined ? "without a claim" : `under fencing token ${this.token}`
    return `Merge queue entry ${this.entryId} cannot be changed ${under}: ${this.reason}`
  }
}

/**
 * The workspace already has an entry that is not final.
 *
 * @category errors
 */
export class AlreadyQueuedError extends Schema.TaggedError<AlreadyQueuedError>()("AlreadyQueuedError", {
  workspace: Schema.String,
  entryId: Schema.Number
}) {
  override get message(): string {
    return `Workspace ${JSON.stringify(this.workspace)} is already queued as entry ${this.entryId}`
  }
}
