/**
 * InnerLoop: the agentic exchange every adapter shares — ask the model, run
 * the tools it calls, give it the results, ask again, until it answers.
 *
 * An adapter only supplies `complete` (one model turn). The loop beats at
 * every iteration; checks the deadline before each model request (`phase:
 * "request"`; the request itself is interrupted if the deadline passes while
 * it runs) and while finalising (`phase: "response"`); records every turn in
 * the session and checks the budget after it (`reason: "budget"`); and
 * decodes the final answer with the prompt's Schema (`reason: "output"`).
 * Retries of a failed request re-check the deadline before each attempt,
 * and a wait between two attempts ends when the deadline passes.
 *
 * A streaming adapter supplies its turns as streams of parts instead
 * (`{ stream }`): the loop assembles the turn from them (text deltas, tool
 * calls, the usage of the last part) and every part that makes progress beats
 * the heartbeat through `Heartbeat.beatEvery` (at most once per
 * `beatInterval`), so a model that keeps writing keeps its request leased and
 * one that stalls — or sends only empty parts — stops beating. Once the first
 * part has arrived the model is answering: a deadline that passes while it
 * streams stops it with `phase: "response"` (a stream that breaks is a failed
 * request, retried like any other). Only a complete answer is an answer: a
 * stream that ends before its final part (the usage) is a failed response,
 * retried like a broken stream, and the turn ends at that part (nothing after
 * it is read or charged); a usage that is not two non-negative safe integers,
 * streamed or whole, is a failed response too ("unchargeable usage"). A turn is
 * bounded while it streams — past `Journal.maxStepBytes` (UTF-8, as the journal
 * stores it) the stream stops at once and the evaluation fails (`response`,
 * `provider`, `limit_bytes`), not retried — and any turn whose step, as the
 * journal would store it (`Journal.stepBytes`), passes the limit fails the same
 * way before it is recorded.
 *
 * With a journal (`EvaluateOptions.journal`, see `Journal`), the evaluation
 * is a step of it and each model turn and tool call a step inside that: a
 * turn recorded by an earlier delivery is returned without calling the model
 * (its tokens count against the budget again, as they were spent), a
 * completed evaluation returns its recorded outcome, each new step is
 * recorded before the loop goes on, and a request that differs from the
 * recorded one stops the evaluation with `JournalDivergedError`.
 */
import * as Clock from "effect/Clock"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import { randomUUID } from "node:crypto"
import * as Deadline from "./Deadline.js"
import * as Heartbeat from "./Heartbeat.js"
import {
  Answering,
  deadlinePayload,
  digest,
  diverged,
  replayed,
  since,
  toolsAsked,
  unchargeable
} from "./internal/agent.js"
import * as Options_ from "./internal/options.js"
import * as Journal from "./Journal.js"
import type * as Prompt from "./Prompt.js"
import {
  type EvaluateOptions,
  PromptEvaluationError,
  type PromptResponse,
  type ProviderAdapter
} from "./ProviderAdapter.js"
import * as Session from "./Session.js"
import type * as Tool from "./Tool.js"
import * as ToolExecutor from "./ToolExecutor.js"

/**
 * One request to the model: the conversation so far and the tools on offer.
 *
 * @category models
 */
export interface ModelRequest {
  readonly prompt: Prompt.Prompt<unknown>
  readonly messages: ReadonlyArray<Prompt.ChatMessage>
  readonly tools: ReadonlyArray<Tool.Any>
}

/**
 * One model turn: tool calls to run, or (with none) the final text.
 *
 * @category models
 */
export interface ModelTurn {
  readonly text: string
  readonly toolCalls: ReadonlyArray<Prompt.ToolCall>
  readonly usage: Session.Usage
}

/**
 * The model could not be reached or answered nonsense.
 *
 * @category errors
 */
