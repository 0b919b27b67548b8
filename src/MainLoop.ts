/**
 * MainLoop: the request/reply worker users deploy.
 *
 * It pulls `MainLoopRequest`s from a mailbox, runs the user's `execute` under
 * the request's deadline (the work is interrupted when it passes) with a
 * heartbeat that keeps the message leased while work happens, replies a
 * `MainLoopResult` to the request's `replyTo` and acknowledges. A failure
 * becomes an error result, or, with a dead-letter queue, a retry with backoff
 * until the policy dead-letters it. Nothing is lost on the way: a reply that
 * cannot be sent nacks the request, a dead letter that cannot be stored
 * nacks it too, and a handle that expired on ack is only logged.
 *
 * `make` captures its environment (the services `execute` needs and the
 * `MailboxResolver` for replies). `layer` runs the loop for the layer's
 * lifetime; closing the layer's scope (SIGTERM under `NodeRuntime.runMain`)
 * is a graceful shutdown.
 */
import * as Cause from "effect/Cause"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { randomUUID } from "node:crypto"
import { hostname } from "node:os"
import * as Budget from "./Budget.js"
import * as DeadLetter from "./DeadLetter.js"
import * as Deadline from "./Deadline.js"
import type * as Heartbeat from "./Heartbeat.js"
import { DurationFromInput } from "./internal/duration.js"
import { counter } from "./internal/metrics.js"
import type { Mailbox, MailboxResolver, Message } from "./Mailbox.js"
import * as MailboxWorker from "./MailboxWorker.js"
import type * as Prompt from "./Prompt.js"
import type { PromptEvaluationError, PromptResponse, ProviderAdapter } from "./ProviderAdapter.js"
import * as Session from "./Session.js"

/** A unit of work for the loop. */
export interface MainLoopRequest<Req> {
  readonly requestId: string
  readonly request: Req
  /** The work is interrupted when this passes. */
  readonly deadline?: Deadline.Deadline | undefined
  /** Token and deadline limits for the work; a tracker reaches `execute`. */
  readonly budget?: Budget.Budget | undefined
  readonly traceId?: string | undefined
  readonly spanId?: string | undefined
}

/** Makes a request with a fresh `requestId` unless one is given. */
export const request = <Req>(
  body: Req,
  options?: Omit<Partial<MainLoopRequest<Req>>, "request">
): MainLoopRequest<Req> => ({ ...options, requestId: options?.requestId ?? randomUUID(), request: body })

/** Who ran an attempt: stable worker id, fresh run id per attempt, attempt = delivery count. */
export interface RunContext {
  readonly workerId: string
  readonly runId: string
  readonly requestId: string
  readonly attempt: number
  readonly traceId?: string | undefined
  readonly spanId?: string | undefined
}

/** The reply to a request: an output or an error, never both. */
export class MainLoopResult<Out> {
  readonly requestId: string
  readonly output: Out | undefined
  readonly error: DeadLetter.ErrorInfo | undefined
  readonly runContext: RunContext
  readonly completedAt: DateTime.Utc
  constructor(fields: {
    readonly requestId: string
    readonly output?: Out | undefined
    readonly error?: DeadLetter.ErrorInfo | undefined
    readonly runContext: RunContext
    readonly completedAt: DateTime.Utc
  }) {
    this.requestId = fields.requestId
    this.output = fields.output
    this.error = fields.error
    this.runContext = fields.runContext
    this.completedAt = fields.completedAt
  }
  get success(): boolean {
    return this.error === undefined
  }
}

/** What `execute` receives besides the request. */
export interface ExecuteContext {
  readonly heartbeat: Heartbeat.Heartbeat
  readonly deadline: Deadline.Deadline | undefined
  readonly budgetTracker: Budget.BudgetTracker | undefined
  readonly runContext: RunContext
}

/**
 * The stored form of `MainLoopRequest<Req>` for a durable mailbox
 * (`MailboxSql.make({ schema: MainLoop.requestSchema(MyRequest) })`).
 */
export const requestSchema = <Req, I>(
  request: Schema.Schema<Req, I, never>
): Schema.Schema<MainLoopRequest<Req>, unknown> =>
  Schema.Struct({
    requestId: Schema.String,
    request,
    deadline: Schema.optional(Deadline.Deadline),
    budget: Schema.optional(Budget.Budget),
    traceId: Schema.optional(Schema.String),
    spanId: Schema.optional(Schema.String)
  }) as unknown as Schema.Schema<MainLoopRequest<Req>, unknown>

