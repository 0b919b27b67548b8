/**
 * Scheduling: who among a queue's senders is served next. Every backend
 * (memory, SQLite, PostgreSQL) implements the rules below in its claim; this
 * module holds what they share — the settings' shapes and checks, and the
 * arithmetic — so the three cannot drift.
 *
 * **Keys and priorities.** `send(body, { key, priority })`: `key` names a
 * tenant, customer or any grouping (the name rule); `priority` is an integer,
 * lower first. A key's messages go in (priority, first enqueue) order, and a
 * message keeps its place when it comes back (its lease ran out, it was given
 * back by a draining worker, nacked): it is ordered by when it was first sent,
 * not by when it became visible again. (A message without a key that comes
 * back keeps its place too in a SQL queue scheduled by key; in memory, and in
 * a SQL queue that never used a key, it goes behind those waiting, as before
 * keys — MainLoop's redelivery tests rely on that order.) Across keys, fair shares decide (a
 * sender cannot jump the fleet by marking everything urgent); a message sent
 * without a key is in no key: never limited, and the claim serves the older
 * of the unkeyed head and the fair pick (by first enqueue: priority orders a
 * line's own messages only, so an urgent unkeyed stream cannot starve keys).
 *
 * **Limits.** A key's concurrency limit bounds its live leases across every
 * process: a claim never hands out a message of a key that already has
 * `limit` leases that are neither settled nor past their visibility. A zombie's
 * expired lease stops counting when it stops protecting. Limit 0 holds the
 * key (nothing of it is claimed).
 *
 * **Fair shares by worker time** (start-time fair queuing over leases). Each
 * key carries a share clock, `vtime`: the leased milliseconds its messages
 * held workers for, divided by its weight. A claim charges the lease's
 * expected length up front — the key's mean lease (an exponential average of
 * how long its settled leases were held), or the visibility before it has one
 * — so a key whose runs take two hours pays for two hours when it takes a
 * worker, not when it gives it back. A running lease is expected to run at
 * least as long again as it has (each extension charges up to twice its age),
 * so a key whose first runs are long is not mistaken for one of short runs
 * before any has ended; and when the lease
 * ends the charge is set right: a settle, nack or release to the time it was
 * held, a lease that ran out to its visibility. The claim goes to the
 * eligible key with the lowest `vtime` (ties by key). A key that becomes busy
 * (a ready message while it had none ready and no live lease) starts at
 * `max(its vtime, the queue's share clock)`, where the queue's share clock is
 * the highest `vtime` at which an active key was last picked: it neither
 * claims credit for the time it was away nor pays for it, so a new key is
 * served at the next free worker and no key with ready work starves. The
 * "window" is thus each key's busy period: a key idle for a while is judged
 * afresh. Cost: one ordered index walk over the queue's active keys per claim,
 * an update of the picked key's row, and a row update per settle of a keyed
 * message; nothing for a message without a key.
 *
 * **Rates.** Per key, at most `starts.count` claims per `starts.per`, and at
 * most `tokens.count` model tokens per `tokens.per` (charged by the agent path
 * with each turn's usage): fixed windows aligned on the store's clock. A key
 * over either is skipped by the claim until its window turns; tokens are
 * charged after the fact, so a turn may take a key past its budget, and the
 * key then waits for its next window. (`@effect/experimental`'s `RateLimiter`
 * consumes a token bucket or a fixed window and fails, or delays, the caller
 * after the fact; a claim must instead skip a key inside the claim statement,
 * among its other keys, so the window is kept in the key's row.)
 *
 * Settings are per (queue, key), with a queue's defaults for keys without
 * their own; every field `null` clears the setting (unlimited, weight 1).
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Metric from "effect/Metric"
import { InvalidParameterError } from "../../Errors.js"
import type { MailboxConnectionError } from "../../Mailbox.js"
import * as Durations from "../duration.js"
import { counter } from "../metrics.js"
import * as Names from "../names.js"

/** A rate: at most `count` per `per`. */
export interface Rate {
  readonly count: number
  readonly per: Duration.DurationInput
}

/** A key's settings, or a queue's defaults. Absent: unchanged; `null`: cleared. */
export interface KeySettings {
  /** At most this many live leases of the key (0..1,000,000); `null`: unlimited. */
  readonly limit?: number | null | undefined
  /** The key's share of worker time relative to others (0.001..1000, default 1). */
  readonly weight?: number | null | undefined
  /** At most `count` starts (claims) per `per`. */
  readonly starts?: Rate | null | undefined
  /** At most `count` model tokens per `per` (charged with each turn's usage). */
  readonly tokens?: Rate | null | undefined
}

/** Settings as stored: milliseconds, `null` for cleared, `undefined` for unchanged. */
export interface StoredSettings {
  readonly limit?: number | null
  readonly weight?: number | null
  readonly startLimit?: number | null
  readonly startIntervalMillis?: number | null
  readonly tokenLimit?: number | null
  readonly tokenIntervalMillis?: number | null
}

