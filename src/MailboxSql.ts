/**
 * MailboxSql: the durable `Mailbox` backend over `@effect/sql`, on SQLite (one
 * machine, the embedded default) or PostgreSQL (many machines).
 *
 * Every queue of a database lives in one table, `<prefix>mailbox_messages`,
 * created by a migration on first use (or by `leasehold migrate`, for
 * mailboxes made with `create: false`). A row is visible when its `visible_at`
 * (epoch ms) has passed by the database's own clock, read in each statement:
 * workers on machines whose clocks drift judge every lease alike, and a
 * SQLite claim reads the time once it holds the file (under `TestClock` the
 * statements use the test's time instead: see `Now`). Receiving a row sets a fresh
 * random receipt handle and pushes `visible_at` out by the visibility
 * timeout, in one statement — `FOR UPDATE SKIP LOCKED` on PostgreSQL, so
 * concurrent receivers never wait on each other, and one write transaction
 * on SQLite. Acknowledge, nack and extend are statements guarded by the
 * handle and `visible_at > now`, so a stale handle changes nothing; the
 * acknowledgements (with their replies) that concurrent loops submit while
 * one is committing go together in the next statement (group commit), and so
 * do concurrent sends — on SQLite too, where a grouped acknowledgement is two
 * statements (the deletes, the replies) and grouped sends one, whatever their
 * number. A receive interrupted once its rows are claimed gives them back at
 * once.
 * On PostgreSQL the claim and the grouped acknowledgement run inside two
 * PL/pgSQL functions (`<prefix>mailbox_claim`, `<prefix>mailbox_settle`):
 * their settings pin index plans, so a table PostgreSQL has not analysed yet
 * (a new queue, a burst) is not scanned whole per statement, and each
 * connection plans them once. Claims, grouped acknowledgements and sends run
 * on a connection of the store's own, outside the pool, opened with its first
 * mailbox and closed with its last (its lane: see `Store.onLane`), so the
 * server works on one of them at a time, back to back; extensions and nacks
 * run there too, so an application holding every pooled connection cannot
 * starve a working message's proof of work.
 *
 * Long polls sleep until a wake-up, the next visibility expiry in the queue
 * or the end of the wait; a queue's idle receivers share one look-up of that
 * expiry, as they share claims. Sends in the same process wake receivers at once;
 * across processes PostgreSQL sends `NOTIFY` (with a bounded polling
 * fallback) and SQLite receivers poll with backoff.
 *
 * A message keeps its sender's W3C trace context in a nullable `traceparent`
 * column (migration 6); a value that is not well-formed reads as none.
 *
 * A process records each queue it sends to in `<prefix>mailbox_queues` the
 * first time (migration 10: see `internal/mailbox/sql/queues.ts`); a queue
 * paused there (`MailboxSqlAdmin`, `leasehold mailbox pause`) gives its
 * receivers nothing — the claim looks the queue's row up.
 *
 * A stored body that no longer decodes with the mailbox's Schema is moved to
 * `<prefix>mailbox_dead_letters` with the decode error; it never reaches the
 * worker. `MailboxSqlAdmin.deadLetters` lists, counts, redrives and purges that
 * table.
 *
 * Where it lives: this module is the SQL driver under the mailbox front end
 * every backend shares (`internal/mailbox/frontEnd.ts`), with the resolver
 * and the layers; `internal/mailbox/sql/` holds the rest — `message.ts` (a
 * delivery: settles, replies, group settling), `store.ts` (tables and
 * migrations, wake-up signals, the lane, the listener, and the store's open
 * life: an entry of an `RcMap` owned by this module's layer, or by a lone
 * mailbox's scope),
 * `statements.ts` (one statement set per dialect behind one interface),
 * `batching.ts` (shared claims, look-ups and settles) and `codec.ts` (bodies).
 * The operator's API is `MailboxSqlAdmin`.
 *
 * Replies: `replyAndAcknowledge` writes the reply and deletes the request in
 * one transaction when the reply queue is in the same database (a worker
 * killed in between leaves neither), so every request gets exactly one reply
 * even when it was executed twice. A reply queue is found through the
 * `MailboxResolver`; a queue the resolver does not know is still reached when
 * the mailbox was made with a `replySchema`.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Database from "./Database.js"
import type { SchemaVersionError } from "./Errors.js"
import * as FrontEnd from "./internal/mailbox/frontEnd.js"
import * as Scheduling from "./internal/mailbox/scheduling.js"
import {
  batchLimits,
  ClaimBatcher,
  type Claimed,
  settleBatcher,
  SingleFlight
} from "./internal/mailbox/sql/batching.js"
import { decoderOf, encoderOf, maxBodyBytesLimit } from "./internal/mailbox/sql/codec.js"
import { batchRows, extensionBatcher } from "./internal/mailbox/sql/extensions.js"
import { GroupCommit } from "./internal/mailbox/sql/groupCommit.js"
import * as Journal from "./internal/mailbox/sql/journal.js"
import { type Local, type MailboxContext, sink, SqlMessage } from "./internal/mailbox/sql/message.js"
import { record as recordQueue } from "./internal/mailbox/sql/queues.js"
import { prepare, requireMigrated } from "./internal/mailbox/sql/schema.js"
import { type Now, nowOf, type SendItem, statements } from "./internal/mailbox/sql/statements.js"
import { connectionError, hold, makeStores, type Row, type Stores, StoresTag } from "./internal/mailbox/sql/store.js"
import * as Validation from "./internal/mailbox/validation.js"
import { counter } from "./internal/metrics.js"
import { storableText } from "./internal/names.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import { createFromEnv } from "./internal/sql/version.js"
import { validTraceparent } from "./internal/tracing.js"
import {
  type Mailbox,
  MailboxConnectionError,
  MailboxFullError,
  MailboxResolutionError,
  MailboxResolver,
  type Message,
  type ReplyTarget,
  type SendError,
  SerializationError
} from "./Mailbox.js"

/**
 * Deliveries extended per extension statement: extensions group-commit, so under load one statement carries many.
 *
 * @category metrics
 */
