/**
 * The scheduling contract (src/internal/mailbox/scheduling.ts): keys and priorities on send, a redelivered
 * message keeping its place, per-key concurrency limits, fair shares by worker time, start and token rates —
 * run against whatever backend schedules by key. Time is `TestClock`'s; the fairness case is a discrete-event
 * simulation of four workers driving the mailbox itself.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Fiber, Metric, type Scope, TestClock } from "effect"
import type { KeySettings, KeyState } from "../../src/internal/mailbox/scheduling.js"
import * as Scheduling from "../../src/internal/mailbox/scheduling.js"
import { chargeTokens, type Mailbox, type Message } from "../../src/Mailbox.js"

/** How a backend is driven for the contract. */
export interface Scheduler {
  readonly make: (
    name: string,
    options?: { readonly keyMetrics?: boolean }
  ) => Effect.Effect<Mailbox<string, string>, unknown, Scope.Scope>
  readonly setKeySettings: (
    mailbox: Mailbox<string, string>,
    key: string | undefined,
    settings: KeySettings
  ) => Effect.Effect<void, unknown>
  readonly keys: (mailbox: Mailbox<string, string>) => Effect.Effect<ReadonlyArray<KeyState>, unknown>
  /** How long the fairness simulation (10,100 messages, thousands of claims) may take on this backend. */
  readonly fairnessTimeout?: number | undefined
}

const bodies = (messages: ReadonlyArray<{ readonly body: string }>) => messages.map((m) => m.body)

/** Receives one message at a time until none is visible: the order a single worker sees. */
const drain = (mailbox: Mailbox<string, string>, ack = true) =>
  Effect.gen(function*() {
    const seen: Array<string> = []
    for (;;) {
      const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      if (message === undefined) return seen
      seen.push(message.body)
      if (ack) yield* message.acknowledge
    }
  })

