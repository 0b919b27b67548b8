import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import * as Postgres from "./postgres.js"

describe("throwaway PostgreSQL cluster", () => {
  it.live("starts, answers a query, and stops", () =>
    Effect.gen(function*() {
      const { url } = yield* Postgres.cluster
      const rows = yield* Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        return yield* sql<{ answer: number }>`SELECT 41 + 1 AS answer`
      }).pipe(Effect.provide(Layer.fresh(PgClient.layer({ url: Redacted.make(url) }))))
      expect(rows[0]?.answer).toBe(42)
    }).pipe(Effect.scoped), 120_000)
})