/** A key's state, as every backend reports it (`keys`). */
export interface KeyState {
  readonly key: string
  /** Visible now. */
  readonly ready: number
  /** Live leases (claimed, neither settled nor past their visibility). */
  readonly inFlight: number
  /** Every unsettled message of the key (ready, in flight, delayed). */
  readonly pending: number
  /** The effective limit (the key's, else the queue's default); `undefined`: unlimited. */
  readonly limit: number | undefined
  readonly weight: number
  /** Leased milliseconds in the key's current busy period (visibility still held counted to its end). */
  readonly leasedMillis: number
  /** The key's share clock (`vtime`): leased milliseconds over weight. */
  readonly vtime: number
  /** Starts in the current window and the effective start rate, if any. */
  readonly starts: { readonly used: number; readonly count: number; readonly perMillis: number } | undefined
  /** Tokens in the current window and the effective token budget, if any. */
  readonly tokens: { readonly used: number; readonly count: number; readonly perMillis: number } | undefined
}

/** Limits of the settings. */
export const bounds = {
  maxLimit: 1_000_000,
  minWeight: 0.001,
  maxWeight: 1000,
  maxRateCount: 1_000_000_000_000,
  maxInterval: Duration.days(1),
  /** Priorities: a safe 32-bit integer, so every store keeps it as INTEGER. */
  minPriority: -2_147_483_648,
  maxPriority: 2_147_483_647,
  /** The most keys the operator's views return. */
  maxKeysListed: 10_000
} as const

const refuse = (parameter: string, value: unknown, reason: string) =>
  Either.left(new InvalidParameterError({ parameter, value, reason }))

/** Checks a send's `key` (the name rule). */
export const validateKey = (key: unknown): Either.Either<string, InvalidParameterError> => {
  const problem = Names.nameProblem(key)
  return problem === undefined ? Either.right(key as string) : refuse("key", key, problem)
}

/** Checks a send's `priority`: an integer in the 32-bit range. */
export const validatePriority = (priority: unknown): Either.Either<number, InvalidParameterError> =>
  typeof priority === "number" && Number.isInteger(priority) && priority >= bounds.minPriority &&
    priority <= bounds.maxPriority
    ? Either.right(priority)
    : refuse("priority", priority, `must be an integer between ${bounds.minPriority} and ${bounds.maxPriority}`)

const validateRate = (
  parameter: string,
  rate: Rate | null | undefined
): Either.Either<{ count: number; perMillis: number } | null | undefined, InvalidParameterError> => {
  if (rate === undefined || rate === null) return Either.right(rate)
  if (typeof rate !== "object") return refuse(parameter, rate, "must be { count, per } or null")
  const { count, per } = rate
  if (typeof count !== "number" || !Number.isInteger(count) || count < 0 || count > bounds.maxRateCount) {
    return refuse(`${parameter}.count`, count, `must be an integer between 0 and ${bounds.maxRateCount}`)
  }
  const parsed = Durations.parse(per)
  if (Either.isLeft(parsed)) return refuse(`${parameter}.per`, per, parsed.left)
  const perMillis = Math.ceil(Duration.toMillis(parsed.right))
  if (perMillis < 1 || Duration.greaterThan(parsed.right, bounds.maxInterval)) {
    return refuse(`${parameter}.per`, per, `must be between 1 ms and ${Duration.format(bounds.maxInterval)}`)
  }
  return Either.right({ count, perMillis })
}

/** Checks settings (an operator's, or a program's) and turns them into what is stored. */
export const validateSettings = (settings: KeySettings): Either.Either<StoredSettings, InvalidParameterError> => {
  if (typeof settings !== "object" || settings === null) return refuse("settings", settings, "must be an object")
  const out: {
    limit?: number | null
    weight?: number | null
    startLimit?: number | null
    startIntervalMillis?: number | null
    tokenLimit?: number | null
    tokenIntervalMillis?: number | null
  } = {}
  const { limit, weight } = settings
  if (limit !== undefined) {
    if (
      limit !== null && (typeof limit !== "number" || !Number.isInteger(limit) || limit < 0 || limit > bounds.maxLimit)
    ) return refuse("limit", limit, `must be an integer between 0 and ${bounds.maxLimit}, or null`)
    out.limit = limit
  }
  if (weight !== undefined) {
    if (
      weight !== null &&
      (typeof weight !== "number" || !Number.isFinite(weight) || weight < bounds.minWeight ||
        weight > bounds.maxWeight)
    ) return refuse("weight", weight, `must be a number between ${bounds.minWeight} and ${bounds.maxWeight}, or null`)
    out.weight = weight
  }
  const starts = validateRate("starts", settings.starts)
  if (Either.isLeft(starts)) return Either.left(starts.left)
  if (starts.right !== undefined) {
    out.startLimit = starts.right?.count ?? null
    out.startIntervalMillis = starts.right?.perMillis ?? null
  }
  const tokens = validateRate("tokens", settings.tokens)
  if (Either.isLeft(tokens)) return Either.left(tokens.left)
  if (tokens.right !== undefined) {
    out.tokenLimit = tokens.right?.count ?? null
    out.tokenIntervalMillis = tokens.right?.perMillis ?? null
  }
  return Either.right(out)
}

