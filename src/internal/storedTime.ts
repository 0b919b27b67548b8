/**
 * Stored times, decoded safely for display. A time column holds epoch milliseconds, but a row written by hand,
 * by another tool or damaged may hold a number outside JavaScript's Date range (±8.64e15 ms) or no number at all.
 * Such a time is not a `DateTime`: it is decoded as the range's upper limit (`invalid`), which no stored time
 * ever is, so one damaged row is still listed (its time shown as "invalid time", null in JSON) and the other
 * rows are not affected.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type * as Statement from "@effect/sql/Statement"
import * as DateTime from "effect/DateTime"

/** The largest epoch milliseconds a Date holds: what a stored time out of range (or not a number) decodes to. */
export const limit = 8_640_000_000_000_000

/** The stand-in for a stored time that is no time (see the module comment). */
export const invalid: DateTime.Utc = DateTime.unsafeMake(limit)

/** A stored time (epoch milliseconds as a number, bigint or text) as a `DateTime`, or `invalid`. */
export const decode = (raw: unknown): DateTime.Utc => {
  const millis = typeof raw === "number" ? raw : typeof raw === "bigint" || typeof raw === "string" ? Number(raw) : NaN
  return Number.isFinite(millis) && Math.abs(millis) < limit && !(typeof raw === "string" && raw.trim() === "")
    ? DateTime.unsafeMake(millis)
    : invalid
}

/** Whether `time` is a real time (not `invalid`). */
export const isValid = (time: DateTime.Utc): boolean => Math.abs(DateTime.toEpochMillis(time)) < limit

/** Epoch milliseconds `millis` as ISO text, or "invalid time" when it is none. */
export const isoOfMillis = (millis: number): string =>
  Number.isFinite(millis) && Math.abs(millis) < limit ? new Date(millis).toISOString() : "invalid time"

/** `time` as ISO text, or "invalid time". */
export const iso = (time: DateTime.Utc): string => isValid(time) ? DateTime.formatIso(time) : "invalid time"

/** `time` as ISO text for JSON, or null. */
export const json = (time: DateTime.Utc): string | null => isValid(time) ? DateTime.formatIso(time) : null

/**
 * The condition that `column` still holds `time` as it was read (`invalid`: still no time), for a statement
 * that acts on a row only while it is the row an operator was shown.
 */
export const still = (sql: SqlClient.SqlClient, column: string, time: DateTime.Utc): Statement.Fragment =>
  isValid(time)
    ? sql`${sql(column)} = ${DateTime.toEpochMillis(time)}`
    : sql`NOT (${sql(column)} > ${-limit} AND ${sql(column)} < ${limit})`

/** A time as a form carries it (epoch milliseconds, `invalid` as the limit); `undefined` when it is none. */
export const ofField = (text: string): DateTime.Utc | undefined =>
  /^-?\d{1,16}$/.test(text) ? decode(Number(text)) : undefined

/** `time` as a form carries it (see `ofField`). */
export const toField = (time: DateTime.Utc): string => String(DateTime.toEpochMillis(time))
