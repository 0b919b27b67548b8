/**
 * Scheduling by key on SQLite and PostgreSQL (the rules are `../scheduling.ts`; MailboxMemory keeps the same
 * ones in memory). A queue becomes *scheduled* the first time a message is sent to it with a key or a
 * priority, or a key setting is made for it (its row `''` in the keys table); from then on its claims go
 * through `claim` here, and the plain claim (`statements.ts`, PostgreSQL's function) gives it nothing, as it
 * gives a paused queue nothing — so a queue that never used a key pays no more than before.
 *
 * The tables (mailbox migration 14):
 * - messages gain `key`, `priority`, and the lease's charge: `leased_at` (when the claim took it), `charged`
 *   (the worker-milliseconds its key has been charged for it so far) and `lease_weight` (the key's weight then).
 * - `keys`: one row per (queue, key) that ever had a message or a setting — its settings (NULL: the queue's
 *   default), its share clock `vtime` (leased milliseconds over weight), its mean lease length, its rate
 *   windows, and `idle` (no message at all: the claim's walk skips it until a send wakes it). The row with the
 *   key `''` (no key may be empty) holds the queue's defaults and the queue's share clock `V`.
 * - `key_charges`: a ledger. A settle, a nack, a dead letter, a release or an extension of a keyed lease
 *   appends what its key is owed (or owes): the correction from the lease's expected length to the time it
 *   really held, and a token charge appends its tokens. Appending takes no lock on a key's row, so settles
 *   never wait on claims or on each other; the claim — the keys' only writer, one at a time per queue —
 *   folds the ledger into the rows first.
 *
 * The claim, in one write transaction (SQLite: the file's lock; PostgreSQL: the `''` row `FOR UPDATE`, so
 * claims of one queue take turns across processes and each counts the leases the one before it made):
 * fold the ledger; walk the active keys by (share clock, name) a page at a time, a key's effective clock being
 * at least `V` (a key coming back from idle starts level, with no credit banked); for each key take its ready
 * messages by (priority, first enqueue) — a redelivered message keeps its place — unless it is at its limit
 * (live leases counted in the transaction), over its start rate or over its token budget; pick the lowest
 * clock (keys at one clock in the order they were loaded: those a send woke, then the page's by (clock, name) —
 * not by name alone, as memory breaks ties), charge it the lease's expected length over its weight, and go
 * again. Unkeyed messages of the queue meet the fair pick by first enqueue. Cost: per claim, one page of keys (a
 * quarter more than it claims, at least 64) and one index range per key looked at (its ready rows, and its live
 * leases when it has a limit), plus the ledger since the last claim. On PostgreSQL the reads before the walk and
 * the writes after it are two calls of PL/pgSQL functions (migration 16, `createClaimFunctions`): four round
 * trips a claim with the transaction's own, where its statements took ten.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Effect from "effect/Effect"
import { MinHeap } from "../../heap.js"
import * as Sql from "../../sql/common.js"
import * as Scheduling from "../scheduling.js"
import { tableOf } from "./queues.js"
import type { Row, Store } from "./store.js"

/** The keys table's name under `prefix`. */
export const keysTable = (prefix: string) => `${prefix}mailbox_keys`
/** The ledger of charges under `prefix`. */
export const chargesTable = (prefix: string) => `${prefix}mailbox_key_charges`

/** The key of the row holding a queue's defaults and share clock (no message key may be empty). */
export const queueRow = ""

/**
 * Migration 15: the keyed leases, by key — what a claim counts against a key's limit (its rows with a receipt
 * handle whose visibility has not passed). Without it a key's count read every row of the key (a backlog of 100
 * a key: 7.7 ms for a page of 100 keys on SQLite, 0.24 ms with it). Unkeyed rows are not in it.
 */
export const migrateLeases = (store: Store): Effect.Effect<void, SqlError> => {
  const { messages, sql } = store
  return sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_leased`)} ON ${sql(messages)} (queue, key, visible_at)
    WHERE receipt_handle IS NOT NULL AND key IS NOT NULL`.pipe(Effect.asVoid)
}

