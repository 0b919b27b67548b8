/**
 * MailboxSqlAdmin: the operator's view of the SQL mailboxes (what the
 * `leasehold mailbox` and `queue` commands use) — the queues with their
 * counts and a peek at their messages, the queues table (pause, resume,
 * drop), and the dead-letter table: list, count, redrive, purge — the
 * worker processes with their loops (`workers`: which are alive, what each
 * loop holds, how old its heartbeat is) — and `browse`, a queue's messages
 * page by page (queued, delayed, in flight, dead-lettered; cursor-paged,
 * filtered by id or body text, each page bounded) and one message whole.
 *
 * With `create: false` nothing is ever created or altered: a database or a
 * prefix without the mailbox tables is a `TablesNotFoundError` naming them.
 * A stored body that is not JSON is shown raw, never a failure.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as DeadLetter from "./DeadLetter.js"
import { TablesNotFoundError } from "./Errors.js"
import * as Browse from "./internal/mailbox/admin/browse.js"
import type { MessageDetail, MessagePage, MessageQuery, MessageState } from "./internal/mailbox/admin/browseModel.js"
import * as DeadLetterTable from "./internal/mailbox/admin/deadLetters.js"
import type * as JournalModel from "./internal/mailbox/admin/journalModel.js"
import { matchLimit, stepLimit } from "./internal/mailbox/admin/journalModel.js"
import * as JournalView from "./internal/mailbox/admin/journalView.js"
import type { WorkerProcess, WorkersOptions } from "./internal/mailbox/admin/workersModel.js"
import * as Scheduling from "./internal/mailbox/scheduling.js"
import * as Journal from "./internal/mailbox/sql/journal.js"
import * as Keys from "./internal/mailbox/sql/keys.js"
import * as QueueTable from "./internal/mailbox/sql/queues.js"
import { openExisting, prepare } from "./internal/mailbox/sql/schema.js"
import { nowOf, statements } from "./internal/mailbox/sql/statements.js"
import { connectionError, type Row } from "./internal/mailbox/sql/store.js"
import * as WorkersTable from "./internal/mailbox/sql/workers.js"
import { nameProblem } from "./internal/names.js"
import * as Options_ from "./internal/options.js"
import * as Sql from "./internal/sql/common.js"
import * as StoredTime from "./internal/storedTime.js"
import { InvalidParameterError, MailboxConnectionError, SerializationError } from "./Mailbox.js"

/**
 * A row of the dead-letter table; `body` is the stored (encoded) body, which may not decode.
 *
 * @category models
 */
export interface StoredDeadLetter {
  readonly id: string
  readonly queue: string
  readonly body: string
  readonly replyTo: string | undefined
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  readonly deadLetteredAt: DateTime.Utc
  readonly errorTag: string
  readonly error: string
}

/**
 * Which dead letters an operation applies to: all, one source queue, and/or some ids.
 *
 * @category models
 */
export interface Selection {
  readonly queue?: string | undefined
  readonly ids?: ReadonlyArray<string> | undefined
  /**
   * Only letters dead-lettered at this time (as read: a time `list` gave): with `ids`, the letters shown, not
   * others stored under the same ids since.
   */
  readonly deadLetteredAt?: DateTime.Utc | undefined
}

/**
 * Operations on the dead-letter table (used by the command line).
 *
 * @category models
 */
export interface DeadLetters {
  /** Oldest first; at most `limit` (default 100). */
  readonly list: (
    selection?: Selection & { readonly limit?: number | undefined }
  ) => Effect.Effect<ReadonlyArray<StoredDeadLetter>, MailboxConnectionError | InvalidParameterError>
  readonly count: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /** Moves dead letters back to their source queue as new messages (delivery count 0); returns how many. */
  readonly redrive: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /** Deletes dead letters; returns how many. */
  readonly purge: (selection?: Selection) => Effect.Effect<number, MailboxConnectionError>
  /**
   * Where a `MainLoop` dead-letters requests (its `deadLetters.mailbox`): the
   * letter's body is stored encoded with `schema`, keyed by its message id.
   */
  readonly sink: <A, I>(schema: Schema.Schema<A, I, never>) => {
    readonly name: string
    readonly send: (
      letter: DeadLetter.DeadLetter<A>
    ) => Effect.Effect<string, SerializationError | MailboxConnectionError>
  }
}