export const extensionBatchRows = batchRows

/**
 * Stored bodies that no longer decoded and were moved to the dead-letter table.
 *
 * @category metrics
 */
export const undecodableDeadLettered = counter(
  "leasehold_mailbox_undecodable_total",
  "Stored message bodies that no longer decoded and were moved to the dead-letter table"
)

/**
 * Keys a claim passed over although it was looking for work, by queue and reason (`limit`, `starts`, `tokens`):
 * a steadily growing `limit` count says a key's limit is what holds its messages back (scheduling by key).
 *
 * @category metrics
 */
export const keysHeldBack = Scheduling.keysHeldBack

// ---------------------------------------------------------------------------
// make
// ---------------------------------------------------------------------------

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options<A, I, R, IR> {
  /** The queue's name: unique within the database and prefix. */
  readonly name: string
  /** Encodes bodies for storage; a stored body that no longer decodes is dead-lettered. */
  readonly schema: Schema.Schema<A, I, never>
  /** Encodes replies for a `replyTo` queue of this database that the `MailboxResolver` does not know. */
  readonly replySchema?: Schema.Schema<R, IR, never> | undefined
  /** Bounds unacknowledged messages (checked in the insert statement, so a burst of concurrent sends can pass it slightly). */
  readonly maxSize?: number | undefined
  /** Table name prefix (default `leasehold_`). */
  readonly prefix?: string | undefined
  /** Longest sleep between polls of a waiting receiver (default 250 ms on SQLite, 1 s on PostgreSQL, which also listens). */
  readonly pollInterval?: Duration.DurationInput | undefined
  /**
   * The largest encoded body (UTF-8 bytes) `send` stores (default 4 MiB, at most 256 MiB); a larger one is
   * a `SerializationError` at `send`. Replies sent to this queue are held to it too.
   */
  readonly maxBodyBytes?: number | undefined
  /**
   * Create or upgrade the tables at start (default true, or `LEASEHOLD_MIGRATE` when set). False runs no
   * migration: the tables must be at the version this release needs (`leasehold migrate` puts them there),
   * else `make` fails with a `SchemaVersionError` saying so.
   */
  readonly create?: boolean | undefined
  /**
   * Publishes each key's live leases as the gauge `leasehold_mailbox_key_leases` (tagged `queue` and `key`; at
   * most 1,000 keys, refreshed by a claim at most every 10 s). Off by default: key names are the senders', and
   * every key shown stays a series.
   */
  readonly keyMetrics?: boolean | undefined
}

