/**
 * The step journal on the memory mailbox (the contract suite, under `TestClock`), and what the loops do with
 * it: `MainLoop.agent` resumes a redelivered request, replies `JournalDivergedError` when the run diverges,
 * and the journal goes with the acknowledgement or stays with a dead letter.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Option, Ref, Schema, TestClock } from "effect"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import * as DeadLetter from "../src/DeadLetter.js"
import * as InnerLoop from "../src/InnerLoop.js"
import { Journaled, journalOf } from "../src/internal/journal.js"
import * as Journal from "../src/Journal.js"
import { MailboxConnectionError, MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import * as Prompt from "../src/Prompt.js"
import * as Session from "../src/Session.js"
import * as Tool from "../src/Tool.js"
import { journalContract } from "./contract/JournalContract.js"
import { sqlBackends } from "./support/sqlBackends.js"

journalContract(
  "memory",
  (options) => MailboxMemory.make<string, string>(options),
  (mailbox, message) => MailboxMemory.journal(mailbox, message.id)
)

// The same contract on SQLite and PostgreSQL, each test on tables of its own (the SQL statements run on the test's
// time, so TestClock drives the leases there too).
let tables = 0
for (const backend of sqlBackends("journal-contract")) {
  journalContract(
    backend.label,
    (options) =>
      Effect.suspend(() =>
        MailboxSql.make({ ...options, schema: Schema.String, replySchema: Schema.String, prefix: `jc${++tables}_` })
          .pipe(Effect.provideService(SqlClient.SqlClient, backend.client()))
      ),
    (_, message) =>
      Effect.map(journalOf(message)!.load, (steps) => steps.length === 0 ? Option.none() : Option.some(steps))
  )
}

describe("replay reads back what the run saw live", () => {
  it.scoped("an adapter whose tool calls carry other fields, in another order, replays without diverging", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "odd-adapter" })
      const calls = yield* Ref.make(0)
      // A hand-written adapter: its calls list `params` first and carry a field of the provider's own.
      const adapter = yield* InnerLoop.makeAdapter(
        "odd",
        (request) =>
          Effect.flatMap(Ref.updateAndGet(calls, (n) => n + 1), (n) => {
            const results = request.messages.filter((message) => message.role === "tool").length
            if (results === 2) {
              return n === 3
                ? Effect.fail(new InnerLoop.ProviderError({ detail: "down" }))
                : Effect.succeed({ text: "done", toolCalls: [], usage: { inputTokens: 1, outputTokens: 1 } })
            }
            const call = { params: { q: `x${results}` }, name: "echo", id: `e${results}`, providerIndex: 0 }
            return Effect.succeed({
              text: "",
              toolCalls: [call as Prompt.ToolCall],
              usage: { inputTokens: 1, outputTokens: 1 }
            })
          })
      )
      const echo = Tool.make({
        name: "echo",
        description: "Echoes.",
        parameters: Schema.Struct({ q: Schema.String }),
        success: Schema.String,
        handler: ({ q }) => Effect.succeed(q)
      })
      const prompt = Prompt.make({ name: "odd", instructions: "Echo.", input: "go", tools: [echo] })
      yield* mailbox.send("request")
      const run = Effect.gen(function*() {
        const [message] = yield* mailbox.receive({ visibilityTimeout: "30 seconds" })
        const session = yield* Session.make
        return yield* Effect.exit(adapter.evaluate(prompt, { session, journal: Journal.forDelivery(message!, "r") }))
      })
      const first = yield* run // two turns and their tools are recorded, then the model fails on the third
      expect(first._tag).toBe("Failure")
      yield* TestClock.adjust("31 seconds")
      const second = yield* run
      expect(Exit.map(second, (response) => response.output)).toEqual(Exit.succeed("done"))
      expect(yield* Ref.get(calls)).toBe(4) // the first two turns were replayed, not asked again
    }))
})

describe("a message's identity", () => {
  it.scoped("a store that cannot name the message fails the step (unavailable) before the tool acts", () =>
    Effect.gen(function*() {
      const ran = yield* Ref.make(0)
      const pay = Tool.make({
        name: "pay",
        description: "Pays, keyed by the message's identity.",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: () => Effect.as(Ref.update(ran, (n) => n + 1), "paid")
      })
      const down = new MailboxConnectionError({ mailbox: "sick", cause: "the identity table is unreachable" })
      // A delivery of a sick store: it reads (nothing recorded yet) but cannot say who the message is.
      const message = {
        deliveryCount: 1,
        [Journaled]: {
          identity: Effect.fail(down),
          load: Effect.succeed([]),
          append: () => Effect.void,
          truncate: () => Effect.void,
          keep: Effect.void
        }
      }
      const adapter = yield* ScriptedAdapter.make([{ toolCalls: [{ id: "p", name: "pay", params: {} }] }, {
        text: "x"
      }])
      const exit = yield* Effect.exit(adapter.evaluate(
        Prompt.make({ name: "p", instructions: "Pay.", input: "go", tools: [pay] }),
        { session: yield* Session.make, journal: Journal.forDelivery(message, "r")! }
      ))
      expect(exit).toEqual(Exit.fail(expect.objectContaining({ _tag: "JournalStoreError", reason: "unavailable" })))
      expect(yield* Ref.get(ran)).toBe(0) // no key, no side effect
    }))

  it.effect("without a journaling mailbox the key is the session's, and the fencing token is the attempt", () =>
    Effect.gen(function*() {
      const seen = yield* Ref.make<ReadonlyArray<readonly [string, number | undefined]>>([])
      const probe = Tool.make({
        name: "probe",
        description: "Reports its context.",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: (_, context) =>
          Effect.as(Ref.update(seen, (all) => [...all, [context.idempotencyKey, context.fencingToken] as const]), "ok")
      })
      const session = yield* Session.make
      const adapter = yield* ScriptedAdapter.make([{ toolCalls: [{ id: "p", name: "probe", params: {} }] }, {
        text: "x"
      }])
      yield* adapter.evaluate(Prompt.make({ name: "p", instructions: "Go.", input: "go", tools: [probe] }), {
        session,
        runContext: { workerId: "w", runId: "r", requestId: "order-42", attempt: 3 }
      })
      expect(yield* Ref.get(seen)).toEqual([[`${session.id}/1.2`, 3]])
    }))
})

describe("a journal is bounded", () => {
  /** An empty model turn recorded at `key`. */
  const turnStep = (key: string): Journal.Step => ({
    _tag: "Turn",
    key,
    promptName: "p",
    asked: "x",
    text: "",
    toolCalls: [],
    usage: { inputTokens: 0, outputTokens: 0 },
    durationMs: 0
  })

  it.scoped(`a journal of more than Journal.maxSteps steps stops the run (too large) before it reads them all`, () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "long-run" })
      yield* mailbox.send("request")
      const [first] = yield* mailbox.receive({ visibilityTimeout: "30 seconds" })
      for (let position = 1; position <= Journal.maxSteps + 1; position++) {
        yield* journalOf(first!)!.append({
          position,
          key: `9.${position}`,
          entry: JSON.stringify(turnStep(`9.${position}`)),
          requestId: "r"
        })
      }
      yield* TestClock.adjust("31 seconds")
      const [second] = yield* mailbox.receive({ visibilityTimeout: "30 seconds" })
      const journal = Journal.forDelivery(second!, "r")!
      const read = yield* Effect.either(journal.recorded("1"))
      expect(read).toEqual(expect.objectContaining({ left: expect.objectContaining({ reason: "too large" }) }))
    }))

  it.scoped("a run that would record more than Journal.maxSteps steps stops (too large) and records nothing more", () =>
    Effect.gen(function*() {
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "long-run" })
      yield* mailbox.send("request")
      const [message] = yield* mailbox.receive({ visibilityTimeout: "30 seconds" })
      const journal = Journal.forDelivery(message!, "r")!
      for (let n = 1; n <= Journal.maxSteps; n++) yield* journal.append(turnStep(`1.${n}`))
      const over = yield* Effect.either(journal.append(turnStep("1.overflow")))
      expect(over).toEqual(expect.objectContaining({ left: expect.objectContaining({ reason: "too large" }) }))
      expect(Option.map(yield* MailboxMemory.journal(mailbox, message!.id), (steps) => steps.length))
        .toEqual(Option.some(Journal.maxSteps))
    }))
})