/**
 * Options of `deadLetters` and `queues`.
 *
 * @category models
 */
export interface Options {
  readonly prefix?: string | undefined
  /** false: open existing tables only, writing nothing (`TablesNotFoundError` without them); default true. */
  readonly create?: boolean | undefined
}

/**
 * Why the operator's view could not be opened: a bad prefix, an unreachable database, no such tables.
 *
 * @category errors
 */
export type OpenError = ParseResult.ParseError | MailboxConnectionError | TablesNotFoundError

const decodeOptions = Options_.decoder("MailboxSqlAdmin", {
  prefix: Sql.Prefix,
  create: Schema.optionalWith(Schema.Boolean, { exact: true, default: () => true })
})

/** The store of the options' prefix: its tables created if needed, or (`create: false`) only looked for. */
const open = (options: Options | undefined) =>
  Effect.flatMap(
    decodeOptions(options),
    ({ create, prefix }) => create ? prepare(prefix) : openExisting(prefix)
  )

/**
 * The dead-letter table of a database and prefix, creating the tables if needed.
 *
 * @category constructors
 */
export const deadLetters = (options?: Options): Effect.Effect<DeadLetters, OpenError, SqlClient.SqlClient> =>
  Effect.zipWith(open(options), Effect.clock, DeadLetterTable.make)

/**
 * One queue of a database, as operators see it.
 *
 * @category models
 */
export interface QueueStats {
  readonly queue: string
  /** Visible now: the next receive can take them. */
  readonly queued: number
  /** Received and not yet settled (invisible until their visibility timeout). */
  readonly inFlight: number
  /** Sent with a delay or nacked with a retry delay, not visible yet. */
  readonly delayed: number
  readonly oldestEnqueuedAt: Option.Option<DateTime.Utc>
  readonly maxDeliveryCount: number
  readonly deadLetters: number
}

/**
 * A stored message, read without receiving it; the body is its stored (encoded) JSON.
 *
 * @category models
 */
export interface PeekedMessage {
  readonly id: string
  readonly body: string
  readonly state: "queued" | "in flight" | "delayed"
  readonly visibleAt: DateTime.Utc
  readonly deliveryCount: number
  readonly enqueuedAt: DateTime.Utc
  readonly replyTo: Option.Option<string>
}

/**
 * Operations on every queue of a database and prefix (used by the command line).
 *
 * @category models
 */
export interface Queues {
  /** Every queue that has messages or dead letters. */
  readonly stats: Effect.Effect<ReadonlyArray<QueueStats>, MailboxConnectionError>
  /** The next messages of `queue` in delivery order (visible first), changing nothing. */
  readonly peek: (
    queue: string,
    options?: { readonly limit?: number | undefined }
  ) => Effect.Effect<ReadonlyArray<PeekedMessage>, MailboxConnectionError | InvalidParameterError>
  /** Deletes every message of `queue`, in flight or not; returns how many. */
  readonly purge: (queue: string) => Effect.Effect<number, MailboxConnectionError>
  /**
   * The queues recorded in the queues table (mailbox migration 10: a queue is recorded when first sent to and
   * stays until dropped, empty or not), by name; none on a database before that migration.
   */
  readonly recorded: Effect.Effect<ReadonlyArray<RecordedQueue>, MailboxConnectionError>
  /**
   * Pauses `queue` (recording it if it was not): its receivers, in every process, get nothing until `resume`;
   * sends and the settling of deliveries already received go on.
   */
  readonly pause: (queue: string) => Effect.Effect<void, QueueAdminError>
  /** Resumes `queue`: its receivers take messages again (on PostgreSQL they are woken at once). */
  readonly resume: (queue: string) => Effect.Effect<void, QueueAdminError>
  /**
   * Removes `queue` from the queues table if it has no messages: "dropped", "not empty" (nothing changed), or
   * "unknown" (not recorded). A queue with dead letters stays listed while they last.
   */
  readonly drop: (queue: string) => Effect.Effect<"dropped" | "not empty" | "unknown", QueueAdminError>
  /**
   * Sets a key's settings in `queue` — its concurrency limit, weight, start rate and token budget (see
   * docs/mailboxes.md) — or, with `key` undefined, the queue's defaults for keys without their own. A field
   * given as `null` is cleared, an absent one left as it was. Checked first (`InvalidParameterError` naming the
   * field); stored in the database, so every process's next claim follows it.
   */
  readonly setKeySettings: (
    queue: string,
    key: string | undefined,
    settings: Scheduling.KeySettings
  ) => Effect.Effect<void, QueueAdminError>
  /** The keys of `queue` with unsettled messages (at most 10,000, most pending first), with their state. */
  readonly keys: (queue: string) => Effect.Effect<ReadonlyArray<Scheduling.KeyState>, QueueAdminError>
}

