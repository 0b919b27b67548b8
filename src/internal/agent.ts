/**
 * What the inner loop and the tool executor share: how a deadline failure's
 * provider payload is written, and how long a step took by `Clock`.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type * as Deadline from "../Deadline.js"

/** The payload of a deadline failure: the cut-off as ISO-8601, under `deadline_expires_at`. */
export const deadlinePayload = (deadline: Deadline.Deadline | undefined): Record<string, unknown> | undefined =>
  deadline === undefined ? undefined : { deadline_expires_at: deadline.iso }

/** Milliseconds since `start` by `Clock`. */
export const since = (start: number): Effect.Effect<number> => Effect.map(Clock.currentTimeMillis, (now) => now - start)
