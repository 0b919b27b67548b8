/**
 * The mailbox process contract (test/contract/ProcessContract.ts) on Redis (a throwaway `redis-server`,
 * test/support/redis.ts): MainLoop worker processes SIGKILLed under load lose nothing and answer each request once
 * (the reply stored in the acknowledging script); four receiving processes never share a message.
 */
import { afterAll, beforeAll } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { Redis } from "ioredis"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
import { mailboxProcessContract } from "./contract/ProcessContract.js"
import * as RedisServer from "./support/redis.js"

const serverScope = Effect.runSync(Scope.make())
let url = ""
let redis: Redis | undefined
beforeAll(async () => {
  const server = await Effect.runPromise(Scope.extend(RedisServer.server, serverScope))
  url = `redis://${server.host}:${server.port}`
  redis = new Redis(url, { maxRetriesPerRequest: 1 })
}, 120_000)
afterAll(async () => {
  await redis?.quit()
  await Effect.runPromise(Scope.close(serverScope, Exit.void))
})

mailboxProcessContract({
  label: "Redis",
  target: () => url,
  directory: mkdtempSync(join(tmpdir(), "leasehold-redis-crash-")),
  open: (name, schema, prefix) => MailboxRedis.make(redis!, { name, schema, prefix })
})
