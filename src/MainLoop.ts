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
import type * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Crypto from "node:crypto"
import * as Budget from "./Budget.js"
import * as Deadline from "./Deadline.js"
import type * as Errors from "./Errors.js"
import { Answering } from "./internal/agent.js"
import * as RequestLoop from "./internal/loops/requestLoop.js"
import * as Scoped from "./internal/loops/scoped.js"
import type * as Journal from "./Journal.js"
import type { Mailbox, MailboxResolver, Message } from "./Mailbox.js"
import * as MailboxWorker from "./MailboxWorker.js"
import type * as Prompt from "./Prompt.js"
import { PromptEvaluationError, type PromptResponse, type ProviderAdapter } from "./ProviderAdapter.js"
import * as RunContextModule from "./RunContext.js"
import * as Session from "./Session.js"

/**
 * A unit of work for the loop.
 *
 * @category models
 */
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

/**
 * Makes a request with a fresh `requestId` unless one is given.
 *
 * @category constructors
 */
export const request = <Req>(
  body: Req,
  options?: Omit<Partial<MainLoopRequest<Req>>, "request">
): MainLoopRequest<Req> => ({
  ...options,
  // `toLowerCase` (a no-op on a UUID) flattens the concatenated string Node builds, several times the flat size.
  requestId: options?.requestId ?? Crypto.randomUUID().toLowerCase(),
  request: body
})

/**
 * Who ran an attempt (the leaf module `RunContext` defines it; re-exported here for the loop's users).
 *
 * @category models
 */
export type RunContext = RunContextModule.RunContext

/**
 * The reply to a request: an output or an error, never both.
 *
 * @category models
 */
