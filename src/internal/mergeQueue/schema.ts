/**
 * The merge queue's tables and, on PostgreSQL, its coordination functions: their names under the prefix,
 * the migrations that create them (a database made by an earlier version gains the functions on its next
 * `create: true` open or `leasehold migrate`; the tables keep their columns — SQLite's audit table is
 * rebuilt once, rows and ids as they were — so older and newer processes can share one database), and
 * `open`, which migrates, checks the version (`create: false`) or only looks, and hands the statements
 * everything they run against.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type * as Statement from "@effect/sql/Statement"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { type SchemaVersionError, TablesNotFoundError } from "../../Errors.js"
import * as Sql from "../sql/common.js"
import { requireVersion } from "../sql/version.js"
import { live, type MoveInputs, moveSet, needsRecovery, verdict } from "./conditions.js"
import { MergeQueueStoreError } from "./errors.js"
import type { MergeQueueConfig } from "./model.js"

/** The names of one queue's tables and functions. */
export interface Names {
  readonly entries: string
  readonly lock: string
  readonly audit: string
  readonly migrations: string
  readonly claim: string
  readonly takeLock: string
  readonly transition: string
  readonly release: string
  readonly extend: string
}

export const names = (prefix: string): Names => ({
  entries: `${prefix}merge_queue`,
  lock: `${prefix}merge_queue_lock`,
  audit: `${prefix}merge_queue_audit`,
  migrations: `${prefix}merge_queue_migrations`,
  claim: `${prefix}merge_queue_claim`,
  takeLock: `${prefix}merge_queue_take_lock`,
  transition: `${prefix}merge_queue_transition`,
  release: `${prefix}merge_queue_release`,
  extend: `${prefix}merge_queue_extend`
})

/** One queue on one client: what every statement runs against. */
export interface Db {
  readonly sql: SqlClient.SqlClient
  readonly dialect: Sql.Dialect
  readonly names: Names
  readonly entries: Statement.Identifier
  readonly lock: Statement.Identifier
  readonly audit: Statement.Identifier
  /**
   * The time a statement runs at, as SQL: the database's clock, read by the statement (every agent, on every
   * machine, by one clock), or under `TestClock` the test's time, so tests drive expiry on every backend alike.
   */
  readonly now: () => Statement.Fragment
  /** The test's time under `TestClock`, else `undefined` (the statements read the database's clock). */
  readonly testNow: (() => number) | undefined
  /** The database's clock, as SQL. */
  readonly databaseNow: Statement.Fragment
  readonly lockTimeoutMillis: number
  /** A transaction that writes: on SQLite it takes the file's write lock first (`Sql.writeTransaction`). */
  readonly writeTransaction: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | SqlError, R>
}

/** What the migrations run against: the tables' names and identifiers on one client. */
export type Tables = Pick<Db, "sql" | "dialect" | "names" | "entries" | "lock" | "audit">

const tablesOf = (sql: SqlClient.SqlClient, prefix: string): Tables => {
  const queueNames = names(prefix)
  return {
    sql,
    dialect: Sql.dialectOf(sql),
    names: queueNames,
    entries: sql(queueNames.entries),
    lock: sql(queueNames.lock),
    audit: sql(queueNames.audit)
  }
}

/**
 * How `open` treats the tables: `migrate` creates or upgrades them (`create: true`); `require` runs no
 * migration and needs them at this release's version (`create: false`: a `SchemaVersionError` otherwise);
 * `look` only checks that they are there and writes nothing (an operator's look, which works on the tables
 * of an earlier version too).
 */
export type OpenMode = "migrate" | "require" | "look"

/** Opens the queue, its tables treated as `mode` says (by default as `config.create` says). */
export const open = (
  sql: SqlClient.SqlClient,
  config: MergeQueueConfig,
  mode: OpenMode = config.create ? "migrate" : "require"
): Effect.Effect<Db, MergeQueueStoreError | TablesNotFoundError | SchemaVersionError> =>
  Effect.gen(function*() {
    const testNow = Sql.testTime(yield* Effect.clock)
    const databaseNow = Sql.databaseNow(sql)
    const queueNames = names(config.prefix)
    const db: Db = {
      sql,
      dialect: Sql.dialectOf(sql),
      names: queueNames,
      entries: sql(queueNames.entries),
      lock: sql(queueNames.lock),
      audit: sql(queueNames.audit),
      now: () => testNow === undefined ? databaseNow : sql`${testNow()}`,
      testNow,
      databaseNow,
      lockTimeoutMillis: Math.round(Duration.toMillis(config.lockTimeout)),
      writeTransaction: Sql.writeTransaction(sql)
    }
    const tables = [queueNames.entries, queueNames.lock, queueNames.audit]
    const setupError = (cause: unknown) => new MergeQueueStoreError({ operation: "setup", cause })
    if (mode === "migrate") {
      yield* migrate(db).pipe(Effect.mapError(setupError), Effect.withSpan("MergeQueue.migrate"))
    } else if (mode === "require") {
      yield* Effect.catchTag(requireMigrated(sql, config.prefix), "SqlError", (cause) => Effect.fail(setupError(cause)))
    } else {
      yield* Effect.flatMap(
        Sql.missingTables(sql, tables).pipe(
          Effect.mapError((cause) => new MergeQueueStoreError({ operation: "setup", cause }))
        ),
        (missing) =>
          missing.length === 0
            ? Effect.void
            : Effect.fail(new TablesNotFoundError({ what: "merge queue tables", prefix: config.prefix, missing }))
      )
    }
    return db
  })

