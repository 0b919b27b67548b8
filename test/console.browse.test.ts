/**
 * The console's browse and message pages, served by `leasehold console` as it ships (a child process), over a
 * SQLite file and a throwaway PostgreSQL:
 *
 * - in headless Chromium, 10,000 queued messages of one queue page by page: the first pages by their "next"
 *   links, newest first, and the last page; a walk over every page (through HTTP, for speed) sees each id once;
 * - a dead letter's page shows its whole long schema error, the causes (the innermost lines with their paths)
 *   first; a queued message's page shows its pretty-printed body and trace id, and its Delete button deletes it
 *   once confirmed and returns to the queue with a notice; with LEASEHOLD_SCREENSHOTS=1 the dead letter's page is saved as
 *   docs/console-message.png;
 * - hostile bodies, errors, names and ids are shown as text on both pages; a read-only console's message pages
 *   offer no action; an action taken on these pages returns to the queue's browse page.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, type Layer, Schema, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Page } from "playwright-core"
import * as ConsoleBrowse from "../src/cli/console/browse.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as Browsers from "./support/browser.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const screenshots = process.env.LEASEHOLD_SCREENSHOTS === "1"
const directory = mkdtempSync(join(tmpdir(), "leasehold-console-browse-"))
const n = 10_000

/** Inserts `rows` into `table`, 500 at a time. */
const insert = (table: string, rows: ReadonlyArray<Record<string, unknown>>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.forEach(
      Array.from({ length: Math.ceil(rows.length / 500) }, (_, i) => rows.slice(i * 500, i * 500 + 500)),
      (chunk) => sql`INSERT INTO ${sql(table)} ${sql.insert(chunk as Array<Record<string, unknown>>)}`,
      { discard: true }
    ))

const queued = (queue: string, body: string, now: number) => ({
  queue,
  body,
  visible_at: now - 60_000,
  receipt_handle: null,
  delivery_count: 0,
  enqueued_at: now - 60_000,
  reply_to: null
})

/** A schema error as a worker stores it: Effect's tree, a long type dump first and what was wrong last. */
const schemaError = (() => {
  const fields = Object.fromEntries(
    Array.from({ length: 60 }, (_, i) => [`field${i}`, Schema.optional(Schema.String)] as const)
  )
  const Task = Schema.Struct({
    ...fields,
    task: Schema.String,
    steps: Schema.Array(Schema.Struct({ n: Schema.Number }))
  })
  const result = Schema.decodeUnknownEither(Task, { errors: "all" })({ task: 1, steps: [{ n: "x" }] })
  return Either.isLeft(result) ? result.left.message : "unreachable"
})()

const hostile = `<script>alert(1)</script><img src=x onerror="alert(2)">&'`

/** The ids a browse page lists, in order. */
const idsOf = (html: string) => [...html.matchAll(/<tr data-id="([^"]*)">/g)].map((match) => match[1]!)
/** The "next page" link of a browse page (HTML-unescaped), if any. */
const nextOf = (html: string) => /<a href="([^"]*)" rel="next">/.exec(html)?.[1]?.replaceAll("&amp;", "&")

const get = (url: string, path: string) =>
  Effect.promise(async () => {
    const response = await fetch(new URL(path, url))
    return { status: response.status, body: await response.text() }
  })

const texts = (page: Page, selector: string) => Effect.promise(() => page.locator(selector).allTextContents())