const ErrorInfoSchema = Schema.Struct({ tag: Schema.String, message: Schema.String })
const RunContextSchema = Schema.Struct({
  workerId: Schema.String,
  runId: Schema.String,
  requestId: Schema.String,
  attempt: Schema.Number,
  traceId: Schema.optional(Schema.String),
  spanId: Schema.optional(Schema.String)
})

/**
 * The stored form of `MainLoopResult<Out>`, for a durable reply mailbox (and the requests' `replySchema`).
 * Decoding checks every field; encoding builds the envelope by hand around `output`'s own encoding, since
 * a reply is encoded once per request and a generic struct encoding of it costs more than the loop's
 * other per-message work together (the two agree: see the MainLoop tests).
 */
export const resultSchema = <Out, I>(
  output: Schema.Schema<Out, I, never>
): Schema.Schema<MainLoopResult<Out>, unknown> => {
  const Stored = Schema.Struct({
    requestId: Schema.String,
    output: Schema.optional(output),
    error: Schema.optional(ErrorInfoSchema),
    runContext: RunContextSchema,
    completedAt: Schema.DateTimeUtc
  })
  const decodeStored = ParseResult.decodeUnknown(Stored)
  const encodeOutput = ParseResult.encodeUnknown(output)
  const Result = Schema.declare((input): input is MainLoopResult<Out> => input instanceof MainLoopResult)
  return Schema.transformOrFail(Schema.Unknown, Result, {
    strict: true,
    decode: (stored, options) =>
      ParseResult.map(
        decodeStored(stored, options),
        (fields) => new MainLoopResult<Out>(fields as ConstructorParameters<typeof MainLoopResult<Out>>[0])
      ),
    encode: (result, options) => {
      const { runContext } = result
      const envelope = (encodedOutput: unknown) => ({
        requestId: result.requestId,
        ...(result.output === undefined ? {} : { output: encodedOutput }),
        ...(result.error === undefined ? {} : { error: { tag: result.error.tag, message: result.error.message } }),
        runContext: {
          workerId: runContext.workerId,
          runId: runContext.runId,
          requestId: runContext.requestId,
          attempt: runContext.attempt,
          ...(runContext.traceId === undefined ? {} : { traceId: runContext.traceId }),
          ...(runContext.spanId === undefined ? {} : { spanId: runContext.spanId })
        },
        completedAt: DateTime.formatIso(result.completedAt)
      })
      return result.output === undefined
        ? ParseResult.succeed(envelope(undefined))
        : ParseResult.map(encodeOutput(result.output, options), envelope)
    }
  }) as unknown as Schema.Schema<MainLoopResult<Out>, unknown>
}

/** Options of the loop. */
export interface MainLoopConfig<Req> {
  /** Stable id of this worker (default `host-pid`). */
  readonly workerId?: string | undefined
  readonly leaseExtender?: MailboxWorker.Options<never, never, never, never, never>["leaseExtender"]
  /** Dead-letter failed requests by this policy instead of replying an error at once. */
  readonly deadLetters?: DeadLetter.DeadLetterQueue<MainLoopRequest<Req>> | undefined
  /** Time limit for a request that carries no deadline, counted from when its execution starts. */
  readonly timeout?: Duration.DurationInput | undefined
  /** Budget for a request that carries none (the request's own budget wins). */
  readonly budget?: Budget.Budget | undefined
}

const RequestTimeout = DurationFromInput.pipe(
  Schema.filter((d) => Duration.greaterThanOrEqualTo(d, Duration.seconds(1)) || "timeout must be at least 1 second")
).annotations({ identifier: "timeout" })

/** Requests dead-lettered by a MainLoop. */
export const deadLettered = counter("leasehold_messages_dead_lettered_total", "Messages moved to a dead-letter queue")

/** The default worker id: `host-pid`. */
export const defaultWorkerId = (): string => `${hostname()}-${process.pid}`

