/**
 * The one way leasehold serves HTTP (the health server, the operator's console): a Node server that cuts
 * clients who hold a connection without using it, caps how many connections it holds, and closes them all
 * when its scope closes.
 *
 * Why each limit: a connection that never finishes its request, or idles after one, costs the process a
 * socket and a file descriptor for as long as the client likes — Node's own defaults allow a minute for the
 * headers, and nothing bounds how many such connections pile up. The probes, scrapes and browsers these
 * servers are for send a whole request at once and answer in milliseconds, so the limits can be tight; they
 * are in `limits` (one place, which the documentation and test/httpServers.test.ts quote). A client that runs
 * into one sees its connection closed: with `408 Request Timeout` when it had started a request and not
 * finished it, silently otherwise (and at once, without a response, beyond the cap).
 */
import type * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import type * as HttpServer from "@effect/platform/HttpServer"
import type { ServeError } from "@effect/platform/HttpServerError"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { createServer } from "node:http"
import { isIP, isIPv4, isIPv6 } from "node:net"

/** The limits every server of ours applies (milliseconds, and a number of connections). */
export const limits = {
  /** From the connection (or the end of the previous response) to the request's last header line. */
  headersTimeout: 5_000,
  /** For the whole request, body included. */
  requestTimeout: 10_000,
  /**
   * How often Node looks for connections past those two (its default, 30 s, would let one live 35 s). The
   * look is a walk over the open connections, at most `maxConnections` of them.
   */
  connectionsCheckingInterval: 500,
  /**
   * How long an idle keep-alive connection is kept after a response, as the `Keep-Alive: timeout=` header tells
   * the client; Node 20 closes it a second later still, so a client that reuses it just in time does not race
   * the close. 4 s + that second: an idle connection ends within 5 s.
   */
  keepAliveTimeout: 4_000,
  /**
   * No byte either way for this long ends a connection: a client that stopped reading its response (which
   * the timeouts above do not cover, the request being complete). Longer than any answer takes to compute.
   */
  socketTimeout: 30_000,
  /** Open connections beyond this are closed as soon as they are accepted. */
  maxConnections: 128
} as const

/** A Node HTTP server with `limits` applied, not yet listening. */
export const createLimitedServer = () => {
  const server = createServer({
    headersTimeout: limits.headersTimeout,
    requestTimeout: limits.requestTimeout,
    connectionsCheckingInterval: limits.connectionsCheckingInterval,
    keepAliveTimeout: limits.keepAliveTimeout
  })
  server.maxConnections = limits.maxConnections
  // Node's socket idle timeout, configured like the limits above (no `createServer` option in Node 20 sets it):
  // Node arms it on each accepted socket and, with no `timeout` listener, destroys the socket. No timer of
  // ours, and nothing the platform's `HttpServer` offers (it serves the Node server it is given).
  server.timeout = limits.socketTimeout
  return server
}

/**
 * An `HttpServer` listening on `options` with `limits` applied, for the scope: when it closes, every connection
 * still open (idle, half-sent or waiting for an answer) is closed at once — the platform's own close waits for
 * each to end, which a client that sent half a request would put off until its timeout. `NodeHttpServer` is
 * passed in: the callers load `@effect/platform-node` when they serve, not when they are imported.
 */
export const serve = (
  Node: typeof NodeHttpServer,
  options: { readonly port: number; readonly host: string }
): Effect.Effect<HttpServer.HttpServer, ServeError, Scope.Scope> =>
  Effect.gen(function*() {
    const node = createLimitedServer()
    const server = yield* Node.make(() => node, { port: options.port, host: options.host })
    // Added after the platform's finalizer, so it runs first (finalizers run in reverse).
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        node.close()
        node.closeAllConnections()
      })
    )
    return server
  })

/** A host name: dot-separated labels of letters, digits, `-` and `_` (container names), at most 253 characters. */
const hostName = /^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$/i

/** What is wrong with `value` as an address to listen on (an IP address, IPv6 without brackets, or a host name). */
export const listenAddressProblem = (value: unknown): string | undefined =>
  typeof value === "string" && (isIP(value) !== 0 || hostName.test(value))
    ? undefined
    : "must be an IP address or a host name"

/** A request's `Host` header, parsed: the name (lower case; IPv6 in brackets, as URLs write it) and the port. */
export interface Host {
  readonly name: string
  readonly port: number | undefined
}

/**
 * Parses a `Host` header strictly: a host name, an IPv4 address or an IPv6 address in brackets, then
 * optionally `:` and the port's digits — nothing else (no user part, path, space or percent sign), so that
 * what is compared is exactly what the client addressed. An IPv6 address comes back in the form `URL` gives it
 * (`[::ffff:127.0.0.1]` reads `[::ffff:7f00:1]`).
 */
export const parseHost = (header: string | undefined): Host | undefined => {
  const match = header === undefined ? null : /^(?:\[([0-9a-f:.]+)\]|([a-z0-9_.-]+))(?::(\d{1,5}))?$/i.exec(header)
  if (match === null) return undefined
  const [, ipv6, name, digits] = match
  const port = digits === undefined ? undefined : Number(digits)
  if (port !== undefined && port > 65_535) return undefined
  if (ipv6 !== undefined) return isIPv6(ipv6) ? { name: new URL(`http://[${ipv6}]`).hostname, port } : undefined
  return isIPv4(name!) || hostName.test(name!) ? { name: name!.toLowerCase(), port } : undefined
}
