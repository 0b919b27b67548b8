/**
 * Work leases in the soak (property 7): placeholder until WorkLeaseSql has lease timeouts.
 */
import { Effect } from "effect"
import type { Dump } from "./checker.js"
import type * as Protocol from "./protocol.js"

/** Whether the build under test has WorkLeaseSql lease timeouts. */
export const available = false

/** Creates the soak's tables for work leases. */
export const setup = (_config: Protocol.Config) => Effect.void

/** Offsets not processed yet. */
export const pending = (_config: Protocol.Config) => Effect.succeed(0)

/** The resource table's accepted writes and what is left, for the checker. */
export const dump = (_config: Protocol.Config): Effect.Effect<Dump["leases"]> => Effect.succeed(undefined)
