/**
 * Hostile tests of the console (attacker atk1): database identity under file replacement, confirmations, search.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Schema, Scope } from "effect"
import { copyFileSync, existsSync, mkdtempSync, renameSync, rmSync, symlinkSync, truncateSync } from "node:fs"
import { request } from "node:http"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import { startConsole } from "./support/console.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-attack-console-"))
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
  expect(form, `a form for ${action} ${id} in: ${html.slice(0, 3000)}`).toBeDefined()
  return form!.fields
}
const get = (url: string, path: string) =>
  Effect.promise(async () => {
    const response = await fetch(new URL(path, url))
    return { status: response.status, body: await response.text() }
  })
const encode = (fields: Fields) =>
  new URLSearchParams(fields.map(([name, value]): [string, string] => [name, value])).toString()
const postRaw = (
  url: string,
  action: string,
  body: string | Buffer,
  contentType = "application/x-www-form-urlencoded"
) =>
  Effect.promise(async () => {
    const response = await fetch(new URL(action, url), {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": contentType },
      body
    })
    return { status: response.status, body: await response.text(), location: response.headers.get("location") }
  })
const post = (url: string, action: string, fields: Fields) => postRaw(url, action, encode(fields))
const field = (fields: Fields, name: string) => fields.find(([each]) => each === name)?.[1]
const replaced = (fields: Fields, name: string, value: string) =>
  fields.map(([each, old]): readonly [string, string] => [each, each === name ? value : old])

const bodies = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ seq: number | string; body: string }>`SELECT seq, body FROM leasehold_mailbox_messages ORDER BY seq`,
    (rows) => rows.map((row) => [String(row.seq), JSON.parse(row.body) as string])
  ))
const fill = (layer: Layer.Layer<MailboxSql.Services, unknown>, texts: ReadonlyArray<string>, name = "jobs") =>
  Effect.gen(function*() {
    const mailbox = yield* MailboxSql.make({ name, schema: Schema.String })
    for (const text of texts) yield* mailbox.send(text)
  }).pipe(Effect.scoped, Effect.provide(layer))
const sqliteBodies = (filename: string) => bodies.pipe(Effect.provide(MailboxSql.layerSqlite({ filename })))

/** A stale page's Delete form for message 1 and a confirmation issued for it. */
const staleDelete = (url: string) =>
  Effect.gen(function*() {
    const before = yield* get(url, "/message?queue=jobs&id=1")
    expect(before.body).toContain("OLD-one")
    const page = formFor(before.body, "/actions/messages/delete", "1")
    const asked = yield* post(url, "/actions/messages/delete", page)
    expect(asked.body).toContain("Delete message 1 of jobs?")
    return { page, confirmation: formsOf(asked.body)[0]!.fields }
  })

let files = 0
const fresh = () => {
  const n = ++files
  return { live: join(directory, `live${n}.db`), other: join(directory, `other${n}.db`) }
}

