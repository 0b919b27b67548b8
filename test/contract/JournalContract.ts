/**
 * The step journal's contract: what an agent run does with the journal a
 * delivery offers, run against every mailbox backend that keeps journals.
 * Each test evaluates a prompt the way `MainLoop.agent` does — one delivery,
 * its journal, the inner loop — and "crashes" a delivery by letting its model
 * fail or its lease run out, then delivers the message again. Time is
 * `TestClock`'s.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Metric, Option, Ref, Schema, TestClock } from "effect"
import { createHash } from "node:crypto"
import * as ScriptedAdapter from "../../src/adapters/ScriptedAdapter.js"
import * as Budget from "../../src/Budget.js"
import { journalOf } from "../../src/internal/journal.js"
import * as Journal from "../../src/Journal.js"
import type { Mailbox, Message } from "../../src/Mailbox.js"
import * as Prompt from "../../src/Prompt.js"
import type { RunContext } from "../../src/RunContext.js"
import * as Session from "../../src/Session.js"
import * as Subagent from "../../src/Subagent.js"
import * as Tool from "../../src/Tool.js"
import type { MakeMailbox } from "./MailboxContract.js"

/**
 * `length` characters that do not compress (base64 of a hash chain): PostgreSQL compresses an index entry before it
 * checks its size, so a repeated character would fit its btree where a real long id does not.
 */
const incompressible = (length: number): string => {
  let text = ""
  for (let n = 0; text.length < length; n++) text += createHash("sha256").update(`${n}`).digest("base64")
  return text.slice(0, length)
}

/** What the backend still stores of `message`'s journal after its acknowledgement (memory: `MailboxMemory.journal`). */
export type JournalKept = (
  mailbox: Mailbox<string, string>,
  message: Message<string, string>
) => Effect.Effect<Option.Option<ReadonlyArray<unknown>>, unknown>

/** What the tools did, across every delivery. */
interface World {
  readonly lookups: Ref.Ref<number>
  /** The idempotency key of every charge made. */
  readonly charges: Ref.Ref<ReadonlyArray<string>>
  readonly clockReads: Ref.Ref<number>
  readonly clock: Ref.Ref<number>
}

const makeWorld = Effect.all({
  lookups: Ref.make(0),
  charges: Ref.make<ReadonlyArray<string>>([]),
  clockReads: Ref.make(0),
  clock: Ref.make(100)
})

const tools = (world: World) => [
  Tool.make({
    name: "lookup",
    description: "Looks a word up.",
    parameters: Schema.Struct({ q: Schema.String }),
    success: Schema.String,
    handler: ({ q }) => Effect.as(Ref.update(world.lookups, (n) => n + 1), `found ${q}`)
  }),
  Tool.make({
    name: "charge",
    description: "Charges a card: a side effect outside leasehold.",
    parameters: Schema.Struct({ amount: Schema.Number }),
    success: Schema.String,
    handler: ({ amount }, context) =>
      Effect.as(Ref.update(world.charges, (all) => [...all, context.idempotencyKey]), `charged ${amount}`)
  }),
  Tool.make({
    name: "now",
    description: "Reads a clock that moves: it must run again on replay.",
    parameters: Schema.Struct({}),
    success: Schema.Number,
    replay: "rerun",
    handler: () => Effect.zipRight(Ref.update(world.clockReads, (n) => n + 1), Ref.get(world.clock))
  })
]

const turn1: ScriptedAdapter.ScriptedTurn = {
  toolCalls: [{ id: "a", name: "lookup", params: { q: "a" } }, { id: "b", name: "charge", params: { amount: 5 } }],
  usage: { inputTokens: 40, outputTokens: 20 }
}
const turn2: ScriptedAdapter.ScriptedTurn = {
  toolCalls: [{ id: "c", name: "lookup", params: { q: "b" } }],
  usage: { inputTokens: 30, outputTokens: 10 }
}
const turn3: ScriptedAdapter.ScriptedTurn = { text: "done", usage: { inputTokens: 5, outputTokens: 5 } }

const promptFor = (world: World, instructions = "Help.") =>
  Prompt.make({ name: "helper", instructions, input: "do it", tools: tools(world) })

