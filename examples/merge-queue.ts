/**
 * The merge queue on SQLite: agents take the processing lock one at a time,
 * a working agent keeps its lock alive through its heartbeat, a crashed one
 * loses it after the lock timeout and its entry heals back into the queue,
 * and the crashed agent — were it only paused — can no longer write.
 *
 *   npx tsx --conditions=leasehold-source examples/merge-queue.ts
 *
 * PostgreSQL: MergeQueue.layerPg({ url }); from a shell: leasehold queue status --db FILE.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Option } from "effect"
import { Heartbeat, LeaseExtender, MergeQueue } from "leasehold"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const filename = join(mkdtempSync(join(tmpdir(), "leasehold-example-")), "queue.db")
const steps = ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const

Effect.gen(function*() {
  const queue = yield* MergeQueue.MergeQueue
  yield* queue.enqueue("feature/login", { beadId: "bd-12", priority: 1 })
  yield* queue.enqueue("hotfix/crash", { beadId: "bd-13", priority: 0 })
  yield* queue.enqueue("chore/deps", { priority: 3 })

  // agent-a claims the most urgent entry, starts rebasing, then hangs: no more beats, no more extensions.
  const first = Option.getOrThrow(yield* queue.nextWithLock("agent-a"))
  yield* queue.transition(first, "rebasing") // the claim carries its fencing token
  yield* Effect.log(`agent-a claimed ${first.workspace} (token ${first.token}), then hangs`)
  const blocked = yield* queue.nextWithLock("agent-b")
  yield* Effect.log(`agent-b while agent-a's lock is live: ${Option.isNone(blocked) ? "nothing" : "?!"}`)

  yield* Effect.sleep("1100 millis") // the lock timeout passes
  yield* Effect.log(`lock stale: ${yield* queue.isLockStale}`)

  // agent-b works through everything; its heartbeat keeps the lock alive however long each step takes.
  const extender = yield* LeaseExtender.make({ interval: "100 millis", extension: "1 second" })
  let last: MergeQueue.Claim | undefined
  for (;;) {
    const next = yield* queue.nextWithLock("agent-b")
    if (Option.isNone(next)) break
    const entry = last = next.value
    yield* Effect.log(`agent-b claimed ${entry.workspace} (token ${entry.token}, attempt ${entry.attemptCount})`)
    const heartbeat = yield* Heartbeat.make
    yield* extender.extendWhile(
      queue.extendable(entry),
      heartbeat,
      Effect.forEach(
        steps,
        (status) =>
          Effect.sleep("200 millis").pipe(
            Effect.zipRight(heartbeat.beat),
            Effect.zipRight(queue.transition(entry, status))
          ),
        { discard: true }
      )
    )
    if (entry.id === first.id) {
      // agent-a wakes up and tries to carry on with its old claim: fenced out by its token, nothing written.
      const refused = yield* Effect.flip(queue.transition(first, "testing"))
      yield* Effect.log(`agent-a wakes up: ${refused._tag}: ${refused.message}`)
    }
  }
  if (last !== undefined) yield* queue.releaseProcessingLock(last)
  const stats = yield* queue.stats
  const healed = (yield* queue.auditLog()).filter((row) => row.action === "entry_reclaimed").length
  yield* Effect.log(`merged ${stats.byStatus.merged} of ${stats.total}; entries healed after a crash: ${healed}`)
}).pipe(
  Effect.scoped,
  Effect.provide(MergeQueue.layerSqlite({ filename, lockTimeout: "1 second" })),
  NodeRuntime.runMain
)
