/**
 * examples/worker.ts — a whole worker as one Layer — run as a real process:
 * it serves, answers requests, reports ready over HTTP, and on SIGTERM turns
 * unready, finishes the request in flight, replies and exits 0.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { spawnTsx } from "./helpers.js"

const get = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(url)
    return { status: response.status, body: await response.text() }
  })

describe("examples/worker.ts", () => {
  it.live("serves until SIGTERM, then drains the request in flight and exits 0", () =>
    Effect.gen(function*() {
      const dir = yield* Effect.acquireRelease(
        Effect.sync(() => mkdtempSync(join(tmpdir(), "leasehold-worker-test-"))),
        (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
      )
      const filename = join(dir, "mailbox.db")
      const child = yield* spawnTsx("examples/worker.ts", [filename])
      yield* child.waitFor(/worker ready \(pid \d+\): http:\/\/[\d.]+:\d+\/health\/ready/)
      const url = /worker ready \(pid \d+\): (http:\/\/[\d.]+:\d+)/.exec(child.output())![1]!
      expect(child.output()).toContain(`mailbox ${filename}`)
      expect(statSync(filename).isFile()).toBe(true)

      yield* child.waitFor(/reply r1: HELLO/)
      yield* child.waitFor(/reply r3: WORLD/)
      yield* child.waitFor(/working on "slow job"/)
      const ready = yield* get(`${url}/health/ready`)
      expect(ready.status).toBe(200)

      yield* child.signal("SIGTERM")
      // The slow job still runs for a few seconds: meanwhile readiness says the worker is going away.
      const draining = yield* get(`${url}/health/ready`).pipe(
        Effect.delay("50 millis"),
        Effect.repeat({ until: ({ status }) => status === 503 }),
        Effect.timeout("2 seconds")
      )
      expect(draining.body).toMatch(/shutting down/)

      const { code } = yield* child.exited
      expect(code).toBe(0)
      const output = child.output()
      expect(output).toMatch(/reply r4: SLOW JOB/)
      expect(output).toMatch(/Loop "main-loop:requests" stopped cleanly/)
      expect(output).toMatch(/drained: 4 replies received, 0 requests left queued/)
      expect(output.indexOf("SIGTERM received")).toBeLessThan(output.indexOf("reply r4: SLOW JOB"))
    }).pipe(Effect.scoped), 60_000)
})
