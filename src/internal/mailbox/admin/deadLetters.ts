/**
 * The operator's dead-letter table (`MailboxSqlAdmin.deadLetters`): list, count, redrive, delete, and the sink a
 * `MainLoop` dead-letters into. A redrive or a delete takes the letters' journals in the same transaction.
 */
import type * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import { InvalidParameterError, SerializationError } from "../../../Mailbox.js"
import type { DeadLetters, Selection, StoredDeadLetter } from "../../../MailboxSqlAdmin.js"
import { nameProblem, storableText } from "../../names.js"
import * as Sql from "../../sql/common.js"
import * as StoredTime from "../../storedTime.js"
import { currentTraceparent } from "../../tracing.js"
import { encoderOf, maxBodyBytesLimit } from "../sql/codec.js"
import * as Journal from "../sql/journal.js"
import * as Keys from "../sql/keys.js"
import { nowOf, statements } from "../sql/statements.js"
import { connectionError, type Store } from "../sql/store.js"

/**
 * The longest error a stored dead letter keeps (a handler's error message is the user's: it may be long, hold a
 * NUL or a lone surrogate — stored as U+FFFD, so the letter is stored and the request leaves the queue).
 */
const maxErrorLength = 64 * 1024

/** A `limit` of the operator's queries: a positive integer (the database would take a negative one as none). */
export const checkLimit = (limit: number | undefined): Either.Either<undefined, InvalidParameterError> =>
  limit === undefined || (Number.isSafeInteger(limit) && limit > 0 && limit <= 100_000)
    ? Either.right(undefined)
    : Either.left(
      new InvalidParameterError({ parameter: "limit", value: limit, reason: "must be an integer in 1..100000" })
    )

interface DeadLetterRow {
  readonly id: string
  readonly queue: string
  readonly body: string
  readonly reply_to: string | null
  readonly delivery_count: number | string
  readonly enqueued_at: number | string
  readonly dead_lettered_at: number | string
  readonly error_tag: string
  readonly error: string
  /** The message's trace context (mailbox migration 8; absent before). */
  readonly traceparent?: string | null | undefined
  /** The message's key and priority (mailbox migration 14; absent before). */
  readonly key?: string | null | undefined
  readonly priority?: number | string | null | undefined
}

