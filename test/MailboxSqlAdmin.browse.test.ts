/**
 * `MailboxSqlAdmin.browse` on SQLite and PostgreSQL: walking a queue's pages with the cursor shows every row of
 * the state asked for exactly once, oldest or newest first (dead letters with ties in their time too); the id and
 * body-text filters (the text's `%`, `_` and `\` matched as themselves, in any case; a dead letter's error too);
 * a search that looks at its bound of rows says so and goes on from there; a page's rows are previews; bad
 * input is a typed failure; one message and one dead letter are read whole; `remove` spares a leased message.
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import * as Browse from "../src/internal/mailbox/admin/browse.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { sqlBackends } from "./support/sqlBackends.js"

let tables = 0
let prefix = "b0_"
beforeEach(() => {
  prefix = `b${++tables}_`
})

const backends = sqlBackends("browse")

/** Inserts `rows` into `table`, 500 at a time. */
const insert = (table: string, rows: ReadonlyArray<Record<string, unknown>>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.forEach(
      Array.from({ length: Math.ceil(rows.length / 500) }, (_, i) => rows.slice(i * 500, i * 500 + 500)),
      (chunk) => sql`INSERT INTO ${sql(table)} ${sql.insert(chunk as Array<Record<string, unknown>>)}`,
      { discard: true }
    ))

const message = (queue: string, body: string, state: "queued" | "delayed" | "inFlight", now: number) => ({
  queue,
  body,
  visible_at: state === "queued" ? now - 60_000 : now + 3_600_000,
  receipt_handle: state === "inFlight" ? crypto.randomUUID() : null,
  delivery_count: state === "inFlight" ? 1 : 0,
  enqueued_at: now - 60_000,
  reply_to: null
})

/** Every page of `query`, following `next`; each page's size checked against the limit. */
const walk = (browser: MailboxSqlAdmin.Browser, query: MailboxSqlAdmin.MessageQuery) =>
  Effect.gen(function*() {
    const seen: Array<MailboxSqlAdmin.MessageRow> = []
    let after: string | undefined
    for (let pages = 0; pages < 1000; pages++) {
      const page = yield* browser.messages({ ...query, after })
      expect(page.rows.length).toBeLessThanOrEqual(query.limit ?? 50)
      seen.push(...page.rows)
      if (page.next === undefined) return seen
      after = page.next
    }
    return yield* Effect.dieMessage("no last page after 1000 pages")
  })

