/**
 * The demo's coordination phases, on the demo's SQLite file (so the operator's
 * console shows them afterwards): a `WorkLeaseSql` keeps per-domain order
 * across fibers, and a `MergeQueue` drains while one agent crashes holding
 * its lock.
 */
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as MergeQueue from "../MergeQueue.js"
import * as WorkLeaseSql from "../WorkLeaseSql.js"

/**
 * Per-domain order with a `WorkLeaseSql` on the demo's file: offsets arrive in order; one holder per domain at a
 * time works them in order.
 */
export const workLeasePhase = Effect.gen(function*() {
  // A store that fails (a full disk, a lock held too long) is the demo's typed failure, reported by the CLI.
  const leases = yield* WorkLeaseSql.make({ maxRetries: 3 })
  const domains = ["repo-a", "repo-b"]
  const offsets = 6
  const processed = new Map<string, Array<number>>(domains.map((domain) => [domain, []]))
  const work = (domain: string, first: { token: string }, offset: number) =>
    Effect.gen(function*() {
      let token = first.token
      let current = offset
      for (;;) {
        processed.get(domain)!.push(current)
        yield* Effect.sleep("5 millis")
        const next = yield* leases.succeed(domain, token)
        if (next._tag === "NoBacklog") return
        const acquired = yield* leases.tryAcquire(domain, next.offset)
        if (acquired._tag !== "Acquired") return
        token = acquired.token
        current = next.offset
      }
    })
  // Offsets arrive in order; whoever acquires one works through the backlog behind it on its own fiber.
  // An arrival while the next holder is being handed the backlog head is told to wait (BacklogOrderingError).
  const deliver = (domain: string) =>
    Effect.gen(function*() {
      const holders: Array<Fiber.RuntimeFiber<void, Effect.Effect.Error<ReturnType<typeof work>>>> = []
      for (let offset = 0; offset < offsets; offset++) {
        const result = yield* leases.tryAcquire(domain, offset).pipe(
          Effect.retry({ schedule: Schedule.spaced("1 millis"), while: (e) => e._tag === "BacklogOrderingError" })
        )
        if (result._tag === "Acquired") holders.push(yield* Effect.fork(work(domain, result, offset)))
        yield* Effect.sleep("2 millis")
      }
      yield* Fiber.joinAll(holders)
    })
  yield* Effect.forEach(domains, deliver, { concurrency: "unbounded", discard: true })
  const inOrder = domains.every((domain) =>
    processed.get(domain)!.join(",") === Array.from({ length: offsets }, (_, i) => i).join(",")
  )
  return {
    domains: domains.length,
    offsets: domains.length * offsets,
    inOrder,
    processed
  }
})

/** A merge queue drains while one agent crashes holding the lock: its entry heals back after the lock timeout. */
export const mergeQueuePhase = Effect.gen(function*() {
  const queue = yield* MergeQueue.make({ lockTimeout: "1 second" })
  const entries = 5
  for (let i = 1; i <= entries; i++) yield* queue.enqueue(`feature/${i}`, { priority: i === 3 ? 0 : 2 })
  const crashed = Option.getOrThrow(yield* queue.nextWithLock("merger-1"))
  yield* queue.transition(crashed, "rebasing") // …and merger-1 dies here, holding the lock
  let last: MergeQueue.Claim | undefined
  for (;;) {
    const next = yield* queue.nextWithLock("merger-2")
    if (Option.isNone(next)) {
      const stats = yield* queue.stats
      if (stats.byStatus.merged === entries) break
      yield* Effect.sleep("100 millis")
      continue
    }
    last = next.value
    for (const status of ["rebasing", "testing", "ready_to_merge", "merging", "merged"] as const) {
      yield* queue.transition(next.value, status)
    }
  }
  if (last !== undefined) yield* queue.releaseProcessingLock(last)
  const healed = (yield* queue.auditLog()).filter((row) => row.action === "entry_reclaimed").length
  return { merged: (yield* queue.stats).byStatus.merged, entries, healed }
})
