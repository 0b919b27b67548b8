/**
 * Bodies as stored text: encoded with the mailbox's Schema, then JSON, refused
 * when JSON cannot hold them exactly (NaN, ±Infinity) or when they exceed the
 * mailbox's `maxBodyBytes`; decoded the other way, a failure explained in words.
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
    const encoded = encode(body as A)
    if (Either.isLeft(encoded)) return Either.left(ParseResult.TreeFormatter.formatErrorSync(encoded.left))
    let text: string | undefined
    try {
      text = JSON.stringify(encoded.right)
    } catch (error) {
      return Either.left(`Not JSON: ${String(error)}`)
    }
    // `undefined` (a `Schema.Void` body, say) has no JSON text.
    if (text === undefined) return Either.left(`Not JSON: ${String(encoded.right)}`)
    // JSON writes NaN and ±Infinity as null: the stored body would not be what was sent. A `null` in the
    // text is rare enough that looking for the number behind it costs nothing on the usual path.
    const inexact = text.includes("null") ? nonFinite(encoded.right, "") : undefined
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

/** Where `value` holds a number JSON cannot write exactly (NaN, ±Infinity), described; else undefined. */
export const nonFinite = (value: unknown, path: string): string | undefined => {
  if (typeof value === "number") {
    return Number.isFinite(value) ? undefined : `${value} at ${path === "" ? "the body" : path} has no JSON form`
  }
  if (typeof value !== "object" || value === null) return undefined
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = nonFinite(value[i], `${path}[${i}]`)
      if (found !== undefined) return found
    }
    return undefined
  }
  // What JSON.stringify writes: an object with toJSON is written as what it returns (a Date as a string).
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") return undefined
  for (const key of Object.keys(value)) {
    const found = nonFinite((value as Record<string, unknown>)[key], `${path}.${key}`)
    if (found !== undefined) return found
  }
  return undefined
}

/** Decodes a stored body; the error is the reason a row that fails is dead-lettered with. */
export const decoderOf = <A, I>(schema: Schema.Schema<A, I, never>): (text: string) => Either.Either<A, string> => {
  const decode = Schema.decodeUnknownEither(schema)
  return (text) => {
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch (error) {
      return Either.left(`Not JSON: ${String(error)}`)
    }
    return Either.mapLeft(decode(json), (error) => ParseResult.TreeFormatter.formatErrorSync(error))
  }
}
