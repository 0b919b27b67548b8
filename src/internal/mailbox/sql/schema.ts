/**
 * The mailbox's tables: the migrations (`Migrator.fromRecord`, one record per
 * service, numbered for ever), the PL/pgSQL claim and settle functions they
 * create on PostgreSQL, and the three ways a caller gets a store's tables —
 * created or upgraded (`prepare`), required at this release's version
 * (`requireMigrated`, a mailbox made with `create: false`), or only read
 * (`openExisting`, the operator's look).
 */
import type * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import { TablesNotFoundError } from "../../../Errors.js"
import { MailboxConnectionError } from "../../../Mailbox.js"
import * as Sql from "../../sql/common.js"
import { requireVersion } from "../../sql/version.js"
import * as Journal from "./journal.js"
import * as Keys from "./keys.js"
import * as Queues from "./queues.js"
import { connectionError, type Store, tablesOf } from "./store.js"
import * as Workers from "./workers.js"

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
    // The step journal of agent runs (internal/journal.ts): the steps a delivery recorded, kept by the
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
    "13_worker_instance": Workers.createInstancesTable(store),
    // Scheduling by key (keys.ts): the columns, the keys table and its ledger, the queues' flag. PostgreSQL's
    // claim (same signature) gives a scheduled queue nothing, as a paused one — its claims go through the
    // scheduled claim — and its settle (same signature) charges each keyed lease's key in the ledger.
    "14_keys": Effect.zipRight(
      Keys.migrate(store),
      store.dialect === "pg"
        ? Effect.zipRight(
          createClaimFunction(store, { receiver: true, pause: true, scheduled: true }),
          createSettleFunction(store, { traceparents: true, charges: true })
        )
        : Effect.void
    ),
    // A keyed lease found by its key (keys.ts): a claim counts a key's live leases without reading its backlog.
    "15_key_leases": Keys.migrateLeases(store),
    // PostgreSQL: the scheduled claim's two round trips as functions (keys.ts), whose plans the server keeps.
    "16_keyed_claim": store.dialect === "pg" ? Keys.createClaimFunctions(store) : Effect.void
  }
}

/**
 * The claim (PostgreSQL): up to `p_max` visible messages of a queue in index order, skipping rows another claim
 * holds. With `receiver` (migration 7 on), an overload that also records who received them; with `pause`
 * (migration 10 on), nothing for a paused queue.
 */
const createClaimFunction = (
  store: Store,
  options?: { readonly receiver: boolean; readonly pause?: boolean; readonly scheduled?: boolean }
) => {
  const { messages, sql } = store
  const receiver = options?.receiver === true
  // One primary-key look-up per claim: a paused queue (queues.ts) gives nothing.
  const pause = options?.pause === true
    ? sql`IF EXISTS (SELECT 1 FROM ${sql(Queues.tableOf(store.prefix))} q WHERE q.name = p_queue AND q.paused <> 0)
          THEN RETURN; END IF;${
      // Migration 14 on: a queue scheduled by key (keys.ts) is claimed through the scheduled claim.
      options?.scheduled === true
        ? sql`
          IF EXISTS (SELECT 1 FROM ${sql(Keys.keysTable(store.prefix))} k WHERE k.queue = p_queue AND k.key = '')
          THEN RETURN; END IF;`
        : sql``}`
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
export const createSettleFunction = (
  store: Store,
  options?: { readonly traceparents: boolean; readonly charges?: boolean }
) => {
  const { messages, sql } = store
  const traced = options?.traceparents === true
  // Migration 14 on: each acknowledged keyed lease charges its key what it held (keys.ts: the ledger).
  const charges = options?.charges === true
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
            RETURNING m.seq${charges ? sql`, m.queue, m.key, m.leased_at, m.charged, m.lease_weight` : sql``}),${
    charges
      ? sql`
          charged AS (
            INSERT INTO ${sql(Keys.chargesTable(store.prefix))} (queue, key, vtime, leased, held, tokens, at)
            SELECT a.queue, a.key, ((p_now - a.leased_at) - a.charged) / a.lease_weight, (p_now - a.leased_at) - a.charged,
              p_now - a.leased_at, NULL, p_now
            FROM acked a WHERE a.key IS NOT NULL AND a.leased_at IS NOT NULL),`
      : sql``
  }
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
