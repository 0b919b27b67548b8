/**
 * LeaseExtender: keeps a message invisible for exactly as long as the worker
 * proves it is working.
 *
 * Instead of a timer that extends the lease no matter what (and so keeps a
 * stuck worker's message hostage), the extender listens to a `Heartbeat`:
 * the first beat after `attach` extends the message's visibility by
 * `extension`, later beats at most once per `interval` counted from the last
 * successful extension, on the monotonic clock (a wall-clock step back must
 * not stop extensions while the worker works). A worker that stops beating
 * lets its lease run out and the message is redelivered elsewhere.
 *
 * The heartbeat forks each extension on its own fiber (`Heartbeat.forkOnBeat`)
 * so `beat` never waits on I/O; at most one is in flight and a beat that
 * arrives meanwhile is dropped. Closing the
 * attach scope stops listening and waits for an in-flight extension, so after
 * it closes nothing touches the message any more. Extension failures are
 * logged, never raised to the worker: extension is a reliability aid, and the
 * worker settles the message itself.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberId from "effect/FiberId"
import * as Metric from "effect/Metric"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type * as Heartbeat from "./Heartbeat.js"
import { type Bind, BindId, type Binding, type Flight } from "./internal/leaseExtender.js"
import { counter } from "./internal/metrics.js"
import * as Options_ from "./internal/options.js"

/** The longest visibility a mailbox's `extendVisibility` takes: an extension beyond it would fail every time. */
const maxExtension = Duration.hours(12)

/**
 * How often and by how much the lease is extended.
 *
 * @category models
 */
export class LeaseExtenderConfig extends Schema.Class<LeaseExtenderConfig>("leasehold/LeaseExtenderConfig")({
  /** Minimum time between two extensions, however often the worker beats (default 60 s; 0..12 h, below `extension`). */
  interval: Schema.optionalWith(
    Options_.duration({ max: maxExtension, range: "must be between 0 and 12 hours" }),
    { default: () => Duration.seconds(60) }
  ),
  /**
   * Visibility requested on each extension, from the moment of extension (default 300 s). More than zero (an
   * extension of zero would hand the message to another receiver while the worker works), at most the 12 h
   * every mailbox's `extendVisibility` takes, and longer than `interval` (or the lease runs out between two).
   */
  extension: Schema.optionalWith(
    Options_.duration({
      positive: true,
      max: maxExtension,
      range: "must be greater than zero and at most 12 hours"
    }),
    { default: () => Duration.seconds(300) }
  ),
  /** When false, `attach` does nothing (default true). */
  enabled: Schema.optionalWith(Schema.Boolean, { default: () => true })
}) {}

/**
 * What the extender needs of a message: its id and a way to extend its visibility.
 *
 * @category models
 */
export interface Extendable {
  readonly id: string
  /** A delivery's handle (a `Message`'s): a new one is a new delivery, even of the same object. */
  readonly receiptHandle?: string
  readonly extendVisibility: (timeout: Duration.Duration) => Effect.Effect<void, { readonly _tag: string }>
}

/**
 * `attach` was called while an earlier attach scope of the same extender is still open.
 *
 * @category errors
 */
export class AlreadyAttachedError extends Schema.TaggedError<AlreadyAttachedError>()("AlreadyAttachedError", {
  messageId: Schema.String,
  attachedTo: Schema.String
}) {
  override get message(): string {
    return `LeaseExtender is already attached to message ${this.attachedTo}; ` +
      `close that attach scope before attaching message ${this.messageId}`
  }
}

/**
 * Extends one message's lease at a time, driven by heartbeats.
 *
 * @category models
 */
