/**
 * What makes a replay diverge (issue 43, finding 15): a recorded turn's digest covers each offered tool's name,
 * description and parameters' JSON Schema, so a deploy that adds a required field to a tool (or an optional one,
 * or rewords it) stops the run with `JournalDivergedError` instead of replaying the old turn and the old result
 * into the new code. The same tool, built anew, replays. Unit tests on the memory mailbox, and a redelivery through
 * `MainLoop.agent` on SQLite and PostgreSQL.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Ref, Schema } from "effect"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import * as Journal from "../src/Journal.js"
import { type Mailbox, MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import * as Session from "../src/Session.js"
import * as Tool from "../src/Tool.js"
import { sqlBackends } from "./support/sqlBackends.js"

/** A charge tool as one deploy defines it; `runs` counts its calls. */
const chargeTool = (
  runs: Ref.Ref<number>,
  parameters: Schema.Schema.AnyNoContext = Schema.Struct({ cents: Schema.Int }),
  description = "Charges the customer."
) =>
  Tool.make({
    name: "charge",
    description,
    parameters,
    success: Schema.String,
    handler: () => Effect.as(Ref.update(runs, (n) => n + 1), "charged")
  })

const prompt = (tool: Tool.Any) => Prompt.make({ name: "pay", instructions: "Pay.", input: "pay", tools: [tool] })

const toolTurn: ScriptedAdapter.ScriptedTurn = { toolCalls: [{ id: "c", name: "charge", params: { cents: 5 } }] }

/**
 * The first delivery, as the old deploy ran it: the model calls the tool (turn and result recorded), then fails;
 * the message goes back at once.
 */
const firstDelivery = <A, R>(mailbox: Mailbox<A, R>, tool: Tool.Any, requestId: string) =>
  Effect.gen(function*() {
    const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
    const adapter = yield* ScriptedAdapter.make([toolTurn, { fail: "overloaded" }])
    const session = yield* Session.make
    const exit = yield* Effect.exit(
      adapter.evaluate(prompt(tool), { session, journal: Journal.forDelivery(message!, requestId) })
    )
    expect(Exit.isFailure(exit)).toBe(true)
    yield* message!.nack()
  })

/** The redelivery, as the new deploy runs it by hand: the outcome, and how often the model was asked. */
const redelivery = <A, R>(mailbox: Mailbox<A, R>, tool: Tool.Any, requestId: string) =>
  Effect.gen(function*() {
    const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
    expect(message!.deliveryCount).toBe(2)
    const adapter = yield* ScriptedAdapter.make([{ text: "done" }])
    const session = yield* Session.make
    const exit = yield* Effect.exit(
      adapter.evaluate(prompt(tool), { session, journal: Journal.forDelivery(message!, requestId) })
    )
    return { exit: Exit.map(exit, (response) => response.output), asked: (yield* adapter.requests).length }
  })

/** The failure's tag and message, or the output. */
const outcome = (exit: Exit.Exit<unknown, unknown>): { tag?: string; message?: string; output?: unknown } =>
  Exit.match(exit, {
    onFailure: (cause) => {
      const error = cause._tag === "Fail" ? cause.error as { _tag: string; message: string } : undefined
      return error === undefined ? { tag: String(cause) } : { tag: error._tag, message: error.message }
    },
    onSuccess: (value) => ({ output: value })
  })