export class ProviderError extends Schema.TaggedError<ProviderError>()("ProviderError", {
  detail: Schema.String,
  /**
   * Where it broke: sending the request (`request`, the default) or in the answer the model was giving
   * (`response`: a stream cut short before its final event, an event too large to parse). Either is retried.
   */
  phase: Schema.optional(Schema.Literal("request", "response"))
}) {
  override get message(): string {
    return this.detail
  }
}

/**
 * One model turn, supplied by an adapter.
 *
 * @category models
 */
export type Complete = (request: ModelRequest) => Effect.Effect<ModelTurn, ProviderError>

/**
 * A piece of a streamed model turn: text as the model writes it, a tool call once its parameters are complete,
 * the turn's token usage (the stream's final part: a stream that ends without one was cut short), or progress
 * that carries nothing the loop keeps. A `Progress` says in `bytes` how much the model wrote in it (a tool
 * call's parameters as they are written, its reasoning): with `bytes > 0` it proves the model is working, beats
 * the heartbeat and counts toward the turn's size; without (metadata, a keep-alive) it does neither. An empty
 * `Text` delta does not beat either: only progress keeps a request leased.
 *
 * @category models
 */
export type TurnPart =
  | { readonly _tag: "Text"; readonly delta: string }
  | { readonly _tag: "ToolCall"; readonly call: Prompt.ToolCall }
  | { readonly _tag: "Usage"; readonly usage: Session.Usage }
  | { readonly _tag: "Progress"; readonly bytes?: number | undefined }

/**
 * One model turn as a stream of parts, supplied by a streaming adapter.
 *
 * @category models
 */
export type CompleteStream = (request: ModelRequest) => Stream.Stream<TurnPart, ProviderError>

/**
 * How an adapter supplies its model turns: whole (`Complete`) or streamed (`{ stream }`).
 *
 * @category models
 */
export type Turns = Complete | { readonly stream: CompleteStream }

/**
 * Options of the loop.
 *
 * @category models
 */
export interface Options {
  /** Retry schedule for failed model requests (none by default). */
  readonly retry?: Schedule.Schedule<unknown, unknown> | undefined
  /** Stop after this many model turns (default 32). */
  readonly maxTurns?: number | undefined
  /** A streamed turn beats the heartbeat at most once per this interval as its parts arrive (default 1 second). */
  readonly beatInterval?: Duration.DurationInput | undefined
}

/** The UTF-8 bytes `value` takes in a journal step (its JSON text; a string without its quotes). */
const stepBytes = (value: unknown): number => {
  const json = JSON.stringify(value) ?? ""
  return Buffer.byteLength(json, "utf8") - (typeof value === "string" ? 2 : 0)
}

/** A streamed turn grew past the step limit: the stream was stopped there (not retried). */
class TurnTooLarge extends Schema.TaggedError<TurnTooLarge>()("TurnTooLarge", { bytes: Schema.Number }) {}

/**
 * A streamed turn as it adds up: what the model wrote so far, whether its final part (the usage) came, and its
 * running size in UTF-8 bytes — the text and tool calls kept, plus what the provider is still assembling (a
 * tool call's parameters being written, counted until the call arrives whole).
 */
class Assembly {
  text = ""
  toolCalls: Array<Prompt.ToolCall> = []
  usage: Session.Usage | undefined = undefined
  private kept = 0
  private pending = 0

  /**
   * Adds `part`; whether it made progress (it beats), or `TurnTooLarge` the moment the turn passes `limit`, or a
   * `ProviderError` (`response`) for a usage that cannot be charged.
   */
  add(part: TurnPart, limit: number): Effect.Effect<boolean, TurnTooLarge | ProviderError> {
    let progress: boolean
    switch (part._tag) {
      case "Text":
        progress = part.delta.length > 0
        if (progress) {
          this.kept += stepBytes(part.delta)
          this.text += part.delta
        }
        break
      case "ToolCall":
        progress = true
        this.kept += stepBytes(part.call)
        this.pending = 0
        this.toolCalls.push(part.call)
        break
      case "Usage": {
        const wrong = unchargeable(part.usage)
        if (wrong !== undefined) return Effect.fail(new ProviderError({ phase: "response", detail: wrong }))
        progress = true
        this.usage = part.usage
        break
      }
      case "Progress": {
        const bytes = part.bytes ?? 0
        progress = Number.isFinite(bytes) && bytes > 0
        if (progress) this.pending += bytes
        break
      }
    }
    const size = this.kept + this.pending
    return size > limit ? Effect.fail(new TurnTooLarge({ bytes: size })) : Effect.succeed(progress)
  }
}

