/**
 * A worker process with graceful shutdown: SIGTERM (or Ctrl-C) lets the
 * in-flight request finish and reply, nacks what has not started, and exits
 * 0; past the 10 s shutdown timeout the request is interrupted and given
 * back; a second signal exits at once (code 130, the coordinator's doing).
 * If a loop dies, the group stops and the process exits 1 with the cause.
 *
 *   npx tsx --conditions=leasehold-source examples/loop-group-signals.ts                 # one 1.5 s request, then idle
 *   npx tsx --conditions=leasehold-source examples/loop-group-signals.ts --idle          # no request
 *   npx tsx --conditions=leasehold-source examples/loop-group-signals.ts --work-ms 20000
 *
 * Then press Ctrl-C.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { LoopGroup, Mailbox, MailboxMemory, MainLoop, ShutdownCoordinator } from "leasehold"

const args = process.argv.slice(2)
const idle = args.includes("--idle")
const workMs = Number(args[args.indexOf("--work-ms") + 1] ?? 1500) || 1500

Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: "responses" })
  // Runs when the process stops, before the mailboxes close: show what was replied.
  yield* Effect.addFinalizer(() =>
    Effect.gen(function*() {
      for (const reply of yield* Effect.orDie(responses.receive({ maxMessages: 10 }))) {
        yield* Effect.log(`replied ${reply.body.requestId}: ${reply.body.output ?? reply.body.error?.message}`)
      }
      yield* Effect.log(`stopped; ${yield* Effect.orDie(requests.approximateCount)} requests left queued`)
    })
  )

  const loop = yield* MainLoop.make({
    requests,
    execute: (request: string, { heartbeat }) =>
      Effect.gen(function*() {
        yield* Effect.log(`started ${request}`)
        for (let step = 0; step < 10; step++) {
          yield* heartbeat.beat // proof of work: keeps the request leased
          yield* Effect.sleep(workMs / 10)
        }
        yield* Effect.log(`finished ${request}`)
        return request.toUpperCase()
      })
  }).pipe(Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests, responses)))

  if (!idle) yield* requests.send(MainLoop.request("job-1", { requestId: "job-1" }), { replyTo: "responses" })
  const group = LoopGroup.make([loop], { shutdownTimeout: "10 seconds" })
  yield* Effect.log(`worker ready (pid ${process.pid})`)
  yield* group.run({ waitTime: "20 seconds" })
}).pipe(Effect.scoped, Effect.provide(ShutdownCoordinator.layer()), NodeRuntime.runMain)
