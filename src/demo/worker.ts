/**
 * A demo worker process: a `LoopGroup` of two `MainLoop.agent` loops on the
 * demo's SQLite mailbox. The "model" is a `ScriptedAdapter` that asks for the
 * `compile` tool, then answers; the tool beats while it works, so requests
 * stay leased for exactly as long as work happens. SIGTERM / SIGINT drain it
 * (`ShutdownCoordinator.layer`); SIGKILL is the crash the demo shows.
 *
 * Started by the demo as `leasehold demo-worker <sqlite-file> <worker-name>`
 * (the command line's own entry, so it runs the same way the demo does:
 * compiled, or from source). Prints `ready`, then `start <requestId>
 * <attempt>` per execution.
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import * as ScriptedAdapter from "../adapters/ScriptedAdapter.js"
import * as LoopGroup from "../LoopGroup.js"
import * as MailboxSql from "../MailboxSql.js"
import * as MainLoop from "../MainLoop.js"
import * as Prompt from "../Prompt.js"
import * as ShutdownCoordinator from "../ShutdownCoordinator.js"
import * as Tool from "../Tool.js"
import { DemoRequest, DemoResponse } from "./schema.js"

const program = (name: string) =>
  Effect.gen(function*() {
    const requests = yield* MailboxSql.make({
      name: "requests",
      schema: MainLoop.requestSchema(DemoRequest),
      replySchema: MainLoop.resultSchema(DemoResponse)
    })
    const loops = yield* Effect.forEach([1, 2], (n) =>
      Effect.gen(function*() {
        // A loop runs one request at a time, so the tool can read the current request's work time from here.
        let workMs = 100
        const compile = Tool.make({
          name: "compile",
          description: "Compiles the task's workspace",
          parameters: Schema.Struct({ task: Schema.String }),
          success: Schema.Struct({ ok: Schema.Boolean }),
          handler: (_, { beat }) =>
            Effect.gen(function*() {
              // The demo kills a worker only while it is compiling, so the kill surely takes a leased request.
              process.stdout.write("compiling\n")
              for (let step = 0; step < 5; step++) {
                yield* beat // proof of work: keeps the request leased
                yield* Effect.sleep(`${Math.max(1, Math.round(workMs / 5))} millis`)
              }
              return { ok: true }
            }).pipe(Effect.ensuring(Effect.sync(() => process.stdout.write("compiled\n"))))
        })
        // Each request takes two turns: call the tool, then answer. Enough turns for every request twice over.
        const turns = Array.from(
          { length: 20_000 },
          (_, i): ScriptedAdapter.ScriptedTurn =>
            i % 2 === 0 ? { toolCalls: [{ name: "compile", params: { task: "build" } }] } : { text: "compiled" }
        )
        return yield* MainLoop.agent({
          name: `${name}/loop-${n}`,
          requests,
          adapter: yield* ScriptedAdapter.make(turns),
          prepare: (request: DemoRequest, { runContext }) =>
            Effect.sync(() => {
              workMs = request.workMs
              process.stdout.write(`start ${runContext.requestId} ${runContext.attempt}\n`)
              return Prompt.make({ name: "demo", instructions: "Compile it.", input: request.task, tools: [compile] })
            }),
          finalize: (response) => Effect.succeed({ answer: response.text, worker: name }),
          config: { workerId: name, leaseExtender: { interval: "250 millis", extension: "2 seconds" } }
        })
      }))
    const group = LoopGroup.make(loops, { shutdownTimeout: "10 seconds" })
    process.stdout.write("ready\n")
    yield* group.run({ waitTime: "1 second", visibilityTimeout: "2 seconds" })
  })

/** Runs a worker until it is signalled: `args` are the SQLite file and the worker's name. */
export const main = (args: ReadonlyArray<string>): void => {
  const [filename = ".leasehold/demo.db", name = `worker-${process.pid}`] = args
  program(name).pipe(
    Effect.scoped,
    Effect.provide([MailboxSql.layerSqlite({ filename }), ShutdownCoordinator.layer()]),
    NodeRuntime.runMain
  )
}
