/**
 * The Redis mailbox driver (src/internal/mailbox/redis/driver.ts) against the mailbox contract every backend
 * passes (test/contract/MailboxContract.ts), on a throwaway `redis-server` (test/support/redis.ts): the same
 * behaviour as memory and SQL, under `TestClock` (the scripts take the test's time when a test gives one).
 */
import { afterAll, beforeAll } from "@effect/vitest"
import { Effect, Exit, Schema, Scope } from "effect"
import { Redis } from "ioredis"
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
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
