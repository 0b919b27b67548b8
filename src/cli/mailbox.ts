/**
 * `leasehold mailbox …`: look into a durable mailbox database from the shell
 * — `stats` (every queue: queued, in flight, delayed, dead letters), `peek`
 * (the next messages, not received), `dlq list`, `dlq redrive` (back to the
 * source queue), `dlq delete`, `purge`, and `pause` / `resume` / `drop` (the
 * queues table, mailbox migration 10), and `journal` (an agent run's step
 * journal, by message id or request id — an ambiguous one refused with its
 * matches, exit 2 —, mailbox migrations 11 and 12), and scheduling by key (mailbox migration 14): `keys` (a
 * queue's keys with their counts, settings and windows), `limit`, `weight` and `rate` (a key's settings, or with
 * no `--key` the queue's defaults; `none` clears one; a bad value is a usage error naming it, exit 2, and
 * nothing is written). What acts on everything (a redrive
 * or delete without `--queue`/`--id`, a delete of a queue's dead letters, a
 * purge) needs `--yes`, and without it says how many rows it would touch
 * (exit 2). A queue or dead letter that is not there is a `NotFoundError`
 * (exit 1): a queue exists while it holds messages or dead letters.
 */
import * as Args from "@effect/cli/Args"
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { summary } from "../internal/mailbox/admin/journalView.js"
import * as StoredTime from "../internal/storedTime.js"
import type * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import { limit as limitOption, withDatabase } from "./database.js"
import { causeOf, clip } from "./errorText.js"
import { admin, type Common, common, existing, iso, NotFoundError, onMailbox, plural, since } from "./mailboxAccess.js"
import { keys, limitCommand, rateCommand, weightCommand } from "./mailboxKeys.js"
import { line, print } from "./output.js"
import { table } from "./table.js"

/** A command that acts on everything, run without `--yes`: a usage error saying how many rows it would touch. */
export class ConfirmationRequiredError extends Schema.TaggedError<ConfirmationRequiredError>()(
  "ConfirmationRequiredError",
  { message: Schema.String }
) {}

export { NotFoundError }

