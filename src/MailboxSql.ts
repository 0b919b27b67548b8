/**
 * MailboxSql: the durable `Mailbox` backend over `@effect/sql`, on SQLite (one
 * machine, the embedded default) or PostgreSQL (many machines).
 *
 * Every queue of a database lives in one table, `<prefix>mailbox_messages`,
 * created by a migration on first use. A row is visible when its `visible_at`
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
 * A stored body that no longer decodes with the mailbox's Schema is moved to
 * `<prefix>mailbox_dead_letters` with the decode error; it never reaches the
 * worker. `deadLetters` lists, counts, redrives and purges that table.
 *
 * Replies: `replyAndAcknowledge` writes the reply and deletes the request in
 * one transaction when the reply queue is in the same database (a worker
 * killed in between leaves neither), so every request gets exactly one reply
 * even when it was executed twice. A reply queue is found through the
 * `MailboxResolver`; a queue the resolver does not know is still reached when
 * the mailbox was made with a `replySchema`.
 */
import { PgClient } from "@effect/sql-pg"
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import type * as ConfigError from "effect/ConfigError"
import * as Context from "effect/Context"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import * as Database from "./Database.js"
import type * as DeadLetter from "./DeadLetter.js"
import { TablesNotFoundError } from "./Errors.js"
import * as FrontEnd from "./internal/mailbox/frontEnd.js"
import { GroupSettle, type GroupSettler, settleOne } from "./internal/mailbox/settle.js"
import * as Validation from "./internal/mailbox/validation.js"
import { validateDuration, validateMake, validateVisibility } from "./internal/mailbox/validation.js"
import { counter } from "./internal/metrics.js"
import * as Sql from "./internal/sql/common.js"
import { GroupCommit } from "./internal/sql/groupCommit.js"
import {
  InvalidParameterError,
  type Mailbox,
  MailboxConnectionError,
  MailboxFullError,
  MailboxResolutionError,
  MailboxResolver,
  type Message,
  MessageFinalizedError,
  ReceiptHandleExpiredError,
  type ReplyError,
  ReplyNotAvailableError,
  type ReplyTarget,
  type SendError,
  SerializationError,
  type Settlement,
  type SettleOutcome
} from "./Mailbox.js"

/** Stored bodies that no longer decoded and were moved to the dead-letter table. */
export const undecodableDeadLettered = counter(
  "leasehold_mailbox_undecodable_total",
  "Stored message bodies that no longer decoded and were moved to the dead-letter table"
)

// ---------------------------------------------------------------------------
// Store: what every mailbox on one database and prefix shares in a process
// ---------------------------------------------------------------------------

interface Row {
  readonly seq: number | string
  readonly body: string
  readonly receipt_handle: string
  readonly delivery_count: number | string
  readonly enqueued_at: number | string
  readonly reply_to: string | null
}

/** A mailbox made by `make`, as the reply path sees it. */
interface Registered {
  readonly store: Store
  readonly queue: string
  readonly encode: (body: unknown) => Either.Either<string, string>
}

/** Mailboxes made in this process, by object, so the reply path can find a same-database target. */
const registered = new WeakMap<object, Registered>()

class Store {
  readonly messages: string
  readonly deadLetters: string
  readonly channel: string
  private readonly signals = new Map<string, Deferred.Deferred<void>>()
  /** Mailboxes open on this store, by queue name (the resolver's view). */
  readonly open = new Map<string, Set<ReplyTarget>>()
  users = 0
  listener: Fiber.RuntimeFiber<unknown, unknown> | undefined
  /** Restarts the LISTEN connection (PostgreSQL), after the server went away. */
  relisten: () => void = () => undefined
  /** The PostgreSQL client's settings, from which the lane's client is made; `undefined` on SQLite. */
  private readonly pgConfig: PgClient.PgClientConfig | undefined
  private lane: Lane | undefined

  constructor(readonly sql: SqlClient.SqlClient, readonly prefix: string, readonly dialect: "pg" | "sqlite") {
    this.messages = `${prefix}mailbox_messages`
    this.deadLetters = `${prefix}mailbox_dead_letters`
    this.channel = `${prefix}mailbox`
    this.pgConfig = dialect === "pg"
      ? (sql as SqlClient.SqlClient & Partial<Pick<PgClient.PgClient, "config">>).config
      : undefined
  }

  /**
   * Runs a claim, a grouped acknowledgement or a send (one statement each, never a transaction of the
   * caller's) on the store's lane (PostgreSQL): a client of its own with one connection, made at the first
   * such statement with the same settings as the store's client and closed when the last mailbox on the
   * store closes. The statements of every mailbox on the store queue for that connection, and each is
   * written the moment the one before returns (the pool hands the connection over in the driver's
   * callback), so the server works on one at a time with no gap between them. Through the shared pool
   * instead, a claim and an acknowledgement run at once in two server processes, which take the cores the
   * worker itself needs: on the benchmark's 2-core machine the lane gave 1.06-1.19x the throughput
   * (three same-process A/B runs, 10-12 alternating rounds each). A lane that cannot be made (the
   * database is down) fails the statement, and the next statement tries again; a statement that finds the
   * connection dead fails, and once the pool has dropped it the next statement gets a new one.
   */
  onLane<A>(statement: (sql: SqlClient.SqlClient) => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.suspend(() => {
      const config = this.pgConfig
      // No lane outside a mailbox's life (a late acknowledgement): nothing would close it.
      if (config === undefined || this.users === 0) return statement(this.sql)
      return Effect.acquireUseRelease(
        this.enterLane(config),
        (lane) =>
          Deferred.await(lane.client).pipe(
            Effect.tapError(() =>
              Effect.sync(() => {
                if (this.lane === lane) this.lane = undefined
              })
            ),
            Effect.flatMap(statement)
          ),
        (lane) =>
          Effect.sync(() => {
            if (--lane.running === 0 && lane.closing) Deferred.unsafeDone(lane.closed, Exit.void)
          })
      )
    })
  }

  /** The lane a statement joins (counted in `running`): the current one, or a new one whose client is being made. */
  private enterLane(config: PgClient.PgClientConfig): Effect.Effect<Lane> {
    return Effect.suspend(() => {
      const current = this.lane
      if (current !== undefined) {
        current.running++
        return Effect.succeed(current)
      }
      const lane: Lane = this.lane = {
        client: Deferred.unsafeMake(FiberId.none),
        closed: Deferred.unsafeMake(FiberId.none),
        running: 1,
        closing: false
      }
      return Effect.as(Effect.forkDaemon(holdLane(config, lane)), lane)
    })
  }

  /** Closes the lane once the last mailbox on the store has closed and the statements on it are done. */
  closeLane(): void {
    const lane = this.lane
    if (lane === undefined) return
    this.lane = undefined
    lane.closing = true
    if (lane.running === 0) Deferred.unsafeDone(lane.closed, Exit.void)
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

/** A store's lane (see `Store.onLane`). */
interface Lane {
  /** Its client, once made. */
  readonly client: Deferred.Deferred<SqlClient.SqlClient, SqlError>
  /** Done when the client is to close. */
  readonly closed: Deferred.Deferred<void>
  /** Statements submitted and not finished: a statement waiting for the connection when the pool ends would wait forever. */
  running: number
  /** The last mailbox on the store closed: the client closes once `running` reaches 0. */
  closing: boolean
}

/** Makes the lane's client (one connection, the store's client's settings) and keeps it until the lane closes. */
const holdLane = (config: PgClient.PgClientConfig, lane: Lane): Effect.Effect<void> =>
  Effect.scoped(
    Effect.flatMap(
      Layer.build(PgClient.layer({ ...config, maxConnections: 1, minConnections: 1 })),
      (context) =>
        Effect.zipRight(
          Deferred.succeed(lane.client, Context.get(context, SqlClient.SqlClient)),
          Deferred.await(lane.closed)
        )
    )
  ).pipe(Effect.catchAll((error) => Effect.asVoid(Deferred.fail(lane.client, error))))

const stores = new WeakMap<SqlClient.SqlClient, Map<string, Store>>()

const storeFor = (sql: SqlClient.SqlClient, prefix: string): Store => {
  let byPrefix = stores.get(sql)
  if (byPrefix === undefined) {
    byPrefix = new Map()
    stores.set(sql, byPrefix)
  }
  let store = byPrefix.get(prefix)
  if (store === undefined) {
    store = new Store(sql, prefix, Sql.dialectOf(sql))
    byPrefix.set(prefix, store)
  }
  return store
}

const connectionError = (mailbox: string) => Sql.mapSqlError((cause) => new MailboxConnectionError({ mailbox, cause }))

/** Creates the tables (idempotent; concurrent processes are fine). */
const migrate = (store: Store): Effect.Effect<void, SqlError | Migrator.MigrationError> => {
  const { deadLetters, messages, sql } = store
  return Sql.migrate(sql, `${store.prefix}mailbox_migrations`, {
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
        sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_claim`)}(
          p_queue text, p_now bigint, p_visible_at bigint, p_max integer)
        RETURNS SETOF ${sql(messages)} LANGUAGE plpgsql VOLATILE
        SET enable_bitmapscan = off SET enable_sort = off
        AS $$ BEGIN
          RETURN QUERY
          UPDATE ${sql(messages)} m SET visible_at = p_visible_at, receipt_handle = gen_random_uuid()::text,
            delivery_count = m.delivery_count + 1
          WHERE m.seq = ANY(ARRAY(
            SELECT c.seq FROM ${sql(messages)} c WHERE c.queue = p_queue AND c.visible_at <= p_now
            ORDER BY c.visible_at, c.seq LIMIT p_max FOR UPDATE SKIP LOCKED))
          RETURNING m.*;
        END $$`,
        createSettleFunction(store)
      ], { discard: true })
      : Effect.void,
    // The settle notifies once per reply queue, not once per reply (about a tenth of a settle of 80 rows on an
    // idle cluster: 2.1-2.9 ms without the per-row notify against 2.5-3.1 ms with it).
    "5_settle_notifies_once_per_queue": store.dialect === "pg" ? createSettleFunction(store) : Effect.void
  })
}

