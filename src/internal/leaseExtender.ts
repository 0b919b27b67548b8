/**
 * A lease extender bound to one loop's heartbeat for the loop's whole run: what
 * `MailboxWorker` uses instead of `attachUnscoped` per message.
 *
 * A worker handles one message at a time, thousands a second. Registering a
 * listener on the heartbeat for each message (and removing it after) costs
 * more than a short handler; a binding registers one for the run, and per
 * message the worker only points it at the message in hand and back, by
 * writing `subject` (`attach` and `detach`: no call, so a message no beat finds
 * in hand costs the extender nothing). The extension itself is the extender's:
 * the same rate limit, one in flight, failures logged. A detach waits for an
 * extension of that message still in flight (`flight`), if any — nearly
 * never, as extensions come once a minute — so after it nothing touches the
 * message.
 */
import type * as Deferred from "effect/Deferred"
import type * as Effect from "effect/Effect"
import type * as Heartbeat from "../Heartbeat.js"
import type { Extendable } from "../LeaseExtender.js"

/** One loop's use of an extender; see the module comment. */
export interface Binding {
  /**
   * The message in hand, extended on the heartbeat's beats while it is here: the worker sets it as the message
   * starts and clears it before settling it (then waits for `flight` if that is the message's).
   */
  subject: Extendable | undefined
  /** The extension in flight, if any, and the message it extends. */
  readonly flight: Flight | undefined
  /** Unregisters from the heartbeat, once the loop is done (waits for an extension in flight). */
  readonly stop: Effect.Effect<void>
}

/** An extension in flight: `done` completes when it has landed (succeeded or failed). */
export interface Flight {
  readonly message: Extendable
  readonly done: Deferred.Deferred<void>
}

/** Binds an extender to a heartbeat: registered by `LeaseExtender.make` for each extender it makes. */
export type Bind = (heartbeat: Heartbeat.Heartbeat) => Effect.Effect<Binding>

/** Each extender's `Bind`: a field of it, not enumerable, so it stays off the public `LeaseExtender` interface. */
export const BindId: unique symbol = Symbol.for("leasehold/LeaseExtender/bind")

/** `extender`'s `Bind`, if `LeaseExtender.make` made it. */
export const binderOf = (extender: object): Bind | undefined => (extender as { readonly [BindId]?: Bind })[BindId]
