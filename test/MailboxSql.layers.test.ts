/**
 * The SQL mailbox's store is owned by its layer: a thousand layers opened and closed (mailboxes made, messages
 * sent, claimed, replied to and acknowledged on some, a worker made on some so the workers row is refreshed,
 * acknowledgements still committing on some when the layer closes) leave nothing behind once each close
 * returns — no fiber (counted by a `Supervisor`), no PostgreSQL session (pg_stat_activity, by application
 * name), no Node timer or socket (`process.getActiveResourcesInfo()`). And the attacks on that ownership: a
 * mailbox used after its layer closed, two layers on one client and prefix, a layer closed while settles are in
 * flight, the database going away under the lane, `make` interrupted half-way.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Schedule, Schema, Scope, Supervisor } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Database from "../src/Database.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-layers-"))
const suite = Effect.runSync(Scope.make())
let cluster: Postgres.Cluster
let admin: SqlClient.SqlClient
beforeAll(async () => {
  cluster = await Effect.runPromise(Scope.extend(Postgres.cluster, suite))
  admin = await Effect.runPromise(
    Layer.buildWithScope(Database.layerPg({ url: cluster.url, minConnections: 1 }), suite).pipe(
      Effect.map(Context.get(SqlClient.SqlClient))
    )
  )
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suite, Exit.void)))

const Job = Schema.Struct({ n: Schema.Number })
/** How many layers of each backend (`LEASEHOLD_LAYERS` to try fewer while debugging). */
const layers = Number(process.env.LEASEHOLD_LAYERS ?? 1_000)

