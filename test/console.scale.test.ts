/**
 * `leasehold console` over a big database: 10,000 queues, 10,000 dead letters, 10,000 merge-queue entries and
 * audit rows, 10,000 work-lease domains, and a few rows whose text is a megabyte — inserted in bulk with SQL,
 * on SQLite and PostgreSQL. The page and its live part stay under 1 MB; the queue table is paged and
 * searchable, the live part keeps the page and the search; the browse and message pages of the queue whose rows
 * are a megabyte stay under 1 MB too, and say what they cut. The time each answer took is printed (not asserted:
 * two shared CPUs make times a poor assertion).
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, type Layer, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-console-scale-"))

const n = 10_000
const pad = (i: number) => String(i).padStart(5, "0")
/** A megabyte of text where a cell shows a database value. */
const huge = "<&>".repeat(350_000)

/** Inserts `rows` into `table`, 500 at a time. */
const insert = (sql: SqlClient.SqlClient, table: string, rows: ReadonlyArray<Record<string, unknown>>) =>
  Effect.forEach(
    Array.from({ length: Math.ceil(rows.length / 500) }, (_, i) => rows.slice(i * 500, i * 500 + 500)),
    (chunk) => sql`INSERT INTO ${sql(table)} ${sql.insert(chunk as Array<Record<string, unknown>>)}`,
    { discard: true }
  )

/** The tables made by the library, then filled with rows directly. */
const fixture = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* MailboxSqlAdmin.deadLetters()
  yield* MergeQueue.make()
  yield* WorkLeaseSql.make()
  const now = Date.now()
  // Every queue has a visible message; every tenth one is in flight as well; one in-flight body is huge.
  yield* insert(sql, "leasehold_mailbox_messages", [
    ...Array.from({ length: n }, (_, i) => ({
      queue: `queue-${pad(i)}`,
      body: JSON.stringify({ job: i, text: "x".repeat(100) }),
      visible_at: now - 60_000,
      receipt_handle: null,
      delivery_count: 0,
      enqueued_at: now - 60_000,
      reply_to: null
    })),
    ...Array.from({ length: n / 10 }, (_, i) => ({
      queue: `queue-${pad(i * 10)}`,
      body: i === 0 ? huge : JSON.stringify({ job: i }),
      visible_at: now + 600_000 + i,
      receipt_handle: `handle-${i}`,
      delivery_count: 1,
      enqueued_at: now - 30_000,
      reply_to: null
    }))
  ])
  // A dead letter for every queue; the oldest has a huge body and error.
  yield* insert(
    sql,
    "leasehold_mailbox_dead_letters",
    Array.from({ length: n }, (_, i) => ({
      id: `dead-${pad(i)}`,
      queue: `queue-${pad(i)}`,
      body: i === 0 ? huge : JSON.stringify({ job: i, text: "y".repeat(100) }),
      reply_to: null,
      delivery_count: 3,
      enqueued_at: now - 120_000,
      dead_lettered_at: now - 100_000 + i,
      error_tag: "Poison",
      error: i === 0 ? huge : `the job failed: ${"z".repeat(150)}`
    }))
  )
  yield* insert(
    sql,
    "leasehold_merge_queue",
    Array.from({ length: n }, (_, i) => ({
      workspace: i === 0 ? `ws-${huge.slice(0, 100_000)}` : `ws-${pad(i)}`,
      bead_id: null,
      priority: 0,
      status: "pending",
      agent_id: null,
      fencing_token: null,
      started_at: null,
      state_changed_at: now - 1000,
      created_at: now - 1000 + i,
      attempt_count: 1,
      last_error: i === 0 ? huge : "a conflict"
    }))
  )
  yield* insert(
    sql,
    "leasehold_merge_queue_audit",
    Array.from({ length: n }, (_, i) => ({
      at: now - n + i,
      action: "enqueue",
      agent_id: null,
      entry_id: i + 1,
      fencing_token: null,
      from_status: null,
      to_status: "pending",
      detail: i === n - 1 ? huge : "enqueued"
    }))
  )
  yield* insert(
    sql,
    "leasehold_work_lease_domains",
    Array.from({ length: n }, (_, i) => ({
      domain_id: i === 0 ? `domain-${huge.slice(0, 100_000)}` : `domain-${pad(i)}`,
      lease_offset: null,
      lease_token: null,
      lease_fencing: null,
      acquired_at: null,
      retry_count: 0,
      fencing_token: 0,
      low_water: 0
    }))
  )
})

/** GETs `path` of the console: status, body, bytes and milliseconds. */
const get = (url: string, path: string) =>
  Effect.promise(async () => {
    const started = performance.now()
    const response = await fetch(new URL(path, url))
    const body = await response.text()
    return {
      status: response.status,
      body,
      bytes: Buffer.byteLength(body),
      millis: Math.round(performance.now() - started)
    }
  })

/** The queues a view lists in its table (each row names its queue). */
const listed = (body: string) => [...body.matchAll(/<tr data-queue="([^"]*)">/g)].map((match) => match[1])

