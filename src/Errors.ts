/**
 * Errors: the errors every module shares (`InvalidParameterError`,
 * `AlreadyRunningError`, …), and what the loops say about a failure when they
 * reply an error result or store a dead letter.
 *
 * One rule for bad input. Configuration given to a constructor (`make`,
 * `layer…` options) is decoded by a Schema: bad configuration fails with a
 * `ParseError` (`effect/ParseResult`) whose message names the field — never a
 * defect. Arguments to an operation (`receive`, `send`, `nack`,
 * `extendVisibility`, `tryAcquire`, an admin `limit`) that are out of range
 * fail with `InvalidParameterError` naming the parameter. A second concurrent
 * `run` is `AlreadyRunningError`.
 *
 * A failure reaches a requester (or an operator reading dead letters) as an
 * `ErrorInfo`: its tag, its message and, for tagged errors, its fields as
 * plain JSON (`details`), so a `PromptEvaluationError` keeps its `phase` and
 * `providerPayload` and an `InvalidParameterError` its `parameter` on the way.
 * A leaf module: the loops, the tool executor and the dead-letter store all
 * describe failures the same way without importing each other.
 */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Predicate from "effect/Predicate"
import * as Schema from "effect/Schema"
import { installSpec } from "./internal/peers.js"

/**
 * An argument of an operation is out of range or malformed; `parameter` names it and `reason` says what is
 * allowed. (A constructor's bad configuration is a `ParseError` instead.)
 *
 * @category errors
 */
export class InvalidParameterError extends Schema.TaggedError<InvalidParameterError>()("InvalidParameterError", {
  parameter: Schema.String,
  value: Schema.Unknown,
  reason: Schema.String
}) {
  override get message(): string {
    return `Invalid ${this.parameter} ${formatValue(this.value)}: ${this.reason}`
  }
}

/**
 * `run` was called on a loop (or a group of loops) that is already running: one run at a time.
 *
 * @category errors
 */
export class AlreadyRunningError extends Schema.TaggedError<AlreadyRunningError>()("AlreadyRunningError", {
  /** What is running: a loop's name, or a group's loop names joined. */
  name: Schema.String
}) {
  override get message(): string {
    return `${this.name} is already running: stop it, or wait for its run to end, before running it again`
  }
}

/**
 * A feature needs a package that is not installed: leasehold's drivers, its HTTP server, its exporter and its
 * model providers are optional peer dependencies, loaded only by the module that uses them. The message's
 * install line names the range this release works with (a bare name would resolve an Effect 4 release).
 *
 * @category errors
 */
export class MissingPackageError extends Schema.TaggedError<MissingPackageError>()("MissingPackageError", {
  /** The npm package to install. */
  packageName: Schema.String,
  /** What needs it, e.g. `Database.layerSqlite`. */
  neededBy: Schema.String
}) {
  override get message(): string {
    return `${this.neededBy} needs the package ${this.packageName}, which is not installed: ` +
      `npm install ${installSpec(this.packageName)}`
  }
}

/**
 * A service was asked to open what already exists (an operator's look, which must change nothing), and the
 * database has no such tables: a wrong database, or a wrong `prefix`.
 *
 * @category errors
 */
export class TablesNotFoundError extends Schema.TaggedError<TablesNotFoundError>()("TablesNotFoundError", {
  what: Schema.String,
  prefix: Schema.String,
  missing: Schema.Array(Schema.String)
}) {
  override get message(): string {
    return `no ${this.what} with prefix "${this.prefix}" in this database (missing: ${this.missing.join(", ")}). ` +
      "Is it the database your workers use, and is --prefix the one they were started with?"
  }
}

/**
 * A service opened with `create: false` (run no migration) found its tables at an older schema version than
 * this release needs, or not created at all (`current` null): run `leasehold migrate` (or
 * `Migrations.run`) against the database first. A database migrated by a newer release is no error here:
 * its older functions and columns are kept for processes of earlier releases (see docs/operating.md).
 *
 * @category errors
 */
export class SchemaVersionError extends Schema.TaggedError<SchemaVersionError>()("SchemaVersionError", {
  /** The service: `mailbox`, `work lease` or `merge queue`. */
  service: Schema.String,
  prefix: Schema.String,
  /** The service's migrations table. */
  table: Schema.String,
  /** The highest migration the table records; null when there is no such table. */
  current: Schema.NullOr(Schema.Number),
  /** The version this release needs. */
  required: Schema.Number
}) {
  override get message(): string {
    const found = this.current === null
      ? `have not been created (no table ${this.table})`
      : `are at schema version ${this.current} (${this.table})`
    return `the ${this.service} tables with prefix "${this.prefix}" ${found}; this release needs version ` +
      `${this.required}, and was started with create: false (no migrations at start). Run ` +
      `\`leasehold migrate --db <the database> --prefix ${this.prefix}\` first.`
  }
}

const formatValue = (value: unknown): string => {
  if (Duration.isDuration(value)) return Duration.format(value)
  try {
    return JSON.stringify(value) ?? String(value)
  } catch {
    return String(value)
  }
}

/**
 * A failure reduced to what a reply or a dead letter can carry.
 *
 * @category models
 */
export interface ErrorInfo {
  readonly tag: string
  readonly message: string
  /** The error's own fields as JSON (tagged errors only; absent when there are none). */
  readonly details?: Readonly<Record<string, unknown>> | undefined
}

/** Fields that are the error's machinery, not its data. */
const skipped: ReadonlySet<string> = new Set(["_tag", "message", "stack", "cause", "name"])

/** A field's JSON form, or undefined when it has none (a function, a cycle, a class JSON cannot hold). */
const toJson = (value: unknown): unknown => {
  if (DateTime.isDateTime(value)) return DateTime.formatIso(DateTime.toUtc(value))
  if (value === null || Predicate.isString(value) || Predicate.isBoolean(value)) return value
  if (Predicate.isNumber(value)) return Number.isFinite(value) ? value : String(value)
  if (typeof value !== "object") return undefined
  try {
    return JSON.parse(JSON.stringify(value))
  } catch {
    return undefined
  }
}

const detailsOf = (error: object): Record<string, unknown> | undefined => {
  let details: Record<string, unknown> | undefined
  for (const key of Object.keys(error)) {
    if (skipped.has(key)) continue
    const value = toJson((error as Record<string, unknown>)[key])
    if (value !== undefined) (details ??= {})[key] = value
  }
  return details
}

/**
 * Describes a failure: its tag (`Error` for untagged values), message and, for a tagged error, its fields.
 *
 * @category utils
 */
export const describe = (error: unknown): ErrorInfo => {
  if (typeof error === "object" && error !== null) {
    const tagged = "_tag" in error && typeof error._tag === "string"
    const tag = tagged ? error._tag as string : error.constructor?.name ?? "Error"
    const message = "message" in error && typeof error.message === "string" && error.message.length > 0
      ? error.message
      : tag
    const details = tagged ? detailsOf(error) : undefined
    return details === undefined ? { tag, message } : { tag, message, details }
  }
  return { tag: "Error", message: String(error) }
}