/**
 * The grouped acknowledgement (PostgreSQL): deletes each delivery whose handle is current and inserts
 * its reply in the same statement, then wakes each reply queue once.
 */
const createSettleFunction = (store: Store) => {
  const { messages, sql } = store
  return sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_settle`)}(
          p_seqs bigint[], p_handles text[], p_reply_queues text[], p_reply_bodies text[], p_now bigint,
          p_channel text)
        RETURNS TABLE (settled_seq bigint, settled_reply_seq bigint, notified boolean) LANGUAGE plpgsql VOLATILE
        SET enable_seqscan = off
        AS $$
        DECLARE
          v_sequence regclass := pg_get_serial_sequence(${sql.literal(`'${messages}'`)}, 'seq')::regclass;
        BEGIN
          RETURN QUERY
          WITH input AS MATERIALIZED (
            SELECT v.seq, v.handle, v.reply_queue, v.reply_body,
              CASE WHEN v.reply_queue IS NULL THEN NULL ELSE nextval(v_sequence) END AS reply_seq
            FROM unnest(p_seqs, p_handles, p_reply_queues, p_reply_bodies) AS v (seq, handle, reply_queue, reply_body)),
          acked AS (
            DELETE FROM ${sql(messages)} m USING input
            WHERE m.seq = ANY(p_seqs) AND m.seq = input.seq AND m.receipt_handle = input.handle
              AND m.visible_at > p_now
            RETURNING m.seq),
          replies AS (
            INSERT INTO ${sql(messages)} (seq, queue, body, visible_at, enqueued_at)
            SELECT input.reply_seq, input.reply_queue, input.reply_body, p_now, p_now
            FROM input JOIN acked ON acked.seq = input.seq WHERE input.reply_queue IS NOT NULL)
          SELECT input.seq, input.reply_seq, input.reply_queue IS NOT NULL
          FROM input JOIN acked ON acked.seq = input.seq;
          -- A queue whose every acknowledgement was stale is woken for nothing: its receivers look and wait again.
          PERFORM pg_notify(p_channel, q.queue) FROM (SELECT DISTINCT unnest(p_reply_queues) AS queue) q
          WHERE q.queue IS NOT NULL;
        END $$`
}

/**
 * Runs the PostgreSQL listener while mailboxes are open on the store: NOTIFY
 * payloads (queue names) wake their queue's receivers. The listen connection
 * dies silently with the server, so a receive that meets a connection error
 * restarts it (`Store.relisten`); receivers poll meanwhile.
 */
const listen = (store: Store): Effect.Effect<void> =>
  Effect.suspend(() => {
    // The PostgreSQL client is the SqlClient itself (whatever tag it was provided under).
    const client = store.sql as SqlClient.SqlClient & Partial<Pick<PgClient.PgClient, "listen">>
    if (store.dialect !== "pg" || store.listener !== undefined || client.listen === undefined) return Effect.void
    const listenTo = client.listen
    return Effect.suspend(() => {
      const once = Effect.suspend(() => {
        const restart = Deferred.unsafeMake<void>(FiberId.none)
        store.relisten = () => Deferred.unsafeDone(restart, Exit.void)
        return Effect.raceFirst(
          listenTo(store.channel).pipe(Stream.runForEach((queue) => Effect.sync(() => store.wake(queue)))),
          Deferred.await(restart)
        )
      })
      const listening = once.pipe(
        Effect.catchAllCause((cause) => Effect.logDebug("LISTEN stopped; listening again", cause)),
        Effect.zipRight(Effect.sleep("1 second")),
        Effect.forever
      )
      return Effect.map(Effect.forkDaemon(listening), (fiber) => {
        store.listener = fiber
      })
    }).pipe(Effect.provideService(SqlClient.SqlClient, store.sql))
  })

// ---------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------

/**
 * When a statement runs. `undefined`: the database's own clock, read by the statement as it runs — so every
 * process judges visibility by one clock (PostgreSQL serving several machines, whose clocks drift), and on
 * SQLite the time is taken once the statement has the file, not before it waited for the lock. A number:
 * the time a test's `TestClock` gives, so tests drive expiry on every backend alike (see `nowOf`).
 */
type Now = number | undefined

/**
 * The `Now` a mailbox's statements run with: the database's clock, unless the mailbox runs under
 * `TestClock` — then the test's time, so `TestClock.adjust` moves visibility on SQLite and PostgreSQL as it
 * does in memory. A clock that is merely wrong (a machine running ahead) is still the database's business.
 */
const nowOf = (clock: Clock.Clock): () => Now => Sql.testTime(clock) ?? (() => undefined)

interface Statements {
  /** Claims up to `max` visible messages of a queue, invisible for `visibilityMillis` from now. */
  readonly claim: (
    queue: string,
    now: Now,
    visibilityMillis: number,
    max: number
  ) => Effect.Effect<ReadonlyArray<Row>, SqlError>
  /** Inserts messages into one queue: each one's id, in order, or `undefined` for those that found it full. */
  readonly insert: (
    queue: string,
    items: ReadonlyArray<SendItem>,
    now: Now,
    maxSize: number | undefined
  ) => Effect.Effect<ReadonlyArray<string | undefined>, SqlError>
  /** Acknowledges deliveries, inserting each one's reply (if any) in the same transaction. */
  readonly settle: (
    items: ReadonlyArray<SettleItem>,
    now: Now
  ) => Effect.Effect<ReadonlyMap<string, string | undefined>, SqlError>
  /** Makes a delivery visible `timeoutMillis` from now (keeping or clearing its handle); false when it is stale. */
  readonly setVisibility: (
    seq: string,
    handle: string,
    now: Now,
    timeoutMillis: number,
    keepHandle: boolean,
    queue: string
  ) => Effect.Effect<boolean, SqlError>
  readonly release: (seq: string, handle: string, now: Now) => Effect.Effect<void, SqlError>
  readonly isCurrent: (seq: string, handle: string, now: Now) => Effect.Effect<boolean, SqlError>
  readonly deadLetter: (
    seq: string,
    handle: string,
    now: Now,
    errorTag: string,
    error: string
  ) => Effect.Effect<void, SqlError>
  /** Milliseconds until the queue's next invisible message becomes visible; `undefined` when there is none. */
  readonly nextVisibleIn: (queue: string, now: Now) => Effect.Effect<number | undefined, SqlError>
  readonly count: (queue: string) => Effect.Effect<number, SqlError>
  readonly purge: (queue: string) => Effect.Effect<number, SqlError>
  /** `now` as a SQL expression, for the operator's queries. */
  readonly at: (now: Now) => Statement.Fragment
}

