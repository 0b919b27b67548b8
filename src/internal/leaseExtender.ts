/**
 * A lease extender bound to one loop's heartbeat for the loop's whole run: what
 * `MailboxWorker` uses instead of `attachUnscoped` per message.
 *
 * A worker handles one message at a time, thousands a second. Registering a
 * listener on the heartbeat for each message (and removing it after) costs
 * more than a short handler; a binding registers one for the run, and per
 * message only points it at the message in hand (`attach`, a field write) and
 * back (`detach`). The extension itself is the extender's: the same rate
 * limit, one in flight, failures logged. `detach` returns the wait for an
 * extension of that message still in flight, if any — nearly never, as
 * extensions come once a minute — so after it nothing touches the message.
 */
import type * as Effect from "effect/Effect"
import type * as Heartbeat from "../Heartbeat.js"
import type { Extendable } from "../LeaseExtender.js"

/** One loop's use of an extender; see the module comment. */
export interface Binding {
  /** Extends `message` on the heartbeat's beats from now until `detach`. */
  readonly attach: (message: Extendable) => void
  /** Stops extending the message in hand; returns the wait for its extension in flight, if there is one. */
  readonly detach: () => Effect.Effect<void> | undefined
  /** Unregisters from the heartbeat, once the loop is done (waits for an extension in flight). */
  readonly stop: Effect.Effect<void>
}

/** Binds an extender to a heartbeat: registered by `LeaseExtender.make` for each extender it makes. */
export type Bind = (heartbeat: Heartbeat.Heartbeat) => Effect.Effect<Binding>

/** Each extender's `Bind`: a field of it, not enumerable, so it stays off the public `LeaseExtender` interface. */
export const BindId: unique symbol = Symbol.for("leasehold/LeaseExtender/bind")

/** `extender`'s `Bind`, if `LeaseExtender.make` made it. */
export const binderOf = (extender: object): Bind | undefined => (extender as { readonly [BindId]?: Bind })[BindId]