/**
 * A queue of the queues table.
 *
 * @category models
 */
export interface RecordedQueue {
  readonly queue: string
  readonly createdAt: DateTime.Utc
  readonly paused: boolean
}

/**
 * Why pausing, resuming or dropping a queue failed: the database, a bad name, or a database before mailbox
 * migration 10 (no queues table: `leasehold migrate` adds it).
 *
 * @category errors
 */
export type QueueAdminError = MailboxConnectionError | InvalidParameterError | TablesNotFoundError

/**
 * The queues of a database and prefix, creating the tables if needed.
 *
 * @category constructors
 */
export const queues = (options?: Options): Effect.Effect<Queues, OpenError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const store = yield* open(options)
    const { sql } = store
    const messages = sql(store.messages)
    const letters = sql(store.deadLetters)
    const clock = yield* Effect.clock
    const withStore = connectionError(store.messages)
    const statements_ = statements(store)
    /** Runs `work` on the queues table: a valid name, and the table there. */
    const onQueueTable = <A>(queue: string, work: Effect.Effect<A, SqlError>): Effect.Effect<A, QueueAdminError> =>
      Effect.suspend(() => {
        const problem = nameProblem(queue)
        if (problem !== undefined) {
          return Effect.fail(new InvalidParameterError({ parameter: "queue", value: queue, reason: problem }))
        }
        return Effect.flatMap(
          withStore(QueueTable.present(store)),
          (present): Effect.Effect<A, QueueAdminError> =>
            present
              ? withStore(work)
              : Effect.fail(
                new TablesNotFoundError({
                  what: "mailbox queues table (mailbox migration 10; leasehold migrate adds it)",
                  prefix: store.prefix,
                  missing: [QueueTable.tableOf(store.prefix)]
                })
              )
        )
      })
    /** Runs `work` on the keys table (mailbox migration 14): a valid queue name, and the table there. */
    const onKeysTable = <A>(queue: string, work: Effect.Effect<A, SqlError>): Effect.Effect<A, QueueAdminError> =>
      Effect.flatMap(
        withStore(Sql.missingTables(sql, [Keys.keysTable(store.prefix)])),
        (missing): Effect.Effect<A, QueueAdminError> =>
          missing.length === 0 ? onQueueTable(queue, work) : Effect.fail(
            new TablesNotFoundError({
              what: "mailbox keys table (mailbox migration 14; leasehold migrate adds it)",
              prefix: store.prefix,
              missing
            })
          )
      )
    return {
      setKeySettings: (queue, key, settings) =>
        Effect.suspend(() => {
          if (key !== undefined) {
            const checked = Scheduling.validateKey(key)
            if (Either.isLeft(checked)) return Effect.fail(checked.left)
          }
          const stored = Scheduling.validateSettings(settings)
          if (Either.isLeft(stored)) return Effect.fail(stored.left)
          return onKeysTable(queue, Keys.setSettings(store, queue, key, stored.right))
        }),
      keys: (queue) => onKeysTable(queue, Keys.list(store, queue, statements_.at(nowOf(clock)()))),
      stats: Effect.suspend(() => {
        const now = statements_.at(nowOf(clock)())
        return Effect.zipWith(
          sql<{
            queue: string
            queued: number | string
            in_flight: number | string
            delayed: number | string
            oldest: number | string | null
            max_delivery: number | string | null
          }>`SELECT queue,
              SUM(CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END) AS queued,
              SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NOT NULL THEN 1 ELSE 0 END) AS in_flight,
              SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NULL THEN 1 ELSE 0 END) AS delayed,
              MIN(enqueued_at) AS oldest, MAX(delivery_count) AS max_delivery
            FROM ${messages} GROUP BY queue`,
          sql<{ queue: string; n: number | string }>`SELECT queue, count(*) AS n FROM ${letters} GROUP BY queue`,
          (rows, dead) => {
            const names = [...new Set([...rows.map((row) => row.queue), ...dead.map((row) => row.queue)])].sort()
            return names.map((queue): QueueStats => {
              const row = rows.find((r) => r.queue === queue)
              return {
                queue,
                queued: Number(row?.queued ?? 0),
                inFlight: Number(row?.in_flight ?? 0),
                delayed: Number(row?.delayed ?? 0),
                oldestEnqueuedAt: row?.oldest === null || row?.oldest === undefined
                  ? Option.none()
                  : Option.some(StoredTime.decode(row.oldest)),
                maxDeliveryCount: Number(row?.max_delivery ?? 0),
                deadLetters: Number(dead.find((r) => r.queue === queue)?.n ?? 0)
              }
            })
          }
        ).pipe(withStore)
      }),
      peek: (queue, peekOptions) =>
        Effect.suspend(
          (): Effect.Effect<ReadonlyArray<PeekedMessage>, MailboxConnectionError | InvalidParameterError> => {
            const limit = DeadLetterTable.checkLimit(peekOptions?.limit)
            if (Either.isLeft(limit)) return Effect.fail(limit.left)
            const problem = nameProblem(queue)
            if (problem !== undefined) {
              return Effect.fail(new InvalidParameterError({ parameter: "queue", value: queue, reason: problem }))
            }
            const now = statements_.at(nowOf(clock)())
            return sql<Row & { visible_at: number | string; visible: number | boolean }>`SELECT seq, body,
              receipt_handle, delivery_count, enqueued_at, reply_to, visible_at,
              CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END AS visible
            FROM ${messages} WHERE queue = ${queue} ORDER BY visible_at, seq LIMIT ${peekOptions?.limit ?? 10}`.pipe(
              Effect.map((rows) =>
                rows.map((row): PeekedMessage => ({
                  id: String(row.seq),
                  body: row.body,
                  state: Number(row.visible) === 1 ? "queued" : row.receipt_handle === null ? "delayed" : "in flight",
                  visibleAt: StoredTime.decode(row.visible_at),
                  deliveryCount: Number(row.delivery_count),
                  enqueuedAt: StoredTime.decode(row.enqueued_at),
                  replyTo: Option.fromNullable(row.reply_to)
                }))
              ),
              withStore
            )
          }
        ),
      purge: (queue) =>
        nameProblem(queue) === undefined
          ? withStore(Effect.flatMap(Journal.present(store), (journals) => statements_.purge(queue, journals)))
          : Effect.succeed(0),
      recorded: Effect.flatMap(QueueTable.present(store), (present) =>
        present
          ? Effect.map(QueueTable.list(store), (rows) =>
            rows.map((row): RecordedQueue => ({
              queue: row.name,
              createdAt: StoredTime.decode(row.createdAt),
              paused: row.paused
            })))
          : Effect.succeed([])).pipe(withStore),
      pause: (queue) => onQueueTable(queue, QueueTable.setPaused(store, queue, true)),
      resume: (queue) => onQueueTable(queue, QueueTable.setPaused(store, queue, false)),
      drop: (queue) => onQueueTable(queue, QueueTable.drop(store, queue))
    }
  })

