import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import { mkdtempSync } from "node:fs"
import { connect } from "node:net"
import { networkInterfaces, tmpdir } from "node:os"
import { join } from "node:path"
import * as Health from "../src/Health.js"
import * as Heartbeat from "../src/Heartbeat.js"
import type * as MailboxWorker from "../src/MailboxWorker.js"
import { messagesProcessed } from "../src/MailboxWorker.js"
import * as Runnable from "../src/Runnable.js"
import { refusedOptions, spawnBundled } from "./helpers.js"

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
      // Each registered loop's heartbeat age, as of the scrape.
      expect(metrics.body).toMatch(/# TYPE leasehold_heartbeat_age_seconds gauge/)
      expect(metrics.body).toMatch(/leasehold_heartbeat_age_seconds\{[^}]*loop="main"[^}]*\} \d/)
    }).pipe(Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "127.0.0.1" }))), Effect.scoped))

  it.live("ready is 503 when a heartbeat is older than staleAfter", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const { loop } = yield* fakeLoop("stale")
      yield* health.register(loop)
      // Real time (the server is real): a window wide enough that a loaded machine answers the second GET
      // inside it, and a sleep past it.
      yield* Effect.sleep("1200 millis")
      const stale = yield* get(`${health.url}/health/ready`)
      expect(stale.status).toBe(503)
      expect(stale.body).toContain("has not beaten for")
      yield* loop.heartbeat.beat
      expect((yield* get(`${health.url}/health/ready`)).status).toBe(200)
    }).pipe(
      Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "127.0.0.1", staleAfter: "1 second" }))),
      Effect.scoped
    ))
})

describe("Runnable.Readiness", () => {
  it.scoped("Health's layers provide it, one registry behind both: a loop registered there counts in readiness", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const readiness = yield* Runnable.Readiness
      const { loop, stop } = yield* fakeLoop("through-readiness")
      yield* Effect.scoped(
        Effect.gen(function*() {
          yield* readiness.register(loop)
          stop()
          expect(yield* health.readiness).toEqual({
            ready: false,
            reasons: [`loop "through-readiness" is not running`]
          })
        })
      )
      // The registration ended with its scope.
      expect((yield* health.readiness).ready).toBe(true)
      yield* readiness.setShuttingDown
      expect(yield* health.readiness).toEqual({ ready: false, reasons: ["shutting down"] })
    }).pipe(Effect.provide(Layer.fresh(Health.layerRegistry()))))
})

describe("Health config", () => {
  it.effect("a bad staleAfter or port is a ParseError naming it", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Layer.build(Health.layerRegistry({ staleAfter: -5 })).pipe(Effect.scoped))
      expect(error._tag).toBe("ParseError")
      expect(refusedOptions(error)).toEqual(["staleAfter"])
      expect(error.message).toContain("must not be negative")
      // The server's port is checked before anything is loaded or bound.
      for (const port of [-1, 65_536, 1.5, Number.NaN, Infinity]) {
        const bad = yield* Effect.flip(Layer.build(Health.layer({ port })).pipe(Effect.scoped))
        expect(refusedOptions(bad)).toEqual(["port"])
        expect(bad.message).toContain("must be a port number")
      }
    }))

  it.effect("staleAfter must be a positive finite duration, on layer and layerRegistry alike", () =>
    Effect.gen(function*() {
      const refused = [
        [0, "must be more than 0 and at most 24 hours"],
        ["0 seconds", "must be more than 0 and at most 24 hours"],
        [Duration.zero, "must be more than 0 and at most 24 hours"],
        [Number.NaN, "is not a number"],
        [Infinity, "must be more than 0 and at most 24 hours"],
        [Duration.infinity, "must be more than 0 and at most 24 hours"],
        ["25 hours", "must be more than 0 and at most 24 hours"],
        ["soon", "is not a duration"],
        ["-1 seconds", "must not be negative"]
      ] as ReadonlyArray<readonly [Duration.DurationInput, string]>
      for (const [staleAfter, message] of refused) {
        for (const layer of [Health.layerRegistry({ staleAfter }), Health.layer({ port: 0, staleAfter })]) {
          const error = yield* Effect.flip(Layer.build(layer).pipe(Effect.scoped))
          expect([staleAfter, error._tag, refusedOptions(error)]).toEqual([staleAfter, "ParseError", ["staleAfter"]])
          expect(error.message).toContain(message)
        }
      }
      // The bounds themselves are fine.
      for (const staleAfter of [1, "24 hours"] as ReadonlyArray<Duration.DurationInput>) {
        yield* Layer.build(Health.layerRegistry({ staleAfter })).pipe(Effect.scoped)
      }
    }))

  it.effect("host must be an address or a name to listen on", () =>
    Effect.gen(function*() {
      for (const host of ["", "127.0.0.1:9090", "http://127.0.0.1", "[::1]", "local host"]) {
        const error = yield* Effect.flip(Layer.build(Health.layer({ port: 0, host })).pipe(Effect.scoped))
        expect([host, refusedOptions(error)]).toEqual([host, ["host"]])
        expect(error.message).toContain("must be an IP address or a host name")
      }
    }))
})

