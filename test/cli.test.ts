/**
 * The `leasehold` command line, run as a child process (`bin/leasehold.mjs`)
 * against a real SQLite file and a throwaway PostgreSQL: each `queue`
 * command, `--json` output, and the errors for bad arguments (exit 2) and a
 * missing or unreachable database (exit 1, naming the fix).
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MergeQueue from "../src/MergeQueue.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-cli-"))
const sqliteFile = join(directory, "queue.db")

/** Runs the CLI; resolves with its exit code and output. */
const leasehold = (...args: ReadonlyArray<string>) =>
  Effect.async<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      "node",
      ["bin/leasehold.mjs", ...args],
      { timeout: 60_000, env: { ...process.env, NO_COLOR: "1", LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "" } },
      (error, stdout, stderr) =>
        resume(Effect.succeed({ code: error === null ? 0 : Number(error.code ?? 1), stdout, stderr }))
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** A queue with five entries, one claimed by agent-1 under a 1 ms lock that has expired. */
const seed = (layer: Layer.Layer<MergeQueue.MergeQueue, unknown>) =>
  Effect.gen(function*() {
    const queue = yield* MergeQueue.MergeQueue
    for (let i = 0; i < 5; i++) yield* queue.enqueue(`ws-${i}`, { priority: i % 2 })
    yield* queue.nextWithLock("agent-1")
    yield* Effect.sleep("5 millis")
  }).pipe(Effect.provide(layer), Effect.runPromise)

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  await seed(MergeQueue.layerSqlite({ filename: sqliteFile, lockTimeout: 1 }))
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
  await seed(MergeQueue.layerPg({ url: pgUrl, lockTimeout: 1 }))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

describe("leasehold queue on SQLite", () => {
  it.live(
    "status shows the stale lock and what recovery would do; list shows queue order",
    () =>
      Effect.gen(function*() {
        const status = yield* leasehold("queue", "status", "--db", sqliteFile)
        expect(status.code).toBe(0)
        expect(status.stdout).toMatch(/lock\s+agent-1 \(token 1\), STALE: expired/)
        expect(status.stdout).toMatch(/stale\s+1 expired lock, 1 stuck entries/)
        const list = yield* leasehold("queue", "list", "--db", sqliteFile, "--json")
        expect(list.code).toBe(0)
        const entries = JSON.parse(list.stdout) as Array<{ workspace: string; status: string; agentId: string | null }>
        expect(entries.map((entry) => entry.workspace)).toEqual(["ws-0", "ws-2", "ws-4", "ws-1", "ws-3"])
        expect(entries[0]).toMatchObject({ status: "claimed", agentId: "agent-1" })
        const pending = yield* leasehold("queue", "list", "--db", sqliteFile, "--status", "pending", "--limit", "2")
        expect(pending.stdout.trim().split("\n")).toHaveLength(4)
        expect(pending.stdout).not.toContain("claimed")
      }),
    60_000
  )

  it.live("recover heals the queue once; stats counts by status", () =>
    Effect.gen(function*() {
      const recovered = yield* leasehold("queue", "recover", "--db", sqliteFile, "--json")
      expect(recovered.code).toBe(0)
      expect(JSON.parse(recovered.stdout)).toMatchObject({ locksCleaned: 1, entriesReclaimed: 1 })
      const again = yield* leasehold("queue", "recover", "--db", sqliteFile)
      expect(again.stdout).toContain("cleared 0 expired lock(s), returned 0 stuck entries to pending")
      const stats = yield* leasehold("queue", "stats", "--db", sqliteFile)
      expect(stats.stdout).toMatch(/pending\s+5/)
      expect(stats.stdout).toMatch(/total\s+5/)
    }), 60_000)

  it.live(
    "bad arguments exit 2 with the usage; a missing database exits 1 naming the fix",
    () =>
      Effect.gen(function*() {
        const unknown = yield* leasehold("queue", "frobnicate", "--db", sqliteFile)
        expect(unknown.code).toBe(2)
        const badStatus = yield* leasehold("queue", "list", "--db", sqliteFile, "--status", "shipped")
        expect(badStatus.code).toBe(2)
        expect(badStatus.stdout + badStatus.stderr).toContain("pending")
        const noDb = yield* leasehold("queue", "status")
        expect(noDb.code).toBe(2)
        expect(noDb.stderr).toContain("Pass --db")
        const missing = yield* leasehold("queue", "status", "--db", join(directory, "nope.db"))
        expect(missing.code).toBe(1)
        expect(missing.stderr).toContain("no such file")
        const help = yield* leasehold("queue", "recover", "--help")
        expect(help.code).toBe(0)
        expect(help.stdout).toContain("Example: leasehold queue recover")
      }),
    60_000
  )
})

describe("leasehold queue on PostgreSQL", () => {
  it.live("status, recover and an unreachable server", () =>
    Effect.gen(function*() {
      const status = yield* leasehold("queue", "status", "--db", pgUrl, "--json")
      expect(status.code).toBe(0)
      expect(JSON.parse(status.stdout)).toMatchObject({ lock: { agentId: "agent-1", stale: true }, pending: 4 })
      const recovered = yield* leasehold("queue", "recover", "--db", pgUrl, "--json")
      expect(JSON.parse(recovered.stdout)).toMatchObject({ locksCleaned: 1, entriesReclaimed: 1 })
      const down = yield* leasehold("queue", "status", "--db", "postgres://me:secret@127.0.0.1:1/none")
      expect(down.code).toBe(1)
      expect(down.stderr).toContain("did not answer")
      expect(down.stderr).not.toContain("secret")
    }), 60_000)
})
