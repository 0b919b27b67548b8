/**
 * The console's keys panel (issue 45, "Operators see it"), in headless Chromium against `leasehold console` as it
 * ships, over a SQLite file: from a queue's row to its keys — ready, in flight, pending, limit, weight, leased
 * time, the start window — sorted by a header's link (and back), each hostile key name (`<script>…`, quotes and
 * ampersands) shown as text and never run; a key's link opens the browse page of that key's messages only
 * (browse's key filter), which the filter form keeps. Over HTTP: a queue name that breaks the name rule is a
 * message, not a failure; the panel's rows are bounded by the store's 10,000.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Schema, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as Browsers from "./support/browser.js"
import { startConsole } from "./support/console.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-console-keys-"))
const file = join(directory, "keys.db")
const scope = Effect.runSync(Scope.make())
let context: Context.Context<SqlClient.SqlClient>
beforeAll(async () => {
  context = await Effect.runPromise(
    Layer.buildWithScope(MailboxSql.layerSqlite({ filename: file }), scope).pipe(
      Effect.map((built) => Context.make(SqlClient.SqlClient, Context.get(built, SqlClient.SqlClient)))
    )
  )
}, 60_000)
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

const script = "<script>alert(1)</script>"
const quotes = "\"'&amp;<b>"

describe("the console's keys panel on SQLite", () => {
  it.live(
    "from a queue's row to its keys, sorted, escaped; a key's messages through browse",
    () =>
      Effect.gen(function*() {
        const prefix = "ck_"
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, prefix })
        // acme: 3 messages, one in flight (limit 1: at its limit); the script key: 2; quotes: 1 (rated).
        for (const [key, n] of [["acme", 3], [script, 2], [quotes, 1]] as const) {
          for (let i = 0; i < n; i++) yield* jobs.send(`${key} #${i}`, { key })
        }
        yield* jobs.send("no key")
        const admin = yield* MailboxSqlAdmin.queues({ prefix })
        yield* admin.setKeySettings("jobs", "acme", { limit: 1 })
        yield* admin.setKeySettings("jobs", quotes, { starts: { count: 5, per: "1 minute" }, weight: 3 })
        // acme's first message taken (the other keys held for the claim, then let go).
        yield* admin.setKeySettings("jobs", script, { limit: 0 })
        yield* admin.setKeySettings("jobs", quotes, { limit: 0 })
        const taken = yield* jobs.receive({ visibilityTimeout: "10 minutes", maxMessages: 1 })
        expect(taken.map((message) => message.body)).toEqual(["acme #0"])
        yield* admin.setKeySettings("jobs", script, { limit: null })
        yield* admin.setKeySettings("jobs", quotes, { limit: null })

        const { url } = yield* startConsole(["--db", file, "--prefix", prefix])
        const browser = yield* Browsers.browser
        const page = yield* Effect.acquireRelease(
          Effect.promise(async () => {
            const context = await browser.newContext()
            const page = await context.newPage()
            return { context, page }
          }),
          ({ context }) => Effect.promise(() => context.close())
        ).pipe(Effect.map(({ page }) => page))
        const dialogs: Array<string> = []
        page.on("dialog", (dialog) => {
          dialogs.push(dialog.message())
          void dialog.dismiss()
        })
        yield* Effect.promise(() => page.goto(url))
        yield* Effect.promise(() => page.locator(`[data-queue="jobs"] a`, { hasText: "keys" }).click())
        yield* Effect.promise(() => page.waitForSelector("#key-table"))
        expect(new URL(page.url()).pathname).toBe("/keys")
        const keys = () =>
          Effect.promise(() =>
            page.locator("#key-table tbody tr").evaluateAll((rows) => rows.map((row) => row.getAttribute("data-key")))
          )
        // Most pending first (the default), each name exactly as sent.
        expect(yield* keys()).toEqual(["acme", script, quotes])
        const cells = yield* Effect.promise(() =>
          page.locator(`#key-table tbody tr`).evaluateAll((rows) =>
            rows.map((row) => [...row.querySelectorAll("td")].map((cell) => cell.textContent?.trim()))
          )
        )
        expect(cells[0]!.slice(0, 6)).toEqual(["acme", "2", "1", "3", "1 at limit", "1"])
        expect(cells[1]![0]).toBe(script)
        expect(cells[2]!.slice(0, 6)).toEqual([quotes, "1", "0", "1", "–", "3"])
        expect(cells[2]![7]).toBe("0 / 5 per 1m")
        // Nothing of a key ran or became markup.
        expect(yield* Effect.promise(() => page.locator("#key-table script, #key-table b").count())).toBe(0)

        // Sorted by a header: by key ascending, then (pressed again) descending; by weight, heaviest first.
        yield* Effect.promise(() => page.locator(`#key-table th a[data-sort="key"]`).click())
        yield* Effect.promise(() => page.waitForSelector(`#key-table th[aria-sort="ascending"] a[data-sort="key"]`))
        expect(yield* keys()).toEqual([quotes, script, "acme"].sort())
        yield* Effect.promise(() => page.locator(`#key-table th a[data-sort="key"]`).click())
        yield* Effect.promise(() => page.waitForSelector(`#key-table th[aria-sort="descending"] a[data-sort="key"]`))
        expect(yield* keys()).toEqual([quotes, script, "acme"].sort().reverse())
        yield* Effect.promise(() => page.locator(`#key-table th a[data-sort="weight"]`).click())
        yield* Effect.promise(() => page.waitForSelector(`#key-table th[aria-sort] a[data-sort="weight"]`))
        expect((yield* keys())[0]).toBe(quotes)

        // A key's messages: browse filtered by key, every row of that key; the filter form keeps it.
        yield* Effect.promise(() => page.locator(`#key-table tr[data-key="acme"] td:first-child a`).click())
        yield* Effect.promise(() => page.waitForSelector("#messages"))
        expect(new URL(page.url()).searchParams.get("key")).toBe("acme")
        const rowKeys = () =>
          Effect.promise(() => page.locator("#message-table tbody tr td:nth-child(2)").allTextContents())
        expect(yield* rowKeys()).toEqual(["acme", "acme"])
        expect(yield* Effect.promise(() => page.locator(`input[name="key"]`).inputValue())).toBe("acme")
        yield* Effect.promise(() => page.locator("nav.tabs a", { hasText: "in flight" }).click())
        yield* Effect.promise(() => page.waitForSelector(`nav.tabs a[aria-current][href*="inFlight"]`))
        expect(yield* rowKeys()).toEqual(["acme"])
        // The script key through the form: typed as text, shown as text.
        yield* Effect.promise(() => page.locator(`input[name="key"]`).fill(script))
        yield* Effect.promise(() => page.locator(`form.filter button[type="submit"]`).click())
        yield* Effect.promise(() => page.waitForURL((at) => at.searchParams.get("key") === script))
        expect(yield* rowKeys()).toEqual([])
        yield* Effect.promise(() => page.locator("nav.tabs a", { hasText: "queued" }).click())
        yield* Effect.promise(() => page.waitForURL((at) => at.searchParams.get("state") === null))
        expect(yield* rowKeys()).toEqual([script, script])
        expect(dialogs).toEqual([])

        // Over HTTP: a queue name the name rule refuses is said so; no queue at all is a 400.
        const bad = yield* Effect.promise(() => fetch(`${url}keys?name=${encodeURIComponent("a\u0001b")}`))
        expect(bad.status).toBe(200)
        expect(yield* Effect.promise(() => bad.text())).toContain("must not contain control characters")
        expect((yield* Effect.promise(() => fetch(`${url}keys`))).status).toBe(400)
      }).pipe(Effect.scoped, Effect.provide(context)),
    120_000
  )
})
