/**
 * The console an operator can trust, in a real browser (headless Chromium) against `leasehold console` as it
 * ships (a child process): a page whose server stopped says it is disconnected and its lease clocks stop, and it
 * recovers when a console answers again; a SQLite file replaced under a running console is reported and then
 * read anew; "Delete all" asks for a confirmation the server checks (with and without JavaScript), and the
 * notice shows next to what changed; pause and resume, from the page and from `leasehold mailbox`, take effect
 * on a live worker process (its messages stay queued, then it drains them); an empty queue stays listed until
 * dropped. On SQLite and PostgreSQL where the claim is about both.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Schedule, Schema, Scope } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Browser, Page } from "playwright-core"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MainLoop from "../src/MainLoop.js"
import { leasehold, spawnBundled } from "./helpers.js"
import * as Browsers from "./support/browser.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-console-trust-"))
const WORKER = "test/fixtures/mailbox-worker.ts"

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
let pg: SqlClient.SqlClient
let sqlite: SqlClient.SqlClient
const sqliteFile = join(directory, "shared.db")
beforeAll(async () => {
  const build = (layer: Layer.Layer<MailboxSql.Services, unknown>) =>
    Effect.runPromise(Layer.buildWithScope(layer, suiteScope).pipe(Effect.map(Context.get(SqlClient.SqlClient))))
  sqlite = await build(MailboxSql.layerSqlite({ filename: sqliteFile }))
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
  pg = await build(MailboxSql.layerPg({ url: pgUrl }))
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

let prefixes = 0
const freshPrefix = () => `trust${++prefixes}_`

const open = (browser: Browser, url: string, javaScriptEnabled = true) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, javaScriptEnabled })
      const page = await context.newPage()
      await page.goto(url)
      return { page, context }
    }),
    ({ context }) => Effect.promise(() => context.close())
  ).pipe(Effect.map(({ page }) => page))

/** Waits (at most 20 s) until the text of `selector` satisfies `predicate`. */
const until = (page: Page, selector: string, predicate: (text: string) => boolean, what: string) => {
  let last = ""
  return Effect.promise(() => page.locator(selector).allTextContents()).pipe(
    Effect.map((texts) => (last = texts.join(" | "))),
    Effect.repeat({ until: predicate, schedule: Schedule.spaced("100 millis") }),
    Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error(`${what}: still "${last}"`) }),
    Effect.map(() => last)
  )
}

const executions = (output: string) => [...output.matchAll(/^exec /gm)].length

const backends = [
  { label: "SQLite", target: () => sqliteFile, client: () => sqlite },
  { label: "PostgreSQL", target: () => pgUrl, client: () => pg }
] as const

