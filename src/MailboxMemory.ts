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
 * This module is the memory driver's front (its messages, options and public
 * functions; the store itself, lines and key scheduling, is
 * `internal/mailbox/memoryStore.ts`; every step synchronous: its throughput is
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
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { randomUUID } from "node:crypto"
import { type DeliveryJournal, Journaled, maxSteps, type StoredStep } from "./internal/journal.js"
import * as FrontEnd from "./internal/mailbox/frontEnd.js"
import { applySettings, type Entry, Store } from "./internal/mailbox/memoryStore.js"
import * as Scheduling from "./internal/mailbox/scheduling.js"
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

/** How many dead-lettered requests' journals a memory mailbox keeps. */
export { keptJournals } from "./internal/mailbox/memoryStore.js"

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

  get key(): string | undefined {
    return this.entry.key?.name
  }
  get priority(): number | undefined {
    return this.entry.priority === 0 ? undefined : this.entry.priority
  }

  /** The key's scheduling handle (the agent path charges model tokens through it); none without a key. */
  get [Scheduling.Scheduled](): Scheduling.DeliveryScheduling | undefined {
    const line = this.entry.key
    if (line === undefined) return undefined
    return {
      key: line.name,
      chargeTokens: (tokens) =>
        Effect.sync(() => {
          // The key's line outlives this delivery while the key has entries; a settled key has no window left.
          const current = this.store.keys.get(line.name) ?? this.store.keptLine(line)
          this.store.chargeTokens(current, this.clock.unsafeCurrentTimeMillis(), tokens)
        })
    }
  }

  get acknowledge(): Effect.Effect<void, ReceiptHandleExpiredError> {
    return this.settle((entry, now) => {
      this.store.endLease(entry, now)
      this.store.settled(entry)
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
          this.store.endLease(entry, now)
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
          this.store.extended(entry, now)
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
  /**
   * Publishes each key's live leases as the gauge `leasehold_mailbox_key_leases` (tagged `queue` and `key`; at
   * most 1,000 keys, refreshed at most every 10 s). Off by default: key names are the senders', and every key
   * shown stays a series.
   */
  readonly keyMetrics?: boolean | undefined
}

const decodeOptions = Options_.decoder("MailboxMemory.make", {
  name: QueueName,
  maxSize: Schema.optionalWith(MaxSize, { exact: true }),
  keyMetrics: Schema.optionalWith(Schema.Boolean, { exact: true })
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
  Effect.flatMap(decodeOptions(options), ({ keyMetrics, maxSize, name }) =>
    Effect.flatMap(Effect.clock, (clock) => {
      const store = new Store<A>(clock)
      // Ids need to be unique, not secret (receipt handles are the secret): a random prefix and a counter.
      const idPrefix = randomUUID().slice(0, 18)
      let nextId = 0

      const insert = (
        body: A,
        delayMillis: number,
        replyTo: string | undefined,
        traceparent: string | undefined,
        placement: FrontEnd.Placement | undefined
      ) => {
        if (maxSize !== undefined && store.live >= maxSize) {
          return Effect.fail(new MailboxFullError({ mailbox: name, maxSize }))
        }
        const now = clock.unsafeCurrentTimeMillis()
        const entry: Entry<A> = {
          id: idPrefix + (nextId++).toString(36),
          seq: store.seq(),
          priority: placement?.priority ?? 0,
          key: placement?.key === undefined ? undefined : store.activate(placement.key),
          body,
          enqueuedAtMillis: now,
          replyTo,
          traceparent,
          deliveryCount: 0,
          state: "ready",
          visibleAt: now,
          receiptHandle: undefined,
          leaseStart: 0,
          chargedUntil: 0,
          weight: 1
        }
        store.live++
        if (delayMillis === 0) store.enqueueReady(entry, true)
        else store.hide(entry, now + delayMillis)
        store.wake()
        return Effect.succeed(entry.id)
      }

      /**
       * Delivers up to `max` visible messages now, hiding each for `visibilityMillis`; the keys it passed over go
       * in `held` (the metric `keysHeldBack`).
       */
      const take = (
        max: number,
        visibilityMillis: number,
        held: Record<Scheduling.HeldBack, Set<string>>
      ): Array<Message<A, R>> => {
        if (store.paused) return []
        const now = clock.unsafeCurrentTimeMillis()
        store.promote(now)
        const received: Array<Message<A, R>> = []
        while (received.length < max) {
          const entry = store.takeNext(now, held)
          if (entry === undefined) break
          entry.deliveryCount++
          // Flattened by `toLowerCase` (a no-op on a UUID): Node's UUID is a tree of strings, several times the size.
          const handle = randomUUID().toLowerCase()
          entry.receiptHandle = handle
          store.started(entry, now, visibilityMillis)
          store.hide(entry, now + visibilityMillis)
          received.push(new MemoryMessage<A, R>(name, clock, store, entry, handle, entry.deliveryCount))
        }
        return received
      }

      const mailbox = FrontEnd.make<A, R>(name, {
        insert,
        claim: (max, visibilityMillis) =>
          Effect.suspend(() => {
            const held = { limit: new Set<string>(), starts: new Set<string>(), tokens: new Set<string>() }
            const received = take(max, visibilityMillis, held)
            // A queue that never used a key pays nothing here.
            if (store.keys.size === 0 && store.gaugesAt === undefined) return Effect.succeed(received)
            const now = clock.unsafeCurrentTimeMillis()
            const due = store.gaugesAt === undefined || now - store.gaugesAt >= Scheduling.gaugeEveryMillis ||
              now < store.gaugesAt
            if (due) store.gaugesAt = now
            const leases = due && keyMetrics === true
              ? new Map(
                [...store.keys.values()].filter((line) => line.leases.size > 0).map((
                  line
                ) => [line.name, line.leases.size])
              )
              : undefined
            return Effect.as(
              Effect.zipRight(
                Scheduling.countHeldBack(name, held),
                due
                  ? Scheduling.setGauges(
                    name,
                    [...store.keys.values()].filter((line) => line.pending > 0).length,
                    leases,
                    store.gaugedKeys
                  )
                  : Effect.void
              ),
              received
            )
          }),
        nextVisibleIn: Effect.sync(() => {
          // Paused: nothing is coming until a resume, which wakes the receivers.
          if (store.paused) return undefined
          const now = clock.unsafeCurrentTimeMillis()
          // A key held back by a rate has entries coming when its window turns.
          const visible = store.nextVisibleAt()
          const window = store.nextWindowAt(now)
          const at = visible === undefined ? window : window === undefined ? visible : Math.min(visible, window)
          return at === undefined ? undefined : at - now
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

/**
 * Sets the scheduling settings (see `KeySettings`) of `key` in a mailbox `make` built — or, with `key`
 * undefined, the defaults of its keys without settings of their own. A field left out stays as it was, `null`
 * clears it. Takes effect at the next receive (a raised limit or a cleared rate wakes waiting receivers).
 * Bad settings fail `InvalidParameterError` naming the field; a mailbox `make` did not build: no effect.
 *
 * @category operations
 */
export const setKeySettings = <A, R>(
  mailbox: Mailbox<A, R>,
  key: string | undefined,
  settings: Scheduling.KeySettings
): Effect.Effect<void, InvalidParameterError> =>
  Effect.suspend(() => {
    if (key !== undefined) {
      const valid = Scheduling.validateKey(key)
      if (Either.isLeft(valid)) return Effect.fail(valid.left)
    }
    const change = Scheduling.validateSettings(settings)
    if (Either.isLeft(change)) return Effect.fail(change.left)
    const store = storeOf(mailbox)
    if (store === undefined) return Effect.void
    if (key === undefined) store.defaults = applySettings(store.defaults, change.right)
    else {
      const next = applySettings(store.settings.get(key) ?? {}, change.right)
      if (Object.keys(next).length === 0) store.settings.delete(key)
      else store.settings.set(key, next)
    }
    store.wake()
    return Effect.void
  })

/**
 * The keys of a mailbox `make` built that have unsettled messages, with their scheduling state (see
 * `KeyState`), by name; at most `KeySettings`' listing bound (10,000).
 *
 * @category operations
 */
export const keys = <A, R>(mailbox: Mailbox<A, R>): Effect.Effect<ReadonlyArray<Scheduling.KeyState>> =>
  Effect.sync(() => {
    const store = storeOf(mailbox)
    if (store === undefined) return []
    const now = store.clockMillis()
    store.promote(now)
    const rate = (used: number, window: number, count: number | undefined, per: number | undefined) =>
      count === undefined || per === undefined
        ? undefined
        : { used: window === Scheduling.windowStart(now, per) ? used : 0, count, perMillis: per }
    return [...store.keys.values()].filter((line) => line.pending > 0).sort((a, b) =>
      a.name < b.name ? -1 : a.name > b.name ? 1 : 0
    )
      .slice(0, Scheduling.bounds.maxKeysListed)
      .map((line): Scheduling.KeyState => ({
        key: line.name,
        ready: line.ready.size,
        inFlight: line.leases.size,
        pending: line.pending,
        limit: store.setting(line, "limit"),
        weight: store.weight(line),
        leasedMillis: line.leased,
        vtime: line.vtime,
        starts: rate(
          line.startsUsed,
          line.startsWindow,
          store.setting(line, "startLimit"),
          store.setting(line, "startIntervalMillis")
        ),
        tokens: rate(
          line.tokensUsed,
          line.tokensWindow,
          store.setting(line, "tokenLimit"),
          store.setting(line, "tokenIntervalMillis")
        )
      }))
  })