/**
 * `maxBodyBytes` unless given: a request or a reply, not a file (store those elsewhere and send a reference).
 *
 * @category constants
 */
export const defaultMaxBodyBytes = 4 * 1024 * 1024

/**
 * The longest queue name (every backend's rule).
 *
 * @category constants
 */
export const maxQueueNameLength = Validation.maxQueueNameLength

/** The longest reason a dead letter keeps for a body that no longer decodes (the decode error can quote the body). */
const maxReasonLength = 16 * 1024

/** A Schema option: required by the types, checked for callers in plain JavaScript (a `TypeError` before). */
const SchemaOption: Schema.Schema<Schema.Schema.Any> = Options_.worded(
  Schema.declare((input: unknown): input is Schema.Schema.Any => Schema.isSchema(input)),
  () => "must be a Schema (effect/Schema)"
)

const decodeOptions = Options_.decoder("MailboxSql.make", {
  name: Validation.QueueName,
  // Required by the type; checked for callers in plain JavaScript, where a missing one was a `TypeError`.
  schema: SchemaOption,
  replySchema: Schema.optionalWith(SchemaOption, { exact: true }),
  maxSize: Schema.optionalWith(Validation.MaxSize, { exact: true }),
  prefix: Sql.Prefix,
  pollInterval: Schema.optionalWith(Options_.duration({ max: Duration.minutes(1) }), { exact: true }),
  maxBodyBytes: Schema.optionalWith(
    Options_.intBetween(1, maxBodyBytesLimit, `must be an integer in 1..${maxBodyBytesLimit} (256 MiB)`),
    { exact: true, default: () => defaultMaxBodyBytes }
  ),
  create: Schema.optionalWith(Schema.Boolean, { exact: true, default: () => true }),
  keyMetrics: Schema.optionalWith(Schema.Boolean, { exact: true })
})

/**
 * Makes a mailbox on the `SqlClient` in the context, creating the tables on
 * first use (unless `create: false`); closed when the scope closes (its
 * messages stay in the database). Bad options are a `ParseError` naming them.
 *
 * @category constructors
 */
export const make = <A, I, R = never, IR = never>(
  options: Options<A, I, R, IR>
): Effect.Effect<
  Mailbox<A, R>,
  ParseResult.ParseError | MailboxConnectionError | SchemaVersionError,
  SqlClient.SqlClient | Scope.Scope