/** Checks a turn's token usage before it is charged: a non-negative safe integer. */
export const validateTokens = (tokens: unknown): Either.Either<number, InvalidParameterError> =>
  typeof tokens === "number" && Number.isSafeInteger(tokens) && tokens >= 0
    ? Either.right(tokens)
    : refuse("tokens", tokens, "must be a non-negative integer")

/** How much a settled lease moves its key's mean lease length (an exponential moving average). */
export const meanWeight = 0.25

/** A running lease's expected length from its age: as long again as it has run (then set right at its end). */
export const expectedLength = (ageMillis: number): number => 2 * ageMillis

/** The start of the fixed window of `intervalMillis` that `now` falls in. */
export const windowStart = (now: number, intervalMillis: number): number => now - (now % intervalMillis)

/**
 * A delivery's scheduling handle, a field of every delivery whose mailbox schedules by key (the agent path
 * charges model tokens through it). Absent on a delivery of a message without a key.
 */
export const Scheduled: unique symbol = Symbol.for("leasehold/Mailbox/scheduled")

export interface DeliveryScheduling {
  readonly key: string
  /** Charges `tokens` (checked already, positive) to the key's token budget, in the store. */
  readonly chargeTokens: (tokens: number) => Effect.Effect<void, MailboxConnectionError>
}

/** The delivery's scheduling handle, when it has one (a wrapper made with `Object.create` charges through it). */
export const scheduledOf = (message: object): DeliveryScheduling | undefined =>
  (message as { readonly [Scheduled]?: DeliveryScheduling })[Scheduled]

/**
 * Keys a claim passed over although it was looking for work, per queue (`queue`) and why (`reason`): `limit` (the
 * key had ready messages but `limit` live leases), `starts` or `tokens` (over its start rate or token budget in
 * this window). Each key counts at most once a claim for each reason. Per queue, never per key: key names are the
 * senders' and unbounded.
 */
export const keysHeldBack = counter(
  "leasehold_mailbox_keys_held_back_total",
  "Keys a claim passed over: at their concurrency limit (reason=limit) or over a start rate or token budget"
)

/**
 * Keys of a queue with unsettled messages, per queue (`queue`), as the process that claims it last saw them: set
 * by a claim at most every `gaugeEveryMillis` (SQLite, PostgreSQL: the keys the claim's walk has not found idle;
 * memory: the keys with unsettled entries).
 */
export const keysActive = Metric.gauge("leasehold_mailbox_keys_active", {
  description: "Keys of the queue with unsettled messages (scheduling by key), as a claim last counted them"
})

/**
 * Opt-in (`keyMetrics: true` on `make`): each key's live leases — what its concurrency limit counts — tagged
 * `queue` and `key`, for at most `keyGaugeLimit` keys a queue (the most leases), set by a claim at most every
 * `gaugeEveryMillis`; a key that drops out is set to 0 once. Key names are the senders': every key ever shown
 * stays a series of the process's registry, so turn it on only where keys are few and trusted.
 */
export const keyLeases = Metric.gauge("leasehold_mailbox_key_leases", {
  description: "Live leases of a key (opt-in: keyMetrics), what its concurrency limit counts"
})

/** How often a claim refreshes the gauges of its queue, at most (the mailbox's clock). */
export const gaugeEveryMillis = 10_000
/** The most keys a queue's per-key gauge shows. */
export const keyGaugeLimit = 1_000

/** Sets the gauges of `queue`: its active keys, and (when given) each key's live leases, zeroing `shown` ones gone. */
export const setGauges = (
  queue: string,
  active: number,
  leases: ReadonlyMap<string, number> | undefined,
  shown: Set<string>
): Effect.Effect<void> =>
  Effect.suspend(() => {
    const updates: Array<Effect.Effect<void>> = [Metric.set(keysActive.pipe(Metric.tagged("queue", queue)), active)]
    if (leases !== undefined) {
      const top = [...leases].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, keyGaugeLimit)
      const now = new Set(top.map(([key]) => key))
      for (const key of shown) if (!now.has(key)) top.push([key, 0])
      shown.clear()
      for (const key of now) shown.add(key)
      for (const [key, n] of top) {
        updates.push(Metric.set(keyLeases.pipe(Metric.tagged("queue", queue), Metric.tagged("key", key)), n))
      }
    }
    return Effect.all(updates, { discard: true })
  })

/** The reason a key with ready work is passed over, for `keysHeldBack`. */
export type HeldBack = "limit" | "starts" | "tokens"

/** Counts the keys a claim of `queue` passed over, by reason (`keysHeldBack`). */
export const countHeldBack = (
  queue: string,
  held: Readonly<Record<HeldBack, ReadonlySet<string>>>
): Effect.Effect<void> =>
  Effect.all(
    (["limit", "starts", "tokens"] as const).filter((reason) => held[reason].size > 0).map((reason) =>
      Metric.incrementBy(
        keysHeldBack.pipe(Metric.tagged("queue", queue), Metric.tagged("reason", reason)),
        held[reason].size
      )
    ),
    { discard: true }
  )
