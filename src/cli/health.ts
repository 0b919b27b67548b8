/**
 * `leasehold health`: asks a running worker's health server whether it is live and ready. A `--url` that is not
 * an http(s) URL is a usage error (exit 2); a worker that does not answer, or is not ready, exit 1.
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import { InvalidParameterError } from "../Errors.js"
import { redact, scrub } from "../internal/sql/target.js"
import { printable, say, sayJson } from "./output.js"

/** The worker did not answer, or answered that it is not ready. `url` is shown without its password. */
export class NotHealthyError extends Schema.TaggedError<NotHealthyError>()("NotHealthyError", {
  url: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `${this.url}: ${this.reason}`
  }
}

const url = Options.text("url").pipe(
  Options.withDescription("The worker's health server, e.g. http://127.0.0.1:9464 (see Health.layer)."),
  Options.withDefault("http://127.0.0.1:9464")
)
const metrics = Options.boolean("metrics").pipe(Options.withDescription("Also print the leasehold_* metrics."))
const json = Options.boolean("json").pipe(Options.withDescription("Print JSON for scripts."))

const get = (base: string, path: string) =>
  Effect.tryPromise({
    try: async () => {
      const response = await fetch(new URL(path, base), { signal: AbortSignal.timeout(5000) })
      return { status: response.status, body: await response.text() }
    },
    // Node's own error text can quote the whole URL, password and all.
    catch: (cause) =>
      new NotHealthyError({
        url: redact(base),
        reason: `no answer (${scrub(String((cause as Error).message), base)}). ` +
          "Is the worker running with Health.layer on this port?"
      })
  })

/** Why `url` is not a health server's address, if it is not. */
const urlProblem = (url: string): string | undefined => {
  if (!URL.canParse(url)) return "must be an http:// or https:// URL, e.g. http://127.0.0.1:9464"
  const { protocol } = new URL(url)
  return protocol === "http:" || protocol === "https:"
    ? undefined
    : `must be an http:// or https:// URL, not ${protocol}// (e.g. http://127.0.0.1:9464)`
}

export const command = Command.make("health", { url, metrics, json }, (options) =>
  Effect.gen(function*() {
    const problem = urlProblem(options.url)
    if (problem !== undefined) {
      return yield* new InvalidParameterError({ parameter: "--url", value: redact(options.url), reason: problem })
    }
    const live = yield* get(options.url, "/health/live")
    const ready = yield* get(options.url, "/health/ready")
    const readiness = (() => {
      try {
        return JSON.parse(ready.body) as { ready?: boolean; reasons?: ReadonlyArray<string> }
      } catch {
        return { ready: ready.status === 200, reasons: [] }
      }
    })()
    const lines = options.metrics
      ? (yield* get(options.url, "/metrics")).body.split("\n").filter((line) => line.startsWith("leasehold_"))
      : []
    if (options.json) {
      // What the server answered is another party's text: printed through the one printer.
      yield* sayJson({
        live: live.status === 200,
        ready: ready.status === 200,
        reasons: readiness.reasons ?? [],
        ...(options.metrics ? { metrics: lines } : {})
      })
    } else {
      yield* say(`live   ${live.status === 200 ? "yes" : `no (${live.status})`}`)
      yield* say(
        `ready  ${
          ready.status === 200 ? "yes" : `no (${ready.status}): ${(readiness.reasons ?? []).map(printable).join("; ")}`
        }`
      )
      for (const metric of lines) yield* say(metric)
    }
    if (ready.status !== 200) {
      return yield* new NotHealthyError({
        url: redact(options.url),
        reason: `not ready: ${(readiness.reasons ?? []).join("; ") || `status ${ready.status}`}`
      })
    }
  })).pipe(
    Command.withDescription(
      "Queries a running worker's /health/live, /health/ready (and /metrics). Exit 1 when not ready.\n" +
        "Example: leasehold health --url http://127.0.0.1:9464 --metrics"
    )
  )
