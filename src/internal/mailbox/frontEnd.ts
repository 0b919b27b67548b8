/**
 * The mailbox front end every backend shares: what `send` and `receive`
 * check, closing, the long poll and the reply guard — over a small storage
 * `Driver` of one queue (insert, claim, next visible time, count, purge,
 * wake-up). `MailboxMemory` drives it with synchronous steps on a heap,
 * `MailboxSql` with statements; neither re-implements the behaviour a user
 * sees, so the two cannot drift. `send` hands the driver the W3C trace
 * context of the sender's span, if there is one, to store with the message.
 *
 * The long poll: arm the queue's wake-up signal, then look (so a send that
 * lands between the look and the sleep still wakes the receiver), then sleep
 * until the signal, the mailbox closing, the next visibility expiry, the end
 * of the wait or — for a driver whose wake-ups do not cover every writer
 * (other processes on a database) — the next poll, backing off from
 * `poll.first` to `poll.max`.
 */
import type * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import type * as Option from "effect/Option"
import {
  type Mailbox,
  MailboxClosedError,
  type MailboxConnectionError,
  type Message,
  MessageFinalizedError,
  ReplyNotAvailableError,
  type SendError
} from "../../Mailbox.js"
import { type Registry, RegistryId } from "../registry.js"
import { perMessage, traceparentOf } from "../tracing.js"
import * as Scheduling from "./scheduling.js"
import { Settles, type Sink } from "./settle.js"
import { validateDelay, validateReceiveOptions, validateReplyTo } from "./validation.js"

/** Where a message goes among its queue's (see `scheduling.ts`): its key, if any, and priority. */
export interface Placement {
  readonly key: string | undefined
  readonly priority: number
}

/** One queue's storage, as the front end uses it. */
export interface Driver<A, R> {
  /**
   * Stores a message visible `delayMillis` from now, with the sender's W3C trace context if it had a span;
   * its id, or why it was refused (full, unencodable, …).
   */
  readonly insert: (
    body: A,
    delayMillis: number,
    replyTo: string | undefined,
    traceparent: string | undefined,
    /** The message's key and priority (scheduling.ts); `undefined` when the sender gave neither. */
    placement: Placement | undefined
  ) => Effect.Effect<string, SendError>
  /** One look: up to `max` visible messages, each hidden for `visibilityMillis` under a fresh receipt handle. */
  readonly claim: (
    max: number,
    visibilityMillis: number
  ) => Effect.Effect<ReadonlyArray<Message<A, R>>, MailboxConnectionError>
  /**
   * Milliseconds until the next message of the queue becomes visible, if any: 0 or less when one is visible
   * already (it became visible after the claim looked, or a concurrent claim holds it), and the receiver
   * looks again at once.
   */
  readonly nextVisibleIn: Effect.Effect<number | undefined, MailboxConnectionError>
  /** The signal a sleeping receiver wakes on (a send, a nack): armed before it looks. */
  readonly arm: () => Deferred.Deferred<void>
  readonly count: Effect.Effect<number, MailboxConnectionError>
  readonly purge: Effect.Effect<number, MailboxConnectionError>
  /**
   * How often a sleeping receiver looks again when nothing wakes it (first sleep, doubling up to `max`), for
   * a store that other processes write to; `undefined` when every write wakes receivers.
   */
  readonly poll?: { readonly firstMillis: number; readonly maxMillis: number } | undefined
  /** The driver's group commit of settles, when it has one (see `settle.ts`): carried by the mailbox. */
  readonly sink?: Sink | undefined
  /** Where loops made on the mailbox are tracked, for a backend that records workers (`internal/registry.ts`). */
  readonly registry?: Registry | undefined
  /** What the backend's own reply path reads back from a mailbox it built (`LocalId`). */
  readonly local?: unknown
}

/** The mailbox's `ReceiveNow`, a field of every mailbox `make` builds. */
export const ReceiveNowId: unique symbol = Symbol.for("leasehold/Mailbox/receiveNow")

