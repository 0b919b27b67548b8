/**
 * Attacks (atk, issue 45) on scheduling by key in the SQL mailboxes (SQLite and PostgreSQL), through the public
 * API only (`Mailbox`, `MailboxSql`, `MailboxSqlAdmin`, `MailboxMemory` for comparison): limits across
 * concurrent receivers and across two stores on one database (two processes), every way a lease ends, redrive,
 * mixed keyed / unkeyed / prioritised traffic, hostile key names and numbers, a clock that jumps, many keys.
 *
 * Each "BUG:" comment names a finding of the attack (all fixed since; the tests are plain tests now).
 */
import { describe, expect, it } from "@effect/vitest"
import { DateTime, Deferred, Duration, Effect, Either, Fiber, Layer, Ref, Schema, TestClock } from "effect"
import type { KeyState } from "../src/internal/mailbox/scheduling.js"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { type SqlBackend, sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("atksql45")
let prefixes = 0
const freshPrefix = () => `atk${++prefixes}_`

const bodies = (messages: ReadonlyArray<{ readonly body: string }>) => messages.map((m) => m.body)

/** A mailbox on the file's store of `prefix` (one "process"). */
const mailboxOf = (backend: SqlBackend, prefix: string, name = "q") =>
  MailboxSql.make({ name, schema: Schema.String, replySchema: Schema.String, prefix }).pipe(
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

describe.each(backends)("atk sql45: $label", (backend) => {
  // -------------------------------------------------------------------------------------------------------------
  // Starvation by the walk's bound
  // -------------------------------------------------------------------------------------------------------------

  // BUG: a claim gives up once the first page of the walk (64 keys, by share clock then name) is used up and
  // none of them could take a message (all delayed, at their limit, over a rate, or only in flight) — the next
  // page is loaded only while the heap is not empty, and the walk stops at max + 256 keys anyway — so a key after
  // 64 such keys, with a ready message and nothing else claimable, gets nothing until their delays pass.
  // Expected: the ready message is received ("no key with ready work starves"; the memory backend serves it).
  it.scoped(
    "a ready key behind 70 keys with only delayed messages is still served",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        for (let i = 0; i < 70; i++) {
          yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}`, delay: "15 minutes" })
        }
        yield* mailbox.send("ready", { key: "zzz" })
        const got = yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" })
        expect(bodies(got)).toEqual(["ready"])
      }),
    120_000
  )

  it.scoped(
    "a ready key behind 60 keys with only delayed messages is served (within the first page)",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        for (let i = 0; i < 60; i++) {
          yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}`, delay: "15 minutes" })
        }
        yield* mailbox.send("ready", { key: "zzz" })
        expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))).toEqual(["ready"])
      }),
    120_000
  )

  // BUG: the same bound past 300 keys (more than max + 256).
  it.scoped(
    "a ready key behind 300 keys with only delayed messages is still served",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        for (let i = 0; i < 300; i++) {
          yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}`, delay: "15 minutes" })
        }
        yield* mailbox.send("ready", { key: "zzz" })
        const got = yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" })
        expect(bodies(got)).toEqual(["ready"])
      }),
    120_000
  )

  it.scoped("(memory holds it) a ready key behind 300 keys with only delayed messages is served", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      for (let i = 0; i < 300; i++) {
        yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}`, delay: "15 minutes" })
      }
      yield* mailbox.send("ready", { key: "zzz" })
      expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))).toEqual(["ready"])
    }))

  /** Gives `key` a history: one lease held `heldMillis` (its share clock and mean lease length move by it). */
  const history = (mailbox: Mailbox.Mailbox<string, string>, key: string, heldMillis: number) =>
    Effect.gen(function*() {
      yield* mailbox.send(`${key}-history`, { key })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(m?.key).toBe(key)
      if (heldMillis > 0) yield* TestClock.adjust(heldMillis)
      yield* m!.acknowledge
    })

  // BUG: same bound, with limits (default limit 1; 300 keys with two messages each, whose short past leases keep
  // their share clocks low): the receives stop after 64 leases — the 64 keys at their limit fill the first page
  // and 236 keys with two ready messages and no lease get nothing; and a key whose one past lease was a second
  // long (a higher clock) gets nothing either. Expected: 300 leases (one per key), then "ready" is received.
  it.scoped("a ready key behind 300 keys at their limit is still served", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", undefined, { limit: 1 })
      yield* history(mailbox, "zzz", 1000)
      const keys = Array.from({ length: 300 }, (_, i) => `k${String(i).padStart(3, "0")}`)
      for (const key of keys) yield* history(mailbox, key, 0)
      for (const key of keys) {
        yield* mailbox.send(`${key}-a`, { key })
        yield* mailbox.send(`${key}-b`, { key })
      }
      let leased = 0
      for (;;) {
        const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
        if (got.length === 0) break
        leased += got.length
      }
      expect(leased).toBe(300)
      yield* mailbox.send("ready", { key: "zzz" })
      expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))).toEqual(["ready"])
    }), 180_000)

  // BUG: the same with no limit at all: 300 keys whose one message is in flight (nothing ready) fill the walk.
  it.scoped(
    "a ready key behind 300 keys with only in-flight messages is still served (no limits)",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        yield* history(mailbox, "zzz", 2000)
        for (let i = 0; i < 300; i++) yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}` })
        let leased = 0
        for (;;) {
          const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 second" })
          if (got.length === 0) break
          leased += got.length
        }
        expect(leased).toBe(300)
        yield* mailbox.send("ready", { key: "zzz" })
        expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))).toEqual(["ready"])
      }),
    180_000
  )

  it.scoped("(memory holds it) a ready key behind 300 keys with only in-flight messages is served", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      yield* history(mailbox, "zzz", 2000)
      for (let i = 0; i < 300; i++) yield* mailbox.send(`k${i}`, { key: `k${String(i).padStart(3, "0")}` })
      let leased = 0
      for (;;) {
        const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 second" })
        if (got.length === 0) break
        leased += got.length
      }
      expect(leased).toBe(300)
      yield* mailbox.send("ready", { key: "zzz" })
      expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 minute" }))).toEqual(["ready"])
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Rates
  // -------------------------------------------------------------------------------------------------------------

  // BUG: a token budget of 0 holds a key only while the key's stored token window is the current one (the
  // claim skips a key only when `window === tokensWindow`): with the clock past the first window, the key is
  // claimed. Expected: nothing of the key is claimed (as a start rate of 0, and as in memory).
  it.scoped("a token budget of count 0 holds the key in a later window", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* TestClock.adjust("90 minutes")
      yield* admin.setKeySettings("q", "a", { tokens: { count: 0, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      expect(bodies(yield* mailbox.receive({ visibilityTimeout: "1 minute" }))).toEqual([])
    }))

  it.scoped("a start rate of count 0 holds the key in a later window", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* TestClock.adjust("90 minutes")
      yield* admin.setKeySettings("q", "a", { starts: { count: 0, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      expect(bodies(yield* mailbox.receive({ visibilityTimeout: "1 minute" }))).toEqual([])
    }))

  it.scoped("(memory holds it) a token budget of count 0 holds the key in a later window", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      yield* TestClock.adjust("90 minutes")
      yield* MailboxMemory.setKeySettings(mailbox, "a", { tokens: { count: 0, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      expect(bodies(yield* mailbox.receive({ visibilityTimeout: "1 minute" }))).toEqual([])
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Two processes
  // -------------------------------------------------------------------------------------------------------------

  // BUG: `drop` deletes the queue's row (and with it the `scheduled` flag); a store that already knew the queue
  // scheduled does not write the flag again on its next keyed send, so another process's plain claim hands the
  // keyed messages out without the limit. Expected: limit 1 holds across the two stores.
  it.scoped(
    "after a drop, a keyed send from a process that knew the queue keeps limits for every process",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        yield* admin.setKeySettings("q", undefined, { limit: 1 })
        yield* a.send("warm", { key: "t" })
        const [warm] = yield* a.receive()
        yield* warm!.acknowledge
        expect(yield* admin.drop("q")).toBe("dropped")
        for (let i = 0; i < 5; i++) yield* a.send(`t${i}`, { key: "t" })
        const other = yield* otherProcess(backend, prefix)
        const b = yield* other.mailbox()
        const got = yield* b.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(got.length).toBe(1)
      }),
    60_000
  )

  it.scoped(
    "a queue that had only unkeyed traffic, then a keyed send from another process: limits hold",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        for (let i = 0; i < 3; i++) yield* a.send(`plain${i}`)
        expect((yield* a.receive({ maxMessages: 10 })).length).toBe(3)
        expect(yield* a.receive({ maxMessages: 10 })).toEqual([])
        const other = yield* otherProcess(backend, prefix)
        const b = yield* other.mailbox()
        yield* other.admin.pipe(Effect.flatMap((admin) => admin.setKeySettings("q", "t", { limit: 1 })))
        for (let i = 0; i < 5; i++) yield* b.send(`t${i}`, { key: "t" })
        yield* a.send("plain-after")
        const got = yield* a.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
        expect(bodies(got).sort()).toEqual(["plain-after", "t0"])
        expect(yield* a.receive({ maxMessages: 10 })).toEqual([])
        expect(yield* b.receive({ maxMessages: 10 })).toEqual([])
      }),
    60_000
  ) // -------------------------------------------------------------------------------------------------------------
   // Limits: concurrency in one process and across two
  // -------------------------------------------------------------------------------------------------------------

  // On PostgreSQL this fails today by the bug below ("a key whose mean lease length is a fraction"): real leases
  // of random lengths give fractional means, and the run's claims fail with "invalid input syntax for type
  // bigint". Expected: it holds there as on SQLite.
  ;(backend.label === "PostgreSQL" ? it.live : it.live)(
    "limit 3 of a key holds across 2 stores × 8 concurrent receivers; nothing lost or duplicated",
    () =>
      Effect.scoped(Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const other = yield* otherProcess(backend, prefix)
        const b = yield* other.mailbox()
        yield* admin.setKeySettings("q", "hot", { limit: 3 })
        yield* admin.setKeySettings("q", undefined, { limit: 2 })
        const sent: Array<string> = []
        for (let i = 0; i < 30; i++) sent.push(yield* a.send(`hot${i}`, { key: "hot" }))
        for (let i = 0; i < 20; i++) sent.push(yield* b.send(`cold${i}`, { key: `cold${i % 4}`, priority: i % 3 }))
        for (let i = 0; i < 10; i++) sent.push(yield* a.send(`plain${i}`))
        const live = yield* Ref.make(new Map<string, number>())
        const worst = yield* Ref.make(new Map<string, number>())
        const done = yield* Ref.make(new Set<string>())
        const duplicates = yield* Ref.make(0)
        const worker = (mailbox: Mailbox.Mailbox<string, string>) =>
          Effect.gen(function*() {
            let idle = 0
            while (idle < 40) {
              const got = yield* mailbox.receive({ maxMessages: 2, visibilityTimeout: "30 seconds" })
              if (got.length === 0) {
                idle++
                yield* Effect.sleep("10 millis")
                continue
              }
              idle = 0
              for (const m of got) {
                const key = m.key ?? ""
                const now = yield* Ref.modify(live, (map) => {
                  const next = new Map(map)
                  next.set(key, (next.get(key) ?? 0) + 1)
                  return [next.get(key)!, next]
                })
                yield* Ref.update(worst, (map) => new Map(map).set(key, Math.max(map.get(key) ?? 0, now)))
              }
              yield* Effect.sleep(Duration.millis(5 + Math.floor(Math.random() * 20)))
              for (const m of got) {
                yield* Ref.update(live, (map) => new Map(map).set(m.key ?? "", map.get(m.key ?? "")! - 1))
                const seen = yield* Ref.modify(done, (set) => [set.has(m.id), new Set(set).add(m.id)])
                if (seen) yield* Ref.update(duplicates, (n) => n + 1)
                yield* m.acknowledge
              }
            }
          })
        yield* Effect.all([
          ...Array.from({ length: 8 }, () => worker(a)),
          ...Array.from({ length: 8 }, () => worker(b))
        ], {
          concurrency: "unbounded"
        })
        const peaks = yield* Ref.get(worst)
        expect(peaks.get("hot")! <= 3).toBe(true)
        for (let i = 0; i < 4; i++) expect(peaks.get(`cold${i}`)! <= 2).toBe(true)
        expect(yield* Ref.get(duplicates)).toBe(0)
        expect([...(yield* Ref.get(done))].sort()).toEqual([...sent].sort())
        expect(yield* a.approximateCount).toBe(0)
      })),
    120_000
  )

  it.scoped("limit 1 holds through nack, nack with delay, extend to 0, expiry and a stale handle's ack", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "k", { limit: 1 })
      for (let i = 0; i < 4; i++) yield* mailbox.send(`k${i}`, { key: "k" })
      const take = (visibilityTimeout: Duration.DurationInput = "1 minute") =>
        mailbox.receive({ maxMessages: 10, visibilityTimeout })
      const [first] = yield* take()
      expect(first?.body).toBe("k0")
      expect(yield* take()).toEqual([])
      yield* first!.nack()
      // Given back: it keeps its place.
      const [again] = yield* take()
      expect(again?.body).toBe("k0")
      expect(again?.deliveryCount).toBe(2)
      yield* again!.nack("30 seconds")
      // Parked: it no longer counts, the next one goes.
      const [second] = yield* take()
      expect(second?.body).toBe("k1")
      expect(yield* take()).toEqual([])
      yield* second!.extendVisibility(0)
      // Extended to 0: visible again at once, its lease gone.
      const [third] = yield* take("10 seconds")
      expect(third?.body).toBe("k1")
      expect(yield* take()).toEqual([])
      const stale = Either.isLeft(yield* Effect.either(second!.acknowledge))
      expect(stale).toBe(true)
      yield* TestClock.adjust("10 seconds")
      // Expired: it stops counting, comes back first (k1), then k0 after its delay.
      const [fourth] = yield* take()
      expect(fourth?.body).toBe("k1")
      const late = yield* Effect.either(third!.acknowledge)
      expect(Either.isLeft(late) && late.left._tag).toBe("ReceiptHandleExpiredError")
      expect(yield* take()).toEqual([])
      yield* fourth!.acknowledge
      yield* TestClock.adjust("30 seconds")
      expect(bodies(yield* take())).toEqual(["k0"])
      const state = stateOf(yield* admin.keys("q"), "k")!
      expect([state.inFlight, state.pending, state.ready]).toEqual([1, 3, 2])
    }))

  // BUG (the PostgreSQL soak, CI at 1ccc8f5: four duplicates "with no fault on the holder"): the claim read its time
  // in the statement that waits for the queue's turn and leased from that time, so a claim that waited behind
  // another (one stopped inside its claim holds the turn up to 5 s) handed out leases already spent — the
  // worker's acknowledgement refused, the message claimed again while it ran. On the real clock.
  it.scopedLive(
    "a claim that waited its turn behind another still hands out a whole lease",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        yield* mailbox.send("a", { key: "k" })
        const sql = backend.client()
        const held = yield* Deferred.make<void>()
        // The queue's turn, held 1.5 s by another claimer (its row locked; on SQLite the file's write lock).
        const holder = yield* Effect.fork(sql.withTransaction(Effect.gen(function*() {
          yield* sql`UPDATE ${sql(`${prefix}mailbox_keys`)} SET vtime = vtime WHERE queue = 'q' AND key = ''`
          yield* Deferred.succeed(held, undefined)
          yield* Effect.sleep("1500 millis")
        })))
        yield* Deferred.await(held)
        const [message] = yield* mailbox.receive({ visibilityTimeout: "1 second" })
        yield* Fiber.join(holder)
        expect(message?.body).toBe("a")
        // Nobody else gets it while the lease runs, and its acknowledgement is accepted.
        const other = yield* mailboxOf(backend, prefix)
        expect(yield* other.receive({ visibilityTimeout: "1 second" })).toEqual([])
        yield* message!.acknowledge
      }),
    20_000
  )

  // The claim's largest shape: receivers asking together are served by one claim of up to 1,000 messages, whose
  // walk reads a page of 1,024 keys (on PostgreSQL through the look function, whose emptiness test was
  // quadratic in the page before it was a set difference). Every key is served once, none over its limit.
  it.scoped(
    "one claim of 1,000 over a page of 1,024 keys serves each key once, none over its limit",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        yield* admin.setKeySettings("q", undefined, { limit: 1 })
        const keys = Array.from({ length: 1_100 }, (_, i) => `t${String(i).padStart(4, "0")}`)
        yield* Effect.forEach(keys, (key) =>
          mailbox.send(`${key}#1`, { key }).pipe(
            Effect.zipRight(mailbox.send(`${key}#2`, { key }))
          ), { concurrency: 50, discard: true })
        const got = (yield* Effect.all(
          Array.from({ length: 120 }, () => mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })),
          { concurrency: "unbounded" }
        )).flat()
        expect(got.length).toBe(keys.length)
        expect(new Set(got.map((m) => m.key)).size).toBe(keys.length)
        for (const m of got) expect(m.body).toBe(`${m.key}#1`)
        expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
      }),
    120_000
  )

  it.scoped("a receive with visibilityTimeout 0 does not lift a key over its limit", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "k", { limit: 1 })
      for (let i = 0; i < 3; i++) yield* mailbox.send(`k${i}`, { key: "k" })
      const zero = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: 0 })
      expect(zero.length).toBe(1)
      const after = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(after.length).toBe(1)
      expect(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })).toEqual([])
    }))

  it.scoped("replyAndAcknowledge on a keyed message frees its place and the reply arrives (same store)", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const requests = yield* mailboxOf(backend, prefix, "requests")
      const replies = yield* mailboxOf(backend, prefix, "replies")
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("requests", undefined, { limit: 1 })
      yield* requests.send("r0", { key: "t", replyTo: "replies" })
      yield* requests.send("r1", { key: "t", replyTo: "replies" })
      const [m] = yield* requests.receive({ maxMessages: 10 })
      expect(yield* requests.receive({ maxMessages: 10 })).toEqual([])
      yield* m!.replyAndAcknowledge("answer").pipe(
        Effect.provide(backend.context()),
        Effect.provideServiceEffect(
          Mailbox.MailboxResolver,
          MailboxSql.resolver({ prefix }).pipe(Effect.provide(backend.context()))
        )
      )
      expect(bodies(yield* requests.receive({ maxMessages: 10 }))).toEqual(["r1"])
      const [reply] = yield* replies.receive()
      expect(reply?.body).toBe("answer")
      expect(reply?.key).toBeUndefined()
    }))

  it.scoped("purge with live leases: the old leases stop counting and their handles are stale", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "k", { limit: 1 })
      yield* mailbox.send("k0", { key: "k" })
      yield* mailbox.send("k1", { key: "k" })
      const [old] = yield* mailbox.receive()
      expect(yield* mailbox.purge).toBe(2)
      yield* mailbox.send("k2", { key: "k" })
      expect(bodies(yield* mailbox.receive())).toEqual(["k2"])
      expect(Either.isLeft(yield* Effect.either(old!.acknowledge))).toBe(true)
      expect(Either.isLeft(yield* Effect.either(old!.extendVisibility("1 minute")))).toBe(true)
      const state = stateOf(yield* admin.keys("q"), "k")!
      expect([state.inFlight, state.pending]).toEqual([1, 1])
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Dead letters
  // -------------------------------------------------------------------------------------------------------------

  it.scoped("an undecodable keyed message is dead-lettered and redriven with its key and priority; limits hold", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const writer = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "k", { limit: 1 })
      yield* writer.send("not a number", { key: "k", priority: -7 })
      yield* writer.send("also not", { key: "k", priority: 5 })
      const strict = yield* MailboxSql.make({ name: "q", schema: Schema.NumberFromString, prefix }).pipe(
        Effect.provide(backend.context())
      )
      expect(yield* strict.receive({ maxMessages: 10 })).toEqual([])
      expect(yield* strict.receive({ maxMessages: 10 })).toEqual([])
      const letters = yield* MailboxSqlAdmin.deadLetters({ prefix }).pipe(Effect.provide(backend.context()))
      expect(yield* letters.count({ queue: "q" })).toBe(2)
      expect(yield* letters.redrive({ queue: "q" })).toBe(2)
      const got = yield* writer.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(got.map((m) => [m.body, m.key, m.priority])).toEqual([["not a number", "k", -7]])
      yield* got[0]!.acknowledge
      const next = yield* writer.receive({ maxMessages: 10 })
      expect(next.map((m) => [m.body, m.key, m.priority])).toEqual([["also not", "k", 5]])
    }))

  // BUG: the dead-letter sink (`MailboxSqlAdmin.deadLetters().sink`, where a MainLoop's or MailboxWorker's DLQ
  // policy stores requests that keep failing) takes a `DeadLetter` record, which has no key or priority, and
  // stores neither: a redriven letter comes back unkeyed (no limit, no share, no rate). Expected: the redriven
  // message has the key and priority it was sent with (issue 45: "carried through redrive").
  it.scoped("a keyed message dead-lettered through the sink a worker's policy uses comes back with its key", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      yield* mailbox.send("poison", { key: "tenant", priority: 3 })
      const [m] = yield* mailbox.receive()
      const letters = yield* MailboxSqlAdmin.deadLetters({ prefix }).pipe(Effect.provide(backend.context()))
      const now = yield* DateTime.now
      yield* letters.sink(Schema.String).send({
        messageId: m!.id,
        body: m!.body,
        sourceMailbox: mailbox.name,
        deliveryCount: m!.deliveryCount,
        lastError: "boom",
        lastErrorTag: "Boom",
        enqueuedAt: m!.enqueuedAt,
        deadLetteredAt: now,
        requestId: undefined,
        replyTo: undefined,
        traceId: undefined,
        // As a MainLoop's dead-letter policy writes it (src/internal/loops/requestLoop.ts).
        key: m!.key,
        priority: m!.priority
      })
      yield* m!.acknowledge
      expect(yield* letters.redrive({ queue: "q" })).toBe(1)
      const [back] = yield* mailbox.receive()
      expect([back?.body, back?.key, back?.priority]).toEqual(["poison", "tenant", 3])
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Hostile input
  // -------------------------------------------------------------------------------------------------------------

  it.scoped("keys named like SQL, object properties, 200 characters, unicode are keys like any other", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      const names = [
        "'; DROP TABLE x; --",
        `${prefix}mailbox_keys`,
        "__proto__",
        "constructor",
        "x".repeat(200),
        "日本語-テナント",
        "emoji-😀",
        "a\\b",
        "%_*",
        "\"quoted\"",
        // Through PostgreSQL's claim as JSON (migration 16): text that looks like an escape stays text.
        "\\u0041\\n",
        "{\"key\": null}",
        "\u2028\u2029"
      ]
      for (const key of names) {
        yield* admin.setKeySettings("q", key, { limit: 1 })
        yield* mailbox.send(`${key}#1`, { key })
        yield* mailbox.send(`${key}#2`, { key })
      }
      const got = yield* Effect.map(
        Effect.all(
          Array.from({ length: 5 }, () => mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))
        ),
        (pages) => pages.flat()
      )
      expect(got.map((m) => m.key).sort()).toEqual([...names].sort())
      for (const m of got) expect(m.body).toBe(`${m.key}#1`)
      const keys = yield* admin.keys("q")
      expect(keys.map((k) => [k.key, k.inFlight, k.pending, k.limit]).sort()).toEqual(
        names.map((key) => [key, 1, 2, 1]).sort()
      )
    }))

  it.scoped("a bad key, priority, setting or token count is a typed error naming it, and stores nothing", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      const parameter = (e: Either.Either<unknown, { readonly _tag: string; readonly parameter?: string }>) =>
        Either.isLeft(e) ? `${e.left._tag}:${e.left.parameter}` : "accepted"
      for (const key of ["", "x".repeat(201), "a\u0000b", "\ud800", 42 as unknown as string]) {
        expect(parameter(yield* Effect.either(mailbox.send("x", { key })))).toBe("InvalidParameterError:key")
        expect(parameter(yield* Effect.either(admin.setKeySettings("q", key, { limit: 1 })))).toBe(
          "InvalidParameterError:key"
        )
      }
      for (const priority of [2 ** 31, -(2 ** 31) - 1, 1.5, Number.NaN, Infinity, "1" as unknown as number]) {
        expect(parameter(yield* Effect.either(mailbox.send("x", { key: "k", priority })))).toBe(
          "InvalidParameterError:priority"
        )
      }
      expect(yield* mailbox.approximateCount).toBe(0)
      yield* admin.setKeySettings("q", "k", { limit: 2, weight: 2 })
      const bad: ReadonlyArray<readonly [unknown, string]> = [
        [{ limit: -1 }, "limit"],
        [{ limit: 1.5 }, "limit"],
        [{ limit: Number.NaN }, "limit"],
        [{ limit: 1_000_001 }, "limit"],
        [{ limit: "3" }, "limit"],
        [{ weight: 0 }, "weight"],
        [{ weight: 0.0001 }, "weight"],
        [{ weight: 1001 }, "weight"],
        [{ weight: Infinity }, "weight"],
        [{ weight: Number.NaN }, "weight"],
        [{ starts: { count: -1, per: "1 second" } }, "starts.count"],
        [{ starts: { count: 1.5, per: "1 second" } }, "starts.count"],
        [{ starts: { count: 1, per: "0 millis" } }, "starts.per"],
        [{ starts: { count: 1, per: "2 days" } }, "starts.per"],
        [{ starts: { count: 1, per: "soon" } }, "starts.per"],
        [{ tokens: { count: 1e13, per: "1 minute" } }, "tokens.count"],
        [{ tokens: 5 }, "tokens"],
        [{ limit: 1, weight: -1 }, "weight"]
      ]
      for (const [settings, field] of bad) {
        expect(parameter(yield* Effect.either(admin.setKeySettings("q", "k", settings as never)))).toBe(
          `InvalidParameterError:${field}`
        )
      }
      expect(parameter(yield* Effect.either(admin.setKeySettings("bad queue\u0000", "k", { limit: 1 })))).toBe(
        "InvalidParameterError:queue"
      )
      expect(parameter(yield* Effect.either(admin.setKeySettings("q", "k", null as never)))).toBe(
        "InvalidParameterError:settings"
      )
      yield* mailbox.send("k0", { key: "k" })
      const [state] = yield* admin.keys("q")
      expect([state?.limit, state?.weight]).toEqual([2, 2])
      const [m] = yield* mailbox.receive()
      for (const tokens of [-1, 1.5, Number.NaN, Infinity, Number.MAX_SAFE_INTEGER + 2, "5" as unknown as number]) {
        expect(parameter(yield* Effect.either(Mailbox.chargeTokens(m!, tokens)))).toBe("InvalidParameterError:tokens")
      }
      expect(parameter(yield* Effect.either(Mailbox.chargeTokens(m!, 0)))).toBe("accepted")
    }))

  it.scoped("priorities at ±(2^31 - 1) and -2^31 keep order within a key and on return", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      yield* mailbox.send("max", { key: "k", priority: 2 ** 31 - 1 })
      yield* mailbox.send("zero", { key: "k" })
      yield* mailbox.send("min", { key: "k", priority: -(2 ** 31) })
      yield* mailbox.send("almost-min", { key: "k", priority: -(2 ** 31) + 1 })
      const [first] = yield* mailbox.receive()
      expect([first?.body, first?.priority]).toEqual(["min", -(2 ** 31)])
      yield* first!.nack()
      const all = yield* mailbox.receive({ maxMessages: 10 })
      expect(all.map((m) => [m.body, m.priority])).toEqual([
        ["min", -(2 ** 31)],
        ["almost-min", -(2 ** 31) + 1],
        ["zero", undefined],
        ["max", 2 ** 31 - 1]
      ])
    }))

  it.scoped("a token charge after the fact holds the key until its window turns, even charged after the ack", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* TestClock.adjust("10 minutes")
      yield* admin.setKeySettings("q", "k", { tokens: { count: 100, per: "1 hour" } })
      yield* mailbox.send("k0", { key: "k" })
      const [m] = yield* mailbox.receive()
      yield* m!.acknowledge
      yield* Mailbox.chargeTokens(m!, Number.MAX_SAFE_INTEGER)
      yield* mailbox.send("k1", { key: "k" })
      yield* mailbox.send("other", { key: "o" })
      const [other] = yield* mailbox.receive({ maxMessages: 10 })
      expect(other?.body).toBe("other")
      yield* other!.acknowledge
      yield* TestClock.adjust("50 minutes")
      expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["k1"])
    })) // BUG (PostgreSQL): token charges, each a safe integer (accepted), whose sum passes what BIGINT holds: every
   // later claim of the queue fails (the claim writes the key's tokens_used back as bigint), so no key and no
  // unkeyed message of the queue is received again. Expected: the claim goes on (the key is over its budget, the
  // others flow). SQLite holds.
  ;(backend.label === "PostgreSQL" ? it.scoped : it.scoped)(
    "token charges summing past 2^63 do not wedge the queue's claims",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        yield* admin.setKeySettings("q", "k", { tokens: { count: 100, per: "1 hour" } })
        yield* mailbox.send("k0", { key: "k" })
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
        yield* Effect.all(Array.from({ length: 1100 }, () => Mailbox.chargeTokens(m!, Number.MAX_SAFE_INTEGER)), {
          concurrency: 20,
          discard: true
        })
        yield* mailbox.send("other", { key: "o" })
        yield* mailbox.send("plain")
        const got = yield* Effect.either(mailbox.receive({ maxMessages: 10 }))
        expect(Either.isRight(got) ? bodies(got.right).sort() : got.left.message).toEqual(["other", "plain"])
      }),
    120_000
  ) // BUG (PostgreSQL): a key's mean lease length is an exponential average (a fraction as soon as two leases
   // differ by a length not divisible by 4); the claim charges it up front and casts it to bigint
  // ("invalid input syntax for type bigint: \"1000.25\""), so every claim that picks the key fails with
  // MailboxConnectionError: the whole queue stops (found first by the live two-store test, "160.75").
  // Expected: the key's next message is received. SQLite holds.
  ;(backend.label === "PostgreSQL" ? it.scoped : it.scoped)(
    "a key whose mean lease length is a fraction is still claimed",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        for (const held of [1000, 1001]) {
          yield* mailbox.send(`k${held}`, { key: "k" })
          const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
          yield* TestClock.adjust(held)
          yield* m!.acknowledge
        }
        yield* mailbox.send("next", { key: "k" })
        yield* mailbox.send("plain")
        const got = yield* Effect.either(mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))
        expect(Either.isRight(got) ? bodies(got.right).sort() : got.left.message).toEqual(["next", "plain"])
      })
  )

  // -------------------------------------------------------------------------------------------------------------
  // Mixed traffic, order, progress
  // -------------------------------------------------------------------------------------------------------------

  /** One worker's order: receive one, `tick` of work, acknowledge, until nothing is visible. */
  const drain = (mailbox: Mailbox.Mailbox<string, string>, tick: Duration.DurationInput = "1 second") =>
    Effect.gen(function*() {
      const seen: Array<string> = []
      for (;;) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        if (m === undefined) return seen
        seen.push(m.body)
        yield* TestClock.adjust(tick)
        yield* m.acknowledge
      }
    })

  /** An unkeyed message nacked back in a queue that also has keys: where it goes (memory: behind those waiting). */
  const unkeyedReturn = (mailbox: Mailbox.Mailbox<string, string>) =>
    Effect.gen(function*() {
      yield* mailbox.send("parked", { key: "k", delay: "15 minutes" })
      yield* mailbox.send("u1")
      yield* mailbox.send("u2")
      yield* TestClock.adjust("1 second")
      const [u1] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(u1?.body).toBe("u1")
      yield* u1!.nack()
      return yield* drain(mailbox)
    })

  it.scoped("(memory) an unkeyed message given back in a keyed queue goes behind those waiting", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      expect(yield* unkeyedReturn(mailbox)).toEqual(["u2", "u1"])
    }))

  // A divergence kept on purpose (see scheduling.ts): in a queue scheduled by key, SQL orders unkeyed messages by
  // (priority, first enqueue), so one that comes back keeps its place, as the issue asks of every message;
  // MailboxMemory still puts an unkeyed one behind those waiting, and so does a SQL queue that never used a key.
  it.scoped("an unkeyed message given back in a keyed queue keeps its place (memory: behind)", () =>
    Effect.gen(function*() {
      const mailbox = yield* mailboxOf(backend, freshPrefix())
      expect(yield* unkeyedReturn(mailbox)).toEqual(["u1", "u2"])
    }))

  it.scoped("a queue that never used keys: a nacked message goes behind those waiting, as before", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      yield* mailbox.send("u1")
      yield* mailbox.send("u2")
      yield* TestClock.adjust("1 second")
      const [u1] = yield* mailbox.receive()
      yield* u1!.nack()
      expect(yield* drain(mailbox)).toEqual(["u2", "u1"])
      expect(yield* (yield* adminOf(backend, prefix)).keys("q")).toEqual([])
    }))

  it.scoped("keyed (urgent), keyed (polite), unkeyed (most urgent) in one queue: all progress, nothing lost", () =>
    Effect.gen(function*() {
      const mailbox = yield* mailboxOf(backend, freshPrefix())
      for (let i = 0; i < 30; i++) yield* mailbox.send(`greedy${i}`, { key: "greedy", priority: -(2 ** 31) })
      for (let i = 0; i < 5; i++) yield* mailbox.send(`polite${i}`, { key: "polite" })
      for (let i = 0; i < 5; i++) yield* mailbox.send(`plain${i}`, { priority: -(2 ** 31) })
      const order = yield* drain(mailbox)
      expect(order.length).toBe(40)
      expect(new Set(order).size).toBe(40)
      const firstPolite = order.findIndex((b) => b.startsWith("polite"))
      const lastPolite = order.length - 1 - [...order].reverse().findIndex((b) => b.startsWith("polite"))
      // Equal shares: polite's five go within the first dozen or so, not after greedy's thirty.
      expect(firstPolite).toBeLessThan(3)
      expect(lastPolite).toBeLessThan(16)
      // The unkeyed ones were sent after greedy's and polite's: they meet the fair pick by first enqueue.
      expect(order.filter((b) => b.startsWith("plain"))).toEqual(["plain0", "plain1", "plain2", "plain3", "plain4"])
    }))

  it.scoped(
    "one hot key with 1,000 messages vs 500 cold keys: every cold key gets its turn early",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        yield* Effect.all(Array.from({ length: 1000 }, (_, i) => mailbox.send(`hot${i}`, { key: "hot" })), {
          concurrency: 50,
          discard: true
        })
        yield* Effect.all(
          Array.from({ length: 1000 }, (_, i) => mailbox.send(`cold${i % 500}`, { key: `cold${i % 500}` })),
          { concurrency: 50, discard: true }
        )
        const firstTurn = new Map<string, number>()
        let claims = 0
        for (let round = 0; round < 400; round++) {
          const got = yield* mailbox.receive({ maxMessages: 4, visibilityTimeout: "1 minute" })
          if (got.length === 0) break
          for (const m of got) {
            claims++
            if (!firstTurn.has(m.key!)) firstTurn.set(m.key!, claims)
          }
          yield* TestClock.adjust("1 second")
          for (const m of got) yield* m.acknowledge
        }
        expect(firstTurn.size).toBe(501)
        expect(Math.max(...firstTurn.values())).toBeLessThan(600)
      }),
    300_000
  )

  it.scoped(
    "keys() on a queue with 10,001 keys returns 10,000 (bounded), most pending first",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        yield* Effect.all(Array.from({ length: 10_001 }, (_, i) => mailbox.send(`m${i}`, { key: `k${i}` })), {
          concurrency: 200,
          discard: true
        })
        yield* mailbox.send("extra", { key: "k9999" })
        const keys = yield* admin.keys("q")
        expect(keys.length).toBe(10_000)
        expect([keys[0]?.key, keys[0]?.pending]).toEqual(["k9999", 2])
        // The first claim after 10,001 fresh keys writes 10,001 key rows back: set-based on both databases (on
        // SQLite it was quadratic, ~110 s of synchronous work that stalled the process, until the write-back's
        // array was materialized).
        const got = yield* mailbox.receive({ maxMessages: 10 })
        expect(got.length).toBe(10)
      }),
    300_000
  )

  it.scoped(
    "a first claim after more fresh keys than a statement takes parameters (66,000) claims, and quickly",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const mailbox = yield* mailboxOf(backend, prefix)
        // SQLite takes 32,766 parameters and PostgreSQL 65,535: the claim's ledger names every one of these keys.
        yield* Effect.all(Array.from({ length: 66_000 }, (_, i) => mailbox.send(`m${i}`, { key: `k${i}` })), {
          concurrency: 500,
          discard: true
        })
        const got = yield* mailbox.receive({ maxMessages: 10 })
        expect(got.length).toBe(10)
        expect(new Set(got.map((message) => message.key)).size).toBe(10)
      }),
    300_000
  )

  it.scoped("a key that takes most of a claim among many held keys is read past the claim's first share of it", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      // 40 keys at their limit (1 live lease each, 1 more ready), and one key with 30 ready: a claim of 10 reads a
      // share of each key's ready rows first (2 here), then more of the one key that can take them.
      yield* admin.setKeySettings("q", undefined, { limit: 1 })
      for (let i = 0; i < 40; i++) {
        yield* mailbox.send(`held${i}a`, { key: `held${String(i).padStart(2, "0")}` })
        yield* mailbox.send(`held${i}b`, { key: `held${String(i).padStart(2, "0")}` })
      }
      const leased: Array<string> = []
      while (leased.length < 40) {
        const got = yield* mailbox.receive({ maxMessages: 10, waitTime: 0 })
        expect(got.length).toBeGreaterThan(0)
        leased.push(...bodies(got))
      }
      expect(new Set(leased).size).toBe(40)
      yield* admin.setKeySettings("q", "big", { limit: 100 })
      for (let i = 0; i < 30; i++) yield* mailbox.send(`big${String(i).padStart(2, "0")}`, { key: "big" })
      const first = yield* mailbox.receive({ maxMessages: 10, waitTime: 0 })
      expect(bodies(first)).toEqual(Array.from({ length: 10 }, (_, i) => `big${String(i).padStart(2, "0")}`))
      const second = yield* mailbox.receive({ maxMessages: 10, waitTime: 0 })
      expect(bodies(second)).toEqual(Array.from({ length: 10 }, (_, i) => `big${String(i + 10).padStart(2, "0")}`))
    }))

  it.scoped("keyed and unkeyed messages go by first enqueue across a seq's digit boundary (9 before 10)", () =>
    Effect.gen(function*() {
      // Found by an attack: PostgreSQL's driver gives BIGINT seqs as strings, and the claim compared "9" < "10"
      // as strings (false): an unkeyed message jumped the keyed one sent before it once seqs reached 10.
      const prefix = freshPrefix()
      const filler = yield* mailboxOf(backend, prefix, "filler")
      const mailbox = yield* mailboxOf(backend, prefix)
      for (let i = 0; i < 8; i++) yield* filler.send(`f${i}`)
      yield* mailbox.send("keyed-first", { key: "k" })
      for (let i = 0; i < 5; i++) yield* mailbox.send(`unkeyed${i}`)
      expect(bodies(yield* mailbox.receive({ maxMessages: 1, visibilityTimeout: "1 hour" }))).toEqual(["keyed-first"])
      expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" }))).toEqual(
        Array.from({ length: 5 }, (_, i) => `unkeyed${i}`)
      )
    }))

  it.scoped("at the longest prefix every table and index the mailbox makes keeps its whole name", () =>
    Effect.gen(function*() {
      if (backend.label !== "PostgreSQL") return
      // PostgreSQL cuts names past 63 characters; the prefix rule leaves room for the longest derived name.
      const prefix = `p${"x".repeat(35)}_`
      expect(prefix.length).toBe(37)
      yield* mailboxOf(backend, prefix)
      const sql = backend.client()
      const names = yield* sql<{ name: string }>`SELECT relname AS name FROM pg_class
        WHERE relname LIKE ${`${prefix}%`} AND relkind IN ('r', 'i')`
      expect(names.map((row) => row.name)).toContain(`${prefix}mailbox_messages_leased`)
      for (const { name } of names) expect(name.length, name).toBeLessThanOrEqual(63)
      // A name cut short would end mid-word: each is one the code derives, whole.
      expect(names.some((row) => row.name.endsWith("_lease"))).toBe(false)
    }))

  it.scoped("weights at the extremes (0.001, 1000): a lone key gets every worker; nothing is lost", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "light", { weight: 0.001 })
      yield* admin.setKeySettings("q", "heavy", { weight: 1000 })
      for (let i = 0; i < 10; i++) yield* mailbox.send(`light${i}`, { key: "light" })
      expect((yield* drain(mailbox, "16 seconds")).length).toBe(10)
      for (let i = 0; i < 10; i++) yield* mailbox.send(`light${i}`, { key: "light" })
      for (let i = 0; i < 10; i++) yield* mailbox.send(`heavy${i}`, { key: "heavy" })
      // 16 s per job both times: the keys' mean lease lengths stay whole (see the fraction bug on PostgreSQL).
      const order = yield* drain(mailbox, "16 seconds")
      expect(order.length).toBe(20)
      expect(order.slice(0, 10).every((b) => b.startsWith("heavy")) || order[0]!.startsWith("light")).toBe(true)
      for (const key of yield* admin.keys("q")) expect(Number.isFinite(key.vtime)).toBe(true)
    }))

  it.scoped("a clock a day ahead: expired leases stop counting and every start window turns", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", undefined, { limit: 1, starts: { count: 1, per: "1 hour" } })
      yield* mailbox.send("a1", { key: "a" })
      yield* mailbox.send("a2", { key: "a" })
      yield* mailbox.send("b1", { key: "b" })
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })).length).toBe(2)
      expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
      yield* TestClock.adjust("1 day")
      const again = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
      expect(bodies(again).sort()).toEqual(["a1", "b1"])
      expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
    }))

  /** A keyed lease (limit 1) held 500 s by 100 extensions, looked at by a claim every 10th; then acknowledged. */
  const extendedLease = (
    mailbox: Mailbox.Mailbox<string, string>,
    setLimit: Effect.Effect<void, unknown>
  ) =>
    Effect.gen(function*() {
      yield* setLimit
      yield* mailbox.send("long", { key: "k" })
      yield* mailbox.send("next", { key: "k" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "10 seconds" })
      for (let i = 0; i < 100; i++) {
        yield* TestClock.adjust("5 seconds")
        yield* m!.extendVisibility("10 seconds")
        if (i % 10 === 0) expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
      }
      yield* m!.acknowledge
    })

  it.scoped("a keyed lease extended 100 times keeps its place at the limit; the next goes after its ack", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* extendedLease(mailbox, admin.setKeySettings("q", "k", { limit: 1 }))
      expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["next"])
    }))

  it.scoped("(memory) after a lease held 500 s is acknowledged, keys() says the key leased 500 s", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      yield* extendedLease(mailbox, MailboxMemory.setKeySettings(mailbox, "k", { limit: 1 }))
      expect(stateOf(yield* MailboxMemory.keys(mailbox), "k")?.leasedMillis).toBe(500_000)
    }))

  // BUG: `keys()` reads the keys' rows without folding the ledger of charges (only a claim folds it), so what the
  // operator sees is stale until the queue's next claim: after a lease held 500 s by extensions is acknowledged,
  // the key shows 910 s leased (the up-front charge of the last folded extension, twice its age then), and its
  // share clock likewise. Expected: 500,000 ms, as MailboxMemory says.
  it.scoped("after a lease held 500 s is acknowledged, keys() says the key leased 500 s", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* extendedLease(mailbox, admin.setKeySettings("q", "k", { limit: 1 }))
      expect(stateOf(yield* admin.keys("q"), "k")?.leasedMillis).toBe(500_000)
    }))

  it.scoped("settings changed mid-run take effect at the next claim; a key's null falls back to the default", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const mailbox = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      yield* admin.setKeySettings("q", "k", { limit: 2 })
      for (let i = 0; i < 6; i++) yield* mailbox.send(`k${i}`, { key: "k" })
      const two = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(two.length).toBe(2)
      yield* admin.setKeySettings("q", "k", { limit: 1 })
      yield* two[0]!.acknowledge
      expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
      yield* two[1]!.acknowledge
      const [third] = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(third?.body).toBe("k2")
      yield* third!.acknowledge
      yield* admin.setKeySettings("q", undefined, { limit: 0 })
      yield* admin.setKeySettings("q", "k", { limit: null })
      expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
      expect(stateOf(yield* admin.keys("q"), "k")?.limit).toBe(0)
      yield* admin.setKeySettings("q", undefined, { limit: null })
      expect((yield* mailbox.receive({ maxMessages: 10 })).length).toBe(3)
      expect(stateOf(yield* admin.keys("q"), "k")?.limit).toBeUndefined()
    }))

  // -------------------------------------------------------------------------------------------------------------
  // Two stores, under TestClock (leases settled at once: whole mean lengths)
  // -------------------------------------------------------------------------------------------------------------

  it.scoped(
    "limit 2 holds across two stores × 6 concurrent receivers each (TestClock, instant settles)",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const other = yield* otherProcess(backend, prefix)
        const b = yield* other.mailbox()
        yield* admin.setKeySettings("q", undefined, { limit: 2 })
        const sent = new Set<string>()
        for (let i = 0; i < 40; i++) sent.add(yield* (i % 2 === 0 ? a : b).send(`m${i}`, { key: `k${i % 3}` }))
        const live = new Map<string, number>()
        let peak = 0
        const seen = new Set<string>()
        let duplicates = 0
        const worker = (mailbox: Mailbox.Mailbox<string, string>) =>
          Effect.gen(function*() {
            for (let idle = 0; idle < 5;) {
              const got = yield* mailbox.receive({ maxMessages: 3, visibilityTimeout: "1 minute" })
              if (got.length === 0) {
                idle++
                yield* Effect.yieldNow()
                continue
              }
              for (const m of got) {
                live.set(m.key!, (live.get(m.key!) ?? 0) + 1)
                peak = Math.max(peak, live.get(m.key!)!)
                if (seen.has(m.id)) duplicates++
                seen.add(m.id)
              }
              yield* Effect.yieldNow()
              for (const m of got) {
                live.set(m.key!, live.get(m.key!)! - 1)
                yield* m.acknowledge
              }
            }
          })
        yield* Effect.all([
          ...Array.from({ length: 6 }, () => worker(a)),
          ...Array.from({ length: 6 }, () => worker(b))
        ], {
          concurrency: "unbounded"
        })
        expect(peak).toBeLessThanOrEqual(2)
        expect(duplicates).toBe(0)
        expect(yield* a.approximateCount).toBe(0)
        expect(seen).toEqual(sent)
      }),
    120_000
  )

  it.scoped("a start rate holds across two stores claiming concurrently", () =>
    Effect.gen(function*() {
      const prefix = freshPrefix()
      const a = yield* mailboxOf(backend, prefix)
      const admin = yield* adminOf(backend, prefix)
      const other = yield* otherProcess(backend, prefix)
      const b = yield* other.mailbox()
      yield* TestClock.adjust("2 hours")
      yield* admin.setKeySettings("q", "k", { starts: { count: 5, per: "1 hour" } })
      for (let i = 0; i < 20; i++) yield* a.send(`k${i}`, { key: "k" })
      const got = yield* Effect.all(
        Array.from({ length: 10 }, (_, i) =>
          (i % 2 === 0 ? a : b).receive({ maxMessages: 3, visibilityTimeout: "5 minutes" })),
        { concurrency: "unbounded" }
      )
      expect(got.flat().length).toBe(5)
      yield* TestClock.adjust("1 hour")
      const next = yield* Effect.all(
        Array.from({ length: 10 }, (_, i) =>
          (i % 2 === 0 ? a : b).receive({ maxMessages: 3, visibilityTimeout: "5 minutes" })),
        { concurrency: "unbounded" }
      )
      // The first five ran out (5 minutes) and come back first; five starts again.
      expect(next.flat().length).toBe(5)
      expect(bodies(next.flat()).sort()).toEqual(bodies(got.flat()).sort())
    }), 60_000)

  it.scoped(
    "a paused keyed queue gives nothing to any store; resumed, the limits still hold",
    () =>
      Effect.gen(function*() {
        const prefix = freshPrefix()
        const a = yield* mailboxOf(backend, prefix)
        const admin = yield* adminOf(backend, prefix)
        const other = yield* otherProcess(backend, prefix)
        const b = yield* other.mailbox()
        yield* admin.setKeySettings("q", "k", { limit: 1 })
        for (let i = 0; i < 3; i++) yield* a.send(`k${i}`, { key: "k" })
        yield* a.send("plain")
        yield* admin.pause("q")
        expect(yield* a.receive({ maxMessages: 10 })).toEqual([])
        expect(yield* b.receive({ maxMessages: 10 })).toEqual([])
        yield* admin.resume("q")
        const got = [...(yield* b.receive({ maxMessages: 10 })), ...(yield* a.receive({ maxMessages: 10 }))]
        expect(bodies(got).sort()).toEqual(["k0", "plain"])
      }),
    60_000
  )

  /** Key "a" once settled at once (a 0 ms lease), then "a" and "b" with ten jobs each: the first batch of ten. */
  const instantHistory = (mailbox: Mailbox.Mailbox<string, string>) =>
    Effect.gen(function*() {
      yield* mailbox.send("a-history", { key: "a" })
      const [h] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      yield* h!.acknowledge
      for (let i = 0; i < 10; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      for (let i = 0; i < 10; i++) yield* mailbox.send(`b${i}`, { key: "b" })
      const batch = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      return batch.filter((m) => m.key === "b").length
    })

  it.scoped("(memory) a key once settled at once does not take every worker of the next batch", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      expect(yield* instantHistory(mailbox)).toBeGreaterThanOrEqual(4)
    }))

  // BUG: a key's first settled lease sets its mean lease length outright (0 ms for a lease settled at once), and
  // the claim then charges that key nothing up front: a batch of ten goes nine to it, one to a key with as much
  // ready work (MailboxMemory fixed this — "a key's mean lease starts at the visibility" — and gives 5 / 5).
  // Expected: at least 4 of the 10 to "b".
  it.scoped("a key once settled at once does not take every worker of the next batch", () =>
    Effect.gen(function*() {
      const mailbox = yield* mailboxOf(backend, freshPrefix())
      expect(yield* instantHistory(mailbox)).toBeGreaterThanOrEqual(4)
    }))
})