/** A message to insert: its encoded body, how long it stays invisible, where its replies go. */
interface SendItem {
  readonly body: string
  readonly delayMillis: number
  readonly replyTo: string | null
}

/** A delivery to acknowledge, with the reply to insert in the same transaction. */
interface SettleItem {
  readonly seq: string
  readonly handle: string
  readonly reply: { readonly queue: string; readonly body: string } | undefined
}

/**
 * Group claims: receivers of one mailbox that ask while a claim is running
 * are served together by the next statement, rows handed out in queue
 * order, each receiver taking at most its `max` (the claim-side twin of the
 * settle batcher: eight loops claiming ten each cost one statement, not
 * eight). A receiver interrupted while it waits takes nothing, and rows
 * that nobody takes are released at once.
 */
class ClaimBatcher {
  private waiting: Array<ClaimRequest> = []
  private claiming = false

  constructor(
    private readonly claim: (
      now: Now,
      visibilityMillis: number,
      max: number
    ) => Effect.Effect<ReadonlyArray<Row>, SqlError>,
    private readonly release: (rows: ReadonlyArray<Row>, now: Now) => Effect.Effect<void>,
    private readonly now: () => Now
  ) {}

  /** Claims up to `max` rows; only the wait is interruptible (through `restore`). */
  submit(
    max: number,
    visibilityMillis: number,
    restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  ): Effect.Effect<Claimed, SqlError> {
    return Effect.suspend(() => {
      const request: ClaimRequest = { max, visibilityMillis, outcome: undefined, resume: undefined, cancelled: false }
      this.waiting.push(request)
      const start = this.claiming ? Effect.void : Effect.asVoid(Effect.forkDaemon(this.drain()))
      this.claiming = true
      // A callback, not a Deferred: one per receive, and a Deferred costs more than the rest of the wait.
      const wait = Effect.async<Claimed, SqlError>((resume) => {
        if (request.outcome !== undefined) return resume(request.outcome)
        request.resume = resume
      })
      return Effect.zipRight(start, restore(wait)).pipe(
        Effect.onInterrupt(() =>
          Effect.suspend(() => {
            // Not served yet: the claim skips this receiver. Served already: give its rows back.
            request.cancelled = true
            const outcome = request.outcome
            return outcome !== undefined && Exit.isSuccess(outcome)
              ? this.release(outcome.value.rows, outcome.value.now)
              : Effect.void
          })
        )
      )
    })
  }

  private drain(): Effect.Effect<void> {
    return Effect.gen(this, function*() {
      yield* Effect.yieldNow() // let receivers that are ready in this tick join the claim
      while (this.waiting.length > 0) {
        const visibilityMillis = this.waiting[0]!.visibilityMillis
        const batch = this.waiting.filter((request) => request.visibilityMillis === visibilityMillis)
        this.waiting = this.waiting.filter((request) => request.visibilityMillis !== visibilityMillis)
        const open = batch.filter((request) => !request.cancelled)
        if (open.length === 0) continue
        const now = this.now()
        const total = open.reduce((sum, request) => sum + request.max, 0)
        const claimed = yield* Effect.exit(this.claim(now, visibilityMillis, total))
        if (Exit.isFailure(claimed)) {
          for (const request of open) this.serve(request, Exit.failCause(claimed.cause))
          continue
        }
        const rows = claimed.value.length > 1
          ? [...claimed.value].sort((a, b) => Number(a.seq) - Number(b.seq))
          : claimed.value
        let next = 0
        for (const request of open) {
          if (request.cancelled) continue
          const mine = rows.slice(next, next + request.max)
          next += mine.length
          this.serve(request, Exit.succeed({ rows: mine, now }))
        }
        if (next < rows.length) yield* this.release(rows.slice(next), now)
      }
      this.claiming = false
    })
  }

  private serve(request: ClaimRequest, outcome: Exit.Exit<Claimed, SqlError>): void {
    request.outcome = outcome
    request.resume?.(outcome)
  }
}

interface Claimed {
  readonly rows: ReadonlyArray<Row>
  readonly now: Now
}

interface ClaimRequest {
  readonly max: number
  readonly visibilityMillis: number
  /** What the claim gave this receiver, once it ran. */
  outcome: Exit.Exit<Claimed, SqlError> | undefined
  /** Wakes the waiting receiver (set when it starts waiting). */
  resume: ((outcome: Exit.Exit<Claimed, SqlError>) => void) | undefined
  cancelled: boolean
}

/**
 * Single flight: callers that ask while the query is running share its
 * answer. A queue's idle receivers all ask when its next message becomes
 * visible; one query answers them, where each asking would take as many
 * connections and scans. The query runs in a fiber of its own, so a caller
 * interrupted while it waits does not cut the query short for the others.
 */
class SingleFlight<A, E> {
  private running: Deferred.Deferred<A, E> | undefined

  constructor(private readonly query: () => Effect.Effect<A, E>) {}

  get run(): Effect.Effect<A, E> {
    return Effect.suspend(() => {
      if (this.running !== undefined) return Deferred.await(this.running)
      const running = Deferred.unsafeMake<A, E>(FiberId.none)
      this.running = running
      const query = Effect.flatMap(Effect.exit(Effect.suspend(this.query)), (exit) => {
        this.running = undefined
        return Deferred.done(running, exit)
      })
      return Effect.zipRight(Effect.forkDaemon(query), Deferred.await(running))
    })
  }
}

/** A settle's result: the reply id (or `undefined` without one), `false` for a stale handle, or the store's error. */
type SettleExit = Exit.Exit<string | undefined | false, SqlError>

/** Acknowledgements with their replies, committed together. */
type SettleBatcher = GroupCommit<SettleItem, string | undefined | false, SqlError>

/**
 * At most this many items, and about this many bytes of bodies, in one grouped statement: PostgreSQL takes
 * a batch as one JSON parameter, which must stay far below what one string can hold.
 */
const batchLimits = { maxItems: 200, maxBytes: 16 * 1024 * 1024 } as const

const settleBatcher = (statements: Statements, now: () => Now): SettleBatcher =>
  new GroupCommit((items) => settleRounds(statements, now, items), {
    ...batchLimits,
    sizeOf: (item) => 64 + (item.reply?.body.length ?? 0)
  })

/**
 * Settles a batch, each message at most once per statement: a message twice in a batch (a delivery that
 * timed out and its redelivery, settled together, or the same delivery twice) goes to a second statement,
 * so each outcome is its own delivery's — the statements match rows by message, and only the current
 * handle settles.
 */
const settleRounds = (
  statements: Statements,
  now: () => Now,
  items: ReadonlyArray<SettleItem>
): Effect.Effect<Array<string | undefined | false>, SqlError> => {
  const seen = new Set<string>()
  const first: Array<number> = []
  const again: Array<number> = []
  items.forEach((item, index) => {
    if (seen.has(item.seq)) return again.push(index)
    seen.add(item.seq)
    first.push(index)
  })
  const round = first.length === items.length ? items : first.map((index) => items[index]!)
  return Effect.flatMap(statements.settle(round, now()), (rows) => {
    const results = new Array<string | undefined | false>(items.length)
    for (const index of first) {
      const { seq } = items[index]!
      results[index] = rows.has(seq) ? rows.get(seq) : false
    }
    if (again.length === 0) return Effect.succeed(results)
    return Effect.map(settleRounds(statements, now, again.map((index) => items[index]!)), (later) => {
      again.forEach((index, k) => {
        results[index] = later[k]!
      })
      return results
    })
  })
}

