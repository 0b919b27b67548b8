/**
 * The command line's one printer (src/cli/output.ts, issue 43 finding 7), against a SQLite file and a throwaway
 * PostgreSQL, each command run as a child process: what another party stored — a request id, a queue name, a
 * body, an error, a worker's name, a health server's reasons — carries ESC, BEL, a CSI, a C1 CSI (U+009B), bidi
 * overrides and isolates; every command prints it escaped (`\u001b`, `\u009b`, `\u202e`), headers and error
 * messages included, and `--json` stays JSON that parses to the very values stored.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { DateTime, Effect, Schema } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { printable, printableLines } from "../src/cli/output.js"
import { journalOf } from "../src/internal/journal.js"
import * as Sql from "../src/internal/sql/common.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { leasehold } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("escape")

let tables = 0
let prefix = "e0_"
beforeEach(() => {
  prefix = `e${++tables}_`
})

/** What a hostile sender stores: a retitle (OSC … BEL), a clear screen (CSI), a C1 CSI, bidi overrides. */
const hostile = "\u001b]0;owned\u0007\u001b[2J\u009b31m\u202egpj.exe\u2066x\u2069\u200f\u2028end"
/** A queue name the name rule accepts (no control character) that still reorders a line: bidi only. */
const queue = "inbox\u202egpj.exe\u2066"

/** Any character the printer must never let through (newlines and the table's spaces aside). */
const raw = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/

const TIMEOUT = 120_000

/** Fails naming the command if its output holds a raw control or bidi character. */
const clean = (what: string, run: { readonly stdout: string; readonly stderr: string }) => {
  const found = raw.exec(run.stdout + run.stderr)
  expect(found === null ? null : `${what}: U+${found[0].charCodeAt(0).toString(16)}`).toBeNull()
}

describe("the printer", () => {
  it("escapes C0, DEL, C1, bidi controls, separators and lone surrogates; keeps text and pairs", () => {
    expect(printable("a\u001b[2Jb")).toBe("a\\u001b[2Jb")
    expect(printable("\u009b\u202e\u2066\u2069\u200e\u061c\u2028\u007f\n\t")).toBe(
      "\\u009b\\u202e\\u2066\\u2069\\u200e\\u061c\\u2028\\u007f\\u000a\\u0009"
    )
    expect(printable("\ud800x\udc00")).toBe("\\ud800x\\udc00")
    expect(printable("café 😀 €")).toBe("café 😀 €")
    expect(printableLines("one\ntwo\u001b")).toBe("one\ntwo\\u001b")
  })
})