describe("attack: SQLite file replaced under the console in other ways", () => {
  it.live(
    "cp over it in place (same inode): a stale Delete of OLD message 1 must not delete NEW message 1",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        const { url, stop } = yield* startConsole(["--db", live])
        const { confirmation } = yield* staleDelete(url)
        copyFileSync(other, live) // in place: O_TRUNC + write, the inode stays
        const after = yield* get(url, "/queue?name=jobs")
        const shown = after.body.includes("NEW-one") ? "new" : after.body.includes("OLD-one") ? "old" : "none"
        const done = yield* post(url, "/actions/messages/delete", confirmation)
        yield* stop
        const rows = yield* sqliteBodies(live)
        // The stale confirmation was for "OLD-one": the new file's message 1 is another message.
        expect({ shown, status: done.status, rows }).toEqual({
          shown: "new",
          status: 409,
          rows: [["1", "NEW-one"], ["2", "NEW-two"]]
        })
      }).pipe(Effect.scoped),
    90_000
  )

  it.live(
    "cp over it in place, no action taken (control): the new file's rows survive the console",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        const { url, stop } = yield* startConsole(["--db", live])
        yield* staleDelete(url)
        copyFileSync(other, live)
        const after = yield* get(url, "/queue?name=jobs")
        yield* stop
        console.log(
          "CP CONTROL shows",
          after.body.includes("NEW-one") ? "new" : after.body.includes("OLD-one") ? "old" : "none"
        )
        expect(yield* sqliteBodies(live)).toEqual([["1", "NEW-one"], ["2", "NEW-two"]])
      }).pipe(Effect.scoped),
    90_000
  )

  it.live("truncated to 0 bytes in place (same inode): a stale Delete is refused", () =>
    Effect.gen(function*() {
      const { live } = fresh()
      yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
      const { url, stop } = yield* startConsole(["--db", live])
      const { confirmation } = yield* staleDelete(url)
      truncateSync(live, 0) // an emptied file: another database (an empty one), same inode
      const shown = yield* get(url, "/queue?name=jobs")
      const done = yield* post(url, "/actions/messages/delete", confirmation)
      yield* stop
      expect({ oldShown: shown.body.includes("OLD-one"), status: done.status }).toEqual({
        oldShown: false,
        status: 409
      })
    }).pipe(Effect.scoped), 90_000)

  it.live(
    "--db is a symlink; its target renamed over while the target's -wal stays: the new file is not read through it",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        const target = `${live}.target`
        yield* fill(MailboxSql.layerSqlite({ filename: target }), ["OLD-one"])
        symlinkSync(target, live)
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        const { url, stop } = yield* startConsole(["--db", live])
        const { page, confirmation } = yield* staleDelete(url)
        // A writer writes while the console holds the file: the target's -wal keeps the frames.
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-two", "OLD-three"])
        const walBefore = existsSync(`${target}-wal`)
        renameSync(other, target) // the operator replaces the file the link names
        const shown = yield* get(url, "/queue?name=jobs")
        console.log(
          "SYMLINK PAGE",
          shown.body.replace(/<style>.*?<\/style>/s, "").replace(/<[^>]+>/g, " ").replace(/\s+/g, " ").slice(0, 1500)
        )
        const status = [
          (yield* post(url, "/actions/messages/delete", page)).status,
          (yield* post(url, "/actions/messages/delete", confirmation)).status
        ]
        yield* stop
        expect(walBefore).toBe(true)
        expect({
          oldShown: shown.body.includes("OLD-"),
          warned: shown.body.includes("still the old file"),
          status
        }).toEqual({ oldShown: false, warned: true, status: [409, 409] })
      }).pipe(Effect.scoped),
    90_000
  )

  it.live(
    "--db is a symlink; its target renamed over: a Delete from a page read after the replacement must not write into the old log",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        const target = `${live}.target`
        yield* fill(MailboxSql.layerSqlite({ filename: target }), ["OLD-one"])
        symlinkSync(target, live)
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        const { url, stop } = yield* startConsole(["--db", live])
        yield* get(url, "/queue?name=jobs")
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-two", "OLD-three"])
        renameSync(other, target)
        // A page read now, after the replacement: it carries the new file's identity.
        const page = yield* get(url, "/message?queue=jobs&id=2")
        const form = formsOf(page.body).find((f) =>
          f.action === "/actions/messages/delete" && field(f.fields, "id") === "2"
        )
        let status = 0
        if (form !== undefined) {
          const asked = yield* post(url, "/actions/messages/delete", form.fields)
          const done = yield* post(url, "/actions/messages/delete", formsOf(asked.body)[0]!.fields)
          status = done.status
        }
        yield* stop
        // The old file's log moved away, as the page should have told the operator: the new file as it is now.
        for (const suffix of ["-wal", "-shm"]) {
          if (existsSync(target + suffix)) renameSync(target + suffix, `${target}.old${suffix}`)
        }
        const rows = yield* sqliteBodies(target)
        console.log("SYMLINK FRESH", JSON.stringify({ shownOld: page.body.includes("OLD-two"), status, rows }))
        expect({ status, rows }).toEqual({ status: 0, rows: [["1", "NEW-one"], ["2", "NEW-two"]] })
      }).pipe(Effect.scoped),
    90_000
  )

  for (const form of ["file", "sqlite", "relative", "dotdot"] as const) {
    it.live(
      `--db in the ${form} form; a file renamed over while its -wal stays: not read, actions refused`,
      () =>
        Effect.gen(function*() {
          const { live, other } = fresh()
          yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
          yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
          const db = form === "file"
            ? `file://${live}`
            : form === "sqlite"
            ? `sqlite:${live}`
            : form === "relative"
            ? relative(process.cwd(), live)
            : live.replace(/\/([^/]+)$/, "/../" + live.split("/").at(-2) + "/$1")
          const { url, stop } = yield* startConsole(["--db", db])
          const { page } = yield* staleDelete(url)
          yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-two", "OLD-three"])
          renameSync(other, live)
          const shown = yield* get(url, "/queue?name=jobs")
          const fresh2 = yield* get(url, "/message?queue=jobs&id=2")
          const stale = (yield* post(url, "/actions/messages/delete", page)).status
          yield* stop
          expect({
            db,
            oldShown: shown.body.includes("OLD-") || fresh2.body.includes("OLD-"),
            warned: shown.body.includes("still the old file"),
            stale
          })
            .toEqual({ db, oldShown: false, warned: true, stale: 409 })
        }).pipe(Effect.scoped),
      90_000
    )
  }

  it.live(
    "a symlink swapped to another file: pages show the new target and a stale Delete is refused",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        const a = `${live}.a`
        yield* fill(MailboxSql.layerSqlite({ filename: a }), ["OLD-one"])
        yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one", "NEW-two"])
        symlinkSync(a, live)
        const { url, stop } = yield* startConsole(["--db", live])
        const { page, confirmation } = yield* staleDelete(url)
        symlinkSync(other, `${live}.tmp`)
        renameSync(`${live}.tmp`, live)
        const shown = yield* get(url, "/queue?name=jobs")
        const status = [
          (yield* post(url, "/actions/messages/delete", page)).status,
          (yield* post(url, "/actions/messages/delete", confirmation)).status
        ]
        yield* stop
        expect({ newShown: shown.body.includes("NEW-one"), oldShown: shown.body.includes("OLD-one"), status }).toEqual({
          newShown: true,
          oldShown: false,
          status: [409, 409]
        })
        expect(yield* sqliteBodies(other)).toEqual([["1", "NEW-one"], ["2", "NEW-two"]])
      }).pipe(Effect.scoped),
    90_000
  )

  it.live(
    "deleted with its -wal/-shm and recreated: a stale Delete is refused, the new file is shown",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
        const { url, stop } = yield* startConsole(["--db", live])
        const { page, confirmation } = yield* staleDelete(url)
        for (const suffix of ["", "-wal", "-shm"]) rmSync(live + suffix, { force: true })
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["NEW-one", "NEW-two"])
        const shown = yield* get(url, "/queue?name=jobs")
        const status = [
          (yield* post(url, "/actions/messages/delete", page)).status,
          (yield* post(url, "/actions/messages/delete", confirmation)).status
        ]
        yield* stop
        expect({ newShown: shown.body.includes("NEW-one"), status }).toEqual({ newShown: true, status: [409, 409] })
        expect(yield* sqliteBodies(live)).toEqual([["1", "NEW-one"], ["2", "NEW-two"]])
      }).pipe(Effect.scoped),
    90_000
  )

  it.live(
    "the messages table emptied and its sequence reset in the same file: a stale Delete must not delete the new message 1",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
        const { url, stop } = yield* startConsole(["--db", live])
        const { confirmation } = yield* staleDelete(url)
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          yield* sql`DELETE FROM leasehold_mailbox_messages`
          yield* sql`DELETE FROM sqlite_sequence WHERE name = 'leasehold_mailbox_messages'`.pipe(Effect.ignore)
        }).pipe(Effect.provide(MailboxSql.layerSqlite({ filename: live })))
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["NEW-one", "NEW-two"])
        const before = yield* sqliteBodies(live)
        const done = yield* post(url, "/actions/messages/delete", confirmation)
        yield* stop
        expect(before[0]).toEqual(["1", "NEW-one"])
        expect({ status: done.status, rows: yield* sqliteBodies(live) }).toEqual({
          status: 409,
          rows: [["1", "NEW-one"], ["2", "NEW-two"]]
        })
      }).pipe(Effect.scoped),
    90_000
  )

  it.live(
    "a replacement raced with the confirmed Delete (6 rounds): never deletes from the new file",
    () =>
      Effect.gen(function*() {
        const { live, other } = fresh()
        let wrong = 0
        for (let round = 0; round < 6; round++) {
          rmSync(live, { force: true })
          rmSync(other, { force: true })
          yield* fill(MailboxSql.layerSqlite({ filename: live }), ["OLD-one"])
          yield* fill(MailboxSql.layerSqlite({ filename: other }), ["NEW-one"])
          const { url, stop } = yield* startConsole(["--db", live])
          const { confirmation } = yield* staleDelete(url)
          yield* Effect.all([
            post(url, "/actions/messages/delete", confirmation),
            Effect.sync(() => {
              renameSync(other, live)
              for (const suffix of ["-wal", "-shm"]) rmSync(live + suffix, { force: true })
            })
          ], { concurrency: 2 })
          yield* stop
          const rows = yield* sqliteBodies(live)
          if (rows.length !== 1) wrong++
        }
        expect(wrong).toBe(0)
      }).pipe(Effect.scoped),
    180_000
  )
})

