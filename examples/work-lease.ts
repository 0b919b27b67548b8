/**
 * WorkLease: one offset per domain at a time, the rest in a FIFO backlog,
 * retries counted, and a fencing token that lets storage refuse a zombie.
 *
 *   npx tsx --conditions=leasehold-source examples/work-lease.ts
 *
 * Across processes: WorkLeaseSql.make() on a SqlClient. There a holder can die or pause, so the end shows
 * `leaseTimeout`: a lease nobody renews goes stale and is taken over; one kept alive by a heartbeat is not.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Option } from "effect"
import { Heartbeat, WorkLease } from "leasehold"

Effect.gen(function*() {
  const leases = yield* WorkLease.make({ maxRetries: 2 })

  // Offset 0 of repo-a is taken; 1 and 2 arrive meanwhile and wait in the backlog, in order.
  const first = yield* leases.tryAcquire("repo-a", 0)
  yield* Effect.log(`repo-a 0: ${first._tag}`)
  yield* Effect.log(`repo-a 1: ${(yield* leases.tryAcquire("repo-a", 1))._tag}`)
  yield* Effect.log(`repo-a 2: ${(yield* leases.tryAcquire("repo-a", 2))._tag}`)
  yield* Effect.log(`repo-b 0: ${(yield* leases.tryAcquire("repo-b", 0))._tag} (domains are independent)`)
  if (first._tag !== "Acquired") return

  // Offset 0 fails once (retry kept under the same lease), then succeeds: the hint names the next offset.
  yield* Effect.log(`repo-a 0 fails: ${(yield* leases.fail("repo-a", first.token))._tag}`)
  const next = yield* leases.succeed("repo-a", first.token)
  yield* Effect.log(`repo-a 0 succeeds: ${next._tag}${next._tag === "NextHint" ? ` ${next.offset}` : ""}`)
  const skipped = yield* Effect.either(leases.tryAcquire("repo-a", 2))
  yield* Effect.log(`repo-a 2 before 1: ${skipped._tag === "Left" ? skipped.left._tag : "?!"}`)
  const second = yield* leases.tryAcquire("repo-a", 1)
  if (second._tag !== "Acquired") return
  yield* Effect.log(`repo-a 1: Acquired with fencing token ${second.fencingToken} (was ${first.fencingToken})`)

  // Storage checks the token: the holder of offset 0 is a zombie now and its late write is refused.
  const zombie = yield* Effect.either(leases.assertCurrent("repo-a", first.fencingToken))
  yield* Effect.log(
    `zombie write with token ${first.fencingToken}: ${zombie._tag === "Left" ? zombie.left._tag : "accepted?!"}`
  )
  yield* Effect.log(`repo-a 0 again: ${(yield* leases.tryAcquire("repo-a", 0))._tag}`)

  // With a leaseTimeout, a holder that goes quiet loses its lease to the next tryAcquire of the same offset.
  const timed = yield* WorkLease.make({ leaseTimeout: "200 millis" })
  const a = yield* timed.tryAcquire("repo-c", 0)
  if (a._tag !== "Acquired") return
  yield* Effect.sleep("300 millis") // holder A pauses and renews nothing (the takeover below is logged as a warning)
  const b = yield* timed.tryAcquire("repo-c", 0)
  if (b._tag !== "Acquired") return
  // A takeover counts as a failed attempt (work that kills its holder must not crash the next one for ever):
  // once maxRetries are used up, the next takeover gives the offset up as fail would (AlreadyFailed).
  const retries = Option.match((yield* timed.inspect("repo-c")).lease, { onNone: () => 0, onSome: (l) => l.retryCount })
  yield* Effect.log(
    `repo-c 0 taken over: fencing token ${b.fencingToken} (A had ${a.fencingToken}), retry count ${retries}`
  )
  const late = yield* Effect.either(timed.succeed("repo-c", a.token))
  yield* Effect.log(`A wakes and settles: ${late._tag === "Left" ? late.left._tag : "accepted?!"}`)
  yield* Effect.log(`repo-c 1 while B works: ${(yield* timed.tryAcquire("repo-c", 1))._tag}`)

  // Work that beats its heartbeat keeps its lease however long it takes (here 5 lease timeouts).
  const heartbeat = yield* Heartbeat.make
  yield* Effect.scoped(Effect.gen(function*() {
    yield* timed.keepAlive("repo-c", b.token, heartbeat)
    for (let step = 0; step < 10; step++) yield* Effect.zipRight(Effect.sleep("100 millis"), heartbeat.beat)
  }))
  const kept = yield* timed.tryAcquire("repo-c", 0)
  yield* Effect.log(
    `repo-c 0 after 1 s of beating work: ${kept._tag}${kept._tag === "AlreadyAcquired" ? " (B's)" : ""}`
  )
  const settled = yield* timed.succeed("repo-c", b.token)
  yield* Effect.log(`B settles: ${settled._tag}${settled._tag === "NextHint" ? ` ${settled.offset}` : ""}`)
}).pipe(NodeRuntime.runMain)
