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
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { InvalidParameterError } from "../Errors.js"
import * as Durations from "../internal/duration.js"
import { summary } from "../internal/mailbox/admin/journalView.js"
import type * as Scheduling from "../internal/mailbox/scheduling.js"
import * as StoredTime from "../internal/storedTime.js"
import type * as MailboxSqlAdmin from "../MailboxSqlAdmin.js"
import { db, json, limit as limitOption, prefix, withDatabase } from "./database.js"
import { causeOf, clip } from "./errorText.js"
import { line, print } from "./output.js"
import { ago, table } from "./table.js"

/** A command that acts on everything, run without `--yes`: a usage error saying how many rows it would touch. */
export class ConfirmationRequiredError extends Schema.TaggedError<ConfirmationRequiredError>()(
  "ConfirmationRequiredError",
  { message: Schema.String }
) {}

/** A queue or dead letter the command names is not in the database (exit 1). */
export class NotFoundError extends Schema.TaggedError<NotFoundError>()("NotFoundError", { message: Schema.String }) {}

const common = { db, json, prefix }
const iso = (time: DateTime.Utc) => StoredTime.json(time)
const since = (time: DateTime.Utc, now: number) =>
  StoredTime.isValid(time) ? ago(DateTime.toEpochMillis(time), now) : "invalid time"
