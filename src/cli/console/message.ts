/**
 * The console's message page, `GET /message?queue=…&id=…` (a queued, delayed or in-flight message) and
 * `GET /dead-letter?queue=…&id=…`: everything stored about one message — its body pretty-printed (JSON indented;
 * the first `MailboxSqlAdmin` detail length of a longer body, raw, with a note saying it is cut), delivery
 * count, reply-to, trace context, its times and who holds it, and for a dead letter its error whole as stored,
 * the cause first (each innermost line of a schema error with its path, `causesOf`: the line that says what was
 * wrong comes last in Effect's tree, after a type dump). The actions that apply are the console's guarded forms:
 * redrive and delete for a dead letter (the dead-letter actions), delete for a message no receiver holds.
 * Below, the message's step journal when an agent run recorded one (`journal`): a table of its steps, each
 * entry pretty-printed in a `<details>`, at most `journalShown` steps and `maxPretty` characters an entry — and
 * only those are read (`MailboxSqlAdmin.journals().read` with a bound), never the whole journal.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { summary } from "../../internal/mailbox/admin/journalView.js"
import * as StoredTime from "../../internal/storedTime.js"
import * as MailboxSqlAdmin from "../../MailboxSqlAdmin.js"
import { causesOf } from "../errorText.js"
import * as Browse from "./browse.js"
import * as Page from "./page.js"

/** The longest pretty-printed body shown (indenting a long body can make it several times longer). */
export const maxPretty = 128 * 1024

/** A body as the page shows it: indented JSON when it is whole and parses, else as stored. */
export const pretty = (body: string, whole: boolean): { readonly text: string; readonly cut: boolean } => {
  if (whole) {
    try {
      const text = JSON.stringify(JSON.parse(body), null, 2)
      return text.length > maxPretty ? { text: text.slice(0, maxPretty), cut: true } : { text, cut: false }
    } catch {
      // Not JSON (another encoder's body, or damaged): shown as stored.
    }
  }
  return { text: body, cut: !whole }
}

/** The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), if it is one. */
export const traceIdOf = (traceparent: string): string | undefined =>
  /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/.exec(traceparent)?.[1]

/** A form posting `action` with the console's token and `fields`; none on a read-only console. */
const button = (
  context: Browse.Context,
  action: string,
  label: string,
  fields: Record<string, string>,
  danger = false
) =>
  context.readOnly ?
    "" :
    `<form method="post" action="${action}" class="action">${
      Object.entries({ token: context.token, db: context.identity, ...fields }).map(([name, value]) =>
        `<input type="hidden" name="${name}" value="${Page.escape(value)}">`
      ).join("")
    }<button type="submit"${danger ? ` class="danger"` : ""}>${Page.escape(label)}</button></form>`

/** The message page of `id` in `queue` (`dead`: the dead letter); `notice` is what the last action did. */
export const page = (context: Browse.Context, dead: boolean, params: URLSearchParams) =>
  Effect.gen(function*() {
    const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
    const queue = (params.get("queue") ?? "").slice(0, 200)
    const id = (params.get("id") ?? "").slice(0, 200)
    const kind = dead ? "Dead letter" : "Message"
    const listHref = Browse.href({ name: queue, state: dead ? "dead" : "queued" })
    const crumbs = [
      `<a href="${Page.escape(listHref)}">queue <b>${Browse.shown(queue)}</b></a>`,
      `${kind.toLowerCase()} <b>${Browse.shown(id)}</b>`
    ]
    const result = yield* Browse.read(
      context,
      Effect.flatMap(
        MailboxSqlAdmin.browse({ prefix: context.prefix, create: false }),
        (browser) => dead ? browser.deadLetter(queue, id) : browser.message(queue, id)
      )
    )
    const title = `${kind} ${id}`
    if (result._tag === "Left") {
      return { status: 200, body: Browse.document(context, title, crumbs, Browse.readFailure(result.left)) }
    }
    if (Option.isNone(result.right)) {
      return {
        status: 404,
        body: Browse.document(
          context,
          title,
          crumbs,
          `<section id="message"><h2>${kind} <code>${
            Browse.shown(id)
          }</code></h2><p class="empty">No ${kind.toLowerCase()} ${Browse.shown(id)} in queue ${Browse.shown(queue)}: ${
            dead ? "redriven or deleted" : "acknowledged, dead-lettered or deleted"
          } meanwhile, or never there. <a href="${Page.escape(listHref)}">Back to the queue</a>.</p></section>`
        )
      }
    }
    const message = result.right.value
    const steps = yield* Browse.read(
      context,
      Effect.flatMap(
        MailboxSqlAdmin.journals({ prefix: context.prefix, create: false }),
        // Only what the page shows: the page's message (never a request id), `journalShown` steps (one more says
        // there are more), `maxPretty` characters each.
        (journals) => journals.read(message.id, { by: "message", steps: journalShown, entryChars: maxPretty })
      )
    )
    return {
      status: 200,
      body: Browse.document(context, title, crumbs, view(context, message, now) + journal(message.id, steps, now))
    }
  })

