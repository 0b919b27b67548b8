/**
 * How a key's scheduling state reads to an operator, the same in the CLI's `mailbox keys` table and the console's
 * keys panel: leased time as a span ("850 ms", "12.5 s", "4.2 min", "3.1 h") and a rate window as
 * "used/allowed per interval".
 */
import * as Duration from "effect/Duration"
import type * as Scheduling from "../internal/mailbox/scheduling.js"

/** Milliseconds as a span: "850 ms", "12.5 s", "4.2 min", "3.1 h"; "-" for what is not a finite number. */
export const span = (millis: number): string =>
  !Number.isFinite(millis)
    ? "-"
    : millis < 1000
    ? `${Math.round(millis)} ms`
    : millis < 120_000
    ? `${(millis / 1000).toFixed(1)} s`
    : millis < 7_200_000
    ? `${(millis / 60_000).toFixed(1)} min`
    : `${(millis / 3_600_000).toFixed(1)} h`

/** A rate window's interval: "1m", "10s". */
export const period = (window: NonNullable<Scheduling.KeyState["starts"]>): string =>
  Duration.format(Duration.millis(window.perMillis))

/** A rate window: "3/10 per 1m" (used in this window / allowed), "-" without one. */
export const windowText = (window: Scheduling.KeyState["starts"]): string =>
  window === undefined ? "-" : `${window.used}/${window.count} per ${period(window)}`
