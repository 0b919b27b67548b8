/**
 * What a worker's loops show of themselves to the operator (`leasehold workers`, the console's Workers panel):
 * a loop made on a mailbox whose backend records workers (the SQL mailboxes: see
 * `internal/mailbox/sql/workers.ts`) is tracked, and that backend reads each tracked loop's state, the
 * message in its hand and its heartbeat's age when it refreshes the process's row — every few seconds, on a fiber
 * of its own. The loop itself writes nothing and does nothing more per message: the backend looks at the run's
 * state as it stands. A leaf, so that `MailboxWorker` needs no SQL and the SQL side no worker.
 */
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type { RunState } from "./loops/runState.js"

/** A loop as its process's row records it. */
export interface LoopPulse {
  readonly state: "running" | "draining" | "stopped"
  /** The message being handled or settled, if any. */
  readonly messageId: string | undefined
}

/** A loop a backend records: its name, queue, heartbeat and how to look at it now. */
export interface TrackedLoop {
  readonly name: string
  readonly queue: string
  readonly elapsed: Effect.Effect<Duration.Duration>
  /** Its state now; `undefined` while it has never run (not listed). */
  readonly look: () => LoopPulse | undefined
}

/** Where a backend that records workers keeps the loops made on its mailboxes. */
export interface Registry {
  /** Every loop made on them (several may share a name: N loops over one queue). */
  readonly loops: Set<TrackedLoop>
  /** Called after a loop is tracked: the backend starts refreshing only once there is one. */
  readonly tracked: () => void
}

/** The registry of a mailbox whose backend records workers: a field of the mailbox (a SQL mailbox sets it). */
export const RegistryId: unique symbol = Symbol.for("leasehold/Mailbox/registry")

/**
 * The most loops a registry keeps: past it, making a loop forgets those not running (a process that makes loops
 * again and again keeps no trail of them).
 */
const maxTracked = 1000

/**
 * Tracks a loop over `mailbox` if its backend records workers. `run` is read when the process's row is refreshed:
 * the run in progress, or `undefined` between runs.
 */
export const track = (
  mailbox: { readonly name: string },
  name: string,
  elapsed: Effect.Effect<Duration.Duration>,
  run: () => RunState<unknown, unknown> | undefined
): void => {
  const registry = (mailbox as { readonly [RegistryId]?: Registry | undefined })[RegistryId]
  if (registry === undefined) return
  if (registry.loops.size >= maxTracked) {
    for (const loop of registry.loops) if (loop.look()?.state !== "running") registry.loops.delete(loop)
  }
  let ran = false
  registry.loops.add({
    name,
    queue: mailbox.name,
    elapsed,
    look: () => {
      const current = run()
      if (current === undefined) return ran ? { state: "stopped", messageId: undefined } : undefined
      ran = true
      return {
        state: current.stopping || current.interrupting ? "draining" : "running",
        messageId: current.inHand?.id
      }
    }
  })
  registry.tracked()
}
