/**
 * The mailbox's statements: one `Statements` interface, one set per dialect
 * (`sqlite`, `pg`) and the statements both share. Every statement takes a
 * `Now`: the database's clock, read as it runs, or a test's `TestClock` time.
 */
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Sql from "../../sql/common.js"
import * as Keys from "./keys.js"
import { tableOf } from "./queues.js"
import type { Row, Store } from "./store.js"

/**
 * When a statement runs. `undefined`: the database's own clock, read by the statement as it runs — so every
 * process judges visibility by one clock (PostgreSQL serving several machines, whose clocks drift), and on
 * SQLite the time is taken once the statement has the file, not before it waited for the lock. A number:
 * the time a test's `TestClock` gives, so tests drive expiry on every backend alike (see `nowOf`).
 */
export type Now = number | undefined

/**
 * The `Now` a mailbox's statements run with: the database's clock, unless the mailbox runs under
 * `TestClock` — then the test's time, so `TestClock.adjust` moves visibility on SQLite and PostgreSQL as it
 * does in memory. A clock that is merely wrong (a machine running ahead) is still the database's business.
 */
export const nowOf = (clock: Clock.Clock): () => Now => Sql.testTime(clock) ?? (() => undefined)

export interface Statements {
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
  /**
   * Deletes the queue's messages, and their journals unless `journals` is false (the table is not there); the
   * journal of a dead letter stays with it.
   */
  readonly purge: (queue: string, journals?: boolean) => Effect.Effect<number, SqlError>
  /** `now` as a SQL expression, for the operator's queries. */
  readonly at: (now: Now) => Statement.Fragment
}

/** A message to insert: its encoded body, how long it stays invisible, where its replies go, its trace. */
export interface SendItem {
  readonly body: string
  readonly delayMillis: number
  readonly replyTo: string | null
  /** The sender's W3C trace context; absent (not even the key) without a span, to keep the batch's JSON lean. */
  readonly traceparent?: string
  /** The message's key (scheduling.ts); absent without one. */
  readonly key?: string
  /** The message's priority; absent when the sender gave neither key nor priority (0). */
  readonly priority?: number
}

/** A delivery to acknowledge, with the reply to insert in the same transaction. */
export interface SettleItem {
  readonly seq: string
  readonly handle: string
  readonly reply: { readonly queue: string; readonly body: string; readonly traceparent?: string } | undefined
  /**
   * The delivery loaded a journal or recorded steps (`journal.ts`), or is a redelivery (an earlier delivery may
   * have), and did not keep it: its journal goes with the acknowledgement. Absent (not even the key) otherwise, so
   * a batch with none pays nothing.
   */
  readonly journal?: true
}

/** The statement set of the store's dialect. */
export const statements = (store: Store): Statements =>
  withScheduling(store, store.dialect === "pg" ? pg(store) : sqlite(store))

/**
 * The claim of a queue scheduled by key (keys.ts) goes through the scheduled claim; the plain claim gives such
 * a queue nothing, and an empty plain claim asks once whether the queue has become scheduled (another
 * process may have sent it a keyed message): a queue that never used a key pays nothing more while it has work.
 */
const withScheduling = (store: Store, plain: Statements): Statements => {
  const scheduled = (queue: string, now: Now, visibilityMillis: number, max: number) =>
    // On the pool, not PostgreSQL's lane: the claim waits its turn on the queue's row, and a process stopped
    // inside its claim must not hold every other process's settles and extensions (on their lanes) behind it.
    Keys.claim(store, store.sql, queue, plain.at(now), visibilityMillis, max, now)
  return {
    ...plain,
    claim: (queue, now, visibilityMillis, max) =>
      store.scheduled.has(queue)
        ? scheduled(queue, now, visibilityMillis, max)
        : Effect.flatMap(plain.claim(queue, now, visibilityMillis, max), (rows) =>
          rows.length > 0
            ? Effect.succeed(rows)
            : Effect.flatMap(
              // On PostgreSQL on the lane, as the claim: the application may hold every pooled connection.
              store.dialect === "pg"
                ? store.onLane((lane) => Keys.isScheduled(store, queue, lane))
                : Keys.isScheduled(store, queue),
              (yes) => yes ? scheduled(queue, now, visibilityMillis, max) : Effect.succeed(rows)
            ))
  }
}