const stats = Command.make("stats", common, (options) =>
  onMailbox(options, ({ queues }) =>
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
    onMailbox(options, (mailbox) =>
      Effect.gen(function*() {
        const messages = yield* mailbox.queues.peek(options.queue, { limit: options.limit })
        if (messages.length === 0) yield* existing(mailbox, options.queue)
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
            messages.length === 0 ? `no messages in ${options.queue} (only dead letters)` : table(
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
    "The next messages of a queue in delivery order, without receiving them. A queue that holds nothing exits 1.\n" +
      "Example: leasehold mailbox peek requests --db ./.leasehold/demo.db --limit 5"
  )
)

const queueOption = Options.text("queue").pipe(
  Options.withDescription("Only dead letters from this source queue."),
  Options.optional
)

/** The most characters of a cause the table shows (`--json` has the whole error). */
const causeShown = 300

const dlqList = Command.make(
  "list",
  { ...common, queue: queueOption, limit },
  (options) =>
    onMailbox(options, (mailbox) =>
      Effect.gen(function*() {
        const queue = Option.getOrUndefined(options.queue)
        const all = yield* mailbox.letters.list({ queue, limit: options.limit })
        if (all.length === 0 && queue !== undefined) yield* existing(mailbox, queue)
        const now = yield* Clock.currentTimeMillis
        yield* print(
          options.json,
          all.map((letter) => ({
            ...letter,
            enqueuedAt: iso(letter.enqueuedAt),
            deadLetteredAt: iso(letter.deadLetteredAt),
            cause: causeOf(letter.error)
          })),
          () =>
            all.length === 0 ? "no dead letters" : table(
              ["id", "queue", "deliveries", "dead-lettered", "error (its cause; --json has it whole)"],
              all.map((letter) => [
                letter.id,
                letter.queue,
                String(letter.deliveryCount),
                since(letter.deadLetteredAt, now),
                clip(`${letter.errorTag}: ${causeOf(letter.error)}`, causeShown)
              ])
            )
        )
      }))
).pipe(
  Command.withDescription(
    "Dead letters, oldest first, with the cause of the error that put them there (--json: the whole error).\n" +
      "Example: leasehold mailbox dlq list --db ./.leasehold/demo.db --queue requests"
  )
)

const ids = Options.text("id").pipe(
  Options.withDescription("Only this dead letter (repeatable)."),
  Options.repeated,
  // Optional: shown as such in the usage.
  Options.withDefault([])
)

const yes = Options.boolean("yes")

/** What `dlq redrive` and `dlq delete` do to the dead letters selected. */
interface LetterAction {
  readonly verb: string
  readonly done: (count: string) => string
  readonly key: string
  readonly run: (letters: MailboxSqlAdmin.DeadLetters, selection: MailboxSqlAdmin.Selection) => Effect.Effect<
    number,
    unknown
  >
  /** Whether acting on all of one queue's dead letters needs `--yes` too. */
  readonly queueNeedsYes: boolean
}

/**
 * Runs `action` on the dead letters `--queue` and `--id` select. Ids not there are a `NotFoundError` (exit 1),
 * after acting on those that are; a `--queue` that holds nothing is one before anything is done; acting on
 * every queue (and, for a delete, on all of one queue) without `--yes` is a `ConfirmationRequiredError` saying
 * how many it would touch.
 */
const onLetters = (
  options: Common & {
    readonly json: boolean
    readonly queue: Option.Option<string>
    readonly id: ReadonlyArray<string>
    readonly yes: boolean
  },
  action: LetterAction
) =>
  onMailbox(options, (mailbox) =>
    Effect.gen(function*() {
      const { letters } = mailbox
      const queue = Option.getOrUndefined(options.queue)
      const of = queue === undefined ? "every queue" : JSON.stringify(queue)
      if (queue !== undefined) yield* existing(mailbox, queue)
      const report = (n: number, notFound: ReadonlyArray<string>) =>
        print(
          options.json,
          { [action.key]: n, ...(notFound.length > 0 ? { notFound } : {}) },
          () => action.done(plural(n, "dead letter"))
        )
      if (options.id.length === 0) {
        if (!options.yes && (queue === undefined || action.queueNeedsYes)) {
          const count = yield* letters.count({ queue })
          return yield* new ConfirmationRequiredError({
            message: `${action.verb} would ${action.verb} ${plural(count, "dead letter")} of ${of}; add --yes` +
              (queue === undefined ? ", or choose some with --queue or --id" : "")
          })
        }
        return yield* Effect.flatMap(action.run(letters, { queue }), (n) => report(n, []))
      }
      const asked = [...new Set(options.id)]
      const present = new Set(
        (yield* letters.list({ queue, ids: asked, limit: Math.min(asked.length, 100_000) })).map((letter) => letter.id)
      )
      const notFound = asked.filter((id) => !present.has(id))
      const missing = () =>
        new NotFoundError({
          message: `no dead letter with id ${notFound.join(", ")}${queue === undefined ? "" : ` from ${of}`}` +
            " (already redriven or deleted? `leasehold mailbox dlq list` shows them)"
        })
      if (present.size === 0) return yield* missing()
      yield* Effect.flatMap(action.run(letters, { queue, ids: [...present] }), (n) => report(n, notFound))
      if (notFound.length > 0) return yield* missing()
    }))

const letterOptions = (what: string) => ({
  ...common,
  queue: queueOption,
  id: ids,
  yes: yes.pipe(Options.withDescription(`Really ${what}.`))
})

const dlqRedrive = Command.make(
  "redrive",
  letterOptions("redrive every queue's dead letters (without --queue or --id)"),
  (options) =>
    onLetters(options, {
      verb: "redrive",
      done: (count) => `moved ${count} back to their source queue`,
      key: "redriven",
      run: (letters, selection) => letters.redrive(selection),
      queueNeedsYes: false
    })
).pipe(
  Command.withDescription(
    "Moves dead letters back to their source queue as new messages. Without --queue or --id it needs --yes.\n" +
      "Example: leasehold mailbox dlq redrive --db ./.leasehold/demo.db --queue requests"
  )
)

const dlqDelete = Command.make(
  "delete",
  letterOptions("delete every dead letter of --queue (or, without it, of every queue)"),
  (options) =>
    onLetters(options, {
      verb: "delete",
      done: (count) => `deleted ${count}`,
      key: "deleted",
      run: (letters, selection) => letters.purge(selection),
      queueNeedsYes: true
    })
).pipe(
  Command.withDescription(
    "Deletes dead letters: by --id, or every one of --queue (or of every queue) with --yes.\n" +
      "Example: leasehold mailbox dlq delete --db ./.leasehold/demo.db --id 42"
  )
)

const dlq = Command.make("dlq").pipe(
  Command.withDescription("The dead-letter table: list, redrive, delete."),
  Command.withSubcommands([dlqList, dlqRedrive, dlqDelete])
)

const purge = Command.make(
  "purge",
  { ...common, queue: Args.text({ name: "queue" }), yes: yes.pipe(Options.withDescription("Really delete.")) },
  (options) =>
    onMailbox(options, (mailbox) =>
      Effect.gen(function*() {
        yield* existing(mailbox, options.queue)
        if (!options.yes) {
          const stats = (yield* mailbox.queues.stats).find((queue) => queue.queue === options.queue)
          const count = stats === undefined ? 0 : stats.queued + stats.inFlight + stats.delayed
          return yield* new ConfirmationRequiredError({
            message: `purge would delete ${count} message(s) of "${options.queue}", in flight ones included; add --yes`
          })
        }
        const deleted = yield* mailbox.queues.purge(options.queue)
        yield* print(options.json, { deleted }, () => `deleted ${deleted} message(s) from ${options.queue}`)
      }))
).pipe(
  Command.withDescription(
    "Deletes every message of a queue (in flight ones too; not its dead letters). Needs --yes.\n" +
      "Example: leasehold mailbox purge requests --db ./.leasehold/demo.db --yes"
  )
)

/** A queue that `drop` found holding messages: nothing was changed (exit 1). */
export class QueueNotEmptyError extends Schema.TaggedError<QueueNotEmptyError>()("QueueNotEmptyError", {
  message: Schema.String
}) {}

const queueArg = Args.text({ name: "queue" })

/** `pause` and `resume`: the queue's state in the queues table (mailbox migration 10). */
const pausing = (name: "pause" | "resume", description: string) =>
  Command.make(
    name,
    { ...common, queue: queueArg },
    (options) =>
      onMailbox(options, (mailbox) =>
        Effect.gen(function*() {
          yield* (name === "pause" ? mailbox.queues.pause(options.queue) : mailbox.queues.resume(options.queue))
          const paused = name === "pause"
          yield* print(
            options.json,
            { queue: options.queue, paused },
            () => `${options.queue}: ${paused ? "paused (its receivers get nothing until resumed)" : "resumed"}`
          )
        }))
  ).pipe(Command.withDescription(description))

const pause = pausing(
  "pause",
  "Pauses a queue: receivers of it, in every process, get nothing (a long poll waits and returns empty) until " +
    "it is resumed; sends go on. The state is in the database.\n" +
    "Example: leasehold mailbox pause requests --db ./.leasehold/demo.db"
)
const resume = pausing(
  "resume",
  "Resumes a paused queue: its receivers take messages again.\n" +
    "Example: leasehold mailbox resume requests --db ./.leasehold/demo.db"
)

const drop = Command.make(
  "drop",
  { ...common, queue: queueArg },
  (options) =>
    onMailbox(options, (mailbox) =>
      Effect.gen(function*() {
        const result = yield* mailbox.queues.drop(options.queue)
        if (result === "unknown") {
          return yield* new NotFoundError({
            message: `no queue ${JSON.stringify(options.queue)} recorded with prefix "${mailbox.prefix}" in this ` +
              "database (leasehold mailbox stats lists the queues)"
          })
        }
        if (result === "not empty") {
          return yield* new QueueNotEmptyError({
            message: `queue ${JSON.stringify(options.queue)} still has messages: nothing dropped (leasehold mailbox ` +
              "purge deletes them first)"
          })
        }
        yield* print(options.json, { dropped: options.queue }, () => `dropped ${options.queue}`)
      }))
).pipe(
  Command.withDescription(
    "Removes an empty queue from the queues table, so the console lists it no more (a queue with messages is " +
      "refused; its dead letters, if any, keep it listed while they last).\n" +
      "Example: leasehold mailbox drop old-requests --db ./.leasehold/demo.db"
  )
)

// ---------------------------------------------------------------------------------------------------------------
// Scheduling by key (mailbox migration 14): `keys`, `limit`, `weight`, `rate`

/**
 * The id given to `journal` names several journals (a request id in two queues, or sent twice; a message id that is
 * another message's request id): nothing was read or discarded (exit 2). The message lists them.
 */
export class AmbiguousJournalIdError extends Schema.TaggedError<AmbiguousJournalIdError>()(
  "AmbiguousJournalIdError",
  { message: Schema.String }
) {}

const notFound = (id: string, prefix: string, lookup: MailboxSqlAdmin.JournalLookup) =>
  new NotFoundError({
    message: `no step journal for ${JSON.stringify(id)} (${
      lookup.by === "message"
        ? "a message id"
        : lookup.by === "request"
        ? "a request id"
        : "a message id or a request id"
    }${lookup.queue === undefined ? "" : ` in queue ${JSON.stringify(lookup.queue)}`}) with prefix ` +
      `"${prefix}" in this database: the run recorded no step, or its journal went with its ` +
      "acknowledgement or retention"
  })

/** A refused ambiguous lookup, as the command line says it: every match, and how to name one. */
const ambiguous = (error: MailboxSqlAdmin.JournalAmbiguousError) =>
  new AmbiguousJournalIdError({
    message:
      `${JSON.stringify(clip(error.id, 200))} names ${error.more ? "more than " : ""}${
        plural(error.matches.length, "journal")
      }${error.queue === undefined ? "" : ` in queue ${JSON.stringify(error.queue)}`}; nothing was read or ` +
      "discarded. Name one with --queue, or by its message id with --by message:\n" +
      table(
        ["message", "queue", "matched by"],
        error.matches.map((match) => [match.messageId, match.queue, match.matchedBy])
      )
  })

/** The journal's header line and steps table. */
const journalText = (found: MailboxSqlAdmin.JournalView) =>
  [
    // The ids and the queue are stored values (a request id is the sender's): each printed escaped.
    line`message ${found.messageId} (${found.where}) in ${found.queue}` +
    Option.match(found.requestId, { onNone: () => "", onSome: (id) => line`, request ${id}` }) +
    `: ${plural(found.steps.length, "step")}${found.truncated ? " (the first ones; there are more)" : ""}`,
    table(
      ["position", "key", "recorded", "entry"],
      found.steps.map((step) => [String(step.position), step.key, StoredTime.iso(step.recordedAt), summary(step.entry)])
    )
  ].join("\n")

const journal = Command.make(
  "journal",
  {
    ...common,
    id: Options.text("id").pipe(Options.withDescription("A message id, or the request id the run answers.")),
    queue: Options.text("queue").pipe(
      Options.withDescription("Only the journals of this queue (a request id may be sent to several)."),
      Options.optional
    ),
    by: Options.choice("by", ["message", "request", "either"]).pipe(
      Options.withDescription(
        "What --id is: a message id, a request id, or either (the default: refused when both answer)."
      ),
      Options.withDefault("either" as const)
    ),
    discard: Options.boolean("discard").pipe(
      Options.withDescription("Delete the journal (the request's next delivery runs from its first step).")
    )
  },
  (options) => {
    const lookup: MailboxSqlAdmin.JournalLookup = {
      by: options.by,
      ...(Option.isSome(options.queue) ? { queue: options.queue.value } : {})
    }
    return admin.pipe(
      Effect.flatMap((MailboxSqlAdmin) => MailboxSqlAdmin.journals({ prefix: options.prefix, create: false })),
      Effect.flatMap((journals) =>
        options.discard
          ? Effect.flatMap(journals.discard(options.id, lookup), (steps) =>
            steps === 0
              ? notFound(options.id, options.prefix, lookup)
              : print(options.json, { discarded: steps }, () => `discarded ${plural(steps, "step")}`))
          : Effect.flatMap(
            journals.read(options.id, lookup),
            Option.match({
              onNone: () => notFound(options.id, options.prefix, lookup),
              onSome: (found) =>
                print(
                  options.json,
                  {
                    ...found,
                    requestId: Option.getOrNull(found.requestId),
                    steps: found.steps.map((step) => ({ ...step, recordedAt: iso(step.recordedAt) }))
                  },
                  () => journalText(found)
                )
            })
          )
      ),
      Effect.catchTag("JournalAmbiguousError", (error) => Effect.fail(ambiguous(error))),
      withDatabase(Option.getOrUndefined(options.db))
    )
  }
).pipe(
  Command.withDescription(
    "The step journal of an agent run's message, by message id or request id: one line per recorded step\n" +
      "(position, key, when, the entry's kind, prompt, tool, tokens, ok); --json has every entry whole.\n" +
      "A request id is the sender's choice: one that several journals carry (in two queues, or sent twice) is\n" +
      "refused with the list of them (exit 2); name one with --queue, or by its message id with --by message.\n" +
      "--discard deletes it: for a run the code no longer matches (it replied JournalDivergedError).\n" +
      "Example: leasehold mailbox journal --id order-42 --queue requests --db ./.leasehold/demo.db"
  )
)

/** `leasehold mailbox`. */
export const command = Command.make("mailbox").pipe(
  Command.withDescription(
    "Inspect durable mailboxes (SQLite file or PostgreSQL): stats, peek, dead letters, purge, pause, resume, drop, " +
      "journal, and scheduling by key: keys, limit, weight, rate."
  ),
  Command.withSubcommands([
    stats,
    peek,
    dlq,
    purge,
    pause,
    resume,
    drop,
    journal,
    keys,
    limitCommand,
    weightCommand,
    rateCommand
  ])
)
