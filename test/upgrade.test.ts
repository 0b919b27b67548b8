/**
 * A rolling upgrade's mix, on SQLite and PostgreSQL: a database fully migrated by this release, a process of
 * this release working on it, and a process of an earlier release — the one before the mailbox's migrations 6
 * and 7 (trace contexts, the receiving process) — still running beside it, with its own connection and the
 * statements that release ran: on PostgreSQL the claim and settle functions of migrations 4 and 5, which the
 * later migrations keep as overloads for it; on SQLite statements that name only the columns it knew. (The
 * work leases' mix — a process before lease expiry beside one after — is in WorkLeaseSql.test.ts.)
 *
 * What is guaranteed, and checked: every request is answered exactly once whichever process took it, neither
 * takes a message the other holds, each reads what the other wrote, and the old process's rows simply lack
 * what it does not know (a claim records no receiver, a reply no trace context).
 */
import { SqlClient } from "@effect/sql"
import * as PgClient from "@effect/sql-pg/PgClient"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { hostname, tmpdir } from "node:os"
import { join } from "node:path"
import * as Database from "../src/Database.js"
import * as Sql from "../src/internal/sql/common.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as Migrations from "../src/Migrations.js"
import * as Postgres from "./support/postgres.js"

const Job = Schema.Struct({ n: Schema.Number })
const prefix = "mix_"
const messagesTable = `${prefix}mailbox_messages`

interface OldRow {
  readonly seq: number | string
  readonly body: string
  readonly receipt_handle: string
}

