/**
 * The scheduling tables (mailbox migration 14; the rules are `../scheduling.ts`): the columns a message gains
 * (its key, priority and whether it waits in order), the keys table (one row per (queue, key) that ever had a
 * message or a setting: its settings, its share clock, its rate windows and how many of its messages are
 * unsettled) and the queues' defaults for keys without settings of their own.
 *
 * A message is `ready` (1) while it waits in (priority, seq) order — visible, or about to be (a row an older
 * release claimed without clearing it is skipped by the claim's `visible_at` guard) — and 0 while a lease or a
 * delay keeps it invisible; a claim first moves the rows whose time has come back to ready (`promote`),
 * keeping their first place. The partial indexes keep each walk on the rows it wants: the ready rows of the
 * unkeyed and of each key in order, the waiting rows by when they come due, a key's leases by expiry.
 *
 * `pending` counts a key's unsettled messages (ready, leased or delayed): sends add, settles, dead letters
 * and deletions take away. The claim walks only active keys (`pending > 0`), and a key it finds without any
 * message is set right there (its count recomputed), so a count that drifted heals on the next claim.
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Sql from "../../sql/common.js"
import type { Store } from "./store.js"

/** The keys table's name under `prefix`. */
export const keysTable = (prefix: string) => `${prefix}mailbox_keys`
/** The queues' default key settings under `prefix`. */
export const defaultsTable = (prefix: string) => `${prefix}mailbox_key_defaults`

/** Migration 14: the columns, the tables and the indexes. */
export const migrate = (store: Store): Effect.Effect<void, SqlError> => {
  const { deadLetters, messages, sql } = store
  const pg = store.dialect === "pg"
  const real = pg ? sql`DOUBLE PRECISION` : sql`REAL`
  const m = sql(messages)
  const addColumns = pg
    ? [
      sql`ALTER TABLE ${m} ADD COLUMN IF NOT EXISTS key TEXT,
        ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS ready INTEGER NOT NULL DEFAULT 1`,
      sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN IF NOT EXISTS key TEXT,
        ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0`
    ]
    : [
      sql`ALTER TABLE ${m} ADD COLUMN key TEXT`,
      sql`ALTER TABLE ${m} ADD COLUMN priority INTEGER NOT NULL DEFAULT 0`,
      sql`ALTER TABLE ${m} ADD COLUMN ready INTEGER NOT NULL DEFAULT 1`,
      sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN key TEXT`,
      sql`ALTER TABLE ${sql(deadLetters)} ADD COLUMN priority INTEGER NOT NULL DEFAULT 0`
    ]
  return Effect.all([
    ...addColumns,
    // Rows stored before: those a lease or a delay holds wait; the rest are ready in their order.
    sql`UPDATE ${m} SET ready = 0 WHERE visible_at > ${Sql.databaseNow(sql)}`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_ready`)} ON ${m} (queue, priority, seq)
      WHERE ready = 1 AND key IS NULL`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_key_ready`)} ON ${m} (queue, key, priority, seq)
      WHERE ready = 1 AND key IS NOT NULL`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_waiting`)} ON ${m} (queue, visible_at) WHERE ready = 0`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${messages}_key_leases`)} ON ${m} (queue, key, visible_at)
      WHERE ready = 0 AND key IS NOT NULL`,
    // Settings (NULL: the queue's default, then none), the share clock and its last pick, the busy period's
    // leased time, the rate windows (start of the window, used in it) and the unsettled count.
    sql`CREATE TABLE IF NOT EXISTS ${sql(keysTable(store.prefix))} (
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      max_leases INTEGER,
      weight ${real},
      start_limit BIGINT,
      start_interval BIGINT,
      token_limit BIGINT,
      token_interval BIGINT,
      pending INTEGER NOT NULL DEFAULT 0,
      vtime ${real} NOT NULL DEFAULT 0,
      picked_vtime ${real} NOT NULL DEFAULT 0,
      leased BIGINT NOT NULL DEFAULT 0,
      starts_window BIGINT NOT NULL DEFAULT 0,
      starts_used BIGINT NOT NULL DEFAULT 0,
      tokens_window BIGINT NOT NULL DEFAULT 0,
      tokens_used BIGINT NOT NULL DEFAULT 0,
      PRIMARY KEY (queue, key))`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${keysTable(store.prefix)}_active`)} ON ${sql(keysTable(store.prefix))}
      (queue, vtime, key) WHERE pending > 0`,
    sql`CREATE INDEX IF NOT EXISTS ${sql(`${keysTable(store.prefix)}_clock`)} ON ${sql(keysTable(store.prefix))}
      (queue, picked_vtime) WHERE pending > 0`,
    sql`CREATE TABLE IF NOT EXISTS ${sql(defaultsTable(store.prefix))} (
      queue TEXT PRIMARY KEY,
      max_leases INTEGER,
      weight ${real},
      start_limit BIGINT,
      start_interval BIGINT,
      token_limit BIGINT,
      token_interval BIGINT)`
  ], { discard: true })
}
