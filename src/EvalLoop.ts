/**
 * EvalLoop: runs evaluation samples from a mailbox and replies scored results.
 *
 * Each `EvalRequest` carries a sample and an experiment name. The loop runs
 * the caller's `execute` on the sample's input — with the loop's heartbeat,
 * so tools that beat keep the eval message leased — times it with `Clock`,
 * scores the output with an `Evaluator` and replies an `EvalResult`. A
 * failed execution is a data point, not a poison message: it becomes a
 * result with `error` and score 0. `EvalReport` aggregates results per
 * experiment and compares experiments; `submitDataset` and `collectResults`
 * drive a whole run from the outside.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import { randomUUID } from "node:crypto"
import type * as Dataset from "./Dataset.js"
import * as DeadLetter from "./DeadLetter.js"
import * as Evaluator from "./Evaluator.js"
import type * as Heartbeat from "./Heartbeat.js"
import type { Mailbox, MailboxResolver, SendError } from "./Mailbox.js"
import * as MailboxWorker from "./MailboxWorker.js"
import * as Session from "./Session.js"

/** One sample to run under an experiment. */
export interface EvalRequest<I, E> {
  readonly requestId: string
  readonly experiment: string
  readonly sample: Dataset.Sample<I, E>
}

/** The scored outcome of one sample. */
export interface EvalResult {
  readonly requestId: string
  readonly sampleId: string
  readonly experiment: string
  readonly score: Evaluator.Score
  readonly latencyMs: number
  /** Why the execution failed; the score is 0 then. */
  readonly error: string | undefined
}

/** What `execute` receives besides the input. */
export interface EvalContext {
  readonly heartbeat: Heartbeat.Heartbeat
  /** A fresh session per sample: pass it to the adapter so session-aware evaluators can read it. */
  readonly session: Session.Session
  readonly sampleId: string
  readonly experiment: string
}

/** Makes an EvalLoop; bad lease-extender config fails with a readable `ParseError`. */
export const make = <I, E, O, Err, R>(options: {
  readonly name?: string
  readonly requests: Mailbox<EvalRequest<I, E>, EvalResult>
  readonly execute: (input: I, context: EvalContext) => Effect.Effect<O, Err, R>
  readonly evaluator: Evaluator.Evaluator<O, E>
  readonly leaseExtender?: MailboxWorker.Options<never, never, never, never, never>["leaseExtender"]
}): Effect.Effect<MailboxWorker.Runnable, ParseResult.ParseError, R | MailboxResolver> =>
  MailboxWorker.make<EvalRequest<I, E>, EvalResult, EvalResult, never, R | MailboxResolver>({
    name: options.name ?? `eval-loop:${options.requests.name}`,
    mailbox: options.requests,
    handle: (message, heartbeat) =>
      Effect.gen(function*() {
        const { experiment, requestId, sample } = message.body
        const session = yield* Session.make
        const started = yield* Clock.currentTimeMillis
        const outcome = yield* Effect.either(
          options.execute(sample.input, { heartbeat, session, sampleId: sample.id, experiment })
        )
        const latencyMs = (yield* Clock.currentTimeMillis) - started
        const base = { requestId, sampleId: sample.id, experiment, latencyMs }
        if (outcome._tag === "Left") {
          const error = DeadLetter.describe(outcome.left)
          return {
            ...base,
            score: new Evaluator.Score({ value: 0, passed: false, reason: "execution failed" }),
            error: `${error.tag}: ${error.message}`
          } satisfies EvalResult
        }
        const score = yield* options.evaluator(outcome.right, sample.expected, session)
        return { ...base, score, error: undefined } satisfies EvalResult
      }),
    onSuccess: (_message, result) => Effect.succeed(Option.some(result)),
    retryAfter: (message) => DeadLetter.backoff(message.deliveryCount),
    // `handle` turns execution failures into results; what is left is a defect in the evaluator.
    onFailure: (message, cause) =>
      Effect.zipRight(
        Effect.logError("Evaluation failed outside execute", cause),
        MailboxWorker.logSettleFailure("nack")(message.nack(DeadLetter.backoff(message.deliveryCount)))
      ),
    ...(options.leaseExtender !== undefined ? { leaseExtender: options.leaseExtender } : {})
  })

/** Sends one request per sample, replies to `replyTo`; returns the request ids in sample order. */
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
        yield* MailboxWorker.logSettleFailure("acknowledge of a result")(message.acknowledge)
      }
    }
    return [...byRequest.values()]
  })

/** Figures for one experiment (or all results). Rates and means are over the successful results. */
export interface Summary {
  readonly total: number
  readonly successful: number
  readonly failed: number
  readonly passed: number
  readonly passRate: number
  readonly meanScore: number
  readonly meanLatencyMs: number
}

/** Results aggregated overall and per experiment. */
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

/** Aggregates results. */
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

/** How `treatment` differs from `baseline` (treatment minus baseline). */
export interface Comparison {
  readonly baseline: string
  readonly treatment: string
  readonly passRateDelta: number
  readonly meanScoreDelta: number
  readonly meanLatencyMsDelta: number
}

/** Compares two experiments of a report; undefined when either is missing. */
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