describe("attack: PostgreSQL tables dropped and created again (same database oid)", () => {
  it.live("a stale Delete of OLD message 1 must not delete NEW message 1", () =>
    Effect.gen(function*() {
      const admin = yield* Layer.build(MailboxSql.layerPg({ url: pgUrl })).pipe(
        Effect.map(Context.get(SqlClient.SqlClient))
      )
      const name = `tables_${Math.floor(Math.random() * 1e9)}`
      const u = new URL(pgUrl)
      u.pathname = `/${name}`
      const target = u.toString()
      yield* admin.unsafe(`CREATE DATABASE ${name}`)
      yield* fill(MailboxSql.layerPg({ url: target }), ["OLD-one"])
      const { url, stop } = yield* startConsole(["--db", target])
      const { confirmation } = yield* staleDelete(url)
      yield* Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const tables = yield* sql<
          { tablename: string }
        >`SELECT tablename FROM pg_tables WHERE tablename LIKE 'leasehold_%'`
        for (const t of tables) yield* sql.unsafe(`DROP TABLE IF EXISTS "${t.tablename}" CASCADE`)
        yield* sql.unsafe(`DROP FUNCTION IF EXISTS leasehold_mailbox_claim CASCADE`).pipe(Effect.ignore)
      }).pipe(Effect.provide(MailboxSql.layerPg({ url: target })))
      yield* fill(MailboxSql.layerPg({ url: target }), ["NEW-one", "NEW-two"])
      const before = yield* bodies.pipe(Effect.provide(MailboxSql.layerPg({ url: target })))
      const done = yield* post(url, "/actions/messages/delete", confirmation)
      yield* stop
      const rows = yield* bodies.pipe(Effect.provide(MailboxSql.layerPg({ url: target })))
      expect(before[0]).toEqual(["1", "NEW-one"])
      expect({ status: done.status, rows }).toEqual({ status: 409, rows: [["1", "NEW-one"], ["2", "NEW-two"]] })
    }).pipe(Effect.scoped), 120_000)
})

