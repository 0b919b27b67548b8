/**
 * Heartbeat + lease extension: a worker that keeps beating keeps its message;
 * a worker that hangs loses it to another worker, and its late ack is refused.
 *
 *   npx tsx --conditions=leasehold-source examples/heartbeat-lease.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Clock, Effect, Metric } from "effect"
import { Heartbeat, LeaseExtender, MailboxMemory } from "leasehold"

const visibilityTimeout = "1 second"

Effect.gen(function*() {
  const start = yield* Clock.currentTimeMillis
  const log = (line: string) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.log(`[${((now - start) / 1000).toFixed(1)}s] ${line}`))

  const jobs = yield* MailboxMemory.make<string>({ name: "jobs" })
  yield* jobs.send("steady-job")
  yield* jobs.send("stuck-job")

  // worker-A: beats every 200 ms for 2.5 s; the extender turns beats into lease extensions (at most every 300 ms).
  const workerA = Effect.scoped(Effect.gen(function*() {
    const [message] = yield* jobs.receive({ visibilityTimeout })
    yield* log(`worker-A received "${message!.body}" (delivery ${message!.deliveryCount})`)
    const heartbeat = yield* Heartbeat.make
    const extender = yield* LeaseExtender.make({ interval: "300 millis", extension: visibilityTimeout })
    yield* extender.attach(message!, heartbeat)
    for (let i = 0; i < 12; i++) {
      yield* heartbeat.beat
      yield* Effect.sleep("200 millis")
    }
    yield* message!.acknowledge
    const extensions = (yield* Metric.value(LeaseExtender.extensions)).count
    yield* log(`worker-A finished "${message!.body}" after ${extensions} lease extensions: never redelivered`)
  }))

  // worker-B: takes a job and hangs without beating; its lease runs out after 1 s.
  const workerB = Effect.gen(function*() {
    const [message] = yield* jobs.receive({ visibilityTimeout })
    yield* log(`worker-B received "${message!.body}" (delivery ${message!.deliveryCount}) and hangs without beating`)
    yield* Effect.sleep("2 seconds")
    const late = yield* Effect.either(message!.acknowledge)
    yield* log(`worker-B wakes up and tries to ack: ${late._tag === "Left" ? late.left._tag : "accepted?!"}`)
  })

  // worker-C: long-polls and picks up whatever becomes visible.
  const workerC = Effect.gen(function*() {
    yield* Effect.sleep("100 millis")
    const [message] = yield* jobs.receive({ waitTime: "5 seconds", visibilityTimeout })
    yield* log(`worker-C received "${message!.body}" (delivery ${message!.deliveryCount}): the stuck lease ran out`)
    yield* message!.acknowledge
  })

  yield* Effect.all([workerA, workerB, workerC], { concurrency: "unbounded" })
  yield* log(`done: ${yield* jobs.approximateCount} messages left in the mailbox`)
}).pipe(Effect.scoped, NodeRuntime.runMain)