describe("a deploy that changed a tool diverges (memory)", () => {
  const cases: ReadonlyArray<readonly [string, (runs: Ref.Ref<number>) => Tool.Any]> = [
    [
      "a required field added to its parameters",
      (runs) => chargeTool(runs, Schema.Struct({ cents: Schema.Int, currency: Schema.String }))
    ],
    [
      "an optional field added to its parameters",
      (runs) => chargeTool(runs, Schema.Struct({ cents: Schema.Int, note: Schema.optional(Schema.String) }))
    ],
    ["a field's type changed", (runs) => chargeTool(runs, Schema.Struct({ cents: Schema.String }))],
    ["its description changed (the model is shown it)", (runs) => chargeTool(runs, undefined, "Refunds the customer.")]
  ]
  for (const [change, changed] of cases) {
    it.scoped(`${change}: JournalDivergedError at the first turn, nothing asked or run again`, () =>
      Effect.gen(function*() {
        const mailbox = yield* MailboxMemory.make<string>({ name: "pay" })
        const runs = yield* Ref.make(0)
        yield* mailbox.send("request")
        yield* firstDelivery(mailbox, chargeTool(runs), "r-1")
        expect(yield* Ref.get(runs)).toBe(1)
        const { asked, exit } = yield* redelivery(mailbox, changed(runs), "r-1")
        expect(outcome(exit)).toEqual({
          tag: "JournalDivergedError",
          message: expect.stringContaining("at step 1.1 of request r-1")
        })
        expect(outcome(exit).message).toContain("a tool on offer")
        expect([asked, yield* Ref.get(runs)]).toEqual([0, 1])
      }))
  }

  it.scoped("the same tool, built anew by the new deploy, replays: the model asked once more, the tool not rerun", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "pay" })
      const runs = yield* Ref.make(0)
      yield* mailbox.send("request")
      yield* firstDelivery(mailbox, chargeTool(runs), "r-1")
      const { asked, exit } = yield* redelivery(mailbox, chargeTool(runs), "r-1")
      expect(outcome(exit)).toEqual({ output: "done" })
      expect([asked, yield* Ref.get(runs)]).toEqual([1, 1])
    }))

  it.scoped("a finished evaluation whose reply was lost diverges too when a tool changed (not its recorded answer)", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string>({ name: "pay" })
      const runs = yield* Ref.make(0)
      yield* mailbox.send("request")
      const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      const adapter = yield* ScriptedAdapter.make([toolTurn, { text: "paid" }])
      const done = yield* adapter.evaluate(prompt(chargeTool(runs)), {
        session: yield* Session.make,
        journal: Journal.forDelivery(message!, "r-1")
      })
      expect(done.output).toBe("paid")
      yield* message!.nack() // died before its reply
      const changed = chargeTool(runs, Schema.Struct({ cents: Schema.Int, currency: Schema.String }))
      const { exit } = yield* redelivery(mailbox, changed, "r-1")
      expect(outcome(exit)).toEqual({
        tag: "JournalDivergedError",
        message: expect.stringContaining("at step 1 of request r-1")
      })
    }))

  it.scoped("a tool whose parameters JSON Schema cannot express (bigint) still replays, and diverges when changed", () =>
    Effect.gen(function*() {
      const bigints = (fields: Schema.Struct.Fields) => (runs: Ref.Ref<number>) =>
        chargeTool(runs, Schema.Struct({ cents: Schema.BigIntFromSelf, ...fields }))
      const changes = [
        [bigints({}), { output: "done" }],
        [bigints({ more: Schema.BigIntFromSelf }), { tag: "JournalDivergedError" }]
      ] as const
      for (const [next, expected] of changes) {
        const mailbox = yield* MailboxMemory.make<string>({ name: "pay" })
        const runs = yield* Ref.make(0)
        yield* mailbox.send("request")
        yield* firstDelivery(mailbox, bigints({})(runs), "r-1")
        const { exit } = yield* redelivery(mailbox, next(runs), "r-1")
        expect(outcome(exit)).toMatchObject(expected)
      }
    }))

  it.scoped("a recursive parameter schema diverges when changed deep inside, with an identifier or without", () =>
    Effect.gen(function*() {
      interface Node {
        readonly label: string
        readonly children: ReadonlyArray<Node>
      }
      const tree = (label: Schema.Schema<string>, identifier?: string): Schema.Schema<Node> => {
        const fields = Schema.Struct({ label, children: Schema.Array(Schema.suspend(() => node)) })
        const node: Schema.Schema<Node> = identifier === undefined ? fields : fields.annotations({ identifier })
        return node
      }
      const cases = [
        // With an identifier, JSON Schema expresses it (in its $defs): a change deep inside diverges.
        [tree(Schema.String, "Node"), tree(Schema.NonEmptyString, "Node"), "JournalDivergedError"],
        [tree(Schema.String, "Node"), tree(Schema.String, "Node"), undefined],
        // Without, JSON Schema cannot: its AST is covered instead, through the recursion.
        [tree(Schema.String), tree(Schema.NonEmptyString), "JournalDivergedError"],
        [tree(Schema.String), tree(Schema.String), undefined]
      ] as const
      for (const [before, after, tag] of cases) {
        const mailbox = yield* MailboxMemory.make<string>({ name: "pay" })
        const runs = yield* Ref.make(0)
        yield* mailbox.send("request")
        yield* firstDelivery(mailbox, chargeTool(runs, Schema.Struct({ cents: Schema.Int, tree: before })), "r-1")
        const { exit } = yield* redelivery(
          mailbox,
          chargeTool(runs, Schema.Struct({ cents: Schema.Int, tree: after })),
          "r-1"
        )
        expect(outcome(exit)).toEqual(tag === undefined ? { output: "done" } : expect.objectContaining({ tag }))
      }
    }))
})

