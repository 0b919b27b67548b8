/**
 * Attacks on the keyed claim of 9e65dcf..fbfce45: the lease runs from when it is written, and PostgreSQL's keyed
 * claim is two calls of migration 16's PL/pgSQL functions (`<prefix>mailbox_keys_look`, `<prefix>mailbox_keys_lease`)
 * whose rows travel as JSON. Through the public API, and through direct SQL as a careless operator / another
 * local user. Each test asserts the correct behaviour: a failing test is a finding.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Either, Exit, Fiber, Layer, Schema, TestClock } from "effect"
import { spawn } from "node:child_process"
import type { KeySettings, KeyState } from "../src/internal/mailbox/scheduling.js"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { type SqlBackend, sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("atkclaim16")
let prefixes = 0
const freshPrefix = () => `c16_${++prefixes}_`

const bodies = (messages: ReadonlyArray<{ readonly body: string }>) => messages.map((m) => m.body)

/** A mailbox on the file's store of `prefix` (one "process"). */
const mailboxOf = (backend: SqlBackend, prefix: string, name = "q", create = true) =>
  MailboxSql.make({ name, schema: Schema.String, replySchema: Schema.String, prefix, create }).pipe(
    Effect.provide(backend.context())
  )

/** The operator's view of `prefix`. */
const adminOf = (backend: SqlBackend, prefix: string) =>
  MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(backend.context()))

/** A second store on the same database (its own connection and layer): another process, as far as a store knows. */
const otherProcess = (backend: SqlBackend, prefix: string) =>
  Effect.gen(function*() {
    const layer = backend.label === "SQLite"
      ? MailboxSql.layerSqlite({ filename: backend.db(), prefix })
      : MailboxSql.layerPg({ url: backend.db(), prefix, minConnections: 1 })
    const context = yield* Layer.build(layer)
    return {
      context,
      mailbox: (name = "q") =>
        MailboxSql.make({ name, schema: Schema.String, replySchema: Schema.String, prefix }).pipe(
          Effect.provide(context)
        ),
      admin: MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(context))
    }
  })

const stateOf = (keys: ReadonlyArray<KeyState>, key: string) => keys.find((k) => k.key === key)

/** Receives until a receive comes back empty; the bodies in order. */
const drainAll = (mailbox: Mailbox.Mailbox<string, string>, max = 10) =>
  Effect.gen(function*() {
    const out: Array<Mailbox.Message<string, string>> = []
    for (;;) {
      const got = yield* mailbox.receive({ maxMessages: max, visibilityTimeout: "10 minutes" })
      if (got.length === 0) return out
      out.push(...got)
    }
  })

/**
 * The queue's turn held `millis` by another connection: PostgreSQL, a transaction on the test's client that
 * updates the queue's '' row; SQLite, a child `sqlite3` process holding the file's write lock (the driver is
 * synchronous: a holder in this process could not commit while another store of this process busy-waits).
 * Resolves once the turn is held; the returned effect waits for its release.
 */
const holdTurn = (backend: SqlBackend, prefix: string, millis: number) =>
  Effect.gen(function*() {
    const held = yield* Deferred.make<void>()
    if (backend.label === "PostgreSQL") {
      const sql = backend.client()
      const fiber = yield* Effect.fork(sql.withTransaction(Effect.gen(function*() {
        yield* sql`UPDATE ${sql(`${prefix}mailbox_keys`)} SET vtime = vtime WHERE queue = 'q' AND key = ''`
        yield* Deferred.succeed(held, undefined)
        yield* Effect.sleep(Duration.millis(millis))
      })))
      yield* Deferred.await(held)
      return Fiber.join(fiber).pipe(Effect.asVoid)
    }
    const done = yield* Deferred.make<void>()
    const child = spawn("sqlite3", [backend.db()], { stdio: ["pipe", "pipe", "inherit"] })
    child.stdout.on("data", (chunk: Buffer) => {
      if (chunk.toString().includes("locked")) Effect.runSync(Deferred.succeed(held, undefined))
    })
    child.on("exit", () => Effect.runSync(Deferred.succeed(done, undefined)))
    child.stdin.end(
      `.timeout 5000\nBEGIN IMMEDIATE;\nUPDATE "${prefix}mailbox_keys" SET vtime = vtime WHERE queue = 'q' AND key = '';\n` +
        `.print locked\n.shell sleep ${millis / 1000}\nCOMMIT;\n`
    )
    yield* Deferred.await(held)
    return Deferred.await(done)
  })

const tagOf = (e: Either.Either<unknown, unknown>) =>
  Either.isLeft(e) ? (e.left as { readonly _tag?: string })._tag ?? String(e.left) : "ok"

