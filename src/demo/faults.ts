/**
 * Faults the demo's own tests inject, to show that its accounting catches
 * what it claims to catch. Hidden (not in `--help`): the environment variable
 * `LEASEHOLD_DEMO_FAULTS` lists them, comma-separated, each `KIND:REQUEST_ID`:
 *
 * - `lose:ID` deletes request ID from the mailbox as soon as it is sent: no
 *   worker answers it, nothing dead-letters it;
 * - `dead-letter:ID` files a dead letter for request ID, which is still
 *   answered (doubly settled);
 * - `duplicate:ID` stores a second copy of ID's reply before the demo reads
 *   the replies.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"

/** One injected fault. */
export interface Fault {
  readonly kind: "lose" | "dead-letter" | "duplicate"
  readonly requestId: string
}

/** The environment variable that lists the faults. */
export const variable = "LEASEHOLD_DEMO_FAULTS"

const kinds: ReadonlyArray<Fault["kind"]> = ["lose", "dead-letter", "duplicate"]

/** Reads the list (empty or absent: none); a malformed entry is named in the `Left`. */
export const parse = (spec: string | undefined): Either.Either<ReadonlyArray<Fault>, string> => {
  const faults: Array<Fault> = []
  for (const entry of (spec ?? "").split(",").map((part) => part.trim()).filter((part) => part !== "")) {
    const colon = entry.indexOf(":")
    const kind = entry.slice(0, colon) as Fault["kind"]
    const requestId = entry.slice(colon + 1)
    if (colon < 0 || !kinds.includes(kind) || requestId === "") {
      return Either.left(`${variable}: "${entry}" is not KIND:REQUEST_ID with KIND one of ${kinds.join(", ")}`)
    }
    faults.push({ kind, requestId })
  }
  return Either.right(faults)
}

const messages = "leasehold_mailbox_messages"
const deadLetters = "leasehold_mailbox_dead_letters"

/** Applies the `lose` and `dead-letter` faults to the sent requests (`seqs`: request id → message id). */
export const afterSend = (
  sql: SqlClient.SqlClient,
  faults: ReadonlyArray<Fault>,
  seqs: ReadonlyMap<string, string>
) =>
  Effect.forEach(faults, (fault) => {
    const seq = Number(seqs.get(fault.requestId))
    switch (fault.kind) {
      case "lose":
        return sql`DELETE FROM ${sql(messages)} WHERE seq = ${seq}`
      case "dead-letter":
        return sql`INSERT INTO ${sql(deadLetters)}
            (id, queue, body, reply_to, delivery_count, enqueued_at, dead_lettered_at, error_tag, error)
          SELECT 'fault-' || seq, queue, body, reply_to, 1, enqueued_at, enqueued_at, 'DemoFault',
            'filed by the demo test (LEASEHOLD_DEMO_FAULTS)'
          FROM ${sql(messages)} WHERE seq = ${seq}`
      default:
        return Effect.void
    }
  }, { discard: true })

/** Applies the `duplicate` faults to the stored replies (queue `replies`). */
export const beforeReading = (sql: SqlClient.SqlClient, faults: ReadonlyArray<Fault>, replies: string) =>
  Effect.forEach(
    faults.filter((fault) => fault.kind === "duplicate"),
    (fault) =>
      sql`INSERT INTO ${sql(messages)} (queue, body, visible_at, enqueued_at)
        SELECT queue, body, visible_at, enqueued_at FROM ${sql(messages)}
        WHERE queue = ${replies} AND json_extract(body, '$.requestId') = ${fault.requestId} LIMIT 1`,
    { discard: true }
  )
