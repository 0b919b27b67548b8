/**
 * The store: what the mailboxes on one database and table prefix share — its
 * tables (created and upgraded by `migrate`, checked by `requireMigrated` under
 * `create: false`, the operator's read-only `openExisting`), the wake-up
 * signals of its queues, PostgreSQL's LISTEN connection, the lane (a
 * connection of its own: see `Store.onLane`) and the process's row in the
 * workers table (`workers.ts`). The store has an owner: `Stores`, an `RcMap`
 * by prefix made in `MailboxSql.layer`'s scope (or a lone mailbox's), whose
 * lookup is the store's open life — the lane, the listener and the row's
 * refresh live in that entry's scope, as `@effect/sql`'s `SqlPersistedQueue`
 * starts its poller inside its map's lookup.
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Layer from "effect/Layer"
import * as RcMap from "effect/RcMap"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import { randomBytes } from "node:crypto"
import { hostname } from "node:os"
import { TablesNotFoundError } from "../../../Errors.js"
import { MailboxConnectionError, type ReplyTarget } from "../../../Mailbox.js"
import type { Registry, TrackedLoop } from "../../worker/pulse.js"
import * as Sql from "../common.js"
import { requireVersion } from "../version.js"
import * as Journal from "./journal.js"
import * as Queues from "./queues.js"
import * as Workers from "./workers.js"

export interface Row {
  readonly seq: number | string
  readonly body: string
  readonly receipt_handle: string
  readonly delivery_count: number | string
  readonly enqueued_at: number | string
  readonly reply_to: string | null
  /** The sender's W3C trace context, as stored (checked when read: see `validTraceparent`). */
  readonly traceparent?: string | null | undefined
}

export class Store {
  readonly messages: string
  readonly deadLetters: string
  /** The step journals of agent runs, by message (migration 11: see `journal.ts`). */
  readonly journal: string
  readonly channel: string
  /** This process, as a claim records it in `received_by` (`host:pid`). */
  readonly receiver = `${hostname()}:${process.pid}`
  /**
   * This store's key in the workers table (migration 13): random, so that two stores with one `host:pid` (two
   * layers in one process, two containers with the same host name and pid) keep a row each.
   */
  readonly instance = randomBytes(8).toString("hex")
  private readonly signals = new Map<string, Deferred.Deferred<void>>()
  /** The loops made on the store's mailboxes (`internal/worker/pulse.ts`): what the process's row lists. */
  readonly loops = new Set<TrackedLoop>()
  /** Done once a loop is tracked in the store's open life: the row's refresh starts then (a sender has none). */
  readonly anyLoop: Deferred.Deferred<void> = Deferred.unsafeMake<void>(FiberId.none)
  /** The store's registry (`internal/worker/pulse.ts`), which its mailboxes register under. */
  readonly registry: Registry = {
    loops: this.loops,
    tracked: () => Deferred.unsafeDone(this.anyLoop, Exit.void)
  }
  /** The process's row is written (and so is deleted when the store closes). */
  registered = false
  /** The database's identity under the prefix, once read (`journal.ts`: the base of a message's identity). */
  identity: string | undefined = undefined
  /** Mailboxes open on this store, by queue name (the resolver's view). */
  readonly open = new Map<string, Set<ReplyTarget>>()
  /** Queues this process has recorded in the queues table (see queues.ts): a send records its queue once. */
  readonly recorded = new Set<string>()
  /** Restarts the LISTEN connection (PostgreSQL), after the server went away. */
  relisten: () => void = () => undefined
  /** The PostgreSQL client's settings, from which the lane's client is made; `undefined` on SQLite. */
  readonly pgConfig: PgClient.PgClientConfig | undefined
  /** The lane's client while the store's open life holds it (see `onLane`). */
  lane: SqlClient.SqlClient | undefined = undefined

  constructor(readonly sql: SqlClient.SqlClient, readonly prefix: string, readonly dialect: "pg" | "sqlite") {
    this.messages = `${prefix}mailbox_messages`
    this.deadLetters = `${prefix}mailbox_dead_letters`
    this.journal = `${prefix}mailbox_journal`
    this.channel = `${prefix}mailbox`
    this.pgConfig = dialect === "pg"
      ? (sql as SqlClient.SqlClient & Partial<Pick<PgClient.PgClient, "config">>).config
      : undefined
  }

