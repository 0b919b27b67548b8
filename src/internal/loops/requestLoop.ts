/**
 * The request/reply loop that MainLoop and EvalLoop share: one attempt per
 * delivery, with a deadline, a budget and a run context, a reply for every
 * outcome, and the dead-letter policy for failures.
 *
 * Per message: a fresh `RunContext` (attempt = delivery count); a budget
 * tracker when the request or the config carries a budget; the work runs
 * under the earliest of the request's deadline (or, without one, the config's
 * `timeout` from the start of the attempt) and the budget's deadline, and is
 * interrupted when it passes. A success replies what `success` builds. A
 * failure without a dead-letter queue replies what `failure` builds and
 * acknowledges; with one, the policy decides: dead-letter (stored while the
 * request stays leased, then the error reply and the acknowledgement in one
 * lease-checked step) or nack with backoff. Nothing is lost or answered twice
 * on the way: a reply that cannot be sent nacks the request, a dead letter
 * that cannot be stored nacks it too. Each attempt gets its request's journal
 * (when the mailbox keeps journals): an agent resumes from it, and a
 * dead-lettered request's journal is kept with its letter.
 */
import * as Cause from "effect/Cause"
import type * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Crypto from "node:crypto"
import { hostname } from "node:os"
import * as Budget from "../../Budget.js"
import * as DeadLetter from "../../DeadLetter.js"
import * as Deadline from "../../Deadline.js"
import * as Errors from "../../Errors.js"
import * as Heartbeat from "../../Heartbeat.js"
import * as Journal from "../../Journal.js"
import type * as LeaseExtender from "../../LeaseExtender.js"
import type { Mailbox, MailboxResolver, Message } from "../../Mailbox.js"
import * as MailboxWorker from "../../MailboxWorker.js"
import type { RunContext } from "../../RunContext.js"
import { monotonicMillis } from "../heartbeat.js"
import { counter } from "../metrics.js"
import * as Options from "../options.js"
import { defaultTracer, idsOf, perMessage } from "../tracing.js"
import * as SettleFailure from "./settleFailure.js"

/** What every request carries for the loop: its id, and optionally a deadline, a budget and a trace. */
export interface Envelope {
  readonly requestId: string
  readonly deadline?: Deadline.Deadline | undefined
  readonly budget?: Budget.Budget | undefined
  readonly traceId?: string | undefined
  readonly spanId?: string | undefined
}

/** Options of a request loop (MainLoop's and EvalLoop's config). */
export interface Config<Body> {
  /** Stable id of this worker (default `host-pid`). */
  readonly workerId?: string | undefined
  /** How the lease of the request in hand is extended (see `LeaseExtender.make`). */
  readonly leaseExtender?: LeaseExtender.Options | undefined
  /** Dead-letter failed requests by this policy instead of replying an error at once. */
  readonly deadLetters?: DeadLetter.DeadLetterQueue<Body> | undefined
  /** Time limit for a request that carries no deadline, counted from when its execution starts (1 s..7 days). */
  readonly timeout?: Duration.DurationInput | undefined
  /** Budget for a request that carries none (the request's own budget wins). */
  readonly budget?: Budget.Budget | undefined
}

/** What the work of one attempt receives besides the request. */
export interface Attempt {
  readonly heartbeat: Heartbeat.Heartbeat
  readonly deadline: Deadline.Deadline | undefined
  readonly budgetTracker: Budget.BudgetTracker | undefined
  readonly runContext: RunContext
  /**
   * The request's step journal (see `Journal`), when its mailbox keeps one: pass it to `evaluate` so the run
   * resumes from the steps earlier deliveries recorded. `MainLoop.agent` does.
   */
  readonly journal: Journal.Journal | undefined
}

/** The attempt a reply is made for: who ran it and when it started (monotonic milliseconds). */
export interface Outcome {
  readonly runContext: RunContext
  readonly startedAt: number
}

/** Reply failures a dead letter's error reply is retried on (under the request's lease): they pass. */
const transientReply: ReadonlySet<string> = new Set(["MailboxConnectionError", "MailboxFullError"])

/** How a dead letter's error reply is retried: 200 ms, growing 2×, five times (about 6 s in all). */
const replyRetry = Schedule.exponential("200 millis", 2).pipe(Schedule.intersect(Schedule.recurs(5)))

