/**
 * What became of the demo's requests, read from its SQLite file once the
 * workers have stopped: the replies (received with a short visibility and
 * acknowledged as they are read, so no lease is left behind), the dead
 * letters and what is still queued — each by request id — and which requests
 * a killed worker held leased when it died.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { hostname } from "node:os"
import * as Mailbox from "../Mailbox.js"
import * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import type * as MainLoop from "../MainLoop.js"
import type { DemoResponse } from "./schema.js"

/** A stored request's id, read from its encoded body (which may no longer decode); `undefined` if it has none. */
const requestIdOf = (body: string): string | undefined => {
  try {
    const id = (JSON.parse(body) as { readonly requestId?: unknown } | null)?.requestId
    return typeof id === "string" ? id : undefined
  } catch {
    return undefined
  }
}

/**
 * Reads every reply of `responses` and acknowledges it: each batch is received for a short visibility (a crash
 * of the demo mid-read gives them back soon) and acknowledged together once read.
 */
export const replies = (
  responses: Mailbox.Mailbox<MainLoop.MainLoopResult<DemoResponse>>
) =>
  Effect.gen(function*() {
    const read: Array<MainLoop.MainLoopResult<DemoResponse>> = []
    for (;;) {
      const batch = yield* responses.receive({ maxMessages: 10, visibilityTimeout: "10 seconds" })
      if (batch.length === 0) return read
      for (const message of batch) read.push(message.body)
      const outcomes = yield* Mailbox.settleAll(batch.map((message) => ({ message, reply: Option.none<never>() })))
      for (const outcome of outcomes) if (outcome._tag === "Left") return yield* Effect.fail(outcome.left)
    }
  })

/** The request id of every dead letter of `queue` (a letter without one is named by its own id). */
export const deadLetters = (queue: string) =>
  Effect.gen(function*() {
    const letters = yield* MailboxSqlAdmin.deadLetters({ create: false })
    const list = yield* letters.list({ queue, limit: 100_000 })
    return list.map((letter) => requestIdOf(letter.body) ?? `dead letter ${letter.id}`)
  })

/** The request id of every message still in `queue`, visible, delayed or in flight. */
export const queued = (queue: string) =>
  Effect.gen(function*() {
    const queues = yield* MailboxSqlAdmin.queues({ create: false })
    const messages = yield* queues.peek(queue, { limit: 100_000 })
    return messages.map((message) => requestIdOf(message.body) ?? `message ${message.id}`)
  })

/**
 * The requests of `queue` leased by process `pid` of this machine (the claim records `host:pid`): read once the
 * process is dead, it is what the process held when it died, until the leases run out and others claim them.
 */
export const heldBy = (sql: SqlClient.SqlClient, queue: string, pid: number) =>
  Effect.map(
    sql<{ readonly body: string }>`SELECT body FROM leasehold_mailbox_messages
      WHERE queue = ${queue} AND receipt_handle IS NOT NULL AND received_by = ${`${hostname()}:${pid}`}
      ORDER BY seq`,
    (rows) => rows.map((row) => requestIdOf(row.body) ?? "?")
  )