/** Makes a MainLoop over `requests`; bad config fails with a readable `ParseError`. */
export const make = <Req, Out, E, R>(options: {
  readonly name?: string
  readonly requests: Mailbox<MainLoopRequest<Req>, MainLoopResult<Out>>
  readonly execute: (request: Req, context: ExecuteContext) => Effect.Effect<Out, E, R>
  readonly config?: MainLoopConfig<Req>
}): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  Effect.gen(function*() {
    const { requests } = options
    const workerId = options.config?.workerId ?? defaultWorkerId()
    const deadLetters = options.config?.deadLetters
    const timeout = options.config?.timeout === undefined
      ? undefined
      : yield* Schema.decodeUnknown(RequestTimeout)(options.config.timeout)
    type Msg = Message<MainLoopRequest<Req>, MainLoopResult<Out>>

    const runContextOf = (message: Msg): RunContext => ({
      workerId,
      runId: randomUUID(),
      requestId: message.body.requestId,
      attempt: message.deliveryCount,
      traceId: message.body.traceId,
      spanId: message.body.spanId
    })
    // The run context of the attempt in flight, for its result: a loop handles one message at a time and
    // settles it (onSuccess / onFailure) before it starts the next.
    let current: { readonly message: Msg; readonly runContext: RunContext } | undefined

    const clock = yield* Effect.clock
    const unsafeResult = (message: Msg, outcome: { output?: Out; error?: DeadLetter.ErrorInfo }) =>
      new MainLoopResult<Out>({
        requestId: message.body.requestId,
        ...outcome,
        runContext: current?.message === message ? current.runContext : runContextOf(message),
        completedAt: DateTime.unsafeMake(clock.unsafeCurrentTimeMillis())
      })
    const result = (message: Msg, outcome: { output?: Out; error?: DeadLetter.ErrorInfo }) =>
      Effect.sync(() => unsafeResult(message, outcome))

    const replyAndAck = (message: Msg, reply: MainLoopResult<Out>) =>
      MailboxWorker.replyThenAck(message, reply, DeadLetter.backoff(message.deliveryCount))

    const deadLetter = (
      queue: DeadLetter.DeadLetterQueue<MainLoopRequest<Req>>,
      message: Msg,
      error: DeadLetter.ErrorInfo
    ) =>
      Effect.gen(function*() {
        const letter: DeadLetter.DeadLetter<MainLoopRequest<Req>> = {
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
          traceId: message.body.traceId
        }
        const stored = yield* Effect.either(queue.mailbox.send(letter))
        if (stored._tag === "Left") {
          yield* Effect.logError("Dead letter could not be stored; the request goes back to the queue", stored.left)
          return yield* MailboxWorker.logSettleFailure("nack after a failed dead letter")(
            message.nack(DeadLetter.backoff(message.deliveryCount))
          )
        }
        yield* Metric.increment(deadLettered)
        yield* Effect.logWarning(
          `Request dead-lettered to "${queue.mailbox.name}" after ${message.deliveryCount} deliveries`
        )
        // The requester hears about it, but a failed error reply must not undo the dead letter.
        if (Option.isSome(message.replyTo)) {
          const reply = yield* result(message, { error })
          yield* Effect.either(message.reply(reply)).pipe(
            Effect.tap((sent) =>
              sent._tag === "Left" ? Effect.logWarning("Error reply for a dead letter failed", sent.left) : Effect.void
            )
          )
        }
        yield* MailboxWorker.logSettleFailure("acknowledge of a dead-lettered request")(message.acknowledge)
      })

    const onFailure = (
      message: Msg,
      cause: Cause.Cause<E | Deadline.DeadlineExceededError | Budget.BudgetExceededError>
    ) =>
      Effect.gen(function*() {
        const error = Option.match(Cause.failureOption(cause), {
          onNone: () => ({ tag: "Defect", message: Cause.pretty(cause) }),
          onSome: DeadLetter.describe
        })
        yield* Effect.logWarning(`Request ${message.body.requestId} failed: ${error.tag}: ${error.message}`)
        if (deadLetters === undefined) {
          return yield* replyAndAck(message, yield* result(message, { error }))
        }
        if (DeadLetter.decide(deadLetters.policy, message.deliveryCount, error.tag) === "dead-letter") {
          return yield* deadLetter(deadLetters, message, error)
        }
        yield* MailboxWorker.logSettleFailure("nack with backoff")(
          message.nack(DeadLetter.backoff(message.deliveryCount))
        )
      })

    // Once per message, so chains rather than generators, and no closures made per message (`tsx` names
    // every one); the optional steps cost only when used.
    const start = (
      message: Msg,
      heartbeat: Heartbeat.Heartbeat,
      budgetTracker: Budget.BudgetTracker | undefined,
      fallback: Deadline.Deadline | undefined
    ) => {
      // Not suspended: the worker calls `handle` when the message starts, and a throwing `execute` is a defect there.
      const body = message.body
      const runContext = runContextOf(message)
      current = { message, runContext }
      // The request's own budget and deadline override the loop's config.
      const deadline = Deadline.earliest(body.deadline ?? fallback, (body.budget ?? options.config?.budget)?.deadline)
      const work = options.execute(body.request, { heartbeat, deadline, budgetTracker, runContext })
      return deadline === undefined ? work : Deadline.within(work, deadline)
    }
    const withFallback = (message: Msg, heartbeat: Heartbeat.Heartbeat, budgetTracker?: Budget.BudgetTracker) =>
      message.body.deadline === undefined && timeout !== undefined
        ? Effect.flatMap(
          Effect.orDie(Deadline.after(timeout)), // ≥ 1 s, checked at construction: cannot be refused
          (fallback) => start(message, heartbeat, budgetTracker, fallback)
        )
        : start(message, heartbeat, budgetTracker, undefined)
    const handle = (message: Msg, heartbeat: Heartbeat.Heartbeat) => {
      const budget = message.body.budget ?? options.config?.budget
      return budget === undefined
        ? withFallback(message, heartbeat)
        : Effect.flatMap(Budget.makeTracker(budget), (tracker) => withFallback(message, heartbeat, tracker))
    }

    return yield* MailboxWorker.make<
      MainLoopRequest<Req>,
      MainLoopResult<Out>,
      Out,
      E | Deadline.DeadlineExceededError,
      R | MailboxResolver
    >({
      name: options.name ?? `main-loop:${requests.name}`,
      mailbox: requests,
      handle,
      annotations: (message) => ({ requestId: message.body.requestId }),
      onSuccess: (message, output) => Effect.sync(() => Option.some(unsafeResult(message, { output }))),
      retryAfter: (message) => DeadLetter.backoff(message.deliveryCount),
      onFailure,
      ...(options.config?.leaseExtender !== undefined ? { leaseExtender: options.config.leaseExtender } : {})
    })
  })

