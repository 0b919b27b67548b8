/**
 * Attacks on what issue 45 has added so far (keys, priorities, limits, shares and rates in `MailboxMemory`;
 * key and priority on every `send`): a hostile sender's key names and priorities, an operator's settings, a
 * clock that jumps — and on the SQL backends: hostile key names, a second store noticing keys, bad settings.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Schema, TestClock } from "effect"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { sqlBackends } from "./support/sqlBackends.js"

const backends = sqlBackends("attack45")

describe("issue 45 attacks: memory", () => {
  it.scoped("a key named like an object's own properties is a key like any other", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      for (const key of ["__proto__", "constructor", "hasOwnProperty", "toString"]) {
        yield* MailboxMemory.setKeySettings(mailbox, key, { limit: 1 })
        yield* mailbox.send(key, { key })
        yield* mailbox.send(key, { key })
      }
      const received = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(received.map((m) => m.body).sort()).toEqual(["__proto__", "constructor", "hasOwnProperty", "toString"])
      expect((yield* MailboxMemory.keys(mailbox)).map((k) => [k.key, k.inFlight, k.pending])).toEqual([
        ["__proto__", 1, 2],
        ["constructor", 1, 2],
        ["hasOwnProperty", 1, 2],
        ["toString", 1, 2]
      ])
    }))

  it.scoped("the most urgent priority does not let a sender jump another key's fair share", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      for (let i = 0; i < 5; i++) yield* mailbox.send("greedy", { key: "greedy", priority: -(2 ** 31) })
      for (let i = 0; i < 5; i++) yield* mailbox.send("polite", { key: "polite" })
      const order: Array<string> = []
      for (let i = 0; i < 6; i++) {
        const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        order.push(message!.body)
        yield* TestClock.adjust("10 seconds")
        yield* message!.acknowledge
      }
      expect(order.filter((body) => body === "polite").length).toBe(3)
    }))

  it.scoped("a clock that jumps a day ahead: expired leases stop counting, every key is served again", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { limit: 1, starts: { count: 1, per: "1 hour" } })
      yield* mailbox.send("a1", { key: "a" })
      yield* mailbox.send("a2", { key: "a" })
      yield* mailbox.send("b1", { key: "b" })
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })).length).toBe(2)
      yield* TestClock.adjust("1 day")
      const again = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
      // Each key's lease ran out (it comes back first) and its start window turned: one each.
      expect(again.map((m) => m.body).sort()).toEqual(["a1", "b1"])
    }))

  it.scoped("settings and token charges of a message without a key, or of a mailbox not built here, do nothing", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "q" })
      yield* mailbox.send("plain")
      const [message] = yield* mailbox.receive()
      yield* Mailbox.chargeTokens(message!, 1_000_000)
      const wrapper = { ...mailbox }
      yield* MailboxMemory.setKeySettings(wrapper, "k", { limit: 0 })
      expect(yield* MailboxMemory.keys(wrapper)).toEqual([])
      const huge = yield* Effect.either(Mailbox.chargeTokens(message!, Number.MAX_SAFE_INTEGER + 2))
      expect(Either.isLeft(huge) && huge.left._tag).toBe("InvalidParameterError")
    }))
})

describe.each(backends)("issue 45 attacks: $label", (backend) => {
  let prefixes = 0
  const fresh = () => `a45_${++prefixes}_`

  it.effect("hostile key names are stored and come back as sent: SQL, __proto__, unicode, 200 characters", () =>
    Effect.scoped(Effect.gen(function*() {
      const prefix = fresh()
      const mailbox = yield* MailboxSql.make({ name: "keyed", schema: Schema.String, prefix }).pipe(
        Effect.provide(backend.context())
      )
      const names = [
        "'; DROP TABLE leasehold_mailbox_keys; --",
        "__proto__",
        "constructor",
        "日本語 🎉",
        "k".repeat(200)
      ]
      for (const key of names) yield* mailbox.send(key, { key })
      const received = yield* mailbox.receive({ maxMessages: 10 })
      expect(received.map((m) => m.key).sort()).toEqual([...names].sort())
      expect(received.every((m) => m.body === m.key)).toBe(true)
      const admin = yield* MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(backend.context()))
      expect((yield* admin.keys("keyed")).map((k) => k.key).sort()).toEqual([...names].sort())
      for (const m of received) yield* m.acknowledge
      expect(yield* admin.keys("keyed")).toEqual([])
    })))

  it.effect("a store that only ever saw plain traffic notices another store's keyed send: its claims keep the limit", () =>
    Effect.scoped(Effect.gen(function*() {
      const prefix = fresh()
      // Two layers on one database: two stores, as two processes have.
      const other = yield* Layer.build(
        backend.label === "SQLite"
          ? MailboxSql.layerSqlite({ filename: backend.db() })
          : MailboxSql.layerPg({ url: backend.db() })
      )
      const plain = yield* MailboxSql.make({ name: "mixed", schema: Schema.String, prefix }).pipe(
        Effect.provide(backend.context())
      )
      yield* plain.send("u1")
      const [first] = yield* plain.receive()
      expect(first!.body).toBe("u1")
      yield* first!.acknowledge
      const sender = yield* MailboxSql.make({ name: "mixed", schema: Schema.String, prefix }).pipe(
        Effect.provide(other)
      )
      const admin = yield* MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(other))
      yield* admin.setKeySettings("mixed", "t", { limit: 1 })
      for (let i = 0; i < 3; i++) yield* sender.send(`t${i}`, { key: "t" })
      const got = yield* plain.receive({ maxMessages: 10 })
      expect(got.map((m) => m.body)).toEqual(["t0"])
      expect(yield* plain.receive({ maxMessages: 10 })).toEqual([])
      yield* got[0]!.acknowledge
      expect((yield* plain.receive({ maxMessages: 10 })).map((m) => m.body)).toEqual(["t1"])
    })))

  it.effect("bad settings through the admin are refused naming the field, and nothing is stored", () =>
    Effect.scoped(Effect.gen(function*() {
      const prefix = fresh()
      const mailbox = yield* MailboxSql.make({ name: "q", schema: Schema.String, prefix }).pipe(
        Effect.provide(backend.context())
      )
      const admin = yield* MailboxSqlAdmin.queues({ prefix }).pipe(Effect.provide(backend.context()))
      const bad: ReadonlyArray<[string, string | undefined, Record<string, unknown>]> = [
        ["limit", "k", { limit: -1 }],
        ["limit", "k", { limit: 1.5 }],
        ["weight", undefined, { weight: 0 }],
        ["key", "a\nb", { limit: 1 }],
        ["key", "", { limit: 1 }]
      ]
      for (const [field, key, settings] of bad) {
        const refused = yield* Effect.either(admin.setKeySettings("q", key, settings))
        expect(Either.isLeft(refused) && refused.left._tag).toBe("InvalidParameterError")
        if (Either.isLeft(refused) && refused.left._tag === "InvalidParameterError") {
          expect(refused.left.parameter).toContain(field)
        }
      }
      const badQueue = yield* Effect.either(admin.setKeySettings("bad\u0000queue", "k", { limit: 1 }))
      expect(Either.isLeft(badQueue) && badQueue.left._tag).toBe("InvalidParameterError")
      // Nothing was stored: the queue is still plain, its messages flow in send order.
      yield* mailbox.send("a")
      yield* mailbox.send("b")
      expect((yield* mailbox.receive({ maxMessages: 2 })).map((m) => m.body)).toEqual(["a", "b"])
    })))
})
