/**
 * The console's Workers panel in a real browser (headless Chromium), on SQLite and PostgreSQL, with two live
 * worker processes (test/fixtures/mailbox-worker.ts: a MainLoop, named by LEASEHOLD_WORKER_NAME) and a loop of
 * this process holding a message: the panel shows all three with their loops; the in-flight message's "held by"
 * links to its worker's row; one worker SIGSTOPped is shown STALLED, then, SIGKILLed, LOST, while the other stays
 * live; `leasehold workers` says the same (`--json` and the table), and a bad `--stalled-after` is exit 2. Short thresholds come from the environment (the children and
 * the console inherit it). With LEASEHOLD_SCREENSHOTS=1 the panel is saved as docs/console-workers.png.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, type Layer, Schedule, Schema, Scope } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { hostname, tmpdir } from "node:os"
import { join } from "node:path"
import type { Page } from "playwright-core"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import { commandLine, spawnBundled } from "./helpers.js"
import * as Browsers from "./support/browser.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

// Inherited by the worker processes and the console this test starts, read by this process's store as it opens.
process.env.LEASEHOLD_WORKER_REFRESH = "300 millis"
process.env.LEASEHOLD_WORKER_STALLED_AFTER = "3 seconds"
process.env.LEASEHOLD_WORKER_LOST_AFTER = "8 seconds"
process.env.LEASEHOLD_WORKER_NAME = "test-process"

const screenshots = process.env.LEASEHOLD_SCREENSHOTS === "1"
const directory = mkdtempSync(join(tmpdir(), "leasehold-console-workers-"))
const prefix = "cw_"

/** Waits (a browser-side poll, at most 30 s) until the text of `selector` satisfies `predicate`. */
const until = (page: Page, selector: string, predicate: (text: string) => boolean, what: string) => {
  let last = ""
  return Effect.promise(() => page.locator(selector).allTextContents()).pipe(
    Effect.map((texts) => (last = texts.join(" | "))),
    Effect.repeat({ until: predicate, schedule: Schedule.spaced("100 millis") }),
    Effect.timeoutFail({ duration: "30 seconds", onTimeout: () => new Error(`${what}: still "${last}"`) }),
    Effect.map(() => last)
  )
}

/** A worker process named `name` (the fixture's MainLoop over "requests"). */
const worker = (target: string, name: string) =>
  Effect.gen(function*() {
    process.env.LEASEHOLD_WORKER_NAME = name // copied into the child's environment as it spawns
    const child = yield* spawnBundled("test/fixtures/mailbox-worker.ts", ["mainloop", target, prefix])
    process.env.LEASEHOLD_WORKER_NAME = "test-process"
    yield* child.waitFor(/ready/)
    return child
  })

/** `leasehold workers --db target --prefix … args`: its exit code and output. */
const leaseholdWorkers = (target: string, ...args: ReadonlyArray<string>) =>
  Effect.async<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      "node",
      [commandLine(), "workers", "--db", target, "--prefix", prefix, ...args],
      { timeout: 60_000, env: { ...process.env, NO_COLOR: "1", LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "" } },
      (error, stdout, stderr) =>
        resume(Effect.succeed({ code: error === null ? 0 : Number(error.code ?? 1), stdout, stderr }))
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

