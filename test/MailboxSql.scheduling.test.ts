/**
 * The scheduling contract (test/contract/SchedulingContract.ts) on SQLite and PostgreSQL: keys, priorities,
 * limits, fair shares and rates stored and enforced by the database (src/internal/mailbox/sql/keys.ts), under
 * `TestClock` as in memory. Each test's mailbox gets a table prefix of its own.
 */
import { Effect, Schema } from "effect"
import type { Mailbox } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { schedulingContract } from "./contract/SchedulingContract.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("scheduling")
let prefixes = 0

for (const backend of backends) {
  const where = new WeakMap<Mailbox<string, string>, { readonly prefix: string; readonly name: string }>()
  const admin = (mailbox: Mailbox<string, string>) =>
    Effect.flatMap(
      Effect.sync(() => where.get(mailbox)!),
      ({ name, prefix }) =>
        Effect.map(
          MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(backend.context())),
          (queues) => ({ queues, name })
        )
    )
  schedulingContract(backend.label, {
    make: (name, options) =>
      Effect.gen(function*() {
        const prefix = `sched${++prefixes}_`
        const mailbox = yield* MailboxSql.make({
          name,
          schema: Schema.String,
          replySchema: Schema.String,
          prefix,
          ...options
        })
        where.set(mailbox, { prefix, name })
        return mailbox
      }).pipe(Effect.provide(backend.context())),
    setKeySettings: (mailbox, key, settings) =>
      Effect.flatMap(admin(mailbox), ({ name, queues }) => queues.setKeySettings(name, key, settings)),
    keys: (mailbox) => Effect.flatMap(admin(mailbox), ({ name, queues }) => queues.keys(name)),
    fairnessTimeout: 300_000
  })
}