/** One delivery of the only message, with its journal (its steps labelled `requestId`). */
const deliver = (mailbox: Mailbox<string, string>, requestId = "request-1") =>
  Effect.map(mailbox.receive({ visibilityTimeout: "30 seconds" }), (messages) => {
    expect(messages).toHaveLength(1)
    const message = messages[0]!
    return { message, journal: Journal.forDelivery(message, requestId)! }
  })

/** The run context of `message`'s delivery, as the loops make it: its attempt is the delivery count. */
const runContextOf = (message: Message<string, string>, requestId = "request-1"): RunContext => ({
  workerId: "w",
  runId: `run-${message.deliveryCount}`,
  requestId,
  attempt: message.deliveryCount
})

const evaluate = (
  adapter: ScriptedAdapter.Scripted,
  prompt: Prompt.Prompt<string>,
  journal: Journal.Journal,
  budgetTracker?: Budget.BudgetTracker,
  runContext?: RunContext
) =>
  Effect.flatMap(Session.make, (session) =>
    Effect.map(
      Effect.exit(adapter.evaluate(prompt, { session, journal, budgetTracker, runContext })),
      (exit) => ({ exit, session })
    ))

/**
 * A tiny fenced store, as a tool's own storage would be: a write carries a fencing token, and the store refuses a
 * token lower than the highest it accepted for the resource (a zombie's), keeping the current holder's write.
 */
interface Fenced {
  readonly highest: ReadonlyMap<string, number>
  readonly values: ReadonlyMap<string, string>
  readonly refused: ReadonlyArray<string>
}

const makeFencedStore = Effect.map(
  Ref.make<Fenced>({ highest: new Map(), values: new Map(), refused: [] }),
  (state) => ({
    state,
    write: (resource: string, value: string, token: number) =>
      Ref.modify(state, (now): [boolean, Fenced] => {
        const highest = now.highest.get(resource) ?? 0
        if (token < highest) return [false, { ...now, refused: [...now.refused, `${value} (token ${token})`] }]
        return [true, {
          ...now,
          highest: new Map([...now.highest, [resource, token]]),
          values: new Map([...now.values, [resource, value]])
        }]
      })
  })
)

/** The steps stored for `message` (read through a delivery's journal). */
const stored = (message: Message<string, string>) =>
  Effect.map(journalOf(message)!.load, (steps) => steps.map((step) => step.key))

/** The first delivery dies after the first turn and its two tools: the model fails on the second turn. */
const crashAfterThreeSteps = (mailbox: Mailbox<string, string>, world: World) =>
  Effect.gen(function*() {
    yield* mailbox.send("request")
    const first = yield* deliver(mailbox)
    const adapter = yield* ScriptedAdapter.make([turn1, { fail: "provider down" }])
    const { exit } = yield* evaluate(adapter, promptFor(world), first.journal)
    expect(Exit.isFailure(exit)).toBe(true)
    expect(yield* stored(first.message)).toEqual(["1.1", "1.2", "1.3"])
    yield* TestClock.adjust("31 seconds") // its lease runs out: the message comes back
    return first
  })

