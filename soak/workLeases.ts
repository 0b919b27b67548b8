/**
 * Work leases in the soak (property 7): the storage-fenced resource the lease workers write, and what the
 * orchestrator reads of it.
 *
 * `soak_resource` has one row per domain: `available` (how many offsets the producer has made available,
 * 0..available-1), and the resource itself — `last_offset` and the `fencing` token of its last writer. A write
 * is the fenced-write pattern of docs/coordination.md: `UPDATE … WHERE fencing <= $fencing`, so a holder whose
 * lease was taken over cannot overwrite a newer holder's write. Each accepted write also appends a row to
 * `soak_resource_log` in the same transaction; the log's `seq` per domain is the commit order (the UPDATE
 * locks the domain's row until the commit), which is what the checker reads.
 */
import { SqlClient, SqlError } from "@effect/sql"
import { Effect, Option } from "effect"
import { WorkLeaseSql } from "leasehold"
import type { Dump } from "./checker.js"
import * as Protocol from "./protocol.js"

/** The domains of a run. */
export const domains = (config: Protocol.Config): ReadonlyArray<string> =>
  Array.from({ length: config.leaseDomains }, (_, i) => `d${i}`)

/** The lease service every process of a run uses. */
export const make = (config: Protocol.Config) =>
  WorkLeaseSql.make({
    prefix: Protocol.prefix,
    leaseTimeout: config.leaseTimeoutMs,
    maxRetries: config.leaseMaxRetries
  })

/** Creates the resource tables and the lease tables (the orchestrator, before the fleet starts). */
export const setup = (config: Protocol.Config) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* make(config)
    yield* sql`CREATE TABLE IF NOT EXISTS soak_resource (
      domain TEXT PRIMARY KEY,
      available INTEGER NOT NULL,
      last_offset INTEGER NOT NULL,
      fencing INTEGER NOT NULL
    )`
    yield* sql.onDialectOrElse({
      pg: () =>
        sql`CREATE TABLE IF NOT EXISTS soak_resource_log (
          seq BIGSERIAL PRIMARY KEY, domain TEXT NOT NULL, "offset" INTEGER NOT NULL, fencing INTEGER NOT NULL,
          proc TEXT NOT NULL
        )`,
      orElse: () =>
        sql`CREATE TABLE IF NOT EXISTS soak_resource_log (
          seq INTEGER PRIMARY KEY AUTOINCREMENT, domain TEXT NOT NULL, "offset" INTEGER NOT NULL,
          fencing INTEGER NOT NULL, proc TEXT NOT NULL
        )`
    })
    for (const domain of domains(config)) {
      yield* sql`INSERT INTO soak_resource (domain, available, last_offset, fencing)
        VALUES (${domain}, 0, -1, 0) ON CONFLICT (domain) DO NOTHING`
    }
  }).pipe(Effect.orDie)

/** How many offsets each domain has available. */
export const available = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ domain: string; available: number | string }>`SELECT domain, available FROM soak_resource`
).pipe(Effect.map((rows) => new Map(rows.map((row) => [row.domain, Number(row.available)]))))

/** Makes one more offset of `domain` available (the producer, during the fault phase). */
export const offer = (domain: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`UPDATE soak_resource SET available = available + 1 WHERE domain = ${domain}`
  )

/**
 * The fenced write: the resource takes `offset` unless a writer with a higher fencing token wrote first; an
 * accepted write is logged in the same transaction. True when accepted.
 */
export const write = (domain: string, offset: number, fencing: number, proc: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql.withTransaction(Effect.gen(function*() {
      const rows = yield* sql`UPDATE soak_resource SET last_offset = ${offset}, fencing = ${fencing}
        WHERE domain = ${domain} AND fencing <= ${fencing} RETURNING domain`
      if (rows.length === 0) return false
      yield* sql`INSERT INTO soak_resource_log (domain, "offset", fencing, proc)
        VALUES (${domain}, ${offset}, ${fencing}, ${proc})`
      return true
    })).pipe(
      // `withTransaction` dies when its COMMIT or ROLLBACK fails (the connection lost to a database restart):
      // here that is the write's failure, which the worker records as not accepted (the log table is the truth).
      Effect.catchSomeDefect((defect) =>
        defect instanceof SqlError.SqlError ? Option.some(Effect.fail(defect)) : Option.none()
      )
    ))

/** Offsets made available and not yet terminal, over every domain (for the drain). */
export const pending = (config: Protocol.Config) =>
  Effect.gen(function*() {
    const leases = yield* make(config)
    const offers = yield* available
    let left = 0
    for (const domain of domains(config)) {
      const snapshot = yield* leases.inspect(domain)
      left += Math.max(0, (offers.get(domain) ?? 0) - snapshot.lowWaterMark)
    }
    return left
  }).pipe(Effect.orDie)

/** The accepted writes in commit order and what is left per domain, for the checker. */
export const dump = (config: Protocol.Config): Effect.Effect<Dump["leases"], never, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const leases = yield* make(config)
    const rows = yield* sql<
      { seq: number | string; domain: string; offset: number | string; fencing: number | string; proc: string }
    >`
      SELECT seq, domain, "offset", fencing, proc FROM soak_resource_log ORDER BY seq`
    const offers = yield* available
    const offsets: Record<string, number> = {}
    const pendingByDomain: Record<string, number> = {}
    for (const domain of domains(config)) {
      const snapshot = yield* leases.inspect(domain)
      offsets[domain] = offers.get(domain) ?? 0
      pendingByDomain[domain] = Math.max(0, (offers.get(domain) ?? 0) - snapshot.lowWaterMark)
    }
    return {
      writes: rows.map((row) => ({
        seq: Number(row.seq),
        domain: row.domain,
        offset: Number(row.offset),
        fencing: Number(row.fencing),
        proc: row.proc
      })),
      offsets,
      pending: pendingByDomain
    }
  }).pipe(Effect.orDie)
