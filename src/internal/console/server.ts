/**
 * The operator's console as an HTTP app (`leasehold console` serves it):
 *
 * - `GET /` the page, `GET /live` its live part (see page.ts), `GET /console.js`.
 * - `POST /actions/dead-letters/redrive` and `…/delete` (one letter by `id`, or all), and
 *   `POST /actions/merge-queue/recover` (self-healing now). Each redirects back to the page with what it did.
 *
 * Actions are guarded against cross-site requests: the form must carry the token this process drew at start
 * (it is only in the console's own page, which no other site can read), and a request whose `Origin` is another
 * host (or `null`) is refused whatever it carries. The console answers only requests addressed (`Host`) to a
 * loopback name or to one it was told of (`allowedHosts`): a page of another site whose name was re-pointed at
 * the console's address (DNS rebinding) would otherwise be same-origin with it and read the page, token included. Responses forbid framing and inline scripts. A read-only console renders
 * no action and refuses every POST. Nothing here creates a table: a part whose tables are missing says so.
 */
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Cause from "effect/Cause"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { randomBytes, timingSafeEqual } from "node:crypto"
import * as Page from "./page.js"
import * as Snapshot from "./snapshot.js"

export interface Options {
  /** Table name prefix the workers use. */
  readonly prefix: string
  /** Show, never change: no action is rendered or accepted. */
  readonly readOnly: boolean
  /** The database as the page names it (secrets redacted). */
  readonly database: string
  /** Names (or addresses) besides loopback's that requests may be addressed to (`Host`, without the port). */
  readonly allowedHosts: ReadonlyArray<string>
  /** How often throughput is sampled (default 2 s). */
  readonly sampleEvery?: Duration.DurationInput | undefined
}

const headers = {
  "content-security-policy": "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; " +
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-frame-options": "DENY",
  "x-content-type-options": "nosniff",
  // Not no-referrer: under it a browser sends `Origin: null` with the page's own forms, which the guard refuses.
  "referrer-policy": "same-origin",
  "cache-control": "no-store"
}

const html = (body: string, status = 200) =>
  HttpServerResponse.text(body, { status, contentType: "text/html; charset=utf-8", headers })

const refused = (status: number, reason: string) =>
  html(
    `<!doctype html><title>refused</title><p>${Page.escape(reason)}</p><p><a href="/">Back to the console</a></p>`,
    status
  )

const ActionForm = Schema.Struct({ token: Schema.String, id: Schema.optional(Schema.String) })

/** Whether `given` is the process's token (in constant time). */
const sameToken = (given: string, token: string) => {
  const a = Buffer.from(given)
  const b = Buffer.from(token)
  return a.length === b.length && timingSafeEqual(a, b)
}

