/**
 * Health: what an orchestrator (Kubernetes, a load balancer) asks a worker.
 *
 * `GET /health/live` answers 200 while the process serves at all.
 * `GET /health/ready` answers 200, or 503 with the reasons when the worker is
 * shutting down, a registered loop is not running, or a loop's heartbeat is
 * older than `staleAfter` (use the watchdog's threshold). `GET /metrics` is
 * every Effect `Metric` of the runtime in Prometheus text, rendered by
 * OpenTelemetry's Prometheus serializer through `@effect/opentelemetry`,
 * with each registered loop's `leasehold_heartbeat_age_seconds` as of the
 * scrape. Anything else is 404. Its layers also provide `Runnable.Readiness`,
 * where loops count themselves in, so no loop imports this module.
 */
import type { ServeError } from "@effect/platform/HttpServerError"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type { MissingPackageError } from "./Errors.js"
import { recordAge } from "./internal/heartbeat.js"
import * as HttpServers from "./internal/httpServer.js"
import * as Optional from "./internal/optional.js"
import * as Options_ from "./internal/options.js"
import { healthKey } from "./internal/readiness.js"
import * as Runnable from "./Runnable.js"

/**
 * The readiness verdict and why.
 *
 * @category models
 */
export interface Readiness {
  readonly ready: boolean
  readonly reasons: ReadonlyArray<string>
}

/**
 * Tracks what readiness depends on. Loops register with it whether it comes from `layer`, `layerRegistry` or
 * by hand (`Layer.succeed(Health, …)`).
 *
 * @category services
 */
export class Health extends Context.Tag(healthKey)<Health, {
  /** Counts `loop` in readiness until the scope closes. */
  readonly register: (loop: Runnable.Runnable) => Effect.Effect<void, never, Scope.Scope>
  /** From now on, not ready: the worker is draining. */
  readonly setShuttingDown: Effect.Effect<void>
  readonly readiness: Effect.Effect<Readiness>
  /** `http://host:port` of the health server, when one is serving. */
  readonly url: string | undefined
}>() {}

const makeRegistry = (
  staleAfter: Duration.Duration,
  url: string | undefined
): { readonly health: Health["Type"]; readonly recordAges: Effect.Effect<void> } => {
  const loops = new Set<Runnable.Runnable>()
  let shuttingDown = false
  const health: Health["Type"] = {
    register: (loop) =>
      Effect.acquireRelease(Effect.sync(() => loops.add(loop)), () => Effect.sync(() => loops.delete(loop))),
    setShuttingDown: Effect.sync(() => {
      shuttingDown = true
    }),
    readiness: Effect.gen(function*() {
      const reasons: Array<string> = []
      if (shuttingDown) reasons.push("shutting down")
      for (const loop of loops) {
        if (!(yield* loop.running)) reasons.push(`loop "${loop.name}" is not running`)
        const elapsed = yield* loop.heartbeat.elapsed
        if (Duration.greaterThan(elapsed, staleAfter)) {
          reasons.push(`loop "${loop.name}" has not beaten for ${Duration.format(elapsed)}`)
        }
      }
      return { ready: reasons.length === 0, reasons }
    }),
    url
  }
  const recordAges = Effect.suspend(() =>
    Effect.forEach(loops, (loop) => recordAge(loop.name, loop.heartbeat), { discard: true })
  )
  return { health, recordAges }
}

/** `Health` and the `Runnable.Readiness` the loops register with, one registry behind both. */
const services = (health: Health["Type"]): Context.Context<Health | Runnable.Readiness> =>
  Context.make(Health, health).pipe(
    Context.add(Runnable.Readiness, { register: health.register, setShuttingDown: health.setShuttingDown })
  )

/**
 * Options of `layer`; `layerRegistry` takes `staleAfter` only.
 *
 * @category models
 */
export interface Options {
  /** The port to serve on: 0..65535, 0 picks a free one (see `url`). */
  readonly port: number
  /**
   * The address to listen on, an IP address or a host name (default `127.0.0.1`; `0.0.0.0` for probes from
   * outside the machine).
   */
  readonly host?: string | undefined
  /**
   * How old a heartbeat may be in a ready worker: more than 0, at most 24 hours (default 720 s, the watchdog's
   * default threshold).
   */
  readonly staleAfter?: Duration.DurationInput | undefined
}

/** The longest `staleAfter`: a loop that may go a day without a beat is not being watched. */
const maxStaleAfter = Duration.hours(24)

const StaleAfter = Schema.optionalWith(
  Options_.duration({ positive: true, max: maxStaleAfter, range: "must be more than 0 and at most 24 hours" }),
  { default: () => Duration.seconds(720) }
)

const decodeRegistryOptions = Options_.decoder("Health.layerRegistry", { staleAfter: StaleAfter })

const decodeOptions = Options_.decoder("Health.layer", {
  port: Options_.intBetween(0, 65535, "must be a port number: an integer in 0..65535"),
  host: Schema.optionalWith(Options_.ruledString(HttpServers.listenAddressProblem), { default: () => "127.0.0.1" }),
  staleAfter: StaleAfter
})