for (const backend of sqlBackends("journal-divergence")) {
  let tables = 0
  describe(`a deploy that changed a tool diverges under MainLoop.agent on ${backend.label}`, () => {
    const run = (changed: boolean) =>
      Effect.gen(function*() {
        const prefix = `jd${++tables}_${changed ? "c" : "u"}_`
        const requests = yield* MailboxSql.make({
          name: "pay-requests",
          schema: MainLoop.requestSchema(Schema.String),
          replySchema: MainLoop.resultSchema(Schema.String),
          prefix
        })
        const replies = yield* MailboxSql.make({
          name: "pay-replies",
          schema: MainLoop.resultSchema(Schema.String),
          prefix
        })
        const runs = yield* Ref.make(0)
        yield* requests.send(MainLoop.request("pay", { requestId: "order-1" }), { replyTo: "pay-replies" })
        // The old deploy: the tool ran and was recorded, then the model failed and the request went back.
        yield* firstDelivery(requests, chargeTool(runs), "order-1")
        // The new deploy: the tool now requires a currency.
        const tool = changed
          ? chargeTool(runs, Schema.Struct({ cents: Schema.Int, currency: Schema.String }))
          : chargeTool(runs)
        const adapter = yield* ScriptedAdapter.make([{ text: "done" }])
        const loop = yield* MainLoop.agent({
          requests,
          adapter,
          prepare: () => Effect.succeed(prompt(tool))
        })
        yield* loop.run({ maxIterations: 1, waitTime: "5 seconds", visibilityTimeout: "1 minute" })
        const [reply] = yield* replies.receive({ waitTime: "5 seconds" })
        const sql = yield* SqlClient.SqlClient
        const left = yield* sql`SELECT 1 FROM ${sql(`${prefix}mailbox_journal`)}`
        return {
          reply: reply!.body,
          asked: (yield* adapter.requests).length,
          runs: yield* Ref.get(runs),
          journal: left.length
        }
      }).pipe(
        Effect.provideService(SqlClient.SqlClient, backend.client()),
        Effect.provide(MailboxResolver.layer()),
        Effect.scoped
      )

    it.live(
      "a required field added to the tool's parameters: the reply is JournalDivergedError",
      () =>
        Effect.gen(function*() {
          const { asked, journal, reply, runs } = yield* run(true)
          expect(reply.error).toEqual(expect.objectContaining({ tag: "JournalDivergedError" }))
          expect(reply.error?.message).toContain("at step 1.1 of request order-1")
          expect(reply.output).toBeUndefined()
          expect([asked, runs, reply.runContext.attempt]).toEqual([0, 1, 2])
          expect(journal).toBe(0) // the error reply acknowledged the request, and its journal went with it
        }),
      60_000
    )

    it.live("the tool unchanged: the redelivery replays it and answers", () =>
      Effect.gen(function*() {
        const { asked, reply, runs } = yield* run(false)
        expect(reply.error).toBeUndefined()
        expect([reply.output, asked, runs]).toEqual(["done", 1, 1])
      }), 60_000)
  })
}
