/**
 * The work leases' tables and, on PostgreSQL, the two functions that make
 * each coordination call one round trip: the rules run next to the rows, so
 * the domain's row lock is held while the function runs, not across the
 * client's round trips.
 *
 * Lease expiry (migration 3) is two columns: `expires_at`, and
 * `expires_fencing`, the fencing token of the lease it belongs to. An expiry
 * counts only while `expires_fencing = lease_fencing`, so a process still on
 * the previous release — whose statements and functions neither set nor
 * clear them — never leaves an expiry that a later lease would inherit: its
 * leases have none, as before. The functions of migration 2 stay as they
 * were for those processes; the new ones are overloads with more arguments.
 *
 * Migration 4 adds the functions this release calls (`…_v4`): the rules of
 * migration 3's, answering one `text[]` instead of `OUT` parameters, and
 * reading the database's clock themselves when given no time. A call is then
 * `SELECT f(…)`, which PostgreSQL plans and runs for less than `SELECT … FROM
 * f(…)` (no function scan, whose result is stored in a tuple store first, and
 * no clock expression in the call). The functions of migrations 2 and 3 stay,
 * unchanged, for processes of the earlier releases.
 */
import type * as Migrator from "@effect/sql/Migrator"
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import type { SchemaVersionError } from "../../../Errors.js"
import * as Sql from "../common.js"
import { requireVersion } from "../version.js"

/** The tables of `prefix`. */
export const tables = (prefix: string) => ({
  domains: `${prefix}work_lease_domains`,
  backlog: `${prefix}work_lease_backlog`,
  terminal: `${prefix}work_lease_terminal`,
  migrations: `${prefix}work_lease_migrations`,
  acquire: `${prefix}work_lease_acquire`,
  settle: `${prefix}work_lease_settle`,
  acquireV4: `${prefix}work_lease_acquire_v4`,
  settleV4: `${prefix}work_lease_settle_v4`
})

/**
 * The condition under which a domain row's lease is stale at `now` (a PL/pgSQL or SQL expression): it has an
 * expiry, the expiry is this lease's, and it has passed.
 */
export const staleCondition = (row: string, now: string) =>
  `(${row}.expires_fencing = ${row}.lease_fencing AND ${row}.expires_at <= ${now})`

/** Creates the tables, or brings those of an earlier release up to date (concurrent processes are fine). */
export const migrate = (
  sql: SqlClient.SqlClient,
  prefix: string
): Effect.Effect<ReadonlyArray<readonly [number, string]>, SqlError | Migrator.MigrationError> =>
  Sql.migrate(sql, tables(prefix).migrations, migrations(sql, prefix))

/** Checks, writing nothing, that the tables are at the version this release needs (`create: false`). */
export const requireMigrated = (
  sql: SqlClient.SqlClient,
  prefix: string
): Effect.Effect<void, SqlError | SchemaVersionError> =>
  requireVersion(sql, {
    service: "work lease",
    prefix,
    table: tables(prefix).migrations,
    required: Object.keys(migrations(sql, prefix)).length
  })