/** Creates or upgrades the tables; answers the migrations it applied. */
export const migrate = (db: Tables) => Sql.migrate(db.sql, db.names.migrations, migrationsOf(db))

/** Checks, writing nothing, that the tables are at the version this release needs (`create: false`). */
export const requireMigrated = (
  sql: SqlClient.SqlClient,
  prefix: string
): Effect.Effect<void, SqlError | SchemaVersionError> =>
  requireVersion(sql, {
    service: "merge queue",
    prefix,
    table: names(prefix).migrations,
    required: Object.keys(migrations(sql, prefix)).length
  })

/** The migrations, by name, in order (`leasehold migrate` lists them; a test builds an older database from the first). */
export const migrations = (sql: SqlClient.SqlClient, prefix: string): Record<string, Effect.Effect<void, SqlError>> =>
  migrationsOf(tablesOf(sql, prefix))

const migrationsOf = (db: Tables): Record<string, Effect.Effect<void, SqlError>> => {
  const { audit, entries, lock, names, sql } = db
  return {
    "1_create_merge_queue": Effect.all([
      sql`CREATE TABLE IF NOT EXISTS ${entries} (
        id ${Sql.identityColumn(sql)},
        workspace TEXT NOT NULL,
        bead_id TEXT,
        priority INTEGER NOT NULL,
        status TEXT NOT NULL,
        agent_id TEXT,
        fencing_token BIGINT,
        started_at BIGINT,
        state_changed_at BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        attempt_count INTEGER NOT NULL DEFAULT 0,
        last_error TEXT)`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${names.entries}_order`)}
        ON ${entries} (status, priority, created_at, id)`,
      sql`CREATE UNIQUE INDEX IF NOT EXISTS ${sql(`${names.entries}_workspace`)}
        ON ${entries} (workspace) WHERE status NOT IN ('merged', 'failed_terminal', 'cancelled')`,
      sql`CREATE TABLE IF NOT EXISTS ${lock} (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        agent_id TEXT,
        acquired_at BIGINT,
        expires_at BIGINT,
        fencing_token BIGINT NOT NULL DEFAULT 0)`,
      sql`INSERT INTO ${lock} (id, fencing_token) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`,
      sql`CREATE TABLE IF NOT EXISTS ${audit} (
        id ${Sql.identityColumn(sql)},
        at BIGINT NOT NULL,
        action TEXT NOT NULL,
        agent_id TEXT,
        entry_id BIGINT,
        fencing_token BIGINT,
        from_status TEXT,
        to_status TEXT,
        detail TEXT)`,
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${names.audit}_entry`)} ON ${audit} (entry_id, id)`
    ], { discard: true }),
    // The claim, the lock calls and the transition as PL/pgSQL functions, one round trip each (SQLite runs
    // each as one write transaction of a few statements: see `statements.ts`). PL/pgSQL, not one SQL
    // statement of data-modifying CTEs: every statement of a function sees what committed before it ran,
    // so the entry is read after the lock row is held — a CTE would read it from the snapshot taken before
    // waiting for the lock, and decide on a state another agent had already changed.
    "2_coordination_functions": db.dialect === "pg" ? createFunctions(db) : Effect.void,
    // SQLite: every write transaction writes two pages fewer, and the file's checkpoints come that much less
    // often. The audit log loses AUTOINCREMENT, whose counter in `sqlite_sequence` each insert rewrote: its
    // newest row is never deleted (retention prunes the log's oldest rows only, `internal/sql/retention.ts`),
    // so the largest id plus one, which an INTEGER PRIMARY KEY takes, is the id AUTOINCREMENT gave. Its entry
    // index leaves out the lock's rows (no entry), which no read by entry looks at. Columns, ids and rows stay
    // as they were, so processes of either version share the table.
    "3_audit_pages": db.dialect === "pg" ? Effect.void : rebuildAudit(db)
  }
}

