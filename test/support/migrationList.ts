/**
 * The real migration list (src/internal/sql/migrations.ts) by service: each migration's name, in order. Read on
 * a throwaway in-memory SQLite client (a service's migrations are statements of a client), so a test that
 * checks numbers or docs against it needs no database of its own.
 */
import { SqlClient } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Effect } from "effect"
import * as Registry from "../../src/internal/sql/migrations.js"

/** Each service's migration names, in order. */
export const migrationNames = (): Promise<Record<Registry.ServiceName, ReadonlyArray<string>>> =>
  Effect.runPromise(
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const names = {} as Record<Registry.ServiceName, ReadonlyArray<string>>
      for (const service of Registry.all(sql, "x_")) {
        names[service.service] = Object.keys(service.migrations).sort((a, b) => Registry.idOf(a) - Registry.idOf(b))
      }
      return names
    }).pipe(Effect.provide(SqliteClient.layer({ filename: ":memory:" })), Effect.scoped)
  )