  /**
   * Runs a claim, a grouped acknowledgement or a send (one statement each, never a transaction of the
   * caller's) on the store's lane (PostgreSQL): a client of its own with one connection, the same settings as
   * the store's client, held by the store's open life (`openLife`: made with its first mailbox, closed with its
   * last). The statements of every mailbox on the store queue for that connection, so the server works on one
   * at a time with no gap between them (BENCHMARKS.md). A statement that finds the connection dead fails, and
   * once the pool has dropped it the next statement gets a new one. Outside an open life (a late
   * acknowledgement, the operator's store) statements use the store's client.
   */
  onLane<A>(statement: (sql: SqlClient.SqlClient) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.suspend(() => statement(this.lane ?? this.sql))
  }

  /** The signal a receiver of `queue` sleeps on; armed before it looks, so no wake-up is missed. */
  arm(queue: string): Deferred.Deferred<void> {
    let signal = this.signals.get(queue)
    if (signal === undefined) {
      signal = Deferred.unsafeMake<void>(FiberId.none)
      this.signals.set(queue, signal)
    }
    return signal
  }

  wake(queue: string): void {
    const signal = this.signals.get(queue)
    if (signal !== undefined) {
      this.signals.delete(queue)
      Deferred.unsafeDone(signal, Exit.void)
    }
  }
}

/** A store's tables on `sql`, outside any open life: for migrations and the operator's reads and writes. */
export const tablesOf = (sql: SqlClient.SqlClient, prefix: string): Store => new Store(sql, prefix, Sql.dialectOf(sql))

/**
 * The stores of one `SqlClient`, by prefix: what `MailboxSql.layer` builds in its scope (or a mailbox made
 * without it, in its own). Each store's open life is an entry of `lives`, held by the mailboxes open on it:
 * the first one in starts it, the last one out ends it; closing the owner's scope ends them all.
 */
export class Stores {
  /** The stores in their open life now, by prefix (the resolver's view). */
  readonly live = new Map<string, Store>()
  constructor(readonly sql: SqlClient.SqlClient, readonly lives: RcMap.RcMap<string, Store, SqlError>) {}
}

/** The layer's stores, when `MailboxSql.layer` built them (provided beside its resolver). */
export class StoresTag extends Context.Tag("leasehold/MailboxSql/Stores")<StoresTag, Stores>() {}

/** Makes the stores of `sql`, owned by the current scope. */
export const makeStores = (sql: SqlClient.SqlClient): Effect.Effect<Stores, never, Scope.Scope> =>
  Effect.suspend(() => {
    let stores: Stores | undefined
    return Effect.map(
      RcMap.make({ lookup: (prefix: string) => openLife(stores!, prefix) }),
      (lives) => stores = new Stores(sql, lives)
    )
  })

/**
 * The store of `prefix` held open for the current scope (a mailbox's): the layer's stores when they are in the
 * context and on this client, else stores owned by that scope alone.
 */
export const hold = (sql: SqlClient.SqlClient, prefix: string): Effect.Effect<Store, SqlError, Scope.Scope> =>
  Effect.flatMap(Effect.serviceOption(StoresTag), (provided) =>
    Effect.flatMap(
      provided._tag === "Some" && provided.value.sql === sql ? Effect.succeed(provided.value) : makeStores(sql),
      (stores) => RcMap.get(stores.lives, prefix)
    ))

export const connectionError = (mailbox: string) =>
  Sql.mapSqlError((cause) => new MailboxConnectionError({ mailbox, cause }))

/** The mailbox's migrations table under `prefix`. */
export const migrationsTable = (prefix: string) => `${prefix}mailbox_migrations`

/** Creates the tables (idempotent; concurrent processes are fine); answers the migrations it applied. */
export const migrate = (
  store: Store
): Effect.Effect<ReadonlyArray<readonly [number, string]>, SqlError | Migrator.MigrationError> =>
  Sql.migrate(store.sql, migrationsTable(store.prefix), migrations(store))