describe("attack: damaged rows on the console", () => {
  it.live(
    "a worker row, a message and a dead letter with times beyond Date's range: pages still answer 200 with the good rows",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        const layer = MailboxSql.layerSqlite({ filename: live })
        yield* fill(layer, ["good", "bad"])
        const admin = yield* Effect.promise(() => import("../src/MailboxSqlAdmin.js"))
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          yield* admin.workers({})
          yield* admin.deadLetters({})
          yield* sql`INSERT INTO leasehold_mailbox_worker_instances
          (instance, process, name, started_at, version, loops, refreshed_at)
          VALUES ('0123456789abcdef', 'good:1', 'goodworker', 0, 'v', '[]', 0),
                 ('bad', 'bad:1', 'badworker', ${"9000000000000000000"}, 'v', '[]', 0)`
          yield* sql`UPDATE leasehold_mailbox_messages SET enqueued_at = ${"9000000000000000000"} WHERE seq = 2`
          yield* sql`INSERT INTO leasehold_mailbox_dead_letters
          (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
          VALUES ('1001', 'jobs', '"x"', 1, 0, 0, 'Boom', 'x'), ('1002', 'jobs', '"y"', 1, ${"9000000000000000000"}, ${"9000000000000000000"}, 'Boom', 'y')`
        }).pipe(Effect.provide(layer))
        const { url, stop } = yield* startConsole(["--db", live])
        const pages: Record<string, string> = {}
        for (
          const path of [
            "/",
            "/queue?name=jobs",
            "/queue?name=jobs&state=dead",
            "/message?queue=jobs&id=2",
            "/dead-letter?queue=jobs&id=1002",
            "/message?queue=jobs&id=1"
          ]
        ) {
          const page = yield* get(url, path)
          const text = page.body.replace(/<style>.*?<\/style>/s, "").replace(/<[^>]+>/g, " ").replace(/\s+/g, " ")
          pages[path] = `${page.status} ${
            /Could not read[^.]*\.[^.]*/.exec(text)?.[0] ?? (text.includes("goodworker") ? "goodworker shown" : "")
          }`
        }
        yield* stop
        console.log("DAMAGED CONSOLE", JSON.stringify(pages))
        expect(Object.values(pages).every((p) => p.startsWith("200") && !p.includes("Could not read"))).toBe(true)
      }).pipe(Effect.scoped),
    90_000
  )
})

describe("attack: the console's own terminal output", () => {
  it.live(
    "hostile Host, path, Origin, fields and a hostile file name never reach the console's stdout/stderr raw",
    () =>
      Effect.gen(function*() {
        const hostileName = join(directory, "evil\u001b]0;owned\u0007\u009b2J\u202e.db")
        yield* fill(MailboxSql.layerSqlite({ filename: hostileName }), ["x"])
        const { spawn } = yield* Effect.promise(() => import("node:child_process"))
        const { commandLine } = yield* Effect.promise(() => import("./helpers.js"))
        const child = spawn("node", [commandLine(), "--log-level", "all", "console", "--db", hostileName], {
          env: { ...process.env, NO_COLOR: "1", LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "" },
          stdio: ["ignore", "pipe", "pipe"]
        })
        let output = ""
        child.stdout.on("data", (c: Buffer) => (output += c.toString()))
        child.stderr.on("data", (c: Buffer) => (output += c.toString()))
        yield* Effect.addFinalizer(() => Effect.sync(() => child.kill("SIGKILL")))
        const url = yield* Effect.promise(async () => {
          for (let i = 0; i < 200; i++) {
            const found = /http:\/\/\S+\//.exec(output)?.[0]
            if (found !== undefined) return found
            await new Promise((r) => setTimeout(r, 50))
          }
          return `no url: ${output}`
        })
        expect(url).toMatch(/^http:/)
        const port = new URL(url).port
        const evil = "\u001b]0;owned\u0007\u001b[2J"
        const rawRequest = (text: string) =>
          Effect.promise(() =>
            new Promise<void>((resolve) => {
              import("node:net").then(({ connect }) => {
                const socket = connect(Number(port), "127.0.0.1", () => socket.end(text))
                socket.on("data", () => {})
                socket.on("close", () => resolve())
                socket.on("error", () => resolve())
                setTimeout(() => {
                  socket.destroy()
                  resolve()
                }, 2000)
              })
            })
          )
        yield* rawRequest(`GET / HTTP/1.1\r\nHost: ${evil}\r\n\r\n`)
        yield* rawRequest(`GET /${evil} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`)
        yield* rawRequest(
          `POST /actions/messages/delete HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nOrigin: ${evil}\r\nContent-Length: 3\r\n\r\nx=1`
        )
        yield* rawRequest(
          `GET /queue?name=${encodeURIComponent(evil)}&text=${
            encodeURIComponent(evil)
          } HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`
        )
        yield* get(url, `/message?queue=${encodeURIComponent(evil)}&id=${encodeURIComponent(evil)}`)
        yield* post(url, "/actions/messages/delete", [["token", evil], ["id", evil], ["db", evil]])
        rmSync(hostileName, { force: true })
        yield* get(url, "/")
        yield* Effect.sleep("2500 millis")
        child.kill("SIGTERM")
        yield* Effect.sleep("1 second")
        const found = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e]/.exec(output)
        expect(
          found === null ? null : `U+${found[0].charCodeAt(0).toString(16)} in: ${JSON.stringify(output.slice(0, 800))}`
        ).toBeNull()
      }).pipe(Effect.scoped),
    60_000
  )
})

