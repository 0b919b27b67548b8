/**
 * A delivery of a SQL mailbox (`SqlMessage`): acknowledge, nack and extend as statements guarded by its
 * receipt handle, replies routed to a queue of the same database (written in the acknowledgement's
 * transaction) or to another store's mailbox, and the mailbox's settle `Sink`: a handled delivery's
 * acknowledgement and local reply as one row of the group commit. A mailbox's `Local` field (set by
 * `MailboxSql.make`) is how the reply path knows a target of the same database.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import {
  type InvalidParameterError,
  MailboxConnectionError,
  MailboxResolver,
  type Message,
  type MessageFinalizedError,
  ReceiptHandleExpiredError,
  type ReplyError,
  type ReplyNotAvailableError,
  type ReplyTarget,
  SerializationError
} from "../../../Mailbox.js"
import { type DeliveryJournal, Journaled, type StoredStep } from "../../journal.js"
import { currentTraceparent } from "../../tracing.js"
import * as FrontEnd from "../frontEnd.js"
import * as Scheduling from "../scheduling.js"
import { type Done, Settles, type Sink } from "../settle.js"
import { validateVisibility } from "../validation.js"
import type { SettleBatcher } from "./batching.js"
import type { Encoder } from "./codec.js"
import type { ExtensionBatcher } from "./extensions.js"
import * as Journal from "./journal.js"
import * as Keys from "./keys.js"
import type { Now, SettleItem, Statements } from "./statements.js"
import { connectionError, type Store } from "./store.js"

/** A mailbox made by `MailboxSql.make`, as the reply path sees it (its `FrontEnd.LocalId` field). */
export interface Local {
  readonly store: Store
  readonly queue: string
  readonly encode: (body: unknown) => Either.Either<string, string>
}

/** The SQL mailbox behind `target`, if `MailboxSql.make` built it. */
const localOf = (target: object): Local | undefined => FrontEnd.fieldsOf(target)[FrontEnd.LocalId] as Local | undefined

/** Whether two stores are one database's tables (one client, one prefix), whichever owner holds each. */
const sameTables = (a: Store, b: Store): boolean => a.sql === b.sql && a.prefix === b.prefix

/** What the messages of one mailbox share. */
export interface MailboxContext {
  readonly name: string
  readonly store: Store
  readonly statements: Statements
  readonly settler: SettleBatcher
  /** The extensions of its deliveries, group-committed ahead of its claims (see `extensions.ts`). */
  readonly extensions: ExtensionBatcher
  /** The process's clock, which `SqlMessage.leaseEnd` is on. */
  readonly clock: Clock.Clock
  /** The step journal's appends (see `journal.ts`). */
  readonly appender: Journal.AppendBatcher
  /** Reply destinations already resolved, by resolver and name. */
  readonly routes: WeakMap<object, Map<string, Destination>>
  /** When the mailbox's statements run (see `Now`). */
  readonly now: () => Now
  readonly replyEncoder: Encoder | undefined
}

/** A resolved reply target: a queue of this database with its encoder, or another store's mailbox. */
export type Destination = { readonly queue: string; readonly encode: Encoder } | { readonly target: ReplyTarget }

/** Where a reply goes: a queue of this database (body encoded here), or another store's mailbox. */
export type ReplyRoute =
  | { readonly _tag: "Local"; readonly queue: string; readonly body: string }
  | { readonly _tag: "Remote"; readonly target: ReplyTarget }

/** A reply to a queue of this database, with the trace context it continues (the key only when there is one). */
const localReply = (
  route: { readonly queue: string; readonly body: string },
  traceparent: string | undefined
): NonNullable<SettleItem["reply"]> =>
  traceparent === undefined
    ? { queue: route.queue, body: route.body }
    : { queue: route.queue, body: route.body, traceparent }

/** The mailbox's `Sink`: each handled delivery's acknowledgement, with its local reply, a row of its group commit. */
export const sink: Sink = {
  offer: (message, reply, resolver, traceparent, done) =>
    message instanceof SqlMessage && message.offer(reply, resolver, traceparent, done)
}

