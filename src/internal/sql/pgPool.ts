/**
 * PostgreSQL clients whose interrupted statements never cancel another fiber's.
 *
 * `@effect/sql-pg` (0.53) answers an interrupted statement with `SELECT pg_cancel_backend(pid)` sent on another
 * connection of the pool. A cancel names a backend, not a statement: when the interrupted statement finishes
 * first, its connection goes back to the pool and the cancel, arriving late, fails whatever that connection runs
 * next — another fiber's claim, settle or ROLLBACK fails with "canceling statement due to user request"
 * (Effect-TS/effect#8068; test/Database.cancel.test.ts's 8,000 interrupts of `SELECT 1` beside 3 busy fibers
 * failed bystanders in every run with it, and in none without; our tests' rare "canceling statement" failures). leasehold's statements are short (a lock wait ends within the
 * holder's 5 s idle bound), so here an interrupted statement is left to finish on the server: its connection
 * serves the next caller after it (node-postgres queues statements per connection), and nothing else fails.
 *
 * How: the pool is made here (as the driver's `make` makes it) and every client it connects hides its backend's
 * process id, which the driver needs to send the cancel and skips it without. `Database.layerPg` and each
 * store's lane (`store.ts`) are made this way; a `PgClient` layer a user builds keeps the driver's behaviour.
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
import type * as SqlClient from "@effect/sql/SqlClient"
import { SqlError } from "@effect/sql/SqlError"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import type * as Pg from "pg"

/** The driver and the `pg` it runs on. */
export interface Drivers {
  readonly PgClient: typeof PgClient
  readonly Pg: typeof Pg
}

/** Loads the driver and `pg` (the driver's dependency, so installed with it). */
export const load = (): Promise<Drivers> =>
  Promise.all([import("@effect/sql-pg/PgClient"), import("pg")]).then(([loaded, pg]) => ({
    PgClient: loaded,
    // pg 8.15 and later have named ESM exports; before, only the CommonJS module as the default.
    Pg: (typeof pg.Pool === "function" ? pg : pg.default) as unknown as typeof Pg
  }))

/** What a pool is made from: the driver's own settings (a store's lane copies its client's). */
export type Config = Pick<
  PgClient.PgClientConfig,
  | "url"
  | "host"
  | "port"
  | "database"
  | "username"
  | "password"
  | "ssl"
  | "maxConnections"
  | "minConnections"
  | "idleTimeout"
  | "connectTimeout"
  | "connectionTTL"
  | "applicationName"
  | "types"
>

/** The client of `config` (a `PgClient`, provided as the `SqlClient` too), its pool closed with the layer. */
export const layer = (
  { Pg, PgClient }: Drivers,
  config: Config
): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError> =>
  PgClient.layerFromPool({
    acquire: Effect.acquireRelease(
      Effect.suspend(() => {
        const settings = {
          connectionString: config.url === undefined ? undefined : Redacted.value(config.url),
          user: config.username,
          host: config.host,
          database: config.database,
          password: config.password === undefined ? undefined : Redacted.value(config.password),
          ssl: config.ssl,
          port: config.port,
          application_name: config.applicationName ?? "@effect/sql-pg",
          ...(config.types === undefined ? {} : { types: config.types })
        }
        const pool = retiring(
          Pg,
          new Pg.Pool({
            ...settings,
            connectionTimeoutMillis: config.connectTimeout === undefined
              ? undefined
              : Duration.toMillis(config.connectTimeout),
            idleTimeoutMillis: config.idleTimeout === undefined ? undefined : Duration.toMillis(config.idleTimeout),
            max: config.maxConnections,
            min: config.minConnections,
            maxLifetimeSeconds: config.connectionTTL === undefined
              ? undefined
              : Duration.toSeconds(config.connectionTTL)
          }),
          settings
        )
        // An idle client's error (the server went away) is the pool's to handle: it drops the client.
        pool.on("error", () => undefined)
        return Effect.tryPromise({
          try: () => pool.query("SELECT 1"),
          catch: (cause) => cause
        }).pipe(
          // Interruptible inside the acquisition, so the timeout can end a server that accepts and never answers.
          Effect.interruptible,
          Effect.timeout(config.connectTimeout ?? Duration.seconds(5)),
          Effect.as(pool),
          Effect.tapError(() => Effect.sync(() => void pool.end().catch(() => undefined))),
          Effect.mapError((cause) => new SqlError({ cause, message: "PgClient: Failed to connect" }))
        )
      }),
      (pool) => Effect.promise(() => pool.end().catch(() => undefined)).pipe(Effect.timeoutOption(1_000))
    ),
    ...(config.applicationName === undefined ? {} : { applicationName: config.applicationName }),
    ...(config.types === undefined ? {} : { types: config.types })
  })

/** The driver's cancel of an interrupted statement, as it sends it through the pool. */
const driverCancel = /^SELECT pg_cancel_backend\((\d+)\)$/

/**
 * `pool`, whose connections an interrupted statement retires: the driver's cancel (`pool.query` of
 * `pg_cancel_backend(pid)`) is answered at once and sent on a connection of its own, outside the pool (so a full
 * pool does not hold it up), and the connection it names is closed when released rather than handed to anyone
 * else — the cancel, however late it lands, finds only the statement it was meant for (or nothing).
 */
const retiring = (Pg: Drivers["Pg"], pool: Pg.Pool, settings: Pg.ClientConfig): Pg.Pool => {
  const byProcess = new Map<number, Pg.PoolClient>()
  const retired = new WeakSet<Pg.PoolClient>()
  pool.on("connect", (client) => {
    const processId = (client as { readonly processID?: number | null }).processID
    if (typeof processId === "number") byProcess.set(processId, client)
    // The pool sets `release` at each checkout: released while retired, the connection is closed, not kept.
    let release: (error?: Error | boolean) => void = () => undefined
    Object.defineProperty(client, "release", {
      configurable: true,
      get: () => (error?: Error | boolean) =>
        release(error ?? (retired.has(client) ? new Error("interrupted statement: connection retired") : undefined)),
      set: (assigned: typeof release) => {
        release = assigned
      }
    })
  })
  pool.on("remove", (client) => {
    const processId = (client as { readonly processID?: number | null }).processID
    if (typeof processId === "number" && byProcess.get(processId) === client) byProcess.delete(processId)
  })
  const query = pool.query.bind(pool) as (...args: ReadonlyArray<unknown>) => unknown
  Object.defineProperty(pool, "query", {
    configurable: true,
    value: (...args: ReadonlyArray<unknown>) => {
      const match = typeof args[0] === "string" ? driverCancel.exec(args[0]) : null
      const callback = args[args.length - 1]
      if (match === null || typeof callback !== "function") return query(...args)
      const client = byProcess.get(Number(match[1]))
      if (client !== undefined) retired.add(client)
      cancelAside(Pg, settings, Number(match[1]))
      ;(callback as () => void)()
      return undefined
    }
  })
  return pool
}

/** `pg_cancel_backend(processId)` on a connection of its own, in the background; its failure is ignored. */
const cancelAside = (Pg: Drivers["Pg"], settings: Pg.ClientConfig, processId: number): void => {
  const client = new Pg.Client({ ...settings, connectionTimeoutMillis: 5_000, query_timeout: 5_000 })
  client.on("error", () => undefined)
  client.connect()
    .then(() => client.query("SELECT pg_cancel_backend($1)", [processId]))
    .catch(() => undefined)
    .finally(() => void client.end().catch(() => undefined))
}