/** The keys of a send's items, when any item has a key or a priority (the queue is scheduled before they go in). */
const placed = (items: ReadonlyArray<SendItem>): ReadonlyArray<string> | undefined => {
  let keys: Array<string> | undefined
  for (const item of items) {
    if (item.key !== undefined) (keys ??= []).push(item.key)
    else if (item.priority !== undefined) keys ??= []
  }
  return keys
}

/** `now` as a SQL expression: the database's clock, or a given time (typed on PostgreSQL, so it can be added to). */
const atOf = (store: Store) => {
  const { sql } = store
  const databaseNow = Sql.databaseNow(sql)
  const pg = store.dialect === "pg"
  return (now: Now): Statement.Fragment => now === undefined ? databaseNow : pg ? sql`${now}::bigint` : sql`${now}`
}

const one = (rows: ReadonlyArray<unknown>) => rows.length > 0

/** The seqs of the items whose journal goes with them, as a PostgreSQL array literal; `undefined` when none. */
const journalSeqs = (items: ReadonlyArray<SettleItem>): string | undefined => {
  let seqs: Array<string> | undefined
  for (const item of items) if (item.journal === true) (seqs ??= []).push(item.seq)
  return seqs === undefined ? undefined : arrayLiteral(seqs)
}

/** Each reply's trace context for PostgreSQL's settle, or `null` (no array) when none has one: the usual case. */
const traceparentsOf = (items: ReadonlyArray<SettleItem>): string | null =>
  items.some((item) => item.reply?.traceparent !== undefined)
    ? arrayLiteral(items.map((item) => item.reply?.traceparent ?? null))
    : null

/** An element PostgreSQL's array syntax reads as written: no quoting needed (and not the word NULL). */
const plainElement = /^[0-9A-Za-z_.:-]+$/

/**
 * A PostgreSQL array literal of `values` (`{a,"b c",NULL}`), cast by the statement (`::text[]`, `::bigint[]`):
 * one string parameter. The driver would build the same text from an array, quoting and escaping every element
 * through a regular expression; ids, receipt handles and queue names rarely need it, and pay nothing here.
 */
export const arrayLiteral = (values: ReadonlyArray<string | null>): string => {
  let text = "{"
  for (let i = 0; i < values.length; i++) {
    const value = values[i]!
    if (i > 0) text += ","
    if (value === null) text += "NULL"
    else if (plainElement.test(value) && value.toUpperCase() !== "NULL") text += value
    else text += `"${value.replace(/[\\"]/g, "\\$&")}"`
  }
  return text + "}"
}

