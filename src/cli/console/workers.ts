/**
 * The console's Workers panel, like Sidekiq's Busy page with proof-of-work ages: each worker process (its
 * `host:pid` with, beside it, the instance id of the store that wrote the row; its name, start, version) with one
 * row per loop — its queue, state, the message in its hand and how long ago its heartbeat beat. A loop whose
 * heartbeat is older than the stalled threshold is marked STALLED, a process whose row was not refreshed for the
 * lost threshold LOST (both judged by the database's clock, see `internal/mailbox/sql/workers.ts`). The first row
 * of each `host:pid` is the anchor an in-flight lease's "held by" links to (`heldBy`). Ages are `<time data-at>`
 * like the page's other clocks, so they keep counting between fetches. Every value from the database is escaped
 * and cut; the list is bounded (`Snapshot.pageLimit`).
 */
import { escape } from "./html.js"
import type * as Snapshot from "./snapshot.js"

/** The longest name or id shown whole: longer ones (a queue name may have 200 characters) end in "…". */
const maxShown = 60

/**
 * The most loop rows the panel shows, over all its processes (a process lists every loop it runs): with the
 * processes bounded too, and every value cut, the panel is bounded whatever the table holds.
 */
export const maxLoopRows = 40

const shown = (value: string, max = maxShown) => escape(value.length > max ? `${value.slice(0, max)}…` : value)

/** The id of a process's row: the fragment an in-flight lease's "held by" links to. */
export const anchor = (process: string): string =>
  `worker-${process.slice(0, maxShown).replace(/[^A-Za-z0-9_.:-]/g, "_")}`

/** An in-flight lease's "held by": the process, linking to its row of the Workers panel. */
export const heldBy = (process: string): string =>
  `<a href="#${escape(anchor(process))}"><code>${shown(process)}</code></a>`

const seconds = (millis: number) => `${Math.round(millis / 1000)} s`

/** A time that the page's script keeps current ("12 s ago"); the server's own words until it does. */
const since = (millis: number, now: number) =>
  Number.isFinite(millis) && Math.abs(millis) < 8.64e15
    ? `<time data-at="${millis}" title="${new Date(millis).toISOString()}">${seconds(now - millis)} ago</time>`
    : "–"

const badge = (text: string) => ` <span class="stale">${text}</span>`

const processRows = (
  worker: Snapshot.WorkersView["processes"][number],
  now: number,
  budget: number,
  anchored: boolean
): string => {
  const shownLoops = worker.loops.slice(0, Math.max(0, budget))
  const hidden = worker.loops.length - shownLoops.length
  const cells = [
    `<code>${shown(worker.process)}</code>${
      worker.instance === undefined ? "" : ` <small class="instance">${shown(worker.instance, 20)}</small>`
    }${worker.lost ? badge("LOST") : ""}${
      worker.lost ? `<br><small>last seen ${since(now - worker.sinceRefreshMillis, now)}</small>` : ""
    }`,
    worker.name === undefined ? "–" : shown(worker.name),
    since(worker.startedAt, now),
    shown(worker.version, 20)
  ]
  const loops = shownLoops.length === 0 ? [undefined] : shownLoops
  return loops.map((loop, i) => {
    const head = i === 0
      ? cells.map((cell) => `<td rowspan="${loops.length}">${cell}</td>`).join("")
      : ""
    const tail = loop === undefined
      ? `<td colspan="5" class="empty">${
        hidden > 0 ? `${hidden} loops not shown (the panel shows ${maxLoopRows})` : "no loop has run yet"
      }</td>`
      : [
        shown(loop.name),
        shown(loop.queue),
        escape(loop.state),
        loop.messageId === undefined ? "–" : `<code>${shown(loop.messageId)}</code>`,
        loop.state === "stopped"
          ? "–"
          : `${since(now - loop.heartbeatAgeMillis, now)}${loop.stalled ? badge("STALLED") : ""}`
      ].map((cell) => `<td>${cell}</td>`).join("")
    const more = i === loops.length - 1 && loop !== undefined && hidden > 0
      ? `<br><small>${hidden} more loops not shown</small>`
      : ""
    const attributes = [
      i === 0 && anchored ? ` id="${escape(anchor(worker.process))}"` : "",
      ` class="${worker.lost ? "lost" : loop?.stalled === true ? "stalled" : "live"}"`
    ].join("")
    return `<tr${attributes}>${head}${tail.replace(/<\/td>$/, `${more}</td>`)}</tr>`
  }).join("")
}

/** Every process's rows, within `maxLoopRows` loops in all (a process past them shows one row saying so). */
const rows = (processes: Snapshot.WorkersView["processes"], now: number) => {
  let budget = maxLoopRows
  // Several rows may share a host:pid (one per store instance): the first is the anchor, ids stay unique.
  const anchors = new Set<string>()
  return processes.map((worker) => {
    const anchored = !anchors.has(anchor(worker.process))
    anchors.add(anchor(worker.process))
    const html = processRows(worker, now, budget, anchored)
    budget -= worker.loops.length
    return html
  }).join("")
}

/** The Workers panel of a snapshot. */
export const panel = (part: Snapshot.Section<Snapshot.WorkersView>, now: number): string => {
  if (part._tag === "Failed") {
    return `<section id="workers"><h2>Workers</h2><p class="error" role="alert">Could not read: ${
      escape(part.error)
    }</p></section>`
  }
  if (part._tag === "Absent") {
    return `<section id="workers"><h2>Workers</h2><p class="empty">${escape(part.reason)}</p></section>`
  }
  const { lostAfter, processes, stalledAfter } = part.value
  const headers = ["process", "name", "started", "version", "loop", "queue", "state", "message", "heartbeat"]
  return `<section id="workers"><h2>Workers</h2>
    <p class="note">Each worker process refreshes its row every few seconds; a loop beats on every poll and
    whenever its work beats. STALLED: a heartbeat older than ${seconds(stalledAfter)}; LOST: a process not heard
    from for ${seconds(lostAfter)} (the database's clock).</p>${
    processes.length === 0
      ? `<p class="empty">No worker processes: workers register while one of their SQL mailboxes is open.</p>`
      : `<table id="workers-table"><thead><tr>${
        headers.map((header) => `<th>${header}</th>`).join("")
      }</tr></thead><tbody>${rows(processes, now)}</tbody></table>`
  }</section>`
}
