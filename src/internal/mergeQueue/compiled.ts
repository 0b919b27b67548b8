/**
 * SQLite statements compiled once, when the queue opens, from the same parameterised `sql` templates as
 * ever: a call binds its values to the text compiled then. Building a statement's fragments and compiling
 * them on every call was a large part of each call's cost, and each call's new text had to be hashed and
 * compared again by the driver's statement cache; one text per statement is found by identity.
 *
 * A template names the values it binds per call as slots (`p.agentId`): it is compiled with a marker in
 * each slot's place, and the marker's position among the bound values is where a call's value goes. Every
 * other bound value is a constant of the template (a status list, the lock timeout), bound as before.
 */
import type * as Statement from "@effect/sql/Statement"
import type { Db } from "./schema.js"

/** Starts a slot's marker: no value a template binds as a constant begins with a NUL. */
const marker = "\u0000leasehold-slot:"

/** A statement's text, compiled once, and the values a call binds to it. */
export interface Compiled<P, A extends object> {
  readonly text: string
  /** The bound values, in placeholder order, of a call with `params` at `now` (the test's time, if any). */
  readonly values: (params: P, now: number | undefined) => Array<unknown>
  /** The rows it returns (a type only). */
  readonly rows?: ReadonlyArray<A>
}

/** The slot of the test's time (no parameter's name starts with `@`). */
const nowSlot = `${marker}@now`

/** A template's slots: what it binds per call, one per parameter (a marker, stood in for the value). */
export type Slots<P> = { readonly [K in keyof P]: unknown }

type Step = { readonly slot: string } | { readonly now: true } | { readonly constant: unknown }

/**
 * Compiles `build` once. `p` has a slot per parameter of `P`; `now` is the time a statement runs at — the
 * database's clock read by the statement, or under `TestClock` a slot bound to the test's time per call.
 */
export const compile = <P extends Record<string, unknown> = Record<never, never>, A extends object = object>(
  db: Db,
  build: (p: Slots<P>, now: Statement.Fragment) => Statement.Statement<A>
): Compiled<P, A> => {
  const slots = new Proxy({}, { get: (_, name) => `${marker}${String(name)}` }) as Slots<P>
  const now = db.testNow === undefined ? db.databaseNow : db.sql`${nowSlot}`
  const [text, bound] = build(slots, now).compile()
  const steps: ReadonlyArray<Step> = bound.map((value) =>
    value === nowSlot
      ? { now: true }
      : typeof value === "string" && value.startsWith(marker)
      ? { slot: value.slice(marker.length) }
      : { constant: value }
  )
  return {
    text,
    values: (params, at) => {
      const values = new Array<unknown>(steps.length)
      for (let i = 0; i < steps.length; i++) {
        const step = steps[i]!
        values[i] = "constant" in step
          ? step.constant
          : "now" in step
          ? at
          : (params as Record<string, unknown>)[step.slot] ?? null
      }
      return values
    }
  }
}