export interface LeaseExtender {
  readonly config: LeaseExtenderConfig
  /** Extends `message` on `heartbeat`'s beats until the scope closes. */
  readonly attach: (
    message: Extendable,
    heartbeat: Heartbeat.Heartbeat
  ) => Effect.Effect<void, AlreadyAttachedError, Scope.Scope>
  /** Runs `effect` with `message` attached, detaching when it ends: `attach` without the cost of a Scope. */
  readonly extendWhile: <A, E, R>(
    message: Extendable,
    heartbeat: Heartbeat.Heartbeat,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | AlreadyAttachedError, R>
  /**
   * Attaches without a scope and returns the step that detaches (stop
   * listening, then wait for an extension in flight). For a caller that is
   * already uninterruptible and runs the detach step however its work ends.
   */
  readonly attachUnscoped: (
    message: Extendable,
    heartbeat: Heartbeat.Heartbeat
  ) => Effect.Effect<Effect.Effect<void>, AlreadyAttachedError>
}

/**
 * Extensions that succeeded.
 *
 * @category metrics
 */
export const extensions = counter("leasehold_lease_extensions_total", "Lease extensions that succeeded")

/**
 * Extensions that failed (expired handle or store error).
 *
 * @category metrics
 */
export const extensionFailures = counter("leasehold_lease_extension_failures_total", "Lease extensions that failed")

/**
 * One message attached to an extender and its extensions so far. For `attachUnscoped` it is also the task its
 * heartbeat forks on beats (`due`, `run`); a binding makes one when a beat first finds a new message in hand.
 */
class Attachment implements Heartbeat.BeatTask {
  /** When the last extension started, on the monotonic clock (the beat's time). */
  lastExtension: number | undefined = undefined
  /** The lease is gone (its handle expired): no further extension is tried, nor logged, for this attachment. */
  lost = false
  /** Failed extensions since the last one that worked: only the first of a run of failures is logged as an error. */
  failures = 0
  /** The delivery this attachment is for: a mailbox may hand the same object out again with a new handle. */
  readonly handle: string | undefined
  constructor(
    readonly message: Extendable,
    private readonly extender: { readonly current: Attachment | undefined; readonly intervalMillis: number },
    private readonly extend: (attachment: Attachment, now: number) => Effect.Effect<void>
  ) {
    this.handle = message.receiptHandle
  }

  /** Whether a beat at `now` may extend: the lease not lost, and `interval` passed since the last extension. */
  ready(now: number): boolean {
    return !this.lost &&
      (this.lastExtension === undefined || now - this.lastExtension >= this.extender.intervalMillis)
  }

  /** Called synchronously on every beat: the rate-limited path allocates nothing. */
  due(now: number): boolean {
    return this.extender.current === this && this.ready(now)
  }

  run(now: number): Effect.Effect<void> {
    return this.extend(this, now)
  }
}

/**
 * One loop's binding (`internal/leaseExtender`): the task registered on its heartbeat for the run. The worker
 * writes `subject`; the heartbeat skips the task while it is `undefined` (between messages, where the loop
 * beats), so a message that no beat finds in hand costs the extender nothing. A message's attachment is made
 * when a beat first finds it in hand (a worker hands each message object over once).
 */
class Bound implements Binding, Heartbeat.BeatTask {
  subject: Extendable | undefined = undefined
  flight: Flight | undefined = undefined
  stop: Effect.Effect<void> = Effect.void
  /** The attachment of the last message a beat found in hand. */
  private attachment: Attachment | undefined = undefined
  /** The attachment the last due beat was for: its run extends it only if it is still in hand then. */
  private pending: Attachment | undefined = undefined
  constructor(
    private readonly state: { readonly current: Attachment | undefined; readonly intervalMillis: number },
    private readonly extend: (attachment: Attachment, now: number) => Effect.Effect<void>
  ) {}

  due(now: number): boolean {
    const message = this.subject
    if (message === undefined) return false
    let attachment = this.attachment
    if (attachment === undefined || attachment.message !== message || attachment.handle !== message.receiptHandle) {
      attachment = this.attachment = new Attachment(message, this.state, this.extend)
    }
    if (!attachment.ready(now)) return false
    this.pending = attachment
    return true
  }

