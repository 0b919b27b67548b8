/**
 * Every HTTP server leasehold runs — the health server (`Health.layer`) and the operator's console
 * (`leasehold console`, as the command line ships) — cuts clients that hold a connection without using it, caps
 * how many connections it holds, and closes them all when it stops. Real sockets (node:net) play the clients,
 * and real time is measured: the figures asserted are the documented ones (src/internal/httpServer.ts) plus a
 * second.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { connect, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Health from "../src/Health.js"
import * as HttpServers from "../src/internal/httpServer.js"
import { foreignSqlite } from "./helpers.js"
import { startConsole } from "./support/console.js"

/** The documented figures (src/internal/httpServer.ts). */
const documented = { headers: 5_000, idle: 5_000, maxConnections: 128 }

/** A server under test: its port, and how to stop it. */
interface Served {
  readonly port: number
  readonly stop: Effect.Effect<void>
}

/** A client connection: when it connected, when the server closed it (ms, performance.now), what it received. */
interface Client {
  readonly socket: Socket
  readonly connectedAt: number
  closedAt: number | undefined
  received: string
}

/** Connects to `port` and sends `data` (perhaps nothing), then says nothing more; destroyed with the scope. */
const client = (port: number, data: string) =>
  Effect.acquireRelease(
    Effect.async<Client>((resume) => {
      const socket = connect({ host: "127.0.0.1", port })
      const state: { -readonly [K in keyof Client]: Client[K] } = {
        socket,
        connectedAt: 0,
        closedAt: undefined,
        received: ""
      }
      socket.on("error", () => undefined)
      socket.on("data", (chunk) => (state.received += chunk.toString()))
      socket.on("close", () => (state.closedAt ??= performance.now()))
      socket.once("connect", () => {
        state.connectedAt = performance.now()
        if (data !== "") socket.write(data)
        resume(Effect.succeed(state))
      })
      // A connection refused outright counts as closed at once.
      socket.once("close", () => {
        if (state.connectedAt === 0) {
          state.connectedAt = performance.now()
          resume(Effect.succeed(state))
        }
      })
    }),
    (state) => Effect.sync(() => state.socket.destroy())
  )

/** Waits until every client is closed, or `millis` passed; the slowest close (ms after connecting) or Infinity. */
const allClosed = (clients: ReadonlyArray<Client>, millis: number) =>
  Effect.gen(function*() {
    const started = performance.now()
    while (clients.some((c) => c.closedAt === undefined) && performance.now() - started < millis) {
      yield* Effect.sleep("50 millis")
    }
    return Math.max(...clients.map((c) => c.closedAt === undefined ? Infinity : c.closedAt - c.connectedAt))
  })

const half = [
  "", // nothing at all
  "GET / HT", // half a request line
  "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" // headers that never end
]