describe("attack: hostile ids and cursors in browse and message URLs", () => {
  for (const backend of ["SQLite", "PostgreSQL"] as const) {
    it.live(
      `${backend}: out-of-range, negative, exponent and junk ids/cursors answer without a 500`,
      () =>
        Effect.gen(function*() {
          const { live } = fresh()
          let target = live
          if (backend === "PostgreSQL") {
            const admin = yield* Layer.build(MailboxSql.layerPg({ url: pgUrl })).pipe(
              Effect.map(Context.get(SqlClient.SqlClient))
            )
            const name = `ids_${Math.floor(Math.random() * 1e9)}`
            yield* admin.unsafe(`CREATE DATABASE ${name}`)
            const u = new URL(pgUrl)
            u.pathname = `/${name}`
            target = u.toString()
          }
          const layer = backend === "SQLite"
            ? MailboxSql.layerSqlite({ filename: live })
            : MailboxSql.layerPg({ url: target })
          yield* fill(layer, ["one", "two"])
          const { url, stop } = yield* startConsole(["--db", target])
          const weird = [
            "99999999999999999999",
            "9223372036854775808",
            "-1",
            "1e3",
            "0x10",
            "1.5",
            " 1",
            "%00",
            "\u0000",
            "NaN",
            "x".repeat(5000)
          ]
          const statuses: Record<string, number> = {}
          for (const w of weird) {
            const q = encodeURIComponent(w)
            for (
              const path of [
                `/message?queue=jobs&id=${q}`,
                `/dead-letter?queue=jobs&id=${q}`,
                `/queue?name=jobs&id=${q}`,
                `/queue?name=jobs&after=${q}`,
                `/queue?name=jobs&state=dead&after=${q}`,
                `/queue?name=jobs&order=newest&after=${q}`
              ]
            ) {
              const page = yield* get(url, path)
              if (page.status >= 500 || page.body.includes("Could not read")) {
                statuses[`${path.slice(0, 60)}`] = page.status
              }
            }
          }
          yield* stop
          expect(statuses).toEqual({})
        }).pipe(Effect.scoped),
      120_000
    )
  }
})

describe("attack: hostile worker rows on the console", () => {
  it.live(
    "a hostile instance, process and name (HTML, quotes, controls, 100 KB) are shown as text; a legacy row with the same host:pid too",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        const layer = MailboxSql.layerSqlite({ filename: live })
        yield* fill(layer, ["x"])
        const evil = `"'><script>alert(1)</script><img src=x onerror=alert(2)>\u001b\u202e`
        const admin = yield* Effect.promise(() => import("../src/MailboxSqlAdmin.js"))
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          yield* admin.workers({})
          const loops = JSON.stringify([{ name: evil, queue: evil, state: evil, messageId: evil, beatAgeMillis: 5 }])
          const now = Date.now()
          yield* sql`INSERT INTO leasehold_mailbox_worker_instances
          (instance, process, name, started_at, version, loops, refreshed_at)
          VALUES (${evil}, ${evil}, ${evil}, 0, ${evil}, ${loops}, ${now}),
                 (${"i".repeat(100_000)}, 'big:1', ${"n".repeat(100_000)}, 0, 'v', '[]', ${now})`
          yield* sql`INSERT INTO leasehold_mailbox_workers (process, name, started_at, version, loops, refreshed_at)
          VALUES (${evil}, 'legacy', 0, 'old', ${loops}, ${now})`
        }).pipe(Effect.provide(layer))
        const { url, stop } = yield* startConsole(["--db", live])
        const home = yield* get(url, "/")
        yield* stop
        expect(home.status).toBe(200)
        expect(home.body).not.toContain("<script>alert")
        expect(home.body).not.toContain("<img src=x")
        expect(home.body).not.toMatch(/id="worker-"'>/)
        expect(home.body.length).toBeLessThan(200_000)
      }).pipe(Effect.scoped),
    90_000
  )
})