/** The migrations, by name, in order (a test builds a database as an earlier release left it from the first ones). */
export const migrations = (
  sql: SqlClient.SqlClient,
  prefix: string
): Record<string, Effect.Effect<void, SqlError>> => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  const pg = Sql.dialectOf(sql) === "pg"
  return {
    // The schema as it was before migrations were recorded: `IF NOT EXISTS` adopts those tables.
    "1_create_work_lease": Effect.all([
      sql`CREATE TABLE IF NOT EXISTS ${domains} (
        domain_id TEXT PRIMARY KEY,
        lease_offset BIGINT, lease_token TEXT, lease_fencing BIGINT, acquired_at BIGINT,
        retry_count INTEGER NOT NULL DEFAULT 0,
        fencing_token BIGINT NOT NULL DEFAULT 0,
        low_water BIGINT NOT NULL DEFAULT 0)`,
      sql`CREATE TABLE IF NOT EXISTS ${backlog} (
        domain_id TEXT NOT NULL, position BIGINT NOT NULL, item BIGINT NOT NULL,
        PRIMARY KEY (domain_id, item))`,
      sql`CREATE TABLE IF NOT EXISTS ${terminal} (
        domain_id TEXT NOT NULL, item BIGINT NOT NULL, kind TEXT NOT NULL,
        PRIMARY KEY (domain_id, item))`
    ], { discard: true }),
    // Every settle reads the backlog's head: by index, not by sorting the domain's whole backlog.
    "2_one_statement_calls": Effect.all([
      sql`CREATE INDEX IF NOT EXISTS ${sql(`${names.backlog}_head`)} ON ${backlog} (domain_id, position)`,
      ...(pg ? [acquireFunction(sql, prefix), settleFunction(sql, prefix)] : [])
    ], { discard: true }),
    // Lease expiry (`leaseTimeout`): when the lease goes stale, and which lease that expiry is for. PostgreSQL
    // gets overloads of both functions that take the time and the timeout (and, to count a takeover as a failed
    // attempt, acquire takes maxRetries); the previous ones stay, so a process still on the previous release
    // works as it did while others upgrade (its leases have no expiry, and it never takes a lease over).
    "3_lease_expiry": Effect.all([
      ...(pg
        ? [
          sql`ALTER TABLE ${domains} ADD COLUMN IF NOT EXISTS expires_at BIGINT,
            ADD COLUMN IF NOT EXISTS expires_fencing BIGINT`,
          acquireFunction(sql, prefix, { expiry: true }),
          settleFunction(sql, prefix, { expiry: true })
        ]
        // SQLite has no `ADD COLUMN IF NOT EXISTS`: a database whose migrations table was lost has them already.
        : ["expires_at", "expires_fencing"].map((column) =>
          Effect.flatMap(
            sql<{ n: number }>`SELECT count(*) AS n FROM pragma_table_info(${names.domains}) WHERE name = ${column}`,
            (rows) =>
              Number(rows[0]?.n ?? 0) > 0 ? Effect.void : sql`ALTER TABLE ${domains} ADD COLUMN ${sql(column)} BIGINT`
          )
        ))
    ], { discard: true }),
    // The functions this release calls on PostgreSQL: migration 3's rules, answering a `text[]` (called as
    // `SELECT f(…)`, the cheapest call to plan and run), reading the clock themselves. SQLite: nothing to do.
    "4_array_answers": pg
      ? Effect.all([settleFunction(sql, prefix, v4), acquireFunction(sql, prefix, v4)], { discard: true })
      : Effect.void
  }
}

/** Which functions to make: migration 2's, migration 3's (`expiry`), or migration 4's (`expiry` and `array`). */
interface FunctionVersion {
  readonly expiry: boolean
  /** Answer one `text[]` rather than `OUT` parameters, and read the clock when `p_now` is NULL (migration 4). */
  readonly array?: boolean
}

const v4: FunctionVersion = { expiry: true, array: true }

/**
 * The pieces that differ between a function answering by `OUT` parameters (migrations 2 and 3) and one answering
 * a `text[]` of the same values in the same order (migration 4): its result in the signature, its locals, how it
 * returns, and its first statement (migration 4's reads the database's clock when `p_now` is NULL).
 */
const answering = (
  sql: SqlClient.SqlClient,
  version: FunctionVersion,
  outs: ReadonlyArray<readonly [string, string]>
) => {
  if (version.array !== true) {
    return {
      outs: sql.literal(outs.map(([name, type]) => `OUT ${name} ${type}`).join(", ")),
      returns: sql``,
      locals: sql``,
      start: sql``,
      answer: sql`RETURN`,
      end: sql``
    }
  }
  const answer = sql.literal(
    `RETURN ARRAY[${outs.map(([name, type]) => type === "text" ? name : `${name}::text`).join(", ")}]`
  )
  return {
    outs: sql``,
    returns: sql` RETURNS text[]`,
    locals: sql.literal(outs.map(([name, type]) => `\n      ${name} ${type};`).join("")),
    start: sql`
      p_now := COALESCE(p_now, ${Sql.databaseNow(sql)});`,
    answer,
    end: sql`
      ${answer};`
  }
}

/**
 * `tryAcquire` (PostgreSQL), the rules of `WorkLease.tryAcquire` in their order. Returns the outcome's tag
 * and its fields: the token (`Acquired`, `AlreadyAcquired`), the fencing token (`Acquired`) or the backlog
 * head (`BacklogOrderingError`). PL/pgSQL keeps its statements' plans for the connection.
 *
 * With `expiry` (migration 3 on), an overload that also takes the lease timeout (`p_timeout`, NULL: none) and
 * `maxRetries`: a new lease expires at `p_now + p_timeout`, and a lease of the same offset that is stale at
 * `p_now` counts as a failed attempt. With retries left it is taken over — a new token, the next fencing token,
 * the retry count one more, `acquired_at` kept; with none left the offset is given up as the stale holder's
 * `fail` would give it up (the settle function does it) and the answer is `AlreadyFailed`. Either way it
 * returns the stale holder's fencing token, how long its lease had been stale and the retry count.
 *
 * With `array` (migration 4), a function of its own name answering those six values as a `text[]`, in that
 * order (tag, token, number, stale fencing token, stale for, retries); `p_now` NULL is the database's clock.
 */