for (const backend of backends) {
  const onDb = <A, E>(effect: Effect.Effect<A, E, SqlClient.SqlClient>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  describe(`MailboxSqlAdmin.browse on ${backend.label}`, () => {
    it.live("a cursor walk shows every row of a state exactly once, in either order", () =>
      Effect.gen(function*() {
        const browser = yield* MailboxSqlAdmin.browse({ prefix })
        const now = Date.now()
        // The states interleaved in sequence order, and another queue's rows between them.
        const kinds = ["queued", "queued", "delayed", "queued", "inFlight"] as const
        yield* insert(
          `${prefix}mailbox_messages`,
          Array.from({ length: 300 }, (_, i) =>
            i % 7 === 0
              ? message("other", `{"i":${i}}`, "queued", now)
              : message("q", `{"i":${i}}`, kinds[i % kinds.length]!, now))
        )
        // Dead letters: groups of three share a time, so the id breaks the ties.
        yield* insert(
          `${prefix}mailbox_dead_letters`,
          Array.from({ length: 100 }, (_, i) => ({
            id: `dead-${String(99 - i).padStart(3, "0")}`,
            queue: i % 10 === 0 ? "other" : "q",
            body: `{"i":${i}}`,
            reply_to: null,
            delivery_count: 3,
            enqueued_at: now - 120_000,
            dead_lettered_at: now - 100_000 + Math.floor(i / 3),
            error_tag: "Poison",
            error: `failed ${i}`
          }))
        )
        const sql = yield* SqlClient.SqlClient
        const expected = (state: "queued" | "delayed" | "inFlight") =>
          Effect.map(
            sql<{ seq: number | string; visible_at: number | string; receipt_handle: string | null }>`SELECT seq,
              visible_at, receipt_handle FROM ${sql(`${prefix}mailbox_messages`)} WHERE queue = 'q' ORDER BY seq`,
            (rows) =>
              rows.filter((row) =>
                state === "queued"
                  ? Number(row.visible_at) <= now
                  : Number(row.visible_at) > now && (row.receipt_handle !== null) === (state === "inFlight")
              ).map((row) => String(row.seq))
          )
        for (const state of ["queued", "delayed", "inFlight"] as const) {
          const ids = yield* expected(state)
          expect(ids.length).toBeGreaterThan(40)
          const oldest = yield* walk(browser, { queue: "q", state, limit: 7 })
          expect(oldest.map((row) => row.id)).toEqual(ids)
          expect(new Set(oldest.map((row) => row.state))).toEqual(new Set([state]))
          const newest = yield* walk(browser, { queue: "q", state, order: "newest", limit: 9 })
          expect(newest.map((row) => row.id)).toEqual([...ids].reverse())
        }
        const letters = yield* walk(browser, { queue: "q", state: "dead", limit: 4 })
        const sorted = letters.map((row) => [row.at.epochMillis, row.id] as const)
        expect(letters).toHaveLength(90)
        expect(new Set(letters.map((row) => row.id)).size).toBe(90)
        expect(sorted).toEqual(
          [...sorted].sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : 1))
        )
        const newestLetters = yield* walk(browser, { queue: "q", state: "dead", order: "newest", limit: 4 })
        expect(newestLetters.map((row) => row.id)).toEqual(letters.map((row) => row.id).reverse())
        // i = 1 and 2 share a time: the smaller id (i = 2's dead-097) comes first.
        expect(letters[0]).toMatchObject({ id: "dead-097", errorTag: "Poison", error: "failed 2", state: "dead" })
      }).pipe(onDb))

    it.live("filters by id and by body text (escaped, any case), and a search goes on past its scan bound", () =>
      Effect.gen(function*() {
        const browser = yield* MailboxSqlAdmin.browse({ prefix })
        const now = Date.now()
        const bodies = [
          `{"deal":"50%_off"}`,
          `{"deal":"50xxoff"}`, // what an unescaped "50%_off" would match
          `{"deal":"50%aoff"}`,
          `{"path":"a\\\\b"}`,
          `{"word":"NeEdLe"}`
        ]
        yield* insert(`${prefix}mailbox_messages`, bodies.map((body) => message("q", body, "queued", now)))
        const text = (value: string) =>
          Effect.map(
            browser.messages({ queue: "q", state: "queued", filter: { text: value } }),
            (page) => page.rows.map((row) => row.body)
          )
        expect(yield* text("50%_off")).toEqual([bodies[0]])
        expect(yield* text("%")).toEqual([bodies[0], bodies[2]])
        expect(yield* text("a\\\\b")).toEqual([bodies[3]])
        expect(yield* text("needle")).toEqual([bodies[4]])
        // By id: that message, in its queue and state only.
        const all = yield* browser.messages({ queue: "q", state: "queued" })
        const second = all.rows[1]!
        expect((yield* browser.messages({ queue: "q", state: "queued", filter: { id: second.id } })).rows)
          .toEqual([second])
        expect((yield* browser.messages({ queue: "other", state: "queued", filter: { id: second.id } })).rows)
          .toEqual([])
        expect((yield* browser.messages({ queue: "q", state: "delayed", filter: { id: second.id } })).rows)
          .toEqual([])
        expect((yield* browser.messages({ queue: "q", state: "queued", filter: { id: "not-a-seq" } })).rows)
          .toEqual([])

        // More rows than a search looks at per page, the only match past them: an empty page that says so and
        // whose cursor goes on to the match.
        yield* insert(
          `${prefix}mailbox_messages`,
          [
            ...Array.from({ length: Browse.scanLimit + 10 }, (_, i) => message("big", `{"i":${i}}`, "queued", now)),
            message("big", `{"i":"the needle"}`, "queued", now)
          ]
        )
        const first = yield* browser.messages({ queue: "big", state: "queued", filter: { text: "needle" } })
        expect(first.rows).toEqual([])
        expect(first.searchCut).toBe(true)
        const rest = yield* browser.messages({
          queue: "big",
          state: "queued",
          filter: { text: "needle" },
          after: first.next
        })
        expect(rest.rows.map((row) => row.body)).toEqual([`{"i":"the needle"}`])
        expect(rest).toMatchObject({ next: undefined, searchCut: false })
        // Dead letters: the text is looked for in the error too.
        yield* insert(`${prefix}mailbox_dead_letters`, [
          { ...letter("d1", "q", now), error: "Expected string, actual 1" },
          { ...letter("d2", "q", now), body: `{"actual":1}` }
        ])
        const found = yield* browser.messages({ queue: "q", state: "dead", filter: { text: "ACTUAL 1" } })
        expect(found.rows.map((row) => row.id)).toEqual(["d1"])
        expect((yield* browser.messages({ queue: "q", state: "dead", filter: { id: "d2" } })).rows.map((r) => r.id))
          .toEqual(["d2"])
      }).pipe(onDb))

    it.live("a text search folds case beyond ASCII, as PostgreSQL's lower() does, in bodies and errors", () =>
      Effect.gen(function*() {
        const browser = yield* MailboxSqlAdmin.browse({ prefix })
        const now = Date.now()
        const bodies = [
          `{"drink":"CAFÉ"}`,
          `{"city":"ÅRHUS straße"}`,
          `{"greek":"ΑΘΉΝΑ"}`,
          `{"cyrillic":"МОСКВА"}`,
          `{"plain":"cafe"}`
        ]
        yield* insert(`${prefix}mailbox_messages`, bodies.map((body) => message("u", body, "queued", now)))
        const text = (value: string) =>
          Effect.map(
            browser.messages({ queue: "u", state: "queued", filter: { text: value } }),
            (page) => page.rows.map((row) => row.body)
          )
        expect(yield* text("é")).toEqual([bodies[0]])
        expect(yield* text("café")).toEqual([bodies[0]])
        expect(yield* text("Café")).toEqual([bodies[0]])
        expect(yield* text("århus STRASSE")).toEqual([])
        expect(yield* text("århus STRAßE")).toEqual([bodies[1]])
        expect(yield* text("αθήνα")).toEqual([bodies[2]])
        expect(yield* text("москва")).toEqual([bodies[3]])
        expect(yield* text("CAFE")).toEqual([bodies[4]])
        // LIKE's wildcards stay literal.
        expect(yield* text("caf_")).toEqual([])
        // Dead letters: their errors fold alike.
        yield* insert(`${prefix}mailbox_dead_letters`, [
          { ...letter("ü1", "u", now), error: "ÜBERLAUF im Puffer" },
          { ...letter("ü2", "u", now), error: "nothing here" }
        ])
        const found = yield* browser.messages({ queue: "u", state: "dead", filter: { text: "überlauf" } })
        expect(found.rows.map((row) => row.id)).toEqual(["ü1"])
      }).pipe(onDb))

    it.live("a page is bounded: previews of huge bodies, at most 100 rows; bad input is a typed failure", () =>
      Effect.gen(function*() {
        const browser = yield* MailboxSqlAdmin.browse({ prefix })
        const now = Date.now()
        const huge = `"${"x".repeat(1_000_000)}"`
        yield* insert(`${prefix}mailbox_messages`, [message("q", huge, "queued", now)])
        yield* insert(`${prefix}mailbox_dead_letters`, [{ ...letter("d", "q", now), body: huge, error: huge }])
        const [row] = (yield* browser.messages({ queue: "q", state: "queued" })).rows
        expect(row!.body).toHaveLength(Browse.previewLength)
        expect(row!.bodyLength).toBe(huge.length)
        const [dead] = (yield* browser.messages({ queue: "q", state: "dead" })).rows
        expect(dead!.error).toHaveLength(Browse.previewLength)
        const failure = (query: Partial<MailboxSqlAdmin.MessageQuery>) =>
          Effect.map(
            Effect.flip(browser.messages({ queue: "q", state: "queued", ...query })),
            (error) => [error._tag, error.message]
          )
        expect(yield* failure({ limit: 101 })).toEqual([
          "InvalidParameterError",
          expect.stringContaining("must be an integer in 1..100")
        ])
        expect((yield* failure({ after: "'; DROP TABLE x" }))[1]).toContain("must be a page's next cursor")
        expect((yield* failure({ state: "dead", after: "12" }))[1]).toContain("must be a page's next cursor")
        expect((yield* failure({ queue: "" }))[1]).toContain("queue")
        expect((yield* failure({ filter: { text: "x".repeat(201) } }))[1]).toContain("1..200 characters")
      }).pipe(onDb))

    it.live("one message and one dead letter whole; remove spares a leased message", () =>
      Effect.gen(function*() {
        const browser = yield* MailboxSqlAdmin.browse({ prefix })
        const now = Date.now()
        const error = `Expected { task: string }\n└─ ["task"]\n   └─ Expected string, actual 1${"…".repeat(20_000)}`
        yield* insert(`${prefix}mailbox_messages`, [
          { ...message("q", `{"a":1}`, "queued", now), reply_to: "answers", traceparent: traceparent },
          message("q", `{"b":2}`, "inFlight", now)
        ])
        yield* insert(`${prefix}mailbox_dead_letters`, [{ ...letter("d", "q", now), error, traceparent }])
        const [queued, leased] = (yield* browser.messages({ queue: "q", state: "queued" })).rows.concat(
          (yield* browser.messages({ queue: "q", state: "inFlight" })).rows
        )
        const detail = Option.getOrThrow(yield* browser.message("q", queued!.id))
        expect(detail).toMatchObject({ body: `{"a":1}`, replyTo: "answers", traceparent, state: "queued" })
        expect(yield* browser.message("other", queued!.id)).toEqual(Option.none())
        const dead = Option.getOrThrow(yield* browser.deadLetter("q", "d"))
        expect(dead.error).toBe(error) // whole: 20,000 characters and more
        expect(dead).toMatchObject({ state: "dead", errorTag: "Poison", traceparent })
        expect(yield* browser.remove("q", leased!.id)).toBe(false)
        expect(yield* browser.remove("other", queued!.id)).toBe(false)
        expect(yield* browser.remove("q", queued!.id)).toBe(true)
        expect(yield* browser.message("q", queued!.id)).toEqual(Option.none())
        expect(Option.isSome(yield* browser.message("q", leased!.id))).toBe(true)
      }).pipe(onDb))
  })
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

const letter = (id: string, queue: string, now: number) => ({
  id,
  queue,
  body: `{"id":"${id}"}`,
  reply_to: null,
  delivery_count: 3,
  enqueued_at: now - 120_000,
  dead_lettered_at: now - 100_000,
  error_tag: "Poison",
  error: "failed"
})
