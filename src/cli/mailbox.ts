/**
 * `leasehold mailbox …`: look into a durable mailbox database from the shell
 * — `stats` (every queue: queued, in flight, delayed, dead letters), `peek`
 * (the next messages, not received), `dlq list`, `dlq redrive` (back to the
 * source queue) and `purge` (with `--yes`).
 */
import * as Args from "@effect/cli/Args"
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import { db, json, limit as limitOption, prefix, withDatabase } from "./database.js"
import { ago, table } from "./table.js"

/** A destructive command run without `--yes`: a usage error. */
export class ConfirmationRequiredError extends Error {
  readonly _tag = "ConfirmationRequiredError"
}

const common = { db, json, prefix }
const iso = (time: DateTime.Utc) => DateTime.formatIso(time)
const since = (time: DateTime.Utc, now: number) => ago(DateTime.toEpochMillis(time), now)
const print = (asJson: boolean, value: unknown, text: () => string) =>
  Console.log(asJson ? JSON.stringify(value, null, 2) : text())

type Common = { readonly db: Option.Option<string>; readonly prefix: string }

/** Loaded when a command runs, so that `--help` does not load the SQL mailbox. */
const admin = Effect.promise(() => import("../MailboxSqlAdmin.js"))

const onQueues = <A, E>(options: Common, body: (queues: MailboxSqlAdmin.Queues) => Effect.Effect<A, E>) =>
  admin.pipe(
    Effect.flatMap((MailboxSqlAdmin) => MailboxSqlAdmin.queues({ prefix: options.prefix, create: false })),
    Effect.flatMap(body),
    withDatabase(Option.getOrUndefined(options.db))
  )

const onDeadLetters = <A, E>(options: Common, body: (letters: MailboxSqlAdmin.DeadLetters) => Effect.Effect<A, E>) =>
  admin.pipe(
    Effect.flatMap((MailboxSqlAdmin) => MailboxSqlAdmin.deadLetters({ prefix: options.prefix, create: false })),
    Effect.flatMap(body),
    withDatabase(Option.getOrUndefined(options.db))
  )

const stats = Command.make("stats", common, (options) =>
  onQueues(options, (queues) =>
    Effect.gen(function*() {
      const all = yield* queues.stats
      const now = yield* Clock.currentTimeMillis
      yield* print(
        options.json,
        all.map((queue) => ({ ...queue, oldestEnqueuedAt: Option.getOrNull(Option.map(queue.oldestEnqueuedAt, iso)) })),
        () =>
          all.length === 0 ? "no queues" : table(
            ["queue", "queued", "in flight", "delayed", "dead letters", "oldest", "max deliveries"],
            all.map((queue) => [
              queue.queue,
              String(queue.queued),
              String(queue.inFlight),
              String(queue.delayed),
              String(queue.deadLetters),
              Option.match(queue.oldestEnqueuedAt, { onNone: () => "-", onSome: (at) => since(at, now) }),
              String(queue.maxDeliveryCount)
            ])
          )
      )
    }))).pipe(
    Command.withDescription(
      "Every queue of the database: queued, in flight, delayed, dead letters.\n" +
        "Example: leasehold mailbox stats --db ./.leasehold/demo.db"
    )
  )

const limit = limitOption("At most this many").pipe(Options.withDefault(10))

/** A stored body for `--json`: its JSON, or — stored by something else, or damaged — the raw text as it is. */
const storedBody = (text: string): { readonly body: unknown; readonly bodyIsJson: boolean } => {
  try {
    return { body: JSON.parse(text) as unknown, bodyIsJson: true }
  } catch {
    return { body: text, bodyIsJson: false }
  }
}

const peek = Command.make(
  "peek",
  { ...common, queue: Args.text({ name: "queue" }), limit },
  (options) =>
    onQueues(options, (queues) =>
      Effect.gen(function*() {
        const messages = yield* queues.peek(options.queue, { limit: options.limit })
        const now = yield* Clock.currentTimeMillis
        yield* print(
          options.json,
          messages.map((message) => ({
            ...message,
            ...storedBody(message.body),
            visibleAt: iso(message.visibleAt),
            enqueuedAt: iso(message.enqueuedAt),
            replyTo: Option.getOrNull(message.replyTo)
          })),
          () =>
            messages.length === 0 ? `no messages in ${options.queue}` : table(
              ["id", "state", "deliveries", "enqueued", "reply to", "body"],
              messages.map((message) => [
                message.id,
                message.state,
                String(message.deliveryCount),
                since(message.enqueuedAt, now),
                Option.getOrElse(message.replyTo, () => "-"),
                message.body.length > 60 ? `${message.body.slice(0, 57)}...` : message.body
              ])
            )
        )
      }))
).pipe(
  Command.withDescription(
    "The next messages of a queue in delivery order, without receiving them.\n" +
      "Example: leasehold mailbox peek requests --db ./.leasehold/demo.db --limit 5"
  )
)