/**
 * Runs a streamed turn to its end: `onPart` hears of each part as it arrives, and the current heartbeat beats
 * on the parts that make progress (at most once per `interval`). A turn that grows past `limit` stops the
 * stream there (`TurnTooLarge`); one that ends without its final part (the usage) was cut short. The turn ends
 * at its first usage part: nothing after it is read, kept or charged.
 */
const collect = (
  parts: Stream.Stream<TurnPart, ProviderError>,
  interval: Duration.DurationInput,
  onPart: Effect.Effect<void>,
  limit: number
): Effect.Effect<ModelTurn, ProviderError | TurnTooLarge> =>
  Effect.suspend(() => {
    const turn = new Assembly()
    return parts.pipe(
      Stream.takeUntil((part) => part._tag === "Usage"),
      Stream.tap(() => onPart),
      Stream.mapEffect((part) => turn.add(part, limit)),
      Stream.filter((progress) => progress),
      Heartbeat.beatEvery(interval),
      Stream.runDrain,
      Effect.flatMap(() =>
        turn.usage === undefined
          ? Effect.fail(
            new ProviderError({
              phase: "response",
              detail: "the stream ended before its final part (the turn's usage): the answer was cut short"
            })
          )
          : Effect.succeed({ text: turn.text, toolCalls: turn.toolCalls, usage: turn.usage })
      )
    )
  })

/**
 * Runs `prompt` to its final output.
 *
 * @category utils
 */
