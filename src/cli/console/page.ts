/**
 * The console's HTML, rendered on the server from a `Snapshot`: `page` is
 * the whole document, `live` the part the browser fetches again every
 * second (`script` swaps it in and counts leases down between fetches;
 * without JavaScript the page reloads itself every 5 s). The queue table
 * is a page of the queues (`?page=N`), optionally of those whose name
 * contains a search (`?q=…`); its links and the live refresh keep both.
 * Every value from the database is escaped and cut to a bounded preview,
 * and every list is bounded (see snapshot.ts), so the page is bounded
 * however big the database is. Actions are plain forms posting the
 * process's token; a read-only console renders none. Queue names and
 * message ids link to the browse and message pages (browse.ts, message.ts), and each queue to its keys
 * (keys.ts).
 * An action's notice is shown in the part it acted on (`noticeAt`), and the
 * live refresh keeps it there. When a refresh fails the script says since
 * when, and stops the clocks, until the server answers again.
 */
import * as Option from "effect/Option"
import * as StoredTime from "../../internal/storedTime.js"
import * as MergeQueue from "../../MergeQueue.js"
import { ago } from "../table.js"
import { escape } from "./html.js"
import * as Snapshot from "./snapshot.js"
import * as Workers from "./workers.js"

export interface View {
  /** The database, its secrets redacted. */
  readonly database: string
  readonly token: string
  readonly readOnly: boolean
  /** The identity of the database the live part was read from (source.ts): every form carries it. */
  readonly identity?: string | undefined
  /** What the last action did (shown after its redirect, next to what it changed: `noticeAt`). */
  readonly notice?: string | undefined
  /** The part the notice is about: one of `noticeAnchors` (else the notice goes at the top). */
  readonly noticeAt?: string | undefined
  /** The queue table's page and search the request asked for. */
  readonly query: Snapshot.Query
}

/**
 * The most characters a cell shows of a value from the database, whatever the database holds: names and ids
 * (a queue name is at most 200), texts (errors, details) and bodies. What is cut ends in "…".
 */
export const cellLimits = { name: 200, text: 300, body: 120 } as const

const clip = (value: string, max: number) => value.length > max ? `${value.slice(0, max)}…` : value

/** Escaped, and cut to `max` characters. */
const shown = (value: string, max: number = cellLimits.name) => escape(clip(value, max))

/** The parts an action's notice can be shown in (the heading each action's redirect scrolls to). */
export const noticeAnchors = ["mailboxes", "dead-letters", "merge-queue"] as const

/** `?q=…&page=…` for a page of the queue table (without what is not given), with an action's notice if given. */
export const search = (q: string, page?: number, notice?: { readonly text: string; readonly at: string }): string => {
  const params = new URLSearchParams()
  if (q !== "") params.set("q", q)
  if (page !== undefined) params.set("page", String(page))
  if (notice !== undefined) {
    params.set("notice", notice.text)
    params.set("at", notice.at)
  }
  const text = params.toString()
  return text === "" ? "" : `?${text}`
}

/** Text made safe for HTML content and attribute values. */
export { escape }

/** Whether `millis` is a time a `Date` can show (a damaged row's can be anything). */
const showable = (millis: number | undefined): millis is number =>
  millis !== undefined && Number.isFinite(millis) && Math.abs(millis) < 8.64e15

/** A time the script keeps current: "in 12 s" counting down, "4 s ago" counting up. */
const clock = (millis: number | undefined, now: number) =>
  !showable(millis) ?
    "–" :
    `<time data-at="${millis}" title="${new Date(millis).toISOString()}">${escape(ago(millis, now))}</time>`

/** A table of `rows` (cells already HTML); `rowAttributes` are the attributes of each row's `<tr>`. */
const table = (
  headers: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string>>,
  empty: string,
  id = "",
  rowAttributes: ReadonlyArray<string> = []
) =>
  rows.length === 0
    ? `<p class="empty">${escape(empty)}</p>`
    : `<table${id === "" ? "" : ` id="${id}"`}><thead><tr>${
      headers.map((header) => `<th>${escape(header)}</th>`).join("")
    }</tr></thead><tbody>${
      rows.map((row, i) =>
        `<tr${rowAttributes[i] === undefined ? "" : ` ${rowAttributes[i]}`}>${
          row.map((cell) => `<td>${cell}</td>`).join("")
        }</tr>`
      ).join("")
    }</tbody></table>`

