/**
 * Bodies as stored text: encoded with the mailbox's Schema, then JSON, refused
 * when JSON cannot hold them exactly (NaN, ±Infinity, an invalid `Date`, even
 * behind a `toJSON`) or when they exceed the mailbox's `maxBodyBytes`; decoded
 * the other way, a failure explained in words. Whatever the schema throws —
 * a stack overflow on a body nested deeper than it can recurse included — is
 * that one body's failure, never a defect.
 */
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

/** The largest `maxBodyBytes` a mailbox takes (256 MiB), and the bound on replies to queues of no known mailbox. */
export const maxBodyBytesLimit = 256 * 1024 * 1024

/** Encodes a body for a queue (a mailbox's schema, or its `replySchema`). */
export type Encoder = (body: unknown) => Either.Either<string, string>

// Bodies are JSON: the schema runs on the parsed value and `JSON` itself runs around it, rather than
// through `Schema.parseJson`, whose extra transformation costs as much as the schema of a small body.

export const encoderOf = <A, I>(schema: Schema.Schema<A, I, never>, maxBytes: number): Encoder => {
  const encode = Schema.encodeEither(schema)
  return (body) => {
    let text: string | undefined
    let encoded: unknown
    // The schema is the caller's: a transformation that throws, or a recursive schema given a body nested
    // deeper than the stack (a `RangeError`), is this body's failure to encode, not a defect.
    try {
      const result = encode(body as A)
      if (Either.isLeft(result)) return Either.left(ParseResult.TreeFormatter.formatErrorSync(result.left))
      encoded = result.right
      text = JSON.stringify(encoded)
    } catch (error) {
      return Either.left(`Not JSON: ${describeThrown(error)}`)
    }
    // `undefined` (a `Schema.Void` body, say) has no JSON text.
    if (text === undefined) return Either.left(`Not JSON: ${String(encoded)}`)
    // JSON writes NaN, ±Infinity and an invalid Date (through its `toJSON`) as null: the stored body would not
    // be what was sent. A `null` in the text is rare enough that looking for what is behind it costs nothing
    // on the usual path.
    const inexact = text.includes("null") ? nullWithoutJson(encoded) : undefined
    if (inexact !== undefined) return Either.left(inexact)
    // A UTF-8 byte is at least a third of a UTF-16 unit: only a long text needs counting.
    if (text.length * 3 > maxBytes) {
      const bytes = Buffer.byteLength(text, "utf8")
      if (bytes > maxBytes) {
        return Either.left(`the encoded body is ${bytes} bytes, more than this queue's maxBodyBytes (${maxBytes})`)
      }
    }
    return Either.right(text)
  }
}

/** What was thrown, in words (a thrown value need not be an `Error`, nor printable). */
export const describeThrown = (error: unknown): string => {
  try {
    return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
  } catch {
    return "a value that cannot be printed was thrown"
  }
}

/**
 * Where `value` holds something JSON writes as `null` though it is not null — NaN, ±Infinity, an invalid
 * `Date`, or `undefined`, a function or a symbol in an array — described with its path; else undefined.
 * It asks `JSON.stringify` itself, whose replacer sees every value after `toJSON` (so `{ toJSON: () => NaN }`
 * is caught) with its holder (so a `Date` whose `toJSON` gave null is seen as the invalid `Date` it was),
 * and walks no deeper than `JSON.stringify` could.
 */
export const nullWithoutJson = (value: unknown): string | undefined => {
  const paths = new WeakMap<object, string>()
  let found: string | undefined
  const replacer = function(this: unknown, key: string, written: unknown): unknown {
    if (found !== undefined) return undefined
    const holder = this as Record<string, unknown>
    const parent = typeof holder === "object" && holder !== null ? paths.get(holder) : undefined
    const path = parent === undefined ? "" : Array.isArray(holder) ? `${parent}[${key}]` : `${parent}.${key}`
    const where = path === "" ? "the body" : path
    const original = holder?.[key]
    if (original instanceof Date && Number.isNaN(original.getTime())) {
      found = `an invalid Date at ${where} has no JSON form`
    } else if (typeof written === "number" && !Number.isFinite(written)) {
      found = `${written} at ${where} has no JSON form`
    } else if (
      Array.isArray(holder) &&
      (written === undefined || typeof written === "function" || typeof written === "symbol")
    ) {
      found = `${typeof written} at ${where} has no JSON form in an array (it would be written as null)`
    } else if (typeof written === "object" && written !== null) {
      paths.set(written, path)
    }
    return written
  }
  try {
    JSON.stringify(value, replacer)
  } catch (error) {
    return `Not JSON: ${describeThrown(error)}`
  }
  return found
}

/** Decodes a stored body; the error is the reason a row that fails is dead-lettered with. */
export const decoderOf = <A, I>(schema: Schema.Schema<A, I, never>): (text: string) => Either.Either<A, string> => {
  const decode = Schema.decodeUnknownEither(schema)
  return (text) => {
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch (error) {
      return Either.left(`Not JSON: ${describeThrown(error)}`)
    }
    // Whatever the schema does with this body — fail, throw, or recurse past the stack on a body nested deep
    // (a `RangeError`) — is this body's failure to decode: the row is set aside, the others are delivered.
    try {
      return Either.mapLeft(decode(json), (error) => ParseResult.TreeFormatter.formatErrorSync(error))
    } catch (error) {
      return Either.left(`Could not be decoded: ${describeThrown(error)}`)
    }
  }
}
