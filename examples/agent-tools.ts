/**
 * An agent worker: MainLoop.agent with a scripted model that calls a slow
 * "run_tests" tool. The tool first downloads a container image in chunks —
 * a helper three calls deep beats per chunk with `Heartbeat.beat`, handed
 * nothing — then runs the suite as a stream of progress lines that beats as
 * lines arrive (`Heartbeat.beatEvery`). So the request stays leased far beyond
 * its 1 s visibility timeout; a second request, whose deadline passes while the
 * tool runs, is stopped in the middle of it.
 *
 *   npx tsx --conditions=leasehold-source examples/agent-tools.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Metric, Schema, Stream } from "effect"
import {
  Deadline,
  Heartbeat,
  LeaseExtender,
  Mailbox,
  MailboxMemory,
  MainLoop,
  Prompt,
  ScriptedAdapter,
  Tool
} from "leasehold"

// Three calls below the tool, and handed nothing: the heartbeat of the request being handled is in the
// environment, so each chunk proves progress (and may extend the request's lease).
const fetchChunk = (_chunk: number) => Effect.zipRight(Effect.sleep("400 millis"), Heartbeat.beat)
const download = (chunks: number) =>
  Effect.forEach(Array.from({ length: chunks }, (_, i) => i), fetchChunk, { discard: true })
const prepareImage = (suite: string) => Effect.zipRight(download(3), Effect.log(`tool: image for ${suite} ready`))

// The suite's progress lines: each line that arrives is proof of work; a suite that hangs stops beating.
const progressLines = Stream.fromIterable(["parser", "lexer", "e2e"]).pipe(
  Stream.mapEffect((name) => Effect.as(Effect.sleep("400 millis"), `ok ${name}`))
)

const runTests = Tool.make({
  name: "run_tests",
  description: "Runs the test suite in a container",
  parameters: Schema.Struct({ suite: Schema.String }),
  success: Schema.Struct({ passed: Schema.Number, failed: Schema.Number }),
  handler: ({ suite }) =>
    Effect.gen(function*() {
      yield* prepareImage(suite)
      yield* Stream.runDrain(Heartbeat.beatEvery(progressLines, "300 millis"))
      yield* Effect.log(`tool: suite ${suite} finished after 2.4 s`)
      return { passed: 41, failed: 1 }
    }).pipe(Effect.onInterrupt(() => Effect.log(`tool: suite ${suite} interrupted at the deadline`)))
})

Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  const model = yield* ScriptedAdapter.make([
    { toolCalls: [{ name: "run_tests", params: { suite: "unit" } }], usage: { inputTokens: 120, outputTokens: 15 } },
    { text: "41 passed, 1 failed: look at test_parser", usage: { inputTokens: 180, outputTokens: 12 } },
    { toolCalls: [{ name: "run_tests", params: { suite: "e2e" } }] }
  ])
  const loop = yield* MainLoop.agent({
    requests,
    adapter: model,
    prepare: (task: string) =>
      Effect.succeed(Prompt.make({ name: "ci-agent", instructions: "Run the tests.", input: task, tools: [runTests] })),
    config: { leaseExtender: { interval: "300 millis", extension: "1 second" } }
  }).pipe(Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests, responses)))

  yield* requests.send(MainLoop.request("check the unit tests", { requestId: "unit" }), { replyTo: "responses" })
  yield* requests.send(
    MainLoop.request("check the e2e tests", { requestId: "e2e", deadline: yield* Deadline.after("3500 millis") }),
    { replyTo: "responses" }
  )
  yield* loop.run({ maxIterations: 2, waitTime: 0, visibilityTimeout: "1 second" })

  for (const { body } of yield* responses.receive({ maxMessages: 10 })) {
    yield* Effect.log(`${body.requestId}: ${body.success ? body.output : `failed: ${body.error?.message}`}`)
  }
  const extensions = (yield* Metric.value(LeaseExtender.extensions)).count
  yield* Effect.log(`lease extensions: ${extensions}; requests left: ${yield* requests.approximateCount}`)
}).pipe(Effect.scoped, NodeRuntime.runMain)