/** The SQLite audit table of migration 3: copied into a table of the same columns, then put in its place. */
const rebuildAudit = (db: Tables) => {
  const { audit, names, sql } = db
  const rebuilt = sql(`${names.audit}_rebuilt`)
  const columns = sql.literal("id, at, action, agent_id, entry_id, fencing_token, from_status, to_status, detail")
  return Effect.all([
    sql`CREATE TABLE ${rebuilt} (
      id INTEGER PRIMARY KEY,
      at BIGINT NOT NULL,
      action TEXT NOT NULL,
      agent_id TEXT,
      entry_id BIGINT,
      fencing_token BIGINT,
      from_status TEXT,
      to_status TEXT,
      detail TEXT)`,
    sql`INSERT INTO ${rebuilt} (${columns}) SELECT ${columns} FROM ${audit} ORDER BY id`,
    sql`DROP TABLE ${audit}`,
    sql`ALTER TABLE ${rebuilt} RENAME TO ${audit}`,
    sql`CREATE INDEX ${sql(`${names.audit}_entry`)} ON ${audit} (entry_id, id) WHERE entry_id IS NOT NULL`
  ], { discard: true })
}

/** A function body is text: it must carry no bound parameter (it would be read as the function's own `$n`). */
const ddl = (statement: Statement.Statement<unknown>): Effect.Effect<void, SqlError> =>
  statement.compile()[1].length === 0
    ? Effect.asVoid(statement)
    : Effect.dieMessage(`MergeQueue: a function body has bound parameters: ${statement.compile()[0]}`)