export class MainLoopResult<Out> {
  readonly requestId: string
  readonly output: Out | undefined
  readonly error: Errors.ErrorInfo | undefined
  readonly runContext: RunContext
  readonly completedAt: DateTime.Utc
  constructor(fields: {
    readonly requestId: string
    readonly output?: Out | undefined
    readonly error?: Errors.ErrorInfo | undefined
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

/**
 * What `execute` receives besides the request: the heartbeat, the deadline, a budget tracker, the run context.
 *
 * @category models
 */
export type ExecuteContext = RequestLoop.Attempt

/**
 * The stored form of `MainLoopRequest<Req>` for a durable mailbox
 * (`MailboxSql.make({ schema: MainLoop.requestSchema(MyRequest) })`).
 *
 * @category schemas
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

const ErrorInfoSchema = Schema.Struct({
  tag: Schema.String,
  message: Schema.String,
  details: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
})

/** The JSON form of a run context, without absent fields (what `RunContextSchema` decodes). */
const encodeRunContext = (runContext: RunContext): Record<string, unknown> => ({
  workerId: runContext.workerId,
  runId: runContext.runId,
  requestId: runContext.requestId,
  attempt: runContext.attempt,
  ...(runContext.traceId === undefined ? {} : { traceId: runContext.traceId }),
  ...(runContext.spanId === undefined ? {} : { spanId: runContext.spanId })
})

const encodeError = (error: Errors.ErrorInfo) =>
  error.details === undefined
    ? { tag: error.tag, message: error.message }
    : { tag: error.tag, message: error.message, details: error.details }

/**
 * The stored form of `MainLoopResult<Out>`, for a durable reply mailbox (and the requests' `replySchema`).
 * Decoding checks every field; encoding builds the envelope by hand around `output`'s own encoding, since
 * a reply is encoded once per request and a generic struct encoding of it costs more than the loop's
 * other per-message work together (the two agree: see the MainLoop tests).
 *
 * @category schemas
 */
export const resultSchema = <Out, I>(
  output: Schema.Schema<Out, I, never>
): Schema.Schema<MainLoopResult<Out>, unknown> => {
  const Stored = Schema.Struct({
    requestId: Schema.String,
    output: Schema.optional(output),
    error: Schema.optional(ErrorInfoSchema),
    runContext: RunContextModule.RunContextSchema,
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
      const envelope = (encodedOutput: unknown) => ({
        requestId: result.requestId,
        ...(result.output === undefined ? {} : { output: encodedOutput }),
        ...(result.error === undefined ? {} : { error: encodeError(result.error) }),
        runContext: encodeRunContext(result.runContext),
        completedAt: DateTime.formatIso(result.completedAt)
      })
      return result.output === undefined
        ? ParseResult.succeed(envelope(undefined))
        : ParseResult.map(encodeOutput(result.output, options), envelope)
    }
  }) as unknown as Schema.Schema<MainLoopResult<Out>, unknown>
}

/**
 * Options of the loop: worker id, lease extender, dead letters, a timeout and a budget for requests without.
 *
 * @category models
 */
export type MainLoopConfig<Req> = RequestLoop.Config<MainLoopRequest<Req>>

/**
 * Requests dead-lettered by a MainLoop or an EvalLoop.
 *
 * @category metrics
 */
export const deadLettered = RequestLoop.deadLettered

/**
 * The default worker id: `host-pid`.
 *
 * @category utils
 */
export const defaultWorkerId = RequestLoop.defaultWorkerId

type Requests<Req, Out> = Mailbox<MainLoopRequest<Req>, MainLoopResult<Out>>

/** The loop's replies: a `MainLoopResult` with the output or the error, and the attempt's run context. */
const replies = <Req, Out>(clock: Clock.Clock) => {
  const result = (
    message: Message<MainLoopRequest<Req>, MainLoopResult<Out>>,
    outcome: RequestLoop.Outcome,
    fields: { readonly output?: Out; readonly error?: Errors.ErrorInfo }
  ) =>
    new MainLoopResult<Out>({
      requestId: message.body.requestId,
      ...fields,
      runContext: outcome.runContext,
      completedAt: DateTime.unsafeMake(clock.unsafeCurrentTimeMillis())
    })
  return {
    success: (message: Message<MainLoopRequest<Req>, MainLoopResult<Out>>, output: Out, outcome: RequestLoop.Outcome) =>
      result(message, outcome, { output }),
    failure: (
      message: Message<MainLoopRequest<Req>, MainLoopResult<Out>>,
      error: Errors.ErrorInfo,
      outcome: RequestLoop.Outcome
    ) => result(message, outcome, { error })
  }
}

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options<Req, Out, E, R> {
  /** The loop's name, in logs and metrics (default `main-loop:<mailbox>`). */
  readonly name?: string | undefined
  readonly requests: Requests<Req, Out>
  /** The work for one request; interrupted when its deadline passes. */
  readonly execute: (request: Req, context: ExecuteContext) => Effect.Effect<Out, E, R>
  readonly config?: MainLoopConfig<Req> | undefined
}

/**
 * Makes a MainLoop over `requests`; bad config fails with a `ParseError` naming it.
 *
 * @category constructors
 */
export const make = <Req, Out, E, R>(
  options: Options<Req, Out, E, R>
): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  Effect.flatMap(Effect.clock, (clock) =>
    RequestLoop.make<MainLoopRequest<Req>, MainLoopResult<Out>, Out, E, R>({
      label: "MainLoop.make",
      name: options.name ?? `main-loop:${options.requests.name}`,
      requests: options.requests,
      config: options.config,
      execute: (body, attempt) => options.execute(body.request, attempt),
      ...replies<Req, Out>(clock)
    }))

/**
 * Options of `layer` besides the loop's: how it runs and how long its graceful stop may take (default 30 s).
 *
 * @category models
 */
export type LayerOptions = MailboxWorker.RunScopedOptions

const decodeLayerOptions = Scoped.decoder("MainLoop.layer")

/**
 * Runs a MainLoop for the lifetime of the layer; closing the layer's scope shuts it down gracefully within
 * `shutdownTimeout` (default 30 s) — then the in-flight request is interrupted and given back. Bad options,
 * the loop's and how it runs, are a `ParseError` naming them when the layer is built. The loop's death is
 * logged at error level and counted; to stop the process on it, run a `LoopGroup` as the main effect.
 *
 * @category layers
 */
export const layer = <Req, Out, E, R>(
  options: Options<Req, Out, E, R> & LayerOptions
): Layer.Layer<never, ParseResult.ParseError, R | MailboxResolver> =>
  Layer.scopedDiscard(
    Effect.flatMap(
      decodeLayerOptions(options),
      (scoped) => Effect.flatMap(make(options), (loop) => Scoped.run(loop, scoped))
    )
  )

/** Where an agent's attempt stands, for a deadline the loop's own timer reports. */
interface AgentProgress {
  stage: "preparing" | "evaluating" | "finalizing"
  promptName: string
  session: Session.Session | undefined
  /** Kept by the inner loop: the model is answering a streamed turn (its first part arrived). */
  answering: boolean
}

/**
 * The phase an evaluation stopped in, from its session (a tool call without its result is a tool running),
 * and the detail to report — worded as the inner loop and the tool executor word it, so the reply reads the
 * same whichever timer noticed the deadline first.
 */
const phaseOf = (
  progress: AgentProgress,
  iso: string
): Effect.Effect<{ readonly phase: Phase; readonly detail: string }> => {
  switch (progress.stage) {
    case "preparing":
      return Effect.succeed({ phase: "preflight", detail: `deadline ${iso} passed while the prompt was prepared` })
    case "finalizing":
      return Effect.succeed({ phase: "response", detail: `deadline ${iso} passed while the response was finalized` })
    case "evaluating":
      return Effect.map(progress.session?.events ?? Effect.succeed([]), (events) => {
        const running = new Map<string, string>()
        for (const event of events) {
          if (event._tag === "ToolCall") running.set(event.callId, event.toolName)
          else if (event._tag === "ToolResult") running.delete(event.callId)
        }
        const tool = [...running.values()].at(-1)
        return tool !== undefined
          ? { phase: "tool", detail: `tool "${tool}" ran out of time: Deadline exceeded at ${iso}` }
          : progress.answering
          ? { phase: "response", detail: `deadline ${iso} passed while the model was answering` }
          : { phase: "request", detail: `deadline ${iso} passed` }
      })
  }
}

type Phase = PromptEvaluationError["phase"]

/**
 * Options of `agent`.
 *
 * @category models
 */
export interface AgentOptions<Req, O, Out = O, E = never, R = never> {
  /** The loop's name, in logs and metrics (default `main-loop:<mailbox>`). */
  readonly name?: string | undefined
  readonly requests: Requests<Req, Out>
  readonly adapter: ProviderAdapter["Type"]
  /** Turns a request into the prompt to evaluate. */
  readonly prepare: (request: Req, context: ExecuteContext) => Effect.Effect<Prompt.Prompt<O>, E, R>
  /** Makes the reply from the evaluation's response (default: its output). */
  readonly finalize?: ((response: PromptResponse<O>, session: Session.Session) => Effect.Effect<Out, E, R>) | undefined
  readonly config?: MainLoopConfig<Req> | undefined
}

/**
 * A MainLoop whose `execute` is an agent: `prepare` turns the request into a
 * prompt, the adapter evaluates it with the request's deadline, budget
 * tracker and the loop's heartbeat (so tool beats keep the request leased),
 * and `finalize` (default: the output) makes the reply. A deadline always
 * ends it as a `PromptEvaluationError` (reason `deadline`) that says where it
 * struck — preparing, waiting for the model, the model answering (a streamed
 * turn whose first part arrived), in a tool, finalizing — with
 * `providerPayload.deadline_expires_at`, whichever timer noticed it first.
 * The evaluation keeps a step journal in the request's mailbox (see
 * `Journal`): a redelivered request resumes from the steps an earlier
 * delivery recorded, and one that diverges from them replies
 * `JournalDivergedError`.
 *
 * @category constructors
 */
export const agent = <Req, O, Out = O, E = never, R = never>(
  options: AgentOptions<Req, O, Out, E, R>
): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> => {
  const attempts = new WeakMap<ExecuteContext, AgentProgress>()
  return Effect.flatMap(
    Effect.clock,
    (clock) =>
      RequestLoop.make<
        MainLoopRequest<Req>,
        MainLoopResult<Out>,
        Out,
        E | PromptEvaluationError | Journal.JournalError,
        R
      >({
        label: "MainLoop.agent",
        name: options.name ?? `main-loop:${options.requests.name}`,
        requests: options.requests,
        config: options.config,
        execute: (body, context) =>
          Effect.gen(function*() {
            const progress: AgentProgress = {
              stage: "preparing",
              promptName: "(not prepared yet)",
              session: undefined,
              answering: false
            }
            attempts.set(context, progress)
            const prompt = yield* options.prepare(body.request, context)
            const session = yield* Session.make
            progress.stage = "evaluating"
            progress.promptName = prompt.name
            progress.session = session
            const response = yield* options.adapter.evaluate(prompt, {
              session,
              deadline: context.deadline,
              budgetTracker: context.budgetTracker,
              heartbeat: context.heartbeat,
              runContext: context.runContext,
              journal: context.journal
            }).pipe(Effect.provideService(Answering, progress))
            progress.stage = "finalizing"
            return options.finalize === undefined
              ? response.output as unknown as Out
              : yield* options.finalize(response, session)
          }),
        onDeadline: (error, context) => {
          const progress = attempts.get(context) ??
            { stage: "preparing", promptName: "(not prepared yet)", session: undefined, answering: false }
          const iso = DateTime.formatIso(error.expiresAt)
          return Effect.map(phaseOf(progress, iso), ({ detail, phase }) =>
            new PromptEvaluationError({
              phase,
              reason: "deadline",
              promptName: progress.promptName,
              detail,
              providerPayload: { deadline_expires_at: iso }
            }))
        },
        ...replies<Req, Out>(clock)
      })
  )
}
