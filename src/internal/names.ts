/**
 * The one rule for names that another party may choose — queue names, `replyTo`, work-lease domain ids,
 * merge-queue workspaces, bead ids and agent ids — the same on every backend, checked before anything is
 * stored or joins a batch:
 *
 * - a non-empty string of at most `maxNameLength` UTF-16 units (a PostgreSQL notification, whose payload is a
 *   queue's name, carries the longest easily);
 * - no control character (C0, DEL, C1): PostgreSQL refuses NUL in text, and a NUL in one item of a batched
 *   statement failed the whole batch, other callers' items with it;
 * - well-formed Unicode: a lone surrogate has no UTF-8 form, so the PostgreSQL driver sends U+FFFD in its
 *   place, and `"\ud800"`, `"\udc00"` and `"\ufffd"` were one queue there and three on SQLite.
 *
 * Free text that is stored (an error message, a dead letter's reason) is not refused but made storable
 * (`storableText`).
 */
import { InvalidParameterError } from "../Errors.js"

/** The longest name, in UTF-16 units. */
export const maxNameLength = 200

const controlCharacter = /[\u0000-\u001f\u007f-\u009f]/
const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** Whether `text` is well-formed Unicode (no lone surrogate): what `String.prototype.isWellFormed` says. */
export const isWellFormed = (text: string): boolean => !loneSurrogate.test(text)

/** Why `name` breaks the name rule (at most `maxLength` units), or `undefined` when it keeps it. */
export const nameProblem = (name: unknown, maxLength: number = maxNameLength): string | undefined => {
  if (typeof name !== "string" || name.length === 0) return "must be a non-empty string"
  if (name.length > maxLength) return `must be at most ${maxLength} characters`
  if (controlCharacter.test(name)) return "must not contain control characters"
  if (loneSurrogate.test(name)) return "must be well-formed Unicode (it has a lone surrogate)"
  return undefined
}

/** The failure of an operation given `value` as its `parameter` (a name), or `undefined` when it keeps the rule. */
export const refusedName = (parameter: string, value: unknown): InvalidParameterError | undefined => {
  const problem = nameProblem(value)
  return problem === undefined ? undefined : new InvalidParameterError({ parameter, value, reason: problem })
}

/**
 * Why a loop's `name` breaks the rule: the name rule, with room for the name of the queue a loop is named after
 * (`main-loop:<queue>`). It labels logs and metrics.
 */
export const loopNameProblem = (name: unknown): string | undefined => nameProblem(name, 2 * maxNameLength)

const unstorable = /[\u0000]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

/**
 * Free text as every backend can store it: NUL and lone surrogates replaced by U+FFFD (PostgreSQL refuses
 * the one and cannot encode the other), and at most `maxLength` UTF-16 units (cut with an ellipsis).
 */
export const storableText = (text: string, maxLength: number): string => {
  const cut = text.length > maxLength ? `${text.slice(0, maxLength - 1)}…` : text
  return cut.replace(unstorable, "\ufffd")
}
