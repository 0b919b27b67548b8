/**
 * `leasehold mailbox keys | limit | weight | rate`: scheduling by key from the shell (mailbox migration 14). `keys`
 * lists a queue's keys with their counts, settings and rate windows (at most 10,000, most pending first);
 * `limit`, `weight` and `rate` set a key's settings, or with no `--key` the queue's defaults; `none` clears one;
 * a bad value is a usage error naming it (exit 2), and nothing is written. Settings take effect on the next claim.
 */
import * as Args from "@effect/cli/Args"
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import { InvalidParameterError } from "../Errors.js"
import * as Durations from "../internal/duration.js"
import type * as Scheduling from "../internal/mailbox/scheduling.js"
import { span, windowText } from "./keyText.js"
import { type Common, common, existing, onMailbox } from "./mailboxAccess.js"
import { line, print } from "./output.js"
import { table } from "./table.js"

const queueArg = Args.text({ name: "queue" })

/** The most keys `keys` lists (MailboxSqlAdmin's bound). */
const keysListed = 10_000

/** A key's state as `--json` prints it (`null` for what is not set). */
const keyJson = (state: Scheduling.KeyState) => ({
  ...state,
  limit: state.limit ?? null,
  starts: state.starts ?? null,
  tokens: state.tokens ?? null
})

export const keys = Command.make(
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

export const limitCommand = Command.make(
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

export const weightCommand = Command.make(
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

export const rateCommand = Command.make(
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
