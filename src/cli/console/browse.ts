/**
 * The console's browse page, `GET /queue?name=…`: one queue's queued, delayed, in-flight or dead-lettered
 * messages, a page at a time (`MailboxSqlAdmin.browse`: keyset-paged, so `next` links carry a cursor, never
 * an offset), oldest or newest first, filtered by id, by key, or by text in the body (a dead letter's: or its
 * error).
 * Each row links to the message page (message.ts). The page is drawn once per request (no live refresh: a
 * list one reads should not move under the reader) and says when it was read; it is bounded like the rest of
 * the console — at most `pageSize` rows of previews, each value escaped and cut.
 *
 * Also here: what the console's pages share (`document`, the header and the styles) and where an action taken
 * on these pages returns to (`returnTo`).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as MailboxSqlAdmin from "../../MailboxSqlAdmin.js"
import { ago } from "../table.js"
import * as Page from "./page.js"
import { readLimit } from "./snapshot.js"

/** What the console's own pages need: the database to read, and how the page is drawn. */
export interface Context {
  readonly sql: SqlClient.SqlClient
  readonly prefix: string
  readonly database: string
  readonly token: string
  readonly readOnly: boolean
  /** The identity of the database `sql` reads (source.ts), which the page's forms carry. */
  readonly identity: string
}

/** An HTML answer: its status and document. */
export interface Answer {
  readonly status: number
  readonly body: string
}

/** Rows a browse page shows. */
export const pageSize = 50

/** The states as the page names them. */
export const stateNames: Record<MailboxSqlAdmin.MessageState, string> = {
  queued: "queued",
  delayed: "delayed",
  inFlight: "in flight",
  dead: "dead letters"
}

/** What `GET /queue` asks for; malformed parts read as their defaults (a bad cursor, as the first page). */
export interface Query {
  readonly name: string
  readonly state: MailboxSqlAdmin.MessageState
  readonly order: "oldest" | "newest"
  readonly after: string | undefined
  readonly id: string
  readonly text: string
  /** Only the messages sent with this key (scheduling by key); "" for all. */
  readonly key: string
}

const short = (value: string | null, max = 200) => (value ?? "").trim().slice(0, max)

/** The query of a browse page's URL. */
export const query = (params: URLSearchParams): Query => {
  const state = params.get("state") ?? ""
  const after = params.get("after") ?? ""
  return {
    name: (params.get("name") ?? "").slice(0, 200),
    state: (MailboxSqlAdmin.messageStates as ReadonlyArray<string>).includes(state)
      ? state as MailboxSqlAdmin.MessageState
      : "queued",
    order: params.get("order") === "newest" ? "newest" : "oldest",
    after: /^[\w-]{1,1200}$/.test(after) ? after : undefined,
    id: short(params.get("id")),
    text: short(params.get("text")),
    // A key is any name (spaces at its ends too): kept as given, only cut to a name's length.
    key: (params.get("key") ?? "").slice(0, 200)
  }
}

/** The URL of a browse page (the defaults left out). */
export const href = (query: Partial<Query> & { readonly name: string }): string => {
  const params = new URLSearchParams({ name: query.name })
  if (query.state !== undefined && query.state !== "queued") params.set("state", query.state)
  if (query.order === "newest") params.set("order", "newest")
  if (query.id !== undefined && query.id !== "") params.set("id", query.id)
  if (query.text !== undefined && query.text !== "") params.set("text", query.text)
  if (query.key !== undefined && query.key !== "") params.set("key", query.key)
  if (query.after !== undefined) params.set("after", query.after)
  return `/queue?${params.toString()}`
}

/** The URL of a queue's keys page (keys.ts), sorted by `sort`. */
export const keysHref = (query: { readonly name: string; readonly sort?: string; readonly dir?: "asc" | "desc" }) => {
  const params = new URLSearchParams({ name: query.name })
  if (query.sort !== undefined) params.set("sort", query.sort)
  if (query.dir !== undefined) params.set("dir", query.dir)
  return `/keys?${params.toString()}`
}

/** The URL of a message's page. */
export const messageHref = (queue: string, id: string, dead: boolean) =>
  `/${dead ? "dead-letter" : "message"}?${new URLSearchParams({ queue, id }).toString()}`

/**
 * Where an action posted from `referer` returns to, when that is one of these pages: the browse page it was on,
 * or the browse page of the message it was about (which may be gone). Undefined for any other page.
 */
export const returnTo = (referer: URL): string | undefined => {
  const params = referer.searchParams
  if (referer.pathname === "/queue") return href(query(params))
  const queue = params.get("queue")
  if (queue === null) return undefined
  if (referer.pathname === "/message") return href({ name: queue })
  if (referer.pathname === "/dead-letter") return href({ name: queue, state: "dead" })
  return undefined
}