/** The counts of `queue`'s row. */
const counts = (body: string, queue: string) =>
  Object.fromEntries(
    [...(new RegExp(`<tr data-queue="${queue}">(.*?)</tr>`).exec(body)?.[1] ?? "").matchAll(
      /data-count="(\w+)">([^<]*)</g
    )].map((match) => [match[1], match[2]])
  )

const scenario = (name: string, layer: () => Layer.Layer<MailboxSql.Services, unknown>, db: () => string) =>
  describe(`leasehold console over 10,000 queues and 10,000 dead letters on ${name}`, () => {
    it.live(
      "the page stays under 1 MB; the queue table is paged and searchable, and the live part keeps both",
      () => {
        const figures: Array<string> = []
        return Effect.gen(function*() {
          yield* fixture.pipe(Effect.provide(layer()))
          const { url } = yield* startConsole(["--db", db()])
          const measure = (path: string) =>
            Effect.tap(
              get(url, path),
              (answer) =>
                Effect.sync(() =>
                  figures.push(
                    `${path}: ${answer.status}, ${(answer.bytes / 1024).toFixed(0)} KiB, ${answer.millis} ms`
                  )
                )
            )

          const first = yield* measure("/")
          for (let i = 0; i < 3; i++) yield* measure("/")
          const live = yield* measure("/live")
          expect(first.status).toBe(200)
          expect(first.bytes).toBeLessThan(1024 * 1024)
          expect(live.bytes).toBeLessThan(1024 * 1024)

          // Page 1: the first queues by name, a bounded number of them, and the totals.
          const page1 = listed(first.body)
          expect(page1.length).toBeGreaterThan(0)
          expect(page1.length).toBeLessThanOrEqual(100)
          expect(page1[0]).toBe("queue-00000")
          expect(first.body).toContain("10000 queues")
          expect(first.body).toContain(`href="/?page=2"`)
          // Every other list is bounded too, and says how many there are in all.
          expect(first.body).toContain("of 10000")
          const size = page1.length

          // Page 2 starts where page 1 ended; the live part of page 2 lists the same queues.
          const page2 = yield* measure("/?page=2")
          expect(listed(page2.body)[0]).toBe(`queue-${pad(size)}`)
          expect(page2.body).toContain(`href="/?page=1"`)
          expect(page2.body).toContain(`data-src="/live?page=2"`)
          expect(listed((yield* measure("/live?page=2")).body)).toEqual(listed(page2.body))

          // The last page (and one past it, which shows the last).
          const pages = Math.ceil(n / size)
          const last = yield* measure(`/?page=${pages}`)
          expect(listed(last.body)).toContain(`queue-${pad(n - 1)}`)
          expect(listed((yield* measure(`/?page=${pages + 5}`)).body)).toContain(`queue-${pad(n - 1)}`)
          expect(listed((yield* measure("/?page=junk")).body)[0]).toBe("queue-00000")

          // Search by name: the matching queues only, with their counts.
          const search = yield* measure("/?q=queue-0123")
          expect(listed(search.body)).toEqual(Array.from({ length: 10 }, (_, i) => `queue-0123${i}`))
          expect(search.body).toContain(`10 of 10000 queues`)
          expect(search.body).toContain(`data-src="/live?q=queue-0123"`)
          expect(counts(search.body, "queue-01230")).toMatchObject({ queued: "1", inFlight: "1", deadLetters: "1" })
          expect(counts(search.body, "queue-01231")).toMatchObject({ queued: "1", inFlight: "0", deadLetters: "1" })
          expect(listed((yield* measure("/live?q=queue-0123")).body)).toEqual(listed(search.body))
          // A search that spans pages keeps the search in its links.
          const wide = yield* measure("/?q=queue-01")
          expect(wide.body).toContain(`href="/?q=queue-01&amp;page=2"`)
          expect(listed((yield* measure("/?q=nothing-like-it")).body)).toEqual([])

          // The browse and message pages of the queue whose in-flight body and dead letter are a megabyte.
          const inFlight = yield* measure("/queue?name=queue-00000&state=inFlight")
          const id = /<tr data-id="(\d+)">/.exec(inFlight.body)?.[1]
          expect(id).toBeDefined()
          const views = [
            inFlight,
            yield* measure("/queue?name=queue-00000&state=dead"),
            yield* measure(`/message?queue=queue-00000&id=${id}`),
            yield* measure("/dead-letter?queue=queue-00000&id=dead-00000")
          ]
          for (const page of views) {
            expect(page.status).toBe(200)
            expect(page.bytes).toBeLessThan(1024 * 1024)
          }
          expect(views[2]!.body).toContain(`(the first 65536 of ${huge.length} characters)`)
          expect(views[3]!.body).toContain(`The first 65536 of the ${huge.length} characters stored`)
        }).pipe(
          Effect.scoped,
          // The figures for the report, also when an assertion failed.
          Effect.ensuring(Effect.sync(() => console.log(`console, 10,000 queues, ${name}:\n  ${figures.join("\n  ")}`)))
        )
      },
      180_000
    )
  })

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

const sqliteFile = join(directory, "scale.db")
scenario("SQLite", () => MailboxSql.layerSqlite({ filename: sqliteFile }), () => sqliteFile)
scenario("PostgreSQL", () => MailboxSql.layerPg({ url: pgUrl }), () => pgUrl)
