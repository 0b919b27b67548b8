/**
 * RunContext: who runs an attempt at a request — the stable worker, a fresh
 * run id per attempt, the attempt number (the message's delivery count) and
 * the trace it continues.
 *
 * A leaf module: the loops make it, and agent code (tools, providers,
 * subagents) reads it, without either side importing the other.
 */
import * as Schema from "effect/Schema"

/**
 * Who ran an attempt: stable worker id, fresh run id per attempt, attempt = delivery count.
 *
 * @category models
 */
export interface RunContext {
  readonly workerId: string
  readonly runId: string
  readonly requestId: string
  readonly attempt: number
  readonly traceId?: string | undefined
  readonly spanId?: string | undefined
}

/**
 * The stored form of a `RunContext` (in replies and dead letters).
 *
 * @category schemas
 */
export const RunContextSchema: Schema.Schema<RunContext> = Schema.Struct({
  workerId: Schema.String,
  runId: Schema.String,
  requestId: Schema.String,
  attempt: Schema.Number,
  traceId: Schema.optional(Schema.String),
  spanId: Schema.optional(Schema.String)
})