const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`

type Common = { readonly db: Option.Option<string>; readonly prefix: string }

/** Loaded when a command runs, so that `--help` does not load the SQL mailbox. */
const admin = Effect.promise(() => import("../MailboxSqlAdmin.js"))

/** The operator's views of the database's queues and dead letters. */
interface Mailbox {
  readonly queues: MailboxSqlAdmin.Queues
  readonly letters: MailboxSqlAdmin.DeadLetters
  readonly prefix: string
}

const onMailbox = <A, E>(options: Common, body: (mailbox: Mailbox) => Effect.Effect<A, E>) =>
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
const existing = (mailbox: Mailbox, queue: string) =>
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

/** The most keys `keys` lists (MailboxSqlAdmin's bound). */
const keysListed = 10_000

/** Milliseconds as the table shows a span: "850 ms", "12.5 s", "4.2 min", "3.1 h". */
export const span = (millis: number): string =>
  !Number.isFinite(millis)
    ? "-"
    : millis < 1000
    ? `${Math.round(millis)} ms`
    : millis < 120_000
    ? `${(millis / 1000).toFixed(1)} s`
    : millis < 7_200_000
    ? `${(millis / 60_000).toFixed(1)} min`
    : `${(millis / 3_600_000).toFixed(1)} h`

/** A rate window as the table shows it: "3/10 per 1m" (used in this window / allowed), "-" without one. */
const windowText = (window: Scheduling.KeyState["starts"]) =>
  window === undefined
    ? "-"
    : `${window.used}/${window.count} per ${Duration.format(Duration.millis(window.perMillis))}`

/** A key's state as `--json` prints it (`null` for what is not set). */
const keyJson = (state: Scheduling.KeyState) => ({
  ...state,
  limit: state.limit ?? null,
  starts: state.starts ?? null,
  tokens: state.tokens ?? null
})

const keys = Command.make(
  "keys",
  { ...common, queue: Args.text({ name: "queue" }) },
  (options) =>
    onMailbox(options, (mailbox) =>
      Effect.gen(function*() {
        const all = yield* mailbox.queues.keys(options.queue)
        if (all.length === 0) yield* existing(mailbox, options.queue)
        yield* print(
          options.json,
          all.map(keyJson),
          () =>
            all.length === 0
              ? line`no key has an unsettled message in ${options.queue}`
              : [
                table(
                  ["key", "ready", "in flight", "pending", "limit", "weight", "leased", "starts", "tokens"],
                  all.map((state) => [
                    state.key,
                    String(state.ready),
                    String(state.inFlight),
                    String(state.pending),
                    state.limit === undefined ? "-" : String(state.limit),
                    String(state.weight),
                    span(state.leasedMillis),
                    windowText(state.starts),
                    windowText(state.tokens)
                  ])
                ),
                ...(all.length >= keysListed ? [`(the first ${keysListed} keys, most pending first)`] : [])
              ].join("\n")
        )
      }))
).pipe(
  Command.withDescription(
    "The keys of a queue with unsettled messages (at most 10000, most pending first): ready,\n" +
      "in flight, pending, the limit and weight in force, leased worker time in the key's busy\n" +
      "period, and the start and token windows (used/allowed per interval). A queue that holds\n" +
      "nothing exits 1.\n" +
      "Example: leasehold mailbox keys requests --db ./.leasehold/demo.db"
  )
)

/** What a setting command was given wrong: named as the command line names it (exit 2, nothing written). */
const badValue = (parameter: string, value: unknown, reason: string) =>
  new InvalidParameterError({ parameter, value, reason })

/** The store's refusal, named as the command line names the value (`none`, not `null`). */
const asGiven = (names: Record<string, string>) => (error: unknown) =>
  error instanceof InvalidParameterError
    ? new InvalidParameterError({
      parameter: names[error.parameter] ?? error.parameter,
      value: error.value,
      reason: error.reason.replace(/, or null$/, ", or none")
    })
    : error

const keyOption = Options.text("key").pipe(
  Options.withDescription(
    "The key (tenant, customer, …) to set; without it, the queue's default for keys without their own."
  ),
  Options.optional
)

/** Sets `settings` for `--key` (or the queue's defaults) and says what is in force now. */
const setting = (
  options: Common & { readonly json: boolean; readonly queue: string; readonly key: Option.Option<string> },
  settings: Scheduling.KeySettings,
  said: string,
  names: Record<string, string>,
  shown: object = settings
) =>
  onMailbox(options, (mailbox) =>
    Effect.gen(function*() {
      const key = Option.getOrUndefined(options.key)
      yield* mailbox.queues.setKeySettings(options.queue, key, settings).pipe(Effect.mapError(asGiven(names)))
      yield* print(
        options.json,
        { queue: options.queue, key: key ?? null, ...shown },
        () =>
          key === undefined
            ? line`${options.queue}: ${said} for keys without their own (takes effect on the next claim)`
            : line`${options.queue}: ${said} for key ${JSON.stringify(key)} (takes effect on the next claim)`
      )
    }))

/** `none`, or a value `parse` reads; else a usage error naming `parameter`. */
const valueOf = <A>(
  parameter: string,
  text: string,
  parse: (text: string) => A | undefined,
  expected: string
): Effect.Effect<A | null, InvalidParameterError> => {
  if (text.trim() === "none") return Effect.succeed(null)
  const parsed = parse(text.trim())
  return parsed === undefined ? Effect.fail(badValue(parameter, text, expected)) : Effect.succeed(parsed)
}

const limitCommand = Command.make(
  "limit",
  { ...common, queue: queueArg, value: Args.text({ name: "n|none" }), key: keyOption },
  (options) =>
    Effect.flatMap(
      valueOf(
        "limit",
        options.value,
        (text) => /^\d{1,9}$/.test(text) ? Number(text) : undefined,
        "must be an integer between 0 and 1000000, or none"
      ),
      (limit) => setting(options, { limit }, limit === null ? "no limit" : `at most ${limit} in flight`, {})
    )
).pipe(
  Command.withDescription(
    "Sets a key's concurrency limit: at most N of its messages leased at once, across every\n" +
      "process (0 holds the key); `none` clears it. Without --key: the queue's default for keys\n" +
      "without their own.\n" +
      "Example: leasehold mailbox limit requests 4 --key acme --db ./.leasehold/demo.db"
  )
)

const weightCommand = Command.make(
  "weight",
  { ...common, queue: queueArg, value: Args.text({ name: "w|none" }), key: keyOption },
  (options) =>
    Effect.flatMap(
      valueOf(
        "weight",
        options.value,
        (text) => /^\d+(\.\d+)?$/.test(text) ? Number(text) : undefined,
        "must be a number between 0.001 and 1000, or none"
      ),
      (weight) => setting(options, { weight }, weight === null ? "weight 1 (cleared)" : `weight ${weight}`, {})
    )
).pipe(
  Command.withDescription(
    "Sets a key's weight: its share of worker time relative to the other keys' (0.001 to 1000,\n" +
      "default 1); `none` clears it. Without --key: the queue's default for keys without their own.\n" +
      "Example: leasehold mailbox weight requests 2 --key acme --db ./.leasehold/demo.db"
  )
)

const shortUnits: Record<string, (n: number) => Duration.Duration> = {
  ms: Duration.millis,
  s: Duration.seconds,
  m: Duration.minutes,
  h: Duration.hours,
  d: Duration.days
}

/**
 * A rate as an operator writes it: `N/PER`, PER an interval like `prune --older-than`'s (`1m`, `10s`, `1h`, `1d`,
 * `500ms`, a bare unit `m` for one, or words: `1 minute`), or `none`. Its bounds are the store's (checked there).
 */
export const parseRate = (text: string): Either.Either<Scheduling.Rate | null, string> => {
  if (text.trim() === "none") return Either.right(null)
  const match = /^(\d{1,13})\s*\/\s*(.+)$/.exec(text.trim())
  if (match === null) return Either.left("must be N/PER (e.g. 100/1m, 90000/1 minute) or none")
  const per = match[2]!.trim()
  const short = /^(\d+(?:\.\d+)?)?(ms|s|m|h|d)$/.exec(per)
  const interval = short !== null
    ? Either.right(shortUnits[short[2]!]!(Number(short[1] ?? "1")))
    : Durations.parse(per)
  return Either.match(interval, {
    onLeft: (reason) => Either.left(`its interval ${JSON.stringify(per)} ${reason}; write e.g. 100/1m or 10/10s`),
    onRight: (duration) => Either.right({ count: Number(match[1]), per: duration })
  })
}

const rateOption = (name: "starts" | "tokens", what: string) =>
  Options.text(name).pipe(Options.withDescription(what), Options.optional)

const rateCommand = Command.make(
  "rate",
  {
    ...common,
    queue: queueArg,
    starts: rateOption("starts", "At most N starts (claims) per interval: N/PER, e.g. 100/1m; none clears it."),
    tokens: rateOption(
      "tokens",
      "At most N model tokens per interval (charged with each turn's usage): N/PER, e.g. 90000/1m; none clears it."
    ),
    key: keyOption
  },
  (options) =>
    Effect.gen(function*() {
      if (Option.isNone(options.starts) && Option.isNone(options.tokens)) {
        return yield* badValue("rate", "", "give --starts N/PER, --tokens N/PER, or both (none clears one)")
      }
      const settings: { starts?: Scheduling.Rate | null; tokens?: Scheduling.Rate | null } = {}
      const shown: Record<string, { readonly count: number; readonly perMillis: number } | null> = {}
      const said: Array<string> = []
      for (const name of ["starts", "tokens"] as const) {
        const given = options[name]
        if (Option.isNone(given)) continue
        const rate = parseRate(given.value)
        if (Either.isLeft(rate)) return yield* badValue(`--${name}`, given.value, rate.left)
        settings[name] = rate.right
        shown[name] = rate.right === null
          ? null
          : { count: rate.right.count, perMillis: Duration.toMillis(Duration.decode(rate.right.per)) }
        said.push(
          rate.right === null
            ? `no ${name} rate`
            : `at most ${rate.right.count} ${name} per ${Duration.format(Duration.decode(rate.right.per))}`
        )
      }
      return yield* setting(options, settings, said.join(", "), {
        "starts.count": "--starts count",
        "starts.per": "--starts interval",
        "tokens.count": "--tokens count",
        "tokens.per": "--tokens interval"
      }, shown)
    })
).pipe(
  Command.withDescription(
    "Sets a key's start rate (--starts: claims per interval) and token budget (--tokens: model\n" +
      "tokens per interval), in fixed windows on the database's clock; `none` clears one. Without --key:\n" +
      "the queue's default for keys without their own. The interval is at most 1d.\n" +
      "Example: leasehold mailbox rate requests --starts 100/1m --tokens 90000/1m --key acme\n" +
      "  --db ./.leasehold/demo.db"
  )
)

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
