/**
 * The Redis mailbox driver (src/internal/mailbox/redis/driver.ts) against the mailbox contract every backend
 * passes (test/contract/MailboxContract.ts), on a throwaway `redis-server` (test/support/redis.ts): the same
 * behaviour as memory and SQL, under `TestClock` (the scripts take the test's time when a test gives one).
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Schema, Scope, TestClock } from "effect"
import { Redis } from "ioredis"
import { journalOf } from "../src/internal/journal.js"
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import { journalContract } from "./contract/JournalContract.js"
import { mailboxContract } from "./contract/MailboxContract.js"
import * as RedisServer from "./support/redis.js"

const serverScope = Effect.runSync(Scope.make())
let redis: Redis
beforeAll(async () => {
  const server = await Effect.runPromise(Scope.extend(RedisServer.server, serverScope))
  redis = new Redis({ host: server.host, port: server.port, maxRetriesPerRequest: 1 })
}, 120_000)
afterAll(async () => {
  await redis?.quit()
  await Effect.runPromise(Scope.close(serverScope, Exit.void))
})

let prefixes = 0

const where = new WeakMap<object, string>()
mailboxContract(
  "Redis",
  (options) =>
    Effect.suspend(() => {
      const prefix = `t${++prefixes}:`
      return Effect.tap(
        MailboxRedis.make<string, string, string>(redis, { ...options, schema: Schema.String, prefix }),
        (mailbox) => Effect.sync(() => where.set(mailbox, prefix))
      )
    }),
  {
    pause: (mailbox) => MailboxRedis.pause(redis, where.get(mailbox), mailbox.name),
    resume: (mailbox) => MailboxRedis.resume(redis, where.get(mailbox), mailbox)
  }
)

/** A mailbox of `name` on its own prefix, with a client of its own (as another process would have). */
const mailboxOn = (client: Redis, name: string, prefix: string, maxSize?: number) =>
  MailboxRedis.make<string, string, string>(client, {
    name,
    schema: Schema.String,
    prefix,
    ...(maxSize === undefined ? {} : { maxSize })
  })

const otherClient = Effect.acquireRelease(
  Effect.sync(() => new Redis({ host: redis.options.host!, port: redis.options.port!, maxRetriesPerRequest: 1 })),
  (client) => Effect.promise(() => client.quit())
)

// The step journal's contract: lease-checked appends, deleted with the acknowledgement, kept with a dead letter.
journalContract(
  "Redis",
  (options) =>
    Effect.suspend(() =>
      MailboxRedis.make<string, string, string>(redis, { ...options, schema: Schema.String, prefix: `j${++prefixes}:` })
    ),
  (_, message) =>
    Effect.map(journalOf(message)!.load, (steps) => steps.length === 0 ? Option.none() : Option.some(steps))
)

