/**
 * What a Redis mailbox keeps when its server dies (docs/production.md, "Redis persistence"): a server with the
 * append-only file on and `appendfsync always` is SIGKILLed — no shutdown, no final write — and started again over
 * its files. Every send and settle that had returned is there: the messages sent, none of the acknowledged ones,
 * the leases and journals as they were. (With `everysec`, the default, up to a second of writes that had returned
 * can be lost by a crash of the machine; a crash of the server process alone loses none, the kernel having the
 * file's pages — this test kills the process, so it cannot show that difference, and does not claim to.)
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Schema, Scope } from "effect"
import { Redis } from "ioredis"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { journalOf } from "../src/internal/journal.js"
import * as MailboxRedis from "../src/internal/mailbox/redis/driver.js"
import { freePort } from "./support/postgres.js"
import * as RedisServer from "./support/redis.js"

const aof = ["--appendonly", "yes", "--appendfsync", "always"]

describe("MailboxRedis across a server killed and started again (appendfsync always)", () => {
  it.live(
    "sent, acknowledged, leased and journaled as before the SIGKILL; the client goes on by itself",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "leasehold-redis-aof-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
        const port = yield* freePort
        const first = yield* Scope.make()
        const server = yield* Scope.extend(RedisServer.serverWith(aof, { port, dir }), first)
        const client = new Redis({ host: server.host, port, maxRetriesPerRequest: 3, retryStrategy: () => 100 })
        yield* Effect.addFinalizer(() => Effect.promise(() => client.quit().catch(() => undefined)))
        const mailbox = yield* MailboxRedis.make<string, string, string>(client, {
          name: "q",
          schema: Schema.String,
          prefix: "durable:"
        })
        for (let i = 0; i < 300; i++) yield* mailbox.send(`m${i}`)
        const acknowledged = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
        yield* Effect.forEach(acknowledged, (message) => message.acknowledge, { discard: true })
        const [held] = yield* mailbox.receive({ visibilityTimeout: "10 minutes" })
        yield* journalOf(held!)!.append({ position: 1, key: "1", entry: "{\"step\":1}", requestId: "r" })

        process.kill(server.pid, "SIGKILL")
        yield* Scope.close(first, Exit.void)
        const second = yield* Scope.make()
        yield* Effect.addFinalizer(() => Scope.close(second, Exit.void))
        yield* Scope.extend(RedisServer.serverWith(aof, { port, dir }), second)

        // The same client and mailbox: ioredis reconnects, the scripts are loaded again on their first NOSCRIPT.
        expect(yield* Effect.retry(mailbox.approximateCount, { times: 50 })).toBe(290)
        // The lease held before the crash still holds: its journal is there, and it can be acknowledged.
        expect((yield* journalOf(held!)!.load).map((step) => step.entry)).toEqual(["{\"step\":1}"])
        const rest = new Set<string>()
        for (;;) {
          const batch = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
          if (batch.length === 0) break
          for (const message of batch) {
            rest.add(message.body)
            yield* message.acknowledge
          }
        }
        yield* held!.acknowledge
        expect(rest.size).toBe(289)
        for (const message of [...acknowledged, held!]) expect(rest.has(message.body)).toBe(false)
        expect(yield* mailbox.approximateCount).toBe(0)
      }).pipe(Effect.scoped),
    60_000
  )
})