export class SqlMessage<A, R> implements Message<A, R> {
  private finalized = false
  /** This delivery loaded a journal that has steps, or recorded one: its acknowledgement deletes the journal. */
  private journaled = false
  /** `keep` was called: the journal outlives the acknowledgement. */
  private kept = false
  private journalView: DeliveryJournal | undefined
  /**
   * When this delivery's lease ends as this process knows it (its clock's millis; 0 until the claim sets it): the
   * claim's start plus its visibility, then each extension's submission plus its timeout. It orders extensions.
   */
  leaseEnd = 0
  /** The message's key and priority (set from its row; absent without). */
  key: string | undefined = undefined
  priority: number | undefined = undefined
  constructor(
    private readonly mailbox: MailboxContext,
    readonly id: string,
    readonly body: A,
    readonly receiptHandle: string,
    readonly deliveryCount: number,
    private readonly enqueuedMillis: number,
    readonly replyTo: Option.Option<string>,
    readonly traceparent: string | undefined
  ) {}

  /** The key's scheduling handle (the agent path charges model tokens through it): the ledger (keys.ts). */
  get [Scheduling.Scheduled](): Scheduling.DeliveryScheduling | undefined {
    const key = this.key
    if (key === undefined) return undefined
    const { name, now, statements, store } = this.mailbox
    return {
      key,
      chargeTokens: (tokens) =>
        Keys.chargeTokens(store, name, key, tokens, statements.at(now())).pipe(connectionError(name))
    }
  }

  /** Made when asked for (a dead letter, the operator): most deliveries never are. */
  get enqueuedAt(): DateTime.Utc {
    return DateTime.unsafeMake(this.enqueuedMillis)
  }

  private expired(): ReceiptHandleExpiredError {
    return new ReceiptHandleExpiredError({
      mailbox: this.mailbox.name,
      messageId: this.id,
      receiptHandle: this.receiptHandle
    })
  }

  /** Runs a statement guarded by this delivery's handle; `false` from it means the handle is stale. */
  private guarded(
    statement: (now: Now) => Effect.Effect<boolean, SqlError>,
    finalizes: boolean
  ): Effect.Effect<void, ReceiptHandleExpiredError | MailboxConnectionError> {
    return Effect.suspend(() =>
      Effect.flatMap(statement(this.mailbox.now()), (done) => {
        if (!done) return Effect.fail(this.expired())
        if (finalizes) this.finalized = true
        return Effect.void
      })
    ).pipe(connectionError(this.mailbox.name))
  }

  private setVisibility(timeout: Duration.Duration, finalizes: boolean) {
    const { name, statements } = this.mailbox
    return this.guarded(
      (now) => statements.setVisibility(this.id, this.receiptHandle, now, Duration.toMillis(timeout), !finalizes, name),
      finalizes
    )
  }

  get [Settles](): Sink {
    return sink
  }

  /** The step journal of this delivery's message (see `internal/journal.ts`). */
  get [Journaled](): DeliveryJournal {
    return this.journalView ??= {
      identity: Effect.suspend(() => Journal.messageIdentity(this.mailbox.store, this.id)).pipe(
        connectionError(this.mailbox.name)
      ),
      load: Effect.suspend(() => Journal.load(this.mailbox.store, this.id)).pipe(
        Effect.tap((steps) =>
          Effect.sync(() => {
            if (steps.length > 0) this.journaled = true
          })
        ),
        connectionError(this.mailbox.name)
      ),
      append: (step: StoredStep) =>
        this.mailbox.appender.submit({ seq: this.id, handle: this.receiptHandle, step }).pipe(
          connectionError(this.mailbox.name),
          Effect.flatMap((written) => {
            if (!written) return Effect.fail(this.expired())
            this.journaled = true
            return Effect.void
          })
        ),
      truncate: (fromPosition: number) =>
        this.guarded(
          (now) =>
            Journal.truncate(
              this.mailbox.store,
              this.mailbox.statements,
              this.id,
              this.receiptHandle,
              fromPosition,
              now
            ),
          false
        ),
      keep: Effect.sync(() => {
        this.kept = true
      })
    }
  }