export const schedulingContract = (label: string, scheduler: Scheduler) =>
  describe(`Scheduling contract: ${label}`, () => {
    const fresh = () => scheduler.make("scheduled")

    describe("metrics", () => {
      let queues = 0
      const gauge = (metric: Metric.Metric.Gauge<number>, tags: ReadonlyArray<readonly [string, string]>) =>
        Effect.map(
          Metric.value(tags.reduce((m, [key, value]) => m.pipe(Metric.tagged(key, value)), metric)),
          (state) => state.value
        )

      it.scoped(
        "a claim counts the keys it held back, sets the active-keys gauge and, opted in, each key's live leases",
        () =>
          Effect.gen(function*() {
            const name = `metered${++queues}${label.replace(/\W/g, "")}`
            const mailbox = yield* scheduler.make(name, { keyMetrics: true })
            yield* scheduler.setKeySettings(mailbox, "a", { limit: 1 })
            yield* mailbox.send("a1", { key: "a" })
            yield* mailbox.send("a2", { key: "a" })
            yield* mailbox.send("b1", { key: "b" })
            const first = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
            expect(bodies(first).sort()).toEqual(["a1", "b1"])
            expect(yield* gauge(Scheduling.keysActive, [["queue", name]])).toBe(2)
            expect(yield* gauge(Scheduling.keyLeases, [["queue", name], ["key", "a"]])).toBe(1)
            expect(yield* gauge(Scheduling.keyLeases, [["queue", name], ["key", "b"]])).toBe(1)
            // a is at its limit with a2 ready: the next claim passes it over, and says so.
            expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
            const held = yield* Metric.value(
              Scheduling.keysHeldBack.pipe(Metric.tagged("queue", name), Metric.tagged("reason", "limit"))
            )
            expect(held.count).toBeGreaterThanOrEqual(1)
            // Settled, and a gauge's period later: b has gone, a holds a2's lease.
            yield* Effect.forEach(first, (message) => message.acknowledge, { discard: true })
            yield* TestClock.adjust("11 seconds")
            expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))).toEqual(["a2"])
            expect(yield* gauge(Scheduling.keysActive, [["queue", name]])).toBe(1)
            expect(yield* gauge(Scheduling.keyLeases, [["queue", name], ["key", "a"]])).toBe(1)
            expect(yield* gauge(Scheduling.keyLeases, [["queue", name], ["key", "b"]])).toBe(0)
          })
      )

      it.scoped("without keyMetrics no per-key series is made", () =>
        Effect.gen(function*() {
          const name = `unmetered${++queues}${label.replace(/\W/g, "")}`
          const mailbox = yield* scheduler.make(name)
          yield* mailbox.send("x", { key: "secret-tenant" })
          expect((yield* mailbox.receive({ maxMessages: 10 })).length).toBe(1)
          expect(yield* gauge(Scheduling.keysActive, [["queue", name]])).toBe(1)
          const series = (yield* Metric.snapshot).filter((pair) =>
            pair.metricKey.tags.some((tag) => tag.key === "key" && tag.value === "secret-tenant")
          )
          expect(series).toEqual([])
        }))
    })

    describe("keys and priorities", () => {
      it.scoped("a delivery carries its key and priority; a key's messages go lowest priority first", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("low", { key: "acme", priority: 5 })
          yield* mailbox.send("urgent", { key: "acme", priority: -3 })
          yield* mailbox.send("normal", { key: "acme" })
          const received = yield* mailbox.receive({ maxMessages: 3 })
          expect(bodies(received)).toEqual(["urgent", "normal", "low"])
          expect(received.map((m) => [m.key, m.priority ?? 0])).toEqual([["acme", -3], ["acme", 0], ["acme", 5]])
        }))

      it.scoped("unkeyed messages go by priority too, and carry no key", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("b")
          yield* mailbox.send("a", { priority: -1 })
          const received = yield* mailbox.receive({ maxMessages: 2 })
          expect(bodies(received)).toEqual(["a", "b"])
          expect(received[1]!.key).toBeUndefined()
        }))

      it.scoped("a bad key or priority is refused, naming it, and nothing is stored", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const bad: ReadonlyArray<[string, unknown, unknown]> = [
            ["key", "", undefined],
            ["key", "a\u0000b", undefined],
            ["key", "x".repeat(201), undefined],
            ["key", "\ud800", undefined],
            ["key", 42, undefined],
            ["priority", undefined, 1.5],
            ["priority", undefined, Number.NaN],
            ["priority", undefined, 2 ** 31],
            ["priority", undefined, -(2 ** 31) - 1],
            ["priority", undefined, "1"]
          ]
          for (const [parameter, key, priority] of bad) {
            const sent = yield* Effect.either(
              mailbox.send("x", { key: key as string, priority: priority as number })
            )
            expect(
              Either.isLeft(sent) && sent.left._tag === "InvalidParameterError" &&
                (sent.left as { parameter: string }).parameter
            ).toBe(parameter)
          }
          expect(yield* mailbox.approximateCount).toBe(0)
        }))
    })

    describe("a redelivered message keeps its place", () => {
      it.scoped("a lease that ran out comes back ahead of newer messages of its key", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("first", { key: "k" })
          yield* mailbox.receive({ visibilityTimeout: "1 second" })
          yield* mailbox.send("second", { key: "k" })
          yield* mailbox.send("third", { key: "k" })
          yield* TestClock.adjust("2 seconds")
          expect(yield* drain(mailbox)).toEqual(["first", "second", "third"])
        }))

      it.scoped("a message given back (nack) goes ahead of newer ones of its key", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("first", { key: "k" })
          const [first] = yield* mailbox.receive()
          yield* mailbox.send("second", { key: "k" })
          yield* first!.nack()
          expect(yield* drain(mailbox)).toEqual(["first", "second"])
        }))
    })

    describe("concurrency limits", () => {
      it.scoped("a key never has more live leases than its limit; a settle or an expiry frees a place", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* scheduler.setKeySettings(mailbox, "k", { limit: 2 })
          for (let i = 0; i < 5; i++) yield* mailbox.send(`k${i}`, { key: "k" })
          const first = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 seconds" })
          expect(bodies(first)).toEqual(["k0", "k1"])
          expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
          yield* first[0]!.acknowledge
          expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" }))).toEqual(["k2"])
          // k1's lease runs out: it stops counting, and comes back first.
          yield* TestClock.adjust("10 seconds")
          expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["k1"])
          const state = (yield* scheduler.keys(mailbox)).find((row) => row.key === "k")!
          expect(state.inFlight).toBe(2)
          expect(state.limit).toBe(2)
        }))

      it.scoped("a default limit holds every key without its own; limit 0 holds a key; others flow", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* scheduler.setKeySettings(mailbox, undefined, { limit: 1 })
          yield* scheduler.setKeySettings(mailbox, "held", { limit: 0 })
          for (const key of ["a", "a", "b", "held"]) yield* mailbox.send(key, { key })
          yield* mailbox.send("plain")
          const received = yield* mailbox.receive({ maxMessages: 10 })
          expect(bodies(received).sort()).toEqual(["a", "b", "plain"])
          // Raising the limit takes effect at the next claim.
          yield* scheduler.setKeySettings(mailbox, "held", { limit: null })
          expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["held"])
        }))

      it.scoped("bad settings are refused naming the field", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const bad: ReadonlyArray<[string, KeySettings]> = [
            ["limit", { limit: -1 }],
            ["limit", { limit: 1.5 }],
            ["limit", { limit: Number.POSITIVE_INFINITY }],
            ["weight", { weight: 0 }],
            ["weight", { weight: Number.NaN }],
            ["weight", { weight: 1e9 }],
            ["starts.count", { starts: { count: -1, per: "1 minute" } }],
            ["starts.per", { starts: { count: 1, per: "0 seconds" } }],
            ["tokens.per", { tokens: { count: 1, per: "nonsense" as Duration.DurationInput } }],
            ["tokens.per", { tokens: { count: 1, per: Duration.days(2) } }]
          ]
          for (const [parameter, settings] of bad) {
            const set = yield* Effect.either(scheduler.setKeySettings(mailbox, "k", settings))
            expect(Either.isLeft(set) && (set.left as { parameter?: string }).parameter).toBe(parameter)
          }
          const badKey = yield* Effect.either(scheduler.setKeySettings(mailbox, "a\nb", { limit: 1 }))
          expect(Either.isLeft(badKey) && (badKey.left as { parameter?: string }).parameter).toBe("key")
        }))
    })

    describe("fair shares by worker time", () => {
      it.scoped("two keys with jobs of one length alternate; a weight of 3 takes three times the starts", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          // One worker, every job held for 10 s of its lease.
          const work = (jobs: number) =>
            Effect.gen(function*() {
              const order: Array<string> = []
              for (let i = 0; i < jobs; i++) {
                const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
                order.push(message!.body)
                yield* TestClock.adjust("10 seconds")
                yield* message!.acknowledge
              }
              return order
            })
          for (let i = 0; i < 6; i++) yield* mailbox.send("a", { key: "a" })
          for (let i = 0; i < 6; i++) yield* mailbox.send("b", { key: "b" })
          expect(yield* work(12)).toEqual(["a", "b", "a", "b", "a", "b", "a", "b", "a", "b", "a", "b"])
          yield* scheduler.setKeySettings(mailbox, "heavy", { weight: 3 })
          for (let i = 0; i < 12; i++) yield* mailbox.send("heavy", { key: "heavy" })
          for (let i = 0; i < 12; i++) yield* mailbox.send("light", { key: "light" })
          const order = yield* work(16)
          const heavy = order.filter((body) => body === "heavy").length
          expect(heavy).toBeGreaterThanOrEqual(11)
          expect(heavy).toBeLessThanOrEqual(13)
        }))

      it.scoped(
        "A's 100 two-hour runs and B's 10,000 five-second jobs on 4 workers: equal worker time (±10%) while both have work, and C's one job starts within one B job",
        () =>
          Effect.gen(function*() {
            const mailbox = yield* fresh()
            for (let i = 0; i < 100; i++) yield* mailbox.send("A", { key: "A" })
            // Sent concurrently: a durable backend group-commits them (their order within B does not matter here).
            yield* Effect.forEach(Array.from({ length: 10_000 }), () => mailbox.send("B", { key: "B" }), {
              concurrency: 256,
              discard: true
            })
            const hour = 3_600_000
            // B's whole backlog is 10,000 × 5 s = 13.9 worker-hours: with half of 4 workers it runs out after
            // about 6.9 h, so the shares are measured over the first 6 h (12 worker-hours each), where both
            // keys always have ready work. (Over 8 h, half would be 16: more than B has.)
            const end = 6 * hour
            const length = { A: 2 * hour, B: 5_000, C: 5_000 } as Record<string, number>
            const visibility = 10 * 60_000
            const extendEvery = 5 * 60_000
            interface Busy {
              message: Message<string, string>
              start: number
              until: number
              nextExtend: number
            }
            const workers: Array<Busy | undefined> = [undefined, undefined, undefined, undefined]
            const leased: Record<string, number> = { A: 0, B: 0, C: 0 }
            let now = 0
            let cSent = false
            let cStarted: number | undefined
            let steps = 0
            while (now < end) {
              // A macrotask turn every 32 steps: the simulation is thousands of steps of microtasks (and
              // synchronous SQLite), and the test runner's worker must get to answer its own messages in between.
              if (++steps % 32 === 0) yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
              for (let w = 0; w < workers.length; w++) {
                if (workers[w] !== undefined) continue
                const [message] = yield* mailbox.receive({ visibilityTimeout: Duration.millis(visibility) })
                if (message === undefined) break
                if (message.body === "C") cStarted = now
                workers[w] = {
                  message,
                  start: now,
                  until: now + length[message.body]!,
                  nextExtend: now + extendEvery
                }
              }
              let next = end
              if (!cSent) next = Math.min(next, 3 * hour)
              for (const busy of workers) if (busy !== undefined) next = Math.min(next, busy.until, busy.nextExtend)
              yield* TestClock.adjust(Duration.millis(next - now))
              now = next
              if (!cSent && now >= 3 * hour) {
                cSent = true
                yield* mailbox.send("C", { key: "C" })
              }
              for (let w = 0; w < workers.length; w++) {
                const busy = workers[w]
                if (busy === undefined) continue
                if (busy.until <= now) {
                  leased[busy.message.body]! += busy.until - busy.start
                  yield* busy.message.acknowledge
                  workers[w] = undefined
                } else if (busy.nextExtend <= now) {
                  yield* busy.message.extendVisibility(Duration.millis(visibility))
                  busy.nextExtend = now + extendEvery
                }
              }
            }
            for (const busy of workers) if (busy !== undefined) leased[busy.message.body]! += end - busy.start
            console.log(
              `fairness: A ${(leased.A! / hour).toFixed(2)} h, B ${(leased.B! / hour).toFixed(2)} h, C started ${
                (cStarted ?? NaN) - 3 * hour
              } ms after it was sent`
            )
            const hoursOf = (key: string) => leased[key]! / hour
            expect(hoursOf("A")).toBeGreaterThanOrEqual(12 * 0.9)
            expect(hoursOf("A")).toBeLessThanOrEqual(12 * 1.1)
            expect(hoursOf("B")).toBeGreaterThanOrEqual(12 * 0.9)
            expect(hoursOf("B")).toBeLessThanOrEqual(12 * 1.1)
            expect(cStarted).toBeDefined()
            expect(cStarted! - 3 * hour).toBeLessThanOrEqual(5_000)
          }),
        scheduler.fairnessTimeout ?? 120_000
      )
    })

    describe("rates", () => {
      it.scoped("at most N starts per interval: the key waits for its next window, others go on", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* scheduler.setKeySettings(mailbox, "k", { starts: { count: 2, per: "1 minute" } })
          for (let i = 0; i < 5; i++) yield* mailbox.send(`k${i}`, { key: "k" })
          yield* mailbox.send("other", { key: "other" })
          expect(bodies(yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })).sort())
            .toEqual(["k0", "k1", "other"])
          expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
          yield* TestClock.adjust("1 minute")
          expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["k2", "k3"])
        }))

      it.scoped("a token budget charged by chargeTokens holds the key until its window turns", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* scheduler.setKeySettings(mailbox, "k", { tokens: { count: 1000, per: "1 minute" } })
          for (let i = 0; i < 3; i++) yield* mailbox.send(`k${i}`, { key: "k" })
          const [first] = yield* mailbox.receive({ visibilityTimeout: "10 minutes" })
          yield* chargeTokens(first!, 600)
          const [second] = yield* mailbox.receive({ visibilityTimeout: "10 minutes" })
          expect(second!.body).toBe("k1")
          yield* chargeTokens(second!, 600)
          expect(yield* mailbox.receive()).toEqual([])
          const refused = yield* Effect.either(chargeTokens(second!, -1))
          expect(Either.isLeft(refused) && refused.left._tag).toBe("InvalidParameterError")
          const state = (yield* scheduler.keys(mailbox)).find((row) => row.key === "k")!
          expect(state.tokens).toEqual({ used: 1200, count: 1000, perMillis: 60_000 })
          yield* TestClock.adjust("1 minute")
          expect(bodies(yield* mailbox.receive())).toEqual(["k2"])
        }))

      it.scoped("a long poll wakes when a held key's window turns", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* scheduler.setKeySettings(mailbox, "k", { starts: { count: 1, per: "10 seconds" } })
          yield* mailbox.send("k0", { key: "k" })
          yield* mailbox.send("k1", { key: "k" })
          expect(bodies(yield* mailbox.receive())).toEqual(["k0"])
          const waiting = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* TestClock.adjust("10 seconds")
          // A store that answers asynchronously (SQL) may have begun its look before the clock moved: time goes
          // on in small steps (well inside the wait) until the receiver has its message.
          for (let step = 0; step < 100 && (yield* Fiber.poll(waiting))._tag === "None"; step++) {
            yield* TestClock.adjust("50 millis")
            yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 10)))
          }
          expect(bodies(yield* Fiber.join(waiting))).toEqual(["k1"])
        }))
    })
  })
