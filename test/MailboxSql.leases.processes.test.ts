/**
 * Leases at scale, in a real process, on SQLite and PostgreSQL: one worker
 * process runs 2,000 MainLoops (1,000 on SQLite) on one mailbox, every job beating every
 * 100 ms for longer than its visibility — no lease of a live, beating
 * worker runs out: every job runs once, no handle expires, every extension
 * lands (extensions group-commit ahead of claims: internal/mailbox/sql/extensions.ts).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import { spawnBundled } from "./helpers.js"
import { processBackends } from "./support/processBackends.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-leases-"))
const backends = processBackends(join(directory, "mailbox.db"))

/**
 * Jobs at once: SQLite's statements run on the worker's own thread, which the beats of 2,000 jobs (20,000 a second)
 * already keep busy on a shared 2-core machine, so its run holds fewer.
 */
const JOBS_OF = { SQLite: 1000, PostgreSQL: 2000 } as const
/** Each job's length, its visibility, the extender's interval and extension (ms): a job outlives its visibility. */
const JOB = 7000
const VISIBILITY = 5000
const INTERVAL = 1000
const EXTENSION = 5000

let tables = 0
for (const backend of backends) {
  const JOBS = JOBS_OF[backend.label]
  describe(`MailboxSql leases at scale on ${backend.label}`, () => {
    it.live(
      `${JOBS} jobs at once in one process, each beating every 100 ms past its visibility: no lease runs out`,
      () =>
        Effect.gen(function*() {
          const prefix = `l${++tables}_`
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: MainLoop.requestSchema(Schema.Number), prefix })
          yield* Effect.forEach(Array.from({ length: JOBS }, (_, n) => n), (n) => jobs.send(MainLoop.request(n)), {
            concurrency: 64,
            discard: true
          })
          const worker = yield* spawnBundled("test/fixtures/lease-worker.ts", [
            backend.target(),
            prefix,
            String(JOBS),
            String(JOB),
            String(VISIBILITY),
            String(INTERVAL),
            String(EXTENSION)
          ])
          yield* worker.waitFor(/^stats /m, 90_000)
          const exit = yield* worker.exited
          const output = worker.output()
          const executions = new Map<string, number>()
          let redeliveries = 0
          for (const [, id, attempt] of output.matchAll(/^exec (\S+) (\d+)$/gm)) {
            executions.set(id!, (executions.get(id!) ?? 0) + 1)
            if (attempt !== "1") redeliveries++
          }
          const stats = JSON.parse(/^stats (.*)$/m.exec(output)![1]!) as {
            extended: number
            failed: number
            statements: number
            rows: number
            maxRows: number
          }
          const expired = output.match(/receipt handle expired|ReceiptHandleExpired/gi)?.length ?? 0
          yield* Effect.logInfo(
            `${backend.label}: ${JOBS} jobs, ${redeliveries} redelivered, ${expired} expired handles logged, ` +
              `${stats.extended} extensions in ${stats.statements} statements (max ${stats.maxRows} rows), ` +
              `${stats.failed} failed`
          )
          expect(exit.code).toBe(0)
          expect(redeliveries).toBe(0)
          expect(expired).toBe(0)
          expect(stats.failed).toBe(0)
          expect(executions.size).toBe(JOBS)
          expect([...executions.values()].filter((count) => count !== 1)).toEqual([])
          expect(stats.extended).toBeGreaterThanOrEqual(JOBS * 2) // each job extended on its first beat and later
          expect(yield* jobs.approximateCount).toBe(0)
        }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped),
      150_000
    )
  })
}