/** Lets forked fibers run up to their next wait. */
const settle = Effect.repeatN(Effect.yieldNow(), 50)

describe("MainLoop.agent with a journal", () => {
  type Request = MainLoop.MainLoopRequest<string>
  const setup = (policy: DeadLetter.Options) =>
    Effect.gen(function*() {
      const requests = yield* MailboxMemory.make<Request, MainLoop.MainLoopResult<string>>({ name: "agent-requests" })
      const replies = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "agent-replies" })
      const letters = yield* MailboxMemory.make<DeadLetter.DeadLetter<Request>>({ name: "agent-dead-letters" })
      const charges = yield* Ref.make(0)
      const instructions = yield* Ref.make("Pay.")
      const charge = Tool.make({
        name: "charge",
        description: "Charges a card.",
        parameters: Schema.Struct({}),
        success: Schema.String,
        handler: () => Effect.as(Ref.update(charges, (n) => n + 1), "charged")
      })
      const deadLetters = { mailbox: letters, policy: yield* DeadLetter.policy(policy) }
      const start = (adapter: ScriptedAdapter.Scripted) =>
        Effect.gen(function*() {
          const loop = yield* MainLoop.agent({
            requests,
            adapter,
            prepare: () =>
              Effect.map(
                Ref.get(instructions),
                (text) => Prompt.make({ name: "pay", instructions: text, input: "pay", tools: [charge] })
              ),
            config: { deadLetters }
          })
          yield* Effect.forkScoped(loop.run({ visibilityTimeout: "30 seconds" }))
        }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(replies)))
      const id = yield* requests.send(MainLoop.request("go", { requestId: "r-1" }), { replyTo: "agent-replies" })
      return { requests, replies, letters, charges, instructions, start, id }
    })

  /** Moves test time on in 1 s steps, letting the loop's fibers run between them. */
  const advance = (seconds: number) =>
    Effect.gen(function*() {
      for (let step = 0; step < seconds; step++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      yield* settle
    })

  const toolTurn: ScriptedAdapter.ScriptedTurn = { toolCalls: [{ id: "c", name: "charge", params: {} }] }

  it.scoped("a request whose model failed mid-run resumes on redelivery: one charge, and the journal goes with the ack", () =>
    Effect.gen(function*() {
      const env = yield* setup({ maxDeliveryCount: 3 })
      // One worker: the model calls the tool, then fails (the request goes back with backoff), then answers.
      const adapter = yield* ScriptedAdapter.make([toolTurn, { fail: "overloaded" }, { text: "paid" }])
      yield* env.start(adapter)
      yield* advance(2)
      expect(Option.map(yield* MailboxMemory.journal(env.requests, env.id), (steps) => steps.length))
        .toEqual(Option.some(2))
      yield* advance(61) // the backoff of a first failure
      const [reply] = yield* env.replies.receive()
      expect([reply?.body.output, reply?.body.runContext.attempt]).toEqual(["paid", 2])
      expect(yield* Ref.get(env.charges)).toBe(1)
      const asked = yield* adapter.requests
      expect(asked).toHaveLength(3) // not 4: the first turn was not asked again…
      // …and the model was asked to go on from the recorded conversation, the tool's result in it.
      expect(asked[2]!.messages.map((message) => message.role)).toEqual(["system", "user", "assistant", "tool"])
      expect(yield* MailboxMemory.journal(env.requests, env.id)).toEqual(Option.none())
    }))

  it.scoped("a dead-lettered request keeps its journal for the operator", () =>
    Effect.gen(function*() {
      const env = yield* setup({ maxDeliveryCount: 1 })
      yield* env.start(yield* ScriptedAdapter.make([toolTurn, { fail: "overloaded" }]))
      yield* advance(2)
      const [letter] = yield* env.letters.receive()
      expect(letter?.body.messageId).toBe(env.id)
      const kept = yield* MailboxMemory.journal(env.requests, env.id)
      expect(Option.map(kept, (steps) => steps.map((step) => step.key))).toEqual(Option.some(["1.1", "1.2"]))
      expect(yield* env.requests.approximateCount).toBe(0)
    }))

  it.scoped("a run that diverged from its journal replies JournalDivergedError (dead-lettered at once by policy)", () =>
    Effect.gen(function*() {
      const env = yield* setup({ maxDeliveryCount: 5, includeErrors: ["JournalDivergedError"] })
      const adapter = yield* ScriptedAdapter.make([toolTurn, { fail: "overloaded" }, { text: "paid" }])
      yield* env.start(adapter)
      yield* advance(2)
      yield* Ref.set(env.instructions, "Pay twice.") // a deploy changed the prompt before the redelivery
      yield* advance(61)
      const [reply] = yield* env.replies.receive()
      expect(reply?.body.error).toEqual(expect.objectContaining({ tag: "JournalDivergedError" }))
      expect(reply?.body.error?.message).toContain("at step 1.1 of request r-1")
      expect(yield* adapter.requests).toHaveLength(2)
      expect(yield* Ref.get(env.charges)).toBe(1)
    }))
})