describe("MailboxRedis beyond the contract", () => {
  it.scopedLive(
    "on the real clock, the server's TIME ends a lease: redelivered after 1 s, the old handle refused",
    () =>
      Effect.gen(function*() {
        const mailbox = yield* mailboxOn(redis, "q", `live${++prefixes}:`)
        yield* mailbox.send("m")
        const [first] = yield* mailbox.receive({ visibilityTimeout: "1 second", waitTime: 0 })
        expect(yield* mailbox.receive({ waitTime: 0 })).toEqual([])
        // The long poll wakes on the lease's end (the server's next visibility), not on a poll of the client.
        const [second] = yield* mailbox.receive({ waitTime: "3 seconds" })
        expect(second!.deliveryCount).toBe(2)
        expect((yield* Effect.flip(first!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        yield* second!.acknowledge
        expect(yield* mailbox.approximateCount).toBe(0)
      }),
    30_000
  )

  it.scopedLive(
    "two clients × 8 receivers over 600 messages: each acknowledged once, never two live leases",
    () =>
      Effect.gen(function*() {
        const prefix = `two${++prefixes}:`
        const a = yield* mailboxOn(redis, "q", prefix)
        const b = yield* mailboxOn(yield* otherClient, "q", prefix)
        const sent = new Set<string>()
        for (let i = 0; i < 600; i++) sent.add(yield* (i % 2 === 0 ? a : b).send(`m${i}`))
        const acked = new Map<string, number>()
        const receiver = (mailbox: typeof a) =>
          Effect.gen(function*() {
            for (;;) {
              const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute", waitTime: 0 })
              if (got.length === 0) return
              for (const message of got) {
                yield* message.acknowledge
                acked.set(message.id, (acked.get(message.id) ?? 0) + 1)
              }
            }
          })
        yield* Effect.all(Array.from({ length: 16 }, (_, i) => receiver(i % 2 === 0 ? a : b)), {
          concurrency: "unbounded"
        })
        expect(acked.size).toBe(600)
        expect([...acked.values()].every((n) => n === 1)).toBe(true)
        expect(new Set(acked.keys())).toEqual(sent)
      }),
    60_000
  )

  it.scoped("queue names with hash-tag braces, a key separator and unicode are queues of their own", () =>
    Effect.gen(function*() {
      const prefix = `names${++prefixes}:`
      const names = ["{q}", "q}", "{", "}{", "a:ready", "q", "é", "\u{1F600}", "x".repeat(200)]
      const boxes = yield* Effect.forEach(names, (name) => mailboxOn(redis, name, prefix))
      yield* Effect.forEach(boxes, (box, i) => box.send(`for ${names[i]}`))
      for (const [i, box] of boxes.entries()) {
        const got = yield* box.receive({ maxMessages: 10 })
        expect(got.map((m) => m.body)).toEqual([`for ${names[i]}`])
      }
      // Every key of a queue names one hash slot: one tag per queue.
      const keys = yield* Effect.promise(() => redis.keys(`${prefix}*`))
      for (const key of keys) expect(key).toMatch(new RegExp(`^${prefix}\\{[0-9a-f]+\\}:`))
    }))

  it.scoped("a 20 MB body goes through whole", () =>
    Effect.gen(function*() {
      const mailbox = yield* mailboxOn(redis, "big", `big${++prefixes}:`)
      const body = "ü".repeat(10_000_000)
      yield* mailbox.send(body)
      const [got] = yield* mailbox.receive()
      expect(got!.body.length).toBe(body.length)
      expect(got!.body === body).toBe(true)
      yield* got!.acknowledge
    }), 60_000)

  it.scoped("a message's hash damaged by hand: typed errors, the other messages still delivered and settled", () =>
    Effect.gen(function*() {
      const prefix = `damage${++prefixes}:`
      const mailbox = yield* mailboxOn(redis, "q", prefix)
      const bad = yield* mailbox.send("not json after this")
      yield* mailbox.send("fine")
      const tag = `${prefix}{${Buffer.from("q").toString("hex")}}`
      yield* Effect.promise(() => redis.hset(`${tag}:m:${bad}`, "b", "{not json"))
      const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })
      expect(got.map((m) => m.body)).toEqual(["fine"])
      // A lease end that is not a number is no lease (not a script error, which would fail a whole group).
      yield* Effect.promise(() => redis.hset(`${tag}:m:${got[0]!.id}`, "v", "soon"))
      const error = yield* Effect.flip(got[0]!.nack())
      expect(error._tag).toBe("ReceiptHandleExpiredError")
      // The undecodable one was set aside as a dead letter: no longer counted.
      expect(yield* mailbox.approximateCount).toBe(1)
    }))

  it.scoped("a journal step damaged by hand (not JSON, wrong types, no position): load fails typed, never a defect", () =>
    Effect.gen(function*() {
      const prefix = `jdamage${++prefixes}:`
      const mailbox = yield* mailboxOn(redis, "q", prefix)
      yield* mailbox.send("m")
      const [held] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      const journal = journalOf(held!)!
      yield* journal.append({ position: 1, key: "1", entry: "{}", requestId: undefined })
      const key = `${prefix}{${Buffer.from("q").toString("hex")}}:j:${held!.id}`
      for (
        const damaged of ["2 {not json", "3 {\"k\":1,\"e\":\"x\"}", "nospace", "x {\"k\":\"k\",\"e\":\"e\"}", "4 null"]
      ) {
        yield* Effect.promise(() => redis.zadd(key, 2, damaged))
        const error = yield* Effect.flip(journal.load)
        expect(error._tag).toBe("MailboxConnectionError")
        yield* Effect.promise(() => redis.zrem(key, damaged))
      }
      expect((yield* journal.load).map((step) => step.position)).toEqual([1])
      yield* held!.acknowledge
    }))

  it.scoped("a body that cannot be decoded is dead-lettered with why, its journal kept: never delivered again", () =>
    Effect.gen(function*() {
      const prefix = `dead${++prefixes}:`
      const mailbox = yield* mailboxOn(redis, "q", prefix)
      const bad = yield* mailbox.send("poison")
      const tag = `${prefix}{${Buffer.from("q").toString("hex")}}`
      yield* Effect.promise(() => redis.zadd(`${tag}:j:${bad}`, 1, "1 {}"))
      yield* Effect.promise(() => redis.hset(`${tag}:m:${bad}`, "b", "[1, 2"))
      yield* mailbox.send("after")
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })).map((m) => m.body))
        .toEqual(["after"])
      // Past every visibility: the poison message does not come back.
      yield* TestClock.adjust("2 hours")
      expect((yield* mailbox.receive({ maxMessages: 10 })).map((m) => m.body)).toEqual(["after"])
      expect(yield* Effect.promise(() => redis.zrange(`${tag}:dead`, 0, -1))).toEqual([bad])
      const letter = yield* Effect.promise(() => redis.hgetall(`${tag}:dl:${bad}`))
      expect(letter.b).toBe("[1, 2")
      expect(letter.why).toMatch(/JSON/)
      expect(yield* Effect.promise(() => redis.exists(`${tag}:m:${bad}`, `${tag}:j:${bad}`))).toBe(1)
    }))

  it.scoped("a server over maxmemory refuses sends (typed, nothing half-written) and still takes acknowledgements", () =>
    Effect.gen(function*() {
      const mailbox = yield* mailboxOn(redis, "q", `oom${++prefixes}:`)
      yield* mailbox.send("before")
      const [held] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
      const used = Number(/used_memory:(\d+)/.exec(yield* Effect.promise(() => redis.info("memory")))![1])
      yield* Effect.promise(() => redis.config("SET", "maxmemory-policy", "noeviction"))
      yield* Effect.promise(() => redis.config("SET", "maxmemory", String(Math.max(1, used - 1_000_000))))
      yield* Effect.gen(function*() {
        const refused = yield* Effect.flip(mailbox.send("during"))
        expect(refused._tag).toBe("MailboxConnectionError")
        expect(String(refused.message)).toMatch(/OOM/)
        expect(yield* mailbox.approximateCount).toBe(1)
        // What frees memory is still taken: a worker's acknowledgement.
        yield* held!.acknowledge
        expect(yield* mailbox.approximateCount).toBe(0)
      }).pipe(Effect.ensuring(Effect.promise(() => redis.config("SET", "maxmemory", "0"))))
      yield* mailbox.send("after")
      expect(yield* mailbox.approximateCount).toBe(1)
    }))

  it.scoped("a reply to a queue of the same server is written in the acknowledging script: full, nothing is done", () =>
    Effect.gen(function*() {
      const prefix = `reply${++prefixes}:`
      const requests = yield* mailboxOn(redis, "requests", prefix)
      const replies = yield* mailboxOn(redis, "replies", prefix, 1)
      yield* replies.send("already here")
      yield* requests.send("ask", { replyTo: "replies" })
      const [request] = yield* requests.receive({ visibilityTimeout: "1 minute" })
      const resolver = MailboxResolver.fromMailboxes(replies)
      const full = yield* Effect.flip(
        request!.replyAndAcknowledge("answer").pipe(Effect.provideService(MailboxResolver, resolver))
      )
      expect(full._tag).toBe("MailboxFullError")
      // Nothing done: the request is still held by this delivery, the reply queue as it was.
      expect(yield* replies.approximateCount).toBe(1)
      const [old] = yield* replies.receive()
      yield* old!.acknowledge
      const id = yield* request!.replyAndAcknowledge("answer").pipe(Effect.provideService(MailboxResolver, resolver))
      expect(yield* requests.approximateCount).toBe(0)
      const [reply] = yield* replies.receive()
      expect([reply!.id, reply!.body]).toEqual([id, "answer"])
    }))

  it.scoped("a reply the target's schema refuses fails SerializationError and leaves the request held", () =>
    Effect.gen(function*() {
      const prefix = `refuse${++prefixes}:`
      const requests = yield* mailboxOn(redis, "requests", prefix)
      const replies = yield* MailboxRedis.make<string, string, string>(redis, {
        name: "replies",
        schema: Schema.String.pipe(Schema.maxLength(3)),
        prefix
      })
      yield* requests.send("ask", { replyTo: "replies" })
      const [request] = yield* requests.receive({ visibilityTimeout: "1 minute" })
      const error = yield* Effect.flip(
        request!.replyAndAcknowledge("far too long").pipe(
          Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(replies))
        )
      )
      expect(error._tag).toBe("SerializationError")
      expect(yield* replies.approximateCount).toBe(0)
      yield* request!.acknowledge
    }))

  it.scoped("a reply to a mailbox of another store is sent, then the request acknowledged", () =>
    Effect.gen(function*() {
      const requests = yield* mailboxOn(redis, "requests", `elsewhere${++prefixes}:`)
      const replies = yield* MailboxMemory.make<string>({ name: "replies" })
      yield* requests.send("ask", { replyTo: "replies" })
      const [request] = yield* requests.receive()
      yield* request!.replyAndAcknowledge("answer").pipe(
        Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(replies))
      )
      expect(yield* requests.approximateCount).toBe(0)
      expect((yield* replies.receive()).map((m) => m.body)).toEqual(["answer"])
    }))

  it.scopedLive(
    "a send of another client wakes a sleeping receiver at once (pub/sub), not at its next poll",
    () =>
      Effect.gen(function*() {
        const prefix = `wake${++prefixes}:`
        const sender = yield* mailboxOn(redis, "q", prefix)
        const receiver = yield* mailboxOn(yield* otherClient, "q", prefix)
        const latencies: Array<number> = []
        for (let i = 0; i < 5; i++) {
          const waiting = yield* Effect.fork(receiver.receive({ waitTime: "10 seconds" }))
          // Long enough for the poll to back off to its 250 ms.
          yield* Effect.sleep(`${700 + i * 37} millis`)
          const sentAt = Date.now()
          yield* sender.send(`m${i}`)
          const [got] = yield* Fiber.join(waiting)
          latencies.push(Date.now() - sentAt)
          yield* got!.acknowledge
        }
        // By the poll alone, each would wait up to 250 ms (all five under 80 ms: about 1 chance in 300).
        expect(Math.max(...latencies)).toBeLessThan(80)
      }),
    30_000
  )
})
