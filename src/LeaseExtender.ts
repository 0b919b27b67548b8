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
 * The extension runs on its own fiber so `beat` never waits on I/O; at most
 * one is in flight and a beat that arrives meanwhile is dropped. Closing the
 * attach scope stops listening and waits for an in-flight extension, so after
 * it closes nothing touches the message any more. Extension failures are
 * logged, never raised to the worker: extension is a reliability aid, and the
 * worker settles the message itself.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Metric from "effect/Metric"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type * as Heartbeat from "./Heartbeat.js"
import { DurationFromInput } from "./internal/duration.js"
import { counter } from "./internal/metrics.js"

/** How often and by how much the lease is extended. */
export class LeaseExtenderConfig extends Schema.Class<LeaseExtenderConfig>("leasehold/LeaseExtenderConfig")({
  /** Minimum time between two extensions, however often the worker beats (default 60 s). */
  interval: Schema.optionalWith(DurationFromInput, { default: () => Duration.seconds(60) }),
  /** Visibility requested on each extension, from the moment of extension (default 300 s). */
  extension: Schema.optionalWith(DurationFromInput, { default: () => Duration.seconds(300) }),
  /** When false, `attach` does nothing (default true). */
  enabled: Schema.optionalWith(Schema.Boolean, { default: () => true })
}) {}

/** What the extender needs of a message: its id and a way to extend its visibility. */
export interface Extendable {
  readonly id: string
  readonly extendVisibility: (timeout: Duration.Duration) => Effect.Effect<void, { readonly _tag: string }>
}

/** `attach` was called while an earlier attach scope of the same extender is still open. */
export class AlreadyAttachedError extends Schema.TaggedError<AlreadyAttachedError>()("AlreadyAttachedError", {
  messageId: Schema.String,
  attachedTo: Schema.String
}) {
  override get message(): string {
    return `LeaseExtender is already attached to message ${this.attachedTo}; ` +
      `close that attach scope before attaching message ${this.messageId}`
  }
}

/** Extends one message's lease at a time, driven by heartbeats. */
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
   * Attaches now, without a scope, and returns the step that detaches (stop
   * listening, then wait for an extension in flight). For a caller that is
   * already uninterruptible and runs the detach step however its work ends.
   */
  readonly unsafeAttach: (
    message: Extendable,
    heartbeat: Heartbeat.Heartbeat
  ) => Either.Either<Effect.Effect<void>, AlreadyAttachedError>
}

/** Extensions that succeeded. */
export const extensions = counter("leasehold_lease_extensions_total", "Lease extensions that succeeded")
/** Extensions that failed (expired handle or store error). */
export const extensionFailures = counter("leasehold_lease_extension_failures_total", "Lease extensions that failed")

interface Attachment {
  readonly message: Extendable
  /** When the last extension started, on the monotonic clock (the beat's time). */
  lastExtension: number | undefined
  /** Set synchronously when an extension starts, so a beat that follows at once is dropped. */
  extending: boolean
  inFlight: Fiber.RuntimeFiber<void> | undefined
}

/** Makes an extender; bad config (a negative interval, say) fails with a readable `ParseError`. */
export const make = (
  config?: Partial<{ interval: Duration.DurationInput; extension: Duration.DurationInput; enabled: boolean }>
): Effect.Effect<LeaseExtender, ParseResult.ParseError> =>
  Effect.map(Schema.decodeUnknown(LeaseExtenderConfig)(config ?? {}), (config): LeaseExtender => {
    const intervalMillis = Duration.toMillis(config.interval)
    let current: Attachment | undefined

    const extend = (attachment: Attachment, now: number) =>
      attachment.message.extendVisibility(config.extension).pipe(
        Effect.zipRight(Effect.sync(() => {
          attachment.lastExtension = now
        })),
        Effect.tap(() => Metric.increment(extensions)),
        Effect.tap(() => Effect.logDebug(`Extended visibility by ${Duration.format(config.extension)}`)),
        Effect.catchAllCause((cause) =>
          Effect.zipRight(
            Metric.increment(extensionFailures),
            cause._tag === "Fail" && cause.error._tag === "ReceiptHandleExpiredError"
              ? Effect.logWarning("Lease extension failed: receipt handle expired")
              : Effect.logError("Lease extension failed", cause)
          )
        ),
        Effect.ensuring(Effect.sync(() => {
          attachment.extending = false
          attachment.inFlight = undefined
        })),
        Effect.withSpan("LeaseExtender.extend", { attributes: { messageId: attachment.message.id } }),
        Effect.annotateLogs({ module: "LeaseExtender", messageId: attachment.message.id })
      )

    // Called synchronously on every beat: the rate-limited path allocates no effect at all.
    const onBeat = (attachment: Attachment) => (now: number): Effect.Effect<void> | undefined => {
      if (current !== attachment || attachment.extending) return undefined
      if (attachment.lastExtension !== undefined && now - attachment.lastExtension < intervalMillis) return undefined
      attachment.extending = true
      // A daemon, not a child of the beating fiber: the extension must finish even if that fiber moves on.
      return Effect.map(Effect.forkDaemon(extend(attachment, now)), (fiber) => {
        // Not when the extension already finished (it ran before this step): a stale fiber would be awaited.
        if (attachment.extending) attachment.inFlight = fiber
      })
    }

    const unsafeAttach = (
      message: Extendable,
      heartbeat: Heartbeat.Heartbeat
    ): Either.Either<Effect.Effect<void>, AlreadyAttachedError> => {
      if (current !== undefined) {
        return Either.left(new AlreadyAttachedError({ messageId: message.id, attachedTo: current.message.id }))
      }
      const attachment: Attachment = { message, lastExtension: undefined, extending: false, inFlight: undefined }
      current = attachment
      const stopListening = heartbeat.unsafeOnBeatAt(onBeat(attachment))
      const awaitInFlight: Effect.Effect<void> = Effect.suspend(() => {
        if (!attachment.extending) return Effect.void
        // Started but its fiber not recorded yet (the beating fiber is between two steps): look again.
        if (attachment.inFlight === undefined) return Effect.zipRight(Effect.yieldNow(), awaitInFlight)
        return Effect.asVoid(Fiber.await(attachment.inFlight))
      })
      return Either.right(Effect.suspend(() => {
        stopListening()
        current = undefined
        return attachment.extending ? awaitInFlight : Effect.void
      }))
    }

    const attach = (message: Extendable, heartbeat: Heartbeat.Heartbeat) =>
      Effect.suspend(() =>
        Either.match(unsafeAttach(message, heartbeat), {
          onLeft: Effect.fail,
          onRight: (detach) => Effect.addFinalizer(() => detach)
        })
      )

    const extendWhile = <A, E, R>(
      message: Extendable,
      heartbeat: Heartbeat.Heartbeat,
      effect: Effect.Effect<A, E, R>
    ) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() =>
          Either.match(unsafeAttach(message, heartbeat), {
            onLeft: (error) => Effect.fail<E | AlreadyAttachedError>(error),
            onRight: (detach) => Effect.ensuring(restore(effect), detach)
          })
        )
      )

    return {
      config,
      attach: config.enabled ? attach : () => Effect.void,
      extendWhile: config.enabled ? extendWhile : (_message, _heartbeat, effect) => effect,
      unsafeAttach: config.enabled ? unsafeAttach : () => Either.right(Effect.void)
    }
  })

/** Makes an extender with the default config. */
export const makeDefault: Effect.Effect<LeaseExtender> = Effect.orDie(make())
