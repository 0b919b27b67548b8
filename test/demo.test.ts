/**
 * `leasehold demo` as a child process with a small size: every request id is
 * matched to its reply or dead letter (nothing lost, none settled twice), the
 * killed worker's leased requests are named and finish elsewhere, exactly one
 * request ends with a deadline error and one undecodable request is
 * dead-lettered; afterwards the file holds no in-flight lease (the replies
 * were acknowledged) and the work-lease tables the console reads. A request
 * dropped on purpose (the hidden `LEASEHOLD_DEMO_FAULTS`) is named as lost,
 * with a duplicated reply and a doubly-settled request, and the run exits 1; a
 * run too small for the kill says that no worker was killed; a run
 * interrupted with SIGINT drains its workers and exits 0. It runs the command
 * line as `npm start` does (the launcher over the CommonJS bundle), which is
 * where a dynamic import once failed. The accounting's rules are tested on
 * their own too (the subtraction they replace hid a lost request behind a
 * doubly-settled one).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Database from "../src/Database.js"
import * as Faults from "../src/demo/faults.js"
import * as Ledger from "../src/demo/ledger.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { commandLine } from "./helpers.js"

const demo = (args: ReadonlyArray<string>, interruptWhen?: RegExp, env: Record<string, string> = {}) =>
  Effect.async<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = spawn("node", [commandLine(), "demo", ...args], {
      env: { ...process.env, NO_COLOR: "1", ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    let interrupted = false
    const check = () => {
      if (interruptWhen !== undefined && !interrupted && interruptWhen.test(stdout + stderr)) {
        interrupted = true
        child.kill("SIGINT")
      }
    }
    child.stdout.on("data", (chunk) => {
      stdout += chunk
      check()
    })
    child.stderr.on("data", (chunk) => {
      stderr += chunk
      check()
    })
    child.on("exit", (code) => resume(Effect.succeed({ code, stdout, stderr })))
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** What the demo left in its file, read as the console reads it: every queue's stats. */
const queuesIn = (dir: string) =>
  Effect.flatMap(MailboxSqlAdmin.queues({ create: false }), (queues) => queues.stats).pipe(
    Effect.provide(Database.layerSqlite({ filename: join(dir, "demo.db") }))
  )

/** The work-lease domains in the demo's file (the console's work-lease panel reads these tables). */
const domainsIn = (dir: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ readonly domain_id: string }>`
    SELECT domain_id FROM leasehold_work_lease_domains ORDER BY domain_id`).pipe(
      Effect.map((rows) => rows.map((row) => row.domain_id)),
      Effect.provide(Database.layerSqlite({ filename: join(dir, "demo.db") }))
    )

const none = { count: 0, ids: [] }