  /**
   * This delivery's item for the group commit: its journal goes with it unless kept, when this delivery read or
   * wrote one or an earlier delivery may have (a redelivery that never read it: a plain loop, a run that failed
   * before its first step). A first delivery that did neither has none, so the plain path pays nothing.
   */
  private item(reply: SettleItem["reply"]): SettleItem {
    return (this.journaled || this.deliveryCount > 1) && !this.kept
      ? { seq: this.id, handle: this.receiptHandle, reply, journal: true }
      : { seq: this.id, handle: this.receiptHandle, reply }
  }

  /**
   * This delivery's row for the group commit (see `Sink.offer`): queued, its outcome to `done` once committed;
   * `false` when `replyAndAcknowledge` must settle it in line — a reply to another store, to a queue this
   * resolver has not been asked about yet (the first reply resolves it, later ones find it cached), or one
   * that is refused or cannot be encoded (in line, it fails as it would alone).
   */
  offer(
    reply: Option.Option<R>,
    resolver: MailboxResolver["Type"],
    traceparent: string | undefined,
    done: Done
  ): Effect.Effect<void> | boolean {
    let local: SettleItem["reply"]
    if (Option.isSome(reply) && Option.isSome(this.replyTo)) {
      const routed = this.routeNow(resolver, reply.value)
      if (routed === undefined || Either.isLeft(routed) || routed.right._tag === "Remote") return false
      local = localReply(routed.right, traceparent)
    }
    const start = this.mailbox.settler.offer(this.item(local), (result) => {
      if (Exit.isFailure(result)) {
        return done(
          new MailboxConnectionError({ mailbox: this.mailbox.name, cause: Cause.squash(result.cause) }),
          undefined
        )
      }
      if (result.value === false) return done(this.expired(), undefined)
      this.finalized = true
      if (local !== undefined) this.mailbox.store.wake(local.queue)
      done(undefined, result.value)
    })
    return start ?? true
  }

  /** Acknowledges through the mailbox's group commit, with the reply to insert in the same transaction. */
  private settle(
    reply: SettleItem["reply"]
  ): Effect.Effect<string | undefined, ReceiptHandleExpiredError | MailboxConnectionError> {
    return this.mailbox.settler.submit(this.item(reply)).pipe(
      connectionError(this.mailbox.name),
      Effect.flatMap((settled) => {
        if (settled === false) return Effect.fail(this.expired())
        this.finalized = true
        if (reply !== undefined) this.mailbox.store.wake(reply.queue)
        return Effect.succeed(settled)
      })
    )
  }

  get acknowledge(): Effect.Effect<void, ReceiptHandleExpiredError | MailboxConnectionError> {
    return Effect.asVoid(this.settle(undefined))
  }

