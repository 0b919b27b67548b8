/**
 * `leasehold console` in a real browser (headless Chromium through playwright-core), run as the command line
 * ships (a child process), over a SQLite file and a throwaway PostgreSQL that live workers of this process
 * use: the page shows the counts changing without a reload, a dead letter is redriven from the page and
 * reaches the worker, a stale merge-queue lock is recovered from the page, the work-lease domains are shown;
 * a POST without the page's token, or from another origin, is refused and changes nothing; `--read-only`
 * offers and accepts no action. With LEASEHOLD_SCREENSHOTS=1 the views are saved under docs/ (the README's).
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Clock, DateTime, Deferred, Effect, Exit, type Layer, Option, Ref, Schedule, Schema, Scope } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import * as http from "node:http"
import { hostname, tmpdir } from "node:os"
import { join } from "node:path"
import type { Browser, Page } from "playwright-core"
import * as ConsolePage from "../src/cli/console/page.js"
import * as Snapshot from "../src/cli/console/snapshot.js"
import * as DeadLetter from "../src/DeadLetter.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MainLoop from "../src/MainLoop.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { foreignSqlite } from "./helpers.js"
import * as Browsers from "./support/browser.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const screenshots = process.env.LEASEHOLD_SCREENSHOTS === "1"
const directory = mkdtempSync(join(tmpdir(), "leasehold-console-"))

/** A failure the request's work declares permanent: dead-lettered at once. */
class Poison extends Schema.TaggedError<Poison>()("Poison", { text: Schema.String }) {}

const Request = Schema.Struct({ text: Schema.String })

const open = (browser: Browser, url: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
      const errors: Array<string> = []
      page.on("pageerror", (error) => errors.push(error.message))
      await page.goto(url)
      return { page, errors }
    }),
    ({ page }) => Effect.promise(() => page.close())
  )

/** Waits (a browser-side poll, at most 15 s) until the text of `selector` satisfies `predicate`. */
const until = (page: Page, selector: string, predicate: (text: string) => boolean, what: string) => {
  let last = ""
  return Effect.promise(() => page.locator(selector).allTextContents()).pipe(
    Effect.map((texts) => (last = texts.join(" | "))),
    Effect.repeat({ until: predicate, schedule: Schedule.spaced("100 millis") }),
    Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error(`${what}: still "${last}"`) }),
    Effect.map(() => last)
  )
}

