/**
 * `leasehold demo` as a child process with a small size: every request is
 * accounted for, the killed worker's requests come back and finish
 * elsewhere, exactly one request ends with a deadline error and one
 * undecodable request is dead-lettered; and a run
 * interrupted with SIGINT drains its workers and exits 0. It runs the command line as `npm start` does (the
 * launcher over the CommonJS bundle), which is where a dynamic import once failed.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { commandLine } from "./helpers.js"

const demo = (args: ReadonlyArray<string>, interruptWhen?: RegExp) =>
  Effect.async<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = spawn("node", [commandLine(), "demo", ...args], {
      env: { ...process.env, NO_COLOR: "1" },
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

describe("leasehold demo", () => {
  it.live(
    "runs to completion: nothing lost, a redelivery after the kill, exactly one deadline error",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "leasehold-demo-"))
        const run = yield* demo(["--size", "40", "--work-ms", "100", "--dir", dir, "--json"])
        expect(run.code, run.stderr).toBe(0)
        const summary = JSON.parse(run.stdout)
        expect(summary).toMatchObject({
          requests: 40,
          answered: 39,
          deadLettered: 1,
          lost: 0,
          leftQueued: 0,
          deadlineErrors: 1,
          otherErrors: 0,
          interrupted: false,
          killed: { worker: "worker-1" },
          workLease: { inOrder: true },
          mergeQueue: { merged: 5, entries: 5, healed: 1 }
        })
        expect(summary.redelivered).toBeGreaterThanOrEqual(1)
        expect(summary.healthUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
        expect(run.stderr).toContain("killed worker-1")
        expect(summary.consoleCommand).toBe(`npx leasehold console --db ${summary.database}`)
      }),
    180_000
  )

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
      const deadLettered = Number([...run.stdout.matchAll(/^dead-lettered\s+(\d+)$/gm)].at(-1)?.[1])
      expect(answered + deadLettered + left).toBe(400)
    }), 180_000)

  it.live("bad sizes are usage errors (exit 2)", () =>
    Effect.gen(function*() {
      const run = yield* demo(["--size", "3"])
      expect(run.code).toBe(2)
      expect(run.stderr).toContain("--size must be between 10 and 5000")
    }), 60_000)
})
