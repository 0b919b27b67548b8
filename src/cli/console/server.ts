/**
 * The operator's console as an HTTP app (`leasehold console` serves it): `GET /` the page and `/live` its live
 * part (page.ts), `/queue` a queue's messages by page (browse.ts), `/keys` a queue's keys (keys.ts), `/message` and `/dead-letter` one whole
 * (message.ts); `POST /actions/…` redrive or delete dead letters, recover the merge queue, delete a message no
 * receiver holds, pause, resume or drop a queue — each redirecting back (its `Referer`) with what it did, a
 * delete only after a confirmation posted with its one-time value (confirm.ts).
 *
 * Why the guards: every form carries the identity of the database it was read from (source.ts), so an action
 * from a page of a replaced file is refused (409); a form carries exactly its action's fields, or is refused
 * (403). Against cross-site requests an action needs this process's token (only in its own page) and a
 * same-host `Origin`; against DNS rebinding only requests addressed (`Host`, parsed strictly, compared exactly)
 * to a loopback name or an `allowedHosts` one, on the console's port, are answered. Responses forbid framing and
 * inline scripts; a read-only console renders no action and refuses every POST; nothing creates a table.
 */
import * as IncomingMessage from "@effect/platform/HttpIncomingMessage"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import type * as UrlParams from "@effect/platform/UrlParams"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { randomBytes, timingSafeEqual } from "node:crypto"
import * as HttpServers from "../../internal/httpServer.js"
import * as StoredTime from "../../internal/storedTime.js"
import * as Browse from "./browse.js"
import * as Confirm from "./confirm.js"
import * as Keys from "./keys.js"
import * as Message from "./message.js"
import * as Page from "./page.js"
import * as Snapshot from "./snapshot.js"
import * as Source from "./source.js"

export interface Options {
  /** Table name prefix the workers use. */
  readonly prefix: string
  /** Show, never change: no action is rendered or accepted. */
  readonly readOnly: boolean
  /** The database as the page names it (secrets redacted). */
  readonly database: string
  /**
   * Names (or addresses) besides loopback's that requests may be addressed to (`Host`, without the port), as
   * `HttpServers.parseHost` gives them (lower case; IPv6 in brackets).
   */
  readonly allowedHosts: ReadonlyArray<string>
  /** The port the console listens on: the only one a request's `Host` may name (none means 80). */
  readonly port: number
  /** How often throughput is sampled (default 2 s). */
  readonly sampleEvery?: Duration.DurationInput | undefined
  /** The SQLite file read, watched for replacement (none on PostgreSQL). */
  readonly file?: Source.File | undefined
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

/** The fields an action may take besides the token, the database and the confirmation: each given at most once. */
type Field = "id" | "queue" | "at"

/** What an action takes: each field it reads, required or not; any other field refuses the form. */
type Takes = { readonly [K in Field]?: "required" | "optional" }

/** An action's form as posted: the token, the identity of the database the page was read from, and its fields. */
interface ActionForm {
  readonly token: string
  readonly db: string
  readonly confirm: string | undefined
  readonly id: string | undefined
  readonly queue: string | undefined
  /**
   * What the page showed of the row `id` names: a message's `enqueued_at`, a dead letter's `dead_lettered_at`
   * (epoch milliseconds, StoredTime.toField). The action acts on the row only while it still holds it.
   */
  readonly at: string | undefined
}

/** An action's form is a token, a database identity and an id: a larger body is refused before it is read whole. */
const maxActionBody = Option.some(16 * 1024)

/**
 * The form `params` carry for an action that takes `takes`, or why it is not one the console's pages post: a
 * field given twice, one the action does not take (a confirmation, for an action that asks none), a required one
 * missing, or no database identity.
 */
const formOf = (params: UrlParams.UrlParams, takes: Takes, confirmed: boolean): Either.Either<ActionForm, string> => {
  const fields = new Map<string, string>()
  for (const [name, value] of params) {
    if (fields.has(name)) return Either.left(`the form gives ${clipped(JSON.stringify(name))} twice`)
    if (!["token", "db", ...(confirmed ? ["confirm"] : [])].includes(name) && !Object.hasOwn(takes, name)) {
      return Either.left(`this action takes no field ${clipped(JSON.stringify(name))}`)
    }
    fields.set(name, value)
  }
  for (const [name, need] of Object.entries(takes)) {
    if (need === "required" && !fields.has(name)) return Either.left(`the form names no ${name}`)
  }
  const at = fields.get("at")
  if (at !== undefined && !fields.has("id")) return Either.left("the form gives a row's time but names no row")
  if (at !== undefined && StoredTime.ofField(at) === undefined) {
    return Either.left(`the form's row time ${clipped(JSON.stringify(at))} is not one the console's pages give`)
  }
  const db = fields.get("db")
  if (db === undefined) return Either.left("the form does not say which database its page was read from")
  return Either.right({
    token: fields.get("token") ?? "",
    db,
    confirm: fields.get("confirm"),
    id: fields.get("id"),
    queue: fields.get("queue"),
    at: fields.get("at")
  })
}

/** The page and search a request asks for. */
const queryOf = (request: HttpServerRequest.HttpServerRequest) =>
  Snapshot.query(new URL(request.url, "http://console").searchParams)

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
    const source = yield* Source.make(sql, options.prefix, options.sampleEvery ?? "2 seconds", options.file)
    const confirmations = Confirm.make()
    const view = (query: Snapshot.Query, notice?: { readonly text: string; readonly at: string }): Page.View => ({
      database: options.database,
      token,
      readOnly: options.readOnly,
      notice: notice?.text,
      noticeAt: notice?.at,
      query
    })
    /** The live part, or what is wrong with the database file instead (never the old file's contents). */
    const livePart = (query: Snapshot.Query, shown: Page.View) =>
      Effect.flatMap(source.current, (current) =>
        current._tag === "Open"
          ? Effect.zipWith(
            Snapshot.snapshot(current.sql, options.prefix, current.sampler, query),
            Effect.either(current.identity),
            (snapshot, identity) => Page.live(snapshot, { ...shown, identity: Either.getOrElse(identity, () => "") })
          )
          : Effect.map(
            Clock.currentTimeMillis,
            (at) =>
              `<div id="snapshot" data-now="${at}"><p class="error" role="alert" id="database-problem">${
                Page.escape(current.problem)
              }</p></div>`
          ))
    const admin = Effect.promise(() => import("../../MailboxSqlAdmin.js"))
    const deadLetters = Effect.flatMap(admin, (module) => module.deadLetters({ prefix: options.prefix, create: false }))
    const mergeQueue = Effect.flatMap(
      Effect.promise(() => import("../../internal/mergeQueue/look.js")),
      (module) => module.look({ prefix: options.prefix })
    )