const extraStyle = `
nav.crumbs{font-size:12px;color:#5a6272;margin:10px 0 0}nav.crumbs a{color:#3a6ea5}
.tabs{display:flex;gap:4px;margin:8px 0}.tabs a{padding:2px 10px;border:1px solid #dde1e7;border-radius:4px;color:#3a6ea5;text-decoration:none}
.tabs a[aria-current]{background:#1d2330;color:#fff;border-color:#1d2330}
form.filter{display:flex;gap:8px;align-items:center;margin:8px 0;flex-wrap:wrap}form.filter input{font:inherit;padding:2px 8px}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:8px 0}dl.fields dt{color:#5a6272}dl.fields dd{margin:0}
pre{background:#f6f7f9;border:1px solid #eef0f3;border-radius:4px;padding:8px;white-space:pre-wrap;word-break:break-all;font-size:12px;max-height:60vh;overflow:auto}
ol.causes{margin:4px 0 8px;padding-left:22px}ol.causes li{color:#a4161a}`

/** A whole document of the console: its header, a path back to the console's page, and `body`. */
export const document = (context: Context, title: string, crumbs: ReadonlyArray<string>, body: string) =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${Page.escape(title)} · leasehold console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>${Page.style}${extraStyle}</style></head>
<body><header><h1>leasehold console</h1><span class="db">${Page.escape(context.database)}</span>${
    context.readOnly ? `<span class="badge">read-only</span>` : ""
  }</header>
