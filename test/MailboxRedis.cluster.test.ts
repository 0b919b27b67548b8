/**
 * The Redis mailbox on a real Redis Cluster: three masters (test/support/redis.ts's `cluster`, each a throwaway
 * `redis-server` in cluster mode), reached through ioredis' `Cluster`. A queue's keys share one hash tag, so every
 * script runs on the queue's slot; queues spread over the nodes. The mailbox, journal and process contracts pass
 * as on one server, but for one thing: a reply to a queue on another node is sent, then the request acknowledged,
 * so a worker killed between the two replies again (at least once; none lost).
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Option, Schema, Scope } from "effect"
import { Cluster } from "ioredis"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { journalOf } from "../src/internal/journal.js"
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
import { MailboxResolver } from "../src/Mailbox.js"
import { journalContract } from "./contract/JournalContract.js"
import { mailboxContract } from "./contract/MailboxContract.js"
import { mailboxProcessContract } from "./contract/ProcessContract.js"
import * as RedisServer from "./support/redis.js"

const clusterScope = Effect.runSync(Scope.make())
let nodes: ReadonlyArray<RedisServer.Server> = []
let cluster: Cluster
beforeAll(async () => {
  nodes = await Effect.runPromise(Scope.extend(RedisServer.cluster(3), clusterScope))
  cluster = new Cluster(nodes.map(({ host, port }) => ({ host, port })), { redisOptions: { maxRetriesPerRequest: 1 } })
}, 120_000)
afterAll(async () => {
  await cluster?.quit()
  await Effect.runPromise(Scope.close(clusterScope, Exit.void))
})

let prefixes = 0
const where = new WeakMap<object, string>()
const make = (options: { readonly name: string; readonly maxSize?: number }) =>
  Effect.suspend(() => {
    const prefix = `c${++prefixes}:`
    return Effect.tap(
      MailboxRedis.make<string, string, string>(cluster, { ...options, schema: Schema.String, prefix }),
      (mailbox) => Effect.sync(() => where.set(mailbox, prefix))
    )
  })

mailboxContract("Redis Cluster", make, {
  pause: (mailbox) => MailboxRedis.pause(cluster, where.get(mailbox), mailbox.name),
  resume: (mailbox) => MailboxRedis.resume(cluster, where.get(mailbox), mailbox)
})

journalContract(
  "Redis Cluster",
  make,
  (_, message) =>
    Effect.map(journalOf(message)!.load, (steps) => steps.length === 0 ? Option.none() : Option.some(steps))
)

mailboxProcessContract({
  label: "Redis Cluster",
  target: () => `redis-cluster://${nodes.map(({ host, port }) => `${host}:${port}`).join(",")}`,
  directory: mkdtempSync(join(tmpdir(), "leasehold-redis-cluster-")),
  // The replies go to another slot: sent, then the request acknowledged (a full run saw one request replied twice).
  repliesAtLeastOnce: true,
  open: (name, schema, prefix) => MailboxRedis.make(cluster, { name, schema, prefix })
})

describe("MailboxRedis on a cluster", () => {
  it.scoped(
    "queues spread over the nodes; a reply to a queue on another node arrives once, the request acknowledged",
    () =>
      Effect.gen(function*() {
        const prefix = `spread${++prefixes}:`
        const names = Array.from({ length: 12 }, (_, i) => `queue-${i}`)
        const boxes = yield* Effect.forEach(
          names,
          (name) => MailboxRedis.make<string, string, string>(cluster, { name, schema: Schema.String, prefix })
        )
        yield* Effect.forEach(boxes, (box) => box.send("x"))
        // Where each queue's keys live: more than one node holds some.
        const holders = new Set<string>()
        for (const node of cluster.nodes("master")) {
          const keys = yield* Effect.promise(() => node.keys(`${prefix}*`))
          if (keys.length > 0) holders.add(`${node.options.host}:${node.options.port}`)
        }
        expect(holders.size).toBeGreaterThan(1)
        const [requests, ...others] = boxes
        const replies = others.find((box) => box !== requests)!
        yield* requests!.send("ask", { replyTo: replies.name })
        const batch = yield* requests!.receive({ maxMessages: 10 })
        const ask = batch.find((message) => message.body === "ask")!
        yield* ask.replyAndAcknowledge("answer").pipe(
          Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(replies))
        )
        for (const message of batch.filter((message) => message !== ask)) yield* message.acknowledge
        expect(yield* requests!.approximateCount).toBe(0)
        expect((yield* replies.receive({ maxMessages: 10 })).map((m) => m.body).sort()).toEqual(["answer", "x"])
      }),
    60_000
  )
})