/**
 * Runs a MainLoop for the lifetime of the layer; closing the layer's scope
 * shuts it down gracefully within `shutdownTimeout` (default 30 s).
 */
export const layer = <Req, Out, E, R>(
  options: Parameters<typeof make<Req, Out, E, R>>[0] & {
    readonly run?: MailboxWorker.RunOptions
    readonly shutdownTimeout?: Duration.DurationInput
  }
): Layer.Layer<never, ParseResult.ParseError, R | MailboxResolver> =>
  Layer.scopedDiscard(
    Effect.gen(function*() {
      const loop = yield* make(options)
      yield* Effect.forkScoped(
        loop.run(options.run).pipe(Effect.catchAllCause((cause) => Effect.logError("MainLoop stopped", cause)))
      )
      // Added after the fork, so it runs before the fork is interrupted: a graceful stop, not an interruption.
      yield* Effect.addFinalizer(() =>
        Effect.flatMap(
          loop.shutdown({ timeout: options.shutdownTimeout ?? Duration.seconds(30) }),
          (clean) =>
            clean ? Effect.logInfo("MainLoop stopped cleanly") : Effect.logWarning("MainLoop shutdown timed out")
        )
      )
    })
  )

/**
 * A MainLoop whose `execute` is an agent: `prepare` turns the request into a
 * prompt, the adapter evaluates it with the request's deadline, budget
 * tracker and the loop's heartbeat (so tool beats keep the request leased),
 * and `finalize` (default: the output) makes the reply.
 */
export const agent = <Req, O, Out = O, E = never, R = never>(options: {
  readonly name?: string
  readonly requests: Mailbox<MainLoopRequest<Req>, MainLoopResult<Out>>
  readonly adapter: ProviderAdapter["Type"]
  readonly prepare: (request: Req, context: ExecuteContext) => Effect.Effect<Prompt.Prompt<O>, E, R>
  readonly finalize?: (response: PromptResponse<O>, session: Session.Session) => Effect.Effect<Out, E, R>
  readonly config?: MainLoopConfig<Req>
}): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  make<Req, Out, E | PromptEvaluationError, R>({
    ...(options.name !== undefined ? { name: options.name } : {}),
    requests: options.requests,
    ...(options.config !== undefined ? { config: options.config } : {}),
    execute: (request, context) =>
      Effect.gen(function*() {
        const prompt = yield* options.prepare(request, context)
        const session = yield* Session.make
        const response = yield* options.adapter.evaluate(prompt, {
          session,
          deadline: context.deadline,
          budgetTracker: context.budgetTracker,
          heartbeat: context.heartbeat,
          runContext: context.runContext
        })
        return options.finalize === undefined
          ? response.output as unknown as Out
          : yield* options.finalize(response, session)
      })
  })