/** What a process of the earlier release runs, on its own client `sql`: a send, a claim and a settle. */
const earlierRelease = (sql: SqlClient.SqlClient) => {
  const messages = sql(messagesTable)
  const now = Sql.databaseNow(sql)
  const pg = Sql.dialectOf(sql) === "pg"
  return {
    send: (queue: string, body: string, replyTo: string) =>
      pg
        ? sql`WITH ins AS (INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, reply_to)
            VALUES (${queue}, ${body}, ${now}, ${now}, ${replyTo}))
          SELECT pg_notify(${`${prefix}mailbox`}, ${queue})`
        : sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at, reply_to)
            VALUES (${queue}, ${body}, ${now}, ${now}, ${replyTo})`,
    claim: (queue: string, max: number): Effect.Effect<ReadonlyArray<OldRow>, unknown> =>
      pg
        ? sql<OldRow>`SELECT seq, body, receipt_handle, delivery_count, enqueued_at, reply_to
            FROM ${sql(`${prefix}mailbox_claim`)}(${queue}::text, ${now}::bigint, (${now} + 60000)::bigint,
              ${max}::integer)`
        : Sql.writeTransaction(sql)(
          sql<OldRow>`UPDATE ${messages} SET visible_at = ${now} + 60000,
              receipt_handle = lower(hex(randomblob(16))), delivery_count = delivery_count + 1
            WHERE seq IN (SELECT seq FROM ${messages} WHERE queue = ${queue} AND visible_at <= ${now}
              ORDER BY visible_at, seq LIMIT ${max})
            RETURNING seq, body, receipt_handle, delivery_count, enqueued_at, reply_to`
        ),
    /** Acknowledges each delivery with a reply to `replyQueue`; answers how many were current. */
    settle: (rows: ReadonlyArray<OldRow>, replyQueue: string, reply: (row: OldRow) => string) =>
      pg
        ? Effect.map(
          sql<{ settled_seq: string }>`SELECT settled_seq, settled_reply_seq
            FROM ${sql(`${prefix}mailbox_settle`)}(${rows.map((row) => Number(row.seq))}::bigint[],
              ${rows.map((row) => row.receipt_handle)}::text[], ${rows.map(() => replyQueue)}::text[],
              ${rows.map(reply)}::text[], ${now}::bigint, ${`${prefix}mailbox`}::text)`,
          (settled) => settled.length
        )
        : Sql.writeTransaction(sql)(Effect.gen(function*() {
          const acked = yield* sql<{ seq: number }>`DELETE FROM ${messages}
            WHERE visible_at > ${now} AND (seq, receipt_handle) IN (
              SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(${
            JSON.stringify(rows.map((row) => [Number(row.seq), row.receipt_handle]))
          }))
            RETURNING seq`
          const current = new Set(acked.map((row) => Number(row.seq)))
          const replying = rows.filter((row) => current.has(Number(row.seq)))
          yield* sql`INSERT INTO ${messages} (queue, body, visible_at, enqueued_at)
            SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), ${now}, ${now}
            FROM json_each(${JSON.stringify(replying.map((row) => [replyQueue, reply(row)]))}) ORDER BY key`
          return acked.length
        }))
  }
}

const scope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, scope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

const backends: ReadonlyArray<{
  readonly label: string
  /** This release's layer, and the earlier release's own client on the same database. */
  readonly layers: () => {
    readonly current: Layer.Layer<MailboxSql.Services, unknown>
    readonly earlier: Layer.Layer<SqlClient.SqlClient, unknown>
  }
}> = [
  {
    label: "SQLite",
    layers: () => {
      const filename = join(mkdtempSync(join(tmpdir(), "leasehold-upgrade-")), "mix.db")
      return { current: MailboxSql.layerSqlite({ filename }), earlier: Database.layerSqlite({ filename }) }
    }
  },
  {
    label: "PostgreSQL",
    layers: () => ({
      current: MailboxSql.layerPg({ url: pgUrl }),
      earlier: PgClient.layer({ url: Redacted.make(pgUrl), maxConnections: 1 })
    })
  }
]

describe("a rolling upgrade: a process of the earlier release beside one of this release", () => {
  for (const backend of backends) {
    it.live(
      `on ${backend.label}, on a database this release migrated, every request is answered once`,
      () =>
        Effect.gen(function*() {
          const layers = backend.layers()
          const earlierClient = Context.get(yield* Layer.build(layers.earlier), SqlClient.SqlClient)
          const old = earlierRelease(earlierClient)
          yield* Effect.gen(function*() {
            const sql = yield* SqlClient.SqlClient
            // The deploy step, then this release's worker with no migration of its own.
            yield* Migrations.run({ prefix })
            expect((yield* Migrations.status({ prefix })).every((status) => status.state === "current")).toBe(true)
            const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix, create: false })
            const done = yield* MailboxSql.make({ name: "done", schema: Job, prefix, create: false })
            for (let n = 1; n <= 4; n++) yield* jobs.send({ n }, { replyTo: "done" }).pipe(Effect.withSpan("send"))

            // The earlier release claims two (the first two, in order) through its own statements.
            const claimedByOld = yield* old.claim("jobs", 2)
            expect(claimedByOld.map((row) => JSON.parse(row.body))).toEqual([{ n: 1 }, { n: 2 }])
            const receivers = yield* sql<{ received_by: string | null }>`SELECT received_by FROM ${sql(messagesTable)}
            WHERE queue = 'jobs' ORDER BY seq`
            // Its claim records no receiver (it knows no such column); the new release's later claims will.
            expect(receivers.map((row) => row.received_by)).toEqual([null, null, null, null])

            // This release takes the other two, never the earlier one's, and answers them.
            const mine = yield* jobs.receive({ maxMessages: 10, waitTime: 0 })
            expect(mine.map((message) => message.body)).toEqual([{ n: 3 }, { n: 4 }])
            expect(yield* old.claim("jobs", 10)).toEqual([]) // nor does the earlier one take this release's
            const held = yield* sql<{ received_by: string | null }>`SELECT received_by FROM ${sql(messagesTable)}
            WHERE queue = 'jobs' AND received_by IS NOT NULL`
            expect(held.map((row) => row.received_by)).toEqual([
              `${hostname()}:${process.pid}`,
              `${hostname()}:${process.pid}`
            ])
            for (const message of mine) {
              yield* message.replyAndAcknowledge({ n: message.body.n * 100 }).pipe(Effect.withSpan("answer"))
            }

            // The earlier release answers its two through its own settle: the replies reach this release.
            const settled = yield* old.settle(
              claimedByOld,
              "done",
              (row) => JSON.stringify({ n: (JSON.parse(row.body) as { n: number }).n * 100 })
            )
            expect(settled).toBe(2)
            expect(yield* jobs.approximateCount).toBe(0)

            // And it still sends; this release receives what it sent, with no trace context, and answers it.
            yield* old.send("jobs", JSON.stringify({ n: 5 }), "done")
            const [fromOld] = yield* jobs.receive({ waitTime: "5 seconds" })
            expect([fromOld?.body, fromOld?.traceparent]).toEqual([{ n: 5 }, undefined])
            yield* fromOld!.replyAndAcknowledge({ n: 500 })

            // Every request answered exactly once, whichever process took it.
            const replies = yield* done.receive({ maxMessages: 10, waitTime: "5 seconds" })
            const more = yield* done.receive({ maxMessages: 10, waitTime: 0 })
            const answered = [...replies, ...more]
            expect(answered.map((reply) => reply.body.n).sort((a, b) => a - b)).toEqual([100, 200, 300, 400, 500])
            // The replies this release wrote in a span carry its trace context; the earlier release's carry none
            // (it knew no such column): all read alike.
            const traced = answered.filter((reply) => reply.traceparent !== undefined).map((reply) => reply.body.n)
            expect(traced.sort((a, b) => a - b)).toEqual([300, 400])
            for (const reply of answered) yield* reply.acknowledge
            const left = yield* sql<{ n: number | string }>`SELECT count(*) AS n FROM ${sql(messagesTable)}`
            expect(Number(left[0]!.n)).toBe(0)
          }).pipe(Effect.provide(layers.current))
        }).pipe(Effect.scoped),
      60_000
    )
  }
})