/** The statement set of the store's dialect. */
const statements = (store: Store): Statements => {
  const { sql } = store
  const messages = sql(store.messages)
  const deadLetters = sql(store.deadLetters)
  const pg = store.dialect === "pg"
  const claimFunction = sql(`${store.prefix}mailbox_claim`)
  const settleFunction = sql(`${store.prefix}mailbox_settle`)
  const one = (rows: ReadonlyArray<unknown>) => rows.length > 0
  const notify = (queue: string) => pg ? sql`, pg_notify(${store.channel}, ${queue})` : sql``
  const databaseNow = Sql.databaseNow(sql)
  // A given time is typed, so PostgreSQL can add to it (`$1 + $2` alone has no type).
  const at = (now: Now): Statement.Fragment => now === undefined ? databaseNow : pg ? sql`${now}::bigint` : sql`${now}`
  return {
    at,
    claim: (queue, now, visibilityMillis, max) =>
      pg
        ? store.onLane((lane) =>
          lane<Row>`SELECT seq, body, receipt_handle, delivery_count, enqueued_at, reply_to
          FROM ${claimFunction}(${queue}::text, ${at(now)}::bigint, (${at(now)} + ${visibilityMillis})::bigint,
            ${max}::integer)`
        )
        // A write transaction (the file's lock first), so the time is read once the claim has the file.
        : Sql.writeTransaction(sql)(
          sql<Row>`UPDATE ${messages} SET visible_at = ${at(now)} + ${visibilityMillis},
              receipt_handle = lower(hex(randomblob(16))), delivery_count = delivery_count + 1
            WHERE seq IN (SELECT seq FROM ${messages} WHERE queue = ${queue} AND visible_at <= ${at(now)}
              ORDER BY visible_at, seq LIMIT ${max})
            RETURNING seq, body, receipt_handle, delivery_count, enqueued_at, reply_to`
        ),
    insert: (queue, items, now, maxSize) => {
      if (pg) {
        // The first `maxSize - count` items go in; ids are drawn up front so each item learns its own.
        const room = maxSize === undefined
          ? sql``
          : sql`WHERE v.n <= ${maxSize} - (SELECT count(*) FROM ${messages} WHERE queue = ${queue})`
        const wake = items.some((item) => item.delayMillis === 0)
        return Effect.map(
          store.onLane((lane) =>
            lane<{ seq: string }>`WITH input AS MATERIALIZED (
            SELECT nextval((SELECT pg_get_serial_sequence(${
              sql.literal(`'${store.messages}'`)
            }, 'seq')::regclass)) AS seq,
              v.body, v.delay, v.reply_to, v.n
            FROM ROWS FROM (json_to_recordset(${JSON.stringify(items)}::json)
              AS (body text, "delayMillis" bigint, "replyTo" text)) WITH ORDINALITY AS v(body, delay, reply_to, n)
            ${room}),
          ins AS (
            INSERT INTO ${messages} (seq, queue, body, visible_at, enqueued_at, reply_to)
            SELECT seq, ${queue}::text, body, ${at(now)} + delay, ${at(now)}, reply_to FROM input)
          SELECT seq${wake ? notify(queue) : sql``} FROM input ORDER BY n`
          ),
          (rows) => items.map((_, index) => rows[index]?.seq)
        )
      }
      // One statement for the batch, like PostgreSQL's; the items go in in order, so their ids ascend in it.
      const room = maxSize === undefined
        ? sql``
        : sql`WHERE key < ${maxSize} - (SELECT count(*) FROM ${messages} WHERE queue = ${queue})`
      return Effect.map(
        sql<{ seq: number }>`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, reply_to)
          SELECT ${queue}, json_extract(value, '$[0]'), ${at(now)} + json_extract(value, '$[1]'), ${at(now)},
            json_extract(value, '$[2]')
          FROM json_each(${JSON.stringify(items.map((item) => [item.body, item.delayMillis, item.replyTo]))}) ${room}
          ORDER BY key
          RETURNING seq`,
        (rows) => {
          const ids = rows.map((row) => row.seq).sort((a, b) => a - b)
          return items.map((_, index) => index < ids.length ? String(ids[index]) : undefined)
        }
      )
    },
    settle: (items, now) =>
      pg
        ? Effect.map(
          store.onLane((lane) =>
            // The reply bodies travel as one JSON array of the bodies themselves (each is JSON already), and
            // each element's text is its body as it was: escaping every quote of every body, in the driver's
            // array literal or as JSON strings, cost more than the rest of the statement's parameters. An
            // item without a reply has `null` there, never read (its reply queue is NULL).
            lane<{ settled_seq: string; settled_reply_seq: string | null }>`SELECT settled_seq, settled_reply_seq
            FROM ${settleFunction}(${items.map((item) => item.seq)}::bigint[], ${
              items.map((item) => item.handle)
            }::text[], ${items.map((item) => item.reply?.queue ?? null)}::text[],
            ARRAY(SELECT body::text FROM json_array_elements(${`[${
              items.map((item) => item.reply?.body ?? "null").join(",")
            }]`}::json) WITH ORDINALITY AS bodies(body, n) ORDER BY n), ${at(now)}::bigint, ${store.channel}::text)`
          ),
          (rows) =>
            new Map(rows.map((row) => [
              String(row.settled_seq),
              row.settled_reply_seq === null ? undefined : String(row.settled_reply_seq)
            ]))
        )
        : Sql.writeTransaction(sql)(Effect.gen(function*() {
          // One transaction and two statements for the batch (a statement costs more than a row): the deletes,
          // whose first write takes the write lock at once, then the replies of the deliveries that were current.
          const acked = yield* sql<{ seq: number; receipt_handle: string }>`DELETE FROM ${messages}
            WHERE visible_at > ${at(now)} AND (seq, receipt_handle) IN (
              SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(${
            JSON.stringify(items.map((item) => [Number(item.seq), item.handle]))
          }))
            RETURNING seq, receipt_handle`
          const current = new Set(acked.map((row) => `${row.seq} ${row.receipt_handle}`))
          const settled = new Map<string, string | undefined>()
          const replying: Array<{ readonly seq: string; readonly queue: string; readonly body: string }> = []
          for (const item of items) {
            // Only the deliveries whose handle was current (a message is once per statement: `settleRounds`).
            if (!current.has(`${item.seq} ${item.handle}`)) continue
            if (item.reply === undefined) settled.set(item.seq, undefined)
            else replying.push({ seq: item.seq, ...item.reply })
          }
          if (replying.length === 0) return settled
          // Inserted in the array's order, so the new ids ascend in that order (RETURNING's order is unspecified).
          const replies = yield* sql<{ seq: number }>`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at)
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), ${at(now)}, ${at(now)}
            FROM json_each(${JSON.stringify(replying.map((reply) => [reply.queue, reply.body]))}) ORDER BY key
            RETURNING seq`
          const ids = replies.map((row) => row.seq).sort((a, b) => a - b)
          replying.forEach((reply, index) => settled.set(reply.seq, String(ids[index])))
          return settled
        })),
    // Extensions and nacks run on the lane too (PostgreSQL): an application that holds every pooled
    // connection must not keep a working message from proving it is alive, or a given-up one from coming back.
    setVisibility: (seq, handle, now, timeoutMillis, keepHandle, queue) => {
      const guard = sql`WHERE seq = ${Number(seq)} AND receipt_handle = ${handle} AND visible_at > ${at(now)}`
      const handleColumn = keepHandle ? sql`` : sql`, receipt_handle = NULL`
      const visibleAt = sql`${at(now)} + ${timeoutMillis}`
      return pg
        ? store.onLane((lane) =>
          Effect.map(
            timeoutMillis === 0
              ? lane`WITH upd AS (UPDATE ${messages} SET visible_at = ${visibleAt}${handleColumn} ${guard}
                  RETURNING seq) SELECT seq${notify(queue)} FROM upd`
              : lane`UPDATE ${messages} SET visible_at = ${visibleAt}${handleColumn} ${guard} RETURNING seq`,
            one
          )
        )
        : Effect.map(sql`UPDATE ${messages} SET visible_at = ${visibleAt}${handleColumn} ${guard} RETURNING seq`, one)
    },
    release: (seq, handle, now) =>
      sql`UPDATE ${messages} SET visible_at = ${at(now)}, receipt_handle = NULL, delivery_count = delivery_count - 1
        WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}`.pipe(Effect.asVoid),
    isCurrent: (seq, handle, now) =>
      Effect.map(
        sql`SELECT seq FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}
          AND visible_at > ${at(now)}`,
        one
      ),
    deadLetter: (seq, handle, now, errorTag, error) =>
      Sql.writeTransaction(sql)(Effect.zipRight(
        sql`INSERT INTO ${deadLetters}
            (id, queue, body, reply_to, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
          SELECT CAST(seq AS TEXT), queue, body, reply_to, delivery_count, enqueued_at, ${
          at(now)
        }, ${errorTag}, ${error}
          FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}
          ON CONFLICT (id) DO NOTHING`,
        sql`DELETE FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}`
      )),
    nextVisibleIn: (queue, now) =>
      Effect.map(
        // Every row of the queue, visible ones too: a row that became visible since the claim looked (its
        // visibility ran out in between) gives a time <= 0, so the receiver looks again at once instead of
        // sleeping a whole poll interval beside a visible message.
        sql<{ next: number | string | null }>`SELECT min(visible_at) - ${at(now)} AS next FROM ${messages}
          WHERE queue = ${queue}`,
        (rows) => rows[0]?.next === null || rows[0]?.next === undefined ? undefined : Number(rows[0].next)
      ),
    count: (queue) =>
      Effect.map(
        sql<{ n: number | string }>`SELECT count(*) AS n FROM ${messages} WHERE queue = ${queue}`,
        (rows) => Number(rows[0]?.n ?? 0)
      ),
    purge: (queue) =>
      Effect.map(sql`DELETE FROM ${messages} WHERE queue = ${queue} RETURNING seq`, (rows) => rows.length)
  }
}

