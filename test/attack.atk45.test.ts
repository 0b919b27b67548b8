/**
 * Attacks (atk45) on the in-memory mailbox's scheduling by key, through the public API only: limits through
 * every path a lease can end by, counts after each operation, rates on a jumping clock, token charges after the
 * fact, a long poll a freed limit must wake, priorities at the bounds, and 10,000 keys.
 *
 * Tests named "was a bug" / "was a spec hole" failed when written (an idle key forgot its rate windows, a weight
 * changed mid-lease corrupted the share clock, one instant settle made a key look free, a long nack delay banked
 * credit, a rate of 0 held only in the first window, an urgent unkeyed stream starved every key, a clock set back
 * gave a second start) and hold since.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, TestClock } from "effect"
import * as Mailbox from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"

const fresh = () => MailboxMemory.make<string, string>({ name: "q" })

const counts = (mailbox: Mailbox.Mailbox<string, string>) =>
  Effect.map(MailboxMemory.keys(mailbox), (ks) => ks.map((k) => [k.key, k.ready, k.inFlight, k.pending]))

describe("atk45: rates", () => {
  it.scoped("was a bug: a start rate is bypassed by a key that goes idle between its messages", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { starts: { count: 1, per: "1 hour" } })
      const starts: Array<string> = []
      for (let i = 0; i < 3; i++) {
        yield* mailbox.send(`a${i}`, { key: "a" })
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        if (m !== undefined) {
          starts.push(m.body)
          yield* m.acknowledge
        }
        yield* TestClock.adjust("1 second")
      }
      // At most 1 start per hour: three starts within 3 seconds break the rate.
      expect(starts).toEqual(["a0"])
    }))

  it.scoped("was a bug: a token budget is forgotten when the key goes idle (charge after ack is dropped)", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { tokens: { count: 100, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      yield* m!.acknowledge
      // The agent path charges a turn's usage after the fact.
      yield* Mailbox.chargeTokens(m!, 1_000_000)
      yield* mailbox.send("a1", { key: "a" })
      const again = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      // 1,000,000 tokens against a budget of 100 per hour: the key must wait for its next window.
      expect(again.map((x) => x.body)).toEqual([])
    }))

  it.scoped("was a bug: a token budget is forgotten when the key goes idle (charged before ack)", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { tokens: { count: 100, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      yield* Mailbox.chargeTokens(m!, 1_000_000)
      expect((yield* MailboxMemory.keys(mailbox))[0]!.tokens?.used).toBe(1_000_000)
      yield* m!.acknowledge
      yield* mailbox.send("a1", { key: "a" })
      expect((yield* MailboxMemory.keys(mailbox))[0]!.tokens?.used).toBe(1_000_000)
      const again = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(again.map((x) => x.body)).toEqual([])
    }))

  it.scoped("was a bug: a start rate of count 0 holds the key only in the first window (clock at 0)", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* TestClock.adjust("90 minutes")
      yield* MailboxMemory.setKeySettings(mailbox, "a", { starts: { count: 0, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      const got = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(got.map((x) => x.body)).toEqual([])
    }))

  it.scoped("was a bug: a token budget of count 0 does not hold the key", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* TestClock.adjust("90 minutes")
      yield* MailboxMemory.setKeySettings(mailbox, "a", { tokens: { count: 0, per: "1 hour" } })
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(got.map((x) => x.body)).toEqual([])
    }))

  it.scoped("a start rate holds across a clock that jumps; the window turns exactly on its boundary", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { starts: { count: 2, per: "1 minute" } })
      for (let i = 0; i < 10; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })).length).toBe(2)
      yield* TestClock.adjust("59999 millis")
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })).length).toBe(0)
      yield* TestClock.adjust("1 millis")
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })).length).toBe(2)
      yield* TestClock.adjust("3 days")
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })).length).toBe(2)
      const [a] = yield* MailboxMemory.keys(mailbox)
      expect(a!.starts?.used).toBe(2)
    }))

  it.scoped("a long poll on a key held by its token budget wakes when the window turns", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { tokens: { count: 10, per: "1 minute" } })
      yield* TestClock.adjust("50 seconds")
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      yield* Mailbox.chargeTokens(m!, 50)
      const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds", visibilityTimeout: "1 hour" }))
      yield* TestClock.adjust("1 second")
      yield* TestClock.adjust("60 seconds")
      const got = yield* Fiber.join(waiting)
      expect(got.map((x) => x.body)).toEqual(["a1"])
    }))
})

describe("atk45: fair shares", () => {
  it.scoped("was a bug: a weight lowered while a lease runs refunds at the new weight; the key then starves others", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { weight: 1000 })
      for (let i = 0; i < 200; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      for (let i = 0; i < 200; i++) yield* mailbox.send(`b${i}`, { key: "b" })
      // a is claimed (charged 60000 ms / 1000), then its weight drops: the refund is at the new weight.
      const [first] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(first!.body).toBe("a0")
      yield* MailboxMemory.setKeySettings(mailbox, "a", { weight: 0.001 })
      yield* first!.acknowledge
      const state = (yield* MailboxMemory.keys(mailbox)).find((k) => k.key === "a")!
      const order: Array<string> = []
      for (let i = 0; i < 20; i++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        order.push(m!.body)
        yield* TestClock.adjust("1 second")
        yield* m!.acknowledge
      }
      // a now weighs 0.001, b 1: b must get nearly all of them; a held a worker 0 ms, so it is owed nothing.
      expect({ bServed: order.filter((b) => b.startsWith("b")).length, aVtime: state.vtime }).toEqual({
        bServed: expect.toSatisfy((n: number) => n > 10),
        aVtime: expect.toSatisfy((v: number) => v >= 0)
      })
    }))

  it.scoped("was a bug: a weight raised while a lease runs leaves the key's charge at the old weight; it starves", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { weight: 0.001 })
      for (let i = 0; i < 50; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      for (let i = 0; i < 50; i++) yield* mailbox.send(`b${i}`, { key: "b" })
      const [first] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(first!.body).toBe("a0")
      // Charged 60,000 ms / 0.001 up front; the operator now gives a the most weight, and a settles at once.
      yield* MailboxMemory.setKeySettings(mailbox, "a", { weight: 1000 })
      yield* first!.acknowledge
      const order: Array<string> = []
      for (let i = 0; i < 40; i++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        order.push(m!.body)
        yield* TestClock.adjust("1 second")
        yield* m!.acknowledge
      }
      const a = (yield* MailboxMemory.keys(mailbox)).find((k) => k.key === "a")!
      // a weighs 1000 and held a worker 0 ms: it should get most; it gets none (b needs ~16 h of worker time).
      expect({ aServed: order.filter((b) => b.startsWith("a")).length, aVtime: a.vtime }).toEqual({
        aServed: expect.toSatisfy((n: number) => n > 20),
        aVtime: expect.toSatisfy((v: number) => v < 60_000)
      })
    }))

  it.scoped("was a spec hole: an urgent unkeyed stream starves every key (the fleet is jumped by priority)", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* mailbox.send("keyed", { key: "a" })
      const order: Array<string> = []
      for (let i = 0; i < 50; i++) {
        yield* mailbox.send(`u${i}`, { priority: -1 })
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
        order.push(m!.body)
        yield* m!.acknowledge
      }
      expect(order).toContain("keyed")
    }))

  it.scoped("a key held at limit 1 with long leases is served (its share is by worker time) among 50 short keys", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "slow", { limit: 1 })
      for (let i = 0; i < 5; i++) yield* mailbox.send(`slow${i}`, { key: "slow" })
      for (let k = 0; k < 50; k++) for (let i = 0; i < 5; i++) yield* mailbox.send(`f${k}-${i}`, { key: `f${k}` })
      let slowServed = 0
      for (let step = 0; step < 200; step++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "10 minutes" })
        if (m === undefined) break
        if (m.key === "slow") slowServed++
        yield* TestClock.adjust(m.key === "slow" ? "1 minute" : "1 second")
        yield* m.acknowledge
      }
      // One minute of worker time against 50 keys' one second each: one claim in 200 is its fair share.
      expect(slowServed).toBeGreaterThanOrEqual(1)
    }))

  it.scoped("a new key is served at the next free worker even after a heavy key ran for a day", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      for (let i = 0; i < 100; i++) yield* mailbox.send(`h${i}`, { key: "heavy" })
      for (let i = 0; i < 50; i++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
        yield* TestClock.adjust("30 minutes")
        yield* m!.acknowledge
      }
      yield* mailbox.send("new", { key: "newcomer" })
      const [next] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      expect(next!.body).toBe("new")
    }))
})

describe("atk45: fair shares (2)", () => {
  it.scoped("was a bug: a key whose lease was settled at once is charged nothing up front and takes every worker", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* mailbox.send("a-probe", { key: "a" })
      yield* mailbox.send("a-keep", { key: "a" })
      const [probe] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      yield* probe!.acknowledge // held 0 ms: the key's mean lease is now 0
      for (let i = 0; i < 10; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      for (let i = 0; i < 10; i++) yield* mailbox.send(`b${i}`, { key: "b" })
      // ten workers, one receive each
      const taken: Array<string> = []
      for (let w = 0; w < 10; w++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
        taken.push(m!.key!)
      }
      // a's next runs take an hour each; b got no worker at all.
      expect(taken.filter((k) => k === "b").length).toBeGreaterThanOrEqual(4)
    }))

  it.scoped("was a bug: a message parked by a long nack delay keeps its key 'active' and banks credit; the key then starves others", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      // a parks one message for 12 hours (a nack with a delay): a stays "active" at share clock ~0, no ready work.
      yield* mailbox.send("a-parked", { key: "a" })
      const [parked] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      yield* parked!.nack("12 hours")
      for (let i = 0; i < 200; i++) yield* mailbox.send(`b${i}`, { key: "b" })
      // b alone runs 60 ten-minute jobs (10 h of worker time).
      for (let i = 0; i < 60; i++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
        expect(m!.key).toBe("b")
        yield* TestClock.adjust("10 minutes")
        yield* m!.acknowledge
      }
      // a now sends a burst of ten-minute jobs: it should share the worker with b, not own it.
      for (let i = 0; i < 50; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      const order: Array<string> = []
      for (let i = 0; i < 20; i++) {
        const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
        order.push(m!.key!)
        yield* TestClock.adjust("10 minutes")
        yield* m!.acknowledge
      }
      expect(order.filter((k) => k === "b").length).toBeGreaterThanOrEqual(5)
    }))

  it.scoped("a key blocked by a start rate wakes a long poll when its window turns", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { starts: { count: 1, per: "10 seconds" } })
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })).length).toBe(1)
      const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds", visibilityTimeout: "1 hour" }))
      yield* TestClock.adjust("1 second")
      yield* TestClock.adjust("10 seconds")
      expect((yield* Fiber.join(waiting)).map((m) => m.body)).toEqual(["a1"])
    }))

  it.scoped("was a bug: a clock set back inside a start window hands out a second start", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* TestClock.setTime(2 * 3_600_000 + 60_000)
      yield* MailboxMemory.setKeySettings(mailbox, "a", { starts: { count: 1, per: "1 hour" } })
      for (let i = 0; i < 3; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "12 hours" })).length).toBe(1)
      yield* TestClock.setTime(2 * 3_600_000 - 60_000)
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "12 hours" })).length).toBe(0)
    }))
})

describe("atk45: limits", () => {
  const overLimit = (mailbox: Mailbox.Mailbox<string, string>, limit: number) =>
    Effect.map(MailboxMemory.keys(mailbox), (ks) => ks.filter((k) => k.inFlight > limit))

  it.scoped("limit 1 holds through nack, nack with delay, extend to 0, expiry + stale ack, and redelivery", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 1 })
      for (let i = 0; i < 6; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      const check = Effect.gen(function*() {
        expect(yield* overLimit(mailbox, 1)).toEqual([])
      })
      // nack
      let [m] = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })
      expect((yield* mailbox.receive({ maxMessages: 5 })).length).toBe(0)
      yield* m!.nack()
      yield* check // nack with delay
      ;[m] = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })
      yield* m!.nack("10 seconds")
      const [m2] = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })
      expect(m2).toBeDefined()
      yield* TestClock.adjust("11 seconds")
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })).length).toBe(0)
      yield* check
      // extend to 0
      yield* m2!.extendVisibility(0)
      const got = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })
      expect(got.length).toBe(1)
      yield* check
      // the extended-to-0 handle is dead
      expect(Either.isLeft(yield* Effect.either(m2!.acknowledge))).toBe(true)
      yield* check
      // expiry, then the stale handle acknowledges (must fail), then another claim
      const holder = got[0]!
      yield* TestClock.adjust("61 seconds")
      const after = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })
      expect(after.length).toBe(1)
      expect(Either.isLeft(yield* Effect.either(holder.acknowledge))).toBe(true)
      expect(Either.isLeft(yield* Effect.either(holder.nack()))).toBe(true)
      expect(Either.isLeft(yield* Effect.either(holder.extendVisibility("1 hour")))).toBe(true)
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 minute" })).length).toBe(0)
      yield* check
      expect((yield* counts(mailbox))[0]).toEqual(["a", 5, 1, 6])
    }))

  it.scoped("a receive with visibilityTimeout 0 does not let a limited key exceed its limit", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 1 })
      for (let i = 0; i < 5; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      const got = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: 0 })
      expect(got.length).toBeLessThanOrEqual(1)
      const ks = yield* MailboxMemory.keys(mailbox)
      expect(ks[0]!.inFlight).toBeLessThanOrEqual(1)
    }))

  it.scoped("lowering a limit mid-flight, then the default vs the key's own, then null clearing", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      for (let i = 0; i < 10; i++) yield* mailbox.send(`a${i}`, { key: "a" })
      const first = yield* mailbox.receive({ maxMessages: 3, visibilityTimeout: "1 hour" })
      expect(first.length).toBe(3)
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { limit: 2 })
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })).length).toBe(0)
      yield* first[0]!.acknowledge
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })).length).toBe(0)
      yield* first[1]!.acknowledge
      const one = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })
      expect(one.length).toBe(1)
      // the key's own limit 0 beats the default
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 0 })
      yield* first[2]!.acknowledge
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })).length).toBe(0)
      expect((yield* MailboxMemory.keys(mailbox))[0]!.limit).toBe(0)
      // null clears the key's own: the default (2) applies again
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: null })
      expect((yield* MailboxMemory.keys(mailbox))[0]!.limit).toBe(2)
      expect((yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })).length).toBe(1)
      // null clears the default: unlimited
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { limit: null })
      expect((yield* MailboxMemory.keys(mailbox))[0]!.limit).toBeUndefined()
      expect((yield* mailbox.receive({ maxMessages: 50, visibilityTimeout: "1 hour" })).length).toBe(5)
    }))

  it.scoped("purge with live leases, then sends: the old leases neither count nor settle", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 1 })
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      const [old] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      expect(yield* mailbox.purge).toBe(2)
      expect(yield* MailboxMemory.keys(mailbox)).toEqual([])
      yield* mailbox.send("b0", { key: "a" })
      yield* mailbox.send("b1", { key: "a" })
      expect(Either.isLeft(yield* Effect.either(old!.acknowledge))).toBe(true)
      expect(yield* counts(mailbox)).toEqual([["a", 2, 0, 2]])
      const got = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "1 hour" })
      expect(got.map((m) => m.body)).toEqual(["b0"])
      expect(yield* counts(mailbox)).toEqual([["a", 1, 1, 2]])
      expect(yield* mailbox.approximateCount).toBe(2)
    }))

  it.scoped("a long poll wakes when a limited key's lease is acknowledged (limit from the defaults)", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { limit: 1 })
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds", visibilityTimeout: "1 hour" }))
      yield* TestClock.adjust("1 second")
      yield* m!.acknowledge
      yield* TestClock.adjust("1 second")
      const got = yield* Fiber.join(waiting)
      expect(got.map((x) => x.body)).toEqual(["a1"])
    }))

  it.scoped("a long poll wakes when a limited key's lease is nacked with a delay, and when it expires", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 1 })
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a" })
      const [m] = yield* mailbox.receive({ visibilityTimeout: "1 hour" })
      const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds", visibilityTimeout: "10 seconds" }))
      yield* TestClock.adjust("1 second")
      yield* m!.nack("1 hour")
      yield* TestClock.adjust("1 second")
      const got = yield* Fiber.join(waiting)
      expect(got.map((x) => x.body)).toEqual(["a1"])
      // a1 held by a lease of 10 s: a waiting receive gets nothing else until it runs out, then a1 again.
      const waiting2 = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds", visibilityTimeout: "1 hour" }))
      yield* TestClock.adjust("11 seconds")
      const got2 = yield* Fiber.join(waiting2)
      expect(got2.map((x) => x.body)).toEqual(["a1"])
    }))

  it.scoped("a long poll wakes when a limit is raised", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: 0 })
      yield* mailbox.send("a0", { key: "a" })
      const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
      yield* TestClock.adjust("1 second")
      yield* MailboxMemory.setKeySettings(mailbox, "a", { limit: null })
      yield* TestClock.adjust("1 second")
      expect((yield* Fiber.join(waiting)).map((x) => x.body)).toEqual(["a0"])
    }))
})

describe("atk45: counts, delivery, priorities", () => {
  it.scoped("keys() counts after send, delayed send, receive, extend, nack, nack with delay, expiry, ack", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* mailbox.send("a0", { key: "a" })
      yield* mailbox.send("a1", { key: "a", delay: "10 seconds" })
      expect(yield* counts(mailbox)).toEqual([["a", 1, 0, 2]])
      const [m] = yield* mailbox.receive({ visibilityTimeout: "5 seconds" })
      expect(yield* counts(mailbox)).toEqual([["a", 0, 1, 2]])
      yield* m!.extendVisibility("30 seconds")
      yield* TestClock.adjust("10 seconds")
      expect(yield* counts(mailbox)).toEqual([["a", 1, 1, 2]])
      yield* m!.nack("5 seconds")
      expect(yield* counts(mailbox)).toEqual([["a", 1, 0, 2]])
      yield* TestClock.adjust("5 seconds")
      expect(yield* counts(mailbox)).toEqual([["a", 2, 0, 2]])
      const both = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "5 seconds" })
      expect(both.length).toBe(2)
      expect(yield* counts(mailbox)).toEqual([["a", 0, 2, 2]])
      yield* TestClock.adjust("5 seconds")
      expect(yield* counts(mailbox)).toEqual([["a", 2, 0, 2]])
      const again = yield* mailbox.receive({ maxMessages: 5, visibilityTimeout: "5 seconds" })
      for (const x of again) yield* x.acknowledge
      expect(yield* counts(mailbox)).toEqual([])
    }))

  it.scoped("no message is delivered twice concurrently nor lost across 3 keys, limits and random settles", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, "k0", { limit: 1 })
      yield* MailboxMemory.setKeySettings(mailbox, "k1", { limit: 2, weight: 3 })
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { starts: { count: 5, per: "10 seconds" } })
      const sent = new Set<string>()
      for (let i = 0; i < 60; i++) {
        const body = `m${i}`
        sent.add(body)
        yield* mailbox.send(body, i % 4 === 3 ? {} : { key: `k${i % 3}`, priority: (i * 7) % 5 - 2 })
      }
      let seed = 42
      const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648
      const held = new Map<string, Mailbox.Message<string, string>>()
      const done = new Set<string>()
      for (let step = 0; step < 2000 && done.size < sent.size; step++) {
        const got = yield* mailbox.receive({ maxMessages: 3, visibilityTimeout: "3 seconds" })
        for (const m of got) {
          const other = held.get(m.body)
          if (other !== undefined) {
            // the old lease must be dead
            expect(Either.isLeft(yield* Effect.either(other.extendVisibility("1 second")))).toBe(true)
          }
          expect(done.has(m.body)).toBe(false)
          held.set(m.body, m)
        }
        for (const [body, m] of held) {
          const r = rand()
          if (r < 0.3) {
            if (Either.isRight(yield* Effect.either(m.acknowledge))) done.add(body)
            held.delete(body)
          } else if (r < 0.4) {
            yield* Effect.either(m.nack(r < 0.35 ? 0 : "2 seconds"))
            held.delete(body)
          } else if (r < 0.45) yield* Effect.either(m.extendVisibility(0))
        }
        for (const k of yield* MailboxMemory.keys(mailbox)) {
          if (k.key === "k0") expect(k.inFlight).toBeLessThanOrEqual(1)
          if (k.key === "k1") expect(k.inFlight).toBeLessThanOrEqual(2)
          expect(k.ready + k.inFlight).toBeLessThanOrEqual(k.pending)
        }
        yield* TestClock.adjust(`${Math.floor(rand() * 2000)} millis`)
      }
      expect(done).toEqual(sent)
      expect(yield* mailbox.approximateCount).toBe(0)
      expect(yield* MailboxMemory.keys(mailbox)).toEqual([])
    }))

  it.scoped("priorities at the bounds keep order within a key and on return; out-of-bounds are refused", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* mailbox.send("max", { key: "a", priority: 2_147_483_647 })
      yield* mailbox.send("zero", { key: "a", priority: 0 })
      yield* mailbox.send("min", { key: "a", priority: -2_147_483_648 })
      yield* mailbox.send("min2", { key: "a", priority: -2_147_483_648 })
      const bad = [2_147_483_648, -2_147_483_649, 0.5, Number.NaN, Infinity]
      for (const priority of bad) {
        const r = yield* Effect.either(mailbox.send("x", { key: "a", priority }))
        expect(Either.isLeft(r)).toBe(true)
      }
      const [first] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      expect(first!.body).toBe("min")
      expect(first!.priority).toBe(-2_147_483_648)
      yield* first!.nack()
      const all = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(all.map((m) => m.body)).toEqual(["min", "min2", "zero", "max"])
      expect(all.map((m) => m.priority)).toEqual([-2_147_483_648, -2_147_483_648, undefined, 2_147_483_647])
    }))

  it.scoped("10,000 keys: sends, one receive, keys() — wall time", () =>
    Effect.gen(function*() {
      const mailbox = yield* fresh()
      yield* MailboxMemory.setKeySettings(mailbox, undefined, { limit: 1, starts: { count: 1, per: "1 minute" } })
      const t0 = performance.now()
      for (let i = 0; i < 10_000; i++) {
        yield* mailbox.send(`m${i}a`, { key: `key${i}` })
        yield* mailbox.send(`m${i}b`, { key: `key${i}` })
      }
      const t1 = performance.now()
      const one = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      const t2 = performance.now()
      const many = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      const t3 = performance.now()
      // drain until every key is at its limit (1 each), then an empty receive walks all 10,000
      for (let i = 0; i < 1000; i++) yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      const t4 = performance.now()
      const empty = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      const t5 = performance.now()
      const ks = yield* MailboxMemory.keys(mailbox)
      const t6 = performance.now()
      console.log(
        `10k keys: 20k sends ${(t1 - t0).toFixed(0)} ms; receive(1) ${(t2 - t1).toFixed(1)} ms; ` +
          `receive(10) ${(t3 - t2).toFixed(1)} ms; 1000 receives(10) ${(t4 - t3).toFixed(0)} ms; ` +
          `empty receive ${(t5 - t4).toFixed(1)} ms; keys() ${(t6 - t5).toFixed(1)} ms`
      )
      expect(one.length).toBe(1)
      expect(many.length).toBe(10)
      expect(empty.length).toBe(0)
      expect(ks.length).toBe(10_000)
      expect(ks.every((k) => k.inFlight === 1 && k.ready === 1)).toBe(true)
    }), 60_000)
})