  // The run starts a moment after its beat, on its own fiber: it extends the message that was due only if that
  // message is still in hand then — one detached meanwhile is being settled and must not be touched. `flight`
  // is the run that started, and the message it extends: the worker's detach waits for it.
  run(now: number): Effect.Effect<void> {
    return Effect.suspend(() => {
      const attachment = this.pending
      this.pending = undefined
      if (attachment === undefined || this.subject !== attachment.message) return Effect.void
      const started: Flight = this.flight = { message: attachment.message, done: Deferred.unsafeMake(FiberId.none) }
      return Effect.ensuring(
        this.extend(attachment, now),
        Effect.suspend(() => {
          if (this.flight === started) this.flight = undefined
          return Deferred.succeed(started.done, undefined)
        })
      )
    })
  }
}

/**
 * Options of `make`: `LeaseExtenderConfig`'s fields as callers write them.
 *
 * @category models
 */
export type Options = Partial<{
  interval: Duration.DurationInput
  extension: Duration.DurationInput
  enabled: boolean
}>

const decodeOptions = Options_.classDecoder(
  "LeaseExtender.make",
  LeaseExtenderConfig,
  ({ extension, interval }) =>
    Duration.lessThanOrEqualTo(extension, interval)
      ? {
        field: "extension",
        message: `must be longer than interval (${Duration.format(interval)}): ` +
          "the lease would run out between two extensions"
      }
      : undefined
)

/**
 * Makes an extender; config that cannot work (a negative interval, an extension of zero, beyond 12 h or not
 * longer than the interval, NaN in any form) fails with a `ParseError` naming it.
 *
 * @category constructors
 */
export const make = (config?: Options): Effect.Effect<LeaseExtender, ParseResult.ParseError> =>
  Effect.map(decodeOptions(config), (config): LeaseExtender => {
    // What the attachments read: the one attached now, and the interval.
    const state: { current: Attachment | undefined; readonly intervalMillis: number } = {
      current: undefined,
      intervalMillis: Duration.toMillis(config.interval)
    }

    // A handle that expired is final: the message is another delivery's now, and extending it again on every
    // beat until the work ends only repeats the warning. Any other failure (the store is down) is retried on the
    // next beat; the first of a run of them is logged as an error, the rest at debug level (every one counted).
    const extend = (attachment: Attachment, now: number) =>
      // Suspended: an `extendVisibility` that throws as it is called is this extension's failure, logged and counted.
      Effect.suspend(() => attachment.message.extendVisibility(config.extension)).pipe(
        Effect.zipRight(Effect.sync(() => {
          attachment.lastExtension = now
          attachment.failures = 0
        })),
        Effect.tap(() => Metric.increment(extensions)),
        Effect.tap(() => Effect.logDebug(`Extended visibility by ${Duration.format(config.extension)}`)),
        Effect.catchAllCause((cause) =>
          Effect.zipRight(
            Metric.increment(extensionFailures),
            Effect.suspend(() => {
              if (cause._tag === "Fail" && cause.error._tag === "ReceiptHandleExpiredError") {
                attachment.lost = true
                return Effect.logWarning("Lease extension failed: receipt handle expired; no longer extending it")
              }
              return attachment.failures++ === 0
                ? Effect.logError("Lease extension failed; retrying on the next beats", cause)
                : Effect.logDebug(`Lease extension failed again (${attachment.failures} in a row)`, cause)
            })
          )
        ),
        Effect.withSpan("LeaseExtender.extend", { attributes: { messageId: attachment.message.id } }),
        Effect.annotateLogs({ module: "LeaseExtender", messageId: attachment.message.id })
      )

    const attachUnscoped = (
      message: Extendable,
      heartbeat: Heartbeat.Heartbeat
    ): Effect.Effect<Effect.Effect<void>, AlreadyAttachedError> =>
      Effect.suspend(() => {
        const current = state.current
        if (current !== undefined) {
          return Effect.fail(new AlreadyAttachedError({ messageId: message.id, attachedTo: current.message.id }))
        }
        const attachment = state.current = new Attachment(message, state, extend)
        // The heartbeat forks each extension (one in flight, beats meanwhile dropped); its detach step stops
        // listening and waits for the one in flight.
        return Effect.map(heartbeat.forkOnBeat(attachment), (stop) =>
          Effect.zipRight(
            Effect.sync(() => {
              if (state.current === attachment) state.current = undefined
            }),
            stop
          ))
      })

    // One registration on the heartbeat for a loop's run; per message the worker only writes `subject`.
    const bind: Bind = (heartbeat) => {
      const bound = new Bound(state, extend)
      return Effect.map(heartbeat.forkOnBeat(bound), (stop) => {
        bound.stop = stop
        return bound
      })
    }

    const attach = (message: Extendable, heartbeat: Heartbeat.Heartbeat) =>
      Effect.flatMap(attachUnscoped(message, heartbeat), (detach) => Effect.addFinalizer(() => detach))

    const extendWhile = <A, E, R>(
      message: Extendable,
      heartbeat: Heartbeat.Heartbeat,
      effect: Effect.Effect<A, E, R>
    ) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(
          attachUnscoped(message, heartbeat),
          (detach): Effect.Effect<A, E | AlreadyAttachedError, R> => Effect.ensuring(restore(effect), detach)
        )
      )

    const extender: LeaseExtender = {
      config,
      attach: config.enabled ? attach : () => Effect.void,
      extendWhile: config.enabled ? extendWhile : (_message, _heartbeat, effect) => effect,
      attachUnscoped: config.enabled ? attachUnscoped : () => Effect.succeed(Effect.void)
    }
    const binder: Bind = config.enabled
      ? bind
      : () => Effect.sync((): Binding => ({ subject: undefined, flight: undefined, stop: Effect.void }))
    Object.defineProperty(extender, BindId, { value: binder, enumerable: false })
    return extender
  })

/**
 * Makes an extender with the default config.
 *
 * @category constructors
 */
// `orDie`: setup that cannot fail (STYLE rule 4): with no config, `make` decodes the schema's own defaults.
export const makeDefault: Effect.Effect<LeaseExtender> = Effect.orDie(make())