/** The migrations, by name, in order (`leasehold migrate` lists them; a test builds an older database from the first). */
export const migrations = (store: Store): Record<string, Effect.Effect<void, SqlError>> => {
  const { deadLetters, messages, sql } = store
  return {
    "1_create_mailbox": Effect.all([
      sql`CREATE TABLE IF NOT EXISTS ${sql(messages)} (
        seq ${Sql.identityColumn(sql)},
        queue TEXT NOT NULL,
        body TEXT NOT NULL,
        visible_at BIGINT NOT NULL,
        receipt_handle TEXT,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        enqueued_at BIGINT NOT NULL,
        reply_to TEXT)`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_visible`)} ON ${sql(messages)} (queue, visible_at, seq)`,
      sql`CREATE TABLE IF NOT EXISTS ${sql(deadLetters)} (
        id TEXT PRIMARY KEY,
        queue TEXT NOT NULL,
        body TEXT NOT NULL,
        reply_to TEXT,
        delivery_count INTEGER NOT NULL,
        enqueued_at BIGINT NOT NULL,
        dead_lettered_at BIGINT NOT NULL,
        error_tag TEXT NOT NULL,
        error TEXT NOT NULL)`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${deadLetters}_queue`)} ON ${sql(deadLetters)} (queue, dead_lettered_at)`
    ], { discard: true }),
    // Superseded by 4 (which redefines both functions): kept so databases migrated before it count the same.
    "2_claim_in_index_order": Effect.void,
    "3_settle_by_primary_key": Effect.void,
    // The claim and the grouped acknowledgement as functions, PostgreSQL only.
    // - The claim walks the (queue, visible_at, seq) index in order: PostgreSQL plans a claim on a table it
    //   has not analysed yet (a new queue, a burst) as a bitmap scan plus a sort of every visible row —
    //   milliseconds per claim at a few thousand rows, growing with the backlog. The settings fix the plan.
    // - The acknowledgement finds its batch through the primary key (on an unanalysed table the DELETE
    //   was planned as a sequential scan of the whole table), and draws each reply's id from the sequence
    //   up front so every acknowledged delivery learns its reply's id.
    // - PL/pgSQL, not SQL: a SQL function's body is planned again at every call, PL/pgSQL keeps the plan
    //   for the connection (a quarter of each statement's time at 80 rows), and the sequence is looked
    //   up once per call, not once per reply.
    "4_claim_and_settle_functions": store.dialect === "pg"
      ? Effect.all([
        createClaimFunction(store),
        createSettleFunction(store)
      ], { discard: true })
      : Effect.void,
    // The settle notifies once per reply queue, not once per reply (about a tenth of a settle of 80 rows on an
    // idle cluster: 2.1-2.9 ms without the per-row notify against 2.5-3.1 ms with it).
    "5_settle_notifies_once_per_queue": store.dialect === "pg" ? createSettleFunction(store) : Effect.void,
    // The sender's W3C trace context, NULL for messages sent without a span (and for every message stored
    // before). PostgreSQL's settle gets an overload that stores each reply's context; the one it replaces
    // stays, so a process still on the previous version settles as it did while others upgrade.
    "6_traceparent": Effect.zipRight(
      store.dialect === "pg"
        ? sql`ALTER TABLE ${sql(messages)} ADD COLUMN IF NOT EXISTS traceparent TEXT`
        : sql`ALTER TABLE ${sql(messages)} ADD COLUMN traceparent TEXT`,
      store.dialect === "pg" ? createSettleFunction(store, { traceparents: true }) : Effect.void
    ),
    // Who holds a delivery and when it was last extended, for the operator (`leasehold console`): a claim
    // records the receiving process (`host:pid`, one for all its workers: claims are batched per process) and
    // clears the extension time, an extension sets it. PostgreSQL's claim gets an overload taking the receiver;
    // the one it replaces stays, so a process still on the previous version claims as it did while others
    // upgrade (its claims leave the receiver as it was).
    "7_receiver_and_extension": Effect.zipRight(
      store.dialect === "pg"
        ? sql`ALTER TABLE ${sql(messages)} ADD COLUMN IF NOT EXISTS received_by TEXT,
            ADD COLUMN IF NOT EXISTS extended_at BIGINT`
        : Effect.zipRight(
          sql`ALTER TABLE ${sql(messages)} ADD COLUMN received_by TEXT`,
          sql`ALTER TABLE ${sql(messages)} ADD COLUMN extended_at BIGINT`
        ),
      store.dialect === "pg" ? createClaimFunction(store, { receiver: true }) : Effect.void
    ),
    // A dead letter keeps its message's trace context, and a redrive puts it back, so a redriven message
    // continues the trace it was sent in.
    "8_dead_letter_traceparent": store.dialect === "pg"
      ? sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN IF NOT EXISTS traceparent TEXT`
      : sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN traceparent TEXT`,
    // The worker processes and their loops, for the operator (`leasehold workers`, the console): see workers.ts.
    "9_workers": Workers.createTable(store),
    // The queues table (queues.ts): a queue stays listed while empty, until dropped, and a paused queue's
    // receivers get nothing. PostgreSQL's claim (the overload migration 7 made, same signature) is replaced by
    // one that returns nothing for a paused queue, so a process still on the previous version honours a pause too.
    "10_queues_and_pause": Effect.zipRight(
      Queues.create(store),
      store.dialect === "pg" ? createClaimFunction(store, { receiver: true, pause: true }) : Effect.void
    ),
    // The step journal of agent runs (internal/mailbox/journal.ts): the steps a delivery recorded, kept by the
    // message's seq so a redelivery replays them. Deleted with the message by its acknowledgement (or kept for a
    // dead letter, until retention's `journals`); found by request id by the operator.
    "11_journal": Effect.all([
      sql`CREATE TABLE IF NOT EXISTS ${sql(store.journal)} (
        message_seq BIGINT NOT NULL,
        position INTEGER NOT NULL,
        step_key TEXT NOT NULL,
        queue TEXT NOT NULL,
        request_id TEXT,
        entry TEXT NOT NULL,
        recorded_at BIGINT NOT NULL,
        PRIMARY KEY (message_seq, position),
        UNIQUE (message_seq, step_key))`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${store.journal}_request`)} ON ${sql(store.journal)} (request_id)`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${store.journal}_queue`)} ON ${sql(store.journal)} (queue)`,
      // Retention's `journals` takes the oldest steps first.
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${store.journal}_recorded`)} ON ${sql(store.journal)} (recorded_at)`
    ], { discard: true }),
    // One journal identity on every backend (journal.ts): the request id stored as JSON text and indexed by a
    // digest (PostgreSQL refused a long id in the index, and a NUL or a lone surrogate as text), and the
    // database's identity, drawn here, which names its messages in tools' idempotency keys.
    "12_journal_identity": Journal.migrateIdentity(store),
    // The workers table keyed by each store's random instance (workers.ts): rows of one `host:pid` no longer
    // overwrite each other. 9's table stays, for processes of the previous release (still listed).
    "13_worker_instance": Workers.createInstancesTable(store)
  }
}