/** The dead-letter table of `store`, timed by `clock`. */
export const make = (store: Store, clock: Clock.Clock): DeadLetters => {
  const { sql } = store
  const placed = (row: DeadLetterRow) => row.key != null || Number(row.priority ?? 0) !== 0
  // The letters back in their queues (a redriven message is new: its own seq), keyed ones with their key.
  const redriven = (gone: ReadonlyArray<DeadLetterRow>, at: ReturnType<ReturnType<typeof statements>["at"]>) =>
    gone.some(placed)
      ? Effect.zipRight(
        Effect.forEach(
          [...new Set(gone.filter(placed).map((row) => row.queue))],
          (queue) =>
            Keys.prepareSend(
              store,
              queue,
              gone.filter((row) => row.queue === queue && row.key != null).map((row) => row.key!)
            ),
          { discard: true }
        ),
        sql`INSERT INTO ${
          sql(store.messages)
        } (queue, body, visible_at, enqueued_at, reply_to, traceparent, key, priority) VALUES ${
          sql.csv(gone.map((row) =>
            sql`(${row.queue}, ${row.body}, ${at}, ${Number(row.enqueued_at)}, ${row.reply_to}, ${
              row.traceparent ?? null
            }, ${row.key ?? null}, ${Number(row.priority ?? 0)})`
          ))
        }`
      )
      : sql`INSERT INTO ${sql(store.messages)} (queue, body, visible_at, enqueued_at, reply_to, traceparent) VALUES ${
        sql.csv(gone.map((row) =>
          sql`(${row.queue}, ${row.body}, ${at}, ${Number(row.enqueued_at)}, ${row.reply_to}, ${
            row.traceparent ?? null
          })`
        ))
      }`
  const table = sql(store.deadLetters)
  const withStore = connectionError(store.deadLetters)
  const where = (selection: Selection | undefined) => {
    const conditions = [
      ...(selection?.queue === undefined ? [] : [sql`queue = ${selection.queue}`]),
      ...(selection?.ids === undefined ? [] : [sql.in("id", selection.ids)]),
      ...(selection?.deadLetteredAt === undefined ?
        [] :
        [StoredTime.still(sql, "dead_lettered_at", selection.deadLetteredAt)])
    ]
    return conditions.length === 0 ? sql`` : sql`WHERE ${sql.and(conditions)}`
  }
  // Nothing to select: no ids, or a queue name or id no message can have (the name rule: a NUL would be a
  // failed statement on PostgreSQL, a lone surrogate would match U+FFFD's letters there).
  // A dead letter's journal goes with it (redriven or deleted), in the same transaction; a database before
  // mailbox migration 11 has no journal table.
  const journalsPresent = Journal.present(store)
  const dropJournals = (journals: boolean, gone: ReadonlyArray<{ readonly id: string }>) =>
    journals ? Journal.dropLetters(store, gone.map((row) => row.id)) : Effect.void
  const empty = (selection: Selection | undefined) =>
    (selection?.ids !== undefined &&
      (selection.ids.length === 0 || selection.ids.some((id) => nameProblem(id) !== undefined))) ||
    (selection?.queue !== undefined && nameProblem(selection.queue) !== undefined)

  return {
    list: (selection) =>
      Either.match(checkLimit(selection?.limit), {
        onLeft: (invalid): Effect.Effect<ReadonlyArray<StoredDeadLetter>, InvalidParameterError> =>
          Effect.fail(invalid),
        onRight: () =>
          empty(selection) ? Effect.succeed([]) : sql<DeadLetterRow>`SELECT * FROM ${table} ${where(selection)}
            ORDER BY dead_lettered_at, id LIMIT ${selection?.limit ?? 100}`.pipe(
            Effect.map((rows) =>
              rows.map((row): StoredDeadLetter => ({
                id: row.id,
                queue: row.queue,
                body: row.body,
                replyTo: row.reply_to ?? undefined,
                deliveryCount: Number(row.delivery_count),
                enqueuedAt: StoredTime.decode(row.enqueued_at),
                deadLetteredAt: StoredTime.decode(row.dead_lettered_at),
                errorTag: row.error_tag,
                error: row.error
              }))
            ),
            withStore
          )
      }),
    count: (selection) =>
      empty(selection) ?
        Effect.succeed(0) :
        sql<{ n: number | string }>`SELECT count(*) AS n FROM ${table} ${where(selection)}`.pipe(
          Effect.map((rows) => Number(rows[0]?.n ?? 0)),
          withStore
        ),
    redrive: (selection) =>
      // A letter with a key or a priority goes back with them, its queue scheduled first (keys.ts).
      empty(selection) ? Effect.succeed(0) : Effect.suspend(() => {
        const at = statements(store).at(nowOf(clock)())
        // Delete first (on SQLite the first statement takes the write lock), then re-insert what was deleted,
        // visible from now on the database's clock. The redriven message is new (its own seq, run afresh): the
        // letters' journals go in the same transaction.
        return Effect.flatMap(journalsPresent, (journals) =>
          Sql.writeTransaction(sql)(
            Effect.flatMap(
              sql<DeadLetterRow>`DELETE FROM ${table} ${where(selection)} RETURNING *`,
              (gone) =>
                gone.length === 0 ? Effect.succeed(gone) : Effect.as(
                  Effect.zipRight(
                    redriven(gone, at),
                    dropJournals(journals, gone)
                  ),
                  gone
                )
            )
          )).pipe(Effect.tap((gone) => Effect.sync(() => gone.forEach((row) => store.wake(row.queue)))))
      }).pipe(Effect.map((gone) => gone.length), withStore),
    purge: (selection) =>
      empty(selection) ? Effect.succeed(0) : Effect.flatMap(journalsPresent, (journals) =>
        Sql.writeTransaction(sql)(
          Effect.tap(
            sql<{ id: string }>`DELETE FROM ${table} ${where(selection)} RETURNING id`,
            (gone) => dropJournals(journals, gone)
          )
        )).pipe(Effect.map((rows) => rows.length), withStore),
    sink: (schema) => {
      const encode = encoderOf(schema, maxBodyBytesLimit)
      return {
        name: store.deadLetters,
        send: (letter) =>
          Either.match(encode(letter.body), {
            onLeft: (reason) =>
              Effect.fail(
                new SerializationError({ mailbox: store.deadLetters, messageId: letter.messageId, reason })
              ),
            // Sent by a worker in the span it handled the message in: a redrive continues that trace.
            onRight: (body) =>
              currentTraceparent((traceparent) => // A keyed letter keeps its key and priority (migration 14's columns; a plain one writes as before).
              {
                const placed = letter.key !== undefined || (letter.priority ?? 0) !== 0
                return sql`INSERT INTO ${table} (id, queue, body, reply_to, delivery_count, enqueued_at,
                    dead_lettered_at, error_tag, error, traceparent${placed ? sql`, key, priority` : sql``})
                  VALUES (${letter.messageId}, ${letter.sourceMailbox}, ${body}, ${letter.replyTo ?? null},
                    ${letter.deliveryCount}, ${DateTime.toEpochMillis(letter.enqueuedAt)},
                    ${DateTime.toEpochMillis(letter.deadLetteredAt)}, ${storableText(letter.lastErrorTag, 200)},
                    ${storableText(letter.lastError, maxErrorLength)},
                    ${traceparent ?? null}${placed ? sql`, ${letter.key ?? null}, ${letter.priority ?? 0}` : sql``})
                  ON CONFLICT (id) DO UPDATE SET delivery_count = excluded.delivery_count,
                    dead_lettered_at = excluded.dead_lettered_at, error_tag = excluded.error_tag,
                    error = excluded.error, traceparent = excluded.traceparent`
              }).pipe(Effect.as(letter.messageId), withStore)
          })
      }
    }
  }
}
