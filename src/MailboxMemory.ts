/**
 * MailboxMemory: the in-memory `Mailbox` backend, for tests, demos and a
 * single process.
 *
 * Every state change happens inside one synchronous step, so fibers never see
 * a half-applied change. Visibility is computed from the `Clock` the mailbox
 * was made with (so a mailbox made in a test runs on `TestClock`): a message whose
 * visibility ran out is visible again the next time anyone looks — there is no
 * reaper fiber, and `TestClock.adjust` alone redelivers. Visible messages wait
 * in a FIFO; hidden ones (in flight or delayed) sit in a min-heap keyed by the
 * time they become visible, with stale heap entries skipped lazily.
 *
 * This module is the memory driver (every step synchronous: its throughput is
 * worth protecting) under the front end all backends share
 * (`internal/mailbox/frontEnd.ts`: option checks, closing, the long poll,
 * the reply guard). A send or a nack wakes sleeping receivers at once; they
 * otherwise sleep until the next visibility expiry, never polling.
 * `pause` / `resume` are the in-process twin of the SQL backends' paused
 * queues: a paused mailbox's receivers get nothing. A message's step journal
 * (see `Journal`) lives beside it until its acknowledgement; the journals of
 * dead-lettered requests are kept (the latest `keptJournals`), for `journal`.
 */
import type * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { MinHeap } from "./internal/heap.js"
import { type DeliveryJournal, Journaled, maxSteps, type StoredStep } from "./internal/journal.js"
import * as FrontEnd from "./internal/mailbox/frontEnd.js"
import { inLine } from "./internal/mailbox/settle.js"
import { MaxSize, QueueName, validateVisibility } from "./internal/mailbox/validation.js"
import * as Options_ from "./internal/options.js"
import {
  type InvalidParameterError,
  type Mailbox,
  MailboxFullError,
  MailboxResolver,
  type Message,
  ReceiptHandleExpiredError,
  type ReplyError
} from "./Mailbox.js"

interface Entry<A> {
  readonly id: string
  readonly body: A
  readonly enqueuedAtMillis: number
  readonly replyTo: string | undefined
  /** The sender's W3C trace context (formatted from a span by the front end, so well-formed). */
  readonly traceparent: string | undefined
  deliveryCount: number
  state: "ready" | "hidden" | "deleted"
  /** While hidden: when it becomes visible again (epoch ms). */
  visibleAt: number
  /** While hidden by a receive: the current delivery's handle. */
  receiptHandle: string | undefined
}

class Store<A> {
  /** Unacknowledged entries: every one is either in `ready` or in `hidden`. */
  live = 0
  /** Hidden entries by visibility time; may hold stale nodes (see `promote`), compacted in `hide`. */
  private hidden = new MinHeap<Entry<A>>()
  private ready: Array<Entry<A>> = []
  private head = 0
  closed = false
  /** Paused (see `pause`): receivers get nothing, senders are unaffected. */
  paused = false
  private signal: Deferred.Deferred<void> | undefined
  /** The step journals of unacknowledged messages, by id. */
  readonly journals = new Map<string, Array<StoredStep>>()
  /** The journals of dead-lettered messages, oldest first, at most `keptJournals`. */
  readonly kept = new Map<string, ReadonlyArray<StoredStep>>()

  /** Drops the journal of an acknowledged message, or keeps it (the loop dead-lettered the request). */
  settleJournal(id: string, keep: boolean): void {
    const journal = this.journals.get(id)
    if (journal === undefined) return
    this.journals.delete(id)
    if (!keep) return
    this.kept.set(id, journal)
    if (this.kept.size > keptJournals) this.kept.delete(this.kept.keys().next().value!)
  }

  enqueueReady(entry: Entry<A>): void {
    entry.state = "ready"
    entry.receiptHandle = undefined
    this.ready.push(entry)
  }

  hide(entry: Entry<A>, visibleAt: number): void {
    entry.state = "hidden"
    entry.visibleAt = visibleAt
    this.hidden.push(visibleAt, entry)
    // Acknowledged, extended and nacked entries leave stale nodes behind; rebuild before they dominate.
    if (this.hidden.size > 1024 && this.hidden.size > 4 * this.live) this.compact()
  }

