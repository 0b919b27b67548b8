/**
 * A console action acts on what its page showed, or on nothing — against `leasehold console` as it ships (a
 * child process), over HTTP as a browser's plain forms post:
 *
 * - the database replaced under a running console (a SQLite file renamed over; a PostgreSQL database dropped and
 *   created again): the browse and message pages show the new one, and a Delete rendered from the old one (its
 *   first step or its confirmation) deletes nothing and says why (409);
 * - a confirmation is bound to exactly one action — kind, queue, id and database: each field changed alone, a
 *   field added, a field left out, a field given twice, and a used confirmation replayed are refused (403) and
 *   delete nothing;
 * - the message page reads only the journal entries it shows (`journals().read` with a bound).
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Option, Schema, Scope } from "effect"
import { mkdtempSync, renameSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-console-identity-"))

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

type Fields = ReadonlyArray<readonly [string, string]>

const unescape = (text: string) =>
  text.replaceAll("&quot;", "\"").replaceAll("&#39;", "'").replaceAll("&lt;", "<").replaceAll("&gt;", ">")
    .replaceAll("&amp;", "&")

/** The POST forms of a page: where each posts, and its hidden fields in order. */
const formsOf = (html: string) =>
  [...html.matchAll(/<form method="post" action="([^"]+)"[^>]*>(.*?)<\/form>/gs)].map((match) => ({
    action: unescape(match[1]!),
    fields: [...match[2]!.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((
      input
    ): readonly [string, string] => [unescape(input[1]!), unescape(input[2]!)])
  }))

const formFor = (html: string, action: string, id: string) => {
  const form = formsOf(html).find((form) =>
    form.action === action && form.fields.some(([name, value]) => name === "id" && value === id)
  )
  expect(form, `a form for ${action} ${id} in: ${html.slice(0, 2000)}`).toBeDefined()
  return form!
}

const get = (url: string, path: string) =>
  Effect.promise(async () => {
    const response = await fetch(new URL(path, url))
    return { status: response.status, body: await response.text() }
  })

const post = (url: string, action: string, fields: Fields) =>
  Effect.promise(async () => {
    const response = await fetch(new URL(action, url), {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(fields.map(([name, value]): [string, string] => [name, value])).toString()
    })
    return { status: response.status, body: await response.text(), location: response.headers.get("location") }
  })

/** The notice an action's redirect carries. */
const noticeOf = (location: string | null) => new URL(location ?? "/", "http://console").searchParams.get("notice")

const field = (fields: Fields, name: string) => fields.find(([each]) => each === name)?.[1]

/** The rows of `table` through a connection of the test's own. */
const count = (table: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      Effect.map(sql<{ n: number | string }>`SELECT count(*) AS n FROM ${sql(table)}`, (rows) => Number(rows[0]!.n))
  )

const bodies = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ seq: number | string; body: string }>`SELECT seq, body FROM leasehold_mailbox_messages ORDER BY seq`,
    (rows) => rows.map((row) => [String(row.seq), JSON.parse(row.body) as string])
  ))

/** A database with queue `jobs` holding `texts` (ids 1, 2, …). */
const fill = (layer: Layer.Layer<MailboxSql.Services, unknown>, texts: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const mailbox = yield* MailboxSql.make({ name: "jobs", schema: Schema.String })
    for (const text of texts) yield* mailbox.send(text)
  }).pipe(Effect.scoped, Effect.provide(layer))

/**
 * The stale Delete of message 1 (a page read from the old database, `page`, and a confirmation issued before
 * the swap, `confirmation`), posted after the swap: refused, saying why; nothing deleted.
 */
const staleRefused = (url: string, page: Fields, confirmation: Fields) =>
  Effect.gen(function*() {
    for (const fields of [page, confirmation]) {
      const stale = yield* post(url, "/actions/messages/delete", fields)
      expect(stale.status).toBe(409)
      expect(stale.body).toContain("another database")
      expect(stale.body).toContain("Nothing was changed")
      expect(stale.body).not.toContain("Deleted message")
    }
  })

