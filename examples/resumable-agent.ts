/**
 * An agent run that survives its worker, on SQLite: the first worker records
 * each step of the run (the model's first turn, a lookup, a refund) in the
 * request's mailbox, then stops while the model works on its second turn; the
 * second worker replays the journal — no model call, no lookup, no refund
 * again — and finishes the run live. The refund tool passes its idempotency
 * key (the same on every delivery) to the payment service.
 *
 *   npx tsx --conditions=leasehold-source examples/resumable-agent.ts
 *
 * Here the first worker is interrupted in the process; test/journal.processes.test.ts SIGKILLs a real one.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Deferred, Effect, Fiber, Option, Ref, Schema } from "effect"
import { InnerLoop, MailboxSql, MailboxSqlAdmin, MainLoop, Prompt, Tool } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const filename = join(mkdtempSync(join(tmpdir(), "leasehold-example-")), "agent.db")

Effect.gen(function*() {
  const requests = yield* MailboxSql.make({
    name: "refund-requests",
    schema: MainLoop.requestSchema(Schema.String),
    replySchema: MainLoop.resultSchema(Schema.String)
  })
  const replies = yield* MailboxSql.make({ name: "refund-replies", schema: MainLoop.resultSchema(Schema.String) })
  const modelCalls = yield* Ref.make(0)
  const toolRuns = yield* Ref.make<ReadonlyArray<string>>([])
  const refunds = new Set<string>() // the payment service: one refund per idempotency key
  const thinking = yield* Deferred.make<void>()

  const lookup = Tool.make({
    name: "lookup_order",
    description: "Finds an order.",
    parameters: Schema.Struct({ order: Schema.String }),
    success: Schema.String,
    handler: ({ order }) => Effect.as(Ref.update(toolRuns, (runs) => [...runs, "lookup_order"]), `${order}: 30 EUR`)
  })
  const refund = Tool.make({
    name: "refund",
    description: "Refunds an order.",
    parameters: Schema.Struct({ order: Schema.String }),
    success: Schema.String,
    handler: ({ order }, context) =>
      Effect.sync(() => refunds.add(context.idempotencyKey)).pipe(
        Effect.zipRight(Ref.update(toolRuns, (runs) => [...runs, "refund"])),
        Effect.as(`refunded ${order}`)
      )
  })

  // A model whose answer depends on the conversation so far. The first worker's model never finishes its second
  // turn: that worker is stopped while it waits.
  const model = (stalls: boolean): InnerLoop.Complete => (request) =>
    Effect.gen(function*() {
      yield* Ref.update(modelCalls, (n) => n + 1)
      const results = request.messages.filter((message) => message.role === "tool").length
      const usage = { inputTokens: 500, outputTokens: 40 }
      if (results === 0) {
        return {
          text: "",
          toolCalls: [
            { id: "1", name: "lookup_order", params: { order: "A-42" } },
            { id: "2", name: "refund", params: { order: "A-42" } }
          ],
          usage
        }
      }
      if (stalls) return yield* Effect.zipRight(Deferred.succeed(thinking, undefined), Effect.never)
      return { text: "Order A-42 was refunded: 30 EUR.", toolCalls: [], usage }
    })

  const worker = (stalls: boolean) =>
    Effect.flatMap(InnerLoop.makeAdapter("model", model(stalls)), (adapter) =>
      MainLoop.agent({
        requests,
        adapter,
        prepare: (task: string) =>
          Effect.succeed(Prompt.make({ name: "support", instructions: "Help.", input: task, tools: [lookup, refund] }))
      }))

  const id = yield* requests.send(MainLoop.request("Refund order A-42", { requestId: "ticket-7" }), {
    replyTo: "refund-replies"
  })

  const first = yield* Effect.fork((yield* worker(true)).run({ visibilityTimeout: "30 seconds" }))
  yield* Deferred.await(thinking)
  yield* Fiber.interrupt(first) // the worker stops; the request goes back to the queue, its journal stays
  yield* Effect.log(
    `worker 1: model calls ${yield* Ref.get(modelCalls)}, tools run: ${(yield* Ref.get(toolRuns)).join(", ")}`
  )
  const journals = yield* MailboxSqlAdmin.journals()
  const journal = yield* journals.read(id, { by: "message" })
  for (const step of Option.match(journal, { onNone: () => [], onSome: (view) => view.steps })) {
    const entry = step.entry as { readonly _tag: string; readonly toolName?: string }
    yield* Effect.log(
      `journal step ${step.key}: ${entry._tag}${entry.toolName === undefined ? "" : ` ${entry.toolName}`}`
    )
  }

  yield* Ref.set(modelCalls, 0)
  yield* Ref.set(toolRuns, [])
  yield* (yield* worker(false)).run({ maxIterations: 1, waitTime: 0 })
  const [reply] = yield* replies.receive()
  yield* Effect.log(
    `worker 2: model calls ${yield* Ref.get(modelCalls)}, tools run: ${(yield* Ref.get(toolRuns)).length}`
  )
  yield* Effect.log(
    `reply to ${reply?.body.requestId} (attempt ${reply?.body.runContext.attempt}): ${reply?.body.output}`
  )
  yield* Effect.log(`refunds made: ${refunds.size} (${[...refunds].join(", ")})`)
  yield* Effect.log(
    `journal after the ack: ${Option.isNone(yield* journals.read(id, { by: "message" })) ? "gone" : "still there"}`
  )
}).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename })), NodeRuntime.runMain)