/** The statements both dialects run alike, on the store's client. */
const shared = (store: Store, at: (now: Now) => Statement.Fragment) => {
  const { sql } = store
  const messages = sql(store.messages)
  const deadLetters = sql(store.deadLetters)
  const journal = sql(store.journal)
  const queues = sql(tableOf(store.prefix))
  const inWriteTransaction = Sql.writeTransaction(sql)
  return {
    at,
    // A keyed lease that ends charges its key what it held (keys.ts: the ledger, in the same transaction).
    release: (seq, handle, now) =>
      inWriteTransaction(Effect.zipRight(
        Keys.chargeEnded(
          store,
          at(now),
          sql`FROM ${messages} m WHERE m.seq = ${Number(seq)} AND m.receipt_handle = ${handle}`,
          { held: false }
        ),
        sql`UPDATE ${messages} SET visible_at = ${at(now)}, receipt_handle = NULL, delivery_count = delivery_count - 1,
          leased_at = NULL WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}`
      )).pipe(Effect.asVoid),
    isCurrent: (seq, handle, now) =>
      Effect.map(
        sql`SELECT seq FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}
          AND visible_at > ${at(now)}`,
        one
      ),
    deadLetter: (seq, handle, now, errorTag, error) =>
      inWriteTransaction(Effect.all([
        sql`INSERT INTO ${deadLetters}
            (id, queue, body, reply_to, delivery_count, enqueued_at, dead_lettered_at, error_tag, error, traceparent,
              key, priority)
          SELECT CAST(seq AS TEXT), queue, body, reply_to, delivery_count, enqueued_at, ${
          at(now)
        }, ${errorTag}, ${error}, traceparent, key, priority
          FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}
          ON CONFLICT (id) DO NOTHING`,
        Keys.chargeEnded(
          store,
          at(now),
          sql`FROM ${messages} m WHERE m.seq = ${Number(seq)} AND m.receipt_handle = ${handle}
            AND m.visible_at > ${at(now)}`,
          { held: true }
        ),
        sql`DELETE FROM ${messages} WHERE seq = ${Number(seq)} AND receipt_handle = ${handle}`
      ], { discard: true })),
    nextVisibleIn: (queue, now) =>
      Effect.map(
        // Every row of the queue, visible ones too: a row that became visible since the claim looked (its
        // visibility ran out in between) gives a time <= 0, so the receiver looks again at once instead of
        // sleeping a whole poll interval beside a visible message.
        // A paused queue has nothing coming: its receivers sleep their poll interval (or until woken by a resume).
        // A scheduled queue (keys.ts) counts only rows still to come: a ready row its claim held back (a key at
        // its limit, over its rate) is no reason to look again at once — its receivers poll.
        store.scheduled.has(queue)
          ? sql<{ next: number | string | null }>`SELECT min(visible_at) - ${at(now)} AS next FROM ${messages}
            WHERE queue = ${queue} AND visible_at > ${at(now)}
              AND NOT EXISTS (SELECT 1 FROM ${queues} WHERE name = ${queue} AND paused <> 0)`
          : sql<{ next: number | string | null }>`SELECT min(visible_at) - ${at(now)} AS next FROM ${messages}
          WHERE queue = ${queue}
            AND NOT EXISTS (SELECT 1 FROM ${queues} WHERE name = ${queue} AND paused <> 0)`,
        (rows) => rows[0]?.next === null || rows[0]?.next === undefined ? undefined : Number(rows[0].next)
      ),
    count: (queue) =>
      Effect.map(
        sql<{ n: number | string }>`SELECT count(*) AS n FROM ${messages} WHERE queue = ${queue}`,
        (rows) => Number(rows[0]?.n ?? 0)
      ),
    purge: (queue, journals = true) =>
      Effect.map(
        // The purged messages' journals go with them (a database before migration 11 has none: `journals` false),
        // and so does any of the queue's journals whose message was already gone without one; a dead letter's
        // stays with it. The second statement sees a message sent since the first, so its journal stays too.
        journals
          ? inWriteTransaction(Effect.zipLeft(
            sql`DELETE FROM ${messages} WHERE queue = ${queue} RETURNING seq`,
            sql`DELETE FROM ${journal} WHERE queue = ${queue}
              AND NOT EXISTS (SELECT 1 FROM ${messages} m WHERE m.seq = ${journal}.message_seq)
              AND NOT EXISTS (SELECT 1 FROM ${deadLetters} d WHERE d.id = CAST(${journal}.message_seq AS TEXT))`
          ))
          : sql`DELETE FROM ${messages} WHERE queue = ${queue} RETURNING seq`,
        (rows) => rows.length
      )
  } satisfies Partial<Statements>
}

/**
 * SQLite: every write in a write transaction that takes the file's lock first (`BEGIN IMMEDIATE`), so a
 * claim reads the time once it has the file and never meets a lock upgrade it cannot wait for.
 */
