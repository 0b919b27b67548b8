/**
 * `leasehold console`: the operator's console in a browser — mailboxes, in-flight leases counting down, dead
 * letters (redrive, delete), the merge queue's lock and audit log (recover now), work-lease domains — served
 * until the process is stopped. It binds loopback unless `--host` says otherwise, never creates tables, and
 * with `--read-only` offers no action. The page and its guards are in src/internal/console/.
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as HttpServer from "@effect/platform/HttpServer"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Http from "node:http"
import { InvalidParameterError } from "../Errors.js"
import { client, db, prefix, redact } from "./database.js"

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
    "A name or address the console may be reached by besides loopback's (repeatable), e.g. the machine's name when\n" +
      "--host binds every interface. Requests addressed to any other name are refused (DNS rebinding)."
  ),
  Options.repeated
)
const readOnly = Options.boolean("read-only").pipe(
  Options.withDescription("Show everything, change nothing: no action is offered or accepted.")
)

/** The host as a URL names it (IPv6 in brackets), for the allow list. */
const urlHostname = (host: string) => {
  const url = `http://${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}`
  return URL.canParse(url) ? new URL(url).hostname : host
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
      const target = Option.getOrUndefined(options.db) ?? process.env.LEASEHOLD_DATABASE_URL ?? process.env.DATABASE_URL
      const database = redact(target ?? "")
      // Loaded when the console runs, so that `--help` does not load the HTTP server.
      const [NodeHttpServer, Server] = yield* Effect.promise(() =>
        Promise.all([import("@effect/platform-node/NodeHttpServer"), import("../internal/console/server.js")])
      )
      const served = Layer.scopedDiscard(Effect.gen(function*() {
        const app = yield* Server.make({
          prefix: options.prefix,
          readOnly: options.readOnly,
          database,
          // The address it binds is a name it may be reached by, unless that is every interface's.
          allowedHosts: [
            ...(wildcard(options.host) || Server.isLoopback(urlHostname(options.host))
              ? []
              : [urlHostname(options.host)]),
            ...options.allowHost.map(urlHostname)
          ]
        })
        yield* HttpServer.serveEffect(app)
        const address = yield* HttpServer.addressWith((address) => Effect.succeed(address))
        const url = address._tag === "TcpAddress"
          ? `http://${address.hostname.includes(":") ? `[${address.hostname}]` : address.hostname}:${address.port}/`
          : address.path
        yield* Console.log(
          `leasehold console: ${url} (${database}${options.readOnly ? ", read-only" : ""}). Ctrl-C stops it.`
        )
        if (!Server.isLoopback(urlHostname(options.host))) {
          yield* Console.error(
            `leasehold console: listening on ${options.host}, not loopback: whoever reaches it can act on the ` +
              "queues (the token only keeps other sites' pages out; add --read-only to only show them)."
          )
        }
      }))
      return yield* Layer.launch(served).pipe(
        Effect.provide(NodeHttpServer.layer(() => Http.createServer(), { port: options.port, host: options.host })),
        Effect.provide(client(target))
      )
    })
).pipe(
  Command.withDescription(
    "Serves the operator's console: mailboxes with in-flight leases and dead letters (redrive, delete), the\n" +
      "merge queue's lock and audit log (recover now), work-lease domains. Refreshes live; binds loopback.\n" +
      "Example: leasehold console --db ./.leasehold/demo.db --port 8080 --read-only"
  )
)