export const journalContract = (label: string, make: MakeMailbox, journalKept: JournalKept) =>
  describe(`Journal contract: ${label}`, () => {
    const fresh = make({ name: "agent-requests" })

    it.scoped("a redelivered run replays the recorded steps and goes on live: no model call or tool call again", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* crashAfterThreeSteps(mailbox, world)
        const second = yield* deliver(mailbox)
        expect(second.message.deliveryCount).toBe(2)
        const adapter = yield* ScriptedAdapter.make([turn2, turn3])
        const replayedBefore = (yield* Metric.value(Journal.stepsReplayed)).count
        const { exit, session } = yield* evaluate(adapter, promptFor(world), second.journal)
        expect((yield* Metric.value(Journal.stepsReplayed)).count - replayedBefore).toBe(3)
        expect(exit).toEqual(
          Exit.succeed({ output: "done", text: "done", usage: { inputTokens: 75, outputTokens: 35 } })
        )
        // The model was asked for the second and third turns only, the tools of the first turn did not run again.
        expect(yield* adapter.requests).toHaveLength(2)
        expect(yield* Ref.get(world.lookups)).toBe(2) // "a" on the first delivery, "b" on the second
        expect(yield* Ref.get(world.charges)).toEqual([`${yield* second.journal.identity}/1.3`])
        const events = yield* session.events
        expect(events.filter((e) => e.replayed === true).map((e) => e._tag)).toEqual([
          "ProviderCall",
          "ToolCall",
          "ToolResult",
          "ToolCall",
          "ToolResult"
        ])

        // An uninterrupted run asks the model the same thing at every turn and answers the same.
        const other = yield* make({ name: "agent-requests-uninterrupted" })
        yield* other.send("request")
        const alone = yield* deliver(other)
        const straight = yield* ScriptedAdapter.make([turn1, turn2, turn3])
        const uninterrupted = yield* evaluate(straight, promptFor(yield* makeWorld), alone.journal)
        expect(uninterrupted.exit).toEqual(exit)
        const resumedAsked = (yield* adapter.requests).map((request) => request.messages)
        expect((yield* straight.requests).slice(1).map((request) => request.messages)).toEqual(resumedAsked)
      }))

    it.scoped("a delivery that lost its lease cannot append: its run stops with JournalStoreError (lease lost)", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* mailbox.send("request")
        const zombie = yield* deliver(mailbox)
        yield* TestClock.adjust("31 seconds") // the lease ran out while the model was thinking
        const adapter = yield* ScriptedAdapter.make([turn1, turn2, turn3])
        const { exit } = yield* evaluate(adapter, promptFor(world), zombie.journal)
        expect(exit).toEqual(Exit.fail(expect.objectContaining({ _tag: "JournalStoreError", reason: "lease lost" })))
        expect(yield* Ref.get(world.lookups)).toBe(0) // it stopped at the turn it could not record
        // And once another delivery holds the message, the zombie's appends are refused too.
        const current = yield* deliver(mailbox)
        const late = yield* Effect.either(zombie.journal.append({
          _tag: "Turn",
          key: "1.1",
          promptName: "helper",
          asked: "x",
          text: "",
          toolCalls: [],
          usage: { inputTokens: 0, outputTokens: 0 },
          durationMs: 0
        }))
        expect(late).toEqual(expect.objectContaining({ left: expect.objectContaining({ reason: "lease lost" }) }))
        expect(yield* stored(current.message)).toEqual([])
      }))

    it.scoped("a run that asks for something else at a recorded step stops with JournalDivergedError", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* crashAfterThreeSteps(mailbox, world)
        const second = yield* deliver(mailbox)
        const adapter = yield* ScriptedAdapter.make([turn1, turn2, turn3])
        const divergedBefore = (yield* Metric.value(Journal.divergences)).count
        // A deploy changed the prompt's instructions in between.
        const { exit } = yield* evaluate(adapter, promptFor(world, "Help, tersely."), second.journal)
        expect((yield* Metric.value(Journal.divergences)).count - divergedBefore).toBe(1)
        expect(exit).toEqual(Exit.fail(expect.objectContaining({
          _tag: "JournalDivergedError",
          key: "1.1",
          requestId: "request-1"
        })))
        expect(yield* adapter.requests).toHaveLength(0) // never a mix of two runs
        expect(Exit.isFailure(exit) && String(exit.cause)).toContain("diverged from its journal at step 1.1")
      }))

    it.scoped("a \"rerun\" tool runs again; a result that changed discards what was recorded after it", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        const script: ReadonlyArray<ScriptedAdapter.ScriptedTurn> = [
          { toolCalls: [{ id: "t", name: "now", params: {} }] },
          { toolCalls: [{ id: "l", name: "lookup", params: { q: "x" } }] },
          { fail: "provider down" }
        ]
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        yield* evaluate(yield* ScriptedAdapter.make(script), promptFor(world), first.journal)
        expect(yield* stored(first.message)).toEqual(["1.1", "1.2", "1.3", "1.4"])
        yield* TestClock.adjust("31 seconds")

        // Same clock: the rerun tool runs, agrees with its record, and the replay goes on past it.
        const second = yield* deliver(mailbox)
        yield* evaluate(yield* ScriptedAdapter.make([{ fail: "provider down" }]), promptFor(world), second.journal)
        expect(yield* Ref.get(world.clockReads)).toBe(2)
        expect(yield* Ref.get(world.lookups)).toBe(1)
        yield* TestClock.adjust("31 seconds")

        // The clock moved: the turn recorded after it answered a question nobody asks now. Live from there on.
        yield* Ref.set(world.clock, 200)
        const third = yield* deliver(mailbox)
        const live = yield* ScriptedAdapter.make([{ text: "it is 200" }])
        const { exit } = yield* evaluate(live, promptFor(world), third.journal)
        expect(Exit.map(exit, (response) => response.output)).toEqual(Exit.succeed("it is 200"))
        expect(yield* Ref.get(world.clockReads)).toBe(3)
        expect(yield* Ref.get(world.lookups)).toBe(1)
        const asked = yield* live.requests
        expect(asked[0]!.messages.at(-1)).toEqual(expect.objectContaining({ role: "tool", content: "200" }))
        expect(yield* stored(third.message)).toEqual(["1.1", "1.2", "1.3", "1"])
      }))

    it.scoped("tokens spent by earlier deliveries count against the budget", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* crashAfterThreeSteps(mailbox, world) // 60 tokens spent on the first turn
        const second = yield* deliver(mailbox)
        const budget = yield* Budget.make({ maxTotalTokens: 90 })
        const tracker = yield* Budget.makeTracker(budget)
        const adapter = yield* ScriptedAdapter.make([turn2, turn3])
        const { exit } = yield* evaluate(adapter, promptFor(world), second.journal, tracker)
        // 60 replayed + 40 live > 90: the second turn is over budget, as it would have been in one delivery.
        expect(exit).toEqual(Exit.fail(expect.objectContaining({ reason: "budget" })))
        expect((yield* tracker.consumed).totalTokens).toBe(100)
        expect(yield* adapter.requests).toHaveLength(1)
      }))

    it.scoped("a completed evaluation is replayed whole: a delivery that died before its reply asks nothing", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        const done = yield* evaluate(
          yield* ScriptedAdapter.make([turn1, turn2, turn3]),
          promptFor(world),
          first.journal
        )
        expect(Exit.isSuccess(done.exit)).toBe(true)
        yield* TestClock.adjust("31 seconds") // died before acknowledging
        const second = yield* deliver(mailbox)
        const adapter = yield* ScriptedAdapter.make([])
        const { exit } = yield* evaluate(adapter, promptFor(world), second.journal)
        expect(exit).toEqual(done.exit)
        expect(yield* adapter.requests).toHaveLength(0)
        expect(yield* Ref.get(world.charges)).toHaveLength(1)
      }))

    it.scoped("a subagent's steps are recorded inside its tool call: a tool that died reruns, its subagent replays", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const childCalls = yield* Ref.make(0)
        const child = Prompt.make({ name: "child", instructions: "Summarise.", input: "text" })
        const delegate = (failAfterChild: boolean) =>
          Tool.make({
            name: "delegate",
            description: "Asks a subagent.",
            parameters: Schema.Struct({}),
            success: Schema.String,
            handler: (_, context) =>
              Effect.gen(function*() {
                yield* Ref.update(childCalls, (n) => n + 1)
                const response = yield* Effect.orDie(Subagent.evaluate(context, child))
                // The worker dies after the subagent answered, before the tool's result is recorded.
                if (failAfterChild) return yield* Effect.interrupt
                return `child said ${response.output}`
              })
          })
        const parent = (failAfterChild: boolean) =>
          Prompt.make({ name: "parent", instructions: "Delegate.", input: "go", tools: [delegate(failAfterChild)] })
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        const dying = yield* ScriptedAdapter.make([{ toolCalls: [{ id: "d", name: "delegate", params: {} }] }, {
          text: "summary"
        }])
        yield* evaluate(dying, parent(true), first.journal)
        expect(yield* stored(first.message)).toEqual(["1.1", "1.2.1.1", "1.2.1"])
        yield* TestClock.adjust("31 seconds")

        const second = yield* deliver(mailbox)
        const adapter = yield* ScriptedAdapter.make([{ text: "finished" }])
        const { exit } = yield* evaluate(adapter, parent(false), second.journal)
        expect(Exit.map(exit, (response) => response.output)).toEqual(Exit.succeed("finished"))
        expect(yield* Ref.get(childCalls)).toBe(2) // the tool ran again…
        const asked = yield* adapter.requests
        expect(asked).toHaveLength(1) // …but its subagent's turn came from the journal
        expect(asked[0]!.messages.at(-1)).toEqual(expect.objectContaining({ content: "\"child said summary\"" }))
      }))

    it.scoped("a tool that acted but died before its result was recorded runs again with the same idempotency key", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const keys = yield* Ref.make<ReadonlyArray<string>>([])
        const pay = (dies: boolean) =>
          Tool.make({
            name: "pay",
            description: "Pays; the payment service dedupes by key.",
            parameters: Schema.Struct({}),
            success: Schema.String,
            handler: (_, context) =>
              Effect.zipRight(
                Ref.update(keys, (all) => [...all, context.idempotencyKey]),
                dies ? Effect.interrupt : Effect.succeed("paid")
              )
          })
        const prompt = (dies: boolean) =>
          Prompt.make({ name: "p", instructions: "Pay.", input: "go", tools: [pay(dies)] })
        const script: ReadonlyArray<ScriptedAdapter.ScriptedTurn> = [{
          toolCalls: [{ id: "p", name: "pay", params: {} }]
        }]
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        yield* evaluate(yield* ScriptedAdapter.make(script), prompt(true), first.journal)
        yield* TestClock.adjust("31 seconds")
        const second = yield* deliver(mailbox)
        yield* evaluate(yield* ScriptedAdapter.make([{ text: "done" }]), prompt(false), second.journal)
        const identity = yield* first.journal.identity
        expect(identity).toBeDefined()
        expect(yield* second.journal.identity).toBe(identity)
        expect(yield* Ref.get(keys)).toEqual([`${identity}/1.2`, `${identity}/1.2`])
      }))

    it.scoped("two messages sent with the same request id get different idempotency keys; each keeps its own", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        // A sender reuses its request id for two different charges: the payment service must see two keys.
        yield* mailbox.send("charge 5")
        yield* mailbox.send("charge 7")
        const both = yield* mailbox.receive({ maxMessages: 2, visibilityTimeout: "30 seconds" })
        expect(both).toHaveLength(2)
        const charge: ScriptedAdapter.ScriptedTurn = { toolCalls: [{ id: "b", name: "charge", params: { amount: 5 } }] }
        for (const message of both) {
          const journal = Journal.forDelivery(message, "order-42")!
          yield* evaluate(yield* ScriptedAdapter.make([charge, { fail: "down" }]), promptFor(world), journal)
        }
        const keys = yield* Ref.get(world.charges)
        expect(keys).toHaveLength(2)
        expect(keys[0]).not.toBe(keys[1])
        for (const key of keys) expect(key).not.toContain("order-42") // never the sender's id
        // Redelivered, each message names itself as before.
        const identities = yield* Effect.forEach(both, (message) => Journal.forDelivery(message, "order-42")!.identity)
        yield* TestClock.adjust("31 seconds")
        const again = yield* mailbox.receive({ maxMessages: 2, visibilityTimeout: "30 seconds" })
        const byId = new Map(again.map((message) => [message.id, message]))
        for (const [index, message] of both.entries()) {
          const redelivered = byId.get(message.id)!
          expect(redelivered.deliveryCount).toBe(2)
          expect(yield* Journal.forDelivery(redelivered, "order-42")!.identity).toBe(identities[index])
        }
        expect(keys).toEqual(identities.map((identity) => `${identity}/1.2`))
      }))

    it.scoped("a zombie's fenced write is refused: the attempt is a fencing token the tool hands its storage", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const store = yield* makeFencedStore
        const zombieStarted = yield* Deferred.make<void>()
        const releaseZombie = yield* Deferred.make<void>()
        const zombieWrote = yield* Deferred.make<boolean>()
        const tokens = yield* Ref.make<ReadonlyArray<number | undefined>>([])
        const save = Tool.make({
          name: "save",
          description: "Saves the account's balance in a fenced store.",
          parameters: Schema.Struct({ balance: Schema.Number }),
          success: Schema.String,
          handler: ({ balance }, context) =>
            Effect.gen(function*() {
              yield* Ref.update(tokens, (all) => [...all, context.fencingToken])
              const token = context.fencingToken!
              if (token === 1) {
                // The first delivery stalls past its lease: the message is redelivered meanwhile.
                yield* Deferred.succeed(zombieStarted, undefined)
                yield* Deferred.await(releaseZombie)
              }
              const accepted = yield* store.write("account-7", `balance ${balance} by attempt ${token}`, token)
              if (token === 1) yield* Deferred.succeed(zombieWrote, accepted as boolean)
              return accepted ? "saved" : "refused: a newer attempt holds the account"
            })
        })
        const prompt = Prompt.make({ name: "bank", instructions: "Save.", input: "go", tools: [save] })
        const script: ReadonlyArray<ScriptedAdapter.ScriptedTurn> = [
          { toolCalls: [{ id: "s", name: "save", params: { balance: 10 } }] },
          { text: "done" }
        ]
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        const zombie = yield* Effect.fork(
          evaluate(yield* ScriptedAdapter.make(script), prompt, first.journal, undefined, runContextOf(first.message))
        )
        yield* Deferred.await(zombieStarted)
        yield* TestClock.adjust("31 seconds") // the zombie's lease runs out
        const second = yield* deliver(mailbox)
        expect(second.message.deliveryCount).toBe(2)
        // Its model turn is replayed (the call to save 10), the tool runs again, now as attempt 2.
        const current = yield* evaluate(
          yield* ScriptedAdapter.make([{ text: "done" }]),
          prompt,
          second.journal,
          undefined,
          runContextOf(second.message)
        )
        expect(Exit.map(current.exit, (response) => response.output)).toEqual(Exit.succeed("done"))
        yield* Deferred.succeed(releaseZombie, undefined)
        expect(yield* Deferred.await(zombieWrote)).toBe(false) // its fenced write was refused…
        const { exit } = yield* Fiber.join(zombie)
        // …and it could not record either: its lease is gone.
        expect(exit).toEqual(Exit.fail(expect.objectContaining({ _tag: "JournalStoreError", reason: "lease lost" })))
        const state = yield* Ref.get(store.state)
        expect(state.values.get("account-7")).toBe("balance 10 by attempt 2")
        expect(state.refused).toEqual(["balance 10 by attempt 1 (token 1)"])
        expect(yield* Ref.get(tokens)).toEqual([1, 2])
      }))

    for (
      const [what, requestId] of [
        ["a request id of 4,000 characters", incompressible(4000)],
        ["a request id with a NUL", "order\u0000-42"],
        ["a request id with a lone surrogate", "order-\ud800"],
        ["a request id of astral and combining characters", "\u{1F4B8}e\u0301".repeat(500)]
      ] as const
    ) {
      it.scoped(`${what} is journaled: a redelivery replays its steps`, () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh
          const world = yield* makeWorld
          yield* mailbox.send("request")
          const first = yield* deliver(mailbox, requestId)
          const dying = yield* ScriptedAdapter.make([turn1, { fail: "provider down" }])
          const crashed = yield* evaluate(dying, promptFor(world), first.journal)
          expect(crashed.exit).toEqual(Exit.fail(expect.objectContaining({ _tag: "PromptEvaluationError" })))
          expect(yield* stored(first.message)).toEqual(["1.1", "1.2", "1.3"])
          const steps = yield* journalOf(first.message)!.load
          expect(steps.map((step) => step.requestId)).toEqual([requestId, requestId, requestId])
          yield* TestClock.adjust("31 seconds")
          const second = yield* deliver(mailbox, requestId)
          const adapter = yield* ScriptedAdapter.make([turn2, turn3])
          const { exit } = yield* evaluate(adapter, promptFor(world), second.journal)
          expect(Exit.map(exit, (response) => response.output)).toEqual(Exit.succeed("done"))
          expect(yield* adapter.requests).toHaveLength(2) // the first turn came from the journal
        }))
    }

    it.scoped("the step limit is in UTF-8 bytes: '€' and astral characters count as they are stored", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        // Fewer UTF-16 units than the limit, more bytes: 3 bytes a '€', 4 an emoji (2 units).
        for (
          const huge of ["€".repeat(Journal.maxStepBytes / 3 + 1), "\u{1F600}".repeat(Journal.maxStepBytes / 4 + 1)]
        ) {
          expect(huge.length).toBeLessThan(Journal.maxStepBytes)
          const adapter = yield* ScriptedAdapter.make([{ text: huge }])
          const { exit } = yield* evaluate(adapter, promptFor(world), first.journal)
          // A model turn over the limit is refused by the inner loop with the journal's own measure
          // (`Journal.stepBytes`), as the documented limit_bytes error, before the journal is asked to store it.
          expect(exit).toEqual(Exit.fail(expect.objectContaining({
            _tag: "PromptEvaluationError",
            phase: "response",
            reason: "provider",
            providerPayload: { limit_bytes: Journal.maxStepBytes }
          })))
          expect(Exit.isFailure(exit) && String(exit.cause)).toMatch(/is \d+ bytes as the journal stores it \(UTF-8/)
          // The journal itself refuses the step as "too large", by the same measure.
          const step: Journal.Step = {
            _tag: "Turn",
            key: "9",
            promptName: "p",
            asked: "a",
            text: huge,
            toolCalls: [],
            usage: { inputTokens: 1, outputTokens: 1 },
            durationMs: 0
          }
          expect(Journal.stepBytes(step)).toBeGreaterThan(Journal.maxStepBytes)
          const refused = yield* Effect.flip(first.journal.append(step))
          expect([refused._tag, refused.reason]).toEqual(["JournalStoreError", "too large"])
          expect(refused.message).toMatch(/is \d+ bytes \(UTF-8\)/)
        }
        expect(yield* stored(first.message)).toEqual([])
        // Just under the limit in bytes is recorded, and replays.
        const fits = "€".repeat(Math.floor((Journal.maxStepBytes - 1024) / 3))
        const { exit } = yield* evaluate(yield* ScriptedAdapter.make([{ text: fits }]), promptFor(world), first.journal)
        expect(Exit.map(exit, (response) => response.output.length)).toEqual(Exit.succeed(fits.length))
        expect(yield* stored(first.message)).toEqual(["3.1", "3"]) // the third evaluation of this delivery
      }))

    it.scoped("a stored step that does not decode stops the run with JournalStoreError (undecodable)", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        yield* journalOf(first.message)!.append({
          position: 1,
          key: "1.1",
          entry: "{\"_tag\":\"Turn\"",
          requestId: "x"
        })
        yield* TestClock.adjust("31 seconds")
        const second = yield* deliver(mailbox)
        const adapter = yield* ScriptedAdapter.make([turn1])
        const { exit } = yield* evaluate(adapter, promptFor(world), second.journal)
        expect(exit).toEqual(Exit.fail(expect.objectContaining({ _tag: "JournalStoreError", reason: "undecodable" })))
        expect(yield* adapter.requests).toHaveLength(0)
      }))

    it.scoped("a step larger than the limit is refused before it is stored, naming its size", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* mailbox.send("request")
        const first = yield* deliver(mailbox)
        const huge = "x".repeat(Journal.maxStepBytes)
        const { exit } = yield* evaluate(yield* ScriptedAdapter.make([{ text: huge }]), promptFor(world), first.journal)
        // The model turn: the documented limit_bytes error (the inner loop measures the step as the journal would).
        expect(exit).toEqual(Exit.fail(expect.objectContaining({
          _tag: "PromptEvaluationError",
          providerPayload: { limit_bytes: Journal.maxStepBytes }
        })))
        // Any step handed to the journal over the limit: JournalStoreError "too large", naming the way out.
        const refused = yield* Effect.flip(first.journal.append({
          _tag: "Tool",
          key: "9",
          promptName: "p",
          toolName: "t",
          callId: "c",
          asked: "a",
          replay: "journal",
          ok: true,
          value: huge,
          durationMs: 0
        }))
        expect([refused._tag, refused.reason]).toEqual(["JournalStoreError", "too large"])
        expect(refused.message).toContain("replay: \"rerun\"")
        expect(yield* stored(first.message)).toEqual([])
      }))

    it.scoped("the journal goes with the acknowledgement, and stays with `keep` (a dead letter)", () =>
      Effect.gen(function*() {
        const mailbox = yield* fresh
        const world = yield* makeWorld
        yield* crashAfterThreeSteps(mailbox, world)
        const second = yield* deliver(mailbox)
        expect(yield* stored(second.message)).toHaveLength(3)
        yield* Journal.keep(second.message)
        yield* second.message.acknowledge
        const kept = yield* journalKept(mailbox, second.message)
        expect(Option.map(kept, (steps) => steps.length)).toEqual(Option.some(3))

        yield* crashAfterThreeSteps(mailbox, world)
        const third = yield* deliver(mailbox)
        yield* third.journal.recorded("1.1") // an agent reads it…
        yield* third.message.acknowledge // …and acknowledges without keeping it
        expect(yield* journalKept(mailbox, third.message)).toEqual(Option.none())
      }))
  })