/** The most steps the page shows (`leasehold mailbox journal --json` has them all, up to its own bound). */
export const journalShown = 200

/**
 * The message's step journal: nothing when it has none (or the database predates it), a note when it could not
 * be read. Only the journal stored under this message's id (not one found by a request id that looks like it).
 */
export const journal = (
  id: string,
  read: Either.Either<Option.Option<MailboxSqlAdmin.JournalView>, { readonly _tag: string; readonly message: string }>,
  now: number
): string => {
  if (Either.isLeft(read)) {
    return read.left._tag === "TablesNotFoundError"
      ? ""
      : `<section id="journal"><h3>Step journal</h3>${Browse.readFailure(read.left)}</section>`
  }
  if (Option.isNone(read.right) || read.right.value.messageId !== id) return ""
  const found = read.right.value
  const steps = found.steps.slice(0, journalShown)
  const more = found.truncated || found.steps.length > steps.length
  const rows = steps.map((step) => {
    const cutAt = step.entryLength
    // An entry the read cut is the start of its text: its kind is read from that start, if it is there.
    const tag = cutAt !== undefined
      ? /^\{"_tag":"([^"\\]{1,60})"/.exec(String(step.entry))?.[1] ?? "?"
      : typeof step.entry === "object" && step.entry !== null && "_tag" in step.entry
      ? String((step.entry as { readonly _tag: unknown })._tag)
      : "?"
    const text = typeof step.entry === "string" ? step.entry : JSON.stringify(step.entry, null, 2)
    const cut = cutAt !== undefined || text.length > maxPretty
    return `<tr><td>${step.position}</td><td><code>${Browse.shown(step.key)}</code></td><td>${
      Browse.shown(tag, 60)
    }</td><td>${
      cutAt === undefined ? Browse.shown(summary(step.entry), 300) : `${Browse.shown(tag, 60)} (${cutAt} characters)`
    }</td><td>${Page.escape(StoredTime.iso(step.recordedAt))} (${
      Browse.when(step.recordedAt, now)
    })</td></tr><tr class="entry"><td colspan="5"><details><summary>entry${
      cut
        ? ` <small class="cut">(the first ${maxPretty} characters${
          cutAt === undefined ? "" : ` of ${cutAt}, as stored`
        })</small>`
        : ""
    }</summary><pre>${Page.escape(text.length > maxPretty ? text.slice(0, maxPretty) : text)}</pre></details></td></tr>`
  })
  return `<section id="journal"><h3>Step journal <small>(${found.steps.length}${more ? "+" : ""} step${
    found.steps.length === 1 ? "" : "s"
  }${
    Option.match(found.requestId, {
      onNone: () => "",
      onSome: (request) => `, request <code>${Browse.shown(request)}</code>`
    })
  })</small></h3>${
    more
      ? `<p class="note">The first ${steps.length} steps; <code>leasehold mailbox journal --id ${
        Browse.shown(id)
      } --json</code> has more.</p>`
      : ""
  }<table id="journal-table"><thead><tr><th>position</th><th>key</th><th>kind</th><th>summary</th><th>recorded</th></tr></thead><tbody>${
    rows.join("")
  }</tbody></table></section>`
}