/** Everything one backend's run needs: workers of this process on `layer`, the console on `db`. */
const scenario = (name: string, layer: () => Layer.Layer<MailboxSql.Services, unknown>, db: () => string) =>
  describe(`leasehold console on ${name}`, () => {
    it.live(
      "live counts, redrive a dead letter to a worker, recover a stale lock, refuse forged POSTs, read-only",
      () =>
        Effect.gen(function*() {
          // A merge queue whose agent "crashed" under a 1 ms lock, and a work-lease domain with a backlog.
          const merges = yield* MergeQueue.make({ lockTimeout: 1 })
          for (const workspace of ["ws-a", "ws-b", "ws-c"]) yield* merges.enqueue(workspace)
          yield* merges.nextWithLock("agent-crashed")
          const leases = yield* WorkLeaseSql.make()
          yield* leases.tryAcquire("tenant-42", 0)
          yield* leases.tryAcquire("tenant-42", 1)
          yield* leases.tryAcquire("tenant-42", 2)

          // A live worker: each request takes a moment; "poison" fails permanently while `poisoned` holds.
          const requests = yield* MailboxSql.make({
            name: "jobs",
            schema: MainLoop.requestSchema(Request),
            replySchema: MainLoop.resultSchema(Schema.String)
          })
          yield* MailboxSql.make({ name: "answers", schema: MainLoop.resultSchema(Schema.String) })
          const letters = yield* MailboxSqlAdmin.deadLetters()
          const poisoned = yield* Ref.make(true)
          const healed = yield* Deferred.make<string>()
          // The jobs wait for this, so the page is looked at while one is in flight and others are queued.
          const go = yield* Deferred.make<void>()
          const loop = yield* MainLoop.make({
            requests,
            execute: ({ text }: { readonly text: string }) =>
              Effect.gen(function*() {
                if (text === "poison") {
                  if (yield* Ref.get(poisoned)) return yield* new Poison({ text })
                  yield* Deferred.succeed(healed, text)
                }
                yield* Deferred.await(go)
                yield* Effect.sleep("50 millis")
                return text.toUpperCase()
              }),
            config: {
              deadLetters: {
                mailbox: letters.sink(MainLoop.requestSchema(Request)),
                policy: yield* DeadLetter.policy({ includeErrors: ["Poison"] })
              }
            }
          })
          yield* loop.run({ waitTime: "200 millis" }).pipe(Effect.forkScoped)

          const browser = yield* Browsers.browser
          const { url } = yield* startConsole(["--db", db()])
          const { errors, page } = yield* open(browser, url)

          // Counts change on the page without a reload.
          // A long job held by this process, its lease extended once.
          const held = yield* MailboxSql.make({ name: "held", schema: Schema.String })
          yield* held.send("a long job")
          const [holding] = yield* held.receive({ visibilityTimeout: "10 minutes" })
          yield* holding!.extendVisibility("10 minutes")
          yield* requests.send(MainLoop.request({ text: "poison" }, { requestId: "the-poison" }))
          for (let i = 0; i < 12; i++) {
            yield* requests.send(MainLoop.request({ text: `job ${i}` }), { replyTo: "answers" })
          }
          yield* until(page, `[data-queue="jobs"] [data-count="queued"]`, (text) => Number(text) > 0, "jobs queued")
          yield* until(page, `[data-queue="jobs"] [data-count="inFlight"]`, (text) => Number(text) > 0, "in flight")
          yield* until(page, "#in-flight-table", (text) => text.includes("job "), "an in-flight body")
          const longJob = page.locator("#in-flight-table tr", { hasText: "a long job" }).locator("td")
          yield* until(page, "#in-flight-table", (text) => text.includes(`${hostname()}:${process.pid}`), "holder")
          expect(yield* Effect.promise(() => longJob.nth(4).textContent())).toMatch(/ago$/) // last extended
          yield* until(page, `[data-queue="jobs"] [data-count="deadLetters"]`, (text) => text === "1", "dead letter")
          if (screenshots) {
            yield* Effect.promise(() => page.screenshot({ path: "docs/console.png", fullPage: true }))
          }
          // The jobs are held until the console's sampler has looked at them (it looks every 2 s): only what it saw
          // leave counts in a queue's rate, and jobs that came and went between two looks would not show there.
          // The console runs on this machine, so its clock is this test's (live) clock.
          const queuedAt = yield* Clock.currentTimeMillis
          yield* Effect.promise(() => page.locator("#mailboxes .note").getAttribute("data-sampled-at")).pipe(
            Effect.repeat({ until: (at) => Number(at) > queuedAt, schedule: Schedule.spaced("100 millis") }),
            Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error("no sample after the jobs came") })
          )
          yield* Deferred.succeed(go, undefined)
          yield* until(page, `[data-queue="answers"] [data-count="queued"]`, (text) => text === "12", "answers")
          yield* until(page, `[data-queue="jobs"] [data-count="queued"]`, (text) => text === "0", "all taken")
          yield* until(page, "#dead-letters-table", (text) => text.includes("Poison"), "the letter's error")
          yield* until(page, "#lock", (text) => text.includes("STALE") && text.includes("agent-crashed"), "stale lock")
          yield* until(page, "#domains", (text) => /tenant-42\s*0\s*1\s*/.test(text), "the domain's holder")

          // A forged POST — no token, or the right form from another origin — is refused and deletes nothing.
          const letter = (yield* letters.list())[0]!
          const forged = yield* Effect.promise(() =>
            fetch(`${url}actions/dead-letters/delete`, {
              method: "POST",
              headers: { "content-type": "application/x-www-form-urlencoded" },
              body: `id=${letter.id}`
            })
          )
          expect(forged.status).toBe(403)
          expect(yield* Effect.promise(() => forged.text())).toContain("token is missing or wrong")
          const token = yield* Effect.promise(() => page.locator("input[name=token]").first().inputValue())
          const crossSite = yield* Effect.promise(() =>
            fetch(`${url}actions/dead-letters/delete`, {
              method: "POST",
              headers: { "content-type": "application/x-www-form-urlencoded", origin: "http://evil.example" },
              body: `token=${token}&id=${letter.id}`
            })
          )
          expect(crossSite.status).toBe(403)
          expect(yield* letters.count()).toBe(1)

          // Redrive from the page: the letter goes back to "jobs" and the (now healthy) worker runs it.
          yield* Ref.set(poisoned, false)
          yield* Effect.promise(() =>
            page.locator("#dead-letters-table tr", { hasText: "Poison" }).getByRole("button", { name: "Redrive" })
              .click()
          )
          yield* until(page, ".notice", (text) => text.includes("Redrove 1 dead letter"), "the redrive's notice")
          expect(yield* Deferred.await(healed).pipe(Effect.timeout("15 seconds"))).toBe("poison")
          yield* until(page, "#mailboxes", (text) => text.includes("No dead letters"), "no dead letters")

          // Recover now: the crashed agent's lock is cleared and its entry is pending again.
          yield* Effect.promise(() => page.getByRole("button", { name: "Recover now" }).click())
          yield* until(page, ".notice", (text) => text.includes("1 stale lock cleared, 1 entry back"), "recovery")
          yield* until(page, "#lock", (text) => text.includes("free"), "a free lock")
          // The jobs that left show in their queue's rate once the console has sampled after them.
          yield* until(page, `[data-queue="jobs"] [data-count="perMinute"]`, (text) => Number(text) > 0, "jobs' rate")
          expect(yield* merges.getProcessingLock).toEqual(Option.none())
          expect((yield* merges.stats).byStatus.pending).toBe(3)
          if (screenshots) {
            yield* Effect.promise(() => page.screenshot({ path: "docs/console-actions.png", fullPage: true }))
          }
          expect(errors).toEqual([])

          // A search keeps its queues through the live refresh (the script fetches the page's own /live?q=…).
          const searched = yield* open(browser, `${url}?q=ANSW`)
          yield* until(searched.page, "#queues", (text) => text.includes("answers"), "the searched queue")
          const updated = yield* Effect.promise(() => searched.page.locator(".updated").textContent())
          yield* until(searched.page, ".updated", (text) => text !== updated, "a live refresh")
          const rows = yield* Effect.promise(() => searched.page.locator("#queues tbody tr").allTextContents())
          expect(rows).toHaveLength(1)
          expect(rows[0]).toContain("answers")
          expect(yield* Effect.promise(() => searched.page.locator("#queue-pages").textContent())).toContain(
            "1 of 3 queues match “ANSW”"
          )
          expect(searched.errors).toEqual([])

          // Read-only: no action on the page, and a POST carrying a real token is refused.
          const readOnly = yield* startConsole(["--db", db(), "--read-only"])
          const view = yield* open(browser, readOnly.url)
          yield* until(view.page, "#queues", (text) => text.includes("answers"), "the read-only view")
          // No action: no form that posts, and no button but the search's.
          expect(yield* Effect.promise(() => view.page.locator("form[method=post]").count())).toBe(0)
          expect(yield* Effect.promise(() => view.page.locator("button").allTextContents())).toEqual(["Search"])
          expect(yield* Effect.promise(() => view.page.locator(".badge").textContent())).toBe("read-only")
          const refused = yield* Effect.promise(() =>
            fetch(`${readOnly.url}actions/merge-queue/recover`, {
              method: "POST",
              headers: { "content-type": "application/x-www-form-urlencoded" },
              body: `token=${token}`
            })
          )
          expect(refused.status).toBe(403)
          expect(yield* Effect.promise(() => refused.text())).toContain("read-only")
        }).pipe(Effect.scoped, Effect.provide(layer())),
      120_000
    )
  })