describe("the SQLite file replaced under a running console", () => {
  it.live(
    "pages show the new file; a Delete rendered from the old one deletes nothing and says why",
    () =>
      Effect.gen(function*() {
        const live = join(directory, "live.db")
        const other = join(directory, "other.db")
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        const { url } = yield* startConsole(["--db", live])

        const before = yield* get(url, "/message?queue=jobs&id=1")
        expect(before.body).toContain("OLD-one")
        const stalePage = formFor(before.body, "/actions/messages/delete", "1").fields
        const asked = yield* post(url, "/actions/messages/delete", stalePage)
        expect(asked.status).toBe(200)
        expect(asked.body).toContain("Delete message 1 of jobs?")
        const staleConfirmation = formsOf(asked.body)[0]!.fields

        // A writer writes while the console holds the file: its -wal keeps the frames.
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-two", "OLD-three"])
        // Replaced as an operator would: another database file renamed over the one the console reads — its -wal
        // and -shm left beside it, which SQLite would read the new file through (the old file's rows shown as
        // the new one's, and a delete written into them): the console says so and reads nothing.
        renameSync(other, live)
        const blocked = yield* get(url, "/queue?name=jobs")
        expect(blocked.body).toContain(`${live}-wal and ${live}-shm are still the old file&#39;s`)
        expect(blocked.body).not.toContain("OLD-")
        for (const fields of [stalePage, staleConfirmation]) {
          const refused = yield* post(url, "/actions/messages/delete", fields)
          expect(refused.status).toBe(409)
          expect(refused.body).toContain("still the old file&#39;s")
        }
        // Moved away: the console reads the new file.
        for (const suffix of ["-wal", "-shm"]) renameSync(live + suffix, `${live}.old${suffix}`)

        const browse = yield* get(url, "/queue?name=jobs")
        expect(browse.body).toContain("NEW-one")
        expect(browse.body).toContain("NEW-two")
        expect(browse.body).not.toContain("OLD-one")
        const after = yield* get(url, "/message?queue=jobs&id=1")
        expect(after.body).toContain("NEW-one")
        expect(after.body).not.toContain("OLD-one")
        const freshPage = formFor(after.body, "/actions/messages/delete", "1").fields

        yield* staleRefused(url, stalePage, staleConfirmation).pipe(
          Effect.zipRight(Effect.flatMap(bodies, (rows) =>
            Effect.sync(() =>
              expect(rows).toEqual([["1", "NEW-one"], ["2", "NEW-two"]])
            ))),
          Effect.provide(MailboxSql.layerSqlite({ filename: live }))
        )

        // The forms name the file they were read from.
        expect(field(stalePage, "db")).toMatch(/^sqlite:\d+:\d+:[\da-f-]{36}$/)
        expect(field(freshPage, "db")).toMatch(/^sqlite:\d+:\d+:[\da-f-]{36}$/)
        expect(field(freshPage, "db")).not.toBe(field(stalePage, "db"))
        // The page read from the new file acts on the new file: its message 1 only.
        const confirm = yield* post(url, "/actions/messages/delete", freshPage)
        const done = yield* post(url, "/actions/messages/delete", formsOf(confirm.body)[0]!.fields)
        expect(done.status).toBe(303)
        expect(noticeOf(done.location)).toContain("Deleted message 1.")
        expect(yield* bodies.pipe(Effect.provide(MailboxSql.layerSqlite({ filename: live })))).toEqual([
          ["2", "NEW-two"]
        ])

        // The file deleted: the pages say so instead of showing it, and an action is refused, saying why.
        const last = formFor((yield* get(url, "/message?queue=jobs&id=2")).body, "/actions/messages/delete", "2")
        for (const suffix of ["", "-wal", "-shm"]) {
          rmSync(live + suffix, { force: true })
        }
        const gone = yield* get(url, "/message?queue=jobs&id=2")
        expect(gone.body).toContain("was deleted at")
        expect(gone.body).not.toContain("NEW-two")
        expect((yield* get(url, "/queue?name=jobs")).body).toContain("was deleted at")
        const refused = yield* post(url, "/actions/messages/delete", last.fields)
        expect(refused.status).toBe(409)
        expect(refused.body).toContain("was deleted at")
        expect(refused.body).toContain("Nothing was changed")
      }).pipe(Effect.scoped),
    90_000
  )
})