/** Requests dead-lettered by a loop. */
export const deadLettered = counter("leasehold_messages_dead_lettered_total", "Messages moved to a dead-letter queue")

/** How many attempts share one random `runId` prefix (the count fills the last twelve hex digits). */
const runIdSpan = 2 ** 32

/** The default worker id: `host-pid`. */
export const defaultWorkerId = (): string => `${hostname()}-${process.pid}`

/** The part of the config decoded here (the lease extender's is `LeaseExtender.make`'s): `timeout` 1 s..7 days. */
const configFields = {
  config: Schema.optionalWith(
    Schema.Struct({
      timeout: Schema.optionalWith(
        Options.duration({
          min: Duration.seconds(1),
          max: Duration.days(7),
          range: "must be at least 1 second and at most 7 days"
        }),
        { exact: true }
      )
    }),
    { exact: true }
  )
}

/** Makes a request loop over `requests`; a bad `timeout` or lease-extender config fails with a `ParseError`. */
export const make = <Body extends Envelope, Res, Out, E, R>(options: {
  /** The constructor the loop's options were given to, for what a `ParseError` says (`MainLoop.make`). */
  readonly label: string
  readonly name: string
  readonly requests: Mailbox<Body, Res>
  readonly config: Config<Body> | undefined
  /** The work of one attempt; interrupted when its deadline passes. */
  readonly execute: (body: Body, attempt: Attempt) => Effect.Effect<Out, E, R>
  /** The reply to a success. */
  readonly success: (message: Message<Body, Res>, output: Out, outcome: Outcome) => Res
  /** The reply to a failure (without a dead-letter queue, or once dead-lettered). */
  readonly failure: (message: Message<Body, Res>, error: Errors.ErrorInfo, outcome: Outcome) => Res
  /**
   * What the loop's own deadline fails with, when the work can say more than `DeadlineExceededError`
   * (the agent: where the evaluation stood). The loop's timer and the work's own can fire at the same
   * instant; whichever wins, the reply is then the same kind of error, with the same phase and payload
   * (only its wording may differ).
   */
  readonly onDeadline?:
    | ((error: Deadline.DeadlineExceededError, attempt: Attempt) => Effect.Effect<E>)
    | undefined
}): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  Effect.gen(function*() {
    const { config, requests } = options
    const workerId = config?.workerId ?? defaultWorkerId()
    const deadLetters = config?.deadLetters
    const timeout = (yield* Options.decoder(options.label, configFields)({ config })).config?.timeout
    const clock: Clock.Clock = yield* Effect.clock
    type Msg = Message<Body, Res>
    // `MainLoop.execute`, `EvalLoop.execute`: a child of the worker's `MailboxWorker.handle`, the parent of
    // the work's own spans (tool calls); only with an exporting tracer, like the worker's span.
    // Made by the worker's fiber as the message starts (`MailboxWorker` calls `handle` then): its tracer is read
    // there, in line, at no cost (see `start`).
    const executeSpan = perMessage(`${options.label.split(".")[0]}.execute`, {
      attributes: { loop: options.name },
      captureStackTrace: false
    })

    // A trace the request names itself wins; else the one its message crossed the mailbox in (the sender's span).
    // A `runId` names an attempt in logs, replies and traces; unique, not secret: a random UUID's first 24 hex
    // digits (drawn again every 2^32 attempts) and the loop's count, rather than a fresh UUID per message.
    let runPrefix = ""
    let runCount = 0
    const nextRunId = (): string => {
      if (runCount % runIdSpan === 0) runPrefix = Crypto.randomUUID().slice(0, 24)
      return runPrefix + (runCount++ % runIdSpan).toString(16).padStart(12, "0")
    }
    const runContextOf = (message: Msg): RunContext => {
      const crossed = message.body.traceId === undefined && message.traceparent !== undefined
        ? idsOf(message.traceparent)
        : undefined
      return {
        workerId,
        runId: nextRunId(),
        requestId: message.body.requestId,
        attempt: message.deliveryCount,
        traceId: crossed?.traceId ?? message.body.traceId,
        spanId: crossed?.spanId ?? message.body.spanId
      }
    }
    // The attempt in flight, for its reply: a loop handles one message at a time and settles it
    // (onSuccess / onFailure) before it starts the next.
    let current: (Outcome & { readonly message: Msg }) | undefined
    const outcomeOf = (message: Msg): Outcome =>
      current?.message === message
        ? current
        : { runContext: runContextOf(message), startedAt: monotonicMillis(clock) }

    const replyAndAck = (message: Msg, reply: Res) =>
      SettleFailure.replyThenAck(message, reply, DeadLetter.backoff(message.deliveryCount))

    /**
     * Dead-letters a request: the letter is stored while the request stays leased (`lease.keep`: however slow
     * the dead-letter store, up to its limit, the request does not come back meanwhile to be dead-lettered
     * again), then the error reply and the acknowledgement go in one lease-checked step, as on every other
     * path, retried under the lease while the store or the reply queue fails for a moment — so a dead-lettered
     * request is stored once, answered once and leaves the queue once. A letter that cannot be stored sends
     * the request back with backoff instead.
     */
    const deadLetter = (
      queue: DeadLetter.DeadLetterQueue<Body>,
      message: Msg,
      error: Errors.ErrorInfo,
      lease: MailboxWorker.HeldLease
    ) =>
      Effect.gen(function*() {
        const letter: DeadLetter.DeadLetter<Body> = {
          messageId: message.id,
          body: message.body,
          sourceMailbox: requests.name,
          deliveryCount: message.deliveryCount,
          lastError: error.message,
          lastErrorTag: error.tag,
          enqueuedAt: message.enqueuedAt,
          deadLetteredAt: yield* DateTime.now,
          requestId: message.body.requestId,
          replyTo: Option.getOrUndefined(message.replyTo),
          traceId: message.body.traceId ?? idsOf(message.traceparent)?.traceId,
          ...(message.key === undefined ? {} : { key: message.key }),
          ...(message.priority === undefined ? {} : { priority: message.priority })
        }
        const stored = yield* Effect.either(lease.keep(queue.mailbox.send(letter)))
        if (stored._tag === "Left") {
          yield* Effect.logError("Dead letter could not be stored; the request goes back to the queue", stored.left)
          return yield* SettleFailure.logSettleFailure("nack after a failed dead letter")(
            message.nack(DeadLetter.backoff(message.deliveryCount))
          )
        }
        yield* Journal.keep(message) // the operator reads how far the run got beside the letter
        yield* Metric.increment(deadLettered)
        yield* Effect.logWarning(
          `Request dead-lettered to "${queue.mailbox.name}" after ${message.deliveryCount} deliveries`
        )
        const acknowledge = SettleFailure.logSettleFailure("acknowledge of a dead-lettered request")(
          message.acknowledge
        )
        if (Option.isNone(message.replyTo)) return yield* acknowledge
        // The requester hears about it with the acknowledgement, in one step (a delivery that lost its lease sends
        // no reply). Its letter is stored: a store that fails for a moment, or a full reply queue, is retried here,
        // under the lease, rather than sending the request back to run again.
        const answered = yield* Effect.either(lease.keep(Effect.retry(
          message.replyAndAcknowledge(options.failure(message, error, outcomeOf(message))),
          { schedule: replyRetry, while: (failed) => transientReply.has(failed._tag) }
        )))
        if (answered._tag === "Right") return
        const failed = answered.left
        switch (failed._tag) {
          case "ReceiptHandleExpiredError":
            // Another delivery holds the request (it will run and be dead-lettered or answered there).
            return yield* Effect.logWarning(
              "Error reply for a dead letter not sent: this delivery lost its lease",
              failed
            )
          case "MailboxConnectionError":
          case "TimeoutException":
          case "MailboxFullError":
            // Still failing: the request comes back when its lease ends (or after the backoff), to be answered
            // then; a SQL dead-letter table keeps one letter per message.
            yield* Effect.logError("Error reply for a dead letter could not be stored; the request comes back", failed)
            return failed._tag === "MailboxFullError"
              ? yield* SettleFailure.logSettleFailure("nack after a failed error reply")(
                message.nack(DeadLetter.backoff(message.deliveryCount))
              )
              : undefined
          default:
            // A reply that can never be sent (no such queue, a closed one, an unencodable body) must not undo the
            // dead letter: the request is acknowledged without it.
            return yield* Effect.zipRight(
              Effect.logWarning("Error reply for a dead letter failed", failed),
              acknowledge
            )
        }
      })

    const onFailure = (
      message: Msg,
      cause: Cause.Cause<E | Deadline.DeadlineExceededError>,
      lease: MailboxWorker.HeldLease
    ) =>
      Effect.gen(function*() {
        const error = Option.match(Cause.failureOption(cause), {
          onNone: () => ({ tag: "Defect", message: Cause.pretty(cause) }),
          onSome: Errors.describe
        })
        yield* Effect.logWarning(`Request ${message.body.requestId} failed: ${error.tag}: ${error.message}`)
        if (deadLetters === undefined) {
          return yield* replyAndAck(message, options.failure(message, error, outcomeOf(message)))
        }
        if (DeadLetter.decide(deadLetters.policy, message.deliveryCount, error.tag) === "dead-letter") {
          return yield* deadLetter(deadLetters, message, error, lease)
        }
        yield* SettleFailure.logSettleFailure("nack with backoff")(
          message.nack(DeadLetter.backoff(message.deliveryCount))
        )
      })

    const { onDeadline } = options
    // Once per message, so chains rather than generators, and no closures made per message (`tsx` names
    // every one); the optional steps cost only when used.
    const start = (
      message: Msg,
      heartbeat: Heartbeat.Heartbeat,
      budgetTracker: Budget.BudgetTracker | undefined,
      fallback: Deadline.Deadline | undefined
    ): Effect.Effect<Out, E | Deadline.DeadlineExceededError, R> => {
      // Not suspended: the worker calls `handle` when the message starts, and a throwing `execute` is a defect there.
      const body = message.body
      const runContext = runContextOf(message)
      current = { message, runContext, startedAt: monotonicMillis(clock) }
      // The request's own budget and deadline override the loop's config. Most requests carry neither.
      const own = body.deadline ?? fallback
      const budgeted = (body.budget ?? config?.budget)?.deadline
      const deadline = budgeted === undefined ? own : Deadline.earliest(own, budgeted)
      // The journal is made when the work first asks for it: a handler that never journals pays nothing for it.
      // An own enumerable accessor, so a spread copy of the attempt (`EvalLoop`'s) carries it.
      let journal: Journal.Journal | undefined | null = null
      const attempt: Attempt = {
        heartbeat,
        deadline,
        budgetTracker,
        runContext,
        get journal() {
          return journal === null ? (journal = Journal.forDelivery(message, body.requestId)) : journal
        }
      }
      const fiber = Fiber.getCurrentFiber()
      const untraced = fiber._tag === "Some" && fiber.value.currentTracer === defaultTracer
      const work = untraced ? options.execute(body, attempt) : executeSpan(options.execute(body, attempt))
      if (deadline === undefined) return work
      const bounded = Deadline.within(work, deadline)
      return onDeadline === undefined
        ? bounded
        : Effect.catchAll(bounded, (error) =>
          error instanceof Deadline.DeadlineExceededError
            ? Effect.flatMap(onDeadline(error, attempt), Effect.fail)
            : Effect.fail(error))
    }
    const withFallback = (message: Msg, heartbeat: Heartbeat.Heartbeat, budgetTracker?: Budget.BudgetTracker) =>
      message.body.deadline === undefined && timeout !== undefined
        ? Effect.flatMap(
          Effect.orDie(Deadline.after(timeout)), // cannot fail: 1 s..7 days, checked at construction
          (fallback) => start(message, heartbeat, budgetTracker, fallback)
        )
        : start(message, heartbeat, budgetTracker, undefined)
    const handle = (message: Msg, heartbeat: Heartbeat.Heartbeat) => {
      const budget = message.body.budget ?? config?.budget
      return budget === undefined
        ? withFallback(message, heartbeat)
        : Effect.flatMap(Budget.makeTracker(budget), (tracker) => withFallback(message, heartbeat, tracker))
    }

    return yield* MailboxWorker.make<Body, Res, Out, E | Deadline.DeadlineExceededError, R | MailboxResolver>({
      name: options.name,
      mailbox: requests,
      handle,
      annotations: (message) => ({ requestId: message.body.requestId }),
      // A request without `replyTo` needs no reply: none is made. Made at once (the worker calls this when the
      // reply is due, and takes a made one without a step).
      onSuccess: (message, output) =>
        Option.isNone(message.replyTo)
          ? Effect.succeedNone
          : Effect.succeed(Option.some(options.success(message, output, outcomeOf(message)))),
      retryAfter: (message) => DeadLetter.backoff(message.deliveryCount),
      onFailure,
      ...(config?.leaseExtender !== undefined ? { leaseExtender: config.leaseExtender } : {})
    })
  })
