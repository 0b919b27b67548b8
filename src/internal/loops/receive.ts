/**
 * A loop's receive: a store that cannot be reached or refuses to write (`MailboxConnectionError`: the server
 * down, the connection dropped, a full disk, a failed COMMIT) is logged and retried with backoff (100 ms,
 * growing 1.5× to at most 10 s) until it answers, and its recovery is logged; any other failure is a bug (the
 * options were validated when the run started) and dies. The retry schedule starts only after a failure, so a
 * receive that succeeds — nearly every one, once per message on a busy loop — does not pay for making a
 * schedule's driver; the retries count from that failure, the first waiting the schedule's first delay.
 *
 * It is made once per run, and a receive that succeeds runs none of this module's code: without an exporting
 * tracer, a mailbox of this package is asked directly (its `ReceiveNow` field: the options are the run's,
 * checked when it started, and there is no span to make).
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type { Mailbox, Message } from "../../Mailbox.js"
import type * as FrontEnd from "../mailbox/frontEnd.js"
import { fieldsOf, ReceiveNowId } from "../mailbox/frontEnd.js"

const backoff = Schedule.exponential("100 millis", 1.5).pipe(Schedule.union(Schedule.spaced("10 seconds")))

/** `mailbox.receive(options)`, retried while the store cannot be reached. */
export const retrying = <A, R>(
  mailbox: Mailbox<A, R>,
  options: {
    readonly maxMessages: number
    readonly visibilityTimeout: Duration.Duration
    readonly waitTime: Duration.Duration
  },
  traced: boolean
): Effect.Effect<ReadonlyArray<Message<A, R>>> => {
  const attempt = mailbox.receive(options)
  const direct = traced ? undefined : fieldsOf(mailbox)[ReceiveNowId] as FrontEnd.ReceiveNow<A, R> | undefined
  const visibilityMillis = Duration.toMillis(options.visibilityTimeout)
  const waitMillis = Duration.toMillis(options.waitTime)
  const first = direct === undefined ? attempt : direct(options.maxMessages, visibilityMillis, waitMillis)
  type Failure = Effect.Effect.Error<typeof attempt>
  // One line per failure (what the store said, not a stack per retry: a full disk can last hours), with the
  // number of failures in a row; the first one also carries the whole cause, for whoever debugs it.
  let failures = 0
  const logged = (error: Failure): Effect.Effect<never, Failure> => {
    if (error._tag !== "MailboxConnectionError") return Effect.fail(error)
    failures++
    const line = `Receive failed; retrying with backoff (${error.message})`
    return Effect.zipRight(
      Effect.annotateLogs(
        failures === 1 ? Effect.logWarning(line, error) : Effect.logWarning(line),
        "failuresInARow",
        failures
      ),
      Effect.fail(error)
    )
  }
  // One handler on the path every receive takes (a `tapError`, a `catchIf` and an `orDie` would be three).
  const recover = (failure: Failure): Effect.Effect<ReadonlyArray<Message<A, R>>> => {
    if (failure._tag !== "MailboxConnectionError") return Effect.die(failure)
    // The failure already happened: the schedule sees it first, then the attempts that follow.
    let seen = false
    const again: Effect.Effect<ReadonlyArray<Message<A, R>>, Failure> = Effect.suspend(() => {
      if (seen) return Effect.catchAll(attempt, logged)
      seen = true
      return logged(failure)
    })
    return Effect.retry(again, { schedule: backoff, while: (error) => error._tag === "MailboxConnectionError" }).pipe(
      Effect.tap(() => Effect.logInfo(`Receive works again after ${failures} failures`)),
      Effect.ensuring(Effect.sync(() => {
        failures = 0
      })),
      // The schedule never ends, so only a failure that is not the store's gets here: a bug, as above.
      Effect.orDie
    )
  }
  return Effect.catchAll(first, recover)
}