describe("the PostgreSQL database dropped and created again under a running console", () => {
  it.live(
    "a Delete rendered from the old database deletes nothing and says why; the pages show the new one",
    () =>
      Effect.gen(function*() {
        const admin = yield* Layer.build(MailboxSql.layerPg({ url: pgUrl })).pipe(
          Effect.map(Context.get(SqlClient.SqlClient))
        )
        const name = `swap_${Math.floor(Math.random() * 1e9)}`
        const url_ = new URL(pgUrl)
        url_.pathname = `/${name}`
        const target = url_.toString()
        yield* admin.unsafe(`CREATE DATABASE ${name}`)
        yield* fill(MailboxSql.layerPg({ url: target }), ["OLD-one"])
        const { url } = yield* startConsole(["--db", target])

        const before = yield* get(url, "/message?queue=jobs&id=1")
        expect(before.body).toContain("OLD-one")
        const stalePage = formFor(before.body, "/actions/messages/delete", "1").fields
        const asked = yield* post(url, "/actions/messages/delete", stalePage)
        const staleConfirmation = formsOf(asked.body)[0]!.fields

        yield* admin.unsafe(`DROP DATABASE ${name} WITH (FORCE)`)
        // Meanwhile, a database that cannot say what it is (it is gone) acts on nothing either.
        const gone = yield* post(url, "/actions/messages/delete", staleConfirmation)
        expect(gone.status).toBe(409)
        expect(gone.body).toContain("Nothing was changed")
        yield* admin.unsafe(`CREATE DATABASE ${name}`)
        yield* fill(MailboxSql.layerPg({ url: target }), ["NEW-one", "NEW-two"])

        // The console's connections were cut: a page may fail once while its pool reconnects.
        const after = yield* get(url, "/message?queue=jobs&id=1").pipe(
          Effect.repeat({ until: (page) => page.body.includes("NEW-one"), times: 20 })
        )
        expect(after.body).not.toContain("OLD-one")
        yield* staleRefused(url, stalePage, staleConfirmation)
        expect(yield* bodies.pipe(Effect.provide(MailboxSql.layerPg({ url: target })))).toEqual([
          ["1", "NEW-one"],
          ["2", "NEW-two"]
        ])
        expect(field(stalePage, "db")).toMatch(new RegExp(`^pg:\\d+:${name}:[\\da-f-]{36}$`))
      }).pipe(Effect.scoped),
    90_000
  )
})

const backends = [
  { label: "SQLite", target: () => join(directory, "confirm.db") },
  { label: "PostgreSQL", target: () => pgUrl }
] as const

let prefixes = 0