describe.each(backends)("atk claim16: $label", (backend) => {
  // Tests of PostgreSQL's claim functions, its BIGINT seqs, its clock: defined there only (SQLite's driver gives
  // seqs as numbers, so one past 2^53 is rounded already by `send`: docs/mailboxes.md).
  const postgres = backend.label === "PostgreSQL"
  // -------------------------------------------------------------------------------------------------------------
  // Seqs past 2^53: the look's rows travel as JSON (BIGINTs become JS numbers)
  // -------------------------------------------------------------------------------------------------------------

  if (postgres) {
    it.scoped("seqs past 2^53: a keyed claim leases its own message, never another queue's", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const other = yield* mailboxOf(backend, prefix, "other")
        const q = yield* mailboxOf(backend, prefix)
        const sql = backend.client()
        const table = `${prefix}mailbox_messages`
        if (backend.label === "PostgreSQL") {
          yield* sql`SELECT setval(pg_get_serial_sequence(${table}, 'seq'), 9007199254740990)`
        } else {
          yield* other.send("warm")
          const [w] = yield* other.receive()
          yield* w!.acknowledge
          yield* sql`UPDATE sqlite_sequence SET seq = 9007199254740990 WHERE name = ${table}`
        }
        const id991 = yield* other.send("other-991")
        const id992 = yield* other.send("other-992")
        const id993 = yield* q.send("mine-993", { key: "k" })
        expect([id991, id992, id993]).toEqual(["9007199254740991", "9007199254740992", "9007199254740993"])
        const got = yield* q.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(got.map((m) => [m.id, m.body])).toEqual([["9007199254740993", "mine-993"]])
        const theirs = yield* other.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(bodies(theirs).sort()).toEqual(["other-991", "other-992"])
      }))
  }

  if (postgres) {
    it.scoped("seqs past 2^53 within one keyed queue: each message leased once, in order, acks accepted", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const q = yield* mailboxOf(backend, prefix)
        const sql = backend.client()
        const table = `${prefix}mailbox_messages`
        if (backend.label === "PostgreSQL") {
          yield* sql`SELECT setval(pg_get_serial_sequence(${table}, 'seq'), 9007199254740990)`
        } else {
          yield* q.send("warm")
          const [w] = yield* q.receive()
          yield* w!.acknowledge
          yield* sql`UPDATE sqlite_sequence SET seq = 9007199254740990 WHERE name = ${table}`
        }
        for (let i = 1; i <= 6; i++) yield* q.send(`m${i}`, { key: "k" })
        const got = yield* q.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(bodies(got)).toEqual(["m1", "m2", "m3", "m4", "m5", "m6"])
        for (const m of got) expect(tagOf(yield* Effect.either(m.acknowledge))).toBe("ok")
        expect(yield* q.approximateCount).toBe(0)
      }))
  }

  if (postgres) {
    it.scoped("seqs past 2^53: every keyed message is delivered in the end (acked one by one)", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const q = yield* mailboxOf(backend, prefix)
        const sql = backend.client()
        const table = `${prefix}mailbox_messages`
        if (backend.label === "PostgreSQL") {
          yield* sql`SELECT setval(pg_get_serial_sequence(${table}, 'seq'), 9007199254740990)`
        } else {
          yield* q.send("warm")
          const [w] = yield* q.receive()
          yield* w!.acknowledge
          yield* sql`UPDATE sqlite_sequence SET seq = 9007199254740990 WHERE name = ${table}`
        }
        for (let i = 1; i <= 6; i++) yield* q.send(`m${i}`, { key: "k" })
        const seen: Array<string> = []
        for (let round = 0; round < 12; round++) {
          const got = yield* q.receive({ maxMessages: 1, visibilityTimeout: "1 minute" })
          for (const m of got) {
            seen.push(m.body)
            yield* Effect.either(m.acknowledge)
          }
        }
        expect(seen).toEqual(["m1", "m2", "m3", "m4", "m5", "m6"])
        expect(yield* q.approximateCount).toBe(0)
      }))
  }

  it.scoped("keyed claims of queues with hostile names (quotes, backslashes, unicode, JSON-like)", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const names = ["q'\"; --", "q\\", "{\"q\":1}", "日本", "q".repeat(120)]
      const admin = yield* adminOf(backend, prefix)
      for (const name of names) {
        const mb = yield* mailboxOf(backend, prefix, name)
        yield* admin.setKeySettings(name, "k", { limit: 1 })
        yield* mb.send(`${name}#1`, { key: "k" })
        yield* mb.send(`${name}#2`, { key: "k" })
        yield* mb.send(`${name}#u`)
      }
      for (const name of names) {
        const mb = yield* mailboxOf(backend, prefix, name)
        const got = yield* mb.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(bodies(got).sort()).toEqual([`${name}#1`, `${name}#u`].sort())
      }
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Careless operator: the functions, the '' row, key rows, the ledger
  // -------------------------------------------------------------------------------------------------------------

  if (postgres) {
    it.scoped("the claim functions dropped by hand: a keyed receive fails typed, nothing is lost", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const q = yield* mailboxOf(backend, prefix)
        const sql = backend.client()
        yield* q.send("m1", { key: "k" })
        yield* sql`DROP FUNCTION ${sql(`${prefix}mailbox_keys_look`)}(text, bigint, integer, integer)`
        const failed = yield* Effect.either(q.receive({ visibilityTimeout: "1 minute" }))
        expect(tagOf(failed)).toBe("MailboxConnectionError")
        expect(yield* q.approximateCount).toBe(1)
      }))
  }

  // The turn's 5 s bound on idling in the transaction ("one stopped inside its claim holds it up to 5 s"): before
  // migration 16 a plain statement of the claim set it; now the look function does, with `set_config(…, true)`.
  if (postgres) {
    it.scoped("(PostgreSQL) after the look, the claim's transaction is still bounded to 5 s of idle", () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const q = yield* mailboxOf(backend, prefix)
        yield* q.send("x", { key: "k" })
        const sql = backend.client()
        const shown = yield* sql.withTransaction(Effect.gen(function*() {
          yield* sql`SELECT ${sql(`${prefix}mailbox_keys_look`)}('q', NULL, 10, 64)`
          const [row] = yield* sql<{ t: string }>`SELECT current_setting('idle_in_transaction_session_timeout') AS t`
          return row?.t
        }))
        expect(shown).toBe("5s")
      }))
  }

  if (postgres) {
    it.scopedLive(
      "(PostgreSQL) a claimer stopped between the look and the lease holds the queue's turn 5 s at most",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const a = yield* mailboxOf(backend, prefix)
          yield* a.send("x", { key: "k" })
          // Another process's claim, stopped (SIGSTOP, a debugger, a GC pause) right after its look: its own
          // connection, idle in the transaction that holds the queue's row.
          const pb = yield* otherProcess(backend, prefix)
          const { SqlClient } = yield* Effect.promise(() => import("@effect/sql"))
          const stopped = SqlClient.SqlClient.pipe(
            Effect.flatMap((sql) =>
              sql.withTransaction(Effect.gen(function*() {
                yield* sql`SELECT ${sql(`${prefix}mailbox_keys_look`)}('q', NULL, 10, 64)`
                yield* Effect.sleep("9 seconds")
              }))
            ),
            Effect.provide(pb.context)
          )
          const fiber = yield* Effect.fork(Effect.exit(stopped))
          yield* Effect.sleep("300 millis")
          const started = Date.now()
          const got = yield* a.receive({ maxMessages: 1, visibilityTimeout: "1 minute", waitTime: "10 seconds" })
          const waited = Date.now() - started
          yield* Fiber.join(fiber)
          expect(bodies(got)).toEqual(["x"])
          expect(waited).toBeLessThan(6_500)
        }),
      30_000
    )
  }

  // The lease function writes each key's row back by the ctid it found (80b56c7). A row updated by another
  // transaction that commits while the write waits for it has a new ctid: READ COMMITTED re-checks `ctid = tid`
  // against the new version and skips the row.
  if (postgres) {
    it.scopedLive(
      "(PostgreSQL) a key row updated by a concurrent transaction during the claim: the claim's write-back is kept",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const a = yield* mailboxOf(backend, prefix)
          const admin = yield* adminOf(backend, prefix)
          yield* admin.setKeySettings("q", "k", { starts: { count: 1, per: "1 hour" } })
          yield* a.send("k0", { key: "k" })
          yield* a.send("k1", { key: "k" })
          const sql = backend.client()
          const held = yield* Deferred.make<void>()
          // As a setKeySettings of another key field (or an operator's UPDATE) in flight: the key's row locked.
          const operator = yield* Effect.fork(sql.withTransaction(Effect.gen(function*() {
            yield* sql`UPDATE ${sql(`${prefix}mailbox_keys`)} SET weight = weight WHERE queue = 'q' AND key = 'k'`
            yield* Deferred.succeed(held, undefined)
            yield* Effect.sleep("1 second")
          })))
          yield* Deferred.await(held)
          const first = yield* a.receive({ maxMessages: 10, visibilityTimeout: "1 minute", waitTime: 0 })
          yield* Fiber.join(operator)
          expect(bodies(first)).toEqual(["k0"])
          // One start an hour: k1 waits.
          expect(bodies(yield* a.receive({ maxMessages: 10, visibilityTimeout: "1 minute", waitTime: 0 }))).toEqual([])
          const state = stateOf(yield* admin.keys("q"), "k")
          expect(state?.starts?.used).toBe(1)
        }),
      30_000
    )
  }

  if (postgres) {
    it.scopedLive(
      "(PostgreSQL) a key woken while its row is being updated by another transaction is not left idle for good",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const a = yield* mailboxOf(backend, prefix)
          const admin = yield* adminOf(backend, prefix)
          yield* admin.setKeySettings("q", "k", { starts: { count: 1, per: "1 hour" } })
          yield* a.send("k0", { key: "k" })
          const [k0] = yield* a.receive({ visibilityTimeout: "1 minute", waitTime: 0 })
          yield* k0!.acknowledge
          // Found empty: idle.
          expect(yield* a.receive({ waitTime: 0 })).toEqual([])
          yield* a.send("k1", { key: "k" })
          const sql = backend.client()
          const held = yield* Deferred.make<void>()
          const operator = yield* Effect.fork(sql.withTransaction(Effect.gen(function*() {
            yield* sql`UPDATE ${sql(`${prefix}mailbox_keys`)} SET weight = weight WHERE queue = 'q' AND key = 'k'`
            yield* Deferred.succeed(held, undefined)
            yield* Effect.sleep("1 second")
          })))
          yield* Deferred.await(held)
          // Woken by the send's ledger entry, passed over (its start used this hour).
          expect(yield* a.receive({ maxMessages: 10, waitTime: 0 })).toEqual([])
          yield* Fiber.join(operator)
          // The operator lifts the rate: k1 goes.
          yield* admin.setKeySettings("q", "k", { starts: null })
          expect(bodies(yield* a.receive({ maxMessages: 10, visibilityTimeout: "1 minute", waitTime: 0 }))).toEqual([
            "k1"
          ])
        }),
      30_000
    )
  }

  if (postgres) {
    it.live(
      "(PostgreSQL) setKeySettings racing claims: a start rate of 2 an hour is never exceeded",
      () =>
        Effect.scoped(Effect.gen(function*() {
          const prefix = freshPrefix()
          const a = yield* mailboxOf(backend, prefix)
          const pb = yield* otherProcess(backend, prefix)
          const b = yield* pb.mailbox()
          const admin = yield* adminOf(backend, prefix)
          const keys = Array.from({ length: 20 }, (_, i) => `r${i}`)
          for (const key of keys) yield* admin.setKeySettings("q", key, { starts: { count: 2, per: "1 hour" } })
          for (const key of keys) for (let i = 0; i < 6; i++) yield* a.send(`${key}-${i}`, { key })
          const got: Array<Mailbox.Message<string, string>> = []
          let stop = false
          const tweaker = Effect.gen(function*() {
            let w = 1
            while (!stop) {
              // The operator retunes weights (other fields of the same rows) while the fleet claims.
              yield* Effect.forEach(keys, (key) => admin.setKeySettings("q", key, { weight: w }), {
                concurrency: 4,
                discard: true
              })
              w = w === 1 ? 2 : 1
            }
          })
          const claimer = (mb: Mailbox.Mailbox<string, string>) =>
            Effect.gen(function*() {
              for (let i = 0; i < 40; i++) {
                const ms = yield* mb.receive({ maxMessages: 2, visibilityTimeout: "1 second", waitTime: 0 })
                got.push(...ms)
                for (const m of ms) yield* m.acknowledge
              }
            })
          yield* Effect.all([
            tweaker,
            Effect.all([claimer(a), claimer(b), claimer(a), claimer(b)], { concurrency: "unbounded" }).pipe(
              Effect.ensuring(Effect.sync(() => {
                stop = true
              }))
            )
          ], { concurrency: "unbounded" })
          const perKey = new Map<string, number>()
          for (const m of got) perKey.set(m.key!, (perKey.get(m.key!) ?? 0) + 1)
          const over = [...perKey].filter(([, n]) => n > 2)
          expect(over).toEqual([])
        })),
      60_000
    )
  }

  // -------------------------------------------------------------------------------------------------------------
  // Real clock: the queue's turn held by another connection
  // -------------------------------------------------------------------------------------------------------------

  it.scopedLive(
    "three stores' claims queued behind a turn held 2 s each hand out whole 1 s leases; acks accepted",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const pc = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        const c = yield* pc.mailbox()
        for (let i = 0; i < 3; i++) yield* a.send(`m${i}`, { key: `k${i}` })
        yield* a.send("plain")
        const released = yield* holdTurn(backend, prefix, 2000)
        const got = yield* Effect.all(
          [a, b, c].map((mb) => mb.receive({ maxMessages: 1, visibilityTimeout: "1 second" })),
          { concurrency: "unbounded" }
        )
        yield* released
        const all = got.flat()
        expect(all.length).toBe(3)
        // Nobody else gets them while their leases run.
        const spied = yield* a.receive({ maxMessages: 10, visibilityTimeout: "1 second", waitTime: 0 })
        expect(bodies(spied).filter((body) => all.every((m) => m.body !== body))).toEqual(bodies(spied))
        yield* Effect.sleep("600 millis")
        for (const m of all) expect([m.body, tagOf(yield* Effect.either(m.acknowledge))]).toEqual([m.body, "ok"])
      }),
    30_000
  )

  it.scopedLive(
    "two stores race behind a turn held 3 s, visibility 1 s: one gets it; its extension and ack are accepted",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        yield* a.send("x", { key: "k" })
        const released = yield* holdTurn(backend, prefix, 3000)
        const raced = yield* Effect.all(
          [b, a].map((mb) => mb.receive({ maxMessages: 1, visibilityTimeout: "1 second", waitTime: 0 })),
          { concurrency: "unbounded" }
        )
        yield* released
        const [m, ...others] = raced.flat()
        expect([m?.body, others.length]).toEqual(["x", 0])
        yield* Effect.sleep("700 millis")
        expect(tagOf(yield* Effect.either(m!.extendVisibility("1 second")))).toBe("ok")
        yield* Effect.sleep("700 millis")
        expect(bodies(yield* a.receive({ maxMessages: 1, waitTime: 0 }))).toEqual([])
        expect(bodies(yield* b.receive({ maxMessages: 1, waitTime: 0 }))).toEqual([])
        expect(tagOf(yield* Effect.either(m!.acknowledge))).toBe("ok")
      }),
    30_000
  )

  if (postgres) {
    it.scopedLive(
      "(PostgreSQL) a queue paused while a claim waits its turn: the claim hands out nothing",
      () =>
        Effect.gen(function*() {
          const prefix = freshPrefix()
          const a = yield* mailboxOf(backend, prefix)
          const admin = yield* adminOf(backend, prefix)
          yield* a.send("x", { key: "k" })
          const released = yield* holdTurn(backend, prefix, 1500)
          const waiting = yield* Effect.fork(a.receive({ maxMessages: 1, visibilityTimeout: "1 minute", waitTime: 0 }))
          yield* Effect.sleep("300 millis")
          yield* admin.pause("q")
          yield* released
          expect(bodies(yield* Fiber.join(waiting))).toEqual([])
          expect(bodies(yield* a.receive({ maxMessages: 1, waitTime: 0 }))).toEqual([])
        }),
      30_000
    )
  }

  it.scopedLive(
    "a receive interrupted while waiting its turn leases nothing; the next claim gets the message",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        yield* a.send("x", { key: "k" })
        const released = yield* holdTurn(backend, prefix, 1500)
        const waiting = yield* Effect.fork(b.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))
        yield* Effect.sleep("300 millis")
        const exit = yield* Fiber.interrupt(waiting)
        yield* released
        yield* Effect.sleep("300 millis")
        const got = yield* a.receive({ maxMessages: 1, visibilityTimeout: "1 minute", waitTime: "2 seconds" })
        const outcome = Exit.isInterrupted(exit)
          ? "interrupted"
          : Exit.isSuccess(exit)
          ? `got ${bodies(exit.value).join(",")}`
          : `failed ${String(exit.cause)}`
        expect([outcome, bodies(got)]).toEqual(outcome === "got x" ? ["got x", []] : [outcome, ["x"]])
        expect(outcome === "interrupted" || outcome === "got " || outcome === "got x").toBe(true)
      }),
    30_000
  )

  // -------------------------------------------------------------------------------------------------------------
  // Limits across three stores, real clock, mixed traffic and every way a lease ends
  // -------------------------------------------------------------------------------------------------------------

  it.live(
    "limits hold across 3 stores × 6 receivers with nacks, extend(0), delays, abandons; nothing lost or doubled",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const pc = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        const c = yield* pc.mailbox()
        yield* admin.setKeySettings("q", undefined, { limit: 2 })
        yield* admin.setKeySettings("q", "hot", { limit: 3, weight: 3 })
        yield* admin.setKeySettings("q", "one", { limit: 1 })
        const limits = new Map<string, number>([["hot", 3], ["one", 1]])
        const sent = new Set<string>()
        const senders = [a, b, c]
        let n = 0
        const send = (body: string, options?: Mailbox.SendOptions) =>
          Effect.map(senders[n++ % 3]!.send(body, options), (id) => sent.add(id))
        for (let i = 0; i < 30; i++) yield* send(`hot${i}`, { key: "hot", priority: (i * 7) % 5 - 2 })
        for (let i = 0; i < 12; i++) yield* send(`one${i}`, { key: "one" })
        for (let i = 0; i < 30; i++) {
          yield* send(`cold${i}`, { key: `cold${i % 5}`, priority: i % 2 === 0 ? -2147483648 : 2147483647 })
        }
        for (let i = 0; i < 15; i++) yield* send(`plain${i}`, i % 3 === 0 ? { priority: -5 } : undefined)
        const visibility = 2_000
        const live = new Map<string, number>()
        const peak = new Map<string, number>()
        const holding = new Map<string, number>() // id → when its lease began at the earliest (ms)
        const acked = new Map<string, number>()
        const problems: Array<string> = []
        let actions = 0
        const worker = (mailbox: Mailbox.Mailbox<string, string>, seed: number) =>
          Effect.gen(function*() {
            let idle = 0
            let r = seed
            const rand = () => (r = (r * 1103515245 + 12345) % 2147483648) / 2147483648
            while (acked.size < sent.size && idle < 400) {
              const asked = Date.now()
              const got = yield* mailbox.receive({
                maxMessages: 1 + Math.floor(rand() * 3),
                visibilityTimeout: Duration.millis(visibility),
                waitTime: 0
              })
              if (got.length === 0) {
                idle++
                yield* Effect.sleep("10 millis")
                continue
              }
              idle = 0
              for (const m of got) {
                const since = holding.get(m.id)
                if (since !== undefined && Date.now() < since + visibility - 20) {
                  problems.push(`${m.id} (${m.body}) redelivered ${Date.now() - since} ms into a live lease`)
                }
                holding.set(m.id, asked)
                if (m.key !== undefined) {
                  const now = (live.get(m.key) ?? 0) + 1
                  live.set(m.key, now)
                  peak.set(m.key, Math.max(peak.get(m.key) ?? 0, now))
                }
              }
              yield* Effect.sleep(Duration.millis(2 + Math.floor(rand() * 15)))
              for (const m of got) {
                const release = () => {
                  if (m.key !== undefined) live.set(m.key, live.get(m.key)! - 1)
                }
                const roll = rand()
                actions++
                if (roll < 0.55) {
                  release()
                  holding.delete(m.id)
                  const e = yield* Effect.either(m.acknowledge)
                  if (Either.isLeft(e)) problems.push(`ack of ${m.body} refused: ${tagOf(e)}`)
                  else acked.set(m.id, (acked.get(m.id) ?? 0) + 1)
                } else if (roll < 0.7) {
                  release()
                  holding.delete(m.id)
                  yield* Effect.either(m.nack())
                } else if (roll < 0.8) {
                  release()
                  holding.delete(m.id)
                  const e = yield* Effect.either(m.extendVisibility(0))
                  if (Either.isLeft(e)) problems.push(`extend(0) of ${m.body} refused: ${tagOf(e)}`)
                } else if (roll < 0.9) {
                  release()
                  holding.delete(m.id)
                  yield* Effect.either(m.nack("40 millis"))
                } else if (roll < 0.95) {
                  // A longer job, kept alive by an extension.
                  const e = yield* Effect.either(m.extendVisibility(Duration.millis(visibility)))
                  if (Either.isLeft(e)) problems.push(`extension of ${m.body} refused: ${tagOf(e)}`)
                  holding.set(m.id, Date.now())
                  yield* Effect.sleep("20 millis")
                  release()
                  holding.delete(m.id)
                  const k = yield* Effect.either(m.acknowledge)
                  if (Either.isLeft(k)) problems.push(`ack after extension of ${m.body} refused: ${tagOf(k)}`)
                  else acked.set(m.id, (acked.get(m.id) ?? 0) + 1)
                } else {
                  // Abandoned: the worker "crashed"; its lease runs out (still counted by the store until then).
                  release()
                }
              }
            }
          })
        yield* Effect.all(
          [a, b, c].flatMap((mb, i) => Array.from({ length: 6 }, (_, j) => worker(mb, i * 100 + j + 1))),
          { concurrency: "unbounded" }
        )
        expect(problems).toEqual([])
        for (const [key, max] of peak) {
          expect(max, key).toBeLessThanOrEqual(limits.get(key) ?? 2)
        }
        expect([...acked.values()].every((count) => count === 1)).toBe(true)
        expect([...acked.keys()].sort()).toEqual([...sent].sort())
        expect(yield* a.approximateCount).toBe(0)
        expect(actions).toBeGreaterThan(sent.size)
      })),
    60_000
  )

  it.live(
    "keys emptying and woken again by sends of 3 stores while 3 stores claim: nothing stranded, nothing doubled",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const pc = yield* otherProcess(backend, prefix)
        const stores = [a, yield* pb.mailbox(), yield* pc.mailbox()]
        yield* admin.setKeySettings("q", undefined, { limit: 1 })
        const sent = new Set<string>()
        const acked = new Map<string, number>()
        const live = new Map<string, number>()
        let over = 0
        let sending = true
        const sender = (mb: Mailbox.Mailbox<string, string>, s: number) =>
          Effect.gen(function*() {
            for (let i = 0; i < 60; i++) {
              const key = `w${(s * 7 + i * 13) % 40}`
              sent.add(yield* mb.send(`${key}/${s}/${i}`, { key }))
              yield* Effect.sleep(Duration.millis((i * s) % 7))
            }
          })
        const receiver = (mb: Mailbox.Mailbox<string, string>) =>
          Effect.gen(function*() {
            let idle = 0
            while (sending || idle < 60) {
              const got = yield* mb.receive({ maxMessages: 3, visibilityTimeout: "20 seconds", waitTime: 0 })
              if (got.length === 0) {
                idle++
                yield* Effect.sleep("5 millis")
                continue
              }
              idle = 0
              for (const m of got) {
                const n = (live.get(m.key!) ?? 0) + 1
                live.set(m.key!, n)
                if (n > 1) over++
              }
              yield* Effect.yieldNow()
              for (const m of got) {
                live.set(m.key!, live.get(m.key!)! - 1)
                yield* m.acknowledge
                acked.set(m.id, (acked.get(m.id) ?? 0) + 1)
              }
            }
          })
        const senders = Effect.all(stores.map((mb, i) => sender(mb, i + 1)), { concurrency: "unbounded" }).pipe(
          Effect.ensuring(Effect.sync(() => {
            sending = false
          }))
        )
        yield* Effect.all([senders, ...stores.flatMap((mb) => [receiver(mb), receiver(mb)])], {
          concurrency: "unbounded"
        })
        expect(over).toBe(0)
        expect([...acked.values()].every((n) => n === 1)).toBe(true)
        expect(yield* a.approximateCount).toBe(0)
        expect(acked.size).toBe(sent.size)
      })),
    60_000
  )

  it.scoped(
    "two stores, 60 receivers × 10 each at once over 1,100 keys at limit 1: each key served once",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const pb = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        yield* admin.setKeySettings("q", undefined, { limit: 1 })
        const keys = Array.from({ length: 1_100 }, (_, i) => `t${String(i).padStart(4, "0")}`)
        yield* Effect.forEach(keys, (key) =>
          a.send(`${key}#1`, { key }).pipe(
            Effect.zipRight(b.send(`${key}#2`, { key }))
          ), { concurrency: 50, discard: true })
        const got = (yield* Effect.all(
          Array.from(
            { length: 120 },
            (_, i) => (i % 2 === 0 ? a : b).receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
          ),
          { concurrency: "unbounded" }
        )).flat()
        expect(new Set(got.map((m) => m.key)).size).toBe(got.length)
        expect(got.length).toBe(keys.length)
        for (const m of got) expect(m.body).toBe(`${m.key}#1`)
        expect(yield* b.receive({ maxMessages: 10 })).toEqual([])
      }),
    120_000
  )

  // -------------------------------------------------------------------------------------------------------------
  // Hostile data through the JSON path
  // -------------------------------------------------------------------------------------------------------------

  it.scoped("keys that look like JSON numbers, literals, escapes, or differ by normalization stay distinct", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      const names = [
        "1e5",
        "100000",
        "100000.0",
        "-0",
        "0",
        "null",
        "true",
        "[]",
        "{}",
        "[\"a\",1]",
        "\\u0000",
        "\\ud800",
        "\\",
        "\\\\",
        "\"",
        "'",
        "é", // NFC
        "e\u0301", // NFD
        "\ufeffbom",
        "\u00a0",
        " ",
        "é".repeat(200),
        "😀".repeat(100),
        "x".repeat(199) + "\"",
        "$[0]",
        "v->>0",
        "*/ SELECT 1; --"
      ]
      for (const key of names) {
        yield* admin.setKeySettings("q", key, { limit: 1 })
        yield* mailbox.send(`${key}#1`, { key, priority: -2147483648 })
        yield* mailbox.send(`${key}#2`, { key, priority: 2147483647 })
      }
      const got = yield* Effect.map(
        Effect.all(
          Array.from({ length: 5 }, () => mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))
        ),
        (pages) => pages.flat()
      )
      expect(got.map((m) => m.key).sort()).toEqual([...names].sort())
      for (const m of got) expect([m.key, m.body, m.priority]).toEqual([m.key, `${m.key}#1`, -2147483648])
      for (const m of got) yield* m.acknowledge
      const second = yield* drainAll(mailbox)
      expect(second.map((m) => m.body).sort()).toEqual(names.map((key) => `${key}#2`).sort())
      const keys = yield* admin.keys("q")
      expect(keys.map((k) => [k.key, k.inFlight, k.pending, k.limit]).sort()).toEqual(
        names.map((key) => [key, 1, 1, 1]).sort()
      )
    }))

  it.scoped("a key whose backlog is read past the look's cap keeps (priority, enqueue) order at INTEGER extremes", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const expected: Array<string> = []
      const priorities = [-2147483648, -2147483648, -2147483647, -1, 0, 0, 1, 2147483646, 2147483647, 2147483647]
      // Sent out of order; the order a key's messages go in is by (priority, first enqueue).
      const order = [9, 3, 0, 7, 5, 1, 8, 2, 6, 4]
      for (const i of order) yield* mailbox.send(`big-${i}`, { key: "big", priority: priorities[i] })
      for (let i = 0; i < 10; i++) expected.push(`big-${i}`)
      // Many other keys: the look's cap per key falls to 2, so "big" is read again past its last row.
      for (let i = 0; i < 60; i++) yield* mailbox.send(`o${i}`, { key: `o${String(i).padStart(2, "0")}` })
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "big", { weight: 1000 })
      const got = yield* drainAll(mailbox, 20)
      const big = got.filter((m) => m.key === "big").map((m) => m.body)
      // Equal priorities go by first enqueue: the send order above.
      const byPlace = [...order.keys()].map((place) => ({ i: order[place]!, place })).sort((x, y) =>
        priorities[x.i]! - priorities[y.i]! || x.place - y.place
      ).map(({ i }) => `big-${i}`)
      expect(big).toEqual(byPlace)
      expect(got.length).toBe(70)
      expect(new Set(got.map((m) => m.id)).size).toBe(70)
    }))

  it.scoped("token budgets near Number.MAX_SAFE_INTEGER: charges saturate, the key waits its window, then goes", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* TestClock.adjust("2 days")
      yield* admin.setKeySettings("q", "t", { tokens: { count: 1_000_000_000_000, per: "1 day" } })
      for (let i = 0; i < 4; i++) yield* mailbox.send(`t${i}`, { key: "t" })
      yield* mailbox.send("u0", { key: "u" })
      const [first, ...rest] = yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" })
      expect(rest).toEqual([])
      expect(first?.body).toBe("t0")
      yield* Mailbox.chargeTokens(first!, Number.MAX_SAFE_INTEGER)
      yield* Mailbox.chargeTokens(first!, Number.MAX_SAFE_INTEGER)
      yield* first!.acknowledge
      // Over budget: "t" waits; "u" goes.
      const u = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(bodies(u)).toEqual(["u0"])
      yield* u[0]!.acknowledge
      expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))).toEqual([])
      const state = stateOf(yield* admin.keys("q"), "t")
      expect(state?.tokens?.used).toBe(Number.MAX_SAFE_INTEGER)
      yield* TestClock.adjust("1 day")
      expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))).toEqual([
        "t1",
        "t2",
        "t3"
      ])
    }))

  it.scoped("settings at their edges (limit 1,000,000, weights 0.001/1000, rates of 1 per 1 ms and per 1 day)", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", undefined, { limit: 1_000_000, weight: 1000 })
      yield* admin.setKeySettings("q", "light", { weight: 0.001, starts: { count: 1_000_000, per: "1 millis" } })
      yield* admin.setKeySettings("q", "daily", { starts: { count: 1, per: "1 day" } })
      for (let i = 0; i < 20; i++) {
        yield* mailbox.send(`light${i}`, { key: "light" })
        yield* mailbox.send(`heavy${i}`, { key: "heavy" })
        yield* mailbox.send(`daily${i}`, { key: "daily" })
      }
      const got: Array<string> = []
      for (let round = 0; round < 10; round++) {
        const ms = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "12 hours" })
        yield* TestClock.adjust("5 seconds")
        for (const m of ms) yield* m.acknowledge
        got.push(...bodies(ms))
      }
      expect(got.filter((b) => b.startsWith("daily"))).toEqual(["daily0"])
      expect(got.filter((b) => b.startsWith("light")).length + got.filter((b) => b.startsWith("heavy")).length)
        .toBe(40)
      for (const key of yield* admin.keys("q")) expect([key.key, Number.isFinite(key.vtime)]).toEqual([key.key, true])
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Shapes: prefixes, create: false, a queue made scheduled mid-run
  // -------------------------------------------------------------------------------------------------------------

  it.scoped("two prefixes on one database, same queue name: each its own limits, nothing crosses over", () =>
    Effect.gen(function*() {
      const p1 = freshPrefix()
      const p2 = `${p1}mailbox_keys_`
      const a = yield* mailboxOf(backend, p1)
      const b = yield* mailboxOf(backend, p2)
      yield* (yield* adminOf(backend, p1)).setKeySettings("q", "k", { limit: 1 })
      yield* (yield* adminOf(backend, p2)).setKeySettings("q", "k", { limit: 2 })
      for (let i = 0; i < 4; i++) {
        yield* a.send(`a${i}`, { key: "k" })
        yield* b.send(`b${i}`, { key: "k" })
      }
      const got = yield* Effect.all([
        a.receive({ maxMessages: 10 }),
        b.receive({ maxMessages: 10 }),
        a.receive({ maxMessages: 10 }),
        b.receive({ maxMessages: 10 })
      ], { concurrency: "unbounded" })
      expect(bodies(got[0]!.concat(got[2]!)).sort()).toEqual(["a0"])
      expect(bodies(got[1]!.concat(got[3]!)).sort()).toEqual(["b0", "b1"])
    }))

  it.scoped("at the longest prefix the claim functions keep their names and keyed claims work", () =>
    Effect.gen(function*() {
      const prefix = `z${"y".repeat(35)}_`
      expect(prefix.length).toBe(37)
      const mailbox = yield* mailboxOf(backend, prefix)
      yield* (yield* adminOf(backend, prefix)).setKeySettings("q", "k", { limit: 1 })
      yield* mailbox.send("k0", { key: "k" })
      yield* mailbox.send("k1", { key: "k" })
      expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["k0"])
      if (backend.label === "PostgreSQL") {
        const sql = backend.client()
        const fns = yield* sql<{ name: string }>`SELECT proname AS name FROM pg_proc
          WHERE proname LIKE ${`${prefix}%`} ORDER BY proname`
        expect(fns.map((f) => f.name)).toEqual(
          expect.arrayContaining([`${prefix}mailbox_keys_lease`, `${prefix}mailbox_keys_look`])
        )
      }
    }))

  it.scoped(
    "a create: false mailbox (another process migrated) claims keyed messages under limits",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const maker = yield* mailboxOf(backend, prefix)
        yield* (yield* adminOf(backend, prefix)).setKeySettings("q", "k", { limit: 1 })
        const pb = yield* otherProcess(backend, prefix)
        const reader = yield* MailboxSql.make({ name: "q", schema: Schema.String, prefix, create: false }).pipe(
          Effect.provide(pb.context)
        )
        for (let i = 0; i < 3; i++) yield* maker.send(`k${i}`, { key: "k" })
        expect(bodies(yield* reader.receive({ maxMessages: 10 }))).toEqual(["k0"])
        expect(bodies(yield* maker.receive({ maxMessages: 10 }))).toEqual([])
      }),
    60_000
  )

  it.live(
    "a queue made scheduled by another process while receivers poll it plain: the limit holds at once",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        for (let i = 0; i < 5; i++) yield* a.send(`plain${i}`)
        const pb = yield* otherProcess(backend, prefix)
        const b = yield* pb.mailbox()
        const seenKeyed: Array<Mailbox.Message<string, string>> = []
        const stop = yield* Deferred.make<void>()
        const pollers = yield* Effect.fork(Effect.all(
          Array.from({ length: 6 }, () =>
            Effect.gen(function*() {
              while (!(yield* Deferred.isDone(stop))) {
                const got = yield* a.receive({ maxMessages: 5, visibilityTimeout: "1 minute", waitTime: 0 })
                for (const m of got) if (m.key !== undefined) seenKeyed.push(m)
                yield* Effect.sleep("5 millis")
              }
            })),
          { concurrency: "unbounded" }
        ))
        yield* Effect.sleep("200 millis")
        yield* (yield* pb.admin).setKeySettings("q", "k", { limit: 1 })
        yield* Effect.forEach(Array.from({ length: 10 }, (_, i) => i), (i) => b.send(`k${i}`, { key: "k" }), {
          concurrency: 10
        })
        yield* Effect.sleep("1500 millis")
        yield* Deferred.succeed(stop, undefined)
        yield* Fiber.join(pollers)
        expect(bodies(seenKeyed)).toEqual(["k0"])
      })),
    30_000
  )

  // -------------------------------------------------------------------------------------------------------------
  // Large shapes
  // -------------------------------------------------------------------------------------------------------------

  it.scoped(
    "a ledger naming 70,000 woken keys: the next claim succeeds in time and every message is served once",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        yield* mailbox.send("seed", { key: "seed" })
        const sql = backend.client()
        const [stored] = yield* sql<{ body: string }>`SELECT body FROM ${sql(`${prefix}mailbox_messages`)}`
        expect(stored?.body).toBe("\"seed\"")
        const keys = sql(`${prefix}mailbox_keys`)
        const messages = sql(`${prefix}mailbox_messages`)
        const charges = sql(`${prefix}mailbox_key_charges`)
        const n = 70_000
        // What 70,000 sends to keys gone idle write (prepareSend and the insert), written as another process would.
        if (backend.label === "PostgreSQL") {
          yield* sql`INSERT INTO ${keys} (queue, key, vtime, idle)
            SELECT 'q', 'k' || lpad(i::text, 6, '0'), 0, 1 FROM generate_series(1, ${n}) i`
          yield* sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, key, priority)
            SELECT 'q', '"m' || i || '"', 0, 0, 'k' || lpad(i::text, 6, '0'), 0 FROM generate_series(1, ${n}) i`
          yield* sql`INSERT INTO ${charges} (queue, key, vtime, leased, held, tokens, at)
            SELECT 'q', 'k' || lpad(i::text, 6, '0'), 0, 0, NULL, NULL, 0 FROM generate_series(1, ${n}) i`
        } else {
          const series = sql`WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ${n})`
          const name = sql`'k' || substr('000000' || i, -6, 6)`
          yield* sql`${series} INSERT INTO ${keys} (queue, key, vtime, idle) SELECT 'q', ${name}, 0, 1 FROM s`
          yield* sql`${series} INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, key, priority)
            SELECT 'q', '"m' || i || '"', 0, 0, ${name}, 0 FROM s`
          yield* sql`${series} INSERT INTO ${charges} (queue, key, vtime, leased, held, tokens, at)
            SELECT 'q', ${name}, 0, 0, NULL, NULL, 0 FROM s`
        }
        const started = Date.now()
        const first = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })
        const took = Date.now() - started
        expect(first.length).toBe(10)
        expect(took).toBeLessThan(10_000)
        // A burst of wide claims after it.
        const more = (yield* Effect.all(
          Array.from({ length: 100 }, () => mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })),
          { concurrency: "unbounded" }
        )).flat()
        const all = [...first, ...more]
        expect(all.length).toBe(1010)
        expect(new Set(all.map((m) => m.id)).size).toBe(all.length)
        const [left] = yield* sql<{ n: number | string }>`SELECT count(*) AS n FROM ${charges}`
        expect(Number(left?.n)).toBe(0)
      }),
    120_000
  )
})

// ---------------------------------------------------------------------------------------------------------------
// Differential: the same script on SQLite, PostgreSQL (the walk is shared; only the reads differ) and memory
// ---------------------------------------------------------------------------------------------------------------

/** A deterministic script under TestClock: what each receive returns. */
const script = (
  mailbox: Mailbox.Mailbox<string, string>,
  settings: (key: string | undefined, s: KeySettings) => Effect.Effect<void, unknown>
) =>
  Effect.gen(function*() {
    // Windows aligned: the next whole day.
    const now = yield* TestClock.currentTimeMillis
    yield* TestClock.adjust(86_400_000 - (now % 86_400_000))
    yield* settings(undefined, { limit: 2 })
    yield* settings("w3", { weight: 3 })
    yield* settings("l1", { limit: 1 })
    yield* settings("s2", { starts: { count: 2, per: "1 minute" } })
    const log: Array<string> = []
    let r = 7
    const rand = () => (r = (r * 48271) % 2147483647) / 2147483647
    const keys = ["w3", "l1", "s2", "a", "b", "c", "d"]
    let sentCount = 0
    const held: Array<Mailbox.Message<string, string>> = []
    for (let step = 0; step < 60; step++) {
      for (let i = 0; i < 3; i++) {
        const key = keys[Math.floor(rand() * keys.length)]!
        const unkeyed = rand() < 0.15
        const priority = Math.floor(rand() * 3) - 1
        yield* mailbox.send(`${unkeyed ? "-" : key}:${sentCount++}`, unkeyed ? undefined : { key, priority })
      }
      const got = yield* mailbox.receive({ maxMessages: 1 + Math.floor(rand() * 4), visibilityTimeout: "30 seconds" })
      log.push(`${step}|${bodies(got).join(",")}`)
      held.push(...got)
      yield* TestClock.adjust(Duration.millis(500 + Math.floor(rand() * 3000)))
      // Settle some of what is held, oldest first.
      const settle = Math.floor(rand() * (held.length + 1))
      for (const m of held.splice(0, settle)) {
        const roll = rand()
        if (roll < 0.7) yield* Effect.either(m.acknowledge)
        else if (roll < 0.85) yield* Effect.either(m.nack())
        else yield* Effect.either(m.extendVisibility(0))
      }
    }
    return log
  })

/** A wider script: 90 keys (past the first page of 64), keys that empty and come back, unkeyed, tokens. */
const wideScript = (
  mailbox: Mailbox.Mailbox<string, string>,
  settings: (key: string | undefined, s: KeySettings) => Effect.Effect<void, unknown>
) =>
  Effect.gen(function*() {
    const now = yield* TestClock.currentTimeMillis
    yield* TestClock.adjust(86_400_000 - (now % 86_400_000))
    yield* settings(undefined, { limit: 1 })
    yield* settings("k007", { limit: 3, weight: 5 })
    yield* settings("k013", { tokens: { count: 100, per: "1 minute" } })
    yield* settings("k021", { weight: 0.25 })
    const log: Array<string> = []
    let r = 11
    const rand = () => (r = (r * 48271) % 2147483647) / 2147483647
    let sentCount = 0
    const held: Array<Mailbox.Message<string, string>> = []
    for (let step = 0; step < 50; step++) {
      const burst = step % 10 === 0 ? 40 : 4
      for (let i = 0; i < burst; i++) {
        const key = `k${String(Math.floor(rand() * 90)).padStart(3, "0")}`
        const unkeyed = rand() < 0.1
        yield* mailbox.send(
          `${unkeyed ? "-" : key}:${sentCount++}`,
          unkeyed ? undefined : {
            key,
            priority: Math.floor(rand() * 5) - 2
          }
        )
      }
      const got = yield* mailbox.receive({ maxMessages: 1 + Math.floor(rand() * 30), visibilityTimeout: "20 seconds" })
      log.push(`${step}|${bodies(got).join(",")}`)
      held.push(...got)
      yield* TestClock.adjust(Duration.millis(200 + Math.floor(rand() * 4000)))
      const settle = Math.floor(rand() * (held.length + 1))
      for (const m of held.splice(0, settle)) {
        const roll = rand()
        if (m.key === "k013") yield* Effect.either(Mailbox.chargeTokens(m, 60))
        if (roll < 0.75) yield* Effect.either(m.acknowledge)
        else if (roll < 0.9) yield* Effect.either(m.nack())
        else yield* Effect.either(m.extendVisibility(0))
      }
    }
    return log
  })

describe("atk claim16: SQLite and PostgreSQL run one script alike", () => {
  it.scoped("the same keyed script gives the same receives on SQLite and PostgreSQL", () =>
    Effect.gen(function*() {
      const logs: Array<ReadonlyArray<string>> = []
      for (const backend of backends) {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        logs.push(yield* script(mailbox, (key, s) => admin.setKeySettings("q", key, s)))
      }
      expect(logs[1]).toEqual(logs[0])
    }), 60_000)

  it.scoped(
    "a wider keyed script (90 keys, idle and woken keys, tokens) gives the same receives on both",
    () =>
      Effect.gen(function*() {
        const logs: Array<ReadonlyArray<string>> = []
        for (const backend of backends) {
          const prefix = freshPrefix()
          const mailbox = yield* mailboxOf(backend, prefix)
          const admin = yield* adminOf(backend, prefix)
          logs.push(yield* wideScript(mailbox, (key, s) => admin.setKeySettings("q", key, s)))
        }
        expect(logs[0]!.flatMap((line) => line.split("|")[1]!.split(",").filter((b) => b !== "")).length)
          .toBeGreaterThan(150)
        expect(logs[1]).toEqual(logs[0])
      }),
    60_000
  )
})
