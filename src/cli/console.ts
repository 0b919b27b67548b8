/**
 * `leasehold console`: the operator's console in a browser — mailboxes, in-flight leases counting down, dead
 * letters (redrive, delete), the merge queue's lock and audit log (recover now), work-lease domains — served
 * until the process is stopped. It binds loopback unless `--host` says otherwise, never creates tables, and
 * with `--read-only` offers no action. Over a SQLite file it notices the file being replaced or deleted and
 * reads the new one (or says it is gone). The page and its guards are in src/cli/console/; the server is
 * every leasehold server's (src/internal/httpServer.ts: clients that hold a connection without using it are
 * cut, open connections are capped, and all are closed when the console stops).
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as HttpServer from "@effect/platform/HttpServer"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { isIPv6 } from "node:net"
import { InvalidParameterError } from "../Errors.js"
import * as HttpServers from "../internal/httpServer.js"
import * as Target from "../internal/sql/target.js"
import { client, db, prefix, redact, targetOf } from "./database.js"
import { say, warn } from "./output.js"

const port = Options.integer("port").pipe(
  Options.withDescription("The port to listen on; 0 picks a free one (printed at start)."),
  Options.withDefault(0)
)
const host = Options.text("host").pipe(
  Options.withDescription(
    "The address to bind. Loopback by default: anyone who can reach the console can redrive and delete."
  ),
  Options.withDefault("127.0.0.1")
)
const allowHost = Options.text("allow-host").pipe(
  Options.withDescription(
    "A name or address the console may be reached by besides loopback's (repeatable), e.g. the machine's name when " +
      "--host binds every interface. Requests addressed to any other name are refused (DNS rebinding)."
  ),
  Options.repeated,
  // Optional: shown as such in the usage.
  Options.withDefault([])
)
const readOnly = Options.boolean("read-only").pipe(
  Options.withDescription("Show everything, change nothing: no action is offered or accepted.")
)

/**
 * A name or address as a `Host` header names it (lower case; IPv6 in brackets, normalised), for the allow list;
 * undefined when it is not one, or names a port.
 */
const hostName = (host: string): string | undefined => {
  const parsed = HttpServers.parseHost(isIPv6(host) ? `[${host}]` : host)
  return parsed === undefined || parsed.port !== undefined ? undefined : parsed.name
}
/**
 * A SQLite target's file, which the console watches for replacement (the demo deletes and re-creates its
 * database), and how to open it again; none for PostgreSQL.
 */
const watched = (target: string | undefined) => {
  const parsed = target === undefined ? undefined : Target.parse(target)
  if (parsed === undefined || Either.isLeft(parsed) || parsed.right._tag !== "Sqlite") return undefined
  return {
    path: parsed.right.filename,
    open: Layer.build(client(target)).pipe(Effect.map(Context.get(SqlClient.SqlClient)))
  }
}

const wildcard = (host: string) => host === "0.0.0.0" || host === "::" || host === "[::]"

export const command = Command.make(
  "console",
  { db, prefix, port, host, allowHost, readOnly },
  (options) =>
    Effect.gen(function*() {
      if (!Number.isSafeInteger(options.port) || options.port < 0 || options.port > 65_535) {
        return yield* new InvalidParameterError({
          parameter: "--port",
          value: options.port,
          reason: "must be 0..65535"
        })
      }
      // An IPv6 address may come in brackets, as in a URL.
      const bind = /^\[.*\]$/.test(options.host) ? options.host.slice(1, -1) : options.host
      if (HttpServers.listenAddressProblem(bind) !== undefined || (bind !== options.host && !isIPv6(bind))) {
        return yield* new InvalidParameterError({
          parameter: "--host",
          value: options.host,
          reason: "must be an IP address or a host name"
        })
      }
      const refusedName = options.allowHost.find((name) => hostName(name) === undefined)
      if (refusedName !== undefined) {
        return yield* new InvalidParameterError({
          parameter: "--allow-host",
          value: refusedName,
          reason: "must be a host name or an IP address, without a port"
        })
      }
      // The header names the database the client opens (blank variables skipped alike).
      const target = targetOf(Option.getOrUndefined(options.db))
      const database = redact(target ?? "")
      // Loaded when the console runs, so that `--help` does not load the HTTP server.
      const [NodeHttpServer, Server] = yield* Effect.promise(() =>
        Promise.all([import("@effect/platform-node/NodeHttpServer"), import("./console/server.js")])
      )
      const served = Layer.scopedDiscard(Effect.gen(function*() {
        const address = yield* HttpServer.addressWith((address) => Effect.succeed(address))
        const bound = hostName(bind)
        const app = yield* Server.make({
          prefix: options.prefix,
          readOnly: options.readOnly,
          database,
          // The address it binds is a name it may be reached by, unless that is every interface's.
          allowedHosts: [
            ...(wildcard(bind) || bound === undefined || Server.isLoopback(bound) ? [] : [bound]),
            ...options.allowHost.flatMap((name) => hostName(name) ?? [])
          ],
          port: address._tag === "TcpAddress" ? address.port : 0,
          file: watched(target)
        })
        yield* HttpServer.serveEffect(app)
        const url = address._tag === "TcpAddress"
          ? `http://${address.hostname.includes(":") ? `[${address.hostname}]` : address.hostname}:${address.port}/`
          : address.path
        yield* say(
          `leasehold console: ${url} (${database}${options.readOnly ? ", read-only" : ""}). Ctrl-C stops it.`
        )
        if (!Server.isLoopback(hostName(bind) ?? "")) {
          yield* warn(
            `leasehold console: listening on ${options.host}, not loopback: whoever reaches it can act on the ` +
              "queues (the token only keeps other sites' pages out; add --read-only to only show them)."
          )
        }
      }))
      return yield* Layer.launch(served).pipe(
        Effect.provide(
          Layer.scoped(HttpServer.HttpServer, HttpServers.serve(NodeHttpServer, { port: options.port, host: bind }))
        ),
        Effect.provide(client(target))
      )
    })
).pipe(
  Command.withDescription(
    "Serves the operator's console: mailboxes with in-flight leases and dead letters (redrive, delete), the " +
      "merge queue's lock and audit log (recover now), work-lease domains. Refreshes live; binds loopback.\n" +
      "Example: leasehold console --db ./.leasehold/demo.db --port 8080 --read-only"
  )
)