/** Encodes a body for a queue (a mailbox's schema, or its `replySchema`). */
type Encoder = (body: unknown) => Either.Either<string, string>

// Bodies are JSON: the schema runs on the parsed value and `JSON` itself runs around it, rather than
// through `Schema.parseJson`, whose extra transformation costs as much as the schema of a small body.

const encoderOf = <A, I>(schema: Schema.Schema<A, I, never>, maxBytes: number): Encoder => {
  const encode = Schema.encodeEither(schema)
  return (body) => {
    const encoded = encode(body as A)
    if (Either.isLeft(encoded)) return Either.left(ParseResult.TreeFormatter.formatErrorSync(encoded.left))
    let text: string | undefined
    try {
      text = JSON.stringify(encoded.right)
    } catch (error) {
      return Either.left(`Not JSON: ${String(error)}`)
    }
    // `undefined` (a `Schema.Void` body, say) has no JSON text.
    if (text === undefined) return Either.left(`Not JSON: ${String(encoded.right)}`)
    // JSON writes NaN and ±Infinity as null: the stored body would not be what was sent. A `null` in the
    // text is rare enough that looking for the number behind it costs nothing on the usual path.
    const inexact = text.includes("null") ? nonFinite(encoded.right, "") : undefined
    if (inexact !== undefined) return Either.left(inexact)
    // A UTF-8 byte is at least a third of a UTF-16 unit: only a long text needs counting.
    if (text.length * 3 > maxBytes) {
      const bytes = Buffer.byteLength(text, "utf8")
      if (bytes > maxBytes) {
        return Either.left(`the encoded body is ${bytes} bytes, more than this queue's maxBodyBytes (${maxBytes})`)
      }
    }
    return Either.right(text)
  }
}

/** Where `value` holds a number JSON cannot write exactly (NaN, ±Infinity), described; else undefined. */
const nonFinite = (value: unknown, path: string): string | undefined => {
  if (typeof value === "number") {
    return Number.isFinite(value) ? undefined : `${value} at ${path === "" ? "the body" : path} has no JSON form`
  }
  if (typeof value !== "object" || value === null) return undefined
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = nonFinite(value[i], `${path}[${i}]`)
      if (found !== undefined) return found
    }
    return undefined
  }
  // What JSON.stringify writes: an object with toJSON is written as what it returns (a Date as a string).
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") return undefined
  for (const key of Object.keys(value)) {
    const found = nonFinite((value as Record<string, unknown>)[key], `${path}.${key}`)
    if (found !== undefined) return found
  }
  return undefined
}

/** Decodes a stored body; the error is the reason a row that fails is dead-lettered with. */
const decoderOf = <A, I>(schema: Schema.Schema<A, I, never>): (text: string) => Either.Either<A, string> => {
  const decode = Schema.decodeUnknownEither(schema)
  return (text) => {
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch (error) {
      return Either.left(`Not JSON: ${String(error)}`)
    }
    return Either.mapLeft(decode(json), (error) => ParseResult.TreeFormatter.formatErrorSync(error))
  }
}

/** What the messages of one mailbox share. */
interface MailboxContext {
  readonly name: string
  readonly store: Store
  readonly statements: Statements
  readonly settler: SettleBatcher
  readonly settleGroup: GroupSettler
  /** Reply destinations already resolved, by resolver and name. */
  readonly routes: WeakMap<object, Map<string, Destination>>
  /** When the mailbox's statements run (see `Now`). */
  readonly now: () => Now
  readonly replyEncoder: Encoder | undefined
}

/** A resolved reply target: a queue of this database with its encoder, or another store's mailbox. */
type Destination = { readonly queue: string; readonly encode: Encoder } | { readonly target: ReplyTarget }

/** Where a reply goes: a queue of this database (body encoded here), or another store's mailbox. */
type ReplyRoute =
  | { readonly _tag: "Local"; readonly queue: string; readonly body: string }
  | { readonly _tag: "Remote"; readonly target: ReplyTarget }

/** How a group settle handles one delivery (see `SqlMessage.prepare`). */
type Prepared =
  | { readonly _tag: "Item"; readonly item: SettleItem }
  | { readonly _tag: "Done"; readonly outcome: SettleOutcome }

/**
 * The `GroupSettler` of a mailbox's messages: every delivery's acknowledgement and local reply go to the
 * group commit together, with one wait for all of them.
 */
const groupSettler = (settler: SettleBatcher): GroupSettler => <A, R>(settlements: ReadonlyArray<Settlement<A, R>>) =>
  Effect.flatMap(MailboxResolver, (resolver) => {
    const outcomes = new Array<SettleOutcome>(settlements.length)
    const items: Array<SettleItem> = []
    const itemIndexes: Array<number> = []
    const alone: Array<number> = []
    settlements.forEach(({ message, reply }, index) => {
      const step = (message as SqlMessage<A, R>).prepare(resolver, reply)
      if (step === undefined) alone.push(index)
      else if (step._tag === "Item") {
        items.push(step.item)
        itemIndexes.push(index)
      } else outcomes[index] = step.outcome
    })
    const grouped = Effect.map(settler.submitAll(items), (results) =>
      results.forEach((result, k) => {
        const index = itemIndexes[k]!
        outcomes[index] = (settlements[index]!.message as SqlMessage<A, R>).settled(result, items[k]!.reply)
      }))
    const single = Effect.forEach(alone, (index) =>
      Effect.map(settleOne(settlements[index]!), (outcome) => {
        outcomes[index] = outcome
      }), { concurrency: "unbounded", discard: true })
    return Effect.as(alone.length === 0 ? grouped : Effect.zip(grouped, single, { concurrent: true }), outcomes)
  })

class SqlMessage<A, R> implements Message<A, R> {
  private finalized = false
  constructor(
    private readonly mailbox: MailboxContext,
    readonly id: string,
    readonly body: A,
    readonly receiptHandle: string,
    readonly deliveryCount: number,
    readonly enqueuedAt: DateTime.Utc,
    readonly replyTo: Option.Option<string>
  ) {}

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

  get [GroupSettle](): GroupSettler {
    return this.mailbox.settleGroup
  }

  /**
   * What a group settle does for this delivery: an item for the group commit (its local reply encoded),
   * or an outcome already known (the reply could not be routed or encoded); `undefined` when
   * `replyAndAcknowledge` must settle it on its own: a reply to another store, or to a queue this
   * resolver has not been asked about yet (the first reply resolves it, later ones find it cached).
   */
  prepare(resolver: MailboxResolver["Type"], reply: Option.Option<R>): Prepared | undefined {
    // (No named closures in here: this runs once per message, and `tsx` names every one it creates.)
    if (Option.isNone(reply) || Option.isNone(this.replyTo)) {
      return { _tag: "Item", item: { seq: this.id, handle: this.receiptHandle, reply: undefined } }
    }
    const routed = this.routeNow(resolver, reply.value)
    if (routed === undefined) return undefined
    if (Either.isLeft(routed)) return { _tag: "Done", outcome: Either.left(routed.left) }
    const route = routed.right
    if (route._tag === "Remote") return undefined
    return {
      _tag: "Item",
      item: { seq: this.id, handle: this.receiptHandle, reply: { queue: route.queue, body: route.body } }
    }
  }

  /** The outcome of this delivery's item in a group commit (the twin of `settle`'s continuation). */
  settled(result: SettleExit, reply: SettleItem["reply"]): SettleOutcome {
    if (Exit.isFailure(result)) {
      const cause = Cause.squash(result.cause)
      return Either.left(new MailboxConnectionError({ mailbox: this.mailbox.name, cause }))
    }
    if (result.value === false) return Either.left(this.expired())
    this.finalized = true
    if (reply !== undefined) this.mailbox.store.wake(reply.queue)
    return Either.right(result.value)
  }

