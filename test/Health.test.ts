import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Health from "../src/Health.js"
import * as Heartbeat from "../src/Heartbeat.js"
import type * as MailboxWorker from "../src/MailboxWorker.js"
import { messagesProcessed } from "../src/MailboxWorker.js"

/** A loop stand-in whose running flag the test sets. */
const fakeLoop = (name: string) =>
  Effect.map(Heartbeat.make, (heartbeat) => {
    let running = true
    const loop: MailboxWorker.Runnable = {
      name,
      heartbeat,
      run: () => Effect.void,
      shutdown: () => Effect.succeed(true),
      running: Effect.sync(() => running)
    }
    return { loop, stop: () => (running = false) }
  })

const get = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(url)
    return { status: response.status, body: await response.text() }
  })

describe("Health server (real HTTP on a free port)", () => {
  it.live("serves live, ready, metrics and 404; ready flips to 503 when a loop stops or shutdown begins", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const base = health.url!
      expect(base).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)

      expect((yield* get(`${base}/health/live`)).status).toBe(200)
      expect((yield* get(`${base}/nowhere`)).status).toBe(404)

      const { loop, stop } = yield* fakeLoop("main")
      yield* health.register(loop)
      yield* loop.heartbeat.beat
      expect(yield* get(`${base}/health/ready`)).toEqual({
        status: 200,
        body: JSON.stringify({ ready: true, reasons: [] })
      })

      stop()
      const notRunning = yield* get(`${base}/health/ready`)
      expect(notRunning.status).toBe(503)
      expect(notRunning.body).toContain(`loop \\"main\\" is not running`)

      yield* health.setShuttingDown
      expect((yield* get(`${base}/health/ready`)).body).toContain("shutting down")

      yield* messagesProcessed(Effect.succeed(1))
      const metrics = yield* get(`${base}/metrics`)
      expect(metrics.status).toBe(200)
      expect(metrics.body).toMatch(/# TYPE leasehold_messages_processed_total counter/)
      expect(metrics.body).toMatch(/leasehold_messages_processed_total(\{[^}]*\})? \d+/)
    }).pipe(Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "127.0.0.1" }))), Effect.scoped))

  it.live("ready is 503 when a heartbeat is older than staleAfter", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const { loop } = yield* fakeLoop("stale")
      yield* health.register(loop)
      yield* Effect.sleep("50 millis")
      const stale = yield* get(`${health.url}/health/ready`)
      expect(stale.status).toBe(503)
      expect(stale.body).toContain("has not beaten for")
      yield* loop.heartbeat.beat
      expect((yield* get(`${health.url}/health/ready`)).status).toBe(200)
    }).pipe(
      Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "127.0.0.1", staleAfter: "20 millis" }))),
      Effect.scoped
    ))
})

describe("Health config", () => {
  it.effect("a bad staleAfter is a ParseError naming it", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Layer.build(Health.layerRegistry({ staleAfter: -5 })).pipe(Effect.scoped))
      expect(error._tag).toBe("ParseError")
      expect(error.message).toContain("staleAfter")
      expect(error.message).toContain("must not be negative")
    }))
})
