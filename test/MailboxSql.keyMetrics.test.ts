/**
 * `MailboxSql.keysHeldBack` (issue 45's per-queue metric) on SQLite and PostgreSQL: a claim that passes over a key
 * at its concurrency limit, or over its start rate, counts it under the queue and the reason — per queue, with no
 * key label (key names are the senders' and unbounded).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Metric, Schema } from "effect"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("keymetrics")
let n = 0

const held = (queue: string, reason: string) =>
  Effect.map(
    Metric.value(MailboxSql.keysHeldBack.pipe(Metric.tagged("queue", queue), Metric.tagged("reason", reason))),
    (state) => state.count
  )

for (const backend of backends) {
  describe(`keysHeldBack on ${backend.label}`, () => {
    it.live(
      "counts keys a claim passed over at their limit or start rate, by queue and reason",
      () =>
        Effect.gen(function*() {
          const prefix = `km${++n}_`
          const queue = `metered-${backend.label}`
          const jobs = yield* MailboxSql.make({ name: queue, schema: Schema.String, prefix })
          const admin = yield* MailboxSqlAdmin.queues({ prefix })
          yield* admin.setKeySettings(queue, "acme", { limit: 1 })
          yield* admin.setKeySettings(queue, "beta", { starts: { count: 1, per: "1 hour" } })
          for (const key of ["acme", "acme", "beta", "beta"]) yield* jobs.send(key, { key })
          const first = yield* jobs.receive({ visibilityTimeout: "10 minutes", maxMessages: 10 })
          expect(first.map((message) => message.body).sort()).toEqual(["acme", "beta"])
          const limitBefore = yield* held(queue, "limit")
          const startsBefore = yield* held(queue, "starts")
          expect(yield* jobs.receive({ visibilityTimeout: "10 minutes", maxMessages: 10, waitTime: 0 })).toEqual([])
          expect((yield* held(queue, "limit")) - limitBefore).toBeGreaterThanOrEqual(1)
          expect((yield* held(queue, "starts")) - startsBefore).toBeGreaterThanOrEqual(1)
          expect(yield* held(queue, "tokens")).toBe(0)
        }).pipe(Effect.scoped, Effect.provide(backend.context())),
      60_000
    )
  })
}
