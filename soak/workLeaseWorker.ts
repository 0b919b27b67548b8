/**
 * A soak work-lease worker (property 7): several of these compete for the same domains of a `WorkLeaseSql`
 * with a `leaseTimeout`, under the nemesis. For each domain it goes for the next offset in order (the backlog's
 * head, else the low-water mark — or the offset of a lease that went stale, which `tryAcquire` takes over),
 * works on it for a while with a `Heartbeat` that keeps the lease alive (`keepAlive`), then — the pattern of
 * docs/coordination.md — checks `assertCurrent` and writes the storage-fenced resource row (workLeases.ts) and,
 * if the write was accepted, `succeed`s. A worker stopped past its lease timeout resumes as a zombie: its
 * `assertCurrent`, its fenced write or its `succeed` must be refused.
 *
 * History: `lease-acquired` (domain, offset, fencing token), `lease-beat` while it works, `lease-write`
 * (accepted or refused), `lease-done` (succeeded, refused — a zombie — or error).
 *
 * Usage (the orchestrator runs it): node workLeaseWorker.mjs '<config json>' <proc>
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Either, Option } from "effect"
import { Heartbeat } from "leasehold"
import * as History from "./history.js"
import * as Protocol from "./protocol.js"
import * as Random from "./random.js"
import * as WorkLeases from "./workLeases.js"

const { config, proc } = Protocol.fromArgv()
const history = History.open(config.dir, proc)
process.on("exit", (code) => history.append({ ev: "exit-self", code }))
// How long each offset's work takes: seeded per process name (not part of what a seed replays exactly: which
// process gets which offset is the run's own).
const random = Random.make(config.seed, 100 + Number(proc.replace(/\D/g, "")))

const program = Effect.gen(function*() {
  const leases = yield* WorkLeases.make(config)
  const domains = WorkLeases.domains(config)
  history.append({ ev: "ready", role: "lease" })
  process.stdout.write("ready\n")

  /** Works on an acquired offset, then writes and settles it, recording each step. */
  const work = (domain: string, offset: number, token: string, fencing: number) =>
    Effect.gen(function*() {
      history.append({ ev: "lease-acquired", domain, offset, fencing })
      const heartbeat = yield* Heartbeat.make
      const steps = Math.ceil(random.int(200, 1500) / config.beatEveryMs)
      yield* Effect.scoped(Effect.gen(function*() {
        yield* leases.keepAlive(domain, token, heartbeat, { interval: config.extenderIntervalMs })
        for (let i = 0; i < steps; i++) {
          yield* Effect.sleep(config.beatEveryMs)
          yield* heartbeat.beat
          history.append({ ev: "lease-beat", domain, offset, fencing })
        }
      }))
      const current = yield* Effect.either(leases.assertCurrent(domain, fencing))
      const accepted = Either.isRight(current) &&
        (yield* Effect.either(WorkLeases.write(domain, offset, fencing, proc))).pipe((written) =>
          Either.isRight(written) && written.right
        )
      history.append({ ev: "lease-write", domain, offset, fencing, accepted })
      if (!accepted) {
        const error = Either.isLeft(current) ? current.left._tag : "the fenced write was refused"
        history.append({ ev: "lease-done", domain, offset, fencing, outcome: "refused", error })
        return
      }
      // A store failure may hide a commit: retry, and take TokenMismatch / LeaseNotFound then as "error".
      for (let attempt = 0; attempt < 20; attempt++) {
        const settled = yield* Effect.either(leases.succeed(domain, token))
        if (Either.isRight(settled)) {
          history.append({ ev: "lease-done", domain, offset, fencing, outcome: "succeeded" })
          return
        }
        const tag = settled.left._tag
        if (tag !== "WorkLeaseStoreError") {
          history.append({
            ev: "lease-done",
            domain,
            offset,
            fencing,
            outcome: attempt === 0 && tag === "TokenMismatchError" ? "refused" : "error",
            error: tag
          })
          return
        }
        yield* Effect.sleep("250 millis")
      }
      history.append({ ev: "lease-done", domain, offset, fencing, outcome: "error", error: "store kept failing" })
    })

  for (let round = 0;; round++) {
    const offers = yield* Effect.either(WorkLeases.available)
    for (let i = 0; i < domains.length; i++) {
      const domain = domains[(round + i) % domains.length]!
      const snapshot = yield* Effect.either(leases.inspect(domain))
      if (Either.isLeft(snapshot) || Either.isLeft(offers)) continue
      const { backlog, lease, lowWaterMark } = snapshot.right
      // The offset in hand if a lease exists (taken over only once it is stale), else the next one in order.
      const next = Option.match(lease, { onNone: () => backlog[0] ?? lowWaterMark, onSome: (held) => held.offset })
      if (next >= (offers.right.get(domain) ?? 0)) continue
      const acquired = yield* Effect.either(leases.tryAcquire(domain, next))
      if (Either.isRight(acquired) && acquired.right._tag === "Acquired") {
        yield* work(domain, next, acquired.right.token, acquired.right.fencingToken)
      }
    }
    yield* Effect.sleep("50 millis")
  }
})

program.pipe(
  Effect.provide(Protocol.database(config)),
  Effect.provide(Protocol.logger(history)),
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
