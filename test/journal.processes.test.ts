/**
 * An agent run survives its worker, on SQLite and PostgreSQL, with real processes: a MainLoop.agent worker
 * (test/fixtures/resumable-agent-worker.ts: a local model stub, three tool calls, one of them a charge the test
 * counts) is SIGKILLed right after the third step of its run; a new worker picks the request up when its
 * lease runs out and replays the journal — no model call and no tool call for the first three steps — and
 * answers what an uninterrupted run answers. The charge was made once, and the journal is gone after the ack.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import { spawnBundled } from "./helpers.js"
import { processBackends } from "./support/processBackends.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-journal-"))
const sqliteFile = join(directory, "agent.db")
let tables = 0

const backends = processBackends(sqliteFile)

const WORKER = "test/fixtures/resumable-agent-worker.ts"

/** The log's lines written by process `pid`, without the pid. */
const linesOf = (logFile: string, pid?: number) =>
  readFileSync(logFile, "utf8").split("\n").filter((line) =>
    line !== "" && (pid === undefined || line.endsWith(` pid=${pid}`))
  )
    .map((line) => line.replace(/ pid=\d+$/, ""))

for (const backend of backends) {
  describe(`the step journal across processes on ${backend.label}`, () => {
    it.live(
      "a run SIGKILLed after its third step resumes on the next worker: no model or tool call repeated, one charge",
      () =>
        Effect.gen(function*() {
          const prefix = `j${++tables}_`
          const sql = yield* SqlClient.SqlClient
          const requests = yield* MailboxSql.make({
            name: "agent-requests",
            schema: MainLoop.requestSchema(Schema.String),
            prefix
          })
          const replies = yield* MailboxSql.make({
            name: "agent-replies",
            schema: MainLoop.resultSchema(Schema.String),
            prefix
          })
          const logFile = join(directory, `${prefix}log`)
          writeFileSync(logFile, "")
          const journal = () =>
            Effect.map(
              sql<{ step_key: string }>`SELECT step_key FROM ${sql(`${prefix}mailbox_journal`)} ORDER BY position`,
              (rows) => rows.map((row) => row.step_key)
            )

          const interrupted = yield* requests.send(MainLoop.request("q", { requestId: "interrupted" }), {
            replyTo: "agent-replies"
          })
          // A charge's idempotency key is the stored message's identity (the database's, and the message's seq).
          const [database] = yield* sql<{ id: string }>`SELECT id FROM ${sql(`${prefix}mailbox_identity`)}`
          const keyOf = (messageId: string) => `${database!.id}.${messageId}/1.3`
          const first = yield* spawnBundled(WORKER, [backend.target(), prefix, logFile, "hang"])
          yield* first.waitFor(/^hanging$/m, 60_000)
          // The first turn and its two tools are recorded; the model is working on the second turn.
          expect(yield* journal()).toEqual(["1.1", "1.2", "1.3"])
          yield* first.signal("SIGKILL")
          expect((yield* first.exited).signal).toBe("SIGKILL")
          expect(linesOf(logFile, first.pid)).toEqual([
            "provider interrupted turn=1",
            "lookup interrupted a",
            `charge ${keyOf(interrupted)}`,
            "provider interrupted turn=2"
          ])

          // A second worker takes the request over once its lease runs out, and answers a fresh one too.
          const uninterrupted = yield* requests.send(MainLoop.request("q", { requestId: "uninterrupted" }), {
            replyTo: "agent-replies"
          })
          const second = yield* spawnBundled(WORKER, [backend.target(), prefix, logFile])
          for (let waited = 0; (yield* replies.approximateCount) < 2; waited++) {
            if (waited > 600) {
              return yield* Effect.dieMessage(
                `no replies after 60 s:\n${second.output()}\n${linesOf(logFile).join("\n")}`
              )
            }
            yield* Effect.sleep("100 millis")
          }
          yield* second.signal("SIGTERM")
          expect((yield* second.exited).code, second.output()).toBe(0)

          const answers = new Map<string, MainLoop.MainLoopResult<string>>()
          for (const reply of yield* replies.receive({ maxMessages: 10 })) answers.set(reply.body.requestId, reply.body)
          const resumed = answers.get("interrupted")!
          const straight = answers.get("uninterrupted")!
          expect(resumed.error).toBeUndefined()
          expect(resumed.runContext.attempt).toBe(2)
          expect(resumed.output).toBe(straight.output)
          expect(resumed.output).toBe("answer from \"definition of a\" + \"charged 5\" + \"definition of b\"")
          // The resumed run asked the model for its second and third turns only and ran only the third tool.
          expect(
            linesOf(logFile, second.pid).filter((line) =>
              /\binterrupted\b/.test(line) && !line.includes("uninterrupted")
            )
          ).toEqual([
            "provider interrupted turn=2",
            "lookup interrupted b",
            "provider interrupted turn=3"
          ])
          expect(linesOf(logFile).filter((line) => line.startsWith("charge"))).toEqual([
            `charge ${keyOf(interrupted)}`,
            `charge ${keyOf(uninterrupted)}`
          ])
          // Both journals went with their acknowledgements.
          expect(yield* journal()).toEqual([])
          expect(yield* requests.approximateCount).toBe(0)
        }).pipe(
          Effect.provideService(SqlClient.SqlClient, backend.client()),
          Effect.provide(MailboxResolver.layer()),
          Effect.scoped
        ),
      180_000
    )
  })
}