describe("attack: confirmations", () => {
  it.live(
    "encoded, odd and non-UTF-8 fields, other content types, GET, another console's confirmation: nothing deleted",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["one", "two", "three"])
        const { url, stop } = yield* startConsole(["--db", live])
        const second = yield* startConsole(["--db", live])
        const results: Array<[string, number, boolean]> = []
        const mailbox = (text: string) => fill(MailboxSql.layerSqlite({ filename: live }), [text])
        let next = 3
        /** A fresh message, its page's Delete form, and its confirmation. */
        const issue = Effect.gen(function*() {
          yield* mailbox(`m${++next}`)
          const id = String(next)
          const page = formFor((yield* get(url, `/message?queue=jobs&id=${id}`)).body, "/actions/messages/delete", id)
          const asked = yield* post(url, "/actions/messages/delete", page)
          return { id, confirmation: formsOf(asked.body)[0]!.fields }
        })
        const attempt = (what: string, body: (f: Fields) => string | Buffer, type?: string, target = url) =>
          Effect.gen(function*() {
            const { confirmation, id } = yield* issue
            const answer = yield* postRaw(target, "/actions/messages/delete", body(confirmation), type)
            const rows = yield* sqliteBodies(live)
            results.push([what, answer.status, !rows.some(([seq]) => seq === id)])
          })
        const swapEnc = (fields: Fields, name: string, raw: string) =>
          fields.map(([n, v]) =>
            n === name ? `${encodeURIComponent(n)}=${raw}` : `${encodeURIComponent(n)}=${encodeURIComponent(v)}`
          ).join("&")
        const variants: ReadonlyArray<[string, (f: Fields) => string | Buffer, string?]> = [
          ["exact (control)", (f) => encode(f)],
          ["id=02", (f) => encode(replaced(f, "id", "0" + field(f, "id")))],
          ["id with a space", (f) => encode(replaced(f, "id", field(f, "id") + " "))],
          ["id=+N", (f) => encode(replaced(f, "id", "+" + field(f, "id")))],
          ["id NUL", (f) => swapEnc(f, "id", field(f, "id") + "%00")],
          ["id %FF", (f) => swapEnc(f, "id", field(f, "id") + "%FF")],
          ["queue jobs%C3", (f) => swapEnc(f, "queue", "jobs%C3")],
          ["queue JOBS", (f) => encode(replaced(f, "queue", "JOBS"))],
          ["queue zero-width", (f) => encode(replaced(f, "queue", "jobs\u200b"))],
          ["ID upper-case name", (f) => encode(f).replace(/(^|&)id=/, "$1ID=")],
          ["empty name added", (f) => encode(f) + "&=x"],
          ["bare name added", (f) => encode(f) + "&x"],
          ["trailing &&", (f) => encode(f) + "&&"],
          ["semicolons", (f) => encode(f).replaceAll("&", ";")],
          ["__proto__ added", (f) => encode(f) + "&__proto__=1"],
          ["x=abc added", (f) => encode(f) + "&x=abc"],
          ["x=%FF added", (f) => encode(f) + "&x=%FF"],
          ["x=<raw ff fe> added", (f) => Buffer.concat([Buffer.from(encode(f) + "&x="), Buffer.from([0xff, 0xfe])])],
          ["raw ff byte as a field name", (f) =>
            Buffer.concat([Buffer.from(encode(f) + "&"), Buffer.from([0xff]), Buffer.from("=1")])],
          ["id=<raw ff> twice", (f) =>
            Buffer.concat([Buffer.from(encode(f) + "&id="), Buffer.from([0xff])])],
          ["text/plain", (f) => encode(f), "text/plain"],
          ["multipart", (f) => encode(f), "multipart/form-data; boundary=x"],
          ["json", (f) => encode(f), "application/json"],
          ["form; charset=utf-16", (f) => encode(f), "application/x-www-form-urlencoded; charset=utf-16"]
        ]
        for (const [what, make, type] of variants) yield* attempt(what, make, type)
        yield* attempt("another console", (f) => encode(f), undefined, second.url)
        const { confirmation } = yield* issue
        const getting = yield* get(url, `/actions/messages/delete?${encode(confirmation)}`)
        results.push(["GET", getting.status, false])
        console.log("CONFIRMATION VARIANTS", JSON.stringify(results))
        yield* stop
        yield* second.stop
        // Only the exact confirmation (and harmless empty pairs) deletes.
        expect(results.filter(([, , deleted]) => deleted).map(([what]) => what)).toEqual([
          "exact (control)",
          "trailing &&",
          // Lenient but harmless: the body is read as a form whatever its type says (token, Origin and the
          // confirmation still checked).
          "text/plain",
          "multipart",
          "json",
          "form; charset=utf-16"
        ])
      }).pipe(Effect.scoped),
    120_000
  )

  it.live(
    "a confirmation of Delete all of a queue's dead letters is not one of all queues' (or the reverse)",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        const layer = MailboxSql.layerSqlite({ filename: live })
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          yield* fill(layer, ["x"], "jobs")
          const { deadLetters } = yield* Effect.promise(() => import("../src/MailboxSqlAdmin.js"))
          yield* deadLetters({})
          for (const [id, q] of [["1", "jobs"], ["2", "other"]]) {
            yield* sql`INSERT INTO leasehold_mailbox_dead_letters
            (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
            VALUES (${id}, ${q}, '{}', 1, 0, 0, 'Boom', 'it broke')`
          }
        }).pipe(Effect.provide(layer))
        const { url, stop } = yield* startConsole(["--db", live])
        const home = (yield* get(url, "/")).body
        const deletes = formsOf(home).filter((f) =>
          f.action === "/actions/dead-letters/delete" && field(f.fields, "id") === undefined
        )
        const count = Effect.flatMap(SqlClient.SqlClient, (sql) =>
          Effect.map(
            sql<{ n: number }>`SELECT count(*) AS n FROM leasehold_mailbox_dead_letters`,
            (r) => Number(r[0]!.n)
          )).pipe(Effect.provide(layer))
        const statuses: Array<number> = []
        for (const form of deletes) {
          const asked = yield* post(url, "/actions/dead-letters/delete", form.fields)
          const conf = formsOf(asked.body)[0]!.fields
          const q = field(conf, "queue")
          const tampered = q === undefined ? [...conf, ["queue", "jobs"] as const] : conf.filter(([n]) => n !== "queue")
          statuses.push((yield* post(url, "/actions/dead-letters/delete", tampered)).status)
          expect(yield* count).toBe(2)
        }
        yield* stop
        expect(statuses.every((s) => s === 403)).toBe(true)
      }).pipe(Effect.scoped),
    90_000
  )
})