    /**
     * Checks the request, runs `work` with its form, and redirects to the page saying what happened. The form
     * must be the token, the identity of the database its page was read from (the one the console reads now),
     * and exactly the fields the action `takes`. With `confirm`, the first POST answers the confirmation page it
     * describes, and `work` runs only when the form carries the one-time value that page was given for exactly
     * this action, queue, id and database (confirm.ts).
     */
    const action = <E extends { readonly message: string }>(
      anchor: (typeof Page.noticeAnchors)[number],
      takes: Takes,
      work: (form: ActionForm) => Effect.Effect<string, E | RowGoneError, SqlClient.SqlClient>,
      confirm?: (form: ActionForm) => Effect.Effect<Omit<Confirm.Request, "fields" | "back">, E, SqlClient.SqlClient>
    ) =>
      Effect.gen(function*() {
        if (options.readOnly) return yield* refused(403, "This console is read-only (started with --read-only).")
        const request = yield* HttpServerRequest.HttpServerRequest
        const origin = request.headers["origin"]
        if (origin !== undefined && !sameOrigin(origin, request.headers["host"])) {
          return yield* refused(403, `Refused: a request from ${origin}, not from this console's page.`)
        }
        const params = yield* request.urlParamsBody.pipe(
          IncomingMessage.withMaxBodySize(maxActionBody),
          Effect.orElseSucceed((): UrlParams.UrlParams => [])
        )
        const tokens = params.filter(([name]) => name === "token")
        if (tokens.length !== 1 || !sameToken(tokens[0]![1], token)) {
          return yield* refused(403, "Refused: the console's token is missing or wrong. Use the console's own page.")
        }
        const parsed = formOf(params, takes, confirm !== undefined)
        if (Either.isLeft(parsed)) {
          return yield* refused(
            403,
            `Refused: ${parsed.left}; this is not a form of the console's pages. Nothing was changed.`
          )
        }
        const form = parsed.right
        const current = yield* source.current
        if (current._tag === "Problem") {
          return yield* refused(409, `Refused: ${current.problem} Nothing was changed.`)
        }
        const database = yield* current.identity.pipe(Effect.either)
        if (Either.isLeft(database)) {
          return yield* refused(409, `Refused: ${database.left.message}. Nothing was changed.`)
        }
        const kind = new URL(request.url, "http://console").pathname
        const binding: Confirm.Binding = { kind, queue: form.queue, id: form.id, at: form.at, database: form.db }
        const given = confirm === undefined ? undefined : form.confirm
        // A confirmed action returns where the first step came from (kept with its confirmation value).
        const confirmed = given === undefined ? undefined : confirmations.take(given, binding)
        if (given !== undefined && confirmed === undefined) {
          return yield* refused(
            403,
            "Refused: that confirmation was used already, expired, or was given for another action (another " +
              "kind, queue, id or database). Nothing was deleted; start again from the console's page."
          )
        }
        if (form.db !== database.right) {
          return yield* refused(
            409,
            `Refused: the page this came from was read from another database (${clipped(form.db)}) than the one ` +
              `the console reads now (${database.right}${
                options.file === undefined ? "" : `: the file ${options.file.path} was replaced`
              }). Nothing was changed: reload the page and act on what it shows now.`
          )
        }
        const onDatabase = <A, F>(effect: Effect.Effect<A, F, SqlClient.SqlClient>) =>
          Effect.provideService(effect, SqlClient.SqlClient, current.sql)
        // Back to the page and search the form was on (only those two are taken from the Referer), or from a
        // browse or message page to the queue's browse page.
        const referer = confirmed !== undefined ? confirmed.back : request.headers["referer"]
        const from = referer !== undefined && URL.canParse(referer)
          ? Snapshot.query(new URL(referer).searchParams)
          : { q: "", page: 1 }
        const page = from.page > 1 ? from.page : undefined
        const browsed = referer !== undefined && URL.canParse(referer) ? Browse.returnTo(new URL(referer)) : undefined
        const back = (notice: string) =>
          HttpServerResponse.redirect(
            browsed !== undefined
              ? `${browsed}&notice=${encodeURIComponent(notice)}#messages`
              : `/${Page.search(from.q, page, { text: notice, at: anchor })}#${anchor}`,
            { status: 303, headers }
          )
        if (confirm !== undefined && given === undefined) {
          const asked = yield* onDatabase(confirm(form)).pipe(Effect.either)
          // Nothing is done unconfirmed: a failure to ask is the notice.
          if (asked._tag === "Left") return back(`Failed: ${asked.left.message}`)
          return yield* html(Confirm.page({
            ...asked.right,
            fields: {
              token,
              db: form.db,
              ...(form.id === undefined ? {} : { id: form.id }),
              ...(form.queue === undefined ? {} : { queue: form.queue }),
              ...(form.at === undefined ? {} : { at: form.at }),
              confirm: confirmations.issue(binding, referer)
            },
            back: browsed ?? `/${Page.search(from.q, page)}#${anchor}`
          }))
        }
        const done = yield* onDatabase(work(form)).pipe(Effect.either)
        if (Either.isLeft(done) && done.left instanceof RowGoneError) {
          return yield* refused(
            409,
            `Refused: ${done.left.message}. Nothing was changed: reload the page and act on what it shows now.`
          )
        }
        return back(Either.isLeft(done) ? `Failed: ${done.left.message}` : done.right)
      })