describe("leasehold demo", () => {
  it.live(
    "runs to completion: every id matched, the killed worker's leased requests named and finished elsewhere, " +
      "no lease left behind",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "leasehold-demo-"))
        const run = yield* demo(["--size", "40", "--work-ms", "100", "--dir", dir, "--json"])
        expect(run.code, run.stderr).toBe(0)
        const summary = JSON.parse(run.stdout)
        expect(summary).toMatchObject({
          requests: 40,
          replies: 39,
          answered: { count: 39 },
          deadLettered: { count: 1, ids: ["corrupt-demo"] },
          leftQueued: none,
          lost: none,
          duplicated: none,
          doublySettled: none,
          unknown: none,
          accountedFor: true,
          deadlineErrors: 1,
          otherErrors: 0,
          interrupted: false,
          killed: { worker: "worker-1" },
          notKilled: null,
          workLease: { inOrder: true },
          mergeQueue: { merged: 5, entries: 5, healed: 1 }
        })
        // The kill took leased requests with it (read from the file once the process was dead): all finished.
        expect(summary.killed.held.count).toBeGreaterThanOrEqual(1)
        expect(summary.killed.finishedElsewhere).toBe(summary.killed.held.count)
        expect(summary.redelivered).toBeGreaterThanOrEqual(1)
        expect(summary.proved).toMatch(
          /^Proved: every one of 40 requests was answered exactly once or dead-lettered on purpose \(corrupt-demo\); worker-1 was SIGKILLed with \d+ requests? leased \((r\d+|deadline-demo)[^)]*\), (all )?finished elsewhere\.$/
        )
        expect(summary.healthUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
        expect(run.stderr).toMatch(
          /killed worker-1 \(pid \d+\) with SIGKILL mid-work, holding \d+ leased requests? \((r\d+|deadline-demo)/
        )
        expect(summary.consoleCommand).toBe(`npx leasehold console --db ${summary.database}`)
        // What the console opens on: no lease held (the replies were read and acknowledged, so their queue is
        // gone; nothing of the requests queue is in flight) and the work-lease tables, with the demo's domains.
        const stats = yield* queuesIn(dir)
        expect(stats.map((queue) => [queue.queue, queue.queued, queue.inFlight, queue.delayed])).toEqual([
          ["requests", 0, 0, 0]
        ])
        expect(yield* domainsIn(dir)).toEqual(["repo-a", "repo-b"])
      }),
    180_000
  )

  it.live(
    "a request dropped on purpose is named as lost (with a duplicated and a doubly-settled one): exit 1",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "leasehold-demo-"))
        const run = yield* demo(["--size", "10", "--work-ms", "20", "--dir", dir, "--json"], undefined, {
          [Faults.variable]: "lose:r7,dead-letter:r8,duplicate:r9"
        })
        expect(run.code, run.stderr).toBe(1)
        const summary = JSON.parse(run.stdout)
        expect(summary).toMatchObject({
          requests: 10,
          replies: 9,
          answered: { count: 8 },
          deadLettered: { count: 2, ids: ["corrupt-demo", "r8"] },
          lost: { count: 1, ids: ["r7"] },
          duplicated: { count: 1, ids: ["r9"] },
          doublySettled: { count: 1, ids: ["r8"] },
          unknown: none,
          accountedFor: false,
          proved: "NOT PROVED: of 10 requests, 1 (r7) lost; 1 (r8) settled twice."
        })
        expect(run.stderr).toContain("leasehold: NOT PROVED: of 10 requests, 1 (r7) lost; 1 (r8) settled twice.")
      }),
    180_000
  )

  it.live("a run too small for the kill says plainly that no worker was killed", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "leasehold-demo-"))
      const run = yield* demo(["--size", "10", "--work-ms", "20", "--dir", dir])
      expect(run.code, run.stdout + run.stderr).toBe(0)
      expect(run.stdout).toContain(
        "no worker will be killed: --size 10 is too small to kill one of 3 workers mid-run (that takes at least 24"
      )
      expect(run.stdout).toMatch(/^workers\s+3, none killed: --size 10 is too small/m)
      expect(run.stdout).not.toContain("SIGKILL")
      expect(run.stdout).toMatch(/^lost\s+0$/m)
      expect(run.stdout).toContain(
        "Proved: every one of 10 requests was answered exactly once or dead-lettered on purpose (corrupt-demo); " +
          "no worker was killed, so this run shows no crash survived: --size 10 is too small"
      )
    }), 180_000)

  it.live("SIGINT part way drains the workers, reports what was left queued and exits 0", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "leasehold-demo-"))
      const run = yield* demo(["--size", "400", "--work-ms", "200", "--dir", dir], /done [1-9]\d* \|/)
      expect(run.code, run.stdout + run.stderr).toBe(0)
      expect(run.stdout).toContain("interrupted: draining the workers")
      expect(run.stdout).toMatch(/lost\s+0/)
      expect(run.stdout).not.toContain("did not exit cleanly")
      expect(run.stdout).toContain("Look inside in a browser: npx leasehold console --db ")
      const left = Number(/left queued\s+(\d+)/.exec(run.stdout)?.[1])
      const answered = Number(/answered\s+(\d+)/.exec(run.stdout)?.[1])
      expect(left).toBeGreaterThan(0)
      const deadLettered = Number(/^dead-lettered\s+(\d+)/m.exec(run.stdout)?.[1])
      expect(answered + deadLettered + left).toBe(400)
      expect(run.stdout).toContain("or left queued by the interruption; no worker was killed")
      // The drained workers left nothing in flight: what is left is queued for the next worker.
      const stats = yield* queuesIn(dir)
      expect(stats.find((queue) => queue.queue === "requests")).toMatchObject({ queued: left, inFlight: 0 })
    }), 180_000)

  it.live("bad sizes are usage errors (exit 2)", () =>
    Effect.gen(function*() {
      const run = yield* demo(["--size", "3"])
      expect(run.code).toBe(2)
      expect(run.stderr).toContain("--size must be between 10 and 5000")
    }), 60_000)

  describe("the accounting", () => {
    it("a request answered and dead-lettered does not hide a lost one (as size − replies − letters did)", () => {
      const ledger = Ledger.reconcile(["a", "b", "c"], { replies: ["a", "b"], deadLetters: ["b"], queued: [] })
      expect(ledger.lost).toEqual({ count: 1, ids: ["c"] })
      expect(ledger.doublySettled).toEqual({ count: 1, ids: ["b"] })
      expect(Ledger.accountedFor(ledger)).toBe(false)
    })

    it("a duplicate reply is reported but accounted for; a letter twice, or an id never sent, is not", () => {
      const duplicate = Ledger.reconcile(["a", "b", "c"], { replies: ["a", "a", "b"], deadLetters: ["c"], queued: [] })
      expect(duplicate).toMatchObject({ duplicated: { count: 1, ids: ["a"] }, lost: none, doublySettled: none })
      expect(Ledger.accountedFor(duplicate)).toBe(true)
      const twice = Ledger.reconcile(["a"], { replies: [], deadLetters: ["a", "a"], queued: [] })
      expect(twice.doublySettled).toEqual({ count: 1, ids: ["a"] })
      const stranger = Ledger.reconcile(["a"], { replies: ["a", "x"], deadLetters: [], queued: [] })
      expect(stranger.unknown).toEqual({ count: 1, ids: ["x"] })
      expect(Ledger.accountedFor(stranger)).toBe(false)
    })

    it("what is still queued is neither lost nor settled; ids are named first few, then counted", () => {
      const ledger = Ledger.reconcile(["a", "b"], { replies: ["a"], deadLetters: [], queued: ["b"] })
      expect(ledger).toMatchObject({ leftQueued: { count: 1, ids: ["b"] }, lost: none })
      const many = Ledger.reconcile(["a", "b", "c", "d", "e", "f", "g"], { replies: [], deadLetters: [], queued: [] })
      expect(Ledger.describe(many.lost)).toBe("7 (a, b, c, d, e, …)")
      expect(Ledger.describe(ledger.leftQueued)).toBe("1 (b)")
      expect(Ledger.describe(none)).toBe("0")
    })

    it("the hidden fault list is read strictly", () => {
      expect(Faults.parse(undefined)).toEqual(Either.right([]))
      expect(Faults.parse("lose:r7, duplicate:r9")).toEqual(
        Either.right([{ kind: "lose", requestId: "r7" }, { kind: "duplicate", requestId: "r9" }])
      )
      expect(Either.isLeft(Faults.parse("drop:r7"))).toBe(true)
      expect(Either.isLeft(Faults.parse("lose"))).toBe(true)
      expect(Either.isLeft(Faults.parse("lose:"))).toBe(true)
    })
  })
})
