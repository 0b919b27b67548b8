/**
 * A soak merge-queue worker: claims entries with `nextWithLock` and walks each through rebasing → testing →
 * ready_to_merge → merging → merged, a few hundred milliseconds of beating work per step, its lock kept
 * alive by the heartbeat through a `LeaseExtender` on `queue.extendable(claim)` — the pattern of
 * docs/coordination.md. The nemesis kills, stops and terminates these processes like the request workers;
 * a worker stopped past its lock timeout finds, when it resumes, that its transitions are refused.
 *
 * History: `claim` (entry, fencing token), `transition` for each one the queue accepted, `refused` for one it
 * refused (LockLostError: the zombie case), `released` when it lets the lock go. The checker compares these
 * with the audit log the orchestrator dumps after the run.
 *
 * Usage (the orchestrator runs it): node mergeQueueWorker.mjs '<config json>' <proc>
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Either, Layer, Option } from "effect"
import { Heartbeat, LeaseExtender, MergeQueue } from "leasehold"
import * as History from "./history.js"
import * as Protocol from "./protocol.js"

const { config, proc } = Protocol.fromArgv()
const history = History.open(config.dir, proc)
process.on("exit", (code) => history.append({ ev: "exit-self", code }))
const agentId = proc

const steps = ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const

const program = Effect.gen(function*() {
  const queue = yield* MergeQueue.MergeQueue
  const extender = yield* LeaseExtender.make({
    interval: config.extenderIntervalMs,
    extension: config.lockTimeoutMs
  })
  history.append({ ev: "ready", role: "merge" })
  process.stdout.write("ready\n")

  /**
   * One transition, retried while the store fails (a database restart). A retry after a failure whose commit
   * did land answers InvalidTransitionError; the entry then already shows the status under this claim.
   */
  const move = (claim: MergeQueue.Claim, status: MergeQueue.Status) =>
    Effect.gen(function*() {
      for (let attempt = 0; attempt < 40; attempt++) {
        const result = yield* Effect.either(queue.transition(claim, status))
        if (Either.isRight(result)) return "moved" as const
        const error = result.left
        if (error._tag === "LockLostError") {
          history.append({
            ev: "refused",
            agentId,
            entryId: claim.id,
            token: claim.token,
            status,
            error: error.message.slice(0, 300)
          })
          return "refused" as const
        }
        if (error._tag === "InvalidTransitionError" && attempt > 0) {
          const entry = yield* Effect.option(queue.get(claim.id))
          const now = Option.flatten(entry)
          if (
            Option.isSome(now) && now.value.status === status &&
            Option.contains(now.value.fencingToken, claim.token)
          ) return "moved" as const
        }
        if (error._tag !== "MergeQueueStoreError") {
          yield* Effect.logWarning(`transition ${claim.id} → ${status} failed`, error)
          return "failed" as const
        }
        yield* Effect.sleep("250 millis")
      }
      return "failed" as const
    })

  for (;;) {
    const next = yield* Effect.either(queue.nextWithLock(agentId))
    if (Either.isLeft(next) || Option.isNone(next.right)) {
      yield* Effect.sleep("100 millis")
      continue
    }
    const claim = next.right.value
    history.append({ ev: "claim", agentId, entryId: claim.id, token: claim.token })
    const heartbeat = yield* Heartbeat.make
    yield* extender.extendWhile(
      queue.extendable(claim),
      heartbeat,
      Effect.gen(function*() {
        for (const status of steps) {
          for (let k = 0; k < 3; k++) {
            yield* Effect.sleep(config.beatEveryMs)
            yield* heartbeat.beat
          }
          const moved = yield* move(claim, status)
          if (moved !== "moved") return
          history.append({ ev: "transition", agentId, entryId: claim.id, token: claim.token, status })
        }
      })
    )
    const released = yield* Effect.either(queue.releaseProcessingLock(claim))
    history.append({
      ev: "released",
      agentId,
      entryId: claim.id,
      token: claim.token,
      released: Either.isRight(released) && released.right
    })
  }
})

program.pipe(
  Effect.provide(
    Layer.provideMerge(
      MergeQueue.layer({ prefix: Protocol.prefix, lockTimeout: config.lockTimeoutMs }),
      Protocol.database(config)
    )
  ),
  Effect.provide(Protocol.logger(history)),
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
