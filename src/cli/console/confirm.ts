/**
 * The console's second step for destructive actions (deleting dead letters, deleting a message). The first POST
 * of such an action answers a confirmation page instead of acting: it says what would be deleted and carries a
 * form that posts the same action again with a one-time confirmation value. The server issued that value for
 * exactly one action — its kind (the route), its `queue` and `id` (each given or not: an id is not a queue, and
 * "none" is not "all"), and the database the page was read from — and takes it once: posted with any other
 * combination (a field changed, added or left out), or a second time, it is not carried out. Plain forms: it
 * works without JavaScript.
 */
import { randomUUID } from "node:crypto"
import { escape } from "./page.js"

/** What one confirmation value allows: one action, on one target, of one database. */
export interface Binding {
  /** The action's route, e.g. `/actions/dead-letters/delete`. */
  readonly kind: string
  readonly queue: string | undefined
  readonly id: string | undefined
  /** What the page showed of the row (its time: server.ts), if the action names one. */
  readonly at?: string | undefined
  /** The identity of the database the page was read from (source.ts). */
  readonly database: string
}

/** The confirmation values issued and not yet used, each bound to its action. */
export interface Confirmations {
  /**
   * A new value for `binding`; `back` is where the confirmed action returns to (a path the server made, kept
   * here rather than trusted from the form).
   */
  readonly issue: (binding: Binding, back?: string) => string
  /**
   * Whether `value` was issued for exactly `binding` and not used — with the `back` it was issued with — or
   * `undefined`; it cannot be used again either way.
   */
  readonly take: (value: string, binding: Binding) => { readonly back: string | undefined } | undefined
}

/** How many unused values are kept (the oldest are forgotten first): a page left open long asks again. */
const kept = 256

/** One text per binding, every field in it (absent and empty kept apart). */
const key = (binding: Binding) =>
  JSON.stringify([binding.kind, binding.queue ?? null, binding.id ?? null, binding.at ?? null, binding.database])

export const make = (): Confirmations => {
  const issued = new Map<string, { readonly key: string; readonly back: string | undefined }>()
  return {
    issue: (binding, back) => {
      const value = randomUUID()
      issued.set(value, { key: key(binding), back })
      if (issued.size > kept) issued.delete(issued.keys().next().value!)
      return value
    },
    take: (value, binding) => {
      const bound = issued.get(value)
      issued.delete(value)
      return bound !== undefined && bound.key === key(binding) ? { back: bound.back } : undefined
    }
  }
}

/** What a confirmation page shows and posts. */
export interface Request {
  /** Where the confirmed form posts (the same action). */
  readonly action: string
  /** The question, e.g. "Delete all 3 dead letters?". */
  readonly question: string
  /** What follows if confirmed. */
  readonly detail: string
  /** The button's label. */
  readonly label: string
  /** The form's fields: the token, the target, the confirmation value. */
  readonly fields: Readonly<Record<string, string>>
  /** Where "Cancel" goes back to. */
  readonly back: string
}

/** The confirmation page (the console's style, no script). */
export const page = (request: Request): string =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Confirm: ${escape(request.question)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:14px/1.45 system-ui,sans-serif;margin:40px auto;max-width:640px;color:#1d2330}
.box{border:1px solid #d08a8c;border-radius:6px;padding:8px 20px 16px;background:#fff}
button{font:inherit;padding:4px 14px;border:1px solid #d08a8c;border-radius:4px;background:#fff;color:#a4161a;cursor:pointer}
a{margin-left:14px}</style></head>
<body><div class="box" role="alertdialog" aria-labelledby="question"><h1 id="question" style="font-size:18px">${
    escape(request.question)
  }</h1><p>${escape(request.detail)}</p>
<form method="post" action="${escape(request.action)}" id="confirm">${
    Object.entries(request.fields).map(([name, value]) =>
      `<input type="hidden" name="${escape(name)}" value="${escape(value)}">`
    ).join("")
  }<button type="submit">${escape(request.label)}</button><a href="${escape(request.back)}">Cancel</a></form></div>
</body></html>`