  /** Acknowledges through the mailbox's group commit, with the reply to insert in the same transaction. */
  private settle(
    reply: SettleItem["reply"]
  ): Effect.Effect<string | undefined, ReceiptHandleExpiredError | MailboxConnectionError> {
    return this.mailbox.settler.submit({ seq: this.id, handle: this.receiptHandle, reply }).pipe(
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
      onRight: (timeout) => this.setVisibility(timeout, false)
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
          const local = registered.get(target)
          return local !== undefined && local.store === this.mailbox.store
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
      return Effect.suspend(() => {
        return statements.insert(
          route.queue,
          [{ body: route.body, delayMillis: 0, replyTo: null }],
          this.mailbox.now(),
          undefined
        )
      }).pipe(
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
      return Effect.map(this.settle({ queue: route.queue, body: route.body }), (replyId) => replyId!)
    })
  }
}

// ---------------------------------------------------------------------------
// make
// ---------------------------------------------------------------------------

/** Options of `make`. */
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
}

/** `maxBodyBytes` unless given: a request or a reply, not a file (store those elsewhere and send a reference). */
export const defaultMaxBodyBytes = 4 * 1024 * 1024
const maxBodyBytesLimit = 256 * 1024 * 1024

/** The longest queue name (every backend's rule). */
export const maxQueueNameLength = Validation.maxQueueNameLength

const invalid = (parameter: string, value: unknown, reason: string) =>
  Effect.fail(new InvalidParameterError({ parameter, value, reason }))

/** The store of `prefix` (checked against the prefix rule), its tables created or brought up to date. */
const prepare = (prefix: string | undefined) =>
  Effect.gen(function*() {
    const resolved = prefix ?? "leasehold_"
    const problem = Sql.prefixProblem(resolved)
    if (problem !== undefined) return yield* invalid("prefix", resolved, problem)
    const store = storeFor(yield* SqlClient.SqlClient, resolved)
    yield* migrate(store).pipe(
      Effect.mapError((cause) => new MailboxConnectionError({ mailbox: `${resolved}mailbox`, cause }))
    )
    return store
  })

/** The store of `prefix` for an operator's look: its tables must exist, and nothing is written. */
const openExisting = (prefix: string | undefined) =>
  Effect.gen(function*() {
    const resolved = prefix ?? "leasehold_"
    const problem = Sql.prefixProblem(resolved)
    if (problem !== undefined) return yield* invalid("prefix", resolved, problem)
    const sql = yield* SqlClient.SqlClient
    const missing = yield* Sql.missingTables(sql, [`${resolved}mailbox_messages`, `${resolved}mailbox_dead_letters`])
      .pipe(Effect.mapError((cause) => new MailboxConnectionError({ mailbox: `${resolved}mailbox`, cause })))
    if (missing.length > 0) return yield* new TablesNotFoundError({ what: "mailbox tables", prefix: resolved, missing })
    return storeFor(sql, resolved)
  })

/**
 * Makes a mailbox on the `SqlClient` in the context, creating the tables on
 * first use; closed when the scope closes (its messages stay in the
 * database).
 */
export const make = <A, I, R = never, IR = never>(
  options: Options<A, I, R, IR>
): Effect.Effect<Mailbox<A, R>, InvalidParameterError | MailboxConnectionError, SqlClient.SqlClient | Scope.Scope> =>
  Effect.gen(function*() {
    const { maxSize, name } = options
    yield* validateMake(options)
    const pollInterval = options.pollInterval === undefined
      ? undefined
      : yield* validateDuration("pollInterval", options.pollInterval, Duration.zero, Duration.minutes(1))
    const maxBodyBytes = options.maxBodyBytes ?? defaultMaxBodyBytes
    if (!(Number.isSafeInteger(maxBodyBytes) && maxBodyBytes > 0 && maxBodyBytes <= maxBodyBytesLimit)) {
      return yield* invalid("maxBodyBytes", maxBodyBytes, `must be an integer in 1..${maxBodyBytesLimit} (256 MiB)`)
    }
    const store = yield* prepare(options.prefix)
    const maxPollMillis = Math.max(1, Duration.toMillis(pollInterval ?? (store.dialect === "pg" ? 1000 : 250)))
    const clock = yield* Effect.clock
    const statements_ = statements(store)
    const encode = encoderOf(options.schema, maxBodyBytes)
    const decode = decoderOf(options.schema)
    const now = nowOf(clock)
    const settler = settleBatcher(statements_, now)
    // Sends group-commit too: concurrent producers share one statement and one commit.
    const sender = new GroupCommit<SendItem, string | undefined, SqlError>(
      (items) =>
        Effect.map(statements_.insert(name, items, now(), maxSize), (ids) => {
          if (items.some((item, index) => item.delayMillis === 0 && ids[index] !== undefined)) store.wake(name)
          return ids
        }),
      { ...batchLimits, sizeOf: (item) => 64 + item.body.length }
    )
    const context: MailboxContext = {
      name,
      store,
      statements: statements_,
      settler,
      settleGroup: groupSettler(settler),
      routes: new WeakMap(),
      now,
      replyEncoder: options.replySchema === undefined ? undefined : encoderOf(options.replySchema, maxBodyBytesLimit)
    }
    const withStore = connectionError(name)

    const insert = (body: A, delayMillis: number, replyTo: string | undefined): Effect.Effect<string, SendError> => {
      const encoded = encode(body)
      if (Either.isLeft(encoded)) return Effect.fail(new SerializationError({ mailbox: name, reason: encoded.left }))
      return sender.submit({ body: encoded.right, delayMillis, replyTo: replyTo ?? null }).pipe(
        withStore,
        Effect.flatMap((id) =>
          id === undefined
            ? Effect.fail(new MailboxFullError({ mailbox: name, maxSize: maxSize! }))
            : Effect.succeed(id)
        )
      )
    }

    /** Turns claimed rows into messages; a row whose body no longer decodes goes to the dead-letter table. */
    const toMessages = (rows: ReadonlyArray<Row>, now: Now) =>
      Effect.gen(function*() {
        const received: Array<Message<A, R>> = []
        for (const row of rows.length > 1 ? [...rows].sort((a, b) => Number(a.seq) - Number(b.seq)) : rows) {
          const id = String(row.seq)
          const body = decode(row.body)
          if (Either.isLeft(body)) {
            const reason = body.left
            yield* statements_.deadLetter(id, row.receipt_handle, now, "SerializationError", reason)
            yield* Metric.increment(undecodableDeadLettered)
            yield* Effect.logWarning(
              `Message ${id} in mailbox "${name}" no longer decodes; moved to dead letters`,
              reason
            )
            continue
          }
          received.push(
            new SqlMessage<A, R>(
              context,
              id,
              body.right,
              row.receipt_handle,
              Number(row.delivery_count),
              DateTime.unsafeMake(Number(row.enqueued_at)),
              Option.fromNullable(row.reply_to)
            )
          )
        }
        return received
      })

    const releaseRows = (rows: ReadonlyArray<Row>, now: Now) =>
      Effect.forEach(
        rows,
        (row) => Effect.ignore(statements_.release(String(row.seq), row.receipt_handle, now)),
        { discard: true }
      )
    const nextVisibleIn = new SingleFlight(() => statements_.nextVisibleIn(name, now()))
    const claimer = new ClaimBatcher(
      (at, visibilityMillis, max) => statements_.claim(name, at, visibilityMillis, max),
      releaseRows,
      now
    )

    /**
     * One claim, grouped with other receivers' (see `ClaimBatcher`). Only the wait is interruptible; if an
     * interruption lands once this receiver's rows are claimed but before it has them as messages, they are
     * released (visible again, delivery not counted).
     */
    const claimOnce = (max: number, visibilityMillis: number) =>
      Effect.suspend(() => {
        let claimed: Claimed | undefined
        return Effect.uninterruptibleMask((restore) =>
          claimer.submit(max, visibilityMillis, restore).pipe(
            Effect.tap((result) => {
              claimed = result
            }),
            Effect.flatMap(({ now, rows }) => toMessages(rows, now))
          )
        ).pipe(
          Effect.onInterrupt(() => claimed === undefined ? Effect.void : releaseRows(claimed.rows, claimed.now)),
          withStore,
          Effect.tapError(() => Effect.sync(() => store.relisten()))
        )
      })

    const mailbox = FrontEnd.make<A, R>(name, {
      insert,
      claim: claimOnce,
      nextVisibleIn: withStore(nextVisibleIn.run),
      arm: () => store.arm(name),
      count: withStore(statements_.count(name)),
      purge: withStore(statements_.purge(name)),
      // Other processes' sends reach PostgreSQL's receivers by NOTIFY, so its polls are only a fallback;
      // SQLite's receivers poll with backoff from 10 ms.
      poll: { firstMillis: store.dialect === "pg" ? maxPollMillis : 10, maxMillis: maxPollMillis }
    }, clock)

    const target = mailbox as unknown as ReplyTarget
    registered.set(target, { store, queue: name, encode })
    let open = store.open.get(name)
    if (open === undefined) store.open.set(name, open = new Set())
    open.add(target)
    store.users++
    yield* listen(store)
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        mailbox.close,
        Effect.suspend(() => {
          open.delete(target)
          if (open.size === 0) store.open.delete(name)
          if (--store.users > 0) return Effect.void
          store.closeLane()
          if (store.listener === undefined) return Effect.void
          const listener = store.listener
          store.listener = undefined
          return Fiber.interrupt(listener)
        })
      )
    )
    // The lane's connection opens with the first mailbox, not with its first message.
    yield* store.onLane(() => Effect.void).pipe(connectionError(name))
    return mailbox
  })