const acquireFunction = (sql: SqlClient.SqlClient, prefix: string, version: FunctionVersion = { expiry: false }) => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  const expiry = version.expiry
  const array = version.array === true
  const settle = sql(array ? names.settleV4 : names.settle)
  const setExpiry = expiry ? sql`, expires_at = p_now + p_timeout, expires_fencing = d.fencing_token + 1` : sql``
  const { answer, end, locals, outs, returns, start } = answering(sql, version, [
    ["o_tag", "text"],
    ["o_token", "text"],
    ["o_number", "bigint"],
    ...(expiry
      ? [["o_stale_fencing", "bigint"], ["o_stale_for", "bigint"], ["o_retries", "bigint"]] as const
      : [])
  ])
  return sql`CREATE OR REPLACE FUNCTION ${sql(array ? names.acquireV4 : names.acquire)}(
      p_domain text, p_offset bigint, p_token text, p_now bigint,${
    expiry ? sql` p_timeout bigint, p_max_retries integer${array ? sql`` : sql`,`}` : sql``
  }${
    array ? sql`` : sql`
      `
  }${outs})${returns}
    LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
      v_domain record;
      v_kind text;
      v_head bigint;${locals}
    BEGIN${start}
      SELECT * INTO v_domain FROM ${domains} d WHERE d.domain_id = p_domain FOR UPDATE;
      IF NOT FOUND THEN
        INSERT INTO ${domains} (domain_id) VALUES (p_domain) ON CONFLICT (domain_id) DO NOTHING;
        SELECT * INTO v_domain FROM ${domains} d WHERE d.domain_id = p_domain FOR UPDATE;
      END IF;
      SELECT t.kind INTO v_kind FROM ${terminal} t WHERE t.domain_id = p_domain AND t.item = p_offset;
      IF v_kind = 'failed' THEN
        o_tag := 'AlreadyFailed';
      ELSIF v_kind = 'processed' OR p_offset < v_domain.low_water THEN
        o_tag := 'AlreadyProcessed';${
    expiry
      ? sql`
      ELSIF v_domain.lease_token IS NOT NULL AND v_domain.lease_offset = p_offset
        AND ${sql.literal(staleCondition("v_domain", "p_now"))} THEN
        o_stale_fencing := v_domain.lease_fencing;
        o_stale_for := p_now - v_domain.expires_at;
        IF v_domain.retry_count >= p_max_retries THEN
          -- Its retries used up: given up, as the stale holder's fail would.
          PERFORM ${settle}(p_domain, v_domain.lease_token, true, p_max_retries, p_now, p_timeout);
          o_tag := 'AlreadyFailed';
          o_retries := v_domain.retry_count;
        ELSE
          UPDATE ${domains} d SET lease_token = p_token, lease_fencing = d.fencing_token + 1,
            fencing_token = d.fencing_token + 1, retry_count = d.retry_count + 1${setExpiry}
          WHERE d.domain_id = p_domain RETURNING d.fencing_token, d.retry_count INTO o_number, o_retries;
          o_tag := 'Acquired';
          o_token := p_token;
        END IF;`
      : sql``
  }
      ELSIF v_domain.lease_token IS NOT NULL AND v_domain.lease_offset = p_offset THEN
        o_tag := 'AlreadyAcquired';
        o_token := v_domain.lease_token;
      ELSIF v_domain.lease_token IS NOT NULL THEN
        INSERT INTO ${backlog} (domain_id, position, item)
          SELECT p_domain, COALESCE(max(b.position), 0) + 1, p_offset FROM ${backlog} b WHERE b.domain_id = p_domain
          ON CONFLICT (domain_id, item) DO NOTHING;
        o_tag := 'Enqueued';
      ELSE
        SELECT b.item INTO v_head FROM ${backlog} b WHERE b.domain_id = p_domain ORDER BY b.position LIMIT 1;
        IF v_head IS NOT NULL AND v_head <> p_offset THEN
          o_tag := 'BacklogOrderingError';
          o_number := v_head;
          ${answer};
        END IF;
        IF v_head IS NOT NULL THEN
          DELETE FROM ${backlog} b WHERE b.domain_id = p_domain AND b.item = p_offset;
        END IF;
        UPDATE ${domains} d SET lease_offset = p_offset, lease_token = p_token, lease_fencing = d.fencing_token + 1,
          acquired_at = p_now, retry_count = 0, fencing_token = d.fencing_token + 1${setExpiry}
        WHERE d.domain_id = p_domain RETURNING d.fencing_token INTO o_number;
        o_tag := 'Acquired';
        o_token := p_token;
      END IF;${end}
    END $$`
}