describe("attack: search folding and literal wildcards", () => {
  for (const backend of ["SQLite", "PostgreSQL"] as const) {
    it.live(`${backend}: é finds CAFÉ, wildcards are literal, a huge search is bounded`, () =>
      Effect.gen(function*() {
        const { live } = fresh()
        let target = live
        if (backend === "PostgreSQL") {
          const admin = yield* Layer.build(MailboxSql.layerPg({ url: pgUrl })).pipe(
            Effect.map(Context.get(SqlClient.SqlClient))
          )
          const name = `search_${Math.floor(Math.random() * 1e9)}`
          yield* admin.unsafe(`CREATE DATABASE ${name} TEMPLATE template0 ENCODING 'UTF8'`)
          const u = new URL(pgUrl)
          u.pathname = `/${name}`
          target = u.toString()
        }
        const layer = backend === "SQLite"
          ? MailboxSql.layerSqlite({ filename: live })
          : MailboxSql.layerPg({ url: target })
        const texts = [
          "CAFÉ au lait",
          "МОСКВА",
          "100% done",
          "a_b",
          "axb",
          "back\\slash",
          "plain",
          "İstanbul",
          "ǅ digraph"
        ]
        yield* fill(layer, texts)
        const { url, stop } = yield* startConsole(["--db", target])
        const search = (text: string) =>
          Effect.map(get(url, `/queue?name=jobs&text=${encodeURIComponent(text)}`), (page) => ({
            status: page.status,
            found: texts.filter((t) => page.body.includes(t.replaceAll("\\", "\\\\")) || page.body.includes(t))
          }))
        const home = yield* get(url, "/queue?name=jobs")
        const textField = /name="(text|q|search)"/.exec(home.body)?.[1] ?? "text"
        const s = (text: string) =>
          Effect.map(get(url, `/queue?name=jobs&${textField}=${encodeURIComponent(text)}`), (page) => ({
            status: page.status,
            found: texts.filter((t) => page.body.includes(t) || page.body.includes(t.replaceAll("\\", "\\\\")))
          }))
        void search
        const results = {
          "é": (yield* s("é")).found,
          "café": (yield* s("café")).found,
          "москва": (yield* s("москва")).found,
          "%": (yield* s("%")).found,
          "_": (yield* s("a_b")).found,
          "\\": (yield* s("\\")).found,
          "ǆ": (yield* s("ǆ")).found
        }
        const huge = yield* get(url, `/queue?name=jobs&${textField}=${"x".repeat(12_000)}`)
        yield* stop
        expect(results).toEqual({
          "é": ["CAFÉ au lait"],
          "café": ["CAFÉ au lait"],
          "москва": ["МОСКВА"],
          "%": ["100% done"],
          "_": ["a_b"],
          "\\": ["back\\slash"],
          "ǆ": ["ǅ digraph"]
        })
        expect(huge.status).toBeLessThan(500)
      }).pipe(Effect.scoped), 120_000)
  }
})

void request