> =>
  Effect.gen(function*() {
    const { create, keyMetrics, maxBodyBytes, maxSize, name, pollInterval, prefix } = yield* decodeOptions(
      yield* createFromEnv(options)
    )
    const sql = yield* SqlClient.SqlClient
    yield* (create ? prepare(prefix) : requireMigrated(prefix))
    // The layer's store of this prefix (else one of this mailbox's own), held open while the mailbox is: the
    // first mailbox in starts its lane, listener and row; the last one out stops them.
    const store = yield* hold(sql, prefix).pipe(connectionError(name))
    if (keyMetrics === true) store.keyMetrics.add(name)
    const scope = yield* Effect.scope
    const maxPollMillis = Math.max(1, Duration.toMillis(pollInterval ?? (store.dialect === "pg" ? 1000 : 250)))
    const clock = yield* Effect.clock
    const statements_ = statements(store)
    const encode = encoderOf(options.schema, maxBodyBytes)
    const decode = decoderOf(options.schema)
    const now = nowOf(clock)
    const settler = settleBatcher(statements_, now, scope)
    // Sends group-commit too: concurrent producers share one statement and one commit.
    const sender = new GroupCommit<SendItem, string | undefined, SqlError>(
      (items) =>
        // The queue is recorded (queues.ts) before this process's first send to it; later sends write nothing more
        // (and, recorded, do not ask).
        Effect.map(
          store.recorded.has(name)
            ? statements_.insert(name, items, now(), maxSize)
            : Effect.zipRight(recordQueue(store, name, now()), statements_.insert(name, items, now(), maxSize)),
          (ids) => {
            if (items.some((item, index) => item.delayMillis === 0 && ids[index] !== undefined)) store.wake(name)
            return ids
          }
        ),
      { ...batchLimits, sizeOf: (item) => 64 + item.body.length, retryAlone: Sql.isDataError },
      scope
    )
    // Extensions group-commit ahead of claims (see internal/mailbox/sql/extensions.ts), their committer forked in
    // the mailbox's scope.
    const extensions = yield* extensionBatcher(store, statements_, name, now, clock, scope)
    const context: MailboxContext = {
      name,
      store,
      statements: statements_,
      settler,
      extensions,
      clock,
      appender: Journal.appendBatcher(store, statements_, now, scope),
      routes: new WeakMap(),
      now,
      replyEncoder: options.replySchema === undefined ? undefined : encoderOf(options.replySchema, maxBodyBytesLimit)
    }
    const withStore = connectionError(name)

    const insert = (
      body: A,
      delayMillis: number,
      replyTo: string | undefined,
      traceparent: string | undefined,
      placement: FrontEnd.Placement | undefined
    ): Effect.Effect<string, SendError> => {
      const encoded = encode(body)
      if (Either.isLeft(encoded)) return Effect.fail(new SerializationError({ mailbox: name, reason: encoded.left }))
      const plain: SendItem = traceparent === undefined
        ? { body: encoded.right, delayMillis, replyTo: replyTo ?? null }
        : { body: encoded.right, delayMillis, replyTo: replyTo ?? null, traceparent }
      // A key or a priority goes with the message (internal/mailbox/sql/keys.ts schedules by them).
      const item: SendItem = placement === undefined
        ? plain
        : {
          ...plain,
          ...(placement.key === undefined ? {} : { key: placement.key }),
          ...(placement.priority === 0 ? {} : { priority: placement.priority })
        }
      return sender.submit(item).pipe(
        withStore,
        Effect.flatMap((id) =>
          id === undefined
            ? Effect.fail(new MailboxFullError({ mailbox: name, maxSize: maxSize! }))
            : Effect.succeed(id)
        )
      )
    }

    /**
     * Turns claimed rows (in queue order: `ClaimBatcher` sorts a claim once) into messages; a row whose body no
     * longer decodes (whatever the reason: a schema error, a transformation that throws, a stack overflow)
     * goes to the dead-letter table alone, and the others are delivered. A batch that decodes whole — nearly
     * every one — is a plain loop.
     */
    const toMessages = (
      rows: ReadonlyArray<Row>,
      now: Now,
      leaseEnd: number
    ): Effect.Effect<Array<Message<A, R>>, SqlError> => {
      const received: Array<Message<A, R>> = []
      let undecodable: Array<{ readonly id: string; readonly handle: string; readonly reason: string }> | undefined
      for (const row of rows) {
        const id = String(row.seq)
        const body = decode(row.body)
        if (Either.isLeft(body)) {
          ;(undecodable ??= []).push({
            id,
            handle: row.receipt_handle,
            reason: storableText(body.left, maxReasonLength)
          })
          continue
        }
        const message = new SqlMessage<A, R>(
          context,
          id,
          body.right,
          row.receipt_handle,
          Number(row.delivery_count),
          Number(row.enqueued_at),
          Option.fromNullable(row.reply_to),
          // Written by another process, or by hand: a malformed value is no trace, not a failed receive.
          row.traceparent == null ? undefined : validTraceparent(row.traceparent)
        )
        message.leaseEnd = leaseEnd
        if (row.key != null) message.key = row.key
        if (row.priority != null && Number(row.priority) !== 0) message.priority = Number(row.priority)
        received.push(message)
      }
      if (undecodable === undefined) return Effect.succeed(received)
      return Effect.as(
        Effect.forEach(undecodable, ({ handle, id, reason }) =>
          Effect.zipRight(
            statements_.deadLetter(id, handle, now, "SerializationError", reason),
            Effect.zipRight(
              Metric.increment(undecodableDeadLettered),
              Effect.logWarning(`Message ${id} in mailbox "${name}" no longer decodes; moved to dead letters`, reason)
            )
          ), { discard: true }),
        received
      )
    }

    const releaseRows = (rows: ReadonlyArray<Row>, now: Now) =>
      Effect.forEach(
        rows,
        (row) => Effect.ignore(statements_.release(String(row.seq), row.receipt_handle, now)),
        { discard: true }
      )
    const nextVisibleIn = new SingleFlight(() => statements_.nextVisibleIn(name, now()), scope)
    const claimer = new ClaimBatcher(
      (at, visibilityMillis, max) =>
        extensions.flushing
          ? Effect.zipRight(extensions.beforeClaim, statements_.claim(name, at, visibilityMillis, max))
          : statements_.claim(name, at, visibilityMillis, max),
      releaseRows,
      now,
      scope
    )

    /**
     * One claim, grouped with other receivers' (see `ClaimBatcher`). Only the wait is interruptible; if an
     * interruption lands once this receiver's rows are claimed but before it has them as messages, they are
     * released (visible again, delivery not counted).
     */
    const claimOnce = (max: number, visibilityMillis: number) =>
      Effect.suspend(() => {
        let claimed: Claimed | undefined
        // The leases end no sooner than this (the claim starts after it): what orders their extensions.
        const leaseEnd = clock.unsafeCurrentTimeMillis() + visibilityMillis
        return Effect.uninterruptibleMask((restore) =>
          claimer.submit(max, visibilityMillis, restore).pipe(
            Effect.tap((result) => {
              claimed = result
            }),
            Effect.flatMap(({ now, rows }) => toMessages(rows, now, leaseEnd))
          )
        ).pipe(
          // Interrupted, or the store failed while the rows were being set aside: they go back (a row already
          // dead-lettered is not released: its handle no longer matches), when the store lets them.
          Effect.onExit((exit) =>
            Exit.isSuccess(exit) || claimed === undefined ? Effect.void : releaseRows(claimed.rows, claimed.now)
          ),
          withStore,
          Effect.tapError(() => Effect.sync(() => store.relisten()))
        )
      })

    // Loops made on it are listed in the process's row of the workers table (internal/mailbox/sql/workers.ts);
    // a reply to it from a mailbox of the same database is written in that mailbox's acknowledgement.
    const mailbox = FrontEnd.make<A, R>(name, {
      insert,
      claim: claimOnce,
      nextVisibleIn: withStore(nextVisibleIn.run),
      arm: () => store.arm(name),
      count: withStore(statements_.count(name)),
      purge: withStore(statements_.purge(name)),
      // Other processes' sends reach PostgreSQL's receivers by NOTIFY, so its polls are only a fallback;
      // SQLite's receivers poll with backoff from 10 ms.
      poll: { firstMillis: store.dialect === "pg" ? maxPollMillis : 10, maxMillis: maxPollMillis },
      sink,
      registry: store.registry,
      local: { store, queue: name, encode } satisfies Local
    }, clock)

    const target = mailbox as unknown as ReplyTarget
    let open = store.open.get(name)
    if (open === undefined) store.open.set(name, open = new Set())
    open.add(target)
    // Closed in reverse: the mailbox, then its batchers (they drain), then its hold on the store.
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        mailbox.close,
        Effect.sync(() => {
          open.delete(target)
          if (open.size === 0) store.open.delete(name)
        })
      )
    )
    return mailbox
  })

