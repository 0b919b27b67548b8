/**
 * Journal: the step journal of an agent run, so that a redelivered request
 * resumes where the last delivery stopped instead of paying for every model
 * call and running every tool again.
 *
 * `InnerLoop` records each completed step of an evaluation — a model turn
 * (its response and tokens), a tool call's result, an evaluation's outcome
 * (a subagent's, or the run's own) — before the run moves past it, in the
 * mailbox's store (memory, SQLite, PostgreSQL) beside the request's message.
 * When the request is delivered again, the evaluation replays the journal:
 * recorded responses and results come back without calling the model or the
 * tool, in order, and the run goes on live from the first step not recorded.
 *
 * Steps are found by their place in the run, a key: `"1"` is the first
 * evaluation, `"1.1"` its first model turn, `"1.2"` the first tool it called,
 * `"1.2.1"` a subagent that tool evaluated, and so on — so a tool that reran
 * (it was not recorded) still finds its subagents' recorded steps. Each step
 * also records what was asked (a digest of the model request, the tool's name
 * and parameters): a run that asks for something else at a recorded step (the
 * prompt or the code changed) stops there with `JournalDivergedError`, never a
 * mix of two runs. A tool made with `replay: "rerun"` runs again on replay; if
 * its result differs from the recorded one, what was recorded after it no
 * longer follows, and is discarded.
 *
 * A journal also names its message (`identity`: the stored message's own, unique across queues, prefixes and
 * databases, the same on every delivery): the base of a tool's `idempotencyKey`, never the sender's request id,
 * which only labels the steps for the operator. Sizes are UTF-8 bytes, as the store keeps them.
 *
 * Appends are checked against the delivery's lease in the store: a delivery
 * that lost its lease (a zombie) cannot record, and its run stops with
 * `JournalStoreError` (`reason: "lease lost"`). The journal is deleted with
 * the message's acknowledgement, and kept when the loop dead-letters it.
 * `MainLoop` gives each attempt its journal (`context.journal`). Subagents a
 * tool evaluates at once take their keys in the order they start; two
 * evaluations started at once by one attempt's own code must not share a scope.
 */
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Metric from "effect/Metric"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import {
  type DeliveryJournal,
  Journaled,
  journalOf,
  maxSteps as stepLimit,
  type StoredStep,
  utf8Bytes
} from "./internal/journal.js"
import { counter } from "./internal/metrics.js"

// ---------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------

const Count = Schema.Int.pipe(Schema.nonNegative())
const Millis = Schema.Number.pipe(Schema.nonNegative())
const Usage = Schema.Struct({ inputTokens: Count, outputTokens: Count })

/**
 * A model turn: what the model answered (text, tool calls) and the tokens it used.
 *
 * @category schemas
 */
export const Turn = Schema.TaggedStruct("Turn", {
  key: Schema.String,
  promptName: Schema.String,
  /** A digest of the model request (the prompt, the conversation so far, the tools on offer). */
  asked: Schema.String,
  text: Schema.String,
  toolCalls: Schema.Array(Schema.Struct({ id: Schema.String, name: Schema.String, params: Schema.Unknown })),
  usage: Usage,
  durationMs: Millis
})

/**
 * A tool call's outcome: for a `"journal"` tool its result as the model saw it (`value`: the encoded result
 * when `ok`, the error message when not); for a `"rerun"` tool only a digest of it.
 *
 * @category schemas
 */
export const ToolStep = Schema.TaggedStruct("Tool", {
  key: Schema.String,
  promptName: Schema.String,
  toolName: Schema.String,
  callId: Schema.String,
  /** A digest of the tool's name and parameters. */
  asked: Schema.String,
  replay: Schema.Literal("journal", "rerun"),
  ok: Schema.Boolean,
  value: Schema.optional(Schema.Unknown),
  digest: Schema.optional(Schema.String),
  durationMs: Millis
})

/**
 * An evaluation's outcome (a subagent's, or the run's own): its final text and the tokens of all its turns.
 *
 * @category schemas
 */
export const Evaluation = Schema.TaggedStruct("Evaluation", {
  key: Schema.String,
  promptName: Schema.String,
  /** A digest of the prompt as evaluated (name, instructions, messages, tools). */
  asked: Schema.String,
  text: Schema.String,
  usage: Usage,
  durationMs: Millis
})

/**
 * One recorded step.
 *
 * @category schemas
 */
export const Step = Schema.Union(Turn, ToolStep, Evaluation)

