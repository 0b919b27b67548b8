/**
 * A sick store never kills a loop: a worker process whose SQLite file sits on a disk that fills up (a real
 * small tmpfs when the test may mount one, else a file size limit on the worker) keeps running, logs the
 * failures and retries with backoff, and when space returns handles every message; a worker whose database
 * file is deleted under it stays alive and still drains on SIGTERM.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import { spawnBundled } from "./helpers.js"
import { smallDisk } from "./support/fullDisk.js"

/** better-sqlite3 itself (it ships no types): a connection of the test's own, to hold the file's write lock. */
const Sqlite = createRequire(import.meta.url)("better-sqlite3") as new(file: string) => {
  pragma(statement: string): unknown
  exec(statement: string): void
  close(): void
}

const worker = "test/fixtures/sick-store-worker.ts"
const scratch = mkdtempSync(join(tmpdir(), "leasehold-sick-"))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

/** Sends `count` jobs (0..count-1) to "jobs" in `file`, from this process, and closes the database. */
const sendJobs = (file: string, count: number) =>
  Effect.gen(function*() {
    const jobs = yield* MailboxSql.make({
      name: "jobs",
      schema: MainLoop.requestSchema(Schema.Number),
      replySchema: MainLoop.resultSchema(Schema.Number)
    })
    for (let n = 0; n < count; n++) yield* jobs.send(MainLoop.request(n, { requestId: `job-${n}` }))
  }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename: file })))

/** Waits until `done()` holds, looking every 50 ms; fails after `timeoutMs` with what `explain` says. */
const eventually = (done: () => boolean, timeoutMs: number, explain: () => string) =>
  Effect.gen(function*() {
    const deadline = performance.now() + timeoutMs
    while (!done()) {
      if (performance.now() > deadline) return yield* Effect.die(new Error(`timed out; output:\n${explain()}`))
      yield* Effect.sleep("50 millis")
    }
  })

/** The numbers a worker's output says it handled, each once. */
const handled = (output: string) => new Set([...output.matchAll(/^handled (\d+)$/gm)].map((match) => Number(match[1])))

describe("a sick store never kills a loop", () => {
  it.scopedLive(
    "a full disk: the loop stays alive, retries, and handles every message once space returns",
    () =>
      Effect.gen(function*() {
        const disk = yield* smallDisk
        const file = join(disk.directory, "jobs.db")
        yield* sendJobs(file, 20)
        // This connection empties the WAL (so the worker's next write must grow a file), then holds the write lock
        // while the worker starts: its first claim waits for the lock, and meets a full disk when it gets it.
        const holder = new Sqlite(file)
        yield* Effect.addFinalizer(() => Effect.sync(() => holder.close()))
        holder.pragma("wal_checkpoint(TRUNCATE)")
        holder.exec("BEGIN IMMEDIATE")
        const child = yield* spawnBundled(worker, [file])
        yield* child.waitFor(/^ready$/m)
        yield* disk.fill(child.pid)
        holder.exec("ROLLBACK")
        yield* child.waitFor(/Receive failed; retrying with backoff/, 15_000)
        // Several retries later, still alive and nothing handled.
        yield* Effect.sleep("2 seconds")
        expect(child.output()).not.toMatch(/died|Defect/)
        expect(child.output()).toMatch(
          /Receive failed; retrying with backoff \(.*(database or disk is full|disk I\/O error)\)/
        )
        expect(handled(child.output()).size).toBe(0)
        yield* disk.free(child.pid)
        // Every job, whichever order the retries took.
        yield* eventually(() => handled(child.output()).size === 20, 30_000, child.output)
        expect(child.output()).not.toMatch(/died/)
        yield* child.signal("SIGTERM")
        expect((yield* child.exited).code).toBe(0)
      }),
    90_000
  )

  it.scopedLive(
    "the database file deleted under a running worker: the loop stays alive and SIGTERM still drains",
    () =>
      Effect.gen(function*() {
        const file = join(scratch, "deleted.db")
        yield* sendJobs(file, 3)
        // Each job takes a second: the file goes while the first is in hand, so its settle and the next claims
        // write to a database that is no longer there.
        const child = yield* spawnBundled(worker, [file, "--work-ms", "1000"])
        yield* child.waitFor(/^handling 0$/m)
        for (const suffix of ["", "-wal", "-shm"]) rmSync(`${file}${suffix}`, { force: true })
        // SQLite carries on in the file it has open (the operator is told: see Database's check); the loop goes on.
        yield* child.waitFor(/^handled 2$/m, 15_000)
        yield* Effect.sleep("2 seconds")
        expect(child.output()).not.toMatch(/died|Defect/)
        yield* child.signal("SIGTERM")
        expect((yield* child.exited).code).toBe(0)
      }),
    60_000
  )
})