/**
 * A resolver over the mailboxes made on this database and prefix in this
 * process: a reply to any of them needs no configuration.
 */
export const resolver = (options?: { readonly prefix?: string | undefined }): Effect.Effect<
  MailboxResolver["Type"],
  InvalidParameterError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const prefix = options?.prefix ?? "leasehold_"
    const problem = Sql.prefixProblem(prefix)
    if (problem !== undefined) return yield* invalid("prefix", prefix, problem)
    const store = storeFor(yield* SqlClient.SqlClient, prefix)
    return {
      resolve: (name: string) => {
        const open = store.open.get(name)
        const first = open === undefined ? undefined : open.values().next().value
        return first === undefined ? Effect.fail(new MailboxResolutionError({ name })) : Effect.succeed(first)
      }
    }
  })

/** `resolver` as a layer. */
export const layerResolver = (options?: { readonly prefix?: string | undefined }) =>
  Layer.effect(MailboxResolver, Effect.orDie(resolver(options)))

// ---------------------------------------------------------------------------
// Dead letters
// ---------------------------------------------------------------------------

/** A row of the dead-letter table; `body` is the stored (encoded) body, which may not decode. */
export interface StoredDeadLetter {
  readonly id: string
  readonly queue: string
  readonly body: string
  readonly replyTo: string | undefined
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  readonly deadLetteredAt: DateTime.Utc
  readonly errorTag: string
  readonly error: string
}

/** Which dead letters an operation applies to: all, one source queue, and/or some ids. */
export interface Selection {
  readonly queue?: string | undefined
  readonly ids?: ReadonlyArray<string> | undefined
}

/** A `limit` of the operator's queries: a positive integer (the database would take a negative one as none). */
const checkLimit = (limit: number | undefined): Either.Either<undefined, InvalidParameterError> =>
  limit === undefined || (Number.isSafeInteger(limit) && limit > 0 && limit <= 100_000)
    ? Either.right(undefined)
    : Either.left(
      new InvalidParameterError({ parameter: "limit", value: limit, reason: "must be an integer in 1..100000" })
    )

/** Operations on the dead-letter table (used by the command line). */
export interface DeadLetters {
  /** Oldest first; at most `limit` (default 100). */
  readonly list: (
    selection?: Selection & { readonly limit?: number | undefined }
  ) => Effect.Effect<ReadonlyArray<StoredDeadLetter>, MailboxConnectionError | InvalidParameterError>
  readonly count: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /** Moves dead letters back to their source queue as new messages (delivery count 0); returns how many. */
  readonly redrive: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /** Deletes dead letters; returns how many. */
  readonly purge: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /**
   * Where a `MainLoop` dead-letters requests (its `deadLetters.mailbox`): the
   * letter's body is stored encoded with `schema`, keyed by its message id.
   */
  readonly sink: <A, I>(schema: Schema.Schema<A, I, never>) => {
    readonly name: string
    readonly send: (
      letter: DeadLetter.DeadLetter<A>
    ) => Effect.Effect<string, SerializationError | MailboxConnectionError>
  }
}

interface DeadLetterRow {
  readonly id: string
  readonly queue: string
  readonly body: string
  readonly reply_to: string | null
  readonly delivery_count: number | string
  readonly enqueued_at: number | string
  readonly dead_lettered_at: number | string
  readonly error_tag: string
  readonly error: string
}

