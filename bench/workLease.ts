/**
 * WorkLease benchmarks: tryAcquire + succeed pairs per second, STM against a
 * plain Map + Semaphore implementation of the same contract, the state size
 * after a million sequential offsets, and the SQL store's pairs (one domain
 * from one fiber; many domains from 8 fibers).
 */
import { PgClient } from "@effect/sql-pg"
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect, Layer, Redacted } from "effect"
import { WorkLease } from "leasehold"
import * as WorkLeaseSql from "leasehold/WorkLeaseSql"
import { randomUUID } from "node:crypto"
import { performance } from "node:perf_hooks"

/** Times the part of a round that counts (not opening the client and the lease's tables). */
const timedPairs = <E>(pairs: number, effect: Effect.Effect<unknown, E>) =>
  Effect.suspend(() => {
    const started = performance.now()
    return Effect.map(effect, () => ({ operations: pairs, millis: performance.now() - started }))
  })

/** The baseline: one mutable record and one semaphore per domain. */
export const makeBaseline = Effect.sync(() => {
  interface Domain {
    lease: { offset: number; token: string; fencingToken: number } | undefined
    backlog: Array<number>
    processed: Set<number>
    fencingToken: number
    readonly lock: Effect.Semaphore
  }
  const domains = new Map<string, Domain>()
  const domain = (id: string) => {
    let d = domains.get(id)
    if (d === undefined) {
      d = { lease: undefined, backlog: [], processed: new Set(), fencingToken: 0, lock: Effect.unsafeMakeSemaphore(1) }
      domains.set(id, d)
    }
    return d
  }
  return {
    tryAcquire: (id: string, offset: number) => {
      const d = domain(id)
      const token = randomUUID()
      return d.lock.withPermits(1)(Effect.sync(() => {
        if (d.processed.has(offset)) return "AlreadyProcessed" as const
        if (d.lease !== undefined) {
          if (d.lease.offset === offset) return d.lease.token
          if (!d.backlog.includes(offset)) d.backlog.push(offset)
          return "Enqueued" as const
        }
        if (d.backlog.length > 0 && d.backlog[0] !== offset) return "BacklogOrdering" as const
        d.backlog.shift()
        d.lease = { offset, token, fencingToken: ++d.fencingToken }
        return token
      }))
    },
    succeed: (id: string, token: string) => {
      const d = domain(id)
      return d.lock.withPermits(1)(Effect.sync(() => {
        if (d.lease === undefined || d.lease.token !== token) return false
        d.processed.add(d.lease.offset)
        d.lease = undefined
        return true
      }))
    }
  }
})

const PAIRS = 100_000

/** `fibers` fibers, each driving its own share of `domains` with sequential offsets, one `pair` per step. */
const drive = (domains: number, fibers: number, pair: (domain: string, offset: number) => Effect.Effect<void>) =>
  Effect.gen(function*() {
    const perFiber = Math.ceil(PAIRS / fibers)
    const share = Math.max(1, Math.floor(domains / fibers))
    yield* Effect.all(
      Array.from({ length: fibers }, (_, f) =>
        Effect.gen(function*() {
          for (let i = 0; i < perFiber; i++) {
            yield* pair(`d${(f + fibers * (i % share)) % domains}`, Math.floor(i / share))
          }
        })),
      { concurrency: "unbounded", discard: true }
    )
    return perFiber * fibers
  })

export const stmPairs = (domains: number, fibers: number) => () =>
  Effect.flatMap(Effect.orDie(WorkLease.make()), (lease) =>
    drive(domains, fibers, (domain, offset) =>
      Effect.flatMap(
        Effect.orDie(lease.tryAcquire(domain, offset)),
        (result) =>
          result._tag === "Acquired" ? Effect.asVoid(Effect.orDie(lease.succeed(domain, result.token))) : Effect.void
      )))