    const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`
    /**
     * A browse or message page, drawn from the database the console reads now (never the one it started with),
     * its forms carrying that database's identity; or what is wrong with the database file instead.
     */
    const answer = (made: (context: Browse.Context) => Effect.Effect<Browse.Answer>) =>
      Effect.flatMap(source.current, (current) =>
        current._tag === "Problem"
          ? html(Browse.document(
            { sql, prefix: options.prefix, database: options.database, token, readOnly: true, identity: "" },
            "database problem",
            [],
            `<p class="error" role="alert" id="database-problem">${Page.escape(current.problem)}</p>`
          ))
          : Effect.flatMap(
            Effect.either(current.identity),
            (identity) =>
              Effect.flatMap(
                made({
                  sql: current.sql,
                  prefix: options.prefix,
                  database: options.database,
                  token,
                  readOnly: options.readOnly,
                  identity: Either.getOrElse(identity, () => "")
                }),
                (page) => html(page.body, page.status)
              )
          ))
    const paramsOf = (request: HttpServerRequest.HttpServerRequest) =>
      new URL(request.url, "http://console").searchParams

    const queues = Effect.flatMap(admin, (module) => module.queues({ prefix: options.prefix, create: false }))
    /** Pause, resume or drop the form's `queue` (the queues table: see MailboxSqlAdmin). */
    const queueAction = (what: "pause" | "resume" | "drop") =>
      action("mailboxes", { queue: "required" }, ({ queue }) => {
        if (queue === undefined) return Effect.succeed("Failed: no queue named.")
        const name = JSON.stringify(queue)
        return Effect.flatMap(queues, (admin) =>
          what === "drop"
            ? Effect.map(admin.drop(queue), (result) =>
              result === "dropped"
                ? `Dropped queue ${name}.`
                : result === "not empty"
                ? `Queue ${name} has messages: not dropped.`
                : `Queue ${name} is not recorded (dropped meanwhile?).`)
            : Effect.as(
              what === "pause" ? admin.pause(queue) : admin.resume(queue),
              what === "pause"
                ? `Paused queue ${name}: its receivers get nothing until it is resumed.`
                : `Resumed queue ${name}.`
            ))
      })

    const router = HttpRouter.empty.pipe(
      HttpRouter.get(
        "/",
        Effect.gen(function*() {
          const request = yield* HttpServerRequest.HttpServerRequest
          const query = queryOf(request)
          const shown = view(query, noticeOf(request))
          return yield* html(Page.page(yield* livePart(query, shown), shown))
        })
      ),
      HttpRouter.get("/favicon.ico", HttpServerResponse.empty({ status: 204 })),
      HttpRouter.get(
        "/queue",
        Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
          const params = paramsOf(request)
          return answer((pages) => Browse.page(pages, Browse.query(params), params.get("notice") ?? undefined))
        })
      ),
      HttpRouter.get(
        "/keys",
        Effect.flatMap(
          HttpServerRequest.HttpServerRequest,
          (request) => answer((pages) => Keys.page(pages, Keys.query(paramsOf(request))))
        )
      ),
      HttpRouter.get(
        "/message",
        Effect.flatMap(
          HttpServerRequest.HttpServerRequest,
          (request) => answer((pages) => Message.page(pages, false, paramsOf(request)))
        )
      ),
      HttpRouter.get(
        "/dead-letter",
        Effect.flatMap(
          HttpServerRequest.HttpServerRequest,
          (request) => answer((pages) => Message.page(pages, true, paramsOf(request)))
        )
      ),
      HttpRouter.get(
        "/live",
        Effect.gen(function*() {
          const request = yield* HttpServerRequest.HttpServerRequest
          const query = queryOf(request)
          return yield* html(yield* livePart(query, view(query, noticeOf(request))))
        })
      ),
      HttpRouter.get(
        "/console.js",
        HttpServerResponse.text(Page.script, { contentType: "text/javascript; charset=utf-8", headers })
      ),
      HttpRouter.post(
        "/actions/dead-letters/redrive",
        action("dead-letters", { id: "optional", at: "optional" }, ({ at, id }) =>
          Effect.flatMap(deadLetters, (letters) =>
            Effect.flatMap(
              letters.redrive(letterSelection(id, at)),
              (n) =>
                id === undefined || n > 0
                  ? Effect.succeed(`Redrove ${plural(n, "dead letter")} to their queues.`)
                  : Effect.fail(letterGone(id))
            )))
      ),
      HttpRouter.post(
        "/actions/dead-letters/delete",
        action(
          "dead-letters",
          { id: "optional", at: "optional" },
          ({ at, id }) =>
            Effect.flatMap(deadLetters, (letters) =>
              Effect.flatMap(
                letters.purge(letterSelection(id, at)),
                (n) =>
                  id === undefined || n > 0
                    ? Effect.succeed(`Deleted ${plural(n, "dead letter")}.`)
                    : Effect.fail(letterGone(id))
              )),
          ({ at, id }) =>
            Effect.flatMap(deadLetters, (letters) =>
              Effect.map(letters.count(letterSelection(id, at)), (n) => ({
                action: "/actions/dead-letters/delete",
                question: id === undefined ? `Delete all ${plural(n, "dead letter")}?` : `Delete dead letter ${id}?`,
                detail: id === undefined
                  ? "Every dead letter of every queue is deleted for good (those that arrive meanwhile too); " +
                    "\"Redrive all\" would send them back to their queues instead."
                  : "The letter is deleted for good; \"Redrive\" would send it back to its queue instead.",
                label: id === undefined ? "Delete all" : "Delete"
              })))
        )
      ),
      HttpRouter.post("/actions/queues/pause", queueAction("pause")),
      HttpRouter.post("/actions/queues/resume", queueAction("resume")),
      HttpRouter.post("/actions/queues/drop", queueAction("drop")),
      HttpRouter.post(
        "/actions/messages/delete",
        action(
          "mailboxes",
          { queue: "required", id: "required", at: "required" },
          ({ at, id, queue }) =>
            Effect.flatMap(
              Effect.flatMap(admin, (module) =>
                module.browse({ prefix: options.prefix, create: false })),
              (browser) => {
                const enqueuedAt = at === undefined ? undefined : StoredTime.ofField(at)
                const gone = new RowGoneError({
                  message: `the message shown is no longer there (message ${clipped(id ?? "")} of ${
                    clipped(JSON.stringify(queue ?? ""))
                  } was deleted, or the id names another message now)`
                })
                if (enqueuedAt === undefined) {
                  return Effect.fail(gone)
                }
                return Effect.flatMap(
                  browser.remove(queue ?? "", id ?? "", { enqueuedAt }),
                  (removed) =>
                    removed
                      ? Effect.succeed(`Deleted message ${id}.`)
                      // Still the message shown: a receiver holds it now. Else it is another, or none.
                      : Effect.flatMap(browser.message(queue ?? "", id ?? ""), (found) =>
                        Option.isSome(found) &&
                          DateTime.toEpochMillis(found.value.enqueuedAt) === DateTime.toEpochMillis(enqueuedAt)
                          ? Effect.succeed(`Message ${id} was not deleted: a receiver holds it now.`)
                          : Effect.fail(gone))
                )
              }
            ),
          ({ id, queue }) =>
            Effect.succeed({
              action: "/actions/messages/delete",
              question: `Delete message ${id ?? ""} of ${queue ?? ""}?`,
              detail: "The message is deleted for good, unless a receiver holds it by then (then nothing is deleted).",
              label: "Delete"
            })
        )
      ),
      HttpRouter.post(
        "/actions/merge-queue/recover",
        action("merge-queue", {}, () =>
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
    const allowed = new Set(options.allowedHosts.map((host) =>
      host.toLowerCase()
    ))
    /** Whether a request addressed to `host` may be answered: an allowed name, and the console's port. */
    const addressed = (host: HttpServers.Host | undefined) =>
      host !== undefined && (host.port ?? 80) === options.port && (isLoopback(host.name) || allowed.has(host.name))
    return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      addressed(HttpServers.parseHost(request.headers["host"]))
        ? router
        : refused(
          403,
          `Refused: this console answers to 127.0.0.1, localhost${
            allowed.size === 0 ? "" : `, ${[...allowed].join(", ")}`
          }, not ${clipped(request.headers["host"] ?? "no Host")} (on port ${options.port} only; ` +
            "leasehold console --allow-host NAME adds a name)."
        ))
  })

/**
 * The row an action names is no longer the one its page showed (deleted, or its id names another row now: a
 * table emptied and its ids used again, a copy of another database): refused with 409, nothing changed.
 */
class RowGoneError extends Schema.TaggedError<RowGoneError>()("RowGoneError", { message: Schema.String }) {}

/** The dead letters a form names: all, or the letter `id` as shown (dead-lettered at `at`). */
const letterSelection = (id: string | undefined, at: string | undefined) =>
  id === undefined ? {} : {
    ids: [id],
    ...(at === undefined ? {} : { deadLetteredAt: StoredTime.ofField(at) })
  }

const letterGone = (id: string) =>
  new RowGoneError({
    message: `the dead letter shown is no longer there (dead letter ${
      clipped(id)
    } was redriven or deleted, or the id names another letter now)`
  })

/** The notice an action's redirect carries, and the part it is about. */
const noticeOf = (request: HttpServerRequest.HttpServerRequest) => {
  const params = new URL(request.url, "http://console").searchParams
  const text = params.get("notice")
  return text === null ? undefined : { text, at: params.get("at") ?? "" }
}

const errorMessage = (error: unknown) => error instanceof Error ? error.message : "see its log"

const clipped = (text: string) => text.length > 200 ? `${text.slice(0, 200)}…` : text

/**
 * Whether `origin` (an `Origin` header) is the console's own page as addressed by `host` (the request's `Host`,
 * already checked): `http:`, and the same name and port.
 */
const sameOrigin = (origin: string, host: string | undefined): boolean => {
  const parsed = HttpServers.parseHost(host)
  if (parsed === undefined || !URL.canParse(origin)) return false
  const url = new URL(origin)
  return url.protocol === "http:" && url.hostname === parsed.name &&
    (url.port === "" ? 80 : Number(url.port)) === (parsed.port ?? 80)
}

/** Whether a host name or address (as `HttpServers.parseHost` gives it) is this machine's loopback. */
export const isLoopback = (name: string): boolean =>
  name === "localhost" || name === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(name) ||
  /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/.test(name)
