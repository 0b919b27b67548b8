/**
 * A whole worker as one Layer: a MainLoop over a durable mailbox on a SQLite
 * file, a health server and the shutdown coordinator, started with
 * `Layer.launch` under `NodeRuntime.runMain`. It serves until SIGTERM (or
 * Ctrl-C): then readiness turns 503, the loop stops receiving, the request in
 * flight finishes and replies, and the process exits 0.
 *
 * A client layer built before the worker (and closed after it) sends a few
 * requests and prints the replies — in production it would be another process.
 *
 *   npx tsx --conditions=leasehold-source examples/worker.ts [mailbox.db]
 *
 * Then Ctrl-C, or kill -TERM <pid>.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Layer, Ref, Schema } from "effect"
import { Health, Heartbeat, MailboxSql, MainLoop, ShutdownCoordinator } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const Task = Schema.Struct({ text: Schema.String, steps: Schema.Number })
const filename = process.argv[2] ?? join(mkdtempSync(join(tmpdir(), "leasehold-worker-")), "mailbox.db")

// The work: a step every 100 ms, each one proof of progress that keeps the request leased.
const work = ({ steps, text }: typeof Task.Type) =>
  Effect.gen(function*() {
    if (steps > 1) yield* Effect.log(`working on "${text}" (${steps} steps)`)
    for (let step = 0; step < steps; step++) {
      yield* Effect.sleep("100 millis")
      yield* Heartbeat.beat
    }
    return text.toUpperCase()
  })

// The loop over the durable mailbox, for the layer's lifetime: closing the layer drains it.
const RequestLoop = Layer.unwrapScoped(
  Effect.map(
    MailboxSql.make({
      name: "requests",
      schema: MainLoop.requestSchema(Task),
      replySchema: MainLoop.resultSchema(Schema.String) // replies reach any queue of the database
    }),
    (requests) => MainLoop.layer({ requests, execute: work, shutdownTimeout: "10 seconds" })
  )
)

// The ready line; on the first signal the coordinator says so (a second signal would exit at once). Readiness
// needs nothing here: MainLoop.layer counts its loop in Health and turns it 503 as soon as the drain starts.
const Announce = Layer.effectDiscard(
  Effect.gen(function*() {
    const health = yield* Health.Health
    const coordinator = yield* ShutdownCoordinator.ShutdownCoordinator
    yield* coordinator.register(Effect.log("signal received: draining"))
    yield* Effect.log(`worker ready (pid ${process.pid}): ${health.url}/health/ready, mailbox ${filename}`)
  })
)

// This example's own traffic: a few requests, and a fiber that prints their replies.
const Client = Layer.scopedDiscard(
  Effect.gen(function*() {
    const requests = yield* MailboxSql.make({ name: "requests", schema: MainLoop.requestSchema(Task) })
    const replies = yield* MailboxSql.make({ name: "replies", schema: MainLoop.resultSchema(Schema.String) })
    const received = yield* Ref.make(0)
    const tasks = [
      { text: "hello", steps: 1 },
      { text: "leased", steps: 1 },
      { text: "world", steps: 1 },
      { text: "slow job", steps: 30 } // three seconds of work: send SIGTERM meanwhile to see the drain
    ]
    for (const [i, task] of tasks.entries()) {
      yield* requests.send(MainLoop.request(task, { requestId: `r${i + 1}` }), { replyTo: "replies" })
    }
    // A receive is interrupted cleanly (its rows go back); what it returned is printed and acknowledged whole.
    const printReplies = (waitTime: "20 seconds" | 0) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(
          restore(replies.receive({ maxMessages: 10, waitTime })),
          (messages) =>
            Effect.forEach(messages, (reply) =>
              Effect.gen(function*() {
                const { error, output, requestId } = reply.body
                yield* Effect.log(`reply ${requestId}: ${output ?? `error ${error?.message}`}`)
                yield* Ref.update(received, (n) => n + 1)
                yield* reply.acknowledge
              }), { discard: true })
        )
      )
    // Runs once the worker has drained (after the printer below stops): the last replies, then what is left.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* printReplies(0)
        const left = yield* requests.approximateCount
        yield* Effect.log(`drained: ${yield* Ref.get(received)} replies received, ${left} requests left queued`)
      }).pipe(Effect.orDie)
    )
    yield* Effect.forkScoped(Effect.forever(printReplies("20 seconds")))
  })
)

// The worker: the loop and its announcements over the health server and the coordinator, on one SQLite file.
const WorkerLive = Layer.mergeAll(RequestLoop, Announce).pipe(
  Layer.provide(Layer.mergeAll(Health.layer({ port: 0 }), ShutdownCoordinator.layer())),
  Layer.provide(Client), // built before the worker, closed after it
  Layer.provide(MailboxSql.layerSqlite({ filename }))
)

Layer.launch(WorkerLive).pipe(NodeRuntime.runMain)