/** Migration 14: the messages' and dead letters' columns, the keys table, the ledger, the queues' flag. */
export const migrate = (store: Store): Effect.Effect<void, SqlError> => {
  const { deadLetters, messages, sql } = store
  const pg = store.dialect === "pg"
  const real = pg ? sql`DOUBLE PRECISION` : sql`REAL`
  const m = sql(messages)
  const addColumns = pg
    ? [
      sql`ALTER TABLE ${m} ADD COLUMN IF NOT EXISTS key TEXT,
        ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS leased_at BIGINT,
        ADD COLUMN IF NOT EXISTS charged BIGINT,
        ADD COLUMN IF NOT EXISTS lease_weight DOUBLE PRECISION`,
      sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN IF NOT EXISTS key TEXT,
        ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0`
    ]
    : [
      // SQLite has no ADD COLUMN IF NOT EXISTS: the columns missing are added (a test re-runs migrations).
      addMissing(store, messages, [
        ["key", "TEXT"],
        ["priority", "INTEGER NOT NULL DEFAULT 0"],
        ["leased_at", "BIGINT"],
        ["charged", "BIGINT"],
        ["lease_weight", "REAL"]
      ]),
      addMissing(store, deadLetters, [["key", "TEXT"], ["priority", "INTEGER NOT NULL DEFAULT 0"]])
    ]
  const keys = sql(keysTable(store.prefix))
  return Effect.all([
    ...addColumns,
    // A key's messages in claim order (and its live leases, counted through the same range); unkeyed rows
    // pay nothing for it.
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_key`)} ON ${m} (queue, key, priority, seq)
      WHERE key IS NOT NULL`,
    // The unkeyed messages of a scheduled queue in claim order: without it a claim of a queue with a keyed
    // backlog would read every ready row to learn it has no unkeyed one. (Every unkeyed row pays for it, on a
    // plain queue too: BENCHMARKS.md measures what.)
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_unkeyed`)} ON ${m} (queue, priority, seq) WHERE key IS NULL`,
    sql`CREATE TABLE IF NOT EXISTS ${keys} (
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      max_leases INTEGER,
      weight ${real},
      start_limit BIGINT,
      start_interval BIGINT,
      token_limit BIGINT,
      token_interval BIGINT,
      vtime ${real} NOT NULL DEFAULT 0,
      mean ${real},
      leased ${real} NOT NULL DEFAULT 0,
      starts_window BIGINT NOT NULL DEFAULT 0,
      starts_used BIGINT NOT NULL DEFAULT 0,
      tokens_window BIGINT NOT NULL DEFAULT 0,
      tokens_used BIGINT NOT NULL DEFAULT 0,
      idle INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (queue, key))`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${keysTable(store.prefix)}_active`)} ON ${keys} (queue, vtime, key)
      WHERE idle = 0`,
    sql`CREATE TABLE IF NOT EXISTS ${sql(chargesTable(store.prefix))} (
      id ${Sql.identityColumn(sql)},
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      vtime ${real} NOT NULL DEFAULT 0,
      leased ${real} NOT NULL DEFAULT 0,
      held BIGINT,
      tokens BIGINT,
      at BIGINT NOT NULL)`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${chargesTable(store.prefix)}_queue`)} ON ${
      sql(chargesTable(store.prefix))
    } (queue, id)`
  ], { discard: true })
}

/** SQLite: adds to `table` those of `columns` (name, type) it does not have. */
const addMissing = (
  store: Store,
  table: string,
  columns: ReadonlyArray<readonly [string, string]>
): Effect.Effect<void, SqlError> => {
  const { sql } = store
  return Effect.flatMap(sql<{ name: string }>`SELECT name FROM pragma_table_info(${table})`, (present) => {
    const have = new Set(present.map((column) => column.name))
    return Effect.forEach(
      columns.filter(([name]) => !have.has(name)),
      ([name, type]) => sql.unsafe(`ALTER TABLE "${table}" ADD COLUMN ${name} ${type}`),
      { discard: true }
    )
  })
}

/**
 * The ledger entry of the leases `source` selects (a `FROM … WHERE …` over the messages table aliased `m`)
 * ending at `end` (a SQL time): each keyed one's correction from what was charged to what it held. `held`
 * moves the key's mean lease length; a release (the lease never reached a worker) does not.
 */
export const chargeEnded = (
  store: Store,
  end: Statement.Fragment,
  source: Statement.Fragment,
  options: { readonly held: boolean }
): Statement.Statement<never> => {
  const { sql } = store
  const length = sql`(${end} - m.leased_at)`
  return sql`INSERT INTO ${sql(chargesTable(store.prefix))} (queue, key, vtime, leased, held, tokens, at)
    SELECT m.queue, m.key, (${length} - m.charged) / m.lease_weight, ${length} - m.charged, ${
    options.held ? length : sql`NULL`
  }, NULL, ${end}
    ${source} AND m.key IS NOT NULL AND m.leased_at IS NOT NULL`
}

/**
 * The ledger entry of an extension at `now` of the leases `source` selects: a running lease is expected to run
 * as long again as it has (`expectedLength`), and its key is charged up to that.
 */
export const chargeExtended = (
  store: Store,
  now: Statement.Fragment,
  source: Statement.Fragment
): Statement.Statement<never> => {
  const { sql } = store
  const owed = sql`(2 * (${now} - m.leased_at) - m.charged)`
  return sql`INSERT INTO ${sql(chargesTable(store.prefix))} (queue, key, vtime, leased, held, tokens, at)
    SELECT m.queue, m.key, ${owed} / m.lease_weight, ${owed}, NULL, NULL, ${now}
    ${source} AND m.key IS NOT NULL AND m.leased_at IS NOT NULL AND ${owed} > 0`
}

/**
 * The `charged` a lease has after an extension at `now`: the most of what it had and twice its age. `table`:
 * how the statement names the messages table (its alias, or its name).
 */
export const chargedAfterExtension = (
  store: Store,
  now: Statement.Fragment,
  table: Statement.Fragment
): Statement.Fragment => {
  const { sql } = store
  const greatest = store.dialect === "pg" ? sql`GREATEST` : sql`max`
  return sql`charged = CASE WHEN ${table}.leased_at IS NULL THEN ${table}.charged
    ELSE ${greatest}(${table}.charged, 2 * (${now} - ${table}.leased_at)) END`
}

/**
 * Marks `queue` scheduled and its `keys` known, before a send of keyed or prioritised messages stores them (in
 * the send's transaction): a plain claim of another process must not take them first. A new key's row is made;
 * every key named gets a wake entry in the ledger, which the next claim folds in (a key found without messages is
 * `idle`, skipped by the walk until woken). No key row is locked: a claim that found the key empty just before
 * this send committed leaves the wake entry in the ledger for the claim after it.
 */
export const prepareSend = (
  store: Store,
  queue: string,
  keys: ReadonlyArray<string>,
  sql: SqlClient.SqlClient = store.sql
): Effect.Effect<void, SqlError> => {
  const table = sql(keysTable(store.prefix))
  const named = [...new Set(keys)].sort()
  const each = store.dialect === "pg"
    ? sql`json_array_elements_text(${JSON.stringify(named)}::json) AS k(value)`
    : sql`json_each(${JSON.stringify(named)}) AS k`
  return Effect.all([
    markScheduled(store, queue, sql),
    named.length === 0 ? Effect.void : sql`INSERT INTO ${table} (queue, key, vtime)
      SELECT ${queue}, k.value, 0 FROM ${each} WHERE true
      ON CONFLICT (queue, key) DO NOTHING`,
    named.length === 0 ? Effect.void : sql`INSERT INTO ${sql(chargesTable(store.prefix))}
        (queue, key, vtime, leased, held, tokens, at)
      SELECT ${queue}, k.value, 0, 0, NULL, NULL, ${Sql.databaseNow(sql)} FROM ${each}`
  ], { discard: true })
}

/** Charges `tokens` to `key`'s token budget in `queue` at `at` (the ledger: the next claim folds it in). */
export const chargeTokens = (
  store: Store,
  queue: string,
  key: string,
  tokens: number,
  at: Statement.Fragment
): Effect.Effect<void, SqlError> => {
  const { sql } = store
  return Effect.asVoid(
    sql`INSERT INTO ${sql(chargesTable(store.prefix))} (queue, key, vtime, leased, held, tokens, at)
      VALUES (${queue}, ${key}, 0, 0, NULL, ${tokens}, ${at})`
  )
}

/**
 * Makes `queue` scheduled: its `''` row (defaults, share clock), once, then a look-up finds it. The row is what
 * every plain claim checks (and nothing deletes it: dropping the queue from the queues table leaves it, so a
 * process that knew the queue scheduled is never wrong).
 */
export const markScheduled = (
  store: Store,
  queue: string,
  sql: SqlClient.SqlClient = store.sql
): Effect.Effect<void, SqlError> =>
  Effect.suspend(() => {
    if (store.scheduled.has(queue)) return Effect.void
    return sql`INSERT INTO ${sql(keysTable(store.prefix))} (queue, key, vtime) VALUES (${queue}, '', 0)
        ON CONFLICT (queue, key) DO NOTHING`.pipe(
      Effect.tap(() => Effect.sync(() => store.scheduled.add(queue))),
      Effect.asVoid
    )
  })

/** Whether `queue` is scheduled (read once it is; a queue never goes back). */
export const isScheduled = (
  store: Store,
  queue: string,
  sql: SqlClient.SqlClient = store.sql
): Effect.Effect<boolean, SqlError> =>
  Effect.suspend(() => {
    if (store.scheduled.has(queue)) return Effect.succeed(true)
    return Effect.map(
      sql`SELECT 1 FROM ${sql(keysTable(store.prefix))} WHERE queue = ${queue} AND key = ''`,
      (rows) => {
        const scheduled = rows.length > 0
        if (scheduled) store.scheduled.add(queue)
        return scheduled
      }
    )
  })

interface KeyRow {
  readonly key: string
  readonly max_leases: number | string | null
  readonly weight: number | string | null
  readonly start_limit: number | string | null
  readonly start_interval: number | string | null
  readonly token_limit: number | string | null
  readonly token_interval: number | string | null
  readonly vtime: number | string
  readonly mean: number | string | null
  readonly leased: number | string
  readonly starts_window: number | string
  readonly starts_used: number | string
  readonly tokens_window: number | string
  readonly tokens_used: number | string
  readonly idle: number | string
}

const num = (value: number | string | null): number | undefined => value === null ? undefined : Number(value)

/** A key's row as numbers, with what this claim changes in it. */
interface KeyStateRow {
  readonly key: string
  readonly limit: number | undefined
  readonly weight: number | undefined
  readonly startLimit: number | undefined
  readonly startInterval: number | undefined
  readonly tokenLimit: number | undefined
  readonly tokenInterval: number | undefined
  vtime: number
  mean: number | undefined
  leased: number
  startsWindow: number
  startsUsed: number
  tokensWindow: number
  tokensUsed: number
  idle: boolean
  changed: boolean
}

const stateOf = (row: KeyRow): KeyStateRow => ({
  key: row.key,
  limit: num(row.max_leases),
  weight: num(row.weight),
  startLimit: num(row.start_limit),
  startInterval: num(row.start_interval),
  tokenLimit: num(row.token_limit),
  tokenInterval: num(row.token_interval),
  vtime: Number(row.vtime),
  mean: num(row.mean),
  leased: Number(row.leased),
  startsWindow: Number(row.starts_window),
  startsUsed: Number(row.starts_used),
  tokensWindow: Number(row.tokens_window),
  tokensUsed: Number(row.tokens_used),
  idle: Number(row.idle) !== 0,
  changed: false
})

/** The settings in force for a key: its own, else the queue's defaults. */
const effective = (row: KeyStateRow, defaults: KeyStateRow) => ({
  limit: row.limit ?? defaults.limit,
  weight: row.weight ?? defaults.weight ?? 1,
  startLimit: row.startLimit ?? defaults.startLimit,
  startInterval: row.startInterval ?? defaults.startInterval,
  tokenLimit: row.tokenLimit ?? defaults.tokenLimit,
  tokenInterval: row.tokenInterval ?? defaults.tokenInterval
})

/** Folds ledger entries into the key rows they name (loaded if not yet). */
const fold = (
  entries: ReadonlyArray<
    {
      readonly key: string
      readonly vtime: number | string
      readonly leased: number | string
      readonly held: number | string | null
      readonly tokens: number | string | null
      readonly at: number | string
    }
  >,
  rows: Map<string, KeyStateRow>,
  defaults: KeyStateRow,
  woken: Array<KeyStateRow>
) => {
  for (const entry of entries) {
    const row = rows.get(entry.key)
    if (row === undefined) continue
    row.changed = true
    // Any entry wakes the key (a send writes one, with nothing to charge: `prepareSend`).
    if (row.idle) woken.push(row)
    row.idle = false
    row.vtime += Number(entry.vtime)
    row.leased += Number(entry.leased)
    if (entry.held !== null) {
      // The mean starts at what the first lease was charged (the visibility: `expectedLength`'s first guess) and
      // moves a quarter of the way per lease, as in memory: one lease settled at once does not make a key free.
      const held = Number(entry.held)
      const start = row.mean ?? held - Number(entry.leased)
      row.mean = start + Scheduling.meanWeight * (held - start)
    }
    if (entry.tokens !== null) {
      const interval = effective(row, defaults).tokenInterval
      if (interval === undefined) continue
      const window = Scheduling.windowStart(Number(entry.at), interval)
      // Held to what a BIGINT column and a JavaScript number both keep exactly: past it the key is over any budget.
      if (window > row.tokensWindow) {
        row.tokensWindow = window
        row.tokensUsed = Math.min(Number(entry.tokens), Number.MAX_SAFE_INTEGER)
      } else if (window === row.tokensWindow) {
        row.tokensUsed = Math.min(row.tokensUsed + Number(entry.tokens), Number.MAX_SAFE_INTEGER)
      }
    }
  }
}

const keyColumns =
  "key, max_leases, weight, start_limit, start_interval, token_limit, token_interval, vtime, mean, leased, " +
  "starts_window, starts_used, tokens_window, tokens_used, idle"

/** A candidate row of a key (or of the unkeyed), in claim order. */
interface Candidate {
  /** BIGINT: a string from PostgreSQL's driver (compare as numbers, never as the strings). */
  readonly seq: number | string
  readonly priority: number | string
  readonly key: string | null
  readonly leased_at: number | string | null
  readonly charged: number | string | null
  readonly lease_weight: number | string | null
  readonly visible_at: number | string
}

/** Rows claimed, with the charge each one starts with. */
interface Pick {
  /** PostgreSQL: the text of the BIGINT (exact past 2^53); SQLite: its driver's number. */
  readonly seq: string | number
  readonly charged: number | null
  readonly weight: number | null
}

/** Orders two seqs (non-negative integers, as text or numbers) exactly, past 2^53 too. */
const compareSeq = (a: number | string, b: number | string): number => {
  const x = String(a)
  const y = String(b)
  return x.length - y.length || (x < y ? -1 : x > y ? 1 : 0)
}

/** A page of the walk: a quarter more keys than the claim takes messages, within these bounds. */
const minPage = 64
const maxPage = 1_024
/** Below every priority (an INTEGER column): the start of a key's claim order. */
const lowestPriority = -2_147_483_648

/** A ledger entry as the claim reads it. */
interface LedgerRow {
  readonly key: string
  readonly vtime: number | string
  readonly leased: number | string
  readonly held: number | string | null
  readonly tokens: number | string | null
  readonly at: number | string
}

/**
 * Migration 16 (PostgreSQL): the scheduled claim's two round trips as PL/pgSQL functions, whose plans the server
 * keeps (node-postgres sends every statement unnamed: parsed and planned each time) — the claim had ten round
 * trips, and a claim waits its turn on the queue's row, so what one costs is what every claim of the queue waits.
 * - `<prefix>mailbox_keys_look(queue, now, max, page)`: takes the queue's turn (its `''` row `FOR UPDATE`, and 5 s
 *   of idle in the transaction at most), then reads — in a statement after the lock, so it sees what the claim
 *   before it wrote — the time (the test's, or the server's clock now), the pause, the ledger (taken), the rows of
 *   the keys it names, the walk's first page and, for those keys and the ledger's idle ones, each one's first
 *   ready messages (a share of `max`), live leases and, with neither, whether it has a message at all; and the
 *   unkeyed head. One JSON value (NULL: the queue is not scheduled).
 * - `<prefix>mailbox_keys_lease(queue, states, lease, guard, at, visibility, receiver)`: writes the keys' rows
 *   back and leases the picked messages still ready at `guard` (the look's time) from `at` (the test's time, or
 *   the server's clock at this call: a lease runs from when it is made).
 * Their plans are generic (made once, again after an ANALYZE) and find each key row by its primary key, a lookup
 * per row (`LATERAL … LIMIT 1`, which a planner cannot turn into a join): joined, a planner hashed every key row
 * of the queue to write 160 of them (1,001 keys: 1.1 ms of a 2.2 ms write-back) — or, with a table's statistics
 * from when it was small, scanned them once per row written (38 ms). The look's emptiness test is a set
 * difference, not an anti-join against the page's rows (quadratic in the page: 1.2 ms of a 3.3 ms look).
 */
export const createClaimFunctions = (store: Store): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const keys = sql(keysTable(store.prefix))
  const messages = sql(store.messages)
  const columns = sql.literal(keyColumns)
  // A seq as text: JSON's numbers (JavaScript's) hold integers exactly only to 2^53. (So every ORDER BY names the
  // table's seq, a BIGINT: the output's `seq` is the text, which orders "10" before "9".)
  const candidate = sql.literal("seq::text AS seq, priority, key, leased_at, charged, lease_weight, visible_at")
  const nowMs = sql.literal("(floor(extract(epoch from clock_timestamp()) * 1000))::bigint")
  return Effect.all([
    sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_keys_look`)}(
        p_queue text, p_now bigint, p_max integer, p_page integer)
      RETURNS json LANGUAGE plpgsql VOLATILE
      SET plan_cache_mode = force_generic_plan AS $$
      DECLARE v_head json; v_now bigint; v_paused integer; v_out json;
      BEGIN
        PERFORM set_config('idle_in_transaction_session_timeout', '5s', true);
        SELECT row_to_json(h) INTO v_head FROM (SELECT ${columns} FROM ${keys}
          WHERE queue = p_queue AND key = '' FOR UPDATE) h;
        IF v_head IS NULL THEN RETURN NULL; END IF;
        v_now := coalesce(p_now, ${nowMs});
        SELECT paused INTO v_paused FROM ${sql(tableOf(store.prefix))} WHERE name = p_queue;
        IF coalesce(v_paused, 0) <> 0 THEN RETURN json_build_object('head', v_head, 'now', v_now, 'paused', 1); END IF;
        WITH
          ledger AS (DELETE FROM ${sql(chargesTable(store.prefix))} WHERE queue = p_queue
            RETURNING key, vtime, leased, held, tokens, at),
          loaded AS (SELECT k.* FROM (SELECT DISTINCT key FROM ledger) l
            CROSS JOIN LATERAL (SELECT ${columns} FROM ${keys} WHERE queue = p_queue AND key = l.key LIMIT 1) k),
          page AS (SELECT ${columns} FROM ${keys} WHERE queue = p_queue AND idle = 0 AND key <> ''
            ORDER BY vtime, key LIMIT p_page),
          looked AS (SELECT key FROM loaded WHERE idle <> 0 UNION SELECT key FROM page),
          cap AS (SELECT LEAST(p_max, GREATEST(2, ceil((2 * p_max)::numeric / GREATEST(count(*), 1))))::integer AS n
            FROM looked),
          ready AS (SELECT r.*, NULL::bigint AS live FROM looked l CROSS JOIN LATERAL (SELECT ${candidate}
            FROM ${messages} WHERE queue = p_queue AND key = l.key AND visible_at <= v_now
            ORDER BY priority, ${messages}.seq LIMIT (SELECT n FROM cap)) r),
          live AS (SELECT * FROM (SELECT NULL::text AS seq, l.key, (SELECT count(*) FROM ${messages}
              WHERE queue = p_queue AND key = l.key AND receipt_handle IS NOT NULL AND visible_at > v_now) AS live
            FROM looked l) c WHERE live > 0),
          empty AS (SELECT key FROM looked EXCEPT SELECT key FROM ready EXCEPT SELECT key FROM live)
        SELECT json_build_object('head', v_head, 'now', v_now, 'paused', 0,
          'ledger', (SELECT json_agg(ledger) FROM ledger), 'loaded', (SELECT json_agg(loaded) FROM loaded),
          'page', (SELECT json_agg(page ORDER BY vtime, key) FROM page),
          'ready', (SELECT json_agg(x) FROM (SELECT seq, priority, key, leased_at, charged, lease_weight, visible_at, live
            FROM ready UNION ALL SELECT seq, NULL, key, NULL, NULL, NULL, NULL, live FROM live) x),
          'present', (SELECT json_agg(e.key) FROM empty e
            WHERE EXISTS (SELECT 1 FROM ${messages} m WHERE m.queue = p_queue AND m.key = e.key)),
          'unkeyed', (SELECT json_agg(u ORDER BY u.priority, u.seq::bigint) FROM (SELECT ${candidate} FROM ${messages}
            WHERE queue = p_queue AND key IS NULL AND visible_at <= v_now ORDER BY priority, ${messages}.seq
            LIMIT p_max) u),
          'cap', (SELECT n FROM cap)) INTO v_out;
        RETURN v_out;
      END $$`,
    sql`CREATE OR REPLACE FUNCTION ${sql(`${store.prefix}mailbox_keys_lease`)}(
        p_queue text, p_states json, p_lease json, p_guard bigint, p_at bigint, p_visibility bigint, p_receiver text)
      RETURNS SETOF ${messages} LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan
      AS $$
      DECLARE v_at bigint;
      BEGIN
        IF p_states IS NOT NULL THEN
          -- The rows locked first, in a statement of their own: the UPDATE after it (a new snapshot) then finds each
          -- one's latest version by its ctid. In one statement a row another transaction changed meanwhile (an
          -- operator's setKeySettings) had a new ctid its snapshot could not see, and its write-back was lost.
          PERFORM 1 FROM json_array_elements(p_states) AS v
            CROSS JOIN LATERAL (SELECT 1 FROM ${keys} WHERE queue = p_queue AND key = v->>0 LIMIT 1 FOR UPDATE) t;
          UPDATE ${keys} k SET vtime = s.vtime, mean = CASE WHEN s.key = '' THEN k.mean ELSE s.mean END,
            leased = s.leased, starts_window = s.sw, starts_used = s.su, tokens_window = s.tw, tokens_used = s.tu,
            idle = s.idle
          FROM (SELECT v->>0 AS key, (v->>1)::float8 AS vtime, (v->>2)::float8 AS mean, (v->>3)::float8 AS leased,
            (v->>4)::bigint AS sw, (v->>5)::bigint AS su, (v->>6)::bigint AS tw, (v->>7)::bigint AS tu,
            (v->>8)::integer AS idle, t.tid FROM json_array_elements(p_states) AS v
            CROSS JOIN LATERAL (SELECT ctid AS tid FROM ${keys} WHERE queue = p_queue AND key = v->>0 LIMIT 1) t) s
          WHERE k.ctid = s.tid;
        END IF;
        IF p_lease IS NULL THEN RETURN; END IF;
        v_at := coalesce(p_at, ${nowMs});
        RETURN QUERY UPDATE ${messages} m SET visible_at = v_at + p_visibility,
          receipt_handle = gen_random_uuid()::text, delivery_count = m.delivery_count + 1,
          received_by = p_receiver, extended_at = NULL,
          leased_at = CASE WHEN p.charged IS NULL THEN NULL ELSE v_at END,
          charged = p.charged, lease_weight = p.weight
        FROM (SELECT (v->>0)::bigint AS seq, (v->>1)::bigint AS charged, (v->>2)::float8 AS weight
          FROM json_array_elements(p_lease) AS v) p
        WHERE m.seq = p.seq AND m.queue = p_queue AND m.visible_at <= p_guard
        RETURNING m.*;
      END $$`
  ], { discard: true })
}

/** What `<prefix>mailbox_keys_look` returns (JSON: BIGINTs as numbers), its parts NULL when empty. */
interface Look {
  readonly head: KeyRow
  readonly now: number
  readonly paused: number
  readonly ledger?: ReadonlyArray<LedgerRow> | null
  readonly loaded?: ReadonlyArray<KeyRow> | null
  readonly page?: ReadonlyArray<KeyRow> | null
  readonly ready?: FirstLook["ready"] | null
  readonly present?: ReadonlyArray<string> | null
  readonly unkeyed?: ReadonlyArray<Candidate> | null
  readonly cap?: number | null
}

/** What PostgreSQL's claim function `<prefix>mailbox_keys_look` reads (after the head: `Look`). */
interface FirstLook {
  readonly ledger: ReadonlyArray<LedgerRow>
  readonly loaded: ReadonlyArray<KeyRow>
  readonly page: ReadonlyArray<KeyRow>
  /** The woken and first page's keys' ready rows (each at most `cap`) and their live leases (`seq` NULL). */
  readonly ready: ReadonlyArray<Candidate & { readonly live: number | string | null }>
  /** Of those keys with nothing ready and no live lease, the ones with a message at all. */
  readonly present: ReadonlyArray<string>
  readonly unkeyed: ReadonlyArray<Candidate>
  readonly cap: number
}

/**
 * The scheduled claim of up to `max` messages of `queue` (see the top comment), on `sql` (the store's client or
 * PostgreSQL's lane), in a write transaction; `at` is the claim's time as SQL (SQLite's), `testNow` the test's
 * time (`undefined`: the database's clock). On PostgreSQL two calls of migration 16's functions
 * (`createClaimFunctions`) do what SQLite's statements do, and the walk between them is the same.
 */
export const claim = (
  store: Store,
  sql: SqlClient.SqlClient,
  queue: string,
  at: Statement.Fragment,
  visibilityMillis: number,
  max: number,
  testNow?: number
): Effect.Effect<ReadonlyArray<Row>, SqlError> => {
  const pg = store.dialect === "pg"
  // A seq as the statements take it back: PostgreSQL's as text (a BIGINT past 2^53 stays exact; `::bigint` reads
  // it), SQLite's as the number its driver gives.
  const seqParam = (seq: number | string): string | number => pg ? String(seq) : Number(seq)
  const keys = sql(keysTable(store.prefix))
  const charges = sql(chargesTable(store.prefix))
  const messages = sql(store.messages)
  const queues = sql(tableOf(store.prefix))
  const columns = sql.literal(keyColumns)
  return Sql.writeTransaction(sql)(Effect.gen(function*() {
    // More keys than the claim takes messages, so a claim of keys at one clock reads one page, not two.
    const pageSize = Math.min(maxPage, Math.max(minPage, Math.ceil(max * 1.25)))
    // PostgreSQL: the queue's turn and all the claim first reads, in one call (`createClaimFunctions`).
    let look: Look | null = null
    if (pg) {
      const [called] = yield* sql<{ look: unknown }>`SELECT ${sql(`${store.prefix}mailbox_keys_look`)}(
        ${queue}::text, ${testNow ?? null}::bigint, ${max}::integer, ${pageSize}::integer) AS look`
      const value = called?.look ?? null
      look = (typeof value === "string" ? JSON.parse(value) : value) as Look | null
    }
    // SQLite: the queue's turn is the file's write lock, which the transaction holds already; the time, the pause.
    const head = pg
      ? (look === null ? [] : [{ ...look.head, now: look.now, paused: look.paused }])
      : yield* sql<KeyRow & { now: number | string; paused: number | string | null }>`SELECT ${columns},
        ${at} AS now, (SELECT paused FROM ${queues} WHERE name = ${queue}) AS paused
      FROM ${keys} WHERE queue = ${queue} AND key = ''`
    if (head.length === 0) {
      // Not scheduled after all (the send that marked it was rolled back): its claims go the plain way again.
      store.scheduled.delete(queue)
      return []
    }
    if (Number(head[0]!.paused ?? 0) !== 0) return []
    const now = Number(head[0]!.now)
    const defaults = stateOf(head[0]!)
    const rows = new Map<string, KeyStateRow>()
    // Keys the ledger woke from idle: the walk's pages (which skip idle rows) do not list them.
    const woken: Array<KeyStateRow> = []
    const inList = (names: ReadonlyArray<string>) =>
      pg ?
        sql`(SELECT json_array_elements_text(${JSON.stringify(names)}::json))` :
        sql`(SELECT value FROM json_each(${JSON.stringify(names)}))`
    // PostgreSQL read the ledger, its keys' rows, the first page and its keys, and the unkeyed head in the look
    // (as the statements below read them); SQLite, in the process, runs those statements.
    const first: FirstLook | undefined = look === null ? undefined : {
      ledger: look.ledger ?? [],
      loaded: look.loaded ?? [],
      page: look.page ?? [],
      ready: look.ready ?? [],
      present: look.present ?? [],
      unkeyed: look.unkeyed ?? [],
      cap: Number(look.cap ?? max)
    }
    // The ledger since the last claim: its keys' rows loaded and set right.
    const entries = first?.ledger ??
      (yield* sql<LedgerRow>`DELETE FROM ${charges} WHERE queue = ${queue}
        RETURNING key, vtime, leased, held, tokens, at`)
    if (entries.length > 0) {
      const named = [...new Set(entries.map((entry) => entry.key))]
      // The names as one JSON array: a ledger can name more keys than a statement takes parameters.
      const loaded = first?.loaded ??
        (yield* sql<KeyRow>`SELECT ${columns} FROM ${keys} WHERE queue = ${queue} AND key IN ${inList(named)}`)
      for (const row of loaded) rows.set(row.key, stateOf(row))
      fold(entries, rows, defaults, woken)
    }
    let V = defaults.vtime
    // The walk: active keys by (clock, name), a page at a time.
    const heap = new MinHeap<KeyStateRow>()
    let tie = 0
    const ready = new Map<string, Array<Candidate>>()
    const live = new Map<string, number>()
    let cursor: { vtime: number; key: string } | undefined
    let exhausted = false
    // Keys whose ready rows were read only up to a cap: more may follow the last one read (`readReady`).
    const more = new Map<string, { priority: number; seq: string | number }>()
    /**
     * Up to `cap` ready messages of each of `names` in claim order, after the given (priority, seq) — an index
     * range per key (PostgreSQL: LATERAL; SQLite: a correlated subquery), so a key's backlog is never read
     * whole (a window over every ready row of a page of keys read 1,172 rows per claim to use 80).
     */
    const readReady = (
      after: ReadonlyArray<readonly [string, number, string | number]>,
      cap: number,
      countLive: boolean
    ) =>
      Effect.gen(function*() {
        const input = JSON.stringify(after)
        // With `countLive`, each key's live leases too, in the same statement (rows with `live` set, no `seq`).
        const liveRows = !countLive ? sql`` : pg
          ? sql` UNION ALL SELECT NULL, NULL, key, NULL, NULL, NULL, NULL, count(*) FROM ${messages}
              WHERE queue = ${queue} AND key IN (SELECT json_array_elements(${input}::json)->>0)
                AND key IS NOT NULL AND receipt_handle IS NOT NULL AND visible_at > ${now}
              GROUP BY key`
          : sql` UNION ALL SELECT NULL, NULL, key, NULL, NULL, NULL, NULL, count(*) FROM ${messages}
              WHERE queue = ${queue} AND key IN (SELECT json_extract(value, '$[0]') FROM json_each(${input}))
                AND key IS NOT NULL AND receipt_handle IS NOT NULL AND visible_at > ${now}
              GROUP BY key`
        const rowsFound = yield* pg
          ? sql<Candidate & { live: number | string | null }>`SELECT m.seq, m.priority, m.key, m.leased_at,
              m.charged, m.lease_weight, m.visible_at, NULL::bigint AS live
            FROM json_array_elements(${input}::json) AS k(v)
            CROSS JOIN LATERAL (SELECT seq, priority, key, leased_at, charged, lease_weight, visible_at
              FROM ${messages} WHERE queue = ${queue} AND key = k.v->>0 AND visible_at <= ${now}
                AND (priority, seq) > ((k.v->>1)::integer, (k.v->>2)::bigint)
              ORDER BY priority, seq LIMIT ${cap}) m${liveRows}`
          : sql<Candidate & { live: number | string | null }>`SELECT m.seq, m.priority, m.key, m.leased_at,
              m.charged, m.lease_weight, m.visible_at, NULL AS live
            FROM json_each(${input}) AS k JOIN ${messages} m ON m.seq IN (
              SELECT i.seq FROM ${messages} i WHERE i.queue = ${queue} AND i.key = json_extract(k.value, '$[0]')
                AND i.visible_at <= ${now}
                AND (i.priority, i.seq) > (json_extract(k.value, '$[1]'), json_extract(k.value, '$[2]'))
              ORDER BY i.priority, i.seq LIMIT ${cap})${liveRows}`
        absorb(after.map(([name]) => name), cap, rowsFound, countLive)
      })
    /** Takes in what `readReady` read of `names` (and their live leases, with `countLive`). */
    const absorb = (
      names: ReadonlyArray<string>,
      cap: number,
      rowsFound: ReadonlyArray<Candidate & { readonly live: number | string | null }>,
      countLive: boolean
    ) => {
      const found: Array<Candidate> = []
      if (countLive) { for (const name of names) live.set(name, 0) }
      for (const row of rowsFound) {
        if (row.seq === null) live.set(row.key!, Number(row.live))
        else found.push(row)
      }
      // Claim order within each key (the statement's order is unspecified).
      found.sort((a, b) =>
        a.key === b.key
          ? (Number(a.priority) - Number(b.priority) || compareSeq(a.seq, b.seq))
          : (a.key! < b.key! ? -1 : 1)
      )
      const counts = new Map<string, number>()
      for (const row of found) {
        const list = ready.get(row.key!) ?? []
        ready.set(row.key!, list)
        list.push(row)
        counts.set(row.key!, (counts.get(row.key!) ?? 0) + 1)
      }
      for (const name of names) {
        if (!ready.has(name)) ready.set(name, [])
        const list = ready.get(name)!
        const last = list[list.length - 1]
        if ((counts.get(name) ?? 0) === cap && last !== undefined) {
          more.set(name, { priority: Number(last.priority), seq: seqParam(last.seq) })
        } else {
          more.delete(name)
        }
      }
    }
    /** Of `names`, those with nothing ready and no live lease that have no message at all (`some`: those that
     * do) go idle: the walk skips them until a send wakes them. */
    const idleEmpty = (names: ReadonlyArray<string>, some: ReadonlySet<string>) => {
      for (const name of names) {
        if (ready.get(name)!.length > 0 || live.get(name) !== 0 || some.has(name)) continue
        const row = rows.get(name)!
        row.idle = true
        row.changed = true
      }
    }
    /**
     * What the walk needs of `batch`'s keys, in three statements for all of them: each one's first ready
     * messages in claim order (a share of `max`: the walk reads more of a key that runs out), its live leases,
     * and — for one with nothing ready — whether it has any message at all (none: idle until a send wakes it).
     */
    const lookUp = (batch: ReadonlyArray<KeyStateRow>) =>
      Effect.gen(function*() {
        const names = batch.map((row) => row.key).filter((name) => !ready.has(name))
        if (names.length === 0) return
        const cap = Math.min(max, Math.max(2, Math.ceil((2 * max) / names.length)))
        yield* readReady(names.map((name) => [name, lowestPriority, seqParam(-1)] as const), cap, true)
        const empty = names.filter((name) => ready.get(name)!.length === 0 && live.get(name) === 0)
        if (empty.length === 0) return
        const any = yield* sql<{ key: string }>`SELECT DISTINCT key FROM ${messages}
          WHERE queue = ${queue} AND key IN ${inList(empty)}`
        idleEmpty(empty, new Set(any.map((row) => row.key)))
      })
    /** A page of the walk read: its keys on the heap (returned), the walk's cursor past them. */
    const takePage = (page: ReadonlyArray<KeyRow>) => {
      if (page.length < pageSize) exhausted = true
      const batch: Array<KeyStateRow> = []
      for (const found of page) {
        cursor = { vtime: Number(found.vtime), key: found.key }
        // A row set right by the ledger is the one to use (its clock moved).
        const row = rows.get(found.key) ?? stateOf(found)
        rows.set(row.key, row)
        batch.push(row)
        heap.push(Math.max(row.vtime, V), row, tie++)
      }
      return batch
    }
    const loadPage = Effect.gen(function*() {
      const page = yield* sql<KeyRow>`SELECT ${columns} FROM ${keys} WHERE queue = ${queue} AND idle = 0
        AND key <> ''${
        cursor === undefined ?
          sql`` :
          sql` AND (vtime, key) > (${cursor.vtime}, ${cursor.key})`
      }
        ORDER BY vtime, key LIMIT ${pageSize}`
      yield* lookUp(takePage(page))
    })
    for (const row of woken) heap.push(Math.max(row.vtime, V), row, tie++)
    if (first === undefined) {
      if (woken.length > 0) yield* lookUp(woken)
      yield* loadPage
    } else {
      // The first look read the woken keys and the first page (as `lookUp` would, one cap for them all).
      const batch = takePage(first.page)
      const names = [...new Set([...woken, ...batch].map((row) => row.key))]
      absorb(names, first.cap, first.ready, true)
      idleEmpty(names, new Set(first.present))
    }
    // The queue's unkeyed messages in claim order (a queue that schedules by key can have them too).
    const unkeyed = first?.unkeyed ??
      (yield* sql<Candidate>`SELECT seq, priority, key, leased_at, charged, lease_weight, visible_at
        FROM ${messages} WHERE queue = ${queue} AND key IS NULL AND visible_at <= ${now}
        ORDER BY priority, seq LIMIT ${max}`)
    let nextUnkeyed = 0
    const picks: Array<Pick> = []
    const corrections: Array<Candidate> = []
    // The keys this claim passed over, and why (the metric `Scheduling.keysHeldBack`).
    const held = { limit: new Set<string>(), starts: new Set<string>(), tokens: new Set<string>() }
    while (picks.length < max) {
      let fair: { row: KeyStateRow; candidate: Candidate; weight: number; expected: number } | undefined
      while (fair === undefined) {
        // The next page when the best key so far might be beaten by one not yet loaded (every key is looked at
        // before a claim gives up: a key with ready work is never left behind others that cannot take any).
        if (!exhausted && (heap.size === 0 || heap.peekKey()! > (cursor?.vtime ?? -Infinity))) {
          yield* loadPage
          continue
        }
        if (heap.size === 0) break
        const row = heap.pop()!
        const settings = effective(row, defaults)
        // Rates: a key over its start rate or its token budget waits for its window to turn.
        if (settings.startLimit !== undefined && settings.startInterval !== undefined) {
          const window = Scheduling.windowStart(now, settings.startInterval)
          if (window > row.startsWindow) {
            row.startsWindow = window
            row.startsUsed = 0
            row.changed = true
          }
          if (row.startsUsed >= settings.startLimit) {
            held.starts.add(row.key)
            continue
          }
        }
        if (settings.tokenLimit !== undefined && settings.tokenInterval !== undefined) {
          const window = Scheduling.windowStart(now, settings.tokenInterval)
          const used = window === row.tokensWindow ? row.tokensUsed : 0
          if (used >= settings.tokenLimit) {
            held.tokens.add(row.key)
            continue
          }
        }
        let waiting = ready.get(row.key) ?? []
        const after = more.get(row.key)
        if (waiting.length === 0 && after !== undefined) {
          // Read up to a cap and used up: its next ready rows, as many as the claim still takes.
          yield* readReady([[row.key, after.priority, after.seq]], max - picks.length, false)
          waiting = ready.get(row.key) ?? []
        }
        if (waiting.length === 0) continue
        if (settings.limit !== undefined && (live.get(row.key) ?? 0) >= settings.limit) {
          held.limit.add(row.key)
          continue
        }
        // Whole milliseconds: the lease's `charged` is an integer column.
        const expected = Math.max(1, Math.round(row.mean ?? visibilityMillis))
        fair = { row, candidate: waiting[0]!, weight: settings.weight, expected }
      }
      const unkeyedHead = unkeyed[nextUnkeyed]
      if (fair !== undefined && (unkeyedHead === undefined || compareSeq(fair.candidate.seq, unkeyedHead.seq) < 0)) {
        const { candidate, expected, row, weight } = fair
        ready.get(row.key)!.shift()
        if (candidate.leased_at !== null) corrections.push(candidate)
        const clock = Math.max(row.vtime, V)
        V = Math.max(V, clock)
        row.vtime = clock + expected / weight
        row.leased += expected
        row.changed = true
        if (row.startLimit !== undefined || defaults.startLimit !== undefined) row.startsUsed++
        live.set(row.key, (live.get(row.key) ?? 0) + 1)
        picks.push({ seq: seqParam(candidate.seq), charged: expected, weight })
        heap.push(row.vtime, row, tie++)
        continue
      }
      if (fair !== undefined) heap.push(Math.max(fair.row.vtime, V), fair.row, tie++)
      if (unkeyedHead === undefined) break
      nextUnkeyed++
      picks.push({ seq: seqParam(unkeyedHead.seq), charged: null, weight: null })
    }
    // A re-claimed row whose last lease ran out: its key is set right for that lease (held until it expired).
    for (const candidate of corrections) {
      const row = rows.get(candidate.key!)
      if (row === undefined || candidate.charged === null || candidate.lease_weight === null) continue
      const length = Number(candidate.visible_at) - Number(candidate.leased_at)
      row.vtime += (length - Number(candidate.charged)) / Number(candidate.lease_weight)
      row.leased += length - Number(candidate.charged)
      row.changed = true
    }
    // The keys' rows written back (their own columns only: settings are the operator's), and the queue's clock.
    const changed = [...rows.values()].filter((row) => row.changed).sort((a, b) => a.key < b.key ? -1 : 1)
    let states: string | null = null
    if (changed.length > 0 || V !== defaults.vtime) {
      states = JSON.stringify([
        ...changed.map((row) => [
          row.key,
          row.vtime,
          row.mean ?? null,
          row.leased,
          row.startsWindow,
          row.startsUsed,
          row.tokensWindow,
          row.tokensUsed,
          row.idle ? 1 : 0
        ]),
        ...(V !== defaults.vtime ? [["", V, null, 0, 0, 0, 0, 0, 0]] : [])
      ])
      // PostgreSQL writes them with the lease (`<prefix>mailbox_keys_lease`). MATERIALIZED: without it SQLite's
      // planner (no statistics) walks the queue's key rows and scans the array for each, quadratic in the keys a
      // claim changes (a first claim after 2,000 fresh keys: 4 s; 10 ms with it, each key row found by its
      // primary key).
      if (!pg) {
        yield* sql`WITH s AS MATERIALIZED (SELECT json_extract(value, '$[0]') AS key,
            json_extract(value, '$[1]') AS vtime, json_extract(value, '$[2]') AS mean,
            json_extract(value, '$[3]') AS leased, json_extract(value, '$[4]') AS sw, json_extract(value, '$[5]') AS su,
            json_extract(value, '$[6]') AS tw, json_extract(value, '$[7]') AS tu, json_extract(value, '$[8]') AS idle
            FROM json_each(${states}))
          UPDATE ${keys} SET vtime = s.vtime, mean = CASE WHEN s.key = '' THEN ${keys}.mean ELSE s.mean END,
            leased = s.leased, starts_window = s.sw, starts_used = s.su, tokens_window = s.tw, tokens_used = s.tu,
            idle = s.idle
          FROM s WHERE ${keys}.queue = ${queue} AND ${keys}.key = s.key`
      }
    }
    yield* Scheduling.countHeldBack(queue, held)
    // The queue's gauges, at most every `gaugeEveryMillis` (or when the clock went back), with this claim's leases.
    const gauge = Effect.gen(function*() {
      const gaugedAt = store.gaugesAt.get(queue)
      if (gaugedAt !== undefined && now - gaugedAt < Scheduling.gaugeEveryMillis && now >= gaugedAt) return
      store.gaugesAt.set(queue, now)
      const active = yield* sql<{ n: number | string }>`SELECT count(*) AS n FROM ${keys}
        WHERE queue = ${queue} AND idle = 0 AND key <> ''`
      const leases = store.keyMetrics.has(queue)
        ? new Map(
          (yield* sql<{ key: string; n: number | string }>`SELECT key, count(*) AS n FROM ${messages}
            WHERE queue = ${queue} AND key IS NOT NULL AND receipt_handle IS NOT NULL AND visible_at > ${now}
            GROUP BY key`).map((row) => [row.key, Number(row.n)] as const)
        )
        : undefined
      let shown = store.gaugedKeys.get(queue)
      if (shown === undefined) store.gaugedKeys.set(queue, shown = new Set())
      yield* Scheduling.setGauges(queue, Number(active[0]?.n ?? 0), leases, shown)
    })
    // PostgreSQL: the keys' rows written back and the picks leased, in one call (`createClaimFunctions`).
    const leaseFn = (lease: string | null) =>
      sql<Row>`SELECT seq, body, receipt_handle, delivery_count, enqueued_at, reply_to, traceparent, key, priority
        FROM ${sql(`${store.prefix}mailbox_keys_lease`)}(${queue}::text, ${states}::json, ${lease}::json,
          ${now}::bigint, ${testNow ?? null}::bigint, ${visibilityMillis}::bigint, ${store.receiver}::text)`
    if (picks.length === 0) {
      if (pg && states !== null) yield* leaseFn(null)
      yield* gauge
      return []
    }
    const order = new Map(picks.map((pick, index) => [String(pick.seq), index]))
    // The lease runs from when it is made (SQLite: this statement's time; PostgreSQL: the lease function's), not
    // from `now`: a claim that read its time and then waited its turn behind another (one stopped inside its claim
    // holds it up to 5 s) handed out leases already spent — the acknowledgement refused, the message claimed again
    // while it ran (the PostgreSQL soak's unexplained duplicates at 1ccc8f5). The guard stays at `now`.
    const lease = JSON.stringify(picks.map((pick) => [pick.seq, pick.charged, pick.weight]))
    const claimed = yield* pg
      ? leaseFn(lease)
      : sql<Row>`UPDATE ${messages} SET visible_at = ${at} + ${visibilityMillis},
          receipt_handle = lower(hex(randomblob(16))), delivery_count = delivery_count + 1,
          received_by = ${store.receiver}, extended_at = NULL,
          leased_at = CASE WHEN json_extract(p.value, '$[1]') IS NULL THEN NULL ELSE ${at} END,
          charged = json_extract(p.value, '$[1]'), lease_weight = json_extract(p.value, '$[2]')
        FROM json_each(${lease}) AS p
        WHERE ${messages}.seq = json_extract(p.value, '$[0]') AND ${messages}.queue = ${queue}
          AND ${messages}.visible_at <= ${now}
        RETURNING ${messages}.seq, ${messages}.body, ${messages}.receipt_handle, ${messages}.delivery_count,
          ${messages}.enqueued_at, ${messages}.reply_to, ${messages}.traceparent, ${messages}.key,
          ${messages}.priority`
    yield* gauge
    // In the order picked (the batcher keeps it: `Row.order`).
    return claimed.map((row) => ({ ...row, order: order.get(String(row.seq)) ?? 0 }))
  }))
}

/**
 * Sets `key`'s settings in `queue` (`undefined`: the queue's defaults), each field given (`null` clears it,
 * absent leaves it); the queue becomes scheduled. Checked already (`Scheduling.validateSettings`). Takes effect
 * on the next claim.
 */
export const setSettings = (
  store: Store,
  queue: string,
  key: string | undefined,
  settings: Scheduling.StoredSettings
): Effect.Effect<void, SqlError> => {
  const { sql } = store
  const table = sql(keysTable(store.prefix))
  const columns: ReadonlyArray<readonly [keyof Scheduling.StoredSettings, string]> = [
    ["limit", "max_leases"],
    ["weight", "weight"],
    ["startLimit", "start_limit"],
    ["startIntervalMillis", "start_interval"],
    ["tokenLimit", "token_limit"],
    ["tokenIntervalMillis", "token_interval"]
  ]
  const given = columns.filter(([field]) => settings[field] !== undefined)
  const name = key ?? queueRow
  return Sql.writeTransaction(sql)(Effect.all([
    markScheduled(store, queue),
    sql`INSERT INTO ${table} (queue, key, vtime, idle) VALUES (${queue}, ${name},
      (SELECT vtime FROM ${table} q WHERE q.queue = ${queue} AND q.key = ''), 0)
      ON CONFLICT (queue, key) DO NOTHING`,
    given.length === 0 ?
      Effect.void :
      sql`UPDATE ${table} SET ${
        sql.csv(given.map(([field, column]) => sql`${sql(column)} = ${settings[field] ?? null}`))
      } WHERE queue = ${queue} AND key = ${name}`
  ], { discard: true }))
}

/** What `list` reports of a queue's keys at most. */
export const listLimit = 10_000

/**
 * The keys of `queue` with unsettled messages (at most `listLimit`, most pending first), at `at` (SQL time):
 * ready, in flight, pending, settings in force, leased time and share clock, rate windows.
 */
export const list = (
  store: Store,
  queue: string,
  at: Statement.Fragment
): Effect.Effect<ReadonlyArray<Scheduling.KeyState>, SqlError> =>
  Effect.gen(function*() {
    const { sql } = store
    const keys = sql(keysTable(store.prefix))
    const counts = yield* sql<
      {
        key: string
        pending: number | string
        ready: number | string
        in_flight: number | string
        now: number | string
      }
    >`SELECT key, count(*) AS pending,
        sum(CASE WHEN visible_at <= ${at} THEN 1 ELSE 0 END) AS ready,
        sum(CASE WHEN receipt_handle IS NOT NULL AND visible_at > ${at} THEN 1 ELSE 0 END) AS in_flight,
        ${at} AS now
      FROM ${sql(store.messages)} WHERE queue = ${queue} AND key IS NOT NULL
      GROUP BY key ORDER BY count(*) DESC, key LIMIT ${listLimit}`
    if (counts.length === 0) return []
    const rows = yield* sql<KeyRow>`SELECT ${sql.literal(keyColumns)} FROM ${keys} WHERE queue = ${queue}
      AND (key = '' OR key IN ${sql.in(counts.map((row) => row.key))})`
    const byKey = new Map(rows.map((row) => [row.key, stateOf(row)]))
    const defaults = byKey.get(queueRow)
    // What the ledger holds for them, folded here as the next claim will (nothing is written).
    const pending = yield* sql<
      {
        key: string
        vtime: number | string
        leased: number | string
        held: number | string | null
        tokens: number | string | null
        at: number | string
      }
    >`SELECT key, vtime, leased, held, tokens, at FROM ${sql(chargesTable(store.prefix))} WHERE queue = ${queue}
      ORDER BY id`
    const none = stateOf({
      key: "",
      max_leases: null,
      weight: null,
      start_limit: null,
      start_interval: null,
      token_limit: null,
      token_interval: null,
      vtime: 0,
      mean: null,
      leased: 0,
      starts_window: 0,
      starts_used: 0,
      tokens_window: 0,
      tokens_used: 0,
      idle: 0
    })
    fold(pending, byKey, defaults ?? none, [])
    return counts.map((count): Scheduling.KeyState => {
      const now = Number(count.now)
      const row = byKey.get(count.key) ?? { ...none, key: count.key }
      const settings = effective(row, defaults ?? none)
      const window = (limit: number | undefined, per: number | undefined, start: number, used: number) =>
        limit === undefined || per === undefined
          ? undefined
          : { used: Scheduling.windowStart(now, per) === start ? used : 0, count: limit, perMillis: per }
      return {
        key: count.key,
        ready: Number(count.ready),
        inFlight: Number(count.in_flight),
        pending: Number(count.pending),
        limit: settings.limit,
        weight: settings.weight,
        leasedMillis: row.leased,
        vtime: row.vtime,
        starts: window(settings.startLimit, settings.startInterval, row.startsWindow, row.startsUsed),
        tokens: window(settings.tokenLimit, settings.tokenInterval, row.tokensWindow, row.tokensUsed)
      }
    })
  })
