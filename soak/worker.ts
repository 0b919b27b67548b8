/**
 * A soak request worker: one process of the fleet the nemesis attacks. It runs `config.loops` MainLoops over
 * the requests queue, as a user would deploy them — under `NodeRuntime.runMain` with the `ShutdownCoordinator`,
 * so SIGTERM drains (`shutdownTimeout`), a lease extender driven by heartbeats (`Heartbeat.beat` during slow
 * work), and a dead-letter policy whose sink is the dead-letter table.
 *
 * What it records in its history (history.ts): `start` / `beat` / `end` of every attempt, `draining` when the
 * signal arrives, warnings and errors the library logs (`log`: failed settles, a store that is down…), and
 * `exit-self` with its exit code. It cannot record when an acknowledgement lands (MainLoop settles in the
 * background, in groups); the checker reads that from the database and from redeliveries.
 *
 * Usage (the orchestrator runs it): node worker.mjs '<config json>' <proc>
 */
import { NodeRuntime } from "@effect/platform-node"
import { Cause, Effect, Exit, Layer } from "effect"
import { DeadLetter, Heartbeat, MailboxSql, MailboxSqlAdmin, MainLoop, ShutdownCoordinator } from "leasehold"
import * as History from "./history.js"
import * as Protocol from "./protocol.js"

const { config, proc } = Protocol.fromArgv()
const history = History.open(config.dir, proc)
process.on("exit", (code) => history.append({ ev: "exit-self", code }))

const errorText = (cause: Cause.Cause<unknown>) => {
  const error = Cause.squash(cause)
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
}

/** The work of one attempt: fast, slow with beats, or failing (poison, stubborn). */
const work = (loop: number) => (body: Protocol.Body, context: MainLoop.ExecuteContext) => {
  const { attempt, requestId } = context.runContext
  history.append({ ev: "start", requestId, attempt, kind: body.kind, loop })
  const steps = Effect.gen(function*() {
    switch (body.kind) {
      case "poison":
        return yield* Effect.fail(new Protocol.PoisonError({ requestId }))
      case "stubborn":
        return yield* Effect.fail(new Protocol.StubbornError({ requestId }))
      case "fast":
        yield* Effect.sleep(body.workMs)
        break
      case "slow": {
        // Beats prove progress: each one may extend the lease (at most once per extender interval).
        const started = performance.now()
        while (performance.now() - started < body.workMs) {
          yield* Effect.sleep(config.beatEveryMs)
          yield* Heartbeat.beat
          history.append({ ev: "beat", requestId, attempt, loop })
        }
        break
      }
    }
    return { worker: proc, workMs: body.workMs }
  })
  return steps.pipe(
    Effect.onExit((exit) =>
      Effect.sync(() =>
        history.append({
          ev: "end",
          requestId,
          attempt,
          loop,
          ...(Exit.isSuccess(exit)
            ? { outcome: "success" as const }
            : Cause.isInterruptedOnly(exit.cause)
            ? { outcome: "interrupted" as const }
            : { outcome: "failure" as const, error: errorText(exit.cause) })
        })
      )
    )
  )
}

const Loops = Layer.unwrapScoped(Effect.gen(function*() {
  const requests = yield* MailboxSql.make({
    name: Protocol.requestsQueue,
    schema: MainLoop.requestSchema(Protocol.Body),
    replySchema: MainLoop.resultSchema(Protocol.Output),
    prefix: Protocol.prefix
  })
  const deadLetters = yield* MailboxSqlAdmin.deadLetters({ prefix: Protocol.prefix })
  const policy = yield* DeadLetter.policy({
    maxDeliveryCount: config.maxDeliveryCount,
    includeErrors: ["PoisonError"]
  })
  const loops = Array.from({ length: config.loops }, (_, loop) =>
    MainLoop.layer({
      name: `soak-${proc}-${loop}`,
      requests,
      execute: work(loop),
      config: {
        workerId: `${proc}-${loop}`,
        timeout: "60 seconds",
        leaseExtender: { interval: config.extenderIntervalMs, extension: config.extensionMs },
        deadLetters: { mailbox: deadLetters.sink(MainLoop.requestSchema(Protocol.Body)), policy }
      },
      run: { maxMessages: 1, visibilityTimeout: config.visibilityMs, waitTime: "1 second" },
      shutdownTimeout: config.shutdownTimeoutMs
    }))
  return Layer.mergeAll(...(loops as [Layer.Layer<never, unknown>]))
}))

/** Records the signal (the drain starts) and says it is ready once the loops run. */
const Announce = Layer.effectDiscard(Effect.gen(function*() {
  const coordinator = yield* ShutdownCoordinator.ShutdownCoordinator
  yield* coordinator.register(Effect.sync(() => history.append({ ev: "draining" })))
  history.append({ ev: "ready", role: "worker" })
  process.stdout.write("ready\n")
}))

Layer.launch(Layer.mergeAll(Loops, Announce)).pipe(
  Effect.provide(ShutdownCoordinator.layer()),
  Effect.provide(Protocol.database(config)),
  Effect.provide(Protocol.logger(history)),
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
