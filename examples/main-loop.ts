/**
 * MainLoop on the in-memory mailbox: requests in, results replied to the
 * requester's mailbox, a request deadline that interrupts slow work, and a
 * dead-letter queue for a request that keeps failing.
 *
 *   npx tsx --conditions=leasehold-source examples/main-loop.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { DeadLetter, Deadline, Mailbox, MailboxMemory, MainLoop } from "leasehold"

type Request = { readonly task: "echo" | "slow" | "poison"; readonly text: string }

Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<Request>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  const deadLetters = yield* MailboxMemory.make<DeadLetter.DeadLetter<MainLoop.MainLoopRequest<Request>>, unknown>({
    name: "dead-letters"
  })

  const loop = yield* MainLoop.make({
    requests,
    execute: ({ task, text }: Request, { runContext }) =>
      task === "slow"
        ? Effect.as(Effect.sleep("10 seconds"), "too late")
        : task === "poison"
        ? Effect.fail(new Error(`cannot handle "${text}" (attempt ${runContext.attempt})`))
        : Effect.succeed(text.toUpperCase()),
    config: { deadLetters: { mailbox: deadLetters, policy: yield* DeadLetter.policy({ maxDeliveryCount: 1 }) } }
  }).pipe(Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests, responses)))

  const send = (id: string, request: Request, deadline?: Deadline.Deadline) =>
    requests.send(MainLoop.request(request, { requestId: id, deadline }), { replyTo: "responses" })
  yield* send("r1", { task: "echo", text: "hello" })
  yield* send("r2", { task: "slow", text: "zzz" }, yield* Deadline.after("1 second"))
  yield* send("r3", { task: "poison", text: "%%%" })

  yield* loop.run({ maxIterations: 3, waitTime: 0 })

  for (const { body } of yield* responses.receive({ maxMessages: 10 })) {
    yield* Effect.log(`${body.requestId}: ${body.success ? `ok ${body.output}` : `error ${body.error?.tag}`}`)
  }
  for (const { body } of yield* deadLetters.receive({ maxMessages: 10 })) {
    yield* Effect.log(`dead letter ${body.requestId} after ${body.deliveryCount} delivery: ${body.lastError}`)
  }
}).pipe(Effect.scoped, NodeRuntime.runMain)
