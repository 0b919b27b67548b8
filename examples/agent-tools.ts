/**
 * An agent worker: MainLoop.agent with a scripted model that calls a slow
 * "container" tool. The tool beats while it works, so the request stays
 * leased far beyond its 1 s visibility timeout; a second request, whose
 * deadline passes while the tool runs, is stopped in the middle of it.
 *
 *   npx tsx examples/agent-tools.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Metric, Schema } from "effect"
import { Deadline, LeaseExtender, Mailbox, MailboxMemory, MainLoop, Prompt, ScriptedAdapter, Tool } from "leasehold"

const runTests = Tool.make({
  name: "run_tests",
  description: "Runs the test suite in a container",
  parameters: Schema.Struct({ suite: Schema.String }),
  success: Schema.Struct({ passed: Schema.Number, failed: Schema.Number }),
  handler: ({ suite }, { beat }) =>
    Effect.gen(function*() {
      for (let step = 1; step <= 6; step++) {
        yield* beat // proof of work: each beat may extend the request's lease
        yield* Effect.sleep("400 millis")
      }
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
