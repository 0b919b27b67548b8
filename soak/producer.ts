/**
 * The soak's producer, which is also a requester: for `config.seconds` it sends requests at `config.rate` per
 * second — a seeded mix of fast, slow (beating) and poison requests (and, in long runs, stubborn ones), about
 * 40% asking for a reply — enqueues a merge-queue entry every `config.mergeEveryMs` and makes one more
 * work-lease offset available every `config.leaseOffsetEveryMs`; all the while, and
 * until SIGTERM, it receives the replies.
 *
 * Each request is sent with a key, one of the run's simulated tenants (seeded), when the run has them: the
 * orchestrator limited each key's live leases before the fleet started (checker property 8).
 *
 * History: `send` (the intent: request id, kind, whether it wants a reply, its key), then `sent` with the message id,
 * or `send-failed` — a send that failed may still have been stored (the connection broke after the commit),
 * so it is retried under a new request id and the checker does not count the old one as lost; `reply` per
 * reply received (its message id, so a reply redelivered to the producer is not mistaken for a second one);
 * `enqueue` per merge entry; `sending-done`.
 *
 * The producer is never a victim of the nemesis, but it lives through the database's faults like everyone.
 *
 * Usage (the orchestrator runs it): node producer.mjs '<config json>' <proc>
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { MailboxSql, MainLoop, MergeQueue } from "leasehold"
import * as History from "./history.js"
import * as Protocol from "./protocol.js"
import * as Random from "./random.js"
import * as WorkLeases from "./workLeases.js"

const { config, proc } = Protocol.fromArgv()
const history = History.open(config.dir, proc)
process.on("exit", (code) => history.append({ ev: "exit-self", code }))
const random = Random.make(config.seed, 1)

/** The seeded mix. Stubborn requests take minutes to dead-letter (backoff 60 s × attempt): long runs only. */
const nextRequest = (
  elapsedMs: number
): Protocol.Body & { readonly wantsReply: boolean; readonly key: string | undefined } => {
  const stubbornAllowed = config.stubborn && config.seconds * 1000 - elapsedMs > 200_000
  const kind = random.pick<History.Kind>([
    ["fast", 93],
    ["slow", 2],
    ["poison", 3],
    ["stubborn", stubbornAllowed ? 2 : 0]
  ])
  const workMs = kind === "slow" ? random.int(5000, 10_000) : kind === "fast" ? random.int(5, 40) : 0
  const wantsReply = random.next() < 0.4
  const tenants = config.tenants ?? []
  const key = tenants.length === 0 ? undefined : tenants[random.int(0, tenants.length - 1)]
  return { kind, workMs, wantsReply, key }
}

const errorText = (error: unknown) =>
  (error instanceof Error ? `${error.name}: ${error.message}` : String(error)).slice(0, 500)

const program = Effect.gen(function*() {
  const requests = yield* MailboxSql.make({
    name: Protocol.requestsQueue,
    schema: MainLoop.requestSchema(Protocol.Body),
    prefix: Protocol.prefix
  })
  const replies = yield* MailboxSql.make({
    name: Protocol.repliesQueue,
    schema: MainLoop.resultSchema(Protocol.Output),
    prefix: Protocol.prefix
  })
  const queue = yield* MergeQueue.make({ prefix: Protocol.prefix, lockTimeout: config.lockTimeoutMs })
  history.append({ ev: "ready", role: "producer" })
  process.stdout.write("ready\n")
  const started = performance.now()

  // Replies, until the process is stopped: each recorded with its message id, then acknowledged.
  const receiveReplies = Effect.forever(Effect.gen(function*() {
    const batch = yield* replies.receive({ maxMessages: 10, visibilityTimeout: "30 seconds", waitTime: "1 second" })
      .pipe(Effect.catchAll((error) => Effect.as(Effect.logWarning("reply receive failed", error), [])))
    for (const message of batch) {
      history.append({
        ev: "reply",
        requestId: message.body.requestId,
        messageId: message.id,
        success: message.body.success,
        ...(message.body.error === undefined ? {} : { errorTag: message.body.error.tag })
      })
      yield* Effect.catchAll(message.acknowledge, (error) => Effect.logWarning("reply acknowledge failed", error))
    }
    if (batch.length === 0) yield* Effect.sleep("50 millis")
  }))

  // Requests, at the rate, for the fault phase. A failed send is retried under a new request id.
  const sendRequests = Effect.gen(function*() {
    let sent = 0
    for (let i = 0;; i++) {
      const due = started + (i * 1000) / config.rate
      const elapsed = performance.now() - started
      if (elapsed >= config.seconds * 1000) break
      if (due > performance.now()) yield* Effect.sleep(due - performance.now())
      const { key, wantsReply, ...body } = nextRequest(performance.now() - started)
      for (let retry = 0;; retry++) {
        const requestId = `r${i}${retry === 0 ? "" : `.${retry}`}`
        history.append({
          ev: "send",
          requestId,
          kind: body.kind,
          wantsReply,
          workMs: body.workMs,
          ...(key === undefined ? {} : { key })
        })
        const result = yield* Effect.either(
          requests.send(MainLoop.request(body, { requestId }), {
            ...(wantsReply ? { replyTo: Protocol.repliesQueue } : {}),
            ...(key === undefined ? {} : { key })
          })
        )
        if (result._tag === "Right") {
          history.append({ ev: "sent", requestId, messageId: result.right })
          sent++
          break
        }
        history.append({ ev: "send-failed", requestId, error: errorText(result.left) })
        yield* Effect.sleep("200 millis")
      }
    }
    history.append({ ev: "sending-done", sent })
    process.stdout.write("sending-done\n")
  })

  // Merge-queue entries, one per interval, for the fault phase. A failed enqueue is retried with the same
  // workspace: AlreadyQueuedError then means the first attempt was stored.
  const enqueueMerges = Effect.gen(function*() {
    if (config.mergeEveryMs <= 0) return
    for (let n = 0; performance.now() - started < config.seconds * 1000; n++) {
      const workspace = `ws-${n}`
      for (;;) {
        const result = yield* Effect.either(queue.enqueue(workspace, { priority: n % 3 }))
        if (result._tag === "Right") {
          history.append({ ev: "enqueue", workspace, entryId: result.right.id })
          break
        }
        if (result.left._tag === "AlreadyQueuedError") {
          history.append({ ev: "enqueue", workspace })
          break
        }
        yield* Effect.logWarning(`enqueue ${workspace} failed; retrying`, result.left)
        yield* Effect.sleep("200 millis")
      }
      yield* Effect.sleep(config.mergeEveryMs)
    }
  })

  // Work-lease offsets, one more per interval, the domains in turn, for the fault phase. A failed offer
  // (the database down) is simply made again at the next tick.
  const offerOffsets = Effect.gen(function*() {
    if (config.leaseWorkers <= 0) return
    const domains = WorkLeases.domains(config)
    for (let n = 0; performance.now() - started < config.seconds * 1000;) {
      const offered = yield* Effect.either(WorkLeases.offer(domains[n % domains.length]!))
      if (offered._tag === "Right") n++
      yield* Effect.sleep(config.leaseOffsetEveryMs)
    }
  })

  yield* Effect.forkScoped(receiveReplies)
  yield* Effect.all([sendRequests, enqueueMerges, offerOffsets], { concurrency: 3, discard: true })
  yield* Effect.never
})

program.pipe(
  Effect.scoped,
  Effect.provide(Protocol.database(config)),
  Effect.provide(Protocol.logger(history)),
  (effect) => Effect.asVoid(effect),
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