const queueOption = Options.text("queue").pipe(
  Options.withDescription("Only dead letters from this source queue."),
  Options.optional
)

const dlqList = Command.make(
  "list",
  { ...common, queue: queueOption, limit },
  (options) =>
    onDeadLetters(options, (letters) =>
      Effect.gen(function*() {
        const all = yield* letters.list({ queue: Option.getOrUndefined(options.queue), limit: options.limit })
        const now = yield* Clock.currentTimeMillis
        yield* print(
          options.json,
          all.map((letter) => ({
            ...letter,
            enqueuedAt: iso(letter.enqueuedAt),
            deadLetteredAt: iso(letter.deadLetteredAt)
          })),
          () =>
            all.length === 0 ? "no dead letters" : table(
              ["id", "queue", "deliveries", "dead-lettered", "error"],
              all.map((letter) => [
                letter.id,
                letter.queue,
                String(letter.deliveryCount),
                since(letter.deadLetteredAt, now),
                `${letter.errorTag}: ${letter.error.split("\n")[0]!.slice(0, 60)}`
              ])
            )
        )
      }))
).pipe(
  Command.withDescription(
    "Dead letters, oldest first, with the error that put them there.\n" +
      "Example: leasehold mailbox dlq list --db ./.leasehold/demo.db --queue requests"
  )
)

const ids = Options.text("id").pipe(Options.withDescription("Only this dead letter (repeatable)."), Options.repeated)

const dlqRedrive = Command.make(
  "redrive",
  { ...common, queue: queueOption, id: ids },
  (options) =>
    onDeadLetters(options, (letters) =>
      Effect.flatMap(
        letters.redrive({
          queue: Option.getOrUndefined(options.queue),
          ids: options.id.length === 0 ? undefined : options.id
        }),
        (moved) =>
          print(options.json, { redriven: moved }, () => `moved ${moved} dead letter(s) back to their source queue`)
      ))
).pipe(
  Command.withDescription(
    "Moves dead letters back to their source queue as new messages.\n" +
      "Example: leasehold mailbox dlq redrive --db ./.leasehold/demo.db --queue requests"
  )
)

const dlq = Command.make("dlq").pipe(
  Command.withDescription("The dead-letter table: list and redrive."),
  Command.withSubcommands([dlqList, dlqRedrive])
)

const yes = Options.boolean("yes").pipe(Options.withDescription("Really delete."))

const purge = Command.make(
  "purge",
  { ...common, queue: Args.text({ name: "queue" }), yes },
  (options) =>
    onQueues(options, (queues) =>
      Effect.gen(function*() {
        if (!options.yes) {
          const stats = (yield* queues.stats).find((queue) => queue.queue === options.queue)
          const count = stats === undefined ? 0 : stats.queued + stats.inFlight + stats.delayed
          return yield* Effect.fail(
            new ConfirmationRequiredError(
              `purge would delete ${count} message(s) of "${options.queue}", in flight ones included; add --yes`
            )
          )
        }
        const deleted = yield* queues.purge(options.queue)
        yield* print(options.json, { deleted }, () => `deleted ${deleted} message(s) from ${options.queue}`)
      }))
).pipe(
  Command.withDescription(
    "Deletes every message of a queue (in flight ones too). Needs --yes.\n" +
      "Example: leasehold mailbox purge requests --db ./.leasehold/demo.db --yes"
  )
)

/** `leasehold mailbox`. */
export const command = Command.make("mailbox").pipe(
  Command.withDescription("Inspect durable mailboxes (SQLite file or PostgreSQL): stats, peek, dead letters, purge."),
  Command.withSubcommands([stats, peek, dlq, purge])
)