for (const backend of backends) {
  describe(`pause and resume on ${backend.label}, with a live worker process`, () => {
    it.live(
      "leasehold mailbox pause keeps a worker's messages queued; resume lets it drain; drop",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const requests = yield* MailboxSql.make({
            name: "requests",
            schema: MainLoop.requestSchema(Schema.Number),
            prefix
          })
          const admin = yield* MailboxSqlAdmin.queues({ prefix })
          const worker = yield* spawnBundled(WORKER, ["mainloop", backend.target(), prefix])
          yield* worker.waitFor(/^ready$/m, 60_000)
          // The worker runs: one request is executed.
          yield* requests.send(MainLoop.request(1))
          yield* worker.waitFor(/^exec /m, 20_000)
          const paused = yield* leasehold("mailbox", "pause", "requests", "--db", backend.target(), "--prefix", prefix)
          expect(paused).toMatchObject({ code: 0 })
          expect(paused.stdout).toContain("requests: paused")
          expect((yield* admin.recorded).find((queue) => queue.queue === "requests")?.paused).toBe(true)
          for (let n = 0; n < 5; n++) yield* requests.send(MainLoop.request(n))
          // Several of the worker's polls (its long poll waits 1 s; it looks again at least every second): none
          // takes anything, the messages stay queued.
          yield* Effect.sleep("3 seconds")
          expect(executions(worker.output())).toBe(1)
          expect((yield* admin.stats).find((queue) => queue.queue === "requests")?.queued).toBe(5)
          const resumed = yield* leasehold(
            "mailbox",
            "resume",
            "requests",
            "--db",
            backend.target(),
            "--prefix",
            prefix
          )
          expect(resumed).toMatchObject({ code: 0 })
          yield* Effect.repeat(
            Effect.sync(() => executions(worker.output())),
            { until: (n) => n === 6, schedule: Schedule.spaced("100 millis") }
          ).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error(worker.output()) }))
          yield* Effect.repeat(requests.approximateCount, {
            until: (n) => n === 0,
            schedule: Schedule.spaced("100 millis")
          })
          // An empty queue stays recorded until dropped; a queue with messages is not dropped.
          const other = yield* MailboxSql.make({ name: "other", schema: Schema.String, prefix })
          yield* other.send("x")
          const refused = yield* leasehold("mailbox", "drop", "other", "--db", backend.target(), "--prefix", prefix)
          expect(refused.code).toBe(1)
          expect(refused.stderr).toContain("still has messages")
          const dropped = yield* leasehold("mailbox", "drop", "requests", "--db", backend.target(), "--prefix", prefix)
          expect(dropped).toMatchObject({ code: 0 })
          expect((yield* admin.recorded).map((queue) => queue.queue)).toEqual(["other"])
          const unknown = yield* leasehold("mailbox", "drop", "requests", "--db", backend.target(), "--prefix", prefix)
          expect(unknown.code).toBe(1)
          expect(unknown.stderr).toContain("no queue \"requests\" recorded")
          yield* worker.signal("SIGTERM")
          expect((yield* worker.exited).code).toBe(0)
        }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped),
      120_000
    )

    it.live(
      "from the page: Pause leaves a live worker's messages queued, Resume lets it drain; an empty queue stays listed until Drop",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const requests = yield* MailboxSql.make({
            name: "requests",
            schema: MainLoop.requestSchema(Schema.Number),
            prefix
          })
          const worker = yield* spawnBundled(WORKER, ["mainloop", backend.target(), prefix])
          yield* worker.waitFor(/^ready$/m, 60_000)
          yield* requests.send(MainLoop.request(1))
          yield* worker.waitFor(/^exec /m, 20_000)
          const browser = yield* Browsers.browser
          const { url } = yield* startConsole(["--db", backend.target(), "--prefix", prefix])
          const page = yield* open(browser, url)
          const row = `[data-queue="requests"]`
          // Empty, and still listed (recorded in the queues table).
          yield* until(page, `${row} [data-count="queued"]`, (text) => text === "0", "the empty queue listed")
          yield* Effect.promise(() => page.locator(row).getByRole("button", { name: "Pause" }).click())
          yield* until(page, "#mailboxes .notice", (text) => text.includes("Paused queue \"requests\""), "notice")
          // The notice is in the part that changed, and the page is scrolled there.
          expect(new URL(page.url()).hash).toBe("#mailboxes")
          yield* until(page, `${row} .paused`, (text) => text === "paused", "the paused badge")
          for (let n = 0; n < 5; n++) yield* requests.send(MainLoop.request(n))
          yield* until(page, `${row} [data-count="queued"]`, (text) => text === "5", "5 queued")
          yield* Effect.sleep("3 seconds")
          expect(executions(worker.output())).toBe(1)
          expect(yield* Effect.promise(() => page.locator(`${row} [data-count="queued"]`).textContent())).toBe("5")
          yield* Effect.promise(() => page.locator(row).getByRole("button", { name: "Resume" }).click())
          yield* until(page, "#mailboxes .notice", (text) => text.includes("Resumed queue \"requests\""), "notice")
          yield* until(page, `${row} [data-count="queued"]`, (text) => text === "0", "drained")
          yield* Effect.repeat(
            Effect.sync(() => executions(worker.output())),
            { until: (n) => n === 6, schedule: Schedule.spaced("100 millis") }
          ).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error(worker.output()) }))
          expect(yield* Effect.promise(() => page.locator(`${row} .paused`).count())).toBe(0)
          // Drained and idle: the queue stays listed (with zero counts) until dropped. (The worker has a
          // message in flight at most for a moment: wait for the row to offer Drop.)
          yield* until(page, `${row} button`, (text) => text.includes("Drop"), "Drop offered")
          yield* Effect.promise(() => page.locator(row).getByRole("button", { name: "Drop" }).click())
          yield* until(page, "#mailboxes .notice", (text) => text.includes("Dropped queue \"requests\""), "dropped")
          // No longer recorded (the page keeps a queue that had traffic in the last 5 minutes: no Drop on it now).
          yield* until(page, `${row} td:last-child`, (text) => !text.includes("Drop"), "no Drop any more")
          expect((yield* (yield* MailboxSqlAdmin.queues({ prefix })).recorded).map((queue) => queue.queue)).toEqual([])
          yield* worker.signal("SIGTERM")
          yield* worker.exited
        }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped),
      120_000
    )

    it.live(
      "Delete all asks first: the server checks a one-time confirmation, with or without JavaScript",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const sql = yield* SqlClient.SqlClient
          const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
          const addLetters = (n: number) =>
            Effect.forEach(Array.from({ length: n }, (_, i) => i), (i) =>
              sql`INSERT INTO ${sql(`${prefix}mailbox_dead_letters`)}
              (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
              VALUES (${`letter-${prefixes}-${i}-${Math.random()}`}, 'jobs', '{}', 1, 0, 0, 'Boom', 'it broke')`, {
              discard: true
            })
          yield* addLetters(3)
          const browser = yield* Browsers.browser
          const { url } = yield* startConsole(["--db", backend.target(), "--prefix", prefix])
          for (const javaScriptEnabled of [true, false]) {
            const page = yield* open(browser, url, javaScriptEnabled)
            yield* Effect.promise(() =>
              page.getByRole("button", { name: "Delete all" }).click()
            )
            // A confirmation page, and nothing deleted yet.
            yield* until(page, "#question", (text) =>
              text === "Delete all 3 dead letters?", "the question")
            expect(yield* letters.count()).toBe(3)
            // Cancel goes back, deleting nothing.
            yield* Effect.promise(() => page.getByRole("link", { name: "Cancel" }).click())
            yield* until(page, "#dead-letters", (text) => text.includes("Dead letters"), "back on the page")
            expect(yield* letters.count()).toBe(3)
            yield* Effect.promise(() => page.getByRole("button", { name: "Delete all" }).click())
            yield* until(page, "#question", (text) => text.includes("Delete all"), "asked again")
            const form = yield* Effect.promise(() =>
              page.locator("#confirm input").evaluateAll((inputs) =>
                inputs.map((input): [string, string] => [
                  input.getAttribute("name") ?? "",
                  input.getAttribute("value") ?? ""
                ])
              )
            )
            yield* Effect.promise(() => page.locator("#confirm").getByRole("button", { name: "Delete all" }).click())
            // The notice is next to the dead letters (what changed), not at the top.
            yield* until(page, "#mailboxes .notice", (text) => text.includes("Deleted 3 dead letters"), "the notice")
            expect(
              yield* Effect.promise(() =>
                page.locator("#notice").evaluate((notice) => notice.previousElementSibling?.id)
              )
            ).toBe("dead-letters")
            expect(yield* letters.count()).toBe(0)
            // The value was for one use: posted again (after new letters came), it is refused and deletes nothing.
            yield* addLetters(2)
            const again = yield* Effect.promise(() =>
              fetch(`${url}actions/dead-letters/delete`, {
                method: "POST",
                redirect: "manual",
                headers: { "content-type": "application/x-www-form-urlencoded" },
                body: new URLSearchParams(form).toString()
              })
            )
            expect(again.status).toBe(403)
            expect(yield* Effect.promise(() => again.text())).toContain("confirmation was used already")
            // The page's form without a confirmation only asks; one issued for one letter does not delete all.
            const token = form.find(([name]) => name === "token")![1]!
            const db = form.find(([name]) => name === "db")![1]!
            const post = (fields: Record<string, string>) =>
              Effect.promise(() =>
                fetch(`${url}actions/dead-letters/delete`, {
                  method: "POST",
                  redirect: "manual",
                  headers: { "content-type": "application/x-www-form-urlencoded" },
                  body: new URLSearchParams({ token, db, ...fields }).toString()
                }).then(async (response) => ({ status: response.status, text: await response.text() }))
              )
            const asked = yield* post({})
            expect(asked.status).toBe(200)
            expect(asked.text).toContain("Delete all 2 dead letters?")
            const one = yield* post({ id: "some-letter" })
            const value = /name="confirm" value="([^"]+)"/.exec(one.text)![1]!
            expect((yield* post({ confirm: value })).status).toBe(403)
            expect(yield* letters.count()).toBe(2)
            yield* letters.purge()
            yield* addLetters(3)
          }
        }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped),
      120_000
    )
  })
}

