/**
 * EvalLoop: runs evaluation samples from a mailbox and replies scored results.
 *
 * Each `EvalRequest` carries a sample and an experiment name. The loop runs
 * the caller's `execute` on the sample's input and scores the output with an
 * `Evaluator`, replying an `EvalResult`. It stands on MainLoop's footing (the
 * same request loop): the loop's heartbeat keeps the eval message leased while
 * the sample works; the sample runs under its deadline — the request's, or the
 * config's `timeout` from the start of the attempt — and its budget, and is
 * interrupted when the deadline passes, so a hung sample cannot hold the
 * loop. A sample whose execution or evaluator fails is a data point: without a
 * dead-letter queue its result carries `error` and score 0; with one, it is
 * retried with backoff and dead-lettered by the policy (then the error result
 * is replied), so a crashing evaluator cannot loop for ever. `layer` runs the
 * loop for a scope's lifetime with a graceful stop. `EvalReport` aggregates
 * results per experiment and compares experiments; `submitDataset` and
 * `collectResults` drive a whole run from the outside.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as ParseResult from "effect/ParseResult"
import { randomUUID } from "node:crypto"
import type * as Budget from "./Budget.js"
import type * as Dataset from "./Dataset.js"
import type * as Deadline from "./Deadline.js"
import * as Evaluator from "./Evaluator.js"
import { monotonicMillis } from "./internal/heartbeat.js"
import * as RequestLoop from "./internal/loops/requestLoop.js"
import * as Scoped from "./internal/loops/scoped.js"
import { logSettleFailure } from "./internal/loops/settleFailure.js"
import type { Mailbox, MailboxResolver, SendError } from "./Mailbox.js"
import * as MailboxWorker from "./MailboxWorker.js"
import * as Session from "./Session.js"

/**
 * One sample to run under an experiment.
 *
 * @category models
 */
export interface EvalRequest<I, E> {
  readonly requestId: string
  readonly experiment: string
  readonly sample: Dataset.Sample<I, E>
  /** The sample's execution and scoring are interrupted when this passes. */
  readonly deadline?: Deadline.Deadline | undefined
  /** Token and deadline limits for the sample; a tracker reaches `execute`. */
  readonly budget?: Budget.Budget | undefined
  readonly traceId?: string | undefined
  readonly spanId?: string | undefined
}

/**
 * The scored outcome of one sample.
 *
 * @category models
 */
export interface EvalResult {
  readonly requestId: string
  readonly sampleId: string
  readonly experiment: string
  readonly score: Evaluator.Score
  /** From the start of the attempt to the end of the execution (or of the failed attempt). */
  readonly latencyMs: number
  /** Why the execution or the scoring failed (`Tag: message`); the score is 0 then. */
  readonly error: string | undefined
}

/**
 * What `execute` receives besides the input: MainLoop's context, a session and the sample's names.
 *
 * @category models
 */
export interface EvalContext extends RequestLoop.Attempt {
  /** A fresh session per sample: pass it to the adapter so session-aware evaluators can read it. */
  readonly session: Session.Session
  readonly sampleId: string
  readonly experiment: string
}

/**
 * Options of the loop: MainLoop's (worker id, lease extender, dead letters, timeout, budget).
 *
 * @category models
 */
export type EvalLoopConfig<I, E> = RequestLoop.Config<EvalRequest<I, E>>

/**
 * Options of `make`.
 *
 * @category models
 */
export interface Options<I, E, O, Err, R> {
  /** The loop's name, in logs and metrics (default `eval-loop:<mailbox>`). */
  readonly name?: string | undefined
  readonly requests: Mailbox<EvalRequest<I, E>, EvalResult>
  /** Runs one sample's input; interrupted when its deadline passes. */
  readonly execute: (input: I, context: EvalContext) => Effect.Effect<O, Err, R>
  /** Scores the output against the sample's expected value. */
  readonly evaluator: Evaluator.Evaluator<O, E>
  readonly config?: EvalLoopConfig<I, E> | undefined
}

/**
 * Makes an EvalLoop; bad config fails with a `ParseError` naming it.
 *
 * @category constructors
 */
export const make = <I, E, O, Err, R>(
  options: Options<I, E, O, Err, R>
): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  Effect.flatMap(Effect.clock, (clock) => {
    const latencySince = (startedAt: number) => Math.max(0, monotonicMillis(clock) - startedAt)
    const base = (body: EvalRequest<I, E>) => ({
      requestId: body.requestId,
      sampleId: body.sample.id,
      experiment: body.experiment
    })
    return RequestLoop.make<
      EvalRequest<I, E>,
      EvalResult,
      { readonly score: Evaluator.Score; readonly latencyMs: number },
      Err,
      R
    >({
      label: "EvalLoop.make",
      name: options.name ?? `eval-loop:${options.requests.name}`,
      requests: options.requests,
      config: options.config,
      execute: (body, attempt) =>
        Effect.gen(function*() {
          const { experiment, sample } = body
          const session = yield* Session.make
          const started = monotonicMillis(clock)
          const output = yield* options.execute(sample.input, { ...attempt, session, sampleId: sample.id, experiment })
          const latencyMs = latencySince(started)
          const score = yield* options.evaluator(output, sample.expected, session)
          return { score, latencyMs }
        }),
      success: (message, { latencyMs, score }) => ({ ...base(message.body), score, latencyMs, error: undefined }),
      failure: (message, error, outcome) => ({
        ...base(message.body),
        score: new Evaluator.Score({ value: 0, passed: false, reason: "execution failed" }),
        latencyMs: latencySince(outcome.startedAt),
        error: `${error.tag}: ${error.message}`
      })
    })
  })

