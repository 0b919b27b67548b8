/**
 * What every `leasehold mailbox …` command shares: the common options (`--db`, `--json`, `--prefix`), the
 * operator's views of the database (MailboxSqlAdmin, loaded only when a command runs, so `--help` does not load
 * the SQL mailbox), and the not-found check for a queue a command names.
 */
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import * as StoredTime from "../internal/storedTime.js"
import type * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import { db, json, prefix, withDatabase } from "./database.js"
import { ago } from "./table.js"

/** A queue or dead letter the command names is not in the database (exit 1). */
export class NotFoundError extends Schema.TaggedError<NotFoundError>()("NotFoundError", { message: Schema.String }) {}

export const common = { db, json, prefix }
export const iso = (time: DateTime.Utc) => StoredTime.json(time)
export const since = (time: DateTime.Utc, now: number) =>
  StoredTime.isValid(time) ? ago(DateTime.toEpochMillis(time), now) : "invalid time"
export const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`

export type Common = { readonly db: Option.Option<string>; readonly prefix: string }

/** Loaded when a command runs, so that `--help` does not load the SQL mailbox. */
export const admin = Effect.promise(() => import("../MailboxSqlAdmin.js"))

/** The operator's views of the database's queues and dead letters. */
export interface Mailbox {
  readonly queues: MailboxSqlAdmin.Queues
  readonly letters: MailboxSqlAdmin.DeadLetters
  readonly prefix: string
}

export const onMailbox = <A, E>(options: Common, body: (mailbox: Mailbox) => Effect.Effect<A, E>) =>
  admin.pipe(
    Effect.flatMap((MailboxSqlAdmin) => {
      const open = { prefix: options.prefix, create: false }
      return Effect.zipWith(
        MailboxSqlAdmin.queues(open),
        MailboxSqlAdmin.deadLetters(open),
        (queues, letters): Mailbox => ({ queues, letters, prefix: options.prefix })
      )
    }),
    Effect.flatMap(body),
    withDatabase(Option.getOrUndefined(options.db))
  )

/** How many queue names a not-found message lists. */
const namesShown = 10

/**
 * Fails `NotFoundError` unless `queue` holds messages or dead letters (a queue has no row of its own); a name no
 * queue can have is an `InvalidParameterError`, as `peek` says.
 */
export const existing = (mailbox: Mailbox, queue: string) =>
  Effect.gen(function*() {
    if ((yield* mailbox.queues.peek(queue, { limit: 1 })).length > 0) return
    if ((yield* mailbox.letters.count({ queue })) > 0) return
    const names = (yield* mailbox.queues.stats).map((stats) => stats.queue)
    const known = names.length === 0
      ? "it holds no queue at all"
      : `its queues: ${names.slice(0, namesShown).map((name) => JSON.stringify(name)).join(", ")}${
        names.length > namesShown ? `, and ${names.length - namesShown} more` : ""
      }`
    return yield* new NotFoundError({
      message: `no queue ${JSON.stringify(queue)} with prefix "${mailbox.prefix}" in this database (no message nor ` +
        `dead letter is stored under that name); ${known}`
    })
  })