/**
 * `succeed` (`p_fail` false) and `fail` (PostgreSQL), after the token checks: a retry counts up and keeps
 * the lease; otherwise the offset becomes terminal, the low-water mark advances over contiguous terminal
 * offsets (dropping the processed ones, keeping the failed), and the lease clears. Returns the outcome's
 * tag (`Released`, `RetryScheduled`, or an error's) and the backlog head or the retry count.
 *
 * With `expiry` (migration 3 on), an overload that also takes the time and the lease timeout: a retry renews
 * the lease to `p_now + p_timeout` (kept as it is when `p_timeout` is NULL), a release clears the expiry too.
 *
 * With `array` (migration 4), a function of its own name answering the tag and the number as a `text[]`;
 * `p_now` NULL is the database's clock.
 */
const settleFunction = (sql: SqlClient.SqlClient, prefix: string, version: FunctionVersion = { expiry: false }) => {
  const names = tables(prefix)
  const domains = sql(names.domains)
  const backlog = sql(names.backlog)
  const terminal = sql(names.terminal)
  const expiry = version.expiry
  const array = version.array === true
  const { answer, end, locals, outs, returns, start } = answering(sql, version, [
    ["o_tag", "text"],
    ["o_number", "bigint"]
  ])
  return sql`CREATE OR REPLACE FUNCTION ${sql(array ? names.settleV4 : names.settle)}(
      p_domain text, p_token text, p_fail boolean, p_max_retries integer,${
    expiry ? sql` p_now bigint, p_timeout bigint${array ? sql`` : sql`,`}` : sql``
  }${
    array ? sql`` : sql`
      `
  }${outs})${returns}
    LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
      v_domain record;
      v_kind text;
      v_low bigint;${locals}
    BEGIN${start}
      SELECT * INTO v_domain FROM ${domains} d WHERE d.domain_id = p_domain FOR UPDATE;
      IF NOT FOUND OR v_domain.lease_token IS NULL THEN
        o_tag := 'LeaseNotFoundError';
        ${answer};
      END IF;
      IF v_domain.lease_token <> p_token THEN
        o_tag := 'TokenMismatchError';
        ${answer};
      END IF;
      IF p_fail AND v_domain.retry_count < p_max_retries THEN
        UPDATE ${domains} d SET retry_count = d.retry_count + 1${
    expiry
      ? sql`,
          expires_at = CASE WHEN p_timeout IS NULL THEN d.expires_at ELSE p_now + p_timeout END,
          expires_fencing = CASE WHEN p_timeout IS NULL THEN d.expires_fencing ELSE d.lease_fencing END`
      : sql``
  } WHERE d.domain_id = p_domain
        RETURNING d.retry_count INTO o_number;
        o_tag := 'RetryScheduled';
        ${answer};
      END IF;
      v_low := v_domain.low_water;
      IF NOT p_fail AND v_domain.lease_offset = v_low THEN
        v_low := v_low + 1; -- in order: the mark moves, nothing is kept
      ELSE
        INSERT INTO ${terminal} (domain_id, item, kind)
        VALUES (p_domain, v_domain.lease_offset, CASE WHEN p_fail THEN 'failed' ELSE 'processed' END);
      END IF;
      LOOP
        SELECT t.kind INTO v_kind FROM ${terminal} t WHERE t.domain_id = p_domain AND t.item = v_low;
        EXIT WHEN NOT FOUND;
        IF v_kind = 'processed' THEN
          DELETE FROM ${terminal} t WHERE t.domain_id = p_domain AND t.item = v_low;
        END IF;
        v_low := v_low + 1;
      END LOOP;
      UPDATE ${domains} d SET lease_offset = NULL, lease_token = NULL, lease_fencing = NULL, acquired_at = NULL,
        retry_count = 0, low_water = v_low${expiry ? sql`, expires_at = NULL, expires_fencing = NULL` : sql``}
      WHERE d.domain_id = p_domain;
      SELECT b.item INTO o_number FROM ${backlog} b WHERE b.domain_id = p_domain ORDER BY b.position LIMIT 1;
      o_tag := 'Released';${end}
    END $$`
}