/**
 * The claim (PostgreSQL): up to `p_max` visible messages of a queue in index order, skipping rows another claim
 * holds. With `receiver` (migration 7 on), an overload that also records who received them; with `pause`
 * (migration 10 on), nothing for a paused queue.
 */
const createClaimFunction = (
  store: Store,
  options?: { readonly receiver: boolean; readonly pause?: boolean }
) => {
  const { messages, sql } = store
  const receiver = options?.receiver === true
  // One primary-key look-up per claim: a paused queue (queues.ts) gives nothing.
  const pause = options?.pause === true
    ? sql`IF EXISTS (SELECT 1 FROM ${sql(Queues.tableOf(store.prefix))} q WHERE q.name = p_queue AND q.paused <> 0)
          THEN RETURN; END IF;`
    : sql``
  return sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_claim`)}(
          p_queue text, p_now bigint, p_visible_at bigint, p_max integer${receiver ? sql`, p_receiver text` : sql``})
        RETURNS SETOF ${sql(messages)} LANGUAGE plpgsql VOLATILE
        SET enable_bitmapscan = off SET enable_sort = off
        AS $$ BEGIN
          ${pause}
          RETURN QUERY
          UPDATE ${sql(messages)} m SET visible_at = p_visible_at, receipt_handle = gen_random_uuid()::text,
            delivery_count = m.delivery_count + 1${
    receiver ? sql`, received_by = p_receiver, extended_at = NULL` : sql``
  }
          WHERE m.seq = ANY(ARRAY(
            SELECT c.seq FROM ${sql(messages)} c WHERE c.queue = p_queue AND c.visible_at <= p_now
            ORDER BY c.visible_at, c.seq LIMIT p_max FOR UPDATE SKIP LOCKED))
          RETURNING m.*;
        END $$`
}

/**
 * The grouped acknowledgement (PostgreSQL): deletes each delivery whose handle is current and inserts
 * its reply in the same statement, then wakes each reply queue once. With `traceparents` (migration 6 on),
 * an overload that also takes each reply's trace context (the array may be NULL: no reply has one).
 */