/** Whether a TCP connection to host:port is accepted. */
const accepts = (host: string, port: number) =>
  Effect.async<boolean>((resume) => {
    const socket = connect({ host, port, timeout: 2_000 })
    const done = (accepted: boolean) => {
      socket.destroy()
      resume(Effect.succeed(accepted))
    }
    socket.once("connect", () => done(true))
    socket.once("error", () => done(false))
    socket.once("timeout", () => done(false))
  })

/** This machine's addresses other than loopback (IPv4). */
const externalAddresses = Object.values(networkInterfaces()).flatMap((entries) =>
  (entries ?? []).filter((entry) => entry.family === "IPv4" && !entry.internal).map((entry) => entry.address)
)

const portOf = (url: string | undefined) => Number(new URL(url!).port)

describe("Health server binding", () => {
  it.live("binds loopback by default: reachable on 127.0.0.1, refused on the machine's other addresses", () =>
    Effect.gen(function*() {
      const port = portOf((yield* Health.Health).url)
      expect(yield* accepts("127.0.0.1", port)).toBe(true)
      for (const address of externalAddresses) expect(yield* accepts(address, port)).toBe(false)
    }).pipe(Effect.provide(Layer.fresh(Health.layer({ port: 0 }))), Effect.scoped))

  it.live("host 0.0.0.0 serves every address (how a container probe reaches it)", () =>
    Effect.gen(function*() {
      const port = portOf((yield* Health.Health).url)
      for (const address of ["127.0.0.1", ...externalAddresses]) expect(yield* accepts(address, port)).toBe(true)
    }).pipe(Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "0.0.0.0" }))), Effect.scoped))
})

describe("Health server and a stopping process", () => {
  it.live(
    "a client that sent half a request cannot keep the process alive after SIGTERM",
    () =>
      Effect.gen(function*() {
        const filename = join(mkdtempSync(join(tmpdir(), "leasehold-health-")), "mailbox.db")
        const child = yield* spawnBundled("test/fixtures/loop-process.ts", [
          filename,
          "--health",
          "--shutdown-ms",
          "1500"
        ])
        yield* child.waitFor(/health http:\/\/127\.0\.0\.1:\d+/)
        yield* child.waitFor(/ready/)
        const port = Number(/health http:\/\/127\.0\.0\.1:(\d+)/.exec(child.output())![1])
        // Half a request: the headers never end, and the socket stays open.
        const socket = yield* Effect.acquireRelease(
          Effect.async<ReturnType<typeof connect>>((resume) => {
            const socket = connect({ host: "127.0.0.1", port }, () => resume(Effect.succeed(socket)))
            socket.on("error", () => undefined)
          }),
          (socket) => Effect.sync(() => socket.destroy())
        )
        socket.write("GET /health/ready HTTP/1.1\r\nHost: probe\r\n")
        yield* Effect.sleep("100 millis")
        const signalled = performance.now()
        yield* child.signal("SIGTERM")
        const { code } = yield* child.exited
        expect(code).toBe(0)
        // The shutdown timeout (1.5 s; the idle loop needs none of it) plus a second.
        expect((performance.now() - signalled) / 1000).toBeLessThan(2.5)
      }).pipe(Effect.scoped),
    60_000
  )
})