  private compact(): void {
    const heap = new MinHeap<Entry<A>>()
    this.hidden.forEach((key, entry) => {
      if (entry.state === "hidden" && entry.visibleAt === key) heap.push(key, entry)
    })
    this.hidden = heap
  }

  delete(entry: Entry<A>): void {
    entry.state = "deleted"
    this.live--
  }

  /** When the next hidden entry may become visible (epoch ms), if any. */
  nextVisibleAt(): number | undefined {
    return this.hidden.peekKey()
  }

  /** Moves every hidden entry whose time has come to the visible queue. */
  promote(now: number): void {
    for (let key = this.hidden.peekKey(); key !== undefined && key <= now; key = this.hidden.peekKey()) {
      const entry = this.hidden.pop()!
      // Stale heap node: the entry was extended, nacked, received again or deleted since.
      if (entry.state === "hidden" && entry.visibleAt <= now) this.enqueueReady(entry)
    }
  }

  /** Takes the next visible entry, skipping ones that changed state while queued. */
  takeReady(): Entry<A> | undefined {
    while (this.head < this.ready.length) {
      const entry = this.ready[this.head++]!
      if (entry.state === "ready") {
        if (this.head > 1024 && this.head * 2 > this.ready.length) {
          this.ready = this.ready.slice(this.head)
          this.head = 0
        }
        return entry
      }
    }
    if (this.head > 0) {
      this.ready = []
      this.head = 0
    }
    return undefined
  }

  purge(): number {
    const count = this.live
    this.journals.clear()
    for (let i = this.head; i < this.ready.length; i++) this.ready[i]!.state = "deleted"
    this.hidden.forEach((_, entry) => {
      entry.state = "deleted"
    })
    this.live = 0
    this.hidden.clear()
    this.ready = []
    this.head = 0
    return count
  }

  /** The signal a waiting receiver sleeps on; armed in the same step that found nothing. */
  arm(): Deferred.Deferred<void> {
    return this.signal ??= Deferred.unsafeMake<void>(FiberId.none)
  }

  wake(): void {
    if (this.signal !== undefined) {
      Deferred.unsafeDone(this.signal, Exit.void)
      this.signal = undefined
    }
  }
}

/** How many dead-lettered requests' journals a memory mailbox keeps. */
export const keptJournals = 1000

class MemoryMessage<A, R> implements Message<A, R> {
  private finalized = false
  private keepJournal = false
  constructor(
    private readonly mailbox: string,
    private readonly clock: Clock.Clock,
    private readonly store: Store<A>,
    private readonly entry: Entry<A>,
    readonly receiptHandle: string,
    readonly deliveryCount: number
  ) {}

  get id(): string {
    return this.entry.id
  }
  get body(): A {
    return this.entry.body
  }
  get enqueuedAt(): DateTime.Utc {
    return DateTime.unsafeMake(this.entry.enqueuedAtMillis)
  }
  get replyTo(): Option.Option<string> {
    return Option.fromNullable(this.entry.replyTo)
  }
  get traceparent(): string | undefined {
    return this.entry.traceparent
  }

  /** Runs `f` on the entry if this delivery's handle is still valid, else fails with the expired handle. */
  private settle(f: (entry: Entry<A>, now: number) => void): Effect.Effect<void, ReceiptHandleExpiredError> {
    return Effect.suspend(() => {
      const now = this.clock.unsafeCurrentTimeMillis()
      const entry = this.entry
      if (entry.state !== "hidden" || entry.receiptHandle !== this.receiptHandle || now >= entry.visibleAt) {
        return Effect.fail(
          new ReceiptHandleExpiredError({
            mailbox: this.mailbox,
            messageId: entry.id,
            receiptHandle: this.receiptHandle
          })
        )
      }
      f(entry, now)
      return Effect.void
    })
  }

  get acknowledge(): Effect.Effect<void, ReceiptHandleExpiredError> {
    return this.settle((entry) => {
      this.store.delete(entry)
      this.store.settleJournal(entry.id, this.keepJournal)
      this.finalized = true
    })
  }