/**
 * Options of `layer` besides the loop's: how it runs and how long its graceful stop may take (default 30 s).
 *
 * @category models
 */
export type LayerOptions = MailboxWorker.RunScopedOptions

const decodeLayerOptions = Scoped.decoder("EvalLoop.layer")

/**
 * Runs an EvalLoop for the lifetime of the layer; closing the layer's scope shuts it down gracefully within
 * `shutdownTimeout` (default 30 s) — then the sample in flight is interrupted and given back. Bad options, the
 * loop's and how it runs, are a `ParseError` naming them when the layer is built.
 *
 * @category layers
 */
export const layer = <I, E, O, Err, R>(
  options: Options<I, E, O, Err, R> & LayerOptions
): Layer.Layer<never, ParseResult.ParseError, R | MailboxResolver> =>
  Layer.scopedDiscard(
    Effect.flatMap(
      decodeLayerOptions(options),
      (scoped) => Effect.flatMap(make(options), (loop) => Scoped.run(loop, scoped))
    )
  )

/**
 * Sends one request per sample, replies to `replyTo`; returns the request ids in sample order.
 *
 * @category utils
 */
export const submitDataset = <I, E>(
  requests: Mailbox<EvalRequest<I, E>, EvalResult>,
  samples: ReadonlyArray<Dataset.Sample<I, E>>,
  options: { readonly experiment?: string; readonly replyTo: string }
): Effect.Effect<ReadonlyArray<string>, SendError> =>
  Effect.forEach(samples, (sample) => {
    const requestId = randomUUID()
    return Effect.as(
      requests.send({ requestId, experiment: options.experiment ?? "baseline", sample }, { replyTo: options.replyTo }),
      requestId
    )
  })

/**
 * Receives results until `expected` have arrived or `timeout` has passed
 * (by `Clock`), acknowledging each; a result seen twice (redelivery) counts once.
 *
 * @category utils
 */
export const collectResults = (
  results: Mailbox<EvalResult>,
  expected: number,
  timeout: Duration.DurationInput
): Effect.Effect<ReadonlyArray<EvalResult>> =>
  Effect.gen(function*() {
    const until = (yield* Clock.currentTimeMillis) + Duration.toMillis(timeout)
    const byRequest = new Map<string, EvalResult>()
    for (;;) {
      const now = yield* Clock.currentTimeMillis
      if (byRequest.size >= expected || now >= until) break
      const wait = Duration.millis(Math.min(until - now, 20_000))
      const batch = yield* results.receive({ maxMessages: 10, waitTime: wait }).pipe(
        Effect.catchAll((error) => Effect.as(Effect.logWarning("Receiving results failed", error), []))
      )
      for (const message of batch) {
        byRequest.set(message.body.requestId, message.body)
        yield* logSettleFailure("acknowledge of a result")(message.acknowledge)
      }
    }
    return [...byRequest.values()]
  })

/**
 * Figures for one experiment (or all results). Rates and means are over the successful results.
 *
 * @category models
 */
export interface Summary {
  readonly total: number
  readonly successful: number
  readonly failed: number
  readonly passed: number
  readonly passRate: number
  readonly meanScore: number
  readonly meanLatencyMs: number
}

/**
 * Results aggregated overall and per experiment.
 *
 * @category models
 */
export interface EvalReport extends Summary {
  readonly experiments: Readonly<Record<string, Summary>>
}

const mean = (values: ReadonlyArray<number>) =>
  values.length === 0 ? 0 : values.reduce((a, b) => a + b, 0) / values.length

const summarize = (results: ReadonlyArray<EvalResult>): Summary => {
  const successful = results.filter((r) => r.error === undefined)
  const passed = successful.filter((r) => r.score.passed).length
  return {
    total: results.length,
    successful: successful.length,
    failed: results.length - successful.length,
    passed,
    passRate: successful.length === 0 ? 0 : passed / successful.length,
    meanScore: mean(successful.map((r) => r.score.value)),
    meanLatencyMs: mean(successful.map((r) => r.latencyMs))
  }
}

/**
 * Aggregates results.
 *
 * @category utils
 */
export const report = (results: ReadonlyArray<EvalResult>): EvalReport => {
  const byExperiment = new Map<string, Array<EvalResult>>()
  for (const result of results) {
    const bucket = byExperiment.get(result.experiment) ?? []
    bucket.push(result)
    byExperiment.set(result.experiment, bucket)
  }
  return {
    ...summarize(results),
    experiments: Object.fromEntries([...byExperiment].map(([name, rs]) => [name, summarize(rs)]))
  }
}

/**
 * How `treatment` differs from `baseline` (treatment minus baseline).
 *
 * @category models
 */
export interface Comparison {
  readonly baseline: string
  readonly treatment: string
  readonly passRateDelta: number
  readonly meanScoreDelta: number
  readonly meanLatencyMsDelta: number
}

/**
 * Compares two experiments of a report; undefined when either is missing.
 *
 * @category utils
 */
export const compare = (report: EvalReport, baseline: string, treatment: string): Comparison | undefined => {
  const a = report.experiments[baseline]
  const b = report.experiments[treatment]
  if (a === undefined || b === undefined) return undefined
  return {
    baseline,
    treatment,
    passRateDelta: b.passRate - a.passRate,
    meanScoreDelta: b.meanScore - a.meanScore,
    meanLatencyMsDelta: b.meanLatencyMs - a.meanLatencyMs
  }
}