describe("a console that is not live says so", () => {
  it.live(
    "the server stops: the page says disconnected and its clocks stop; a console answering again recovers it",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const held = yield* MailboxSql.make({ name: "held", schema: Schema.String, prefix })
        yield* held.send("a long job")
        // Under two minutes, so the page counts it down in seconds.
        yield* held.receive({ visibilityTimeout: "115 seconds" })
        const browser = yield* Browsers.browser
        const first = yield* startConsole(["--db", sqliteFile, "--prefix", prefix])
        const port = new URL(first.url).port
        const page = yield* open(browser, first.url)
        const clock = "#in-flight-table td:nth-child(4) time" // lease ends
        const initial = yield* until(page, clock, (text) => text.startsWith("in "), "a lease counting down")
        yield* until(page, clock, (text) => text !== initial, "the clock moving")
        expect(yield* Effect.promise(() => page.locator("#connection").isHidden())).toBe(true)
        yield* first.stop
        const banner = yield* until(page, "#connection", (text) => text.startsWith("Disconnected since "), "banner")
        expect(banner).toMatch(/^Disconnected since \d\d:\d\d:\d\d: /)
        // The clocks stopped: what the page shows is as of the disconnection.
        const frozen = yield* Effect.promise(() => page.locator(clock).textContent())
        yield* Effect.sleep("2500 millis")
        expect(yield* Effect.promise(() => page.locator(clock).textContent())).toBe(frozen)
        // A console on the same address answers again: the page is live again.
        yield* startConsole(["--db", sqliteFile, "--prefix", prefix, "--port", port])
        yield* until(page, "#connection", (text) => text === "", "the banner gone")
        expect(yield* Effect.promise(() => page.locator("#connection").isHidden())).toBe(true)
        yield* until(page, clock, (text) => text !== frozen, "the clock moving again")
      }).pipe(Effect.provideService(SqlClient.SqlClient, sqlite), Effect.scoped),
    120_000
  )

  it.live(
    "the SQLite file is deleted and re-created under a running console: it says so, then shows the new file",
    () =>
      Effect.gen(function*() {
        const file = join(directory, "replaced.db")
        const fill = (queue: string) =>
          Effect.gen(function*() {
            const mailbox = yield* MailboxSql.make({ name: queue, schema: Schema.String })
            yield* mailbox.send("x")
          }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename: file })))
        yield* fill("before-replace")
        const browser = yield* Browsers.browser
        const { url } = yield* startConsole(["--db", file])
        const page = yield* open(browser, url)
        yield* until(page, "#queues", (text) => text.includes("before-replace"), "the first file's queue")
        // As the demo does: delete the file (and its WAL), then create a new one.
        for (const suffix of ["", "-wal", "-shm"]) rmSync(file + suffix, { force: true })
        yield* until(page, "#database-problem", (text) => text.includes("was deleted at"), "the deletion reported")
        expect(yield* Effect.promise(() => page.locator("#queues").count())).toBe(0)
        yield* fill("after-replace")
        yield* until(page, "#queues", (text) => text.includes("after-replace"), "the new file's queue")
        expect(yield* Effect.promise(() => page.locator("#queues").textContent())).not.toContain("before-replace")
        expect(yield* Effect.promise(() => page.locator("#database-problem").count())).toBe(0)
      }).pipe(Effect.scoped),
    120_000
  )

  it.live(
    "a refresh never swaps a button out from under a press (a click needs its press and release on one element)",
    () =>
      Effect.gen(function*() {
        const file = join(directory, "pressed.db")
        yield* Effect.gen(function*() {
          const mailbox = yield* MailboxSql.make({ name: "pressed", schema: Schema.String })
          yield* mailbox.send("x")
        }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename: file })))
        const browser = yield* Browsers.browser
        const { url } = yield* startConsole(["--db", file])
        const page = yield* open(browser, url)
        const row = `[data-queue="pressed"]`
        yield* until(page, `${row} [data-count="queued"]`, (text) => text === "1", "the queue listed")
        const button = page.locator(row).getByRole("button", { name: "Pause" })
        const mark = () => Effect.promise(() => button.evaluate((element) => element.setAttribute("data-mark", "1")))
        const marked = Effect.promise(() => page.locator(`${row} button[data-mark]`).count())
        // Released, the live part is replaced every second (the mark goes with the old element).
        yield* mark()
        yield* Effect.repeat(marked, { until: (n) => n === 0, schedule: Schedule.spaced("100 millis") }).pipe(
          Effect.timeout("10 seconds")
        )
        // Pressed and held for three refreshes: the same element stays.
        yield* mark()
        yield* Effect.promise(() => button.dispatchEvent("pointerdown", { bubbles: true }))
        yield* Effect.sleep("3500 millis")
        expect(yield* marked).toBe(1)
        // Released: refreshing resumes.
        yield* Effect.promise(() => page.dispatchEvent("body", "pointerup", { bubbles: true }))
        yield* Effect.repeat(marked, { until: (n) => n === 0, schedule: Schedule.spaced("100 millis") }).pipe(
          Effect.timeout("10 seconds")
        )
      }).pipe(Effect.scoped),
    120_000
  )
})