/**
 * Readiness tracking without a server (for tests, or a process that serves health elsewhere).
 *
 * @category layers
 */
export const layerRegistry = (
  options?: Pick<Options, "staleAfter">
): Layer.Layer<Health | Runnable.Readiness, ParseResult.ParseError> =>
  Layer.effectContext(
    Effect.map(decodeRegistryOptions(options), ({ staleAfter }) => services(makeRegistry(staleAfter, undefined).health))
  )

/**
 * The server's pieces, loaded when `layer` is built so that a worker without a health server loads no HTTP
 * server and no exporter: `@effect/opentelemetry` and `@opentelemetry/exporter-prometheus` are optional peer
 * dependencies. (`node:http` is imported statically, by `internal/httpServer.ts`: a dynamic import of a
 * built-in stays a real `import()` in the command line's bundle, which its launcher cannot run once the code
 * cache is used.)
 */
const serverModules = Effect.all({
  NodeHttpServer: Optional.load(
    ["@effect/platform-node"],
    "Health.layer",
    () => import("@effect/platform-node/NodeHttpServer")
  ),
  HttpServerRequest: Effect.promise(() => import("@effect/platform/HttpServerRequest")),
  HttpServerResponse: Effect.promise(() => import("@effect/platform/HttpServerResponse")),
  Metrics: Optional.load(["@effect/opentelemetry"], "Health.layer", () => import("@effect/opentelemetry/Metrics")),
  Resource: Optional.load(["@effect/opentelemetry"], "Health.layer", () => import("@effect/opentelemetry/Resource")),
  Prometheus: Optional.load(
    ["@opentelemetry/exporter-prometheus"],
    "Health.layer",
    () => import("@opentelemetry/exporter-prometheus")
  )
})

/** Prometheus text of every metric in the runtime, rendered by OpenTelemetry's serializer. */
const prometheusText = (
  { Metrics, Prometheus: { PrometheusExporter, PrometheusSerializer }, Resource }: Effect.Effect.Success<
    typeof serverModules
  >
): Effect.Effect<Effect.Effect<string>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const exporter = new PrometheusExporter({ preventServerStart: true })
    const producer = yield* Metrics.makeProducer.pipe(
      Effect.provide(Resource.layer({ serviceName: "leasehold" }))
    )
    yield* Metrics.registerProducer(producer, () => exporter)
    const serializer = new PrometheusSerializer()
    return Effect.map(
      Effect.promise(() => exporter.collect()),
      ({ resourceMetrics }) => serializer.serialize(resourceMetrics)
    )
  })

/**
 * Serves health and metrics on `port` (0 picks a free one; see `url`) until
 * the layer closes. `host` defaults to `127.0.0.1`: a probe from outside the
 * machine or container (Kubernetes' kubelet) needs `host: "0.0.0.0"`.
 * `staleAfter` (default 720 s, the watchdog's default threshold) is how old a
 * heartbeat may be in a ready worker.
 *
 * The server never holds a stopping process, nor gives its sockets to clients
 * that do not use them: the limits of every leasehold server
 * (`internal/httpServer.ts`) cut a client that does not finish its request or
 * idles after one, cap the open connections, and close every connection still
 * open when the layer closes.
 *
 * @category layers
 */
export const layer = (
  options: Options
): Layer.Layer<Health | Runnable.Readiness, ServeError | ParseResult.ParseError | MissingPackageError> =>
  Layer.scopedContext(
    Effect.gen(function*() {
      const { host, port, staleAfter } = yield* decodeOptions(options)
      const modules = yield* serverModules
      const { HttpServerRequest, HttpServerResponse, NodeHttpServer } = modules
      const server = yield* HttpServers.serve(NodeHttpServer, { port, host })
      const address = server.address
      const url = address._tag === "TcpAddress"
        ? `http://${
          address.hostname === "0.0.0.0" || address.hostname === "::" ? "127.0.0.1" : address.hostname
        }:${address.port}`
        : undefined
      const { health, recordAges } = makeRegistry(staleAfter, url)
      const metrics = yield* prometheusText(modules)
      yield* server.serve(
        Effect.gen(function*() {
          const request = yield* HttpServerRequest.HttpServerRequest
          switch (request.url.split("?")[0]) {
            case "/health/live":
              return HttpServerResponse.unsafeJson({ live: true })
            case "/health/ready": {
              const readiness = yield* health.readiness
              return HttpServerResponse.unsafeJson(readiness, { status: readiness.ready ? 200 : 503 })
            }
            case "/metrics":
              yield* recordAges
              return HttpServerResponse.text(yield* metrics, { contentType: "text/plain; version=0.0.4" })
            default:
              return HttpServerResponse.text("not found\n", { status: 404 })
          }
        })
      )
      yield* Effect.logInfo(`Health server listening on ${url}`)
      return services(health)
    })
  )