export const run = <Out>(
  adapter: ProviderAdapter["Type"],
  turns: Turns,
  prompt: Prompt.Prompt<Out>,
  options: EvaluateOptions,
  loopOptions?: Options
): Effect.Effect<PromptResponse<Out>, PromptEvaluationError | Journal.JournalError> =>
  Effect.gen(function*() {
    const fail = (
      phase: PromptEvaluationError["phase"],
      reason: PromptEvaluationError["reason"],
      detail: string,
      providerPayload?: Record<string, unknown>
    ) =>
      new PromptEvaluationError({
        phase,
        reason,
        promptName: prompt.name,
        detail,
        ...(providerPayload !== undefined ? { providerPayload } : {})
      })

    // Preflight: a deadline object can come from deserialisation or an untrusted caller.
    if (options.deadline !== undefined && (yield* Deadline.isExpired(options.deadline))) {
      return yield* fail("preflight", "deadline", "the deadline had already passed", deadlinePayload(options.deadline))
    }
    const deadline = Deadline.earliest(options.deadline, Option.getOrUndefined(yield* Deadline.current))
    const deadlineFailure = (phase: "request" | "response", detail = `deadline ${deadline?.iso} passed`) =>
      fail(phase, "deadline", detail, deadlinePayload(deadline))
    const checkpoint = (phase: "request" | "response") =>
      deadline !== undefined
        ? Effect.flatMap(
          Deadline.isExpired(deadline),
          (expired) => expired ? Effect.fail(deadlineFailure(phase)) : Effect.void
        )
        : Effect.void
    // The heartbeat given, else the current one (the worker's): the tools' `context.heartbeat` and their
    // `Heartbeat.beat` are the same heartbeat.
    const heartbeat = options.heartbeat ?? Option.getOrUndefined(yield* Heartbeat.current)
    const beat = heartbeat?.beat ?? Effect.void
    const evaluationId = randomUUID()
    // The evaluation is a step of the caller's journal; its turns and tools are the steps inside it.
    const parent = options.journal ?? Journal.unrecorded(options.runContext?.requestId)
    const evaluationKey = parent.nextKey()
    const steps = parent.within(evaluationKey)
    // The tools as offered (name, description, parameters' JSON Schema): a changed tool diverges. Only a journal
    // compares or stores the digests, so a run without one does not pay for the schemas.
    const toolsOffered = options.journal === undefined ? [] : toolsAsked(prompt.tools)
    const evaluationAsked = digest(JSON.stringify([prompt.name, prompt.instructions, prompt.messages, toolsOffered]))
    const context: Tool.ToolContext = {
      deadline,
      heartbeat,
      beat,
      runContext: options.runContext,
      prompt: prompt as Prompt.Prompt<unknown>,
      session: options.session,
      budgetTracker: options.budgetTracker,
      adapter,
      journal: undefined, // each tool call gets its own scope (ToolExecutor)
      idempotencyKey: "",
      fencingToken: options.runContext?.attempt
    }
    let usage: Session.Usage = { inputTokens: 0, outputTokens: 0 }
    /** Adds a turn's tokens (live or replayed: they were spent) and checks the budget. */
    const spend = (spent: Session.Usage) =>
      Effect.suspend(() => {
        usage = {
          inputTokens: usage.inputTokens + spent.inputTokens,
          outputTokens: usage.outputTokens + spent.outputTokens
        }
        const tracker = options.budgetTracker
        if (tracker === undefined) return Effect.void
        return Effect.zipRight(
          tracker.record(evaluationId, usage).pipe(
            Effect.mapError((error) =>
              fail("response", "provider", `invalid usage from the provider: ${error.message}`)
            )
          ),
          tracker.check.pipe(
            Effect.mapError((error) => fail("response", "budget", error.message, { dimension: error.dimension }))
          )
        )
      })

    // Completed on an earlier delivery (it died before its reply): the recorded outcome, decoded again.
    const done = yield* parent.recorded(evaluationKey)
    if (done !== undefined) {
      if (done._tag !== "Evaluation" || done.asked !== evaluationAsked) {
        return yield* diverged(parent.requestId, evaluationKey, done, `the evaluation of prompt "${prompt.name}"`)
      }
      yield* options.session.record({
        _tag: "ProviderCall",
        promptName: prompt.name,
        at: yield* Clock.currentTimeMillis,
        durationMs: done.durationMs,
        usage: done.usage,
        replayed: true
      })
      yield* replayed
      yield* spend(done.usage)
      const output = yield* decodeOutput(prompt, done.text, fail)
      return { output, text: done.text, usage }
    }
    const evaluationStarted = yield* Clock.currentTimeMillis

    // A streamed turn runs under the heartbeat (its parts beat it) and notes while the model is answering: a
    // deadline that passes then stops the response, not the request. A broken stream is no longer answering
    // (a wait before its retry is part of the request), nor is a complete one. The note is `MainLoop.agent`'s
    // when it gave one, so that its own deadline timer, if it fires first, reports the same phase.
    const progress = Option.getOrElse(yield* Effect.serviceOption(Answering), () => ({ answering: false }))
    const startAnswering = Effect.sync(() => {
      progress.answering = true
    })
    const stopAnswering = Effect.sync(() => {
      progress.answering = false
    })
    const beatInterval = loopOptions?.beatInterval ?? "1 second"
    const complete = (request: ModelRequest): Effect.Effect<ModelTurn, ProviderError | PromptEvaluationError> =>
      typeof turns === "function"
        ? Effect.flatMap(turns(request), (turn) => {
          // A hand-written adapter's usage is checked as a stream's is: a turn that cannot be charged is no answer.
          const wrong = unchargeable(turn.usage)
          return wrong === undefined
            ? Effect.succeed(turn)
            : Effect.fail(new ProviderError({ phase: "response", detail: wrong }))
        })
        : Effect.suspend(() => {
          progress.answering = false
          const turn = collect(turns.stream(request), beatInterval, startAnswering, Journal.maxStepBytes).pipe(
            Effect.onExit((exit) => Exit.isInterrupted(exit) ? Effect.void : stopAnswering),
            Effect.catchTag("TurnTooLarge", (error) =>
              Effect.fail(fail(
                "response",
                "provider",
                `the model's turn grew past ${Journal.maxStepBytes} bytes while streaming (Journal.maxStepBytes; ` +
                  `${error.bytes} so far): the stream was stopped there`,
                { limit_bytes: Journal.maxStepBytes }
              )))
          )
          return heartbeat === undefined ? turn : Heartbeat.within(turn, heartbeat)
        })
    const attempt = (request: ModelRequest) => Effect.zipRight(checkpoint("request"), complete(request))
    const retried = (model: ModelRequest) =>
      loopOptions?.retry === undefined
        ? attempt(model)
        : Effect.retry(attempt(model), {
          schedule: loopOptions.retry,
          while: (error) => error._tag === "ProviderError"
        })
    // The deadline bounds a request with its retries: an attempt is interrupted when it passes, and so is a
    // wait between two attempts.
    const request = (model: ModelRequest) =>
      (deadline === undefined
        ? retried(model)
        : Deadline.within(retried(model), deadline).pipe(
          Effect.catchTag("DeadlineExceededError", () =>
            Effect.fail(
              progress.answering
                ? deadlineFailure("response", `deadline ${deadline.iso} passed while the model was answering`)
                : deadlineFailure("request")
            ))
        )).pipe(
          Effect.catchTag(
            "ProviderError",
            (error) => Effect.fail(fail(error.phase ?? "request", "provider", error.detail))
          )
        )

    // One measure for a turn's size: the step as the journal stores it (its JSON, key, digest and usage
    // included), journaled or not. A streamed turn is stopped early at the same limit by its parts alone; what the
    // envelope adds is refused here, with the same error, before the journal would refuse it as "too large".
    const fits = (step: Journal.Step, what: string) =>
      Effect.suspend(() => {
        const bytes = Journal.stepBytes(step)
        return bytes === undefined || bytes <= Journal.maxStepBytes
          ? Effect.void
          : Effect.fail(fail(
            "response",
            "provider",
            `the ${what} is ${bytes} bytes as the journal stores it (UTF-8 JSON), more than ` +
              `Journal.maxStepBytes (${Journal.maxStepBytes}): it is not taken as an answer`,
            { limit_bytes: Journal.maxStepBytes }
          ))
      })

    let messages: ReadonlyArray<Prompt.ChatMessage> = [
      { role: "system", content: prompt.instructions },
      ...prompt.messages
    ]
    // What each turn asked, as a chain: the digest of the one before and the messages added since.
    let asked = digest(JSON.stringify([prompt.name, toolsOffered]))
    let digested = 0
    const maxTurns = loopOptions?.maxTurns ?? 32
    for (let turnNumber = 1;; turnNumber++) {
      yield* beat
      if (turnNumber > maxTurns) return yield* fail("response", "provider", `no final answer after ${maxTurns} turns`)
      const key = steps.nextKey()
      asked = digest(asked + JSON.stringify(messages.slice(digested)))
      digested = messages.length
      const recorded = yield* steps.recorded(key)
      let turn: ModelTurn
      if (recorded !== undefined) {
        if (recorded._tag !== "Turn" || recorded.asked !== asked) {
          return yield* diverged(
            steps.requestId,
            key,
            recorded,
            recorded._tag === "Turn"
              ? `a model turn of prompt "${prompt.name}" with another request (the prompt, a tool on offer or a tool's result changed)`
              : `a model turn of prompt "${prompt.name}"`
          )
        }
        turn = { text: recorded.text, toolCalls: recorded.toolCalls, usage: recorded.usage }
        yield* replayed
        yield* options.session.record({
          _tag: "ProviderCall",
          promptName: prompt.name,
          at: yield* Clock.currentTimeMillis,
          durationMs: recorded.durationMs,
          usage: turn.usage,
          replayed: true
        })
      } else {
        const started = yield* Clock.currentTimeMillis
        const answered = yield* request({ prompt: prompt as Prompt.Prompt<unknown>, messages, tools: prompt.tools })
        // The calls as a replay will read them back (exactly these fields, in this order): the conversation, and so
        // what the next turn asks, is then the same live and replayed, whatever else an adapter put on a call.
        turn = { ...answered, toolCalls: answered.toolCalls.map(({ id, name, params }) => ({ id, name, params })) }
        const durationMs = yield* since(started)
        const step: Journal.Step = {
          _tag: "Turn",
          key,
          promptName: prompt.name,
          asked,
          text: turn.text,
          toolCalls: turn.toolCalls,
          usage: turn.usage,
          durationMs
        }
        yield* fits(step, "model's turn")
        // Recorded before anything else: the turn is paid for, whatever the budget says next.
        yield* steps.append(step)
        yield* options.session.record({
          _tag: "ProviderCall",
          promptName: prompt.name,
          at: started,
          durationMs,
          usage: turn.usage
        })
      }
      yield* spend(turn.usage)
      if (turn.toolCalls.length === 0) {
        yield* checkpoint("response")
        const output = yield* decodeOutput(prompt, turn.text, fail)
        const outcome: Journal.Step = {
          _tag: "Evaluation",
          key: evaluationKey,
          promptName: prompt.name,
          asked: evaluationAsked,
          text: turn.text,
          usage,
          durationMs: yield* since(evaluationStarted)
        }
        yield* fits(outcome, "evaluation's outcome")
        yield* parent.append(outcome)
        return { output, text: turn.text, usage }
      }
      messages = [...messages, { role: "assistant", content: turn.text, toolCalls: turn.toolCalls }]
      for (const call of turn.toolCalls) {
        const result = yield* ToolExecutor.execute(call, context, steps)
        messages = [...messages, {
          role: "tool",
          toolCallId: call.id,
          toolName: call.name,
          content: result._tag === "Ok" ? JSON.stringify(result.value) ?? "null" : `error: ${result.message}`
        }]
      }
    }
  }).pipe(Effect.withSpan("InnerLoop.run", { attributes: { prompt: prompt.name }, captureStackTrace: false }))

