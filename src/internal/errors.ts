/**
 * How the errors of leasehold describe a driver's failure: whether it means
 * the database cannot be reached (worth retrying) or refused a statement (a
 * bug or bad data), and its text with the driver's own message.
 */

/** Error codes and messages of a database that cannot be reached (as opposed to one that refused a statement). */
const unreachableCodes: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "57P01",
  "57P02",
  "57P03",
  "53300",
  "SQLITE_CANTOPEN",
  "SQLITE_BUSY",
  "SQLITE_IOERR",
  "SQLITE_NOTADB"
])
const unreachableMessage =
  /connection (terminated|is not open|error)|not queryable|timeout exceeded when trying to connect|database is locked/i

/**
 * Whether a store failure means the database cannot be reached (down, restarting, out of connections,
 * locked) rather than that it refused a statement (a constraint, bad SQL, bad input): the first is worth
 * retrying, the second is a bug or bad data. Walks the failure's `cause` chain (a driver error inside an
 * `SqlError`); PostgreSQL's connection-exception class (SQLSTATE 08…) counts as unreachable.
 */
export const isUnreachable = (failure: unknown): boolean => {
  for (let error = failure, depth = 0; typeof error === "object" && error !== null && depth < 5; depth++) {
    const { code, message } = error as { readonly code?: unknown; readonly message?: unknown }
    if (
      typeof code === "string" && (unreachableCodes.has(code) || code.startsWith("08") ||
        code.startsWith("SQLITE_IOERR"))
    ) return true
    if (typeof message === "string" && unreachableMessage.test(message)) return true
    error = (error as { readonly cause?: unknown }).cause
  }
  return false
}

/** A failure as text: itself, and the innermost cause's message when that says more (a driver's error). */
export const causeText = (failure: unknown): string => {
  let innermost: string | undefined
  for (let error = failure, depth = 0; typeof error === "object" && error !== null && depth < 5; depth++) {
    const { message } = error as { readonly message?: unknown }
    if (typeof message === "string" && message.length > 0) innermost = message
    error = (error as { readonly cause?: unknown }).cause
  }
  const text = String(failure)
  return innermost === undefined || text.includes(innermost) ? text : `${text} (${innermost})`
}