const createFunctions = (db: Tables): Effect.Effect<void, SqlError> => {
  const { audit, entries, lock, names, sql } = db
  const p = (name: string) => sql.literal(name)
  const now = p("p_now")
  const isLive = live(sql, now)
  const row = (table: Statement.Identifier) => sql`${table}%ROWTYPE`
  const inputs: MoveInputs = {
    now,
    token: p("p_token"),
    to: p("p_status"),
    needsClaim: p("p_needs_claim"),
    fromInProgress: p("v_entry.status = ANY(p_in_progress)"),
    fromAllowed: p("v_entry.status = ANY(p_allowed_from)"),
    staysActive: p("p_stays_active"),
    error: p("p_error")
  }
  return Effect.all([
    // Takes the lock for p_agent unless another agent holds it live; the token, or NULL. A new token when
    // asked, or when the lock changes hands; taking over an expired lock is audited as its expiry.
    ddl(sql`CREATE OR REPLACE FUNCTION ${sql(names.takeLock)}(
        p_agent text, p_now bigint, p_timeout bigint, p_new_token boolean)
      RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        v_lock ${row(lock)};
        v_token bigint;
      BEGIN
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1 FOR UPDATE;
        IF ${isLive} AND v_lock.agent_id <> p_agent THEN
          RETURN NULL;
        END IF;
        v_token := v_lock.fencing_token
          + CASE WHEN p_new_token OR v_lock.agent_id IS DISTINCT FROM p_agent THEN 1 ELSE 0 END;
        IF v_lock.agent_id <> p_agent THEN
          INSERT INTO ${audit} (at, action, agent_id, fencing_token, detail)
          VALUES (p_now, 'lock_expired', v_lock.agent_id, v_lock.fencing_token,
            'expired at ' || v_lock.expires_at || '; taken over by ' || p_agent);
        END IF;
        UPDATE ${lock} SET agent_id = p_agent, acquired_at = p_now, expires_at = p_now + p_timeout,
          fencing_token = v_token WHERE id = 1;
        INSERT INTO ${audit} (at, action, agent_id, fencing_token) VALUES (p_now, 'lock_acquired', p_agent, v_token);
        RETURN v_token;
      END $$`),
    // The claim. First a look without the row lock: an idle poller writes nothing and waits for no one
    // while another agent's lock is live. Asked to (p_check_stale), it stops at 'recover' when there is
    // something to heal: the caller recovers, best effort, and claims again without the check.
    ddl(sql`CREATE OR REPLACE FUNCTION ${sql(names.claim)}(
        p_agent text, p_now bigint, p_timeout bigint, p_check_stale boolean, p_in_progress text[])
      RETURNS json LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        v_lock ${row(lock)};
        v_entry ${row(entries)};
        v_token bigint;
      BEGIN
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1;
        IF ${isLive} AND v_lock.agent_id <> p_agent THEN
          RETURN json_build_object('outcome', 'busy');
        END IF;
        IF p_check_stale AND ${needsRecovery(sql, entries, { now, inProgress: p("status = ANY(p_in_progress)") })} THEN
          RETURN json_build_object('outcome', 'recover');
        END IF;
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1 FOR UPDATE;
        IF ${isLive} THEN
          IF v_lock.agent_id <> p_agent THEN
            RETURN json_build_object('outcome', 'busy');
          END IF;
          -- The agent's own entry under its live lock comes back to it.
          SELECT * INTO v_entry FROM ${entries}
          WHERE status = ANY(p_in_progress) AND fencing_token = v_lock.fencing_token LIMIT 1;
          IF FOUND THEN
            RETURN json_build_object('outcome', 'claimed', 'token', v_lock.fencing_token, 'entry', row_to_json(v_entry));
          END IF;
        END IF;
        SELECT * INTO v_entry FROM ${entries} WHERE status = 'pending' ORDER BY priority, created_at, id LIMIT 1;
        IF NOT FOUND THEN
          RETURN json_build_object('outcome', 'none');
        END IF;
        v_token := ${sql(names.takeLock)}(p_agent, p_now, p_timeout, true);
        UPDATE ${entries} SET status = 'claimed', agent_id = p_agent, fencing_token = v_token, started_at = p_now,
          state_changed_at = p_now, attempt_count = attempt_count + 1
        WHERE id = v_entry.id RETURNING * INTO v_entry;
        INSERT INTO ${audit} (at, action, agent_id, entry_id, fencing_token, from_status, to_status)
        VALUES (p_now, 'claimed', p_agent, v_entry.id, v_token, 'pending', 'claimed');
        RETURN json_build_object('outcome', 'claimed', 'token', v_token, 'entry', row_to_json(v_entry));
      END $$`),
    // A transition under the lock row: 'ok' with the moved entry, or why not with what the refusal names.
    ddl(sql`CREATE OR REPLACE FUNCTION ${sql(names.transition)}(
        p_id bigint, p_token bigint, p_status text, p_error text, p_now bigint, p_allowed_from text[],
        p_needs_claim boolean, p_in_progress text[], p_stays_active boolean)
      RETURNS json LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        v_lock ${row(lock)};
        v_entry ${row(entries)};
        v_outcome text;
      BEGIN
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1 FOR UPDATE;
        SELECT * INTO v_entry FROM ${entries} WHERE id = p_id;
        v_outcome := ${verdict(sql, inputs)};
        IF v_outcome <> 'ok' THEN
          RETURN json_build_object('outcome', v_outcome, 'status', v_entry.status,
            'fencing_token', v_entry.fencing_token, 'lock_expires_at', v_lock.expires_at);
        END IF;
        INSERT INTO ${audit} (at, action, agent_id, entry_id, fencing_token, from_status, to_status, detail)
        VALUES (p_now, 'transition', v_entry.agent_id, p_id, v_entry.fencing_token, v_entry.status, p_status, p_error);
        UPDATE ${entries} SET ${moveSet(sql, inputs)} WHERE id = p_id RETURNING * INTO v_entry;
        RETURN json_build_object('outcome', 'ok', 'entry', row_to_json(v_entry));
      END $$`),
    // Releases the lock held under p_token (live or not); false when it is not held under it.
    ddl(sql`CREATE OR REPLACE FUNCTION ${sql(names.release)}(p_token bigint, p_now bigint)
      RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        v_lock ${row(lock)};
      BEGIN
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1 FOR UPDATE;
        IF v_lock.agent_id IS NULL OR v_lock.fencing_token <> p_token THEN
          RETURN false;
        END IF;
        UPDATE ${lock} SET agent_id = NULL, acquired_at = NULL, expires_at = NULL WHERE id = 1;
        INSERT INTO ${audit} (at, action, agent_id, fencing_token)
        VALUES (p_now, 'lock_released', v_lock.agent_id, p_token);
        RETURN true;
      END $$`),
    // Moves the live lock held under p_token to expire no sooner than p_now + p_extra; false when it is not.
    ddl(sql`CREATE OR REPLACE FUNCTION ${sql(names.extend)}(p_token bigint, p_now bigint, p_extra bigint)
      RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        v_lock ${row(lock)};
        v_until bigint;
      BEGIN
        SELECT * INTO v_lock FROM ${lock} WHERE id = 1 FOR UPDATE;
        IF v_lock.fencing_token <> p_token OR NOT ${isLive} THEN
          RETURN false;
        END IF;
        v_until := GREATEST(v_lock.expires_at, p_now + p_extra);
        UPDATE ${lock} SET expires_at = v_until WHERE id = 1;
        INSERT INTO ${audit} (at, action, agent_id, fencing_token, detail)
        VALUES (p_now, 'lock_extended', v_lock.agent_id, p_token, 'until ' || v_until);
        RETURN true;
      END $$`)
  ], { discard: true })
}
