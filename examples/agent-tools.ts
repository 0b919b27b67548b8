/**
 * An agent worker: MainLoop.agent with a scripted model that calls a slow
 * "run_tests" tool. The tool first downloads a container image in chunks —
 * a helper three calls deep beats per chunk with `Heartbeat.beat`, handed
 * nothing — then runs the suite as a stream of progress lines that beats as
 * lines arrive (`Heartbeat.beatEvery`). So the request stays leased far beyond
 * its 1 s visibility timeout; a second request, whose deadline passes while the
 * tool runs, is stopped in the middle of it.
 *
 * `--provider anthropic` or `--provider openai` asks a real model instead of
 * the script (key from ANTHROPIC_API_KEY / OPENAI_API_KEY, model from
 * ANTHROPIC_MODEL / OPENAI_MODEL); what it answers is then up to the model.
 *
 *   npx tsx --conditions=leasehold-source examples/agent-tools.ts [--provider scripted|anthropic|openai]
 */
import { FetchHttpClient } from "@effect/platform"
import { NodeRuntime } from "@effect/platform-node"
import { Config, Effect, Layer, Metric, Schema, type Scope, Stream } from "effect"
import {
  Anthropic,
  Deadline,
  EffectAi,
  Heartbeat,
  LeaseExtender,
  Mailbox,
  MailboxMemory,
  MainLoop,
  Prompt,
  type ProviderAdapter,
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

// The model: the script by default, or a real provider's (its package loaded only when chosen).
const providerFlag = process.argv.indexOf("--provider")
const provider = providerFlag === -1 ? "scripted" : process.argv[providerFlag + 1]
const chooseModel = (): Effect.Effect<ProviderAdapter.ProviderAdapter["Type"], unknown, Scope.Scope> => {
  switch (provider) {
    case "scripted":
      return ScriptedAdapter.make([
        {
          toolCalls: [{ name: "run_tests", params: { suite: "unit" } }],
          usage: { inputTokens: 120, outputTokens: 15 }
        },
        { text: "41 passed, 1 failed: look at test_parser", usage: { inputTokens: 180, outputTokens: 12 } },
        { toolCalls: [{ name: "run_tests", params: { suite: "e2e" } }] }
      ])
    case "anthropic":
      return Effect.gen(function*() {
        const model = yield* Config.string("ANTHROPIC_MODEL").pipe(Config.withDefault("claude-sonnet-4-5"))
        const apiKey = yield* Config.redacted("ANTHROPIC_API_KEY")
        return yield* Anthropic.make({ model, apiKey })
      }).pipe(Effect.provide(FetchHttpClient.layer))
    case "openai":
      return Effect.gen(function*() {
        const { OpenAiClient, OpenAiLanguageModel } = yield* Effect.promise(() => import("@effect/ai-openai"))
        const model = yield* Config.string("OPENAI_MODEL").pipe(Config.withDefault("gpt-4.1-mini"))
        const apiKey = yield* Config.redacted("OPENAI_API_KEY")
        return yield* EffectAi.make().pipe(
          Effect.provide(
            OpenAiLanguageModel.layer({ model }).pipe(
              Layer.provide(OpenAiClient.layer({ apiKey })),
              Layer.provide(FetchHttpClient.layer)
            )
          )
        )
      })
    default:
      return Effect.dieMessage(`--provider must be scripted, anthropic or openai, not ${provider}`)
  }
}

Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  const model = yield* chooseModel()
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
