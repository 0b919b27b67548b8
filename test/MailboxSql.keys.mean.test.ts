/**
 * A key's mean lease is an average (an exponential one: 1001 then 1000 held make 1000.75), and the claim charges
 * it to the lease as a whole number of milliseconds: PostgreSQL refused the claim when the fraction reached its
 * BIGINT `charged` column ("invalid input syntax for type bigint"), so a keyed queue stopped being served once
 * its leases' lengths were not multiples of four. On SQLite and PostgreSQL, under `TestClock`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema, TestClock } from "effect"
import * as MailboxSql from "../src/MailboxSql.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("keymean")
let prefixes = 0

for (const backend of backends) {
  describe(`MailboxSql keys on ${backend.label}`, () => {
    it.scoped("a claim after leases whose mean is fractional", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix: `mean${++prefixes}_` })
        for (let n = 0; n < 3; n++) yield* jobs.send(n, { key: "tenant" })
        for (const held of [1001, 1000]) {
          const [message] = yield* jobs.receive({ visibilityTimeout: "1 minute" })
          yield* TestClock.adjust(held)
          yield* message!.acknowledge
        }
        const last = yield* jobs.receive({ visibilityTimeout: "1 minute" })
        expect(last.map((message) => message.body)).toEqual([2])
      }).pipe(Effect.provide(backend.context())))
  })
}
