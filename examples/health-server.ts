/**
 * Health and metrics over HTTP for a worker: liveness, readiness (503 while
 * shutting down or when a loop's heartbeat is stale) and every Effect metric
 * in Prometheus text.
 *
 *   npx tsx --conditions=leasehold-source examples/health-server.ts
 *
 * It queries its own server, then exits.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { Health, LoopGroup, Mailbox, MailboxMemory, MainLoop } from "leasehold"

const get = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(url)
    return { status: response.status, body: await response.text() }
  })

Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: "requests"
  })
  const loop = yield* MainLoop.make({ requests, execute: (text: string) => Effect.succeed(text.toUpperCase()) }).pipe(
    Effect.provideService(Mailbox.MailboxResolver, Mailbox.MailboxResolver.fromMailboxes(requests))
  )
  const health = yield* Health.Health
  const group = LoopGroup.make([loop])
  const running = yield* Effect.fork(group.run({ waitTime: "1 second" }))
  for (let i = 0; i < 3; i++) yield* requests.send(MainLoop.request(`job ${i}`))
  yield* Effect.sleep("300 millis")

  yield* Effect.log(`serving ${health.url}`)
  yield* Effect.log(`GET /health/live -> ${(yield* get(`${health.url}/health/live`)).status}`)
  const ready = yield* get(`${health.url}/health/ready`)
  yield* Effect.log(`GET /health/ready -> ${ready.status}`)
  const metrics = (yield* get(`${health.url}/metrics`)).body
  const processed = metrics.split("\n").find((line) => line.startsWith("leasehold_messages_processed_total"))
  yield* Effect.log(`GET /metrics -> ${processed}`)

  yield* group.shutdown()
  const draining = yield* get(`${health.url}/health/ready`)
  yield* Effect.log(`after shutdown: GET /health/ready -> ${draining.status} ${draining.body.trim()}`)
  yield* running.await
}).pipe(Effect.scoped, Effect.provide(Health.layer({ port: 0, host: "127.0.0.1" })), NodeRuntime.runMain)