for (const backend of backends) {
  const layer = () =>
    backend.label === "SQLite"
      ? MailboxSql.layerSqlite({ filename: backend.target() })
      : MailboxSql.layerPg({ url: backend.target() })

  describe(`the console on ${backend.label}: its actions and its message page`, () => {
    it.live(
      "a confirmation is bound to one kind, queue, id and database: each changed alone, a field added, dropped or doubled, a replay: 403",
      () =>
        Effect.gen(function*() {
          const prefix = `bound${++prefixes}_${Math.floor(Math.random() * 1e6)}_`
          const letters = `${prefix}mailbox_dead_letters`
          yield* MailboxSqlAdmin.deadLetters({ prefix })
          const sql = yield* SqlClient.SqlClient
          for (const id of ["1", "2", "3", "4"]) {
            yield* sql`INSERT INTO ${sql(letters)}
              (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
              VALUES (${id}, ${id === "4" ? "other" : "jobs"}, '{}', 1, 0, 0, 'Boom', 'it broke')`
          }
          const { url } = yield* startConsole(["--db", backend.target(), "--prefix", prefix])
          const home = yield* get(url, "/")
          const base = formFor(home.body, "/actions/dead-letters/delete", "2").fields
          /** A new confirmation for deleting dead letter 2: its form's fields. */
          const confirmation = Effect.gen(function*() {
            const asked = yield* post(url, "/actions/dead-letters/delete", base)
            expect(asked.status).toBe(200)
            expect(asked.body).toContain("Delete dead letter 2?")
            return formsOf(asked.body)[0]!.fields
          })
          const without = (fields: Fields, name: string) => fields.filter(([each]) => each !== name)
          const replaced = (fields: Fields, name: string, value: string) =>
            fields.map(([each, old]): readonly [string, string] => [each, each === name ? value : old])
          const left = count(letters)

          const variants: ReadonlyArray<readonly [string, string, (fields: Fields) => Fields]> = [
            ["another id", "/actions/dead-letters/delete", (f) => replaced(f, "id", "3")],
            ["queue=2 instead of id=2", "/actions/dead-letters/delete", (f) => [
              ...without(f, "id"),
              ["queue", "2"]
            ]],
            ["no id (all)", "/actions/dead-letters/delete", (f) => without(f, "id")],
            ["an empty id", "/actions/dead-letters/delete", (f) => replaced(f, "id", "")],
            ["another database", "/actions/dead-letters/delete", (f) => replaced(f, "db", "sqlite:1:1")],
            ["no database", "/actions/dead-letters/delete", (f) => without(f, "db")],
            ["an added queue", "/actions/dead-letters/delete", (f) => [...f, ["queue", "jobs"]]],
            ["an added field", "/actions/dead-letters/delete", (f) => [...f, ["evil", "1"]]],
            ["an added inherited name", "/actions/dead-letters/delete", (f) => [...f, ["constructor", "1"]]],
            ["id twice", "/actions/dead-letters/delete", (f) => [...f, ["id", "3"]]],
            ["confirm twice", "/actions/dead-letters/delete", (f) => [...f, ["confirm", field(f, "confirm")!]]],
            ["another confirmation value", "/actions/dead-letters/delete", (f) => replaced(f, "confirm", "x")],
            ["another kind (redrive)", "/actions/dead-letters/redrive", (f) => f],
            ["another kind (a message)", "/actions/messages/delete", (f) => [...f, ["queue", "jobs"]]],
            ["another kind (drop)", "/actions/queues/drop", (f) => [...without(f, "id"), ["queue", "jobs"]]],
            ["no token", "/actions/dead-letters/delete", (f) => without(f, "token")]
          ]
          for (const [what, action, change] of variants) {
            const refused = yield* post(url, action, change(yield* confirmation))
            expect({ what, status: refused.status }).toEqual({ what, status: 403 })
            expect(refused.body).toMatch(/Refused: /)
            expect({ what, left: yield* left }).toEqual({ what, left: 4 })
          }
          // The confirmation left out: the first step again, which only asks.
          const again = yield* post(url, "/actions/dead-letters/delete", without(yield* confirmation, "confirm"))
          expect(again.status).toBe(200)
          expect(again.body).toContain("Delete dead letter 2?")
          expect(yield* left).toBe(4)
          // A confirmation of "Delete all" does not delete one letter either (nor all, posted with an id).
          const all = formsOf(home.body).find((form) =>
            form.action === "/actions/dead-letters/delete" && field(form.fields, "id") === undefined
          )!.fields
          const allAsked = yield* post(url, "/actions/dead-letters/delete", all)
          expect(allAsked.body).toContain("Delete all 4 dead letters?")
          const allConfirmation = formsOf(allAsked.body)[0]!.fields
          expect((yield* post(url, "/actions/dead-letters/delete", [...allConfirmation, ["id", "2"]])).status).toBe(
            403
          )
          expect(yield* left).toBe(4)

          // The confirmation as issued deletes dead letter 2, and only it; replayed, it is refused.
          const exact = yield* confirmation
          const done = yield* post(url, "/actions/dead-letters/delete", exact)
          expect(done.status).toBe(303)
          expect(noticeOf(done.location)).toContain("Deleted 1 dead letter.")
          const remaining = yield* sql<{ id: string }>`SELECT id FROM ${sql(letters)} ORDER BY id`
          expect(remaining.map((row) =>
            row.id
          )).toEqual(["1", "3", "4"])
          const replay = yield* post(url, "/actions/dead-letters/delete", exact)
          expect(replay.status).toBe(403)
          expect(replay.body).toContain("confirmation was used already")
          expect(yield* left).toBe(3)
        }).pipe(Effect.provide(layer()), Effect.scoped),
      120_000
    )

    it.live(
      "a message's confirmation: another queue or id alone is refused; a stale database identity says why",
      () =>
        Effect.gen(function*() {
          const prefix = `msg${++prefixes}_${Math.floor(Math.random() * 1e6)}_`
          const a = yield* MailboxSql.make({ name: "a", schema: Schema.String, prefix })
          const b = yield* MailboxSql.make({ name: "b", schema: Schema.String, prefix })
          const sent = yield* a.send("in a")
          yield* b.send("in b")
          const { url } = yield* startConsole(["--db", backend.target(), "--prefix", prefix])
          const page = yield* get(url, `/message?queue=a&id=${sent}`)
          const base = formFor(page.body, "/actions/messages/delete", String(sent)).fields
          const messages = count(`${prefix}mailbox_messages`)
          const confirmation = Effect.flatMap(
            post(url, "/actions/messages/delete", base),
            (asked) => Effect.succeed(formsOf(asked.body)[0]!.fields)
          )
          const swap = (fields: Fields, name: string, value: string) =>
            fields.map(([each, old]): readonly [string, string] => [each, each === name ? value : old])
          for (const [name, value] of [["queue", "b"], ["id", String(Number(sent) + 1)], ["db", "pg:0:x"]]) {
            const refused = yield* post(url, "/actions/messages/delete", swap(yield* confirmation, name!, value!))
            expect({ name, status: refused.status }).toEqual({ name, status: 403 })
            expect(yield* messages).toBe(2)
          }
          // The first step posted with a database identity that is not this one's: refused, saying why (409).
          const stale = yield* post(url, "/actions/messages/delete", swap(base, "db", "sqlite:1:1"))
          expect(stale.status).toBe(409)
          expect(stale.body).toContain("another database (sqlite:1:1)")
          expect(yield* messages).toBe(2)
          // A hostile identity is not echoed raw, nor whole; a body over 16 KiB is not read.
          const hostile = yield* post(url, "/actions/messages/delete", swap(base, "db", `<script>${"x".repeat(9000)}`))
          expect(hostile.status).toBe(409)
          expect(hostile.body).not.toContain("<script>")
          expect(hostile.body.length).toBeLessThan(2000)
          // (The server stops reading it: a 403, or the connection closed before the client finished sending.)
          const huge = yield* Effect.either(Effect.tryPromise(() =>
            fetch(new URL("/actions/messages/delete", url), {
              method: "POST",
              redirect: "manual",
              headers: { "content-type": "application/x-www-form-urlencoded" },
              body: new URLSearchParams(swap(base, "db", "x".repeat(20_000)).map(([n, v]): [string, string] => [n, v]))
                .toString()
            })
          ))
          if (huge._tag === "Right") expect(huge.right.status).toBe(403)
          expect(yield* messages).toBe(2)
          // One confirmation posted twice at once: one deletes, the other is refused.
          const value = yield* confirmation
          const raced = yield* Effect.all([
            post(url, "/actions/messages/delete", value),
            post(url, "/actions/messages/delete", value)
          ], { concurrency: 2 })
          expect(raced.map((answer) => answer.status).sort()).toEqual([303, 403])
          expect(yield* messages).toBe(1)
        }).pipe(Effect.provide(layer()), Effect.scoped),
      120_000
    )

    it.live(
      "the message page shows 200 steps of a longer journal, a long entry cut as read (its whole length named)",
      () =>
        Effect.gen(function*() {
          const prefix = `page${++prefixes}_${Math.floor(Math.random() * 1e6)}_`
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, prefix })
          const id = yield* jobs.send("with a journal")
          yield* MailboxSqlAdmin.journals({ prefix })
          const sql = yield* SqlClient.SqlClient
          // A stored entry is another party's text: its kind, read from the cut start, is shown escaped.
          const big = JSON.stringify({ _tag: "<b>Turn</b>", text: "x".repeat(1_000_000) })
          const rows = Array.from({ length: 260 }, (_, i) => ({
            message_seq: Number(id),
            position: i + 1,
            step_key: String(i + 1),
            queue: "jobs",
            request_id: "r-1",
            entry: i === 1 ? big : JSON.stringify({ _tag: "Tool", ok: true }),
            recorded_at: 0
          }))
          yield* sql`INSERT INTO ${sql(`${prefix}mailbox_journal`)} ${sql.insert(rows)}`
          const { url } = yield* startConsole(["--db", backend.target(), "--prefix", prefix])
          const page = yield* get(url, `/message?queue=jobs&id=${id}`)
          expect(page.status).toBe(200)
          expect(page.body).toContain("200+ steps")
          expect([...page.body.matchAll(/<tr class="entry">/g)]).toHaveLength(200)
          // The long entry: its start as stored, and how long it is whole (it was not read whole).
          expect(page.body).toContain(`(the first 131072 characters of ${big.length}, as stored)`)
          expect(page.body).toContain(`&lt;b&gt;Turn&lt;/b&gt; (${big.length} characters)`)
          expect(page.body).not.toContain("<b>Turn</b>")
          expect(page.body.length).toBeLessThan(400_000)
        }).pipe(Effect.provide(layer()), Effect.scoped),
      120_000
    )

    it.effect(
      "the journal's read takes a bound: only the steps and characters asked for are read; a bad bound is refused",
      () =>
        Effect.gen(function*() {
          const prefix = `journal${++prefixes}_${Math.floor(Math.random() * 1e6)}_`
          const journals = yield* MailboxSqlAdmin.journals({ prefix })
          const sql = yield* SqlClient.SqlClient
          const big = JSON.stringify({ _tag: "Turn", text: "€".repeat(300_000) })
          for (let position = 1; position <= 5; position++) {
            yield* sql`INSERT INTO ${sql(`${prefix}mailbox_journal`)}
              (message_seq, position, step_key, queue, request_id, entry, recorded_at)
              VALUES (77, ${position}, ${String(position)}, 'jobs', 'r-1',
                ${position === 2 ? big : JSON.stringify({ _tag: "Tool", ok: true })}, 0)`
          }
          const whole = Option.getOrThrow(yield* journals.read("77"))
          expect(whole.steps).toHaveLength(5)
          expect(whole.truncated).toBe(false)
          const bounded = Option.getOrThrow(yield* journals.read("77", { steps: 2, entryChars: 40 }))
          expect(bounded.steps.map((step) => step.position)).toEqual([1, 2])
          expect(bounded.truncated).toBe(true)
          expect(bounded.steps[0]!.entry).toEqual({ _tag: "Tool", ok: true })
          expect(bounded.steps[0]!.entryLength).toBeUndefined()
          expect(bounded.steps[1]!.entry).toBe(big.slice(0, 40))
          expect(bounded.steps[1]!.entryLength).toBe(big.length)
          for (const bad of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 1e9]) {
            const steps = yield* Effect.flip(journals.read("77", { steps: bad }))
            expect(steps._tag).toBe("InvalidParameterError")
            const chars = yield* Effect.flip(journals.read("77", { entryChars: bad }))
            expect(chars._tag).toBe("InvalidParameterError")
          }
        }).pipe(Effect.provide(layer())),
      60_000
    )
  })
}
