/**
 * The console's keys page, `GET /keys?name=…&sort=…&dir=…` (issue 45, scheduling by key): one queue's keys with
 * unsettled messages — ready, in flight, pending, the limit and weight in force, leased worker time in the key's
 * busy period, the start and token windows — as `MailboxSqlAdmin.Queues.keys` reads them (at most 10,000, most
 * pending first), sorted on the server by any column (a plain link per header: no script needed). Each key links
 * to the browse page of its messages. Keys are names another party chose: each one escaped and cut like every
 * other value of the console; like the browse page it is drawn once per request (it says when).
 */
import * as Effect from "effect/Effect"
import * as Scheduling from "../../internal/mailbox/scheduling.js"
import * as MailboxSqlAdmin from "../../MailboxSqlAdmin.js"
import { period, span } from "../keyText.js"
import * as Browse from "./browse.js"
import * as Page from "./page.js"

/** The columns the page sorts by, as its URL names them, with how each compares. */
const columns = {
  key: { label: "key", value: (state: Scheduling.KeyState) => state.key },
  ready: { label: "ready", value: (state: Scheduling.KeyState) => state.ready },
  inFlight: { label: "in flight", value: (state: Scheduling.KeyState) => state.inFlight },
  pending: { label: "pending", value: (state: Scheduling.KeyState) => state.pending },
  // Unlimited sorts above every limit.
  limit: { label: "limit", value: (state: Scheduling.KeyState) => state.limit ?? Number.POSITIVE_INFINITY },
  weight: { label: "weight", value: (state: Scheduling.KeyState) => state.weight },
  leased: { label: "leased time", value: (state: Scheduling.KeyState) => state.leasedMillis },
  starts: { label: "starts (window)", value: (state: Scheduling.KeyState) => fill(state.starts) },
  tokens: { label: "tokens (window)", value: (state: Scheduling.KeyState) => fill(state.tokens) }
} as const

type Column = keyof typeof columns

/** How full a window is (used over allowed); -1 without one, so keys without a rate sort apart. */
const fill = (window: Scheduling.KeyState["starts"]) =>
  window === undefined ? -1 : window.count === 0 ? Number.POSITIVE_INFINITY : window.used / window.count

/** What `GET /keys` asks for; anything malformed reads as the default (most pending first). */
export interface Query {
  readonly name: string
  readonly sort: Column
  readonly dir: "asc" | "desc"
}

export const query = (params: URLSearchParams): Query => {
  const sort = params.get("sort") ?? ""
  const column: Column = Object.hasOwn(columns, sort) ? sort as Column : "pending"
  const dir = params.get("dir")
  return {
    name: (params.get("name") ?? "").slice(0, 200),
    sort: column,
    dir: dir === "asc" || dir === "desc" ? dir : column === "key" ? "asc" : "desc"
  }
}

const windowCell = (window: Scheduling.KeyState["starts"]) =>
  window === undefined
    ? "–"
    : `<span data-used="${window.used}">${window.used}</span> / ${window.count} per ${Page.escape(period(window))}${
      window.used >= window.count ? ` <span class="paused">held</span>` : ""
    }`

/** The keys page of `query`. */
export const page = (context: Browse.Context, query: Query) =>
  Effect.gen(function*() {
    const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    const { name } = query
    if (name === "") {
      return {
        status: 400,
        body: Browse.document(context, "no queue", [], `<p class="error">Which queue? (?name=…)</p>`)
      }
    }
    const result = yield* Browse.read(
      context,
      Effect.flatMap(MailboxSqlAdmin.queues({ prefix: context.prefix, create: false }), (queues) => queues.keys(name))
    )
    const crumbs = [`queue <a href="${Page.escape(Browse.href({ name }))}"><b>${Browse.shown(name)}</b></a>`, "keys"]
    const listing = result._tag === "Left" ? Browse.readFailure(result.left) : table(result.right, query)
    return {
      status: 200,
      body: Browse.document(
        context,
        `${name} · keys`,
        crumbs,
        `<section id="keys"><h2>Keys of <code>${Browse.shown(name)}</code></h2>${listing}<p class="updated">Read ${
          Page.escape(new Date(now).toISOString())
        } (this page does not refresh itself: <a href="${
          Page.escape(Browse.keysHref(query))
        }">reload</a>).</p></section>`
      )
    }
  })

const table = (states: ReadonlyArray<Scheduling.KeyState>, query: Query) => {
  if (states.length === 0) return `<p class="empty">No key has an unsettled message in this queue.</p>`
  const value = columns[query.sort].value
  const sorted = [...states].sort((a, b) => {
    const x = value(a)
    const y = value(b)
    const order = x < y ? -1 : x > y ? 1 : a.key < b.key ? -1 : a.key > b.key ? 1 : 0
    return query.dir === "asc" ? order : -order
  })
  const headers = (Object.keys(columns) as Array<Column>).map((column) => {
    const current = column === query.sort
    const dir = current ? (query.dir === "asc" ? "desc" : "asc") : column === "key" ? "asc" : "desc"
    return `<th${current ? ` aria-sort="${query.dir === "asc" ? "ascending" : "descending"}"` : ""}><a href="${
      Page.escape(Browse.keysHref({ name: query.name, sort: column, dir }))
    }" data-sort="${column}">${Page.escape(columns[column].label)}</a>${
      current ? (query.dir === "asc" ? " ▲" : " ▼") : ""
    }</th>`
  }).join("")
  const rows = sorted.map((state) =>
    `<tr data-key="${Page.escape(state.key)}"><td><a href="${
      Page.escape(Browse.href({ name: query.name, key: state.key }))
    }"><code class="key">${
      Browse.shown(state.key)
    }</code></a></td><td>${state.ready}</td><td>${state.inFlight}</td><td>${state.pending}</td><td>${
      state.limit === undefined ? "–" : state.limit
    }${
      state.limit !== undefined && state.inFlight >= state.limit ? ` <span class="paused">at limit</span>` : ""
    }</td><td>${state.weight}</td><td>${span(state.leasedMillis)}</td><td>${windowCell(state.starts)}</td><td>${
      windowCell(state.tokens)
    }</td></tr>`
  ).join("")
  const bound = states.length >= Scheduling.bounds.maxKeysListed
    ? `<p class="note">The first ${Scheduling.bounds.maxKeysListed} keys by pending messages are shown.</p>`
    : ""
  return `<p class="pager">${states.length} key${
    states.length === 1 ? "" : "s"
  }. Leased time: the worker time the key's leases held in its busy period (those running, counted to their visibility). A key's messages: its name.</p>${bound}<table id="key-table"><thead><tr>${headers}</tr></thead><tbody>${rows}</tbody></table>`
}