export const baselinePairs = (domains: number, fibers: number) => () =>
  Effect.flatMap(
    makeBaseline,
    (lease) =>
      drive(domains, fibers, (domain, offset) =>
        Effect.flatMap(lease.tryAcquire(domain, offset), (token) =>
          Effect.asVoid(lease.succeed(domain, token))))
  )

/** State of one domain after `n` sequential offsets, with the default retention. */
export const retainedAfter = (n: number) =>
  Effect.gen(function*() {
    const lease = yield* WorkLease.make()
    for (let offset = 0; offset < n; offset++) {
      const result = yield* Effect.orDie(lease.tryAcquire("A", offset))
      if (result._tag === "Acquired") yield* Effect.orDie(lease.succeed("A", result.token))
    }
    return yield* lease.inspect("A")
  })

const SQL_PAIRS = 2_000
const SQL_FIBERS = 8
const SQL_DOMAINS_PER_FIBER = 4

/** One pair on a SQL store: the acquisition must be new (each round works domains of its own). */
const sqlPair = (lease: WorkLeaseSql.SqlWorkLease, domain: string, offset: number) =>
  Effect.flatMap(lease.tryAcquire(domain, offset), (result) =>
    result._tag === "Acquired"
      ? Effect.asVoid(lease.succeed(domain, result.token))
      : Effect.dieMessage(`${domain} ${offset}: ${result._tag}`))

/** Sequential tryAcquire + succeed pairs through one domain on a SQL store (one connection's worth). */
export const sqlPairs = (client: Layer.Layer<SqlClient.SqlClient, unknown>, prefix: string) => () =>
  Effect.gen(function*() {
    const lease = yield* WorkLeaseSql.make({ prefix })
    const domain = `bench-${randomUUID()}`
    return yield* timedPairs(
      SQL_PAIRS,
      Effect.gen(function*() {
        for (let offset = 0; offset < SQL_PAIRS; offset++) yield* sqlPair(lease, domain, offset)
      })
    )
  }).pipe(Effect.provide(Layer.fresh(client)), Effect.orDie)

/**
 * Many domains from 8 fibers: each fiber works its own 4 domains in turn (sequential offsets in each), so
 * calls run side by side on the pool's connections (PostgreSQL) or queue for the file's one (SQLite).
 */
export const sqlManyDomains = (client: Layer.Layer<SqlClient.SqlClient, unknown>, prefix: string) => () =>
  Effect.gen(function*() {
    const lease = yield* WorkLeaseSql.make({ prefix })
    const round = randomUUID()
    const perFiber = (2 * SQL_PAIRS) / SQL_FIBERS
    return yield* timedPairs(
      perFiber * SQL_FIBERS,
      Effect.all(
        Array.from({ length: SQL_FIBERS }, (_, fiber) =>
          Effect.gen(function*() {
            for (let i = 0; i < perFiber; i++) {
              const domain = `bench-${round}-${fiber}-${i % SQL_DOMAINS_PER_FIBER}`
              yield* sqlPair(lease, domain, Math.floor(i / SQL_DOMAINS_PER_FIBER))
            }
          })),
        { concurrency: "unbounded", discard: true }
      )
    )
  }).pipe(Effect.provide(Layer.fresh(client)), Effect.orDie)

/**
 * A client of the PostgreSQL server at `url` over its Unix socket (asked over TCP where the socket is): the
 * one-domain pairs are one round trip after another, and a worker on the database's machine connects this way.
 */
export const pgOverUnixSocket = (url: string): Promise<Layer.Layer<SqlClient.SqlClient, unknown>> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const [server] = yield* sql<{ dir: string; port: string; username: string; database: string }>`
      SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS dir,
        current_setting('port') AS port, current_user AS username, current_database() AS database`
    return PgClient.layer({
      host: server!.dir.trim(),
      port: Number(server!.port),
      username: server!.username,
      database: server!.database
    }) as Layer.Layer<SqlClient.SqlClient, unknown>
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })), Effect.orDie, Effect.runPromise)