/**
 * Options of `resolver` and `layer`.
 *
 * @category models
 */
export interface ResolverOptions {
  /** Table name prefix (default `leasehold_`). */
  readonly prefix?: string | undefined
}

const decodeResolverOptions = Options_.decoder("MailboxSql.resolver", { prefix: Sql.Prefix })

/**
 * A resolver over the mailboxes open on this database and prefix under the
 * layer in the context (`layer`, `layerSqlite`, `layerPg`): a reply to any of
 * them needs no configuration. Without one it resolves nothing.
 *
 * @category constructors
 */
export const resolver = (options?: ResolverOptions): Effect.Effect<
  MailboxResolver["Type"],
  ParseResult.ParseError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const { prefix } = yield* decodeResolverOptions(options)
    const sql = yield* SqlClient.SqlClient
    const stores = yield* Effect.serviceOption(StoresTag)
    return resolverOf(stores._tag === "Some" && stores.value.sql === sql ? stores.value : undefined, prefix)
  })

/** Resolves a name to a mailbox open on the store of `prefix` in `stores`. */
const resolverOf = (stores: Stores | undefined, prefix: string): MailboxResolver["Type"] => ({
  resolve: (name: string) => {
    const open = stores?.live.get(prefix)?.open.get(name)
    const first = open === undefined ? undefined : open.values().next().value
    return first === undefined ? Effect.fail(new MailboxResolutionError({ name })) : Effect.succeed(first)
  }
})