for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  describe(`the command line on ${backend.label}`, () => {
    it.live(
      "prints every stored string escaped: journal header, peek, dlq list, stats, workers, errors; --json round-trips",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const jobs = yield* MailboxSql.make({ name: queue, schema: Schema.String, prefix })
          yield* jobs.send(hostile)
          const [message] = yield* jobs.receive({ visibilityTimeout: "10 minutes" })
          // The journal: the request id is the sender's; so is what a step recorded.
          yield* journalOf(message!)!.append({
            position: 1,
            key: "1",
            entry: JSON.stringify({ _tag: "Tool", toolName: hostile }),
            requestId: hostile
          })
          // A dead letter whose error quotes the sender.
          const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
          yield* letters.sink(Schema.String).send({
            messageId: "9999",
            body: hostile,
            sourceMailbox: queue,
            deliveryCount: 3,
            lastError: `Boom: ${hostile}`,
            lastErrorTag: "Boom",
            enqueuedAt: DateTime.unsafeMake(0),
            deadLetteredAt: DateTime.unsafeMake(0),
            requestId: hostile,
            replyTo: undefined,
            traceId: undefined
          })
          // A worker's row as a hostile process (or a damaged table) would write it.
          yield* MailboxSqlAdmin.workers({ prefix })
          const loops = JSON.stringify([
            { name: hostile, queue: hostile, state: "running", messageId: hostile, beatAgeMillis: 5 }
          ])
          yield* sql`INSERT INTO ${sql(`${prefix}mailbox_worker_instances`)}
            (instance, process, name, started_at, version, loops, refreshed_at)
            VALUES (${hostile}, ${hostile}, ${hostile}, 0, ${hostile}, ${loops}, ${Sql.databaseNow(sql)})`

          const args = ["--db", backend.db(), "--prefix", prefix]
          const escaped = printable(hostile)

          const header = yield* leasehold("mailbox", "journal", "--id", message!.id, ...args)
          expect(header.code).toBe(0)
          clean("journal", header)
          expect(header.stdout).toContain(`message ${message!.id} (queued) in ${printable(queue)}, request ${escaped}`)
          expect(header.stdout).toContain(`Tool tool=${escaped}`)
          const headerJson = yield* leasehold("mailbox", "journal", "--id", message!.id, "--json", ...args)
          clean("journal --json", headerJson)
          expect(JSON.parse(headerJson.stdout)).toMatchObject({ requestId: hostile, queue })

          const peek = yield* leasehold("mailbox", "peek", queue, ...args)
          expect(peek.code).toBe(0)
          clean("peek", peek)
          expect(peek.stdout).toContain("\\u009b31m\\u202egpj.exe")
          const peekJson = yield* leasehold("mailbox", "peek", queue, "--json", ...args)
          clean("peek --json", peekJson)
          expect((JSON.parse(peekJson.stdout) as ReadonlyArray<{ body: unknown }>)[0]!.body).toBe(hostile)

          const dlq = yield* leasehold("mailbox", "dlq", "list", ...args)
          expect(dlq.code).toBe(0)
          clean("dlq list", dlq)
          expect(dlq.stdout).toContain(printable(queue))
          expect(dlq.stdout).toContain("\\u001b]0;owned\\u0007")
          const dlqJson = yield* leasehold("mailbox", "dlq", "list", "--json", ...args)
          clean("dlq list --json", dlqJson)
          expect((JSON.parse(dlqJson.stdout) as ReadonlyArray<{ error: string }>)[0]!.error).toBe(`Boom: ${hostile}`)

          const stats = yield* leasehold("mailbox", "stats", ...args)
          clean("stats", stats)
          expect(stats.stdout).toContain(printable(queue))

          const workers = yield* leasehold("workers", ...args)
          expect(workers.code).toBe(0)
          clean("workers", workers)
          expect(workers.stdout).toContain(escaped.slice(0, 20))
          const workersJson = yield* leasehold("workers", "--json", ...args)
          clean("workers --json", workersJson)
          expect(JSON.parse(workersJson.stdout)).toMatchObject([{ process: hostile, instance: hostile, name: hostile }])

          // Errors that name stored values: a queue not there lists the queues there; a purge asks for --yes.
          const missing = yield* leasehold("mailbox", "peek", "nosuch", ...args)
          expect(missing.code).toBe(1)
          clean("peek nosuch", missing)
          expect(missing.stderr).toContain("\\u202e")
          const purge = yield* leasehold("mailbox", "purge", queue, ...args)
          expect(purge.code).toBe(2)
          clean("purge without --yes", purge)
          expect(purge.stderr).toContain(printable(queue))
          // Commands that echo the queue they acted on.
          for (const command of ["pause", "resume"]) {
            const done = yield* leasehold("mailbox", command, queue, ...args)
            expect(done.code).toBe(0)
            clean(command, done)
          }
        }).pipe(Effect.scoped, onDb),
      TIMEOUT
    )
  })
}

describe("leasehold health", () => {
  it.live("prints a health server's reasons escaped, as text and as JSON", () =>
    Effect.gen(function*() {
      const server = createServer((request, response) => {
        if (request.url === "/health/live") return void response.writeHead(200).end("ok")
        response.writeHead(503, { "content-type": "application/json" })
          .end(JSON.stringify({ ready: false, reasons: [hostile] }))
      })
      yield* Effect.acquireRelease(
        Effect.async<void>((resume) => void server.listen(0, "127.0.0.1", () => resume(Effect.void))),
        () => Effect.sync(() => server.close())
      )
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
      const text = yield* leasehold("health", "--url", url)
      expect(text.code).toBe(1)
      clean("health", text)
      expect(text.stdout).toContain(printable(hostile))
      const json = yield* leasehold("health", "--url", url, "--json")
      clean("health --json", json)
      expect(JSON.parse(json.stdout)).toMatchObject({ ready: false, reasons: [hostile] })
    }).pipe(Effect.scoped), TIMEOUT)
})