<main><nav class="crumbs"><a href="/">Console</a>${crumbs.map((crumb) => ` › ${crumb}`).join("")}</nav>
${body}</main></body></html>`

/** A time as the page shows it: how long ago (or in how long), the exact time as its title. */
export const when = (time: DateTime.Utc | undefined, now: number) => {
  if (time === undefined) return "–"
  const millis = DateTime.toEpochMillis(time)
  return Number.isFinite(millis) && Math.abs(millis) < 8.64e15
    ? `<time title="${new Date(millis).toISOString()}">${Page.escape(ago(millis, now))}</time>`
    : "invalid time"
}

/** `text` escaped, cut to `max` characters ("…" says so). */
export const shown = (text: string, max = 200) => Page.escape(text.length > max ? `${text.slice(0, max)}…` : text)

/** What a read that failed says on the page (no mailbox tables, a database that does not answer). */
export const readFailure = (error: { readonly _tag: string; readonly message: string }) =>
  error._tag === "TablesNotFoundError"
    ? `<p class="empty">${Page.escape(error.message)}</p>`
    : error._tag === "InvalidParameterError"
    ? `<p class="error" role="alert">${shown(error.message, 1000)}</p>`
    : `<p class="error" role="alert">Could not read: ${shown(error.message, 1000)}</p>`

/** Runs a read of the console's pages: bounded in time, on the console's database. */
export const read = <A, E extends { readonly _tag: string; readonly message: string }>(
  context: Context,
  effect: Effect.Effect<A, E, SqlClient.SqlClient>
) =>
  effect.pipe(
    Effect.timeoutFail({
      duration: readLimit,
      onTimeout: () => ({ _tag: "Timeout", message: `the database did not answer within ${readLimit}` })
    }),
    Effect.either,
    Effect.provideService(SqlClient.SqlClient, context.sql)
  )

/** The browse page of `query`; `notice` is what the last action did. */
export const page = (context: Context, query: Query, notice: string | undefined) =>
  Effect.gen(function*() {
    const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    const { name, state } = query
    const title = `${name} · ${stateNames[state]}`
    const crumbs = [
      `queue <b>${shown(name)}</b>`,
      ...(query.key === "" ? [] : [`key <b>${shown(query.key)}</b>`])
    ]
    if (name === "") {
      return { status: 400, body: document(context, "no queue", [], `<p class="error">Which queue? (?name=…)</p>`) }
    }
    const filter = {
      ...(query.id === "" ? {} : { id: query.id }),
      ...(query.text === "" ? {} : { text: query.text }),
      ...(query.key === "" ? {} : { key: query.key })
    }
    const result = yield* read(
      context,
      Effect.flatMap(MailboxSqlAdmin.browse({ prefix: context.prefix, create: false }), (browser) =>
        browser.messages({
          queue: name,
          state,
          order: query.order,
          after: query.after,
          filter,
          limit: pageSize
        }))
    )
    const tabs = `<nav class="tabs" aria-label="States">${
      MailboxSqlAdmin.messageStates.map((each) =>
        `<a href="${Page.escape(href({ name, state: each, order: query.order, key: query.key }))}"${
          each === state ? ` aria-current="page"` : ""
        }>${stateNames[each]}</a>`
      ).join("")
    }</nav>`
    const form = `<form method="get" action="/queue" class="filter" role="search">
      <input type="hidden" name="name" value="${Page.escape(name)}"><input type="hidden" name="state" value="${state}">
      <label>id <input type="search" name="id" value="${Page.escape(query.id)}" size="14"></label>
      <label>key <input type="search" name="key" value="${Page.escape(query.key)}" size="14"></label>
      <label>${state === "dead" ? "body or error" : "body"} contains <input type="search" name="text" value="${
      Page.escape(query.text)
    }" size="24"></label>
      <label>order <select name="order"><option value="oldest"${
      query.order === "oldest" ? " selected" : ""
    }>oldest first</option><option value="newest"${
      query.order === "newest" ? " selected" : ""
    }>newest first</option></select></label>
      <button type="submit">Show</button>${
      query.id === "" && query.text === "" && query.key === ""
        ? ""
        : ` <a href="${Page.escape(href({ name, state }))}">clear</a>`
    }</form>`
    const listing = result._tag === "Left" ? readFailure(result.left) : list(result.right, query, now)
    return {
      status: 200,
      body: document(
        context,
        title,
        crumbs,
        `<section id="messages"><h2>Queue <code>${shown(name)}</code></h2><p class="note"><a href="${
          Page.escape(keysHref({ name }))
        }">Keys of this queue</a></p>${
          notice === undefined ? "" : `<p class="notice" role="status">${shown(notice, 300)}</p>`
        }${tabs}${form}${listing}<p class="updated">Read ${
          Page.escape(new Date(now).toISOString())
        } (this page does not refresh itself: <a href="${Page.escape(href(query))}">reload</a>).</p></section>`
      )
    }
  })

/** The page's table and its links to the first and the next page. */
const list = (page: MailboxSqlAdmin.MessagePage, query: Query, now: number) => {
  const dead = query.state === "dead"
  const headers = dead
    ? ["id", "key", "deliveries", "enqueued", "dead-lettered", "error", "body"]
    : ["id", "key", "deliveries", "enqueued", query.state === "inFlight" ? "lease ends" : "visible", "held by", "body"]
  const rows = page.rows.map((row) =>
    `<tr data-id="${Page.escape(row.id)}"><td><a href="${Page.escape(messageHref(row.queue, row.id, dead))}">${
      shown(row.id)
    }</a></td><td>${
      row.key === undefined ? "–" : `<code class="key">${shown(row.key)}</code>`
    }</td><td>${row.deliveryCount}</td><td>${when(row.enqueuedAt, now)}</td><td>${when(row.at, now)}</td><td>${
      dead
        ? `<b>${shown(row.errorTag ?? "")}</b> ${shown(row.error ?? "", 160)}`
        : row.receivedBy === undefined
        ? "–"
        : `<code>${shown(row.receivedBy)}</code>`
    }</td><td><code class="body">${shown(row.body, 160)}</code>${
      row.bodyLength > 160 ? ` <small>(${row.bodyLength} characters)</small>` : ""
    }</td></tr>`
  ).join("")
  const first = query.after === undefined
    ? ""
    : `<a href="${Page.escape(href({ ...query, after: undefined }))}" rel="first">first page</a>`
  const next = page.next === undefined
    ? ""
    : `<a href="${Page.escape(href({ ...query, after: page.next }))}" rel="next">next page</a>`
  const where = page.rows.length === 0
    ? ""
    : `${page.rows.length} shown (${query.order} first)${page.next === undefined ? "; the last page" : ""}`
  const pager = `<p class="pager" id="message-pages">${
    [where, first, next].filter((part) => part !== "").join(" · ")
  }</p>`
  const cut = page.searchCut
    ? `<p class="note">The search looks at ${MailboxSqlAdmin.searchScanLimit} messages a page: these are the ` +
      "matches among them. The next page searches on.</p>"
    : ""
  const empty = page.searchCut
    ? ""
    : `<p class="empty">${query.after === undefined ? "None" : "No more"}${
      query.id === "" && query.text === "" && query.key === "" ? "" : " that match"
    }.</p>`
  return page.rows.length === 0
    ? `${cut}${empty}${pager}`
    : `${cut}<table id="message-table"><thead><tr>${
      headers.map((header) => `<th>${header}</th>`).join("")
    }</tr></thead><tbody>${rows}</tbody></table>${pager}`
}