/** What a dead letter's actions act on: its id, and when it was dead-lettered as shown (StoredTime.ts). */
const letterFields = (letter: { readonly id: string; readonly deadLetteredAt: number }) => ({
  id: letter.id,
  at: StoredTime.toField(StoredTime.decode(letter.deadLetteredAt))
})

/** A form posting `action` with the token and `fields`; nothing on a read-only console. */
const button = (view: View, action: string, label: string, fields: Record<string, string> = {}, danger = false) =>
  view.readOnly ?
    "" :
    `<form method="post" action="${action}" class="action">${
      Object.entries({ token: view.token, db: view.identity ?? "", ...fields }).map(([name, value]) =>
        `<input type="hidden" name="${name}" value="${escape(value)}">`
      ).join("")
    }<button type="submit"${danger ? " class=\"danger\"" : ""}>${escape(label)}</button></form>`

/**
 * `html` linking to `path?params` (the browse and message pages); not linked when a value is too long to be a
 * name (a damaged row's), which keeps the page bounded.
 */
const link = (path: string, params: Record<string, string>, html: string) =>
  Object.values(params).some((value) => value.length > cellLimits.name)
    ? html
    : `<a href="${escape(`${path}?${new URLSearchParams(params).toString()}`)}">${html}</a>`

const preview = (body: string) => `<code class="body">${shown(body, cellLimits.body)}</code>`

/** The last 30 buckets as bars; a bucket nothing left in draws none (most queues, most of the time). */
const sparkline = (values: ReadonlyArray<number>) => {
  if (values.length === 0) return ""
  const max = Math.max(1, ...values)
  const bars = values.slice(-30).map((value, i) =>
    value <= 0 ?
      "" :
      `<rect x="${i * 4}" y="${20 - Math.round((value / max) * 20)}" width="3" height="${
        Math.max(1, Math.round((value / max) * 20))
      }"/>`
  ).join("")
  return `<svg class="spark" viewBox="0 0 120 20" width="120" height="20" aria-hidden="true">${bars}</svg>`
}

const rate = (perMinute: number) => perMinute >= 10 ? Math.round(perMinute).toString() : perMinute.toFixed(1)

const failedOrAbsent = (part: Snapshot.Section<unknown>) =>
  part._tag === "Failed"
    ? `<p class="error" role="alert">Could not read: ${escape(part.error)}</p>`
    : part._tag === "Absent"
    ? `<p class="empty">${escape(part.reason)}</p>`
    : ""