/** Sessions of `application` now. */
const sessions = (application: string) =>
  Effect.suspend(() =>
    admin<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${application}`
  ).pipe(Effect.map((rows) => rows[0]!.n), Effect.orDie)

/** Node's active handles and requests by kind (timers, sockets, …). */
const resources = (): Map<string, number> => {
  const counts = new Map<string, number>()
  for (const kind of process.getActiveResourcesInfo()) counts.set(kind, (counts.get(kind) ?? 0) + 1)
  return counts
}
/** The kinds of which there are more now than in `baseline`. */
const grownNow = (baseline: Map<string, number>) =>
  [...resources()].filter(([kind, n]) => n > (baseline.get(kind) ?? 0)).map(([kind, n]) => `${kind}: ${n}`)

/**
 * `check` once it gives `expected`, or its last answer after 5 s: a closed socket leaves Node's list, and a
 * session pg_stat_activity, a moment after the close that ended it.
 */
const settled = <A>(check: Effect.Effect<A>, expected: A) =>
  check.pipe(
    Effect.filterOrFail((value) => JSON.stringify(value) === JSON.stringify(expected), (value) => value),
    Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 100 }),
    Effect.merge
  )
const grown = (baseline: Map<string, number>) => settled(Effect.sync(() => grownNow(baseline)), [])
const sessionsNow = (application: string) => settled(sessions(application), 0)

/**
 * One layer's life: two mailboxes; on every 10th a message sent, claimed, replied to and acknowledged, and a
 * worker made (its loop is tracked, so the workers row is written and refreshed); on every 25th a burst of
 * acknowledgements forked and the layer closed while they commit.
 */
const life = (layer: Layer.Layer<MailboxSql.Services, unknown>, index: number) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(layer, scope)
    yield* Effect.gen(function*() {
      const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job, replySchema: Job, prefix: "layers_" })
      const done = yield* MailboxSql.make({ name: "done", schema: Job, prefix: "layers_" })
      if (index % 10 === 0) {
        yield* jobs.purge // what an earlier layer's burst left
        yield* MailboxWorker.make({
          name: `worker-${index}`,
          mailbox: jobs,
          handle: () => Effect.void,
          onSuccess: () => Effect.succeedNone,
          onFailure: () => Effect.void
        })
        yield* jobs.send({ n: index }, { replyTo: "done" })
        const [message] = yield* jobs.receive({ waitTime: "1 second" })
        yield* message!.replyAndAcknowledge({ n: index * 2 })
        const replies = yield* done.receive({ waitTime: "1 second" })
        expect(replies.map((reply) => reply.body.n)).toEqual([index * 2])
        yield* replies[0]!.acknowledge
      }
      if (index % 25 === 5) {
        yield* Effect.forEach([1, 2, 3, 4, 5], (n) => jobs.send({ n }), { concurrency: "unbounded" })
        const received = yield* jobs.receive({ maxMessages: 5 })
        // Acknowledgements in flight as the layer closes: the close waits for them.
        yield* Effect.forkIn(Effect.forEach(received, (m) => Effect.ignore(m.acknowledge), { discard: true }), scope)
      }
    }).pipe(Effect.provide(context), Scope.extend(scope))
    yield* Scope.close(scope, Exit.void)
  })

/** Runs `layers` lives, then checks that nothing they started is left. */
const noneLeft = (label: string, layerAt: (index: number) => Layer.Layer<MailboxSql.Services, unknown>) =>
  Effect.gen(function*() {
    const baseline = resources()
    const supervisor = yield* Supervisor.track
    for (let index = 0; index < layers; index++) {
      yield* life(layerAt(index), index).pipe(Effect.supervised(supervisor))
    }
    // Checked the moment the last close returned: closing a layer ends what it started, it does not leave it
    // ending in the background.
    const fibers = yield* supervisor.value
    expect(fibers.map((fiber) => `${label}: fiber ${fiber.id().id}`)).toEqual([])
    expect(yield* grown(baseline)).toEqual([])
  })

describe("a thousand SQL mailbox layers opened and closed", () => {
  it.live(
    "SQLite file: no fiber, timer or handle left",
    () => noneLeft("SQLite", () => MailboxSql.layerSqlite({ filename: join(directory, "layers.db") })),
    600_000
  )

  it.live("PostgreSQL: no fiber, session, timer or socket left", () =>
    Effect.gen(function*() {
      const application = "layers_test"
      const url = `${cluster.url}?application_name=${application}`
      expect(yield* sessions(application)).toBe(0)
      yield* noneLeft("PostgreSQL", () => MailboxSql.layerPg({ url, minConnections: 1, maxConnections: 2 }))
      expect(yield* sessionsNow(application)).toBe(0)
    }), 900_000)
})

describe("the store's owner, attacked", () => {
  const sqlite = (name: string) => MailboxSql.layerSqlite({ filename: join(directory, `${name}.db`) })

  it.live("a mailbox used after its layer closed fails typed, and nothing hangs", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(sqlite("after"), scope)
      const outside = yield* Scope.make()
      const jobs = yield* MailboxSql.make({ name: "jobs", schema: Job }).pipe(
        Effect.provide(context),
        Scope.extend(outside)
      )
      yield* jobs.send({ n: 1 })
      const [message] = yield* jobs.receive()
      yield* Scope.close(scope, Exit.void)
      // The mailbox's own scope is still open, its store's owner (and client) gone.
      const sent = yield* Effect.either(jobs.send({ n: 2 })).pipe(Effect.timeout("5 seconds"))
      expect(sent._tag === "Left" && sent.left._tag).toBe("MailboxConnectionError")
      const acked = yield* Effect.either(message!.acknowledge).pipe(Effect.timeout("5 seconds"))
      expect(acked._tag === "Left" && acked.left._tag).toBe("MailboxConnectionError")
      yield* Scope.close(outside, Exit.void).pipe(Effect.timeout("5 seconds"))
    }))

  for (const backend of ["SQLite", "PostgreSQL"] as const) {
    it.live(
      `${backend}: two layers on one client and one prefix keep a store each; replies route between them`,
      () =>
        Effect.gen(function*() {
          const client = backend === "SQLite"
            ? Database.layerSqlite({ filename: join(directory, "two.db") })
            : Database.layerPg({
              url: `${cluster.url}?application_name=two_layers`,
              minConnections: 1,
              maxConnections: 1
            })
          const sql = yield* Layer.build(client)
          const first = yield* Scope.make()
          const second = yield* Scope.make()
          const one = yield* Layer.buildWithScope(MailboxSql.layer({ prefix: "two_" }), first).pipe(Effect.provide(sql))
          const two = yield* Layer.buildWithScope(MailboxSql.layer({ prefix: "two_" }), second).pipe(
            Effect.provide(sql)
          )
          const requests = yield* MailboxSql.make({ name: "requests", schema: Job, replySchema: Job, prefix: "two_" })
            .pipe(Effect.provide(one), Effect.provide(sql), Scope.extend(first))
          const replies = yield* MailboxSql.make({ name: "replies", schema: Job, prefix: "two_" }).pipe(
            Effect.provide(two),
            Effect.provide(sql),
            Scope.extend(second)
          )
          // Each layer's resolver sees its own mailboxes only.
          const resolverOne = Context.get(one, MailboxResolver)
          expect((yield* Effect.flip(resolverOne.resolve("replies")))._tag).toBe("MailboxResolutionError")
          expect((yield* Context.get(two, MailboxResolver).resolve("replies")).name).toBe("replies")
          yield* requests.send({ n: 1 }, { replyTo: "replies" })
          const [request] = yield* requests.receive()
          // Through the reply schema (not the resolver), into the same tables: one transaction with the ack.
          yield* request!.replyAndAcknowledge({ n: 10 }).pipe(Effect.provideService(MailboxResolver, resolverOne))
          // Through the other layer's resolver: the target is a mailbox of the same tables.
          yield* requests.send({ n: 2 }, { replyTo: "replies" })
          const [again] = yield* requests.receive()
          yield* again!.replyAndAcknowledge({ n: 20 }).pipe(
            Effect.provideService(MailboxResolver, Context.get(two, MailboxResolver))
          )
          const got: Array<number> = []
          while (got.length < 2) {
            const batch = yield* replies.receive({ maxMessages: 10, waitTime: "2 seconds" })
            if (batch.length === 0) break
            for (const m of batch) {
              got.push(m.body.n)
              yield* m.acknowledge
            }
          }
          expect(got.sort((a, b) => a - b)).toEqual([10, 20])
          // Closing the first layer ends its store only: the second's mailbox goes on.
          yield* Scope.close(first, Exit.void)
          yield* replies.send({ n: 3 })
          expect((yield* replies.receive({ waitTime: "2 seconds" })).map((m) => m.body.n)).toEqual([3])
          yield* Scope.close(second, Exit.void)
          if (backend === "PostgreSQL") {
            expect(yield* settled(sessions("two_layers"), 1)).toBe(1) // the client's own pool only
          }
        }).pipe(Effect.scoped),
      60_000
    )
  }

  it.live(
    "PostgreSQL: a layer closed while claims and settles are in flight on the lane: each ends, typed",
    () =>
      Effect.gen(function*() {
        const url = `${cluster.url}?application_name=closing_test`
        const scope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(MailboxSql.layerPg({ url, minConnections: 1 }), scope)
        const jobs = yield* MailboxSql.make({ name: "closing", schema: Job, prefix: "closing_" }).pipe(
          Effect.provide(context),
          Scope.extend(scope)
        )
        yield* Effect.forEach(Array.from({ length: 50 }, (_, n) => n), (n) => jobs.send({ n }), {
          concurrency: "unbounded"
        })
        const received = yield* jobs.receive({ maxMessages: 10 })
        const settling = yield* Effect.fork(
          Effect.forEach(received, (m) => Effect.either(m.acknowledge), { concurrency: "unbounded" })
        )
        const claiming = yield* Effect.fork(
          Effect.forEach([1, 2, 3, 4], () => Effect.either(jobs.receive({ maxMessages: 5 })), {
            concurrency: "unbounded"
          })
        )
        yield* Effect.yieldNow()
        yield* Scope.close(scope, Exit.void).pipe(
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => "hung" })
        )
        const settled = yield* Fiber.join(settling).pipe(Effect.timeout("10 seconds"))
        for (const outcome of settled) {
          if (outcome._tag === "Left") expect(outcome.left._tag).toMatch(/MailboxConnectionError|ReceiptHandleExpired/)
        }
        const claimed = yield* Fiber.join(claiming).pipe(Effect.timeout("10 seconds"))
        for (const outcome of claimed) {
          if (outcome._tag === "Left") expect(outcome.left._tag).toBe("MailboxConnectionError")
        }
        expect(yield* sessionsNow("closing_test")).toBe(0)
      }),
    60_000
  )

  it.live(
    "PostgreSQL: the database killing the lane's connection: the next statement gets a new one",
    () =>
      Effect.gen(function*() {
        const url = `${cluster.url}?application_name=lane_killed`
        const context = yield* Layer.build(MailboxSql.layerPg({ url, minConnections: 1 }))
        const jobs = yield* MailboxSql.make({ name: "killed", schema: Job, prefix: "killed_" }).pipe(
          Effect.provide(context)
        )
        yield* jobs.send({ n: 1 })
        yield* admin`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'lane_killed'`
        // The statements that meet the dead connections fail typed; within a few tries one goes through again.
        const sent = yield* jobs.send({ n: 2 }).pipe(
          Effect.retry({ times: 20, schedule: Schedule.spaced("100 millis") }),
          Effect.timeout("10 seconds")
        )
        expect(typeof sent).toBe("string")
        const got = yield* jobs.receive({ maxMessages: 10, waitTime: "1 second" }).pipe(
          Effect.retry({ times: 20, schedule: Schedule.spaced("100 millis") })
        )
        expect(got.map((m) => m.body.n).sort()).toEqual([1, 2])
      }).pipe(Effect.scoped),
    60_000
  )

  for (const backend of ["SQLite", "PostgreSQL"] as const) {
    it.live(`${backend}: make interrupted half-way leaves nothing`, () =>
      Effect.gen(function*() {
        const application = "interrupted_make"
        const layer = backend === "SQLite"
          ? sqlite("interrupted")
          : MailboxSql.layerPg({ url: `${cluster.url}?application_name=${application}`, minConnections: 1 })
        const baseline = resources()
        const supervisor = yield* Supervisor.track
        for (const after of [0, 1, 2, 5, 10, 20, 50]) {
          yield* Effect.gen(function*() {
            const context = yield* Layer.build(layer)
            const making = yield* Effect.fork(
              MailboxSql.make({ name: "interrupted", schema: Job, prefix: "interrupted_" }).pipe(
                Effect.provide(context),
                Effect.scoped
              )
            )
            yield* Effect.sleep(`${after} millis`)
            yield* Fiber.interrupt(making)
          }).pipe(Effect.scoped, Effect.supervised(supervisor))
        }
        expect(yield* supervisor.value).toEqual([])
        expect(yield* grown(baseline)).toEqual([])
        if (backend === "PostgreSQL") expect(yield* sessionsNow(application)).toBe(0)
      }), 60_000)
  }
})