export const createSettleFunction = (store: Store, options?: { readonly traceparents: boolean }) => {
  const { messages, sql } = store
  const traced = options?.traceparents === true
  return sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_settle`)}(
          p_seqs bigint[], p_handles text[], p_reply_queues text[], p_reply_bodies text[], p_now bigint,
          p_channel text${traced ? sql`, p_reply_traceparents text[]` : sql``})
        RETURNS TABLE (settled_seq bigint, settled_reply_seq bigint, notified boolean) LANGUAGE plpgsql VOLATILE
        SET enable_seqscan = off
        AS $$
        DECLARE
          v_sequence regclass := pg_get_serial_sequence(${sql.literal(`'${messages}'`)}, 'seq')::regclass;
        BEGIN
          RETURN QUERY
          WITH input AS MATERIALIZED (
            SELECT v.seq, v.handle, v.reply_queue, v.reply_body,${traced ? sql` v.reply_traceparent,` : sql``}
              CASE WHEN v.reply_queue IS NULL THEN NULL ELSE nextval(v_sequence) END AS reply_seq
            FROM ${
    traced
      ? sql`unnest(p_seqs, p_handles, p_reply_queues, p_reply_bodies, p_reply_traceparents)
              AS v (seq, handle, reply_queue, reply_body, reply_traceparent)),`
      : sql`unnest(p_seqs, p_handles, p_reply_queues, p_reply_bodies) AS v (seq, handle, reply_queue, reply_body)),`
  }
          acked AS (
            DELETE FROM ${sql(messages)} m USING input
            WHERE m.seq = ANY(p_seqs) AND m.seq = input.seq AND m.receipt_handle = input.handle
              AND m.visible_at > p_now
            RETURNING m.seq),
          replies AS (
            INSERT INTO ${sql(messages)} (seq, queue, body, visible_at, enqueued_at${
    traced ? sql`, traceparent` : sql``
  })
            SELECT input.reply_seq, input.reply_queue, input.reply_body, p_now, p_now${
    traced ? sql`, input.reply_traceparent` : sql``
  }
            FROM input JOIN acked ON acked.seq = input.seq WHERE input.reply_queue IS NOT NULL)
          SELECT input.seq, input.reply_seq, input.reply_queue IS NOT NULL
          FROM input JOIN acked ON acked.seq = input.seq;
          -- A queue whose every acknowledgement was stale is woken for nothing: its receivers look and wait again.
          PERFORM pg_notify(p_channel, q.queue) FROM (SELECT DISTINCT unnest(p_reply_queues) AS queue) q
          WHERE q.queue IS NOT NULL;
        END $$`
}

/**
 * The PostgreSQL listener: NOTIFY payloads (queue names) wake their queue's receivers. The listen
 * connection dies silently with the server, so a receive that meets a connection error restarts it
 * (`Store.relisten`); receivers poll meanwhile. Runs until interrupted (the store's open life ends).
 */
const listening = (
  store: Store,
  listenTo: PgClient.PgClient["listen"],
  ready: { readonly token: string; readonly listening: Deferred.Deferred<void> }
): Effect.Effect<never> => {
  const once = Effect.suspend(() => {
    const restart = Deferred.unsafeMake<void>(FiberId.none)
    store.relisten = () => Deferred.unsafeDone(restart, Exit.void)
    return Effect.raceFirst(
      listenTo(store.channel).pipe(
        Stream.runForEach((queue) =>
          Effect.sync(() => queue === ready.token ? Deferred.unsafeDone(ready.listening, Exit.void) : store.wake(queue))
        )
      ),
      Deferred.await(restart)
    )
  })
  return once.pipe(
    Effect.catchAllCause((cause) => Effect.logDebug("LISTEN stopped; listening again", cause)),
    Effect.zipRight(Effect.sleep("1 second")),
    Effect.forever
  )
}

/**
 * A store's open life, the RcMap's lookup: runs in a scope of its own that closes when the last mailbox
 * holding it closes (or its owner's scope does) — then the listener and the row's refresh (forked in that
 * scope) stop, the row is deleted and the lane closes.
 */