  /** The journal beside the message: read freely, written only while this delivery holds the message. */
  get [Journaled](): DeliveryJournal {
    const { store } = this
    const id = this.entry.id
    return {
      // Unique beyond this mailbox: every memory mailbox draws its ids' prefix at random (see `make`).
      identity: Effect.succeed(id),
      load: Effect.sync(() => (store.journals.get(id) ?? []).slice(0, maxSteps + 1)),
      append: (step) =>
        this.settle(() => {
          const journal = store.journals.get(id)
          if (journal === undefined) store.journals.set(id, [step])
          else journal.push(step)
        }),
      truncate: (from) =>
        this.settle(() => {
          const journal = store.journals.get(id)
          if (journal !== undefined) store.journals.set(id, journal.filter((step) => step.position < from))
        }),
      keep: Effect.sync(() => {
        this.keepJournal = true
      })
    }
  }

  nack(
    visibilityTimeout?: Duration.DurationInput
  ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError> {
    return Either.match(validateVisibility("visibilityTimeout", visibilityTimeout), {
      onLeft: Effect.fail,
      onRight: (timeout) =>
        this.settle((entry, now) => {
          this.finalized = true
          entry.receiptHandle = undefined
          if (Duration.isZero(timeout)) this.store.enqueueReady(entry)
          else this.store.hide(entry, now + Duration.toMillis(timeout))
          this.store.wake()
        })
    })
  }

  extendVisibility(
    timeout: Duration.DurationInput
  ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError> {
    return Either.match(validateVisibility("timeout", timeout), {
      onLeft: Effect.fail,
      onRight: (timeout) =>
        this.settle((entry, now) => {
          this.store.hide(entry, now + Duration.toMillis(timeout))
        })
    })
  }

  replyAndAcknowledge(body: R): Effect.Effect<string, ReplyError | ReceiptHandleExpiredError, MailboxResolver> {
    return Effect.zipRight(this.settle(() => undefined), Effect.zipLeft(this.reply(body), this.acknowledge))
  }

  reply(body: R): Effect.Effect<string, ReplyError, MailboxResolver> {
    return Effect.suspend((): Effect.Effect<string, ReplyError, MailboxResolver> => {
      const replyTo = this.entry.replyTo
      const refused = FrontEnd.replyRefused(this.entry.id, this.finalized, replyTo)
      if (refused !== undefined) return Effect.fail(refused)
      return Effect.flatMap(
        MailboxResolver,
        (resolver) => Effect.flatMap(resolver.resolve(replyTo!), (target) => target.send(body))
      )
    })
  }
}

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options {
  /** The queue's name: 1..200 characters, no control characters (every backend's rule). */
  readonly name: string
  /** Bounds the unacknowledged messages: sends beyond it fail `MailboxFullError` (a positive integer). */
  readonly maxSize?: number | undefined
}

const decodeOptions = Options_.decoder("MailboxMemory.make", {
  name: QueueName,
  maxSize: Schema.optionalWith(MaxSize, { exact: true })
})

/**
 * Makes an in-memory mailbox, closed when the scope closes. A name or `maxSize` the durable backends would
 * refuse (the same rule) is refused here too, as a `ParseError` naming the option: a mailbox that works in
 * memory works on a database.
 *
 * @category constructors
 */
export const make = <A, R = never>(
  options: Options
): Effect.Effect<Mailbox<A, R>, ParseResult.ParseError, Scope.Scope> =>
  Effect.flatMap(decodeOptions(options), ({ maxSize, name }) =>
    Effect.flatMap(Effect.clock, (clock) => {
      const store = new Store<A>()
      // Ids need to be unique, not secret (receipt handles are the secret): a random prefix and a counter.
      const idPrefix = randomUUID().slice(0, 18)
      let nextId = 0

      const insert = (
        body: A,
        delayMillis: number,
        replyTo: string | undefined,
        traceparent: string | undefined
      ) => {
        if (maxSize !== undefined && store.live >= maxSize) {
          return Effect.fail(new MailboxFullError({ mailbox: name, maxSize }))
        }
        const now = clock.unsafeCurrentTimeMillis()
        const entry: Entry<A> = {
          id: idPrefix + (nextId++).toString(36),
          body,
          enqueuedAtMillis: now,
          replyTo,
          traceparent,
          deliveryCount: 0,
          state: "ready",
          visibleAt: now,
          receiptHandle: undefined
        }
        store.live++
        if (delayMillis === 0) store.enqueueReady(entry)
        else store.hide(entry, now + delayMillis)
        store.wake()
        return Effect.succeed(entry.id)
      }

      /** Delivers up to `max` visible messages now, hiding each for `visibilityMillis`. */
      const take = (max: number, visibilityMillis: number): Array<Message<A, R>> => {
        if (store.paused) return []
        const now = clock.unsafeCurrentTimeMillis()
        store.promote(now)
        const received: Array<Message<A, R>> = []
        while (received.length < max) {
          const entry = store.takeReady()
          if (entry === undefined) break
          entry.deliveryCount++
          // Flattened by `toLowerCase` (a no-op on a UUID): Node's UUID is a tree of strings, several times the size.
          const handle = randomUUID().toLowerCase()
          entry.receiptHandle = handle
          store.hide(entry, now + visibilityMillis)
          received.push(new MemoryMessage<A, R>(name, clock, store, entry, handle, entry.deliveryCount))
        }
        return received
      }

      const mailbox = FrontEnd.make<A, R>(name, {
        insert,
        claim: (max, visibilityMillis) => Effect.sync(() => take(max, visibilityMillis)),
        nextVisibleIn: Effect.sync(() => {
          // Paused: nothing is coming until a resume, which wakes the receivers.
          if (store.paused) return undefined
          const at = store.nextVisibleAt()
          return at === undefined ? undefined : at - clock.unsafeCurrentTimeMillis()
        }),
        arm: () => store.arm(),
        count: Effect.sync(() => store.live),
        purge: Effect.sync(() => store.purge()),
        sink: inLine,
        // For `pause`, `resume` and `journal`: the store is a field of the mailbox.
        local: store
      }, clock)
      return Effect.as(Effect.addFinalizer(() => mailbox.close), mailbox)
    }))

/** The store of a mailbox `make` built, if it is one. */
const storeOf = (mailbox: object): Store<unknown> | undefined => {
  const local = FrontEnd.fieldsOf(mailbox)[FrontEnd.LocalId]
  return local instanceof Store ? local as Store<unknown> : undefined
}

const setPaused = (mailbox: Mailbox<unknown, unknown>, paused: boolean): Effect.Effect<void> =>
  Effect.sync(() => {
    const store = storeOf(mailbox)
    if (store === undefined) return
    store.paused = paused
    if (!paused) store.wake()
  })

/**
 * Pauses a mailbox `make` built: its receivers get nothing (a long poll waits, and returns empty at the end of
 * its wait) until `resume`; sends, acknowledgements and extensions go on. The in-memory twin of
 * `leasehold mailbox pause` (the SQL backends keep the pause in the database). Anything else: no effect.
 *
 * @category operations
 */
export const pause = <A, R>(mailbox: Mailbox<A, R>): Effect.Effect<void> =>
  setPaused(mailbox as Mailbox<unknown, unknown>, true)

/**
 * The step journal of message `id` of a mailbox `make` built (see `Journal`), as stored: while the message is
 * unacknowledged, or after the loop dead-lettered it (the latest `keptJournals` of those); none otherwise.
 *
 * @category operations
 */
export const journal = <A, R>(
  mailbox: Mailbox<A, R>,
  id: string
): Effect.Effect<Option.Option<ReadonlyArray<StoredStep>>> =>
  Effect.sync(() => {
    const store = storeOf(mailbox)
    return Option.fromNullable(store?.journals.get(id) ?? store?.kept.get(id)).pipe(Option.map((steps) => [...steps]))
  })

/**
 * Resumes a paused mailbox: its waiting receivers look again at once.
 *
 * @category operations
 */
export const resume = <A, R>(mailbox: Mailbox<A, R>): Effect.Effect<void> =>
  setPaused(mailbox as Mailbox<unknown, unknown>, false)
