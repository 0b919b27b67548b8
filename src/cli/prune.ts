/**
 * `leasehold prune`: retention from the shell (or a cron job) — deletes, in
 * bounded batches, merge-queue entries in a terminal status, the merge
 * queue's audit log, dead letters and the unread replies of the queues named
 * with `--reply-queue`, once older than `--older-than`; `--dry-run` counts
 * them instead. Prints the count of each kind. See `Retention`.
 */
import * as Command from "@effect/cli/Command"
import * as HelpDoc from "@effect/cli/HelpDoc"
import * as Options from "@effect/cli/Options"
import * as ValidationError from "@effect/cli/ValidationError"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { parse as parseDuration } from "../internal/duration.js"
import type * as Retention from "../Retention.js"
import { db, json, prefix, withDatabase } from "./database.js"
import { print } from "./output.js"
import { pairs } from "./table.js"

const units: Record<string, (n: number) => Duration.Duration> = {
  s: Duration.seconds,
  m: Duration.minutes,
  h: Duration.hours,
  d: Duration.days,
  w: Duration.weeks
}

/**
 * An age as an operator writes it: `7d`, `12h`, `30m`, `90s`, `2w`, or a duration in words (`36 hours`).
 * From 1 millisecond to 36500 days (100 years, `Retention.maxAge`), else why not: a shorter one would round to
 * 0 ms and prune everything, a longer one is more than any database holds alike.
 */
export const parseAge = (text: string): Either.Either<Duration.Duration, string> => {
  const short = /^(\d+(?:\.\d+)?)([smhdw])$/.exec(text.trim())
  const parsed = short !== null ? Either.right(units[short[2]!]!(Number(short[1]))) : parseDuration(text)
  return Either.flatMap(
    Either.mapLeft(parsed, (reason) => `${reason}; write e.g. 7d, 12h, 30m or "36 hours"`),
    (age) =>
      Duration.isZero(age)
        ? Either.left("must be greater than zero")
        : !Duration.isFinite(age)
        ? Either.left("must be finite")
        : Duration.lessThan(age, Duration.millis(1))
        ? Either.left("must be at least 1 millisecond (a shorter age would prune every row)")
        : Duration.greaterThan(age, Duration.days(36_500))
        ? Either.left("must be at most 36500 days (100 years)")
        : Either.right(age)
  )
}

const olderThan = Options.text("older-than").pipe(
  Options.withDescription("Delete rows older than this: 7d, 12h, 30m, 90s, 2w, or \"36 hours\"."),
  Options.mapEffect((text) =>
    Either.match(parseAge(text), {
      onLeft: (reason) =>
        Effect.fail(ValidationError.invalidValue(HelpDoc.p(`--older-than ${JSON.stringify(text)} ${reason}`))),
      onRight: Effect.succeed
    })
  )
)

const dryRun = Options.boolean("dry-run").pipe(Options.withDescription("Count what would go; delete nothing."))

const replyQueue = Options.text("reply-queue").pipe(
  Options.withDescription(
    "A queue that receives replies (a replyTo): its unread replies older than --older-than\n" +
      "go (repeatable). Without it no reply is pruned: leasehold cannot tell a reply queue\n" +
      "from a work queue."
  ),
  Options.repeated
)

/** Each kind as the output names it (plain data, so that `--help` does not load the SQL statements). */
const labels: Record<Retention.Kind, string> = {
  entries: "merge-queue entries (merged, failed, cancelled)",
  audit: "merge-queue audit rows",
  deadLetters: "dead letters",
  replies: "unread replies",
  journals: "step journals of gone messages"
}
const kinds = Object.keys(labels) as ReadonlyArray<Retention.Kind>

const kind = Options.choice("kind", kinds).pipe(
  Options.withDescription("Only this kind of rows (repeatable; default all)."),
  Options.repeated
)

const batchSize = Options.integer("batch-size").pipe(
  Options.withDescription("Rows per batch, each its own short transaction (1 to 10000)."),
  Options.withDefault(500),
  Options.mapEffect((value) =>
    Number.isSafeInteger(value) && value >= 1 && value <= 10_000
      ? Effect.succeed(value)
      : Effect.fail(
        ValidationError.invalidValue(HelpDoc.p(`--batch-size must be an integer from 1 to 10000, got ${value}`))
      )
  )
)

/** `leasehold prune`. */
export const command = Command.make(
  "prune",
  { db, prefix, json, olderThan, dryRun, replyQueue, kind, batchSize },
  (options) =>
    Effect.promise(() => import("../Retention.js")).pipe(
      Effect.flatMap((Retention) =>
        Retention.prune({
          olderThan: options.olderThan,
          dryRun: options.dryRun,
          prefix: options.prefix,
          replyQueues: options.replyQueue,
          batchSize: options.batchSize,
          ...(options.kind.length === 0 ? {} : { kinds: options.kind })
        })
      ),
      Effect.flatMap((result) =>
        print(
          options.json,
          { ...result, olderThan: Duration.format(options.olderThan) },
          () =>
            [
              `${result.dryRun ? "would delete" : "deleted"} rows older than ${Duration.format(options.olderThan)}:`,
              pairs(
                kinds
                  .filter((kind) => options.kind.length === 0 || options.kind.includes(kind))
                  .map((kind) => [
                    labels[kind],
                    result.skipped.includes(kind) ? "- (no such tables)" : String(result[kind])
                  ])
              ),
              ...(options.replyQueue.length === 0 && (options.kind.length === 0 || options.kind.includes("replies"))
                ? ["(no --reply-queue given: no reply was looked at)"]
                : [])
            ].join("\n")
        )
      ),
      withDatabase(Option.getOrUndefined(options.db))
    )
).pipe(
  Command.withDescription(
    "Delete old rows that nothing reads any more, in short batches: merge-queue entries\n" +
      "that are merged, failed for good or cancelled, the merge-queue audit log, dead letters,\n" +
      "unread replies of the queues given with --reply-queue, and the step journals of agent\n" +
      "runs whose message is gone (dead-lettered, purged). Never a queued, delayed,\n" +
      "in-flight or in-progress row.\n" +
      "Example: leasehold prune --db ./app.db --older-than 7d --reply-queue responses --dry-run"
  )
)