export type {
  MessageDetail,
  MessagePage,
  MessageQuery,
  MessageRow,
  MessageState
} from "./internal/mailbox/admin/browseModel.js"

/**
 * The states, in the order the console shows them.
 *
 * @category models
 */
export const messageStates: ReadonlyArray<MessageState> = Browse.states

/**
 * How many rows of a queue a body-text search looks at per page (`MessagePage.searchCut`).
 *
 * @category models
 */
export const searchScanLimit: number = Browse.scanLimit

/**
 * A look into the queues, message by message (used by the console's browse and message pages).
 *
 * @category models
 */
export interface Browser {
  /** A page of `query.queue`'s messages in `query.state`, keyset-paged (see `MessageQuery`). */
  readonly messages: (query: MessageQuery) => Effect.Effect<MessagePage, MailboxConnectionError | InvalidParameterError>
  /** The message `id` of `queue` (queued, delayed or in flight), if it is there. */
  readonly message: (queue: string, id: string) => Effect.Effect<Option.Option<MessageDetail>, MailboxConnectionError>
  /** The dead letter `id` of `queue`, if it is there. */
  readonly deadLetter: (
    queue: string,
    id: string
  ) => Effect.Effect<Option.Option<MessageDetail>, MailboxConnectionError>
  /**
   * Deletes a message of `queue` no receiver holds now; whether it did. With `shown`, only while the message
   * was enqueued at `shown.enqueuedAt` (as `messages`/`message` gave it): an id used again names another.
   */
  readonly remove: (
    queue: string,
    id: string,
    shown?: { readonly enqueuedAt: DateTime.Utc }
  ) => Effect.Effect<boolean, MailboxConnectionError>
}