/** The dead-letter table of a database and prefix, creating the tables if needed. */
export const deadLetters = (options?: {
  readonly prefix?: string | undefined
  /** false: open existing tables only, writing nothing (`TablesNotFoundError` without them); default true. */
  readonly create?: boolean | undefined
}): Effect.Effect<
  DeadLetters,
  InvalidParameterError | MailboxConnectionError | TablesNotFoundError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const store = yield* (options?.create === false ? openExisting(options.prefix) : prepare(options?.prefix))
    const { sql } = store
    const table = sql(store.deadLetters)
    const messages = sql(store.messages)
    const clock = yield* Effect.clock
    const withStore = connectionError(store.deadLetters)
    const where = (selection: Selection | undefined) => {
      const conditions = [
        ...(selection?.queue === undefined ? [] : [sql`queue = ${selection.queue}`]),
        ...(selection?.ids === undefined ? [] : [sql.in("id", selection.ids)])
      ]
      return conditions.length === 0 ? sql`` : sql`WHERE ${sql.and(conditions)}`
    }
    const empty = (selection: Selection | undefined) => selection?.ids !== undefined && selection.ids.length === 0

    return {
      list: (selection) =>
        Either.match(checkLimit(selection?.limit), {
          onLeft: (invalid): Effect.Effect<ReadonlyArray<StoredDeadLetter>, InvalidParameterError> =>
            Effect.fail(invalid),
          onRight: () =>
            empty(selection) ? Effect.succeed([]) : sql<DeadLetterRow>`SELECT * FROM ${table} ${where(selection)}
              ORDER BY dead_lettered_at, id LIMIT ${selection?.limit ?? 100}`.pipe(
              Effect.map((rows) =>
                rows.map((row): StoredDeadLetter => ({
                  id: row.id,
                  queue: row.queue,
                  body: row.body,
                  replyTo: row.reply_to ?? undefined,
                  deliveryCount: Number(row.delivery_count),
                  enqueuedAt: DateTime.unsafeMake(Number(row.enqueued_at)),
                  deadLetteredAt: DateTime.unsafeMake(Number(row.dead_lettered_at)),
                  errorTag: row.error_tag,
                  error: row.error
                }))
              ),
              withStore
            )
        }),
      count: (selection) =>
        empty(selection) ?
          Effect.succeed(0) :
          sql<{ n: number | string }>`SELECT count(*) AS n FROM ${table} ${where(selection)}`.pipe(
            Effect.map((rows) => Number(rows[0]?.n ?? 0)),
            withStore
          ),
      redrive: (selection) =>
        empty(selection) ? Effect.succeed(0) : Effect.suspend(() => {
          const at = statements(store).at(nowOf(clock)())
          // Delete first (on SQLite the first statement takes the write lock), then re-insert what was deleted,
          // visible from now on the database's clock.
          return Sql.writeTransaction(sql)(
            Effect.flatMap(
              sql<DeadLetterRow>`DELETE FROM ${table} ${where(selection)} RETURNING *`,
              (gone) =>
                gone.length === 0 ? Effect.succeed(gone) : Effect.as(
                  sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, reply_to) VALUES ${
                    sql.csv(gone.map((row) =>
                      sql`(${row.queue}, ${row.body}, ${at}, ${Number(row.enqueued_at)}, ${row.reply_to})`
                    ))
                  }`,
                  gone
                )
            )
          ).pipe(Effect.tap((gone) => Effect.sync(() => gone.forEach((row) => store.wake(row.queue)))))
        }).pipe(Effect.map((gone) => gone.length), withStore),
      purge: (selection) =>
        empty(selection) ? Effect.succeed(0) : sql`DELETE FROM ${table} ${where(selection)} RETURNING id`.pipe(
          Effect.map((rows) => rows.length),
          withStore
        ),
      sink: (schema) => {
        const encode = encoderOf(schema, maxBodyBytesLimit)
        return {
          name: store.deadLetters,
          send: (letter) =>
            Either.match(encode(letter.body), {
              onLeft: (reason) =>
                Effect.fail(
                  new SerializationError({ mailbox: store.deadLetters, messageId: letter.messageId, reason })
                ),
              onRight: (body) =>
                sql`INSERT INTO ${table}
                    (id, queue, body, reply_to, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
                  VALUES (${letter.messageId}, ${letter.sourceMailbox}, ${body}, ${letter.replyTo ?? null},
                    ${letter.deliveryCount}, ${DateTime.toEpochMillis(letter.enqueuedAt)},
                    ${DateTime.toEpochMillis(letter.deadLetteredAt)}, ${letter.lastErrorTag}, ${letter.lastError})
                  ON CONFLICT (id) DO UPDATE SET delivery_count = excluded.delivery_count,
                    dead_lettered_at = excluded.dead_lettered_at, error_tag = excluded.error_tag,
                    error = excluded.error`.pipe(Effect.as(letter.messageId), withStore)
            })
        }
      }
    }
  })

/** One queue of a database, as operators see it. */
export interface QueueStats {
  readonly queue: string
  /** Visible now: the next receive can take them. */
  readonly queued: number
  /** Received and not yet settled (invisible until their visibility timeout). */
  readonly inFlight: number
  /** Sent with a delay or nacked with a retry delay, not visible yet. */
  readonly delayed: number
  readonly oldestEnqueuedAt: Option.Option<DateTime.Utc>
  readonly maxDeliveryCount: number
  readonly deadLetters: number
}

/** A stored message, read without receiving it; the body is its stored (encoded) JSON. */
export interface PeekedMessage {
  readonly id: string
  readonly body: string
  readonly state: "queued" | "in flight" | "delayed"
  readonly visibleAt: DateTime.Utc
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  readonly replyTo: Option.Option<string>
}

/** Operations on every queue of a database and prefix (used by the command line). */
export interface Queues {
  /** Every queue that has messages or dead letters. */
  readonly stats: Effect.Effect<ReadonlyArray<QueueStats>, MailboxConnectionError>
  /** The next messages of `queue` in delivery order (visible first), changing nothing. */
  readonly peek: (
    queue: string,
    options?: { readonly limit?: number | undefined }
  ) => Effect.Effect<ReadonlyArray<PeekedMessage>, MailboxConnectionError | InvalidParameterError>
  /** Deletes every message of `queue`, in flight or not; returns how many. */
  readonly purge: (queue: string) => Effect.Effect<number, MailboxConnectionError>
}

/** The queues of a database and prefix, creating the tables if needed. */
export const queues = (options?: {
  readonly prefix?: string | undefined
  /** false: open existing tables only, writing nothing (`TablesNotFoundError` without them); default true. */
  readonly create?: boolean | undefined
}): Effect.Effect<
  Queues,
  InvalidParameterError | MailboxConnectionError | TablesNotFoundError,
  SqlClient.SqlClient
> =>
  Effect.gen(function*() {
    const store = yield* (options?.create === false ? openExisting(options.prefix) : prepare(options?.prefix))
    const { sql } = store
    const messages = sql(store.messages)
    const letters = sql(store.deadLetters)
    const clock = yield* Effect.clock
    const withStore = connectionError(store.messages)
    const statements_ = statements(store)
    return {
      stats: Effect.suspend(() => {
        const now = statements_.at(nowOf(clock)())
        return Effect.zipWith(
          sql<{
            queue: string
            queued: number | string
            in_flight: number | string
            delayed: number | string
            oldest: number | string | null
            max_delivery: number | string | null
          }>`SELECT queue,
              SUM(CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END) AS queued,
              SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NOT NULL THEN 1 ELSE 0 END) AS in_flight,
              SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NULL THEN 1 ELSE 0 END) AS delayed,
              MIN(enqueued_at) AS oldest, MAX(delivery_count) AS max_delivery
            FROM ${messages} GROUP BY queue`,
          sql<{ queue: string; n: number | string }>`SELECT queue, count(*) AS n FROM ${letters} GROUP BY queue`,
          (rows, dead) => {
            const names = [...new Set([...rows.map((row) => row.queue), ...dead.map((row) => row.queue)])].sort()
            return names.map((queue): QueueStats => {
              const row = rows.find((r) => r.queue === queue)
              return {
                queue,
                queued: Number(row?.queued ?? 0),
                inFlight: Number(row?.in_flight ?? 0),
                delayed: Number(row?.delayed ?? 0),
                oldestEnqueuedAt: row?.oldest === null || row?.oldest === undefined
                  ? Option.none()
                  : Option.some(DateTime.unsafeMake(Number(row.oldest))),
                maxDeliveryCount: Number(row?.max_delivery ?? 0),
                deadLetters: Number(dead.find((r) => r.queue === queue)?.n ?? 0)
              }
            })
          }
        ).pipe(withStore)
      }),
      peek: (queue, peekOptions) =>
        Effect.suspend(
          (): Effect.Effect<ReadonlyArray<PeekedMessage>, MailboxConnectionError | InvalidParameterError> => {
            const limit = checkLimit(peekOptions?.limit)
            if (Either.isLeft(limit)) return Effect.fail(limit.left)
            const now = statements_.at(nowOf(clock)())
            return sql<Row & { visible_at: number | string; visible: number | boolean }>`SELECT seq, body,
              receipt_handle, delivery_count, enqueued_at, reply_to, visible_at,
              CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END AS visible
            FROM ${messages} WHERE queue = ${queue} ORDER BY visible_at, seq LIMIT ${peekOptions?.limit ?? 10}`.pipe(
              Effect.map((rows) =>
                rows.map((row): PeekedMessage => ({
                  id: String(row.seq),
                  body: row.body,
                  state: Number(row.visible) === 1 ? "queued" : row.receipt_handle === null ? "delayed" : "in flight",
                  visibleAt: DateTime.unsafeMake(Number(row.visible_at)),
                  deliveryCount: Number(row.delivery_count),
                  enqueuedAt: DateTime.unsafeMake(Number(row.enqueued_at)),
                  replyTo: Option.fromNullable(row.reply_to)
                }))
              ),
              withStore
            )
          }
        ),
      purge: (queue) => withStore(statements_.purge(queue))
    }
  })

// ---------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------

/** What the layers provide: the database client and a resolver over its mailboxes. */
export type Services = SqlClient.SqlClient | MailboxResolver

/**
 * The mailboxes' `MailboxResolver` on the `SqlClient` in the context (provide `Database.layerSqlite` /
 * `layerPg` once: every durable service of the process then shares its pool).
 */
export const layer = (options?: { readonly prefix?: string | undefined }): Layer.Layer<
  MailboxResolver,
  never,
  SqlClient.SqlClient
> => layerResolver(options)

/** `Database.layerSqlite` with this module's resolver: the client and a resolver over its mailboxes. */
export const layerSqlite = (options: {
  readonly filename: string
  readonly busyTimeout?: Duration.DurationInput | undefined
  readonly prefix?: string | undefined
}): Layer.Layer<Services, MailboxConnectionError | InvalidParameterError> =>
  Layer.provideMerge(
    layerResolver(options),
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

/** The environment variables `layerPg` reads when no `url` is given. */
export const databaseUrl = Database.databaseUrl

/** `Database.layerPg` with this module's resolver: the client and a resolver over its mailboxes. */
export const layerPg = (options?: {
  readonly url?: Redacted.Redacted | string | undefined
  /** Most connections the pool opens (default 10). */
  readonly maxConnections?: number | undefined
  /**
   * Connections opened when the layer starts and kept open (default 4, or `maxConnections` if fewer), so a
   * worker's first long polls do not pay for new server processes. Claims, acknowledgements, sends,
   * extensions and nacks do not use the pool: the mailboxes of a prefix share a connection of their own,
   * opened with the first of them (see `Store.onLane`).
   */
  readonly minConnections?: number | undefined
  readonly prefix?: string | undefined
}): Layer.Layer<Services, MailboxConnectionError | ConfigError.ConfigError | InvalidParameterError> =>
  Layer.provideMerge(
    layerResolver(options),
    Database.layerPg(options).pipe(
      Layer.catchAll((error) =>
        Layer.fail(
          error._tag === "DatabaseError" ? new MailboxConnectionError({ mailbox: error.database, cause: error }) : error
        )
      )
    )
  )