const suiteScope = Effect.runSync(Scope.make())
let pg: Postgres.Cluster
let pgUrl = ""
beforeAll(async () => {
  pg = await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))
  pgUrl = pg.url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const sqliteFile = join(directory, "console.db")
scenario("SQLite", () => MailboxSql.layerSqlite({ filename: sqliteFile }), () => sqliteFile)
scenario("PostgreSQL", () => MailboxSql.layerPg({ url: pgUrl }), () => pgUrl)

/** GET `path` of the console on 127.0.0.1:`port`, with the `Host` header `host` (whatever it holds). */
const getAddressed = (port: number | string, host: string, path = "/") =>
  Effect.async<{ readonly status: number; readonly body: string }>((resume) => {
    const request = http.get({ host: "127.0.0.1", port, path, headers: { host } }, (response) => {
      let body = ""
      response.on("data", (chunk) => (body += chunk))
      response.on("end", () => resume(Effect.succeed({ status: response.statusCode ?? 0, body })))
    })
    request.on("error", (error) => resume(Effect.die(error)))
  })

describe("leasehold console when things are wrong", () => {
  it.live(
    "over someone else's SQLite file: says which tables are missing, and the file is unchanged",
    () =>
      Effect.gen(function*() {
        const foreign = join(directory, "foreign.db")
        yield* foreignSqlite(foreign)
        const before = readFileSync(foreign)
        const { url } = yield* startConsole(["--db", foreign])
        const page = yield* Effect.promise(() => fetch(url).then((response) => response.text()))
        expect(page).toContain(`no mailbox tables with prefix &quot;leasehold_&quot;`)
        expect(page).toContain(`no merge queue tables with prefix &quot;leasehold_&quot;`)
        expect(page).toContain(`no work-lease tables with prefix &quot;leasehold_&quot;`)
        yield* Effect.sleep("2500 millis") // a throughput sample or two
        expect(readFileSync(foreign).equals(before)).toBe(true)
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "a request addressed to another name (DNS rebinding), or from an opaque origin, is refused",
    () =>
      Effect.gen(function*() {
        const file = join(directory, "rebinding.db")
        yield* foreignSqlite(file)
        const { url } = yield* startConsole(["--db", file])
        const { port } = new URL(url)
        const get = (host: string) => getAddressed(port, host)
        const rebound = yield* get(`attacker.example:${port}`)
        expect(rebound.status).toBe(403)
        expect(rebound.body).toContain("answers to 127.0.0.1, localhost, not attacker.example")
        expect(rebound.body).not.toContain("<section")
        expect((yield* get(`localhost:${port}`)).status).toBe(200)
        expect((yield* get(`[::ffff:127.0.0.1]:${port}`)).status).toBe(200)
        // A name it is told of is answered too (--allow-host, for a console reached by the machine's name).
        const named = yield* startConsole(["--db", file, "--allow-host", "console.example"])
        const namedPort = new URL(named.url).port
        expect((yield* getAddressed(namedPort, `console.example:${namedPort}`)).status).toBe(200)
        const opaque = yield* Effect.promise(() =>
          fetch(`${url}actions/merge-queue/recover`, {
            method: "POST",
            headers: { "content-type": "application/x-www-form-urlencoded", origin: "null" },
            body: "token=x"
          })
        )
        expect(opaque.status).toBe(403)
        expect(yield* Effect.promise(() => opaque.text())).toContain("a request from null, not from this console")
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "the Host header is parsed strictly and its name and port compared exactly",
    () =>
      Effect.gen(function*() {
        const file = join(directory, "host.db")
        yield* foreignSqlite(file)
        const { url } = yield* startConsole(["--db", file, "--allow-host", "console.example"])
        const port = Number(new URL(url).port)
        const other = port === 65_535 ? 1 : port + 1
        const status = (host: string) => Effect.map(getAddressed(port, host), (answer) => [host, answer.status])
        const answered = [
          `127.0.0.1:${port}`,
          `localhost:${port}`,
          `LocalHost:${port}`,
          `127.0.0.2:${port}`,
          `[::1]:${port}`,
          `[0:0:0:0:0:0:0:1]:${port}`,
          `[::ffff:127.0.0.1]:${port}`,
          `console.example:${port}`,
          `CONSOLE.example:${port}`
        ]
        const refused = [
          `evil.com@127.0.0.1:${port}`,
          `127.0.0.1:${port}@evil.com`,
          `127.0.0.1:${port}@127.0.0.1:${port}`,
          `user:pass@localhost:${port}`,
          `127.0.0.1:${other}`,
          "127.0.0.1", // port 80
          `localhost:0${port}0`,
          `127.0.0.1:${port}/`,
          `127.0.0.1:${port}/evil.com`,
          `127.0.0.1 :${port}`,
          `127.0.0.1:${port},evil.com`,
          `%31%32%37.0.0.1:${port}`,
          `127.1:${port}`,
          `localhost.:${port}`,
          `[::1]:${other}`,
          `::1:${port}`,
          `[::1:${port}`,
          `[::1]x:${port}`,
          `[::2]:${port}`,
          `[fe80::1%25lo]:${port}`,
          `console.example:${other}`,
          `console.example.evil.com:${port}`,
          `evil.com#@127.0.0.1:${port}`,
          `127.0.0.1:99999`
        ]
        const results = yield* Effect.forEach([...answered, ...refused], status)
        expect(results).toEqual([
          ...answered.map((host) => [host, 200]),
          ...refused.map((host) => [host, 403])
        ])
        // The refusal names what was addressed and what would be answered.
        const wrongPort = yield* getAddressed(port, `127.0.0.1:${other}`)
        expect(wrongPort.body).toContain(`not 127.0.0.1:${other} (on port ${port} only`)
        expect(wrongPort.body).not.toContain("<section")
        // An --allow-host that is not a bare name or address is refused at start.
        for (const bad of ["evil.com@console.example", "console.example:8080", "a b", "http://x"]) {
          const error = yield* Effect.flip(startConsole(["--db", file, "--allow-host", bad]))
          expect(error.message).toContain("must be a host name or an IP address, without a port")
        }
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "an action returns to the page and search it was taken from",
    () =>
      Effect.gen(function*() {
        const file = join(directory, "return.db")
        // Merge-queue tables, so that the page offers an action (and carries the token).
        yield* MergeQueue.make().pipe(Effect.provide(MailboxSql.layerSqlite({ filename: file })), Effect.scoped)
        const { url } = yield* startConsole(["--db", file])
        const page = yield* Effect.promise(() => fetch(url).then((response) => response.text()))
        const token = /name="token" value="([^"]+)"/.exec(page)![1]!
        // The identity of the database the page was read from, which every form carries.
        const db = /name="db" value="([^"]+)"/.exec(page)![1]!
        const post = (referer: string | undefined) =>
          Effect.promise(() =>
            fetch(`${url}actions/merge-queue/recover`, {
              method: "POST",
              redirect: "manual",
              headers: {
                "content-type": "application/x-www-form-urlencoded",
                ...(referer === undefined ? {} : { referer })
              },
              body: new URLSearchParams({ token, db }).toString()
            })
          )
        const back = yield* post(`${url}?q=jobs&page=3&notice=old&evil=1`)
        expect(back.status).toBe(303)
        // The notice names the part it is about, and is shown there (next to what changed).
        expect(back.headers.get("location")).toMatch(/^\/\?q=jobs&page=3&notice=[^&#]+&at=merge-queue#merge-queue$/)
        expect((yield* post(undefined)).headers.get("location")).toMatch(
          /^\/\?notice=[^&#]+&at=merge-queue#merge-queue$/
        )
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "PostgreSQL going away: the page says it cannot read, and shows the queues again once it is back",
    () =>
      Effect.gen(function*() {
        const { url } = yield* startConsole(["--db", pgUrl])
        const live = Effect.promise(() => fetch(`${url}live`).then((response) => response.text()))
        expect(yield* live).not.toContain("Could not read")
        yield* pg.stop
        const down = yield* live.pipe(Effect.ensuring(pg.start))
        expect(down).toContain("Could not read")
        yield* live.pipe(
          Effect.repeat({ until: (text) => !text.includes("Could not read"), schedule: Schedule.spaced("200 millis") }),
          Effect.timeout("20 seconds")
        )
        const back = yield* live
        expect(back).toContain(`<section id="mailboxes">`)
      }).pipe(Effect.scoped),
    60_000
  )
})

describe("the console's page", () => {
  it("escapes everything that comes from the database", () => {
    const hostile = `<img src=x onerror="alert(1)">&'`
    const html = ConsolePage.live({
      at: 0,
      mailboxes: {
        _tag: "Present",
        value: {
          queues: [{
            queue: hostile,
            queued: 1,
            inFlight: 1,
            delayed: 0,
            deadLetters: 0,
            oldestVisibleAt: 0,
            perMinute: 0,
            recent: [],
            paused: true,
            recorded: true
          }],
          inFlight: [{
            id: "1",
            queue: hostile,
            deliveryCount: 1,
            leaseUntil: 1000,
            enqueuedAt: 0,
            receivedBy: hostile,
            extendedAt: undefined,
            body: hostile
          }],
          inFlightTotal: 1,
          deadLetters: [],
          deadLetterTotal: 0,
          queuePage: { q: hostile, page: 1, pages: 1, matching: 1, total: 1, offset: 0 },
          totalPerMinute: undefined,
          sampledAt: undefined
        }
      },
      workers: {
        _tag: "Present",
        value: {
          processes: [{
            process: hostile,
            instance: hostile,
            name: hostile,
            startedAt: 0,
            version: hostile,
            refreshedAt: 0,
            sinceRefreshMillis: 99_000,
            lost: true,
            loops: [{
              name: hostile,
              queue: hostile,
              state: "running",
              messageId: hostile,
              heartbeatAgeMillis: 1,
              stalled: true
            }]
          }],
          stalledAfter: 60_000,
          lostAfter: 30_000
        }
      },
      mergeQueue: { _tag: "Failed", error: hostile },
      workLeases: { _tag: "Absent", reason: hostile }
    }, { database: "db", token: "t", readOnly: false, query: { q: hostile, page: 1 } })
    expect(html).not.toContain("<img")
    expect(html).toContain("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;&#39;")
  })
})

describe("the console's page, bounded", () => {
  it("is under 1 MB with every list full and every value from the database huge and all escapes", () => {
    // What the database could hold, at its worst: a megabyte of characters that escaping makes five times longer.
    const huge = "<&>\"'".repeat(200_000)
    const at = DateTime.unsafeMake(0)
    const some = Option.some(huge)
    const snapshot: Snapshot.Snapshot = {
      at: 0,
      mailboxes: {
        _tag: "Present",
        value: {
          // The snapshot reads at most a page of queues, `inFlightLimit` messages and `pageLimit` dead letters,
          // bodies and errors cut to `previewLength`; names are as long as the database has them.
          queues: Array.from({ length: Snapshot.pageLimit }, (_, i) => ({
            queue: `${i}${huge}`,
            queued: 1e15,
            inFlight: 1e15,
            delayed: 1e15,
            deadLetters: 1e15,
            oldestVisibleAt: 0,
            perMinute: 1e15,
            recent: Array.from({ length: Snapshot.bars }, (_, bar) => bar + 1),
            paused: true,
            recorded: true
          })),
          // A search is at most 200 characters (Snapshot.query).
          queuePage: { q: huge.slice(0, 200), page: 2, pages: 3, matching: 1e15, total: 1e15, offset: 50 },
          inFlight: Array.from({ length: Snapshot.inFlightLimit }, () => ({
            id: huge,
            queue: huge,
            deliveryCount: 1e15,
            leaseUntil: 0,
            enqueuedAt: 0,
            receivedBy: huge,
            extendedAt: 0,
            body: huge.slice(0, Snapshot.previewLength)
          })),
          inFlightTotal: 1e15,
          deadLetters: Array.from({ length: Snapshot.pageLimit }, (_, i) => ({
            id: i % 2 === 0 ? huge : `${i}`.repeat(100).slice(0, 200), // ids short enough for a form, and not
            queue: huge,
            deliveryCount: 1e15,
            deadLetteredAt: 0,
            errorTag: huge.slice(0, Snapshot.previewLength),
            error: huge.slice(0, Snapshot.previewLength),
            body: huge.slice(0, Snapshot.previewLength)
          })),
          deadLetterTotal: 1e15,
          totalPerMinute: 1e15,
          sampledAt: 1e15
        }
      },
      mergeQueue: {
        _tag: "Present",
        value: {
          stats: {
            total: 1e15,
            byStatus: Object.fromEntries(MergeQueue.Status.literals.map((status) => [status, 1e15])) as never,
            lock: Option.some({ agentId: huge, acquiredAt: at, expiresAt: at, fencingToken: 1e15 }),
            oldestPendingAt: Option.some(at)
          },
          entries: Array.from({ length: Snapshot.pageLimit }, (_, i) => ({
            id: i,
            workspace: huge,
            beadId: some,
            priority: 1e15,
            status: "pending" as const,
            agentId: some,
            fencingToken: Option.some(1e15),
            startedAt: Option.some(at),
            stateChangedAt: at,
            createdAt: at,
            attemptCount: 1e15,
            lastError: some
          })),
          audit: Array.from({ length: Snapshot.auditLimit }, (_, i) => ({
            id: i,
            at,
            action: "claimed" as const,
            agentId: some,
            entryId: Option.some(1e15),
            fencingToken: Option.some(1e15),
            fromStatus: Option.some("pending" as const),
            toStatus: Option.some(MergeQueue.inProgress[0]!),
            detail: some
          }))
        }
      },
      // Every process with more loops than the panel shows, every value huge.
      workers: {
        _tag: "Present",
        value: {
          processes: Array.from({ length: Snapshot.pageLimit }, () => ({
            process: huge,
            name: huge,
            startedAt: 0,
            version: huge,
            refreshedAt: 0,
            sinceRefreshMillis: 1e15,
            lost: true,
            loops: Array.from({ length: 1000 }, () => ({
              name: huge,
              queue: huge,
              state: "draining" as const,
              messageId: huge,
              heartbeatAgeMillis: 1e15,
              stalled: true
            }))
          })),
          stalledAfter: 1e15,
          lostAfter: 1e15
        }
      },
      workLeases: {
        _tag: "Present",
        value: {
          domains: Array.from({ length: Snapshot.pageLimit }, () => ({
            domainId: huge,
            leaseOffset: 1e15,
            leaseFencing: 1e15,
            acquiredAt: 0,
            retryCount: 1e15,
            fencingToken: 1e15,
            lowWater: 1e15,
            backlog: 1e15
          })),
          total: 1e15
        }
      }
    }
    const html = ConsolePage.page(snapshot, {
      database: "db",
      token: "t".repeat(32),
      readOnly: false,
      notice: huge, // anyone can link to /?notice=…
      query: { q: huge.slice(0, 200), page: 2 }
    })
    const bytes = Buffer.byteLength(html)
    console.log(`the console's page at its worst: ${(bytes / 1024).toFixed(0)} KiB`)
    expect(bytes).toBeLessThan(1024 * 1024)
    expect(html).not.toContain("<&")
  })
})

describe("the console's throughput", () => {
  it("is per minute over the sampler's own clock, and the sparkline's bars cover the window", () => {
    const bucket = (start: number, end: number, left: number, total: number) => ({
      start,
      end,
      left: new Map([["q", left]]),
      total
    })
    const buckets = [bucket(0, 2_000, 4, 6), bucket(2_000, 4_000, 2, 2), bucket(290_000, 300_000, 3, 3)]
    const leftOfQ = (b: Snapshot.Bucket) => b.left.get("q") ?? 0
    // 9 left over 300 s: 1.8 a minute; however the database's clock differs, it is not in the sum.
    expect(Snapshot.perMinute(buckets, leftOfQ)).toBeCloseTo(1.8)
    expect(Snapshot.perMinute(buckets, (b) => b.total)).toBeCloseTo(2.2)
    expect(Snapshot.perMinute([], leftOfQ)).toBe(0)
    const bars = Snapshot.recent(buckets, leftOfQ)
    expect(bars).toHaveLength(30)
    expect(bars[29]).toBe(3) // the last 10 s
    expect(bars[0]).toBe(6) // the first 10 s of the window
    expect(bars.reduce((a, b) => a + b, 0)).toBe(9)
  })
})

describe("the console's sampler", () => {
  it.live("counts what left each queue between two samples, and the total from the sequence", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number })
      yield* jobs.send(0)
      const sampler = yield* Snapshot.makeSampler(sql, "leasehold_")
      yield* sampler.sample
      for (let i = 1; i <= 4; i++) yield* jobs.send(i)
      yield* sampler.sample // sees 5 rows
      for (const message of yield* jobs.receive({ maxMessages: 10 })) yield* message.acknowledge
      yield* jobs.send(5) // sent and done between two samples: only in the total
      for (const message of yield* jobs.receive({ maxMessages: 10 })) yield* message.acknowledge
      yield* sampler.sample
      const { buckets } = yield* sampler.rates
      expect(buckets.map((bucket) => [bucket.left.get("jobs") ?? 0, bucket.total])).toEqual([[0, 0], [5, 6]])
    }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename: join(directory, "sampler.db") }))))
})
