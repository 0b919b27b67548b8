/**
 * The mailbox process contract (test/contract/ProcessContract.ts) on SQLite and PostgreSQL: worker processes
 * SIGKILLed under load lose nothing and answer each request once; four receiving processes never share a message.
 */
import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import { mailboxProcessContract } from "./contract/ProcessContract.js"
import { processBackends } from "./support/processBackends.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-crash-"))

for (const backend of processBackends(join(directory, "mailbox.db"))) {
  mailboxProcessContract({
    label: backend.label,
    target: backend.target,
    directory,
    open: (name, schema, prefix) =>
      MailboxSql.make({ name, schema, prefix }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()))
  })
}
