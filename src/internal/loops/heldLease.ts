/**
 * The lease of a failed message while its failure is settled (`MailboxWorker`'s `HeldLease`): work of the
 * worker's own before the settle — storing a dead letter — runs with the message kept leased, so a slow store
 * cannot outlast the lease and have the message come back to be dead-lettered again.
 *
 * It does not beat the loop's heartbeat: a heartbeat is proof that the user's work progresses, and beating it
 * on a timer would make a store that hangs look healthy to the Watchdog and to readiness, and hold the message
 * for ever. The message is extended on a schedule of its own instead, and for a bounded time.
 */
import type * as Cause from "effect/Cause"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Metric from "effect/Metric"
import * as LeaseExtender from "../../LeaseExtender.js"
import type { Message } from "../../Mailbox.js"

/** The lease of a failed message while its failure is settled (`MailboxWorker.HeldLease`). */
export interface HeldLease {
  /**
   * Runs `work` — the worker's own work before the settle, such as storing a dead letter — with the message's
   * lease kept: extended at once and then every `max(interval, extension / 3)` of the worker's lease-extender
   * config, by `extension` each time, until `work` ends (an extension in flight is waited for, so the settle
   * that follows never races one). Without it, a slow store could outlast the lease and the message come back
   * to be dead-lettered again. It holds the lease at most `holdLimit` (the longer of 5 minutes and the
   * extension): `work` still running then is interrupted and `keep` fails with `TimeoutException`, and the
   * message comes back when its lease runs out. The loop's heartbeat is not beaten meanwhile, so a store that
   * hangs shows as a stalled loop. With the extender disabled, nothing is extended.
   */
  readonly keep: <X, Y, Z>(work: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y | Cause.TimeoutException, Z>
}

/**
 * The longest a held lease is kept (unless the extension is longer): the worker's own work before a settle is a
 * statement or two, and one that takes minutes is stuck.
 */
export const holdLimit: Duration.Duration = Duration.minutes(5)

/**
 * `HeldLease.keep` for an extender's config: `work` runs with `message` extended at once, then every
 * `max(interval, extension / 3)` by `extension` (each extension whole: only the wait between two is cut short
 * when `work` ends), for at most `max(holdLimit, extension)` — past it `work` is interrupted and `keep` fails
 * with `TimeoutException`. An expired handle ends the extensions (the message is another delivery's); another
 * failure is logged (the first of a run as an error) and tried again at the next turn. With the extender
 * disabled, nothing is extended.
 */
export const keeper = (config: LeaseExtender.LeaseExtenderConfig) => {
  const every = Duration.max(config.interval, Duration.millis(Math.ceil(Duration.toMillis(config.extension) / 3)))
  const limit = Duration.max(holdLimit, config.extension)
  return <A, R, X, Y, Z>(
    message: Message<A, R>,
    work: Effect.Effect<X, Y, Z>
  ): Effect.Effect<X, Y | Cause.TimeoutException, Z> => {
    const bounded = Effect.timeout(Effect.interruptible(work), limit)
    if (!config.enabled) return bounded
    let failures = 0
    const extendOnce: Effect.Effect<boolean> = Effect.uninterruptible(message.extendVisibility(config.extension)).pipe(
      Effect.zipRight(Effect.sync(() => {
        failures = 0
        return true
      })),
      Effect.tap(() => Metric.increment(LeaseExtender.extensions)),
      Effect.catchAllCause((cause) =>
        Effect.zipRight(
          Metric.increment(LeaseExtender.extensionFailures),
          cause._tag === "Fail" && cause.error._tag === "ReceiptHandleExpiredError"
            ? Effect.as(Effect.logWarning("Lease lost while settling a failed message; no longer extending it"), false)
            : Effect.as(
              failures++ === 0
                ? Effect.logError("Lease extension failed while settling a failed message", cause)
                : Effect.logDebug(`Lease extension failed again (${failures} in a row)`),
              true
            )
        )
      )
    )
    const extending: Effect.Effect<void> = Effect.flatMap(
      extendOnce,
      (goOn) => goOn ? Effect.zipRight(Effect.sleep(every), extending) : Effect.void
    )
    return Effect.acquireUseRelease(
      // Interruptible though forked from an uninterruptible settle, so the release can stop it.
      Effect.fork(Effect.interruptible(extending)),
      () => bounded,
      (fiber) => Fiber.interrupt(fiber)
    )
  }
}