const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`

/** Where the page lies among the queues, and links to the others (keeping the search). */
const pager = (at: Snapshot.QueuePage, shownCount: number) => {
  const link = (page: number, label: string) =>
    `<a href="/${escape(search(at.q, page))}" rel="${label}">${escape(label)}</a>`
  const count = at.q === ""
    ? plural(at.total, "queue")
    : `${at.matching} of ${plural(at.total, "queue")} match “${shown(at.q)}”`
  const range = shownCount === 0 ? "" : `; ${at.offset + 1}–${at.offset + shownCount} shown`
  const links = at.pages <= 1 ?
    "" :
    ` · ${at.page > 1 ? `${link(1, "first")} ${link(at.page - 1, "prev")} ` : ""}page ${at.page} of ${at.pages}${
      at.page < at.pages ? ` ${link(at.page + 1, "next")} ${link(at.pages, "last")}` : ""
    }`
  return `<p class="pager" id="queue-pages">${count}${range}${links}</p>`
}

/**
 * A queue's actions: pause or resume it (the state is the database's: every worker's receive honours it), and
 * drop it from the queues table once it has no messages. A name too long to show whole is not one the console
 * can name in a form.
 */
const queueActions = (view: View, queue: Snapshot.QueueView) =>
  queue.queue.length > cellLimits.name ? "" : `${
    queue.paused
      ? button(view, "/actions/queues/resume", "Resume", { queue: queue.queue })
      : button(view, "/actions/queues/pause", "Pause", { queue: queue.queue })
  }${
    queue.recorded && queue.queued + queue.inFlight + queue.delayed === 0
      ? button(view, "/actions/queues/drop", "Drop", { queue: queue.queue })
      : ""
  }`

const mailboxes = (part: Snapshot.Section<Snapshot.Mailboxes>, view: View, now: number) => {
  if (part._tag !== "Present") return `<section id="mailboxes"><h2>Mailboxes</h2>${failedOrAbsent(part)}</section>`
  const { deadLetterTotal, deadLetters, inFlight, inFlightTotal, queuePage, queues, sampledAt, totalPerMinute } =
    part.value
  return `<section id="mailboxes"><h2>Mailboxes</h2>
    ${queuePage.total === 0 ? "" : pager(queuePage, queues.length)}
    ${
    table(
      ["queue", "queued", "in flight", "delayed", "dead letters", "oldest visible", "done / min", "last 5 min", ""],
      queues.map((queue) => [
        `${link("/queue", { name: queue.queue }, shown(queue.queue))}${
          queue.paused ? ` <span class="paused" data-paused="true">paused</span>` : ""
        } <small>${link("/keys", { name: queue.queue }, "keys")}</small>`,
        `<span data-count="queued">${queue.queued}</span>`,
        `<span data-count="inFlight">${queue.inFlight}</span>`,
        `<span data-count="delayed">${queue.delayed}</span>`,
        `<span data-count="deadLetters">${queue.deadLetters}</span>`,
        clock(queue.oldestVisibleAt, now),
        `<span data-count="perMinute">${rate(queue.perMinute)}</span>`,
        sparkline(queue.recent),
        queueActions(view, queue)
      ]),
      queuePage.total === 0 ? "No messages and no dead letters yet." : "No queue's name contains that.",
      "queues",
      // The row names its queue once (the data-* attributes are what the tests and scripts look for).
      queues.map((queue) => `data-queue="${shown(queue.queue)}"`)
    )
  }
    <p class="note"${
    sampledAt === undefined ? "" : ` data-sampled-at="${sampledAt}"`
  }>Done / min: messages that left the queue (acknowledged or dead-lettered), as seen by the console's
    samples${
    totalPerMinute === undefined
      ? ""
      : `; all queues, from the messages' sequence (which also counts those sent and done between two samples):
    <b id="total-rate">${rate(totalPerMinute)}</b> / min`
  }.</p>
    <h3 id="in-flight">In flight${
    inFlightTotal > inFlight.length
      ? ` <small>(the ${inFlight.length} whose leases end first, of ${inFlightTotal})</small>`
      : ""
  }</h3>
    ${
    table(
      ["id", "queue", "deliveries", "lease ends", "last extended", "held by", "enqueued", "body"],
      inFlight.map((message) => [
        link("/message", { queue: message.queue, id: message.id }, shown(message.id)),
        shown(message.queue),
        String(message.deliveryCount),
        clock(message.leaseUntil, now),
        clock(message.extendedAt, now),
        message.receivedBy === undefined ? "–" : Workers.heldBy(message.receivedBy),
        clock(message.enqueuedAt, now),
        preview(message.body)
      ]),
      "Nothing in flight.",
      "in-flight-table"
    )
  }
    <h3 id="dead-letters">Dead letters${
    deadLetterTotal > deadLetters.length
      ? ` <small>(the ${deadLetters.length} oldest, of ${deadLetterTotal}; "Redrive all" and "Delete all" act on ${
        deadLetterTotal === 1 ? "it" : `all ${deadLetterTotal}`
      })</small>`
      : ""
  }</h3>
    ${
    deadLetters.length === 0 ?
      "" :
      `<div class="actions">${button(view, "/actions/dead-letters/redrive", "Redrive all", {})}${
        button(view, "/actions/dead-letters/delete", "Delete all", {}, true)
      }</div>`
  }
    ${
    table(
      ["id", "queue", "deliveries", "dead-lettered", "error", "body", ""],
      deadLetters.map((letter) => [
        link("/dead-letter", { queue: letter.queue, id: letter.id }, shown(letter.id)),
        shown(letter.queue),
        String(letter.deliveryCount),
        clock(letter.deadLetteredAt, now),
        `<b>${shown(letter.errorTag)}</b> ${shown(letter.error, cellLimits.text)}`,
        preview(letter.body),
        // An id too long to show whole is not one the console can name in a form (none of leasehold's is).
        letter.id.length > cellLimits.name ?
          "" :
          `${button(view, "/actions/dead-letters/redrive", "Redrive", letterFields(letter))}${
            button(view, "/actions/dead-letters/delete", "Delete", letterFields(letter), true)
          }`
      ]),
      "No dead letters.",
      "dead-letters-table"
    )
  }
  </section>`
}

const lock = (held: Option.Option<MergeQueue.ProcessingLock>, now: number) =>
  Option.match(held, {
    onNone: () => `<p id="lock">Processing lock: <b>free</b></p>`,
    onSome: (lock) => {
      const expires = Snapshot.millis(lock.expiresAt)
      return `<p id="lock">Processing lock: <b>${shown(lock.agentId)}</b>, fencing token <b>${lock.fencingToken}</b>, ${
        expires < now ? `<span class="stale">STALE</span> expired` : "expires"
      } ${clock(expires, now)} (taken ${clock(Snapshot.millis(lock.acquiredAt), now)})</p>`
    }
  })

const mergeQueue = (part: Snapshot.Section<Snapshot.MergeQueueView>, view: View, now: number) => {
  if (part._tag !== "Present") {
    return `<section id="merge-queue"><h2>Merge queue</h2>${failedOrAbsent(part)}</section>`
  }
  const { audit, entries, stats } = part.value
  const some = <A>(option: Option.Option<A>, max: number = cellLimits.name) =>
    Option.match(option, { onNone: () => "–", onSome: (value) => shown(String(value), max) })
  const waiting = [...MergeQueue.inProgress, "pending" as const].reduce(
    (sum, status) => sum + stats.byStatus[status],
    0
  )
  return `<section id="merge-queue"><h2>Merge queue</h2>
    ${lock(stats.lock, now)}
    <div class="actions">${button(view, "/actions/merge-queue/recover", "Recover now")}</div>
    <p class="counts">${
    Object.entries(stats.byStatus).filter(([, n]) => n > 0).map(([status, n]) =>
      `<span class="status">${escape(status)} <b data-status="${escape(status)}">${n}</b></span>`
    ).join(" ") || "No entries."
  }</p>
    ${
    waiting > entries.length
      ? `<p class="note">The ${entries.length} taken first, of ${waiting} pending or in progress.</p>`
      : ""
  }
    ${
    table(
      ["id", "workspace", "status", "agent", "fencing token", "attempts", "changed", "last error"],
      entries.map((entry) => [
        String(entry.id),
        shown(entry.workspace),
        shown(entry.status),
        some(entry.agentId),
        some(entry.fencingToken),
        String(entry.attemptCount),
        clock(Snapshot.millis(entry.stateChangedAt), now),
        some(entry.lastError, cellLimits.text)
      ]),
      "Nothing pending or in progress.",
      "entries"
    )
  }
    <h3>Audit log <small>(the newest ${Snapshot.auditLimit}, newest last)</small></h3>
    ${
    table(
      ["when", "action", "agent", "entry", "token", "change", "detail"],
      audit.map((row) => [
        clock(Snapshot.millis(row.at), now),
        shown(row.action),
        some(row.agentId),
        some(row.entryId),
        some(row.fencingToken),
        Option.isSome(row.toStatus) ? `${some(row.fromStatus)} → ${some(row.toStatus)}` : "",
        some(row.detail, cellLimits.text)
      ]),
      "No audit rows.",
      "audit"
    )
  }
  </section>`
}

const workLeases = (part: Snapshot.Section<Snapshot.Domains>, now: number) =>
  `<section id="work-leases"><h2>Work leases</h2>${
    part._tag !== "Present" ? failedOrAbsent(part) : `${
      part.value.total > part.value.domains.length
        ? `<p class="note">The first ${part.value.domains.length} by name, of ${part.value.total}.</p>`
        : ""
    }${
      table(
        ["domain", "held at offset", "fencing token", "acquired", "retries", "backlog", "processed below"],
        part.value.domains.map((domain) => [
          shown(domain.domainId),
          domain.leaseOffset === undefined ? "free" : String(domain.leaseOffset),
          String(domain.leaseFencing ?? domain.fencingToken),
          clock(domain.acquiredAt, now),
          String(domain.retryCount),
          String(domain.backlog),
          String(domain.lowWater)
        ]),
        "No domains.",
        "domains"
      )
    }`
  }</section>`

/** The notice of the last action, as an element. */
const noticeElement = (notice: string) =>
  `<p class="notice" role="status" id="notice">${shown(notice, cellLimits.text)}</p>`

/** Whether the notice goes next to the part it is about (else at the top of the page). */
const placed = (view: View) =>
  view.notice !== undefined && (noticeAnchors as ReadonlyArray<string | undefined>).includes(view.noticeAt)

/** `html` with the view's notice right after the heading of the part it is about (see `placed`). */
const withNotice = (html: string, view: View) => {
  if (view.notice === undefined || !placed(view)) return html
  const start = html.indexOf(`id="${view.noticeAt}"`)
  const heading = start < 0 ? -1 : html.slice(start).search(/<\/h[23]>/)
  // The part is not drawn (its read failed): the notice goes first.
  if (heading < 0) return `${noticeElement(view.notice)}${html}`
  const at = start + heading + 5
  return `${html.slice(0, at)}${noticeElement(view.notice)}${html.slice(at)}`
}

/** The part refreshed live. */
export const live = (snapshot: Snapshot.Snapshot, view: View): string => withNotice(liveParts(snapshot, view), view)

const liveParts = (snapshot: Snapshot.Snapshot, view: View): string =>
  `<div id="snapshot" data-now="${snapshot.at}">
  <p class="updated">Updated ${showable(snapshot.at) ? escape(new Date(snapshot.at).toISOString()) : "–"}</p>
  ${mailboxes(snapshot.mailboxes, view, snapshot.at)}
  ${Workers.panel(snapshot.workers, snapshot.at)}
  ${mergeQueue(snapshot.mergeQueue, view, snapshot.at)}
  ${workLeases(snapshot.workLeases, snapshot.at)}
  </div>`

/** The styles of every page of the console. */
export const style = `
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0}header .db{font-family:ui-monospace,monospace;opacity:.8}
.badge{background:#e0a100;color:#1d2330;border-radius:4px;padding:1px 6px;font-weight:600}
main{padding:8px 20px 40px}section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:4px 16px 12px;margin:14px 0}
h2{font-size:16px;margin:10px 0}h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{font-weight:600;color:#5a6272;font-size:12px}
.body{font-size:12px;color:#3b4456;word-break:break-all}.empty,.note,.updated{color:#6b7384;font-size:12px}
.error{color:#a4161a;background:#fde8e8;padding:6px 10px;border-radius:4px}.notice{background:#e6f4ea;color:#14532d;padding:6px 10px;border-radius:4px}
.stale{color:#fff;background:#a4161a;border-radius:3px;padding:0 5px;font-weight:600}
.actions{display:flex;gap:8px;margin:6px 0}form.action{display:inline}
button{font:inherit;font-size:12px;padding:2px 10px;border:1px solid #9aa3b2;border-radius:4px;background:#fff;cursor:pointer}
button.danger{border-color:#d08a8c;color:#a4161a}.status{margin-right:14px}
.spark rect{fill:#3a6ea5}.pager{color:#5a6272;font-size:12px}.pager a{margin:0 3px}
.search{margin:12px 0 0}.search input{font:inherit;padding:2px 8px;width:260px}
.paused{color:#1d2330;background:#e0a100;border-radius:3px;padding:0 5px;font-size:11px;font-weight:600}
#connection{position:sticky;top:0;z-index:1}
#workers tr.lost{background:#fbeaea}#workers tr.stalled{background:#fff6e0}#workers tr:target{outline:2px solid #3a6ea5}`

/** The whole document, around a snapshot or a live part rendered already. */
export const page = (snapshot: Snapshot.Snapshot | string, view: View): string =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>leasehold console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="5"></noscript>
<style>${style}</style></head>
<body><header><h1>leasehold console</h1><span class="db">${escape(view.database)}</span>${
    view.readOnly ? `<span class="badge">read-only</span>` : ""
  }</header>
<main><p id="connection" class="error" role="alert" hidden></p>${
    view.notice === undefined || placed(view) ? "" : noticeElement(view.notice)
  }
<form method="get" action="/" role="search" class="search"><input type="search" name="q" value="${
    escape(view.query.q)
  }" placeholder="Queue name contains…" aria-label="Search queues by name"><button type="submit">Search</button>${
    view.query.q === "" ? "" : ` <a href="/">All queues</a>`
  }</form>
<div id="live" data-src="/live${
    escape(search(
      view.query.q,
      view.query.page > 1 ? view.query.page : undefined,
      // The live part keeps the notice where it is.
      view.notice !== undefined && placed(view) ? { text: view.notice, at: view.noticeAt! } : undefined
    ))
  }">${typeof snapshot === "string" ? snapshot : live(snapshot, view)}</div></main>
<script src="/console.js" defer></script></body></html>`

/**
 * Fetches the live part every second and keeps the times current between fetches. Browser code, served as
 * /console.js: its timers and `Date.now()` are the browser's own (the server's time reaches it as `data-now`,
 * and the server side reads time only through Effect's `Clock` and the database).
 */
export const script = `"use strict";
(() => {
  const live = document.getElementById("live");
  let offset = 0;
  // The same words as the server's \`ago\` (src/cli/table.ts).
  const ago = (millis, now) => {
    const delta = Math.abs(now - millis);
    const text = delta < 1000 ? delta + " ms"
      : delta < 120000 ? Math.round(delta / 1000) + " s"
      : delta < 7200000 ? Math.round(delta / 60000) + " min"
      : Math.round(delta / 3600000) + " h";
    return millis <= now ? text + " ago" : "in " + text;
  };
  // While the last refresh failed, the page says so and its clocks stop: nothing on it is live.
  const connection = document.getElementById("connection");
  let failedSince;
  const hhmmss = (date) => date.toTimeString().slice(0, 8);
  const failed = (why) => {
    if (failedSince === undefined) failedSince = new Date();
    connection.textContent = why + " since " + hhmmss(failedSince) +
      ": what this page shows is as of then (lease clocks stopped). Retrying every second.";
    connection.hidden = false;
    document.body.dataset.stale = "true";
  };
  const recovered = () => {
    failedSince = undefined;
    connection.hidden = true;
    connection.textContent = "";
    delete document.body.dataset.stale;
  };
  const tick = () => {
    if (failedSince !== undefined) return;
    const now = Date.now() + offset;
    for (const time of live.querySelectorAll("time[data-at]")) time.textContent = ago(Number(time.dataset.at), now);
  };
  const sync = () => {
    const snapshot = document.getElementById("snapshot");
    if (snapshot) offset = Number(snapshot.dataset.now) - Date.now();
  };
  // A press is not swapped out from under the pointer: while a button is held the refresh keeps the part
  // as it is (a click needs its press and release on one element), and once a form is sent the page is
  // leaving — no refresh replaces the button that sent it.
  let pressed = false;
  let leaving = false;
  live.addEventListener("pointerdown", () => { pressed = true; });
  document.addEventListener("pointerup", () => { setTimeout(() => { pressed = false; }, 0); });
  document.addEventListener("pointercancel", () => { pressed = false; });
  document.addEventListener("submit", () => { leaving = true; });
  // One fetch at a time, the next a second after the last ends (a slow server gets no pile-up, and an old
  // answer never replaces a newer one); one that takes over 10 s is given up.
  const refresh = async () => {
    if (leaving) return;
    const abort = new AbortController();
    const limit = setTimeout(() => abort.abort(), 10000);
    try {
      // The same page of queues and the same search as the page (the server put them in data-src).
      const response = await fetch(live.dataset.src || "/live", { cache: "no-store", signal: abort.signal });
      if (response.ok) {
        const html = await response.text();
        if (!pressed && !leaving) { live.innerHTML = html; sync(); tick(); }
        recovered();
      } else failed("The last refresh failed (HTTP " + response.status + ")");
    } catch { failed("Disconnected"); }
    clearTimeout(limit);
    setTimeout(refresh, 1000);
  };
  sync();
  setTimeout(refresh, 1000);
  setInterval(tick, 250);
})();
`