/**
 * The messages of a database and prefix, message by message, creating the tables if needed. Every page is
 * bounded: at most 100 rows with previews of bodies and errors; a text search looks at 2,000 rows of the queue
 * (the first 64 Ki characters of each body) per page; on PostgreSQL each read has a 5 s statement timeout.
 *
 * @category constructors
 */
export const browse = (options?: Options): Effect.Effect<Browser, OpenError, SqlClient.SqlClient> =>
  Effect.flatMap(open(options), (store) => Effect.map(Effect.clock, (clock) => Browse.make(store, clock)))

export type { WorkerLoop, WorkerProcess, WorkersOptions } from "./internal/mailbox/admin/workersModel.js"

/**
 * The worker processes of a database and prefix (used by `leasehold workers` and the console).
 *
 * @category models
 */
export interface Workers {
  /** Every process that has a row, by id: those gone recently too (`lost`), none that exited gracefully. */
  readonly list: (
    options?: WorkersOptions
  ) => Effect.Effect<ReadonlyArray<WorkerProcess>, MailboxConnectionError | InvalidParameterError>
}

/**
 * The workers table of a database and prefix, creating the tables if needed; with `create: false`, a database
 * whose mailbox tables predate it (migration 9) is a `TablesNotFoundError` naming it.
 *
 * @category constructors
 */
export const workers = (options?: Options): Effect.Effect<Workers, OpenError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const store = yield* open(options)
    const table = WorkersTable.workersTable(store.prefix)
    const missing = yield* Sql.missingTables(store.sql, [table]).pipe(connectionError(table))
    if (missing.length > 0) {
      return yield* new TablesNotFoundError({
        what: "workers table (run leasehold migrate)",
        prefix: store.prefix,
        missing
      })
    }
    return { list: (listOptions) => connectionError(table)(WorkersTable.listProcesses(store, listOptions)) }
  })

export type {
  JournalLookup,
  JournalMatch,
  JournalReadBound,
  JournalReadOptions,
  Journals,
  JournalStep,
  JournalView
} from "./internal/mailbox/admin/journalModel.js"
export {
  /**
   * An id names more than one journal: nothing was read or discarded (see `JournalLookup`).
   *
   * @category errors
   */
  JournalAmbiguousError
} from "./internal/mailbox/admin/journalModel.js"

/**
 * The most journals `journals().matches` lists.
 *
 * @category models
 */
export const journalMatchLimit: number = matchLimit

/**
 * The most steps `journals().read` returns (`JournalView.truncated` says when a journal has more).
 *
 * @category models
 */
export const journalStepLimit: number = stepLimit

/**
 * The step journals of agent runs (mailbox migrations 11 and 12): read one by message id or request id (a request
 * id that several journals carry, in one queue or several, is refused with `JournalAmbiguousError` listing them:
 * name the queue or the message id), list the journals an id names, or discard one.
 * With `create: false`, a database before that migration is a `TablesNotFoundError` naming it.
 *
 * @category constructors
 */
export const journals = (options?: Options): Effect.Effect<JournalModel.Journals, OpenError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const store = yield* open(options)
    const withStore = connectionError(store.journal)
    // Migration 12 made the identity table with the columns lookups use: a database before it is told so.
    const needed = [store.journal, Journal.identityTable(store.prefix)]
    const missing = yield* withStore(Sql.missingTables(store.sql, needed))
    if (missing.length > 0) {
      return yield* new TablesNotFoundError({
        what: "mailbox journal tables (mailbox migrations 11 and 12; leasehold migrate adds them)",
        prefix: store.prefix,
        missing
      })
    }
    return {
      read: (id, options) => withStore(JournalView.read(store, id, options)),
      discard: (id, lookup) => withStore(JournalView.discard(store, id, lookup)),
      matches: (id, lookup) => withStore(JournalView.matches(store, id, lookup))
    }
  })
