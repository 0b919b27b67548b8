/**
 * Several processes writing to one SQLite file at once (the embedded default's multi-process promise):
 * merge-queue enqueues, mailbox sends and work-lease pairs all succeed, because every write transaction
 * takes the file's write lock first and waits for it (`BEGIN IMMEDIATE` and the busy timeout), where a
 * transaction that reads first fails at once when another process holds the lock by the time it writes.
 * test/fixtures/sqlite-contention.ts is the writer.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { spawnBundled } from "./helpers.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-contention-"))
const PROCESSES = 4
const EACH = 50

describe("one SQLite file, four writing processes", () => {
  for (const mode of ["enqueue", "send", "worklease"] as const) {
    it.live(`${mode}: ${PROCESSES} × ${EACH}, every one succeeds`, () =>
      Effect.gen(function*() {
        const filename = join(directory, `${mode}.db`)
        const start = join(directory, `${mode}.start`)
        const children = yield* Effect.forEach(
          Array.from({ length: PROCESSES }),
          () => spawnBundled("test/fixtures/sqlite-contention.ts", [filename, mode, String(EACH), start])
        )
        for (const child of children) yield* child.waitFor(/ready/)
        writeFileSync(start, "")
        for (const child of children) {
          const { code } = yield* child.exited
          expect(code, child.output()).toBe(0)
          expect(child.output()).toContain(`done ok=${EACH} failed=0`)
        }
      }).pipe(Effect.scoped), 120_000)
  }
})