/** The backend's `Driver.local`, a field of a mailbox `make` built with one. */
export const LocalId: unique symbol = Symbol.for("leasehold/Mailbox/local")

/** The fields a mailbox `make` built carries beside the `Mailbox` interface (keyed by symbol, off its surface). */
export interface Fields {
  readonly [ReceiveNowId]?: ReceiveNow<unknown, unknown> | undefined
  readonly [RegistryId]?: Registry | undefined
  readonly [LocalId]?: unknown
  readonly [Settles]?: Sink | undefined
}

/** The fields of `mailbox` (none for a mailbox this package did not build). */
export const fieldsOf = (mailbox: object): Fields => ({
  [ReceiveNowId]: own(mailbox, ReceiveNowId) as ReceiveNow<unknown, unknown> | undefined,
  [RegistryId]: own(mailbox, RegistryId) as Registry | undefined,
  [LocalId]: own(mailbox, LocalId),
  [Settles]: own(mailbox, Settles) as Sink | undefined
})

/**
 * A field the mailbox itself carries, never one inherited: a wrapper made with `Object.create(mailbox)` (or a
 * class extending it) and its own `receive` is another mailbox, which must not be driven through this one's.
 */
export const own = (holder: object, key: symbol): unknown =>
  Object.prototype.hasOwnProperty.call(holder, key) ? (holder as Record<symbol, unknown>)[key] : undefined

/**
 * `receive` with options checked already and no span: the effect a worker's loop runs for each poll when no
 * exporting tracer is installed, made once per run.
 */
export type ReceiveNow<A, R> = (
  maxMessages: number,
  visibilityMillis: number,
  waitMillis: number
) => Effect.Effect<ReadonlyArray<Message<A, R>>, MailboxConnectionError>