const scenario = (name: string, layer: () => Layer.Layer<MailboxSql.Services, unknown>, target: () => string) =>
  describe(`the Workers panel on ${name}`, () => {
    it.live(
      "shows two live workers and this process; held by links to its row; SIGSTOP is STALLED, SIGKILL LOST",
      () =>
        Effect.gen(function*() {
          const alpha = yield* worker(target(), "alpha")
          const beta = yield* worker(target(), "beta")

          // A loop of this process, stuck on a message it holds: its "held by" is this process.
          const held = yield* MailboxSql.make({ name: "held", schema: Schema.String, prefix })
          const gate = yield* Deferred.make<void>()
          const holder = yield* MailboxWorker.make({
            name: "holder",
            mailbox: held,
            handle: () => Deferred.await(gate),
            onSuccess: () => Effect.succeedNone,
            onFailure: (message) => Effect.ignore(message.nack(0))
          })
          yield* holder.run({ waitTime: "200 millis" }).pipe(Effect.forkScoped)
          yield* held.send("a long job")
          yield* Effect.addFinalizer(() => Deferred.succeed(gate, undefined))

          const browser = yield* Browsers.browser
          const { url } = yield* startConsole(["--db", target(), "--prefix", prefix])
          const page = yield* Effect.acquireRelease(
            Effect.promise(async () => {
              const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
              await page.goto(url)
              return page
            }),
            (page) => Effect.promise(() => page.close())
          )

          const me = `${hostname()}:${process.pid}`
          const rows = "#workers-table tbody tr"
          yield* until(
            page,
            rows,
            (text) =>
              [`${hostname()}:${alpha.pid}`, `${hostname()}:${beta.pid}`, me, "alpha", "beta", "test-process", "holder"]
                .every((part) => text.includes(part)),
            "both workers and this process listed"
          )
          const alphaRow = `#workers-table tr[id="worker-${hostname()}:${alpha.pid}"]`
          const betaRow = `#workers-table tr[id="worker-${hostname()}:${beta.pid}"]`
          expect(yield* until(page, alphaRow, (text) => text.includes("requests"), "alpha's loop")).toContain("running")
          // Beside host:pid, the instance of the store that wrote the row.
          expect(yield* Effect.promise(() => page.locator(`${alphaRow} .instance`).textContent())).toMatch(
            /^[0-9a-f]{16}$/
          )

          // The in-flight message's "held by" links to this process's row.
          yield* until(page, "#in-flight-table", (text) => text.includes(me), "the held message in flight")
          const link = page.locator(`#in-flight-table a[href="#worker-${me}"]`)
          yield* Effect.promise(() => link.first().click())
          expect(
            yield* Effect.promise(() =>
              page.evaluate(() => (globalThis as unknown as { location: { hash: string } }).location.hash)
            )
          ).toBe(`#worker-${me}`)
          expect(yield* Effect.promise(() => page.locator(`tr[id="worker-${me}"]`).count())).toBe(1)

          // Frozen: its loop's heartbeat grows old — STALLED — while beta's stays fresh.
          yield* alpha.signal("SIGSTOP")
          yield* until(page, alphaRow, (text) => text.includes("STALLED"), "alpha stalled")
          if (screenshots && name === "SQLite") {
            yield* Effect.promise(() => page.locator("#workers").screenshot({ path: "docs/console-workers.png" }))
          }
          // Killed: its row is no longer refreshed — LOST.
          yield* alpha.signal("SIGKILL")
          yield* until(page, alphaRow, (text) => text.includes("LOST"), "alpha lost")
          const betaText = yield* until(page, betaRow, (text) => text.includes("beta"), "beta listed")
          expect(betaText).not.toContain("LOST")

          // The command line says the same: as JSON, as a table, and a bad threshold is a usage error naming it.
          const json = yield* leaseholdWorkers(target(), "--json")
          expect(json.code).toBe(0)
          const processes = JSON.parse(json.stdout) as ReadonlyArray<{ process: string; name: string; lost: boolean }>
          const byName = new Map(processes.map((process) => [process.name, process]))
          expect(byName.get("alpha")?.lost).toBe(true)
          expect(byName.get("beta")?.lost).toBe(false)
          expect(byName.get("test-process")?.process).toBe(me)
          const text = yield* leaseholdWorkers(target())
          expect(text.code).toBe(0)
          expect(text.stdout).toMatch(new RegExp(`${hostname()}:${alpha.pid} LOST\\s+[0-9a-f]{16}\\s+alpha`))
          expect(text.stdout).toContain("STALLED")
          const bad = yield* leaseholdWorkers(target(), "--stalled-after", "soon")
          expect(bad.code).toBe(2)
          expect(bad.stderr).toContain("--stalled-after")
        }).pipe(Effect.scoped, Effect.provide(layer())),
      120_000
    )
  })

const suiteScope = Effect.runSync(Scope.make())
let pg: Postgres.Cluster
const sqliteFile = join(directory, "workers.db")
beforeAll(async () => {
  pg = await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

scenario("SQLite", () => MailboxSql.layerSqlite({ filename: sqliteFile }), () => sqliteFile)
scenario("PostgreSQL", () => MailboxSql.layerPg({ url: pg.url }), () => pg.url)