const scenario = (name: string, layer: () => Layer.Layer<MailboxSql.Services, unknown>, db: () => string) =>
  describe(`the console's browse and message pages on ${name}`, () => {
    it.live(
      "10,000 queued messages page by page in Chromium; a dead letter's whole schema error, causes first; delete",
      () =>
        Effect.gen(function*() {
          const now = Date.now()
          const sql = yield* SqlClient.SqlClient
          yield* MailboxSqlAdmin.deadLetters()
          yield* insert(
            "leasehold_mailbox_messages",
            Array.from({ length: n }, (_, i) => queued("bulk", JSON.stringify({ job: i }), now))
          )
          const seqs = (yield* sql<{ seq: number | string }>`SELECT seq FROM leasehold_mailbox_messages
            WHERE queue = 'bulk' ORDER BY seq`).map((row) => String(row.seq))
          expect(seqs).toHaveLength(n)
          yield* insert("leasehold_mailbox_dead_letters", [{
            id: "the-poison",
            queue: "jobs",
            body: JSON.stringify({ task: 1, steps: [{ n: "x" }] }),
            reply_to: "answers",
            delivery_count: 1,
            enqueued_at: now - 120_000,
            dead_lettered_at: now - 100_000,
            error_tag: "ParseError",
            error: schemaError,
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
          }])
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Unknown })
          const sent = yield* jobs.send({ task: "resize", size: { width: 640, height: 480 } })

          const { url } = yield* startConsole(["--db", db()])
          const browser = yield* Browsers.browser
          const page = yield* Effect.acquireRelease(
            Effect.promise(() => browser.newPage({ viewport: { width: 1280, height: 900 } })),
            (page) => Effect.promise(() => page.close())
          )
          const errors: Array<string> = []
          page.on("pageerror", (error) => errors.push(error.message))

          // From the console's page to the queue's browse page, then the first pages by their "next" links.
          yield* Effect.promise(() => page.goto(url))
          yield* Effect.promise(() => page.locator("#queues a", { hasText: "bulk" }).click())
          expect(yield* texts(page, "#message-table tbody tr td:first-child")).toEqual(seqs.slice(0, 50))
          for (let i = 1; i <= 3; i++) {
            yield* Effect.promise(() => page.getByRole("link", { name: "next page" }).click())
            expect(yield* texts(page, "#message-table tbody tr td:first-child")).toEqual(
              seqs.slice(i * 50, i * 50 + 50)
            )
          }
          // Newest first: the last messages sent, from the newest.
          yield* Effect.promise(() => page.selectOption("select[name=order]", "newest"))
          yield* Effect.promise(() => page.getByRole("button", { name: "Show" }).click())
          expect(yield* texts(page, "#message-table tbody tr td:first-child")).toEqual(
            seqs.slice(-50).reverse()
          )

          // Every page once, through HTTP: each id once, in order; then the last page in the browser.
          const seen: Array<string> = []
          let path: string | undefined = "/queue?name=bulk"
          let last = ""
          let pages = 0
          while (path !== undefined) {
            const answer = yield* get(url, path)
            expect(answer.status).toBe(200)
            expect(Buffer.byteLength(answer.body)).toBeLessThan(256 * 1024)
            seen.push(...idsOf(answer.body))
            last = path
            path = nextOf(answer.body)
            pages++
          }
          expect(pages).toBe(n / 50)
          expect(seen).toEqual(seqs)
          yield* Effect.promise(() => page.goto(new URL(last, url).href))
          expect(yield* texts(page, "#message-table tbody tr td:first-child")).toEqual(seqs.slice(-50))
          expect(yield* texts(page, "#message-pages")).toEqual([expect.stringContaining("the last page")])
          expect(yield* Effect.promise(() => page.getByRole("link", { name: "next page" }).count())).toBe(0)

          // A text search: one message of 10,000 (the search looks at 2,000 a page and goes on).
          yield* Effect.promise(() => page.goto(`${url}queue?name=bulk&text=%22job%22%3A9999%7D`))
          let found: ReadonlyArray<string> = []
          for (let i = 0; i < 10 && found.length === 0; i++) {
            found = yield* texts(page, "#message-table tbody tr td:first-child")
            if (found.length === 0) yield* Effect.promise(() => page.getByRole("link", { name: "next page" }).click())
          }
          expect(found).toEqual([seqs[n - 1]])

          // The dead letter's page: the causes first, then the whole error (longer than any cut the page had).
          yield* Effect.promise(() => page.goto(`${url}queue?name=jobs&state=dead`))
          yield* Effect.promise(() => page.getByRole("link", { name: "the-poison" }).click())
          expect(yield* texts(page, "#causes li")).toEqual([
            `["task"] Expected string, actual 1`,
            `["steps"][0]["n"] Expected number, actual "x"`
          ])
          expect(schemaError.length).toBeGreaterThan(2000)
          expect(schemaError.indexOf(`Expected string, actual 1`)).toBeGreaterThan(1000)
          expect(yield* Effect.promise(() => page.locator("#error").textContent())).toBe(schemaError)
          expect(yield* Effect.promise(() => page.locator("#trace-id").textContent())).toBe(
            "4bf92f3577b34da6a3ce929d0e0e4736"
          )
          expect(yield* Effect.promise(() => page.locator("#body").textContent())).toBe(
            JSON.stringify({ task: 1, steps: [{ n: "x" }] }, null, 2)
          )
          expect(yield* texts(page, "#message button")).toEqual(["Redrive", "Delete"])
          if (screenshots) {
            yield* Effect.promise(() => page.screenshot({ path: "docs/console-message.png", fullPage: true }))
          }

          // A queued message: its body pretty-printed; Delete deletes it and returns to its queue with a notice.
          yield* Effect.promise(() => page.goto(`${url}queue?name=jobs`))
          yield* Effect.promise(() => page.getByRole("link", { name: sent, exact: true }).click())
          expect(yield* Effect.promise(() => page.locator("#body").textContent())).toBe(
            JSON.stringify({ task: "resize", size: { width: 640, height: 480 } }, null, 2)
          )
          yield* Effect.promise(() => page.getByRole("button", { name: "Delete" }).click())
          // The server asks first (a second step it checks); nothing is deleted until that is confirmed.
          expect(yield* Effect.promise(() => page.locator("#question").textContent())).toBe(
            `Delete message ${sent} of jobs?`
          )
          expect((yield* get(url, `/message?queue=jobs&id=${sent}`)).status).toBe(200)
          yield* Effect.promise(() => page.locator("#confirm").getByRole("button", { name: "Delete" }).click())
          expect(yield* Effect.promise(() => page.locator(".notice").textContent())).toBe(`Deleted message ${sent}.`)
          expect(new URL(page.url()).pathname).toBe("/queue")
          expect(yield* jobs.receive({ waitTime: 0 })).toEqual([])
          const gone = yield* get(url, `/message?queue=jobs&id=${sent}`)
          expect(gone.status).toBe(404)
          expect(errors).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(layer())),
      180_000
    )

    it.live("hostile bodies, errors, names and ids are shown as text", () =>
      Effect.gen(function*() {
        const now = Date.now()
        const prefix = "hostile_"
        yield* MailboxSqlAdmin.deadLetters({ prefix })
        yield* insert(`${prefix}mailbox_messages`, [queued(hostile, hostile, now)])
        yield* insert(`${prefix}mailbox_dead_letters`, [{
          id: hostile,
          queue: hostile,
          body: hostile,
          reply_to: hostile,
          delivery_count: 1,
          enqueued_at: now,
          dead_lettered_at: now,
          error_tag: hostile,
          error: `${hostile}\n└─ ["<b>"]\n   └─ ${hostile}`
        }])
        const { url } = yield* startConsole(["--db", db(), "--prefix", prefix])
        const q = encodeURIComponent(hostile)
        const list = yield* get(url, `/queue?name=${q}`)
        const id = idsOf(list.body)[0]!
        const pages = [
          list,
          yield* get(url, `/queue?name=${q}&state=dead`),
          yield* get(url, `/queue?name=${q}&text=${q}&id=${q}`),
          yield* get(url, `/message?queue=${q}&id=${id}`),
          yield* get(url, `/dead-letter?queue=${q}&id=${q}`),
          yield* get(url, `/message?queue=${q}&id=${q}`), // none such
          yield* get(url, "/")
        ]
        for (const answer of pages) {
          expect(answer.body).not.toMatch(/<script>|<img|<b>"/)
        }
        expect(pages[3]!.body).toContain("&lt;script&gt;alert(1)&lt;/script&gt;")
        expect(pages[4]!.body).toContain(`<li><code>[&quot;&lt;b&gt;&quot;] &lt;script&gt;`)
        expect(pages.map((answer) => answer.status)).toEqual([200, 200, 200, 200, 200, 404, 200])
        // Read-only: the message pages offer no action.
        const readOnly = yield* startConsole(["--db", db(), "--prefix", prefix, "--read-only"])
        for (const path of [`/message?queue=${q}&id=${id}`, `/dead-letter?queue=${q}&id=${q}`]) {
          const answer = yield* get(readOnly.url, path)
          expect(answer.status).toBe(200)
          expect(answer.body).not.toContain(`<form method="post"`)
        }
      }).pipe(Effect.scoped, Effect.provide(layer())), 60_000)
  })

describe("an action taken on the browse and message pages", () => {
  it("returns to the queue's browse page (the same page for a browse page), and to nothing else", () => {
    const from = (path: string) => ConsoleBrowse.returnTo(new URL(path, "http://127.0.0.1:1"))
    expect(from("/queue?name=jobs&state=dead&order=newest&after=12&notice=old&evil=1")).toBe(
      "/queue?name=jobs&state=dead&order=newest&after=12"
    )
    expect(from("/message?queue=a%26b&id=7")).toBe("/queue?name=a%26b")
    expect(from("/dead-letter?queue=jobs&id=x")).toBe("/queue?name=jobs&state=dead")
    expect(from("/?q=jobs")).toBeUndefined()
    expect(from("/elsewhere?queue=jobs")).toBeUndefined()
  })
})

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const sqliteFile = join(directory, "browse.db")
scenario("SQLite", () => MailboxSql.layerSqlite({ filename: sqliteFile }), () => sqliteFile)
scenario("PostgreSQL", () => MailboxSql.layerPg({ url: pgUrl }), () => pgUrl)