const sqlite = (store: Store): Statements => {
  const { sql } = store
  const messages = sql(store.messages)
  // A paused queue (queues.ts) gives nothing: one primary-key look-up per claim.
  const queues = sql(tableOf(store.prefix))
  const inWriteTransaction = Sql.writeTransaction(sql)
  const at = atOf(store)
  return {
    ...shared(store, at),
    claim: (queue, now, visibilityMillis, max) =>
      // A write transaction (the file's lock first), so the time is read once the claim has the file.
      inWriteTransaction(
        sql<Row>`UPDATE ${messages} SET visible_at = ${at(now)} + ${visibilityMillis},
            receipt_handle = lower(hex(randomblob(16))), delivery_count = delivery_count + 1,
            received_by = ${store.receiver}, extended_at = NULL
          WHERE seq IN (SELECT seq FROM ${messages} WHERE queue = ${queue} AND visible_at <= ${at(now)}
            AND NOT EXISTS (SELECT 1 FROM ${queues} WHERE name = ${queue} AND paused <> 0)
            AND NOT EXISTS (SELECT 1 FROM ${sql(Keys.keysTable(store.prefix))} WHERE queue = ${queue} AND key = '')
            ORDER BY visible_at, seq LIMIT ${max})
          RETURNING seq, body, receipt_handle, delivery_count, enqueued_at, reply_to, traceparent`
      ),
    insert: (queue, items, now, maxSize) => {
      // One statement for the batch, like PostgreSQL's; the items go in in order, so their ids ascend in it.
      const room = maxSize === undefined
        ? sql``
        : sql`WHERE key < ${maxSize} - (SELECT count(*) FROM ${messages} WHERE queue = ${queue})`
      const keys = placed(items)
      const insert = sql<{ seq: number }>`INSERT INTO ${messages}
          (queue, body, visible_at, enqueued_at, reply_to, traceparent, key, priority)
        SELECT ${queue}, json_extract(value, '$[0]'), ${at(now)} + json_extract(value, '$[1]'), ${at(now)},
          json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'),
          coalesce(json_extract(value, '$[5]'), 0)
        FROM json_each(${
        JSON.stringify(items.map((item) =>
          item.key !== undefined || item.priority !== undefined
            ? [
              item.body,
              item.delayMillis,
              item.replyTo,
              item.traceparent ?? null,
              item.key ?? null,
              item.priority ?? 0
            ]
            : item.traceparent === undefined
            ? [item.body, item.delayMillis, item.replyTo]
            : [item.body, item.delayMillis, item.replyTo, item.traceparent]
        ))
      }) ${room}
        ORDER BY key
        RETURNING seq`
      return Effect.map(
        keys === undefined ? insert : inWriteTransaction(Effect.zipRight(Keys.prepareSend(store, queue, keys), insert)),
        (rows) => {
          const ids = rows.map((row) => row.seq).sort((a, b) => a - b)
          return items.map((_, index) => index < ids.length ? String(ids[index]) : undefined)
        }
      )
    },
    settle: (items, now) =>
      inWriteTransaction(Effect.gen(function*() {
        // One transaction and two statements for the batch (a statement costs more than a row): the deletes,
        // whose first write takes the write lock at once, then the replies of the deliveries that were current.
        const acked = yield* sql<
          {
            seq: number
            receipt_handle: string
            queue: string
            key: string | null
            leased_at: number | null
            charged: number | null
            lease_weight: number | null
            now: number
          }
        >`DELETE FROM ${messages}
          WHERE visible_at > ${at(now)} AND (seq, receipt_handle) IN (
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(${
          JSON.stringify(items.map((item) => [Number(item.seq), item.handle]))
        }))
          RETURNING seq, receipt_handle, queue, key, leased_at, charged, lease_weight, ${at(now)} AS now`
        // Keyed leases charge their keys what they held (keys.ts: the ledger), in the same transaction.
        const ended = acked.filter((row) => row.key !== null && row.leased_at !== null)
        if (ended.length > 0) {
          yield* sql`INSERT INTO ${sql(Keys.chargesTable(store.prefix))} (queue, key, vtime, leased, held, tokens, at)
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
              json_extract(value, '$[3]'), json_extract(value, '$[4]'), NULL, json_extract(value, '$[5]')
            FROM json_each(${
            JSON.stringify(ended.map((row) => {
              const held = row.now - row.leased_at!
              const owed = held - (row.charged ?? 0)
              return [row.queue, row.key, owed / (row.lease_weight ?? 1), owed, held, row.now]
            }))
          })`
        }
        const current = new Set(acked.map((row) => `${row.seq} ${row.receipt_handle}`))
        const settled = new Map<string, string | undefined>()
        const replying: Array<
          { readonly seq: string; readonly queue: string; readonly body: string; readonly traceparent?: string }
        > = []
        let journals: Array<number> | undefined
        for (const item of items) {
          // Only the deliveries whose handle was current (a message is once per statement: `settleRounds`).
          if (!current.has(`${item.seq} ${item.handle}`)) continue
          if (item.journal === true) (journals ??= []).push(Number(item.seq))
          if (item.reply === undefined) settled.set(item.seq, undefined)
          else replying.push({ seq: item.seq, ...item.reply })
        }
        // The journals of the acknowledged deliveries that had one go in the same transaction (none: no statement).
        if (journals !== undefined) {
          yield* sql`DELETE FROM ${sql(store.journal)}
            WHERE message_seq IN (SELECT value FROM json_each(${JSON.stringify(journals)}))`
        }
        if (replying.length === 0) return settled
        // Inserted in the array's order, so the new ids ascend in that order (RETURNING's order is unspecified).
        const replies = yield* sql<{ seq: number }>`INSERT INTO ${messages}
            (queue, body, visible_at, enqueued_at, traceparent)
          SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), ${at(now)}, ${at(now)},
            json_extract(value, '$[2]')
          FROM json_each(${
          JSON.stringify(
            replying.map((reply) =>
              reply.traceparent === undefined ? [reply.queue, reply.body] : [reply.queue, reply.body, reply.traceparent]
            )
          )
        }) ORDER BY key
          RETURNING seq`
        const ids = replies.map((row) => row.seq).sort((a, b) => a - b)
        replying.forEach((reply, index) => settled.set(reply.seq, String(ids[index])))
        return settled
      })),
    setVisibility: (seq, handle, now, timeoutMillis, keepHandle) => {
      // A keyed lease charges its key (keys.ts): an extension up to twice its age, a nack what it held.
      const source = sql`FROM ${messages} m WHERE m.seq = ${Number(seq)} AND m.receipt_handle = ${handle}
        AND m.visible_at > ${at(now)}`
      return Effect.map(
        inWriteTransaction(Effect.zipRight(
          keepHandle ? Keys.chargeExtended(store, at(now), source) : Keys.chargeEnded(store, at(now), source, {
            held: true
          }),
          sql`UPDATE ${messages} SET visible_at = ${at(now)} + ${timeoutMillis}${
            keepHandle
              ? sql`, extended_at = ${at(now)}, ${Keys.chargedAfterExtension(store, at(now), sql`${messages}`)}`
              : sql`, receipt_handle = NULL, leased_at = NULL`
          }
          WHERE seq = ${Number(seq)} AND receipt_handle = ${handle} AND visible_at > ${at(now)} RETURNING seq`
        )),
        one
      )
    }
  }
}