/**
 * One recorded step.
 *
 * @category models
 */
export type Step = typeof Step.Type

/**
 * The largest step recorded, in UTF-8 bytes of its JSON text (as the store keeps it: a '€' is 3 bytes, an emoji 4):
 * a tool that returns more can say `replay: "rerun"`.
 */
export const maxStepBytes = 4 * 1024 * 1024

/** The most steps one request's journal holds: a run that would record more stops with `JournalStoreError`. */
export const maxSteps: number = stepLimit

/**
 * What a step is, for an error message or a listing: `model turn of prompt "triage"`.
 *
 * @category utils
 */
export const describe = (step: Step): string => {
  switch (step._tag) {
    case "Turn":
      return `a model turn of prompt "${step.promptName}"`
    case "Tool":
      return `tool "${step.toolName}"`
    case "Evaluation":
      return `the evaluation of prompt "${step.promptName}"`
  }
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/**
 * Steps recorded in a journal.
 *
 * @category metrics
 */
export const stepsRecorded = counter("leasehold_journal_steps_recorded_total", "Agent steps recorded in a journal")

/**
 * Steps a redelivered run took from its journal instead of calling the model or running the tool again.
 *
 * @category metrics
 */
export const stepsReplayed = counter(
  "leasehold_journal_steps_replayed_total",
  "Agent steps replayed from a journal (no model call, no tool run)"
)

/**
 * Runs that asked for something else than their journal recorded (`JournalDivergedError`).
 *
 * @category metrics
 */
export const divergences = counter("leasehold_journal_divergences_total", "Agent runs that diverged from their journal")

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/**
 * The run asked for something other than what its journal recorded at `key`: replay stops there.
 *
 * @category errors
 */
export class JournalDivergedError extends Schema.TaggedError<JournalDivergedError>()("JournalDivergedError", {
  requestId: Schema.optional(Schema.String),
  key: Schema.String,
  /** What the journal holds at the step. */
  recorded: Schema.String,
  /** What the run asked for there. */
  asked: Schema.String
}) {
  override get message(): string {
    return `The run diverged from its journal at step ${this.key}${
      this.requestId === undefined ? "" : ` of request ${this.requestId}`
    }: the journal recorded ${this.recorded}, the run asked for ${this.asked}. ` +
      "The prompt, a tool's parameters or the code changed since the step was recorded"
  }
}

/**
 * A step could not be recorded or read: this delivery lost its lease (`"lease lost"`), the store failed
 * (`"unavailable"`), the step is larger than `maxStepBytes` (`"too large"`), or a stored step does not decode
 * (`"undecodable"`).
 *
 * @category errors
 */
export class JournalStoreError extends Schema.TaggedError<JournalStoreError>()("JournalStoreError", {
  requestId: Schema.optional(Schema.String),
  key: Schema.optional(Schema.String),
  reason: Schema.Literal("lease lost", "unavailable", "too large", "undecodable"),
  detail: Schema.String
}) {
  override get message(): string {
    const where = this.key === undefined ? "" : ` at step ${this.key}`
    const of = this.requestId === undefined ? "" : ` of request ${this.requestId}`
    return `The journal${of} failed${where} (${this.reason}): ${this.detail}`
  }
}

/**
 * Either journal failure: a run stops on it.
 *
 * @category errors
 */
export type JournalError = JournalDivergedError | JournalStoreError

// ---------------------------------------------------------------------------
// The journal
// ---------------------------------------------------------------------------

/**
 * One scope of a run's journal: the steps of the run (`path` `""`), or the steps inside one step.
 *
 * @category models
 */
export interface Journal {
  /** The request the run answers, if known. */
  readonly requestId: string | undefined
  /** The prefix of this scope's keys: `""` for the run, `"1.2."` for the steps inside step `1.2`. */
  readonly path: string
  /** Whether steps are kept anywhere (`false`: `unrecorded`, which only counts keys). */
  readonly durable: boolean
  /**
   * The stored message's own name, the base of a tool's idempotency key: unique among every message of every
   * store (queue, table prefix and database included), the same on every delivery of the message, never taken from
   * its body. `undefined` when unknown (`unrecorded` without one).
   */
  readonly identity: Effect.Effect<string | undefined, JournalStoreError>
  /** The key of this scope's next step (`"1.3"`): steps take keys in the order they start. */
  readonly nextKey: () => string
  /** The step earlier deliveries recorded at `key`, if any (the first look reads the journal from the store). */
  readonly recorded: (key: string) => Effect.Effect<Step | undefined, JournalStoreError>
  /** Records `step` under its key, while the delivery holds its message. */
  readonly append: (step: Step) => Effect.Effect<void, JournalStoreError>
  /** Discards the step recorded at `key` and every step recorded after it (a rerun tool changed its result). */
  readonly discardFrom: (key: string) => Effect.Effect<void, JournalStoreError>
  /** The scope of the steps inside step `key`. */
  readonly within: (key: string) => Journal
}

const decodeStep = Schema.decodeUnknownEither(Schema.parseJson(Step))
const encodeStep = Schema.encodeEither(Schema.parseJson(Step))

/**
 * The UTF-8 bytes `step` takes as the journal stores it (its JSON text): what `maxStepBytes` bounds, measured as
 * `append` measures it; `undefined` when the step cannot be encoded (`append` says why). The inner loop refuses a
 * model turn over the limit with this measure before it is recorded.
 *
 * @category utils
 */
export const stepBytes = (step: Step): number | undefined =>
  Either.match(encodeStep(step), { onLeft: () => undefined, onRight: utf8Bytes })

/** A recorded step and where it sits. */
interface Placed {
  readonly position: number
  readonly step: Step
}

/** What every scope of one delivery's journal shares: the steps read from the store, and the next position. */
class Log {
  private steps: Map<string, Placed> | undefined
  private next = 1
  private found: DeliveryJournal | undefined
  constructor(
    /** The delivery whose journal this is; none for `unrecorded`. */
    private readonly message: object | undefined,
    readonly requestId: string | undefined,
    /** The message's first delivery: nothing can have been recorded, and the store is not asked. */
    private readonly firstDelivery: boolean,
    /** The message's identity when known without a store (`unrecorded`). */
    private readonly given?: string | undefined
  ) {}

  private named: string | undefined

  /** The message's identity (see `Journal.identity`), asked of the store once. */
  get identity(): Effect.Effect<string | undefined, JournalStoreError> {
    return Effect.suspend(() => {
      const delivery = this.delivery
      if (this.named !== undefined || delivery === undefined) return Effect.succeed(this.named ?? this.given)
      return delivery.identity.pipe(
        Effect.mapError(this.storeFailure(undefined)),
        Effect.tap((identity) => {
          this.named = identity
        })
      )
    })
  }

  get durable(): boolean {
    return this.message !== undefined
  }

  /** The delivery's journal, asked of the message when first used: most attempts (no agent) never do. */
  get delivery(): DeliveryJournal | undefined {
    if (this.message === undefined) return undefined
    return this.found ??= journalOf(this.message)
  }

  private failure(reason: JournalStoreError["reason"], detail: string, key?: string): JournalStoreError {
    return new JournalStoreError({
      ...(this.requestId === undefined ? {} : { requestId: this.requestId }),
      ...(key === undefined ? {} : { key }),
      reason,
      detail
    })
  }

  private storeFailure(key: string | undefined) {
    return (error: { readonly _tag: string; readonly message: string }) =>
      error._tag === "ReceiptHandleExpiredError"
        ? this.failure("lease lost", `this delivery no longer holds the request: ${error.message}`, key)
        : this.failure("unavailable", error.message, key)
  }

  /** The recorded steps by key, read from the store at the first look (made only then: most attempts never look). */
  get loaded(): Effect.Effect<Map<string, Placed>, JournalStoreError> {
    return this.steps !== undefined ? Effect.succeed(this.steps) : Effect.suspend(() => this.read())
  }

  private read(): Effect.Effect<Map<string, Placed>, JournalStoreError> {
    if (this.steps !== undefined) return Effect.succeed(this.steps)
    if (this.message === undefined || this.firstDelivery) return Effect.succeed(this.steps = new Map())
    return this.delivery!.load.pipe(
      Effect.mapError(this.storeFailure(undefined)),
      Effect.flatMap((stored) => {
        if (stored.length > maxSteps) {
          return Effect.fail(this.failure("too large", `the journal holds more than ${maxSteps} steps`))
        }
        const steps = new Map<string, Placed>()
        for (const { entry, key, position } of stored) {
          const decoded = decodeStep(entry)
          if (Either.isLeft(decoded) || decoded.right.key !== key) {
            return Effect.fail(this.failure(
              "undecodable",
              Either.isLeft(decoded)
                ? `the stored step does not decode: ${ParseResult.TreeFormatter.formatErrorSync(decoded.left)}`
                : `the stored step says it is step ${decoded.right.key}`,
              key
            ))
          }
          steps.set(key, { position, step: decoded.right })
          this.next = Math.max(this.next, position + 1)
        }
        this.steps = steps
        return Effect.succeed(steps)
      })
    )
  }

  recorded(key: string): Effect.Effect<Step | undefined, JournalStoreError> {
    return Effect.map(this.loaded, (steps) => steps.get(key)?.step)
  }

  append(step: Step): Effect.Effect<void, JournalStoreError> {
    return Effect.flatMap(this.loaded, (steps) => {
      if (this.delivery === undefined) return Effect.void
      const encoded = encodeStep(step)
      if (Either.isLeft(encoded)) {
        return Effect.fail(this.failure(
          "undecodable",
          `the step cannot be encoded: ${ParseResult.TreeFormatter.formatErrorSync(encoded.left)}`,
          step.key
        ))
      }
      const entry = encoded.right
      const bytes = utf8Bytes(entry)
      if (bytes > maxStepBytes) {
        return Effect.fail(this.failure(
          "too large",
          `${describe(step)} is ${bytes} bytes (UTF-8), more than the ${maxStepBytes} a step may be ` +
            `(a tool that returns this much can be made with replay: "rerun")`,
          step.key
        ))
      }
      if (this.next > maxSteps) {
        return Effect.fail(this.failure("too large", `the run would record more than ${maxSteps} steps`, step.key))
      }
      // The position is taken now: steps of concurrent subagents append at once, each at its own position.
      const stored: StoredStep = { position: this.next++, key: step.key, entry, requestId: this.requestId }
      return this.delivery.append(stored).pipe(
        Effect.mapError(this.storeFailure(step.key)),
        Effect.tap(() => {
          steps.set(step.key, { position: stored.position, step })
          return Metric.increment(stepsRecorded)
        })
      )
    })
  }

  discardFrom(key: string): Effect.Effect<void, JournalStoreError> {
    return Effect.flatMap(this.loaded, (steps) => {
      const from = steps.get(key)?.position
      if (from === undefined || this.delivery === undefined) return Effect.void
      return this.delivery.truncate(from).pipe(
        Effect.mapError(this.storeFailure(key)),
        Effect.tap(() => {
          for (const [other, placed] of steps) if (placed.position >= from) steps.delete(other)
          this.next = from
        })
      )
    })
  }
}

class Scope implements Journal {
  private count = 0
  constructor(private readonly log: Log, readonly path: string) {}
  get requestId(): string | undefined {
    return this.log.requestId
  }
  get durable(): boolean {
    return this.log.durable
  }
  get identity(): Effect.Effect<string | undefined, JournalStoreError> {
    return this.log.identity
  }
  nextKey(): string {
    return `${this.path}${++this.count}`
  }
  recorded(key: string): Effect.Effect<Step | undefined, JournalStoreError> {
    return this.log.recorded(key)
  }
  append(step: Step): Effect.Effect<void, JournalStoreError> {
    return this.log.append(step)
  }
  discardFrom(key: string): Effect.Effect<void, JournalStoreError> {
    return this.log.discardFrom(key)
  }
  within(key: string): Journal {
    return new Scope(this.log, `${key}.`)
  }
}

/**
 * The journal of the message `message` is a delivery of, when its mailbox keeps journals (`MailboxMemory`,
 * `MailboxSql`); `undefined` for another mailbox. `requestId` labels its steps for the operator.
 *
 * @category constructors
 */
export const forDelivery = (
  message: { readonly deliveryCount: number },
  requestId: string | undefined
): Journal | undefined =>
  Journaled in message ? new Scope(new Log(message, requestId, message.deliveryCount <= 1), "") : undefined

/**
 * A journal that keeps nothing: it only numbers steps (their keys make a tool's idempotency key, with `identity`
 * the message's own name when the caller knows one).
 *
 * @category constructors
 */
export const unrecorded = (requestId?: string, identity?: string): Journal =>
  new Scope(new Log(undefined, requestId, true, identity), "")

/**
 * Keeps the journal of `message` after its acknowledgement, for the operator: the loops call it when they
 * dead-letter a request. No effect on a mailbox that keeps no journals.
 *
 * @category utils
 */
export const keep = (message: object): Effect.Effect<void> => journalOf(message)?.keep ?? Effect.void