const decodeOutput = <Out>(
  prompt: Prompt.Prompt<Out>,
  text: string,
  fail: (phase: "response", reason: "output", detail: string) => PromptEvaluationError
): Effect.Effect<Out, PromptEvaluationError> => {
  if (prompt.output === undefined) return Effect.succeed(text as Out)
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch (error) {
    return Effect.fail(fail("response", "output", `the answer is not JSON: ${(error as Error).message}`))
  }
  return Schema.decodeUnknown(prompt.output)(json).pipe(
    Effect.mapError((error) => fail("response", "output", ParseResult.TreeFormatter.formatErrorSync(error)))
  )
}

const decodeOptions = Options_.decoder("InnerLoop.makeAdapter", {
  maxTurns: Schema.optionalWith(Options_.PositiveInt, { exact: true }),
  retry: Schema.optionalWith(Options_.ScheduleValue, { exact: true }),
  beatInterval: Schema.optionalWith(Options_.duration(), { exact: true })
})

/**
 * An adapter whose model turns come from `turns` (a `Complete`, or `{ stream }` for a streaming provider): what
 * an adapter for a new provider is made with. Bad options (a `maxTurns` that is not a positive integer, a
 * `retry` that is not a `Schedule`, a `beatInterval` that is not a finite duration) are a `ParseError` naming
 * them.
 *
 * @category constructors
 */
export const makeAdapter = (
  name: string,
  turns: Turns,
  loopOptions?: Options
): Effect.Effect<ProviderAdapter["Type"], ParseResult.ParseError> =>
  Effect.map(decodeOptions(loopOptions), () => {
    const adapter: ProviderAdapter["Type"] = {
      name,
      evaluate: (prompt, options) => run(adapter, turns, prompt, options, loopOptions)
    }
    return adapter
  })
