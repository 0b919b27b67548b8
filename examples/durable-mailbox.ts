/**
 * The durable mailbox on SQLite: requests survive the process, replies commit
 * with their request's acknowledgement, a request that keeps failing lands in
 * the dead-letter table (and is redriven), and a stored body that no longer
 * decodes is dead-lettered instead of crashing the worker.
 *
 *   npx tsx --conditions=leasehold-source examples/durable-mailbox.ts
 *
 * Switch to PostgreSQL with MailboxSql.layerPg({ url }).
 */
import { NodeRuntime } from "@effect/platform-node"
import { SqlClient } from "@effect/sql"
import { Effect, Schema } from "effect"
import { DeadLetter, MailboxSql, MailboxSqlAdmin, MainLoop } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const Request = Schema.Struct({ text: Schema.String })
const filename = join(mkdtempSync(join(tmpdir(), "leasehold-example-")), "mailbox.db")

Effect.gen(function*() {
  const requests = yield* MailboxSql.make({
    name: "requests",
    schema: MainLoop.requestSchema(Request),
    replySchema: MainLoop.resultSchema(Schema.String) // replies reach any queue of this database
  })
  const responses = yield* MailboxSql.make({ name: "responses", schema: MainLoop.resultSchema(Schema.String) })
  const deadLetters = yield* MailboxSqlAdmin.deadLetters()

  const loop = yield* MainLoop.make({
    requests,
    execute: ({ text }: { readonly text: string }) =>
      text === "%%%" ? Effect.fail(new Error(`cannot handle "${text}"`)) : Effect.succeed(text.toUpperCase()),
    config: {
      deadLetters: {
        mailbox: deadLetters.sink(MainLoop.requestSchema(Request)),
        policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 })
      }
    }
  })
  yield* requests.send(MainLoop.request({ text: "hello" }, { requestId: "r1" }), { replyTo: "responses" })
  yield* requests.send(MainLoop.request({ text: "%%%" }, { requestId: "r2" }), { replyTo: "responses" })
  const corrupt = yield* requests.send(MainLoop.request({ text: "fine" }, { requestId: "r3" }))
  // Someone edits a stored row by hand: it no longer decodes.
  const sql = yield* SqlClient.SqlClient
  yield* sql`UPDATE leasehold_mailbox_messages SET body = '{"oops":1}' WHERE seq = ${Number(corrupt)}`

  yield* loop.run({ maxIterations: 3, waitTime: 0 })

  for (const { body } of yield* responses.receive({ maxMessages: 10 })) {
    yield* Effect.log(`${body.requestId}: ${body.success ? `ok ${body.output}` : `error ${body.error?.message}`}`)
  }
  for (const letter of yield* deadLetters.list()) {
    const why = letter.error.split("\n").map((line) => line.replace(/^[└─\s]+/, "")).slice(-2).join(" ")
    yield* Effect.log(`dead letter ${letter.id} from "${letter.queue}": ${letter.errorTag}: ${why}`)
  }
  const redriven = yield* deadLetters.redrive({ queue: "requests", ids: [(yield* deadLetters.list())[0]!.id] })
  yield* Effect.log(`redrove ${redriven}; requests queued: ${yield* requests.approximateCount}; file: ${filename}`)
}).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename })), NodeRuntime.runMain)