/** Builds the `Mailbox` over `driver`; `close` refuses sends and wakes every sleeping receiver. */
export const make = <A, R>(name: string, driver: Driver<A, R>, clock: Clock.Clock): Mailbox<A, R> => {
  let closed = false
  const closing = Deferred.unsafeMake<void>(FiberId.none)
  const { claim, poll } = driver
  const maxPollMillis = poll?.maxMillis ?? Infinity

  // The fiber's current span is a field of the fiber: read where `suspend` would have run, it costs no step,
  // and the trace context is formatted only when there is a span.
  const send: Mailbox<A, R>["send"] = (body, options) =>
    Effect.withFiberRuntime((fiber): Effect.Effect<string, SendError> => {
      let delayMillis = 0
      if (options?.delay !== undefined) {
        const delay = validateDelay(options.delay)
        if (Either.isLeft(delay)) return Effect.fail(delay.left)
        delayMillis = Duration.toMillis(delay.right)
      }
      const replyTo = options?.replyTo
      if (replyTo !== undefined) {
        const valid = validateReplyTo(replyTo)
        if (Either.isLeft(valid)) return Effect.fail(valid.left)
      }
      let placement: Placement | undefined
      if (options?.key !== undefined || options?.priority !== undefined) {
        const key = options.key === undefined ? undefined : Scheduling.validateKey(options.key)
        if (key !== undefined && Either.isLeft(key)) return Effect.fail(key.left)
        const priority = options.priority === undefined ? undefined : Scheduling.validatePriority(options.priority)
        if (priority !== undefined && Either.isLeft(priority)) return Effect.fail(priority.left)
        placement = { key: key?.right, priority: priority?.right ?? 0 }
      }
      if (closed) return Effect.fail(new MailboxClosedError({ mailbox: name }))
      const span = fiber.currentSpan
      return driver.insert(
        body,
        delayMillis,
        replyTo,
        span === undefined ? undefined : traceparentOf(span),
        placement
      )
    })

  const longPoll = (
    max: number,
    visibilityMillis: number,
    waitUntil: number,
    pollMillis: number
  ): Effect.Effect<ReadonlyArray<Message<A, R>>, MailboxConnectionError> =>
    Effect.suspend(() => {
      if (closed) return Effect.succeed([])
      const signal = driver.arm()
      return Effect.flatMap(claim(max, visibilityMillis), (received) => {
        // The wait is measured on the fiber's Clock (a duration); when a message shows, on the store's.
        const started = clock.unsafeCurrentTimeMillis()
        if (received.length > 0 || closed || started >= waitUntil) return Effect.succeed(received)
        return Effect.flatMap(driver.nextVisibleIn, (nextVisible) => {
          const sleepUntil = Math.min(
            waitUntil,
            nextVisible === undefined ? waitUntil : started + nextVisible,
            started + pollMillis
          )
          return Effect.zipRight(
            Effect.raceAll([
              Deferred.await(signal),
              Deferred.await(closing),
              // The clock may have moved during the look: measure the sleep from now, or a TestClock overshoots it.
              Effect.suspend(() =>
                Effect.sleep(Duration.millis(Math.max(0, sleepUntil - clock.unsafeCurrentTimeMillis())))
              )
            ]),
            longPoll(max, visibilityMillis, waitUntil, Math.min(maxPollMillis, pollMillis * 2))
          )
        })
      })
    })

  const receiveNow = (
    maxMessages: number,
    visibilityMillis: number,
    waitMillis: number
  ): Effect.Effect<ReadonlyArray<Message<A, R>>, MailboxConnectionError> => {
    if (closed) return Effect.succeed([])
    if (waitMillis === 0) return claim(maxMessages, visibilityMillis)
    const waitUntil = clock.unsafeCurrentTimeMillis() + waitMillis
    return longPoll(maxMessages, visibilityMillis, waitUntil, poll?.firstMillis ?? Infinity)
  }

  const receive: Mailbox<A, R>["receive"] = (options) =>
    Effect.suspend((): ReturnType<Mailbox<A, R>["receive"]> => {
      const valid = validateReceiveOptions(options)
      if (Either.isLeft(valid)) return Effect.fail(valid.left)
      const { maxMessages, visibilityTimeout, waitTime } = valid.right
      return receiveNow(maxMessages, Duration.toMillis(visibilityTimeout), Duration.toMillis(waitTime))
    })
  const now: ReceiveNow<A, R> = (maxMessages, visibilityMillis, waitMillis) =>
    Effect.suspend(() => receiveNow(maxMessages, visibilityMillis, waitMillis))

  const span = perMessage("Mailbox.receive", { attributes: { mailbox: name }, captureStackTrace: false })
  const mailbox: Mailbox<A, R> = {
    name,
    send,
    receive: (options) => span(receive(options)),
    purge: driver.purge,
    approximateCount: driver.count,
    close: Effect.sync(() => {
      closed = true
      Deferred.unsafeDone(closing, Exit.void)
    }),
    isClosed: Effect.sync(() => closed)
  }
  return withFields(mailbox, {
    [ReceiveNowId]: now as ReceiveNow<unknown, unknown>,
    [RegistryId]: driver.registry,
    [LocalId]: driver.local,
    [Settles]: driver.sink
  })
}

/**
 * Sets the fields, not enumerable: a wrapper spreading the mailbox (`{ ...mailbox, receive }`) is another
 * mailbox, and must not carry this one's `ReceiveNow` (nor its registry, reply route or settle sink).
 */
const withFields = <M extends object>(mailbox: M, fields: Fields): M & Fields => {
  for (const key of [ReceiveNowId, RegistryId, LocalId, Settles] as const) {
    if (fields[key] !== undefined) Object.defineProperty(mailbox, key, { value: fields[key], enumerable: false })
  }
  return mailbox
}

/** Why a delivery cannot reply at all, if it cannot: it was settled already, or its sender named no `replyTo`. */
export const replyRefused = (
  messageId: string,
  finalized: boolean,
  replyTo: Option.Option<string> | string | undefined
): MessageFinalizedError | ReplyNotAvailableError | undefined => {
  if (finalized) return new MessageFinalizedError({ messageId })
  if (replyTo === undefined || (typeof replyTo === "object" && replyTo._tag === "None")) {
    return new ReplyNotAvailableError({ messageId })
  }
  return undefined
}
