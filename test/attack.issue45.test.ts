/**
 * Attacks on what issue 45 has added so far (keys, priorities, limits, shares and rates in `MailboxMemory`;
 * key and priority on every `send`): a hostile sender's key names and priorities, an operator's settings, a
 * clock that jumps — and the SQL backends, which do not store keys yet, refusing them rather than dropping them.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Schema, TestClock } from "effect"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
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
  it.effect("a key or a priority is refused, typed and naming it, until the SQL store keeps them; nothing is stored", () =>
    Effect.scoped(Effect.gen(function*() {
      const mailbox = yield* MailboxSql.make({ name: "keyed", schema: Schema.String, prefix: "a45_" }).pipe(
        Effect.provide(backend.context())
      )
      const keyed = yield* Effect.either(mailbox.send("x", { key: "tenant" }))
      expect(Either.isLeft(keyed) && keyed.left._tag === "InvalidParameterError" && keyed.left.parameter).toBe("key")
      const urgent = yield* Effect.either(mailbox.send("x", { priority: 1 }))
      expect(Either.isLeft(urgent) && urgent.left._tag === "InvalidParameterError" && urgent.left.parameter).toBe(
        "priority"
      )
      expect(yield* mailbox.approximateCount).toBe(0)
      yield* mailbox.send("plain")
      expect(yield* mailbox.approximateCount).toBe(1)
    })))
})