/** The page's section for `message`. */
export const view = (context: Browse.Context, message: MailboxSqlAdmin.MessageDetail, now: number) => {
  const dead = message.state === "dead"
  const when = (time: DateTime.Utc | undefined) =>
    time === undefined
      ? "–"
      : StoredTime.isValid(time)
      ? `${Page.escape(DateTime.formatIso(time))} (${Browse.when(time, now)})`
      : "invalid time"
  const traceId = message.traceparent === undefined ? undefined : traceIdOf(message.traceparent)
  const fields: Array<readonly [string, string]> = [
    [
      "queue",
      `<a href="${Page.escape(Browse.href({ name: message.queue, state: message.state }))}"><code>${
        Browse.shown(message.queue)
      }</code></a>`
    ],
    ["state", message.state === "dead" ? "dead-lettered" : Browse.stateNames[message.state]],
    ["deliveries", String(message.deliveryCount)],
    ["reply to", message.replyTo === undefined ? "–" : `<code>${Browse.shown(message.replyTo)}</code>`],
    [
      "trace id",
      message.traceparent === undefined
        ? "–"
        : `<code id="trace-id">${Browse.shown(traceId ?? message.traceparent)}</code>${
          traceId === undefined ? "" : ` <small>(traceparent <code>${Browse.shown(message.traceparent)}</code>)</small>`
        }`
    ],
    ["enqueued", when(message.enqueuedAt)],
    ...(dead
      ? [["dead-lettered", when(message.deadLetteredAt)] as const]
      : [
        [message.state === "inFlight" ? "lease ends" : "visible", when(message.visibleAt)] as const,
        [
          "held by",
          message.receivedBy === undefined ? "–" : `<code>${Browse.shown(message.receivedBy)}</code>`
        ] as const,
        ["last extended", when(message.extendedAt)] as const
      ])
  ]
  // What the actions act on: this letter (dead-lettered when shown), this message (enqueued when shown).
  const letterShown: Record<string, string> = message.deadLetteredAt === undefined
    ? {}
    : { at: StoredTime.toField(message.deadLetteredAt) }
  const whole = message.body.length >= message.bodyLength
  const body = pretty(message.body, whole)
  const actions = dead
    ? `${button(context, "/actions/dead-letters/redrive", "Redrive", { id: message.id, ...letterShown })}${
      button(context, "/actions/dead-letters/delete", "Delete", { id: message.id, ...letterShown }, true)
    }`
    : message.state === "inFlight"
    ? `<span class="note">Held by a receiver: it can be deleted once its lease ends.</span>`
    : button(context, "/actions/messages/delete", "Delete", {
      queue: message.queue,
      id: message.id,
      at: StoredTime.toField(message.enqueuedAt)
    }, true)
  return `<section id="message"><h2>${dead ? "Dead letter" : "Message"} <code>${Browse.shown(message.id)}</code></h2>
  ${actions === "" ? "" : `<div class="actions">${actions}</div>`}
  <dl class="fields">${fields.map(([name, value]) => `<dt>${name}</dt><dd>${value}</dd>`).join("")}</dl>
  ${message.error === undefined ? "" : errorPart(message.errorTag ?? "", message.error, message.errorLength)}
  <h3>Body${
    whole ? "" : ` <small class="cut">(the first ${message.body.length} of ${message.bodyLength} characters)</small>`
  }${whole && body.cut ? ` <small class="cut">(the first ${maxPretty} characters of it indented)</small>` : ""}</h3>
  <pre id="body">${Page.escape(body.text)}</pre>
  </section>`
}

/** A dead letter's error: its causes first, then the whole text as stored. */
const errorPart = (tag: string, error: string, length = error.length) =>
  `<h3>Error <code>${Browse.shown(tag)}</code></h3>
  <p class="note">Cause${causesOf(error).length === 1 ? "" : "s"}:</p>
  <ol class="causes" id="causes">${
    causesOf(error).map((cause) => `<li><code>${Browse.shown(cause, 1000)}</code></li>`).join("")
  }</ol>
  <p class="note">${
    length > error.length
      ? `The first ${error.length} of the ${length} characters stored (a row leasehold did not write: ` +
        `it stores at most ${error.length}):`
      : `The whole error, as stored (${error.length} characters):`
  }</p>
  <pre id="error">${Page.escape(error)}</pre>`