/** The console's app on the `SqlClient` in context; the throughput sampler runs until `Scope` closes. */
export const make = (options: Options) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const token = randomBytes(24).toString("base64url")
    const sampler = yield* Snapshot.makeSampler(sql, options.prefix)
    yield* sampler.sample.pipe(Effect.repeat(Schedule.spaced(options.sampleEvery ?? "2 seconds")), Effect.forkScoped)
    const view = (notice?: string): Page.View => ({
      database: options.database,
      token,
      readOnly: options.readOnly,
      notice
    })
    const snapshot = Snapshot.snapshot(sql, options.prefix, sampler)
    const admin = Effect.promise(() => import("../../MailboxSqlAdmin.js"))
    const deadLetters = Effect.flatMap(admin, (module) => module.deadLetters({ prefix: options.prefix, create: false }))
    const mergeQueue = Effect.flatMap(
      Effect.promise(() => import("../../MergeQueue.js")),
      (module) => module.make({ prefix: options.prefix, create: false })
    )

    /** Checks the request, runs `work` with its form, and redirects to the page saying what happened. */
    const action = <E extends { readonly message: string }>(
      anchor: string,
      work: (id: string | undefined) => Effect.Effect<string, E, SqlClient.SqlClient>
    ) =>
      Effect.gen(function*() {
        if (options.readOnly) return yield* refused(403, "This console is read-only (started with --read-only).")
        const request = yield* HttpServerRequest.HttpServerRequest
        const origin = request.headers["origin"]
        if (origin !== undefined && hostOf(origin) !== request.headers["host"]) {
          return yield* refused(403, `Refused: a request from ${origin}, not from this console's page.`)
        }
        const form = yield* HttpServerRequest.schemaBodyUrlParams(ActionForm).pipe(Effect.option)
        if (Option.isNone(form) || !sameToken(form.value.token, token)) {
          return yield* refused(403, "Refused: the console's token is missing or wrong. Use the console's own page.")
        }
        const notice = yield* work(form.value.id).pipe(
          Effect.catchAll((error) => Effect.succeed(`Failed: ${error.message}`)),
          Effect.provideService(SqlClient.SqlClient, sql)
        )
        return HttpServerResponse.redirect(`/?notice=${encodeURIComponent(notice)}#${anchor}`, {
          status: 303,
          headers
        })
      })

    const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`

    const router = HttpRouter.empty.pipe(
      HttpRouter.get(
        "/",
        Effect.gen(function*() {
          const request = yield* HttpServerRequest.HttpServerRequest
          const notice = new URL(request.url, "http://console").searchParams.get("notice") ?? undefined
          return yield* html(Page.page(yield* snapshot, view(notice)))
        })
      ),
      HttpRouter.get("/favicon.ico", HttpServerResponse.empty({ status: 204 })),
      HttpRouter.get("/live", Effect.flatMap(snapshot, (now) => html(Page.live(now, view())))),
      HttpRouter.get(
        "/console.js",
        HttpServerResponse.text(Page.script, { contentType: "text/javascript; charset=utf-8", headers })
      ),
      HttpRouter.post(
        "/actions/dead-letters/redrive",
        action("dead-letters", (id) =>
          Effect.flatMap(deadLetters, (letters) =>
            Effect.map(
              letters.redrive(id === undefined ? {} : { ids: [id] }),
              (n) =>
                id === undefined || n > 0
                  ? `Redrove ${plural(n, "dead letter")} to their queues.`
                  : `Dead letter ${id} is gone (redriven or deleted meanwhile).`
            )))
      ),
      HttpRouter.post(
        "/actions/dead-letters/delete",
        action("dead-letters", (id) =>
          Effect.flatMap(deadLetters, (letters) =>
            Effect.map(
              letters.purge(id === undefined ? {} : { ids: [id] }),
              (n) => `Deleted ${plural(n, "dead letter")}.`
            )))
      ),
      HttpRouter.post(
        "/actions/merge-queue/recover",
        action("merge-queue", () =>
          Effect.flatMap(mergeQueue, (queue) =>
            Effect.map(
              queue.detectAndRecoverStale,
              (stats) =>
                `Recovery: ${plural(stats.locksCleaned, "stale lock")} cleared, ${stats.entriesReclaimed} ${
                  stats.entriesReclaimed === 1 ? "entry" : "entries"
                } back to pending.`
            )))
      ),
      // A bug of the console's, not the database (the snapshot reports those): logged whole, named on the page.
      HttpRouter.catchAllCause((cause) =>
        Effect.zipRight(
          Effect.logError("leasehold console: a request failed", cause),
          refused(500, `The console failed: ${errorMessage(Cause.squash(cause))}`)
        )
      )
    )
    const allowed = new Set(options.allowedHosts.map((host) => host.toLowerCase()))
    return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
      const name = hostnameOf(request.headers["host"])
      return name !== undefined && (isLoopback(name) || allowed.has(name))
        ? router
        : refused(
          403,
          `Refused: this console answers to 127.0.0.1, localhost${
            allowed.size === 0 ? "" : `, ${[...allowed].join(", ")}`
          }, not ${request.headers["host"]} (leasehold console --allow-host NAME adds a name).`
        )
    })
  })

const errorMessage = (error: unknown) => error instanceof Error ? error.message : "see its log"

const hostOf = (origin: string): string | undefined => URL.canParse(origin) ? new URL(origin).host : undefined

/** The name a `Host` header addresses, without its port (IPv6 in brackets, as URLs write it). */
const hostnameOf = (host: string | undefined): string | undefined =>
  host === undefined || !URL.canParse(`http://${host}`) ? undefined : new URL(`http://${host}`).hostname

/** Whether a host name or address (as `URL` normalises it) is this machine's loopback. */
export const isLoopback = (name: string): boolean =>
  name === "localhost" || name === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(name) ||
  /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(name)