  nack(
    visibilityTimeout?: Duration.DurationInput
  ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError | MailboxConnectionError> {
    return Either.match(validateVisibility("visibilityTimeout", visibilityTimeout), {
      onLeft: Effect.fail,
      onRight: (timeout) =>
        Effect.tap(
          this.setVisibility(timeout, true),
          () => Duration.isZero(timeout) ? Effect.sync(() => this.mailbox.store.wake(this.mailbox.name)) : Effect.void
        )
    })
  }

  extendVisibility(
    timeout: Duration.DurationInput
  ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError | MailboxConnectionError> {
    return Either.match(validateVisibility("timeout", timeout), {
      onLeft: Effect.fail,
      onRight: (timeout) =>
        Effect.suspend(() => {
          const { clock, extensions, name } = this.mailbox
          const timeoutMillis = Duration.toMillis(timeout)
          const submitted = clock.unsafeCurrentTimeMillis()
          return extensions.submit({ seq: this.id, handle: this.receiptHandle, timeoutMillis, leaseEnd: this.leaseEnd })
            .pipe(
              connectionError(name),
              Effect.flatMap((extended) => {
                if (!extended) return Effect.fail(this.expired())
                this.leaseEnd = submitted + timeoutMillis
                return Effect.void
              })
            )
        })
    })
  }

  /**
   * Routes a reply without waiting when it can: the checks, and a destination this resolver already
   * gave (`undefined` when it has to be resolved first).
   */
  private routeNow(
    resolver: MailboxResolver["Type"],
    body: R
  ): Either.Either<ReplyRoute, ReplyError> | undefined {
    const refused = this.replyRefused()
    if (refused !== undefined) return Either.left(refused)
    const found = this.mailbox.routes.get(resolver)?.get(Option.getOrElse(this.replyTo, () => ""))
    if (found === undefined) return undefined
    if ("target" in found) return Either.right({ _tag: "Remote", target: found.target })
    const encoded = found.encode(body)
    return Either.isLeft(encoded)
      ? Either.left(new SerializationError({ mailbox: found.queue, messageId: this.id, reason: encoded.left }))
      : Either.right({ _tag: "Local", queue: found.queue, body: encoded.right })
  }

  /** Why this delivery cannot reply at all, if it cannot. */
  private replyRefused(): MessageFinalizedError | ReplyNotAvailableError | undefined {
    return FrontEnd.replyRefused(this.id, this.finalized, this.replyTo)
  }

  private route(body: R): Effect.Effect<ReplyRoute, ReplyError, MailboxResolver> {
    return Effect.flatMap(MailboxResolver, (resolver) => {
      const now = this.routeNow(resolver, body)
      if (now !== undefined) return now
      // A reply target is resolved once per resolver and name: resolving (and, for a queue the resolver
      // does not know, building its error) on every message costs more than the reply's insert.
      const replyTo = Option.getOrElse(this.replyTo, () => "") // present: `routeNow` answered otherwise
      return resolver.resolve(replyTo).pipe(
        Effect.map((target): Destination => {
          const local = localOf(target)
          return local !== undefined && sameTables(local.store, this.mailbox.store)
            ? { queue: local.queue, encode: local.encode }
            : { target }
        }),
        Effect.catchTag("MailboxResolutionError", (error) =>
          this.mailbox.replyEncoder === undefined
            ? Effect.fail(error)
            : Effect.succeed<Destination>({ queue: replyTo, encode: this.mailbox.replyEncoder })),
        Effect.flatMap((destination) => {
          let known = this.mailbox.routes.get(resolver)
          if (known === undefined) this.mailbox.routes.set(resolver, known = new Map())
          known.set(replyTo, destination)
          return this.routeNow(resolver, body)!
        })
      )
    })
  }

  reply(body: R): Effect.Effect<string, ReplyError, MailboxResolver> {
    return Effect.flatMap(this.route(body), (route) => {
      if (route._tag === "Remote") return route.target.send(body)
      const { statements, store } = this.mailbox
      return currentTraceparent((traceparent) =>
        statements.insert(
          route.queue,
          [
            traceparent === undefined
              ? { body: route.body, delayMillis: 0, replyTo: null }
              : { body: route.body, delayMillis: 0, replyTo: null, traceparent }
          ],
          this.mailbox.now(),
          undefined
        )
      ).pipe(
        Effect.map((ids) => {
          store.wake(route.queue)
          return ids[0]!
        }),
        connectionError(route.queue)
      )
    })
  }

  replyAndAcknowledge(body: R): Effect.Effect<string, ReplyError | ReceiptHandleExpiredError, MailboxResolver> {
    return Effect.flatMap(this.route(body), (route) => {
      if (route._tag === "Remote") {
        // No shared transaction with another store: check the lease first so a stale delivery sends nothing.
        return this.guarded((now) => this.mailbox.statements.isCurrent(this.id, this.receiptHandle, now), false).pipe(
          Effect.zipRight(route.target.send(body)),
          Effect.zipLeft(this.acknowledge)
        )
      }
      return currentTraceparent((traceparent) =>
        Effect.map(this.settle(localReply(route, traceparent)), (replyId) => replyId!)
      )
    })
  }
}