// ---------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------

/**
 * What the layers provide: the database client and a resolver over its mailboxes.
 *
 * @category models
 */
export type Services = SqlClient.SqlClient | MailboxResolver

/**
 * The mailboxes' stores and their `MailboxResolver` on the `SqlClient` in the context (provide
 * `Database.layerSqlite` / `layerPg` once: every durable service of the process then shares its pool). The
 * layer owns the stores: the mailboxes made under it share one per prefix (its lane, listener and workers
 * row), and closing the layer ends them.
 *
 * @category layers
 */
export const layer = (options?: ResolverOptions): Layer.Layer<
  MailboxResolver,
  ParseResult.ParseError,
  SqlClient.SqlClient
> =>
  // The stores ride in the context beside the resolver, under an internal tag: `make` finds them there.
  Layer.scopedContext(Effect.gen(function*() {
    const { prefix } = yield* decodeResolverOptions(options)
    const stores = yield* makeStores(yield* SqlClient.SqlClient)
    return Context.make(StoresTag, stores).pipe(Context.add(MailboxResolver, resolverOf(stores, prefix)))
  }))

/**
 * Options of `layerSqlite`: `Database.layerSqlite`'s and the table prefix.
 *
 * @category models
 */
export interface SqliteOptions extends ResolverOptions {
  readonly filename: string
  /** How long a writer waits for another process's lock (default 5 s, at most 10 min). */
  readonly busyTimeout?: Duration.DurationInput | undefined
}

/**
 * `Database.layerSqlite` with this module's resolver: the client and a resolver over its mailboxes.
 *
 * @category layers
 */
export const layerSqlite = (
  options: SqliteOptions
): Layer.Layer<Services, MailboxConnectionError | ParseResult.ParseError> =>
  Layer.provideMerge(
    layer(options),
    Database.layerSqlite(options).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "DatabaseError"
            ? new MailboxConnectionError({ mailbox: options.filename, cause: error })
            : error
        )
      )
    )
  )

/**
 * Options of `layerPg`: `Database.layerPg`'s and the table prefix.
 *
 * @category models
 */
export interface PgOptions extends ResolverOptions {
  readonly url?: Redacted.Redacted | string | undefined
  /** Most connections the pool opens (default 10). */
  readonly maxConnections?: number | undefined
  /**
   * Connections opened when the layer starts and kept open (default 4, or `maxConnections` if fewer), so a
   * worker's first long polls do not pay for new server processes. Claims, acknowledgements, sends,
   * extensions and nacks do not use the pool: the mailboxes of a prefix share a connection of their own,
   * opened with the first of them.
   */
  readonly minConnections?: number | undefined
}

/**
 * `Database.layerPg` with this module's resolver: the client and a resolver over its mailboxes.
 *
 * @category layers
 */
export const layerPg = (
  options?: PgOptions
): Layer.Layer<Services, MailboxConnectionError | ConfigError.ConfigError | ParseResult.ParseError> =>
  Layer.provideMerge(
    layer(options),
    Database.layerPg(options).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "DatabaseError" ? new MailboxConnectionError({ mailbox: error.database, cause: error }) : error
        )
      )
    )
  )
