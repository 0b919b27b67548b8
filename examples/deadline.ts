/**
 * Deadlines and budgets: a slow tool is interrupted the moment the deadline
 * passes (its cleanup still runs), a nested deadline can only tighten the
 * outer one, and a budget stops an evaluation that used too many tokens.
 *
 *   npx tsx --conditions=leasehold-source examples/deadline.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Option } from "effect"
import { Budget, Deadline } from "leasehold"

const slowTool = Effect.gen(function*() {
  yield* Effect.log("slow tool: started, needs 5 s")
  yield* Effect.sleep("5 seconds")
  yield* Effect.log("slow tool: finished (never printed)")
}).pipe(Effect.onInterrupt(() => Effect.log("slow tool: interrupted, cleaning up")))

Effect.gen(function*() {
  // Bad input is refused with a reason.
  for (const input of ["2030-01-01T00:00:00", "next tuesday", "2000-01-01T00:00:00Z"]) {
    const error = yield* Effect.flip(Deadline.make(input))
    yield* Effect.log(`Deadline.make(${JSON.stringify(input)}) refused: ${error.reason}`)
  }

  // A 1.5 s deadline around a 5 s tool: interrupted at 1.5 s.
  const outer = yield* Deadline.after("1500 millis")
  const result = yield* Effect.either(Deadline.within(slowTool, outer))
  if (result._tag === "Left") yield* Effect.log(`evaluation stopped: ${result.left.message}`)

  // Nested: a subagent asks for 10 s but inherits the parent's tighter 1.2 s.
  const parent = yield* Deadline.after("1200 millis")
  const child = yield* Deadline.after("10 seconds")
  const effective = yield* Deadline.current.pipe(Deadline.within(child), Deadline.within(parent))
  yield* Effect.log(`subagent runs under the parent's deadline: ${Option.getOrThrow(effective) === parent}`)

  // A budget of 1 000 total tokens shared by a parent and its subagent.
  const tracker = yield* Budget.makeTracker(yield* Budget.make({ maxTotalTokens: 1_000 }))
  yield* tracker.record("parent", { inputTokens: 400, outputTokens: 200 })
  yield* tracker.record("subagent", { inputTokens: 300, outputTokens: 150 })
  const over = yield* Effect.flip(tracker.check)
  yield* Effect.log(`budget check: ${over.message}`)
}).pipe(NodeRuntime.runMain)