const openLife = (stores: Stores, prefix: string): Effect.Effect<Store, SqlError, Scope.Scope> =>
  Effect.gen(function*() {
    const store = tablesOf(stores.sql, prefix)
    if (store.pgConfig !== undefined) {
      const config = store.pgConfig
      // The store's client is PostgreSQL's, so its driver is installed; loaded here to keep it out of the core.
      const PgClient = yield* Effect.promise(() => import("@effect/sql-pg/PgClient"))
      const context = yield* Layer.build(PgClient.layer({ ...config, maxConnections: 1, minConnections: 1 }))
      store.lane = Context.get(context, SqlClient.SqlClient)
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          store.lane = undefined
        })
      )
    }
    stores.live.set(prefix, store)
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        if (stores.live.get(prefix) === store) stores.live.delete(prefix)
      })
    )
    // The PostgreSQL client is the SqlClient itself (whatever tag it was provided under).
    const client = store.sql as SqlClient.SqlClient & Partial<Pick<PgClient.PgClient, "listen">>
    if (store.dialect === "pg" && client.listen !== undefined) {
      // The driver's LISTEN connection, interrupted while it connects, is never closed: the listener is stopped
      // only once it has heard its own NOTIFY (a token no queue can be named: it has a control character), or
      // after a bound when the server does not answer.
      const ready = { token: `\u0001ready:${store.instance}`, listening: Deferred.unsafeMake<void>(FiberId.none) }
      const { sql } = store
      const listenTo = client.listen
      // In one step: an interruption between the fork and the finalizer would stop the listener unheard.
      yield* Effect.uninterruptible(Effect.gen(function*() {
        yield* Effect.forkScoped(Effect.interruptible(listening(store, listenTo, ready)))
        // On the live clock: this waits for the network, and a test's clock standing still must not make it wait
        // for ever.
        const live = Effect.withClock(Clock.make())
        yield* Effect.forkScoped(Effect.interruptible(
          Effect.ignore(sql`SELECT pg_notify(${store.channel}, ${ready.token})`).pipe(
            Effect.repeat(Schedule.spaced("50 millis")),
            Effect.raceFirst(Deferred.await(ready.listening)),
            Effect.timeout("5 seconds"),
            Effect.ignore,
            live
          )
        ))
        // Runs before the two fibers are interrupted (finalizers run in reverse).
        yield* Effect.addFinalizer(() =>
          Effect.ignore(Effect.timeout(Effect.interruptible(Deferred.await(ready.listening)), "5 seconds")).pipe(live)
        )
      }))
    }
    // The process's row: deleted when the store closes, after its refresh (forked later, so stopped first).
    yield* Effect.addFinalizer(() => Workers.unregister(store))
    yield* Effect.forkScoped(Effect.interruptible(Workers.keepRegistered(store)))
    return store
  }).pipe(Effect.annotateLogs({ module: "MailboxSql", prefix }))

/** The store of `prefix` (decoded by the caller's options), its tables created or brought up to date. */
export const prepare = (prefix: string) =>
  Effect.gen(function*() {
    const store = tablesOf(yield* SqlClient.SqlClient, prefix)
    yield* migrate(store).pipe(
      Effect.mapError((cause) => new MailboxConnectionError({ mailbox: `${prefix}mailbox`, cause }))
    )
    return store
  })

/**
 * The store of `prefix` for a mailbox made with `create: false`: no migration runs, and tables behind the
 * version this release needs are a `SchemaVersionError` (see `version.ts`).
 */
export const requireMigrated = (prefix: string) =>
  Effect.gen(function*() {
    const store = tablesOf(yield* SqlClient.SqlClient, prefix)
    yield* requireVersion(store.sql, {
      service: "mailbox",
      prefix,
      table: migrationsTable(prefix),
      // The highest migration's number (the numbers need not be contiguous while a release is assembled).
      required: Math.max(...Object.keys(migrations(store)).map((name) => Number.parseInt(name, 10)))
    }).pipe(connectionError(`${prefix}mailbox`))
    return store
  })

/** The store of `prefix` for an operator's look: its tables must exist, and nothing is written. */
export const openExisting = (prefix: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const missing = yield* Sql.missingTables(sql, [`${prefix}mailbox_messages`, `${prefix}mailbox_dead_letters`])
      .pipe(Effect.mapError((cause) => new MailboxConnectionError({ mailbox: `${prefix}mailbox`, cause })))
    if (missing.length > 0) return yield* new TablesNotFoundError({ what: "mailbox tables", prefix, missing })
    return tablesOf(sql, prefix)
  })
