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
        const pool = new Pg.Pool({
          connectionString: config.url === undefined ? undefined : Redacted.value(config.url),
          user: config.username,
          host: config.host,
          database: config.database,
          password: config.password === undefined ? undefined : Redacted.value(config.password),
          ssl: config.ssl,
          port: config.port,
          connectionTimeoutMillis: config.connectTimeout === undefined
            ? undefined
            : Duration.toMillis(config.connectTimeout),
          idleTimeoutMillis: config.idleTimeout === undefined ? undefined : Duration.toMillis(config.idleTimeout),
          max: config.maxConnections,
          min: config.minConnections,
          maxLifetimeSeconds: config.connectionTTL === undefined ? undefined : Duration.toSeconds(config.connectionTTL),
          application_name: config.applicationName ?? "@effect/sql-pg",
          ...(config.types === undefined ? {} : { types: config.types })
        })
        // An idle client's error (the server went away) is the pool's to handle: it drops the client.
        pool.on("error", () => undefined)
        pool.on("connect", hideProcessId)
        return Effect.tryPromise({
          try: () => pool.query("SELECT 1"),
          catch: (cause) => cause
        }).pipe(
          Effect.timeout(config.connectTimeout ?? Duration.seconds(5)),
          Effect.as(pool),
          Effect.tapError(() => Effect.promise(() => pool.end().catch(() => undefined))),
          Effect.mapError((cause) => new SqlError({ cause, message: "PgClient: Failed to connect" }))
        )
      }),
      (pool) => Effect.promise(() => pool.end().catch(() => undefined)).pipe(Effect.timeoutOption(1_000))
    ),
    ...(config.applicationName === undefined ? {} : { applicationName: config.applicationName }),
    ...(config.types === undefined ? {} : { types: config.types })
  })

/** The driver reads `processID` to cancel; `undefined`, it does not (and node-postgres's own setter is ignored). */
const hideProcessId = (client: Pg.PoolClient): void => {
  Object.defineProperty(client, "processID", { configurable: true, get: () => undefined, set: () => undefined })
}