/**
 * PostgreSQL: claims, grouped acknowledgements, sends, extensions and nacks run on the store's lane (its own
 * connection: `Store.onLane`) — the claim and the acknowledgement as the PL/pgSQL functions `migrate`
 * creates — and a write that makes a message visible now notifies the queue's receivers.
 */
const pg = (store: Store): Statements => {
  const { sql } = store
  const messages = sql(store.messages)
  const claimFunction = sql(`${store.prefix}mailbox_claim`)
  const settleFunction = sql(`${store.prefix}mailbox_settle`)
  const notify = (queue: string) => sql`, pg_notify(${store.channel}, ${queue})`
  const at = atOf(store)
  return {
    ...shared(store, at),
    claim: (queue, now, visibilityMillis, max) =>
      store.onLane((lane) =>
        lane<Row>`SELECT seq, body, receipt_handle, delivery_count, enqueued_at, reply_to, traceparent
        FROM ${claimFunction}(${queue}::text, ${at(now)}::bigint, (${at(now)} + ${visibilityMillis})::bigint,
          ${max}::integer, ${store.receiver}::text)`
      ),
    insert: (queue, items, now, maxSize) => {
      // The first `maxSize - count` items go in; ids are drawn up front so each item learns its own.
      const room = maxSize === undefined
        ? sql``
        : sql`WHERE v.n <= ${maxSize} - (SELECT count(*) FROM ${messages} WHERE queue = ${queue})`
      const wake = items.some((item) => item.delayMillis === 0)
      const keys = placed(items)
      return Effect.map(
        store.onLane((lane) => {
          const insert = lane<{ seq: string }>`WITH input AS MATERIALIZED (
          SELECT nextval((SELECT pg_get_serial_sequence(${
            sql.literal(`'${store.messages}'`)
          }, 'seq')::regclass)) AS seq,
            v.body, v.delay, v.reply_to, v.traceparent, v.key, v.priority, v.n
          FROM ROWS FROM (json_to_recordset(${JSON.stringify(items)}::json)
            AS (body text, "delayMillis" bigint, "replyTo" text, traceparent text, key text, priority integer))
            WITH ORDINALITY AS v(body, delay, reply_to, traceparent, key, priority, n)
          ${room}),
        ins AS (
          INSERT INTO ${messages} (seq, queue, body, visible_at, enqueued_at, reply_to, traceparent, key, priority)
          SELECT seq, ${queue}::text, body, ${at(now)} + delay, ${at(now)}, reply_to, traceparent, key,
            coalesce(priority, 0) FROM input)
        SELECT seq${wake ? notify(queue) : sql``} FROM input ORDER BY n`
          // A keyed or prioritised send makes its queue scheduled first, in the same transaction (keys.ts).
          return keys === undefined
            ? insert
            : Sql.writeTransaction(lane)(Effect.zipRight(Keys.prepareSend(store, queue, keys, lane), insert))
        }),
        (rows) => items.map((_, index) => rows[index]?.seq)
      )
    },
    settle: (items, now) =>
      Effect.map(
        store.onLane((lane) => {
          // The reply bodies travel as one JSON array of the bodies themselves (each is JSON already), and
          // each element's text is its body as it was: escaping every quote of every body, in the driver's
          // array literal or as JSON strings, cost more than the rest of the statement's parameters. An
          // item without a reply has `null` there, never read (its reply queue is NULL).
          const call = sql`${settleFunction}(${arrayLiteral(items.map((item) => item.seq))}::bigint[], ${
            arrayLiteral(items.map((item) => item.handle))
          }::text[], ${arrayLiteral(items.map((item) => item.reply?.queue ?? null))}::text[],
          ARRAY(SELECT body::text FROM json_array_elements(${`[${
            items.map((item) => item.reply?.body ?? "null").join(",")
          }]`}::json) WITH ORDINALITY AS bodies(body, n) ORDER BY n), ${at(now)}::bigint, ${store.channel}::text,
          ${traceparentsOf(items)}::text[])`
          const journals = journalSeqs(items)
          if (journals === undefined) {
            return lane<{ settled_seq: string; settled_reply_seq: string | null }>`SELECT settled_seq,
              settled_reply_seq FROM ${call}`
          }
          // Deliveries with a journal: it goes in the same statement, for those the settle acknowledged only.
          return lane<{ settled_seq: string; settled_reply_seq: string | null }>`WITH s AS (SELECT * FROM ${call}),
            d AS (DELETE FROM ${sql(store.journal)} WHERE message_seq IN (SELECT settled_seq FROM s)
              AND message_seq = ANY(${journals}::bigint[]))
            SELECT settled_seq, settled_reply_seq FROM s`
        }),
        (rows) =>
          new Map(rows.map((row) => [
            String(row.settled_seq),
            row.settled_reply_seq === null ? undefined : String(row.settled_reply_seq)
          ]))
      ),
    // Extensions and nacks run on the lane too: an application that holds every pooled connection must not
    // keep a working message from proving it is alive, or a given-up one from coming back.
    setVisibility: (seq, handle, now, timeoutMillis, keepHandle, queue) => {
      const guard = sql`WHERE seq = ${Number(seq)} AND receipt_handle = ${handle} AND visible_at > ${at(now)}`
      // An extension records when it happened (for the operator); a nack gives the message up. A keyed lease
      // charges its key (keys.ts): an extension up to twice its age, a nack what it held.
      const handleColumn = keepHandle
        ? sql`, extended_at = ${at(now)}, ${Keys.chargedAfterExtension(store, at(now), sql`${messages}`)}`
        : sql`, receipt_handle = NULL, leased_at = NULL`
      const source = sql`FROM ${messages} m WHERE m.seq = ${Number(seq)} AND m.receipt_handle = ${handle}
        AND m.visible_at > ${at(now)}`
      const charge = keepHandle
        ? Keys.chargeExtended(store, at(now), source)
        : Keys.chargeEnded(store, at(now), source, { held: true })
      const visibleAt = sql`${at(now)} + ${timeoutMillis}`
      return store.onLane((lane) =>
        Effect.map(
          lane`WITH charge AS (${charge}),
            upd AS (UPDATE ${messages} SET visible_at = ${visibleAt}${handleColumn} ${guard} RETURNING seq)
            SELECT seq${timeoutMillis === 0 ? notify(queue) : sql``} FROM upd`,
          one
        )
      )
    }
  }
}
