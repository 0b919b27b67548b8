/**
 * The store: what the mailboxes on one database and table prefix share — its
 * tables' names (their migrations are `schema.ts`), the wake-up
 * signals of its queues, PostgreSQL's LISTEN connection, the lane (a
 * connection of its own: see `Store.onLane`) and the process's row in the
 * workers table (`workers.ts`). The store has an owner: `Stores`, an `RcMap`
 * by prefix made in `MailboxSql.layer`'s scope (or a lone mailbox's), whose
 * lookup is the store's open life — the lane, the listener and the row's
 * refresh live in that entry's scope, as `@effect/sql`'s `SqlPersistedQueue`
 * starts its poller inside its map's lookup.
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
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
import { MailboxConnectionError, type ReplyTarget } from "../../../Mailbox.js"
import type { Registry, TrackedLoop } from "../../registry.js"
import * as Sql from "../../sql/common.js"
import * as PgPool from "../../sql/pgPool.js"
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
  /** The message's key and priority (migration 14; a scheduled claim returns them). */
  readonly key?: string | null | undefined
  readonly priority?: number | string | null | undefined
  /** Where a scheduled claim put the row in its batch (keys.ts); absent from a plain claim (queue order: seq). */
  readonly order?: number | undefined
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
  /** The loops made on the store's mailboxes (`internal/registry.ts`): what the process's row lists. */
  readonly loops = new Set<TrackedLoop>()
  /** Done once a loop is tracked in the store's open life: the row's refresh starts then (a sender has none). */
  readonly anyLoop: Deferred.Deferred<void> = Deferred.unsafeMake<void>(FiberId.none)
  /** The store's registry (`internal/registry.ts`), which its mailboxes register under. */
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
  /** Queues this process has found scheduled by key (keys.ts): their claims go through the scheduled claim. */
  readonly scheduled = new Set<string>()
  /** Queues whose claims publish each key's live leases (`keyMetrics` on `make`). */
  readonly keyMetrics = new Set<string>()
  /** When a claim of each queue last set its gauges (the database's ms), and the keys its per-key gauge shows. */
  readonly gaugesAt = new Map<string, number>()
  readonly gaugedKeys = new Map<string, Set<string>>()
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
      const drivers = yield* Effect.promise(PgPool.load)
      const context = yield* Layer.build(PgPool.layer(drivers, { ...config, maxConnections: 1, minConnections: 1 }))
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