const suite = (name: string, start: Effect.Effect<Served, unknown, Scope.Scope>) =>
  describe(`${name}: silent clients and the connection cap`, () => {
    it.live(
      "100 silent half-open connections are all closed within the header timeout plus a second",
      () =>
        Effect.gen(function*() {
          const { port } = yield* start
          const clients = yield* Effect.forEach(
            Array.from({ length: 100 }, (_, i) => half[i % half.length]!),
            (data) => client(port, data),
            { concurrency: 20 }
          )
          const slowest = yield* allClosed(clients, documented.headers + 3_000)
          console.log(`${name}: 100 silent connections, the last closed after ${slowest.toFixed(0)} ms`)
          expect(slowest).toBeLessThan(documented.headers + 1_000)
          // Those that said anything were told why.
          for (const c of clients.filter((_, i) => i % half.length !== 0)) {
            expect(c.received).toMatch(/^HTTP\/1\.1 408 /)
          }
        }).pipe(Effect.scoped),
      30_000
    )

    it.live("an idle keep-alive connection is closed within its timeout plus a second", () =>
      Effect.gen(function*() {
        const { port } = yield* start
        const idle = yield* client(port, "GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        const slowest = yield* allClosed([idle], documented.idle + 3_000)
        console.log(`${name}: an idle keep-alive connection closed after ${slowest.toFixed(0)} ms`)
        expect(idle.received).toMatch(/^HTTP\/1\.1 /)
        expect(slowest).toBeLessThan(documented.idle + 1_000)
      }).pipe(Effect.scoped), 30_000)

    it.live(
      "connections beyond the cap are closed at once; the server answers again once some are gone",
      () =>
        Effect.gen(function*() {
          const { port } = yield* start
          const held = yield* Effect.forEach(
            Array.from({ length: documented.maxConnections }),
            () => client(port, "GET / HT")
          )
          yield* Effect.sleep("200 millis") // the server has accepted them all
          const extra = yield* Effect.forEach(Array.from({ length: 10 }), () => client(port, ""))
          const slowest = yield* allClosed(extra, 3_000)
          console.log(`${name}: 10 connections beyond the cap closed after ${slowest.toFixed(0)} ms at most`)
          expect(slowest).toBeLessThan(1_000)
          expect(held.filter((c) => c.closedAt !== undefined)).toEqual([])
          for (const c of held.slice(0, 10)) c.socket.destroy()
          yield* Effect.sleep("200 millis")
          const again = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/health/live`))
          expect(again.status).toBeLessThan(500)
        }).pipe(Effect.scoped),
      30_000
    )

    it.live("stopping the server closes every open connection at once", () =>
      Effect.gen(function*() {
        const { port, stop } = yield* start
        const clients = yield* Effect.forEach(
          Array.from({ length: 100 }, (_, i) => half[i % half.length]!),
          (data) => client(port, data),
          { concurrency: 20 }
        )
        yield* Effect.sleep("200 millis")
        const stopping = performance.now()
        yield* stop
        const stopped = performance.now() - stopping
        yield* allClosed(clients, 3_000)
        const last = Math.max(...clients.map((c) => (c.closedAt ?? Infinity) - stopping))
        console.log(`${name}: stopped in ${stopped.toFixed(0)} ms, its 100 connections closed by ${last.toFixed(0)} ms`)
        expect(last).toBeLessThan(1_000)
      }).pipe(Effect.scoped), 30_000)
  })

suite(
  "Health server",
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    const context = yield* Layer.buildWithScope(Layer.fresh(Health.layer({ port: 0 })), scope)
    const port = Number(new URL(Context.get(context, Health.Health).url!).port)
    return { port, stop: Scope.close(scope, Exit.void) }
  })
)

const directory = mkdtempSync(join(tmpdir(), "leasehold-servers-"))

suite(
  "Console server",
  Effect.gen(function*() {
    const file = join(directory, `console-${performance.now()}.db`)
    yield* foreignSqlite(file)
    const running = yield* startConsole(["--db", file])
    return { port: Number(new URL(running.url).port), stop: Effect.asVoid(running.stop) }
  })
)

describe("the Host header, parsed strictly", () => {
  it("the socket idle limit is Node's own server setting, with no listener of ours", () => {
    const server = HttpServers.createLimitedServer()
    expect(server.timeout).toBe(HttpServers.limits.socketTimeout)
    expect(server.listenerCount("timeout")).toBe(0) // Node then destroys an idle socket itself
    expect(server.maxConnections).toBe(HttpServers.limits.maxConnections)
  })

  it("reads a name or address and the port's digits, and nothing else", () => {
    expect(HttpServers.parseHost("127.0.0.1:8080")).toEqual({ name: "127.0.0.1", port: 8080 })
    expect(HttpServers.parseHost("LocalHost")).toEqual({ name: "localhost", port: undefined })
    expect(HttpServers.parseHost("my_console.internal:1")).toEqual({ name: "my_console.internal", port: 1 })
    expect(HttpServers.parseHost("[::1]:80")).toEqual({ name: "[::1]", port: 80 })
    expect(HttpServers.parseHost("[::FFFF:127.0.0.1]")).toEqual({ name: "[::ffff:7f00:1]", port: undefined })
    for (
      const junk of [
        undefined,
        "",
        "evil.com@127.0.0.1:80",
        "127.0.0.1:80@evil.com",
        "127.0.0.1:80/",
        "127.0.0.1 :80",
        " 127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "::1",
        "[::1",
        "[::1]]:80",
        "[1.2.3.4]",
        "[fe80::1%lo]",
        "%31.0.0.1",
        "a..b",
        "-a.example",
        "localhost.",
        "x".repeat(254)
      ]
    ) {
      expect([junk, HttpServers.parseHost(junk)]).toEqual([junk, undefined])
    }
  })

  it("an address to listen on is an IP address (IPv6 without brackets) or a host name", () => {
    for (const good of ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "worker-1.internal"]) {
      expect(HttpServers.listenAddressProblem(good)).toBeUndefined()
    }
    for (const bad of ["", " ", "[::1]", "127.0.0.1:80", "http://x", "a b", 5]) {
      expect(HttpServers.listenAddressProblem(bad)).toBe("must be an IP address or a host name")
    }
  })
})
