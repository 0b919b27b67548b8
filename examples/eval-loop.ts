/**
 * EvalLoop: a small dataset run under two experiments, scored, and reported.
 *
 *   npx tsx --conditions=leasehold-source examples/eval-loop.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Schema } from "effect"
import { Dataset, EvalLoop, Evaluator, Mailbox, MailboxMemory } from "leasehold"

const jsonl = [1, 2, 3, 4, 5, 6, 7, 8].map((n) => JSON.stringify({ id: `q${n}`, input: n, expected: `${n * n}` }))
  .join("\n")

Effect.gen(function*() {
  const samples = yield* Dataset.fromJsonl(jsonl, { input: Schema.Number, expected: Schema.String })
  const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<number, string>, EvalLoop.EvalResult>({
    name: "evals"
  })
  const results = yield* MailboxMemory.make<EvalLoop.EvalResult>({ name: "results" })

  // The "model": squares correctly, except that the "sloppy" experiment gets odd numbers wrong.
  const loop = yield* EvalLoop.make({
    requests,
    execute: (n: number, { experiment, heartbeat }) =>
      Effect.zipRight(
        heartbeat.beat,
        Effect.succeed(experiment === "sloppy" && n % 2 === 1 ? `${n * n + 1}` : `${n * n}`)
      ),
    evaluator: Evaluator.exactMatch
  }).pipe(Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests, results)))

  yield* EvalLoop.submitDataset(requests, samples, { experiment: "careful", replyTo: "results" })
  yield* EvalLoop.submitDataset(requests, samples, { experiment: "sloppy", replyTo: "results" })
  yield* loop.run({ maxIterations: 16, waitTime: 0 })

  const report = EvalLoop.report(yield* EvalLoop.collectResults(results, 16, "5 seconds"))
  for (const [name, summary] of Object.entries(report.experiments)) {
    yield* Effect.log(`${name}: pass rate ${summary.passRate}, mean score ${summary.meanScore}`)
  }
  const diff = EvalLoop.compare(report, "careful", "sloppy")!
  yield* Effect.log(`sloppy vs careful: pass rate ${diff.passRateDelta > 0 ? "+" : ""}${diff.passRateDelta}`)
}).pipe(Effect.scoped, NodeRuntime.runMain)