describe("attack: what an action was shown of its row (the form's at)", () => {
  const backends = [
    {
      label: "SQLite",
      make: () =>
        Effect.sync(() => {
          const { live } = fresh()
          return { layer: MailboxSql.layerSqlite({ filename: live }), db: live }
        })
    },
    {
      label: "PostgreSQL",
      make: () =>
        Effect.gen(function*() {
          const admin = yield* Layer.build(MailboxSql.layerPg({ url: pgUrl })).pipe(
            Effect.map(Context.get(SqlClient.SqlClient))
          )
          const name = `rows_${Math.floor(Math.random() * 1e9)}`
          const u = new URL(pgUrl)
          u.pathname = `/${name}`
          yield* admin.unsafe(`CREATE DATABASE ${name}`)
          return { layer: MailboxSql.layerPg({ url: u.toString() }), db: u.toString() }
        })
    }
  ] as const
  for (const backend of backends) {
    it.live(
      `${backend.label}: a dead letter stored again under the same id: a stale Redrive or Delete is refused (409), nothing changes`,
      () =>
        Effect.gen(function*() {
          const made = yield* backend.make()
          yield* fill(made.layer, ["x"])
          const admin = yield* Effect.promise(() => import("../src/MailboxSqlAdmin.js"))
          const letters = Effect.flatMap(SqlClient.SqlClient, (sql) =>
            sql<{ id: string; error: string }>`SELECT id, error FROM leasehold_mailbox_dead_letters ORDER BY id`)
          yield* Effect.gen(function*() {
            const sql = yield* SqlClient.SqlClient
            yield* admin.deadLetters({})
            yield* sql`INSERT INTO leasehold_mailbox_dead_letters
              (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
              VALUES ('1001', 'jobs', '"x"', 1, 1000, 1000, 'Boom', 'old')`
          }).pipe(Effect.provide(made.layer))
          const { url, stop } = yield* startConsole(["--db", made.db])
          const page = yield* get(url, "/dead-letter?queue=jobs&id=1001")
          const redrive = formFor(page.body, "/actions/dead-letters/redrive", "1001")
          const remove = formFor(page.body, "/actions/dead-letters/delete", "1001")
          expect(field(redrive, "at")).toBe("1000")
          const asked = yield* post(url, "/actions/dead-letters/delete", remove)
          const confirmation = formsOf(asked.body)[0]!.fields
          // Meanwhile the letter goes and another is stored under its id.
          yield* Effect.gen(function*() {
            const sql = yield* SqlClient.SqlClient
            yield* sql`UPDATE leasehold_mailbox_dead_letters SET dead_lettered_at = 2000, error = 'new'
              WHERE id = '1001'`
          }).pipe(Effect.provide(made.layer))
          const statuses = [
            (yield* post(url, "/actions/dead-letters/redrive", redrive)).status,
            (yield* post(url, "/actions/dead-letters/delete", confirmation)).status
          ]
          const refusal = yield* post(url, "/actions/dead-letters/redrive", redrive)
          yield* stop
          expect(statuses).toEqual([409, 409])
          expect(refusal.body).toContain("the dead letter shown is no longer there")
          expect(yield* letters.pipe(Effect.provide(made.layer))).toEqual([{ id: "1001", error: "new" }])
        }).pipe(Effect.scoped),
      90_000
    )

    it.live(
      `${backend.label}: a message and a dead letter whose time is beyond Date's range can still be deleted from their pages`,
      () =>
        Effect.gen(function*() {
          const made = yield* backend.make()
          yield* fill(made.layer, ["good", "bad"])
          const admin = yield* Effect.promise(() => import("../src/MailboxSqlAdmin.js"))
          yield* Effect.gen(function*() {
            const sql = yield* SqlClient.SqlClient
            yield* admin.deadLetters({})
            yield* sql`UPDATE leasehold_mailbox_messages SET enqueued_at = ${"9000000000000000000"} WHERE seq = 2`
            yield* sql`INSERT INTO leasehold_mailbox_dead_letters
              (id, queue, body, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
              VALUES ('1002', 'jobs', '"y"', 1, ${"9000000000000000000"}, ${"9000000000000000000"}, 'Boom', 'y'),
                     ('1003', 'jobs', '"z"', 1, 0, 0, 'Boom', 'z')`
          }).pipe(Effect.provide(made.layer))
          const { url, stop } = yield* startConsole(["--db", made.db])
          const message = yield* get(url, "/message?queue=jobs&id=2")
          expect(message.body).toContain("invalid time")
          const asked = yield* post(
            url,
            "/actions/messages/delete",
            formFor(message.body, "/actions/messages/delete", "2")
          )
          const deleted = yield* post(url, "/actions/messages/delete", formsOf(asked.body)[0]!.fields)
          const letter = yield* get(url, "/dead-letter?queue=jobs&id=1002")
          const redriven = yield* post(
            url,
            "/actions/dead-letters/redrive",
            formFor(letter.body, "/actions/dead-letters/redrive", "1002")
          )
          yield* stop
          expect([deleted.status, redriven.status]).toEqual([303, 303])
          const left = yield* Effect.flatMap(SqlClient.SqlClient, (sql) =>
            sql<{ id: string }>`SELECT id FROM leasehold_mailbox_dead_letters ORDER BY id`).pipe(
              Effect.provide(made.layer)
            )
          expect(left.map((row) =>
            row.id
          )).toEqual(["1003"])
          expect((yield* bodies.pipe(Effect.provide(made.layer))).map(([, body]) => body)).toEqual(["good", "y"])
        }).pipe(Effect.scoped),
      90_000
    )
  }

  it.live(
    "SQLite: a hostile at (missing, junk, exponent, too long, another time, without an id) changes nothing",
    () =>
      Effect.gen(function*() {
        const { live } = fresh()
        yield* fill(MailboxSql.layerSqlite({ filename: live }), ["one"])
        const { url, stop } = yield* startConsole(["--db", live])
        const page = yield* get(url, "/message?queue=jobs&id=1")
        const base = formFor(page.body, "/actions/messages/delete", "1")
        const asked = yield* post(url, "/actions/messages/delete", base)
        const confirmation = formsOf(asked.body)[0]!.fields
        const without = (fields: Fields, name: string) => fields.filter(([each]) => each !== name)
        const results: Record<string, number> = {}
        for (
          const [what, fields] of [
            ["no at", without(base, "at")],
            ["junk", replaced(base, "at", "abc")],
            ["exponent", replaced(base, "at", "1e3")],
            ["17 digits", replaced(base, "at", "12345678901234567")],
            ["empty", replaced(base, "at", "")],
            ["at twice", [...base, ["at", "1"]]],
            ["confirmation, another at", replaced(confirmation, "at", "1")]
          ] as const
        ) {
          results[what] = (yield* post(url, "/actions/messages/delete", fields)).status
        }
        const otherTime = yield* post(url, "/actions/messages/delete", replaced(base, "at", "1"))
        const otherConfirmation = formsOf(otherTime.body)[0]?.fields
        results["another time, confirmed"] = otherConfirmation === undefined
          ? otherTime.status
          : (yield* post(url, "/actions/messages/delete", otherConfirmation)).status
        results["dead letters: at without id"] = (yield* post(url, "/actions/dead-letters/delete", [
          ["token", field(base, "token")!],
          ["db", field(base, "db")!],
          ["at", "1"]
        ])).status
        yield* stop
        expect(results).toEqual({
          "no at": 403,
          junk: 403,
          exponent: 403,
          "17 digits": 403,
          empty: 403,
          "at twice": 403,
          "confirmation, another at": 403,
          "another time, confirmed": 409,
          "dead letters: at without id": 403
        })
        expect(yield* sqliteBodies(live)).toEqual([["1", "one"]])
      }).pipe(Effect.scoped),
    90_000
  )
})
