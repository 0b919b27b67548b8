/**
 * What a sender can put into a durable mailbox, on SQLite and on PostgreSQL: a body nested deeper than its
 * schema can recurse, a schema that throws, values JSON writes as `null` behind `toJSON`, an item a batched
 * statement refuses — each fails only its own message or send, never a loop or another caller — and the
 * property that every body `send` accepts comes back exactly as it was sent (memory, SQLite, PostgreSQL).
 */
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { DateTime, Effect, Either, FastCheck, ParseResult, Schema, type Scope } from "effect"
import { arrayLiteral } from "../src/internal/mailbox/sql/statements.js"
import type { Mailbox } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import { refusedOptions } from "./helpers.js"
import { sqlBackends } from "./support/sqlBackends.js"

let tables = 0
let prefix = "h0_"
beforeEach(() => {
  prefix = `h${++tables}_`
})

const backends = sqlBackends("hostile")

/** A linked list, read with a recursive schema: the kind of body a deep nesting overflows. */
interface Node {
  readonly next: Node | null
}
const Node: Schema.Schema<Node> = Schema.Struct({ next: Schema.NullOr(Schema.suspend(() => Node)) })

/** A list `depth` nodes deep: legal JSON, deeper than `Node`'s decoder can recurse at 1,500. */
const deep = (depth: number): Node => {
  let node: Node = { next: null }
  for (let i = 1; i < depth; i++) node = { next: node }
  return node
}

/** Runs a worker over `mailbox` for `polls` receives of up to 10; what it handled, in order. */
const drain = <A, R>(mailbox: Mailbox<A, R>, polls: number) =>
  Effect.gen(function*() {
    const handled: Array<A> = []
    const worker = yield* MailboxWorker.make({
      name: "w",
      mailbox,
      handle: (message) => Effect.sync(() => handled.push(message.body)),
      onSuccess: () => Effect.succeedNone,
      onFailure: () => Effect.void
    })
    // The run ends after its polls; a loop that died would fail it.
    yield* worker.run({ maxIterations: polls, maxMessages: 10, waitTime: 0 })
    return handled
  })

for (const backend of backends) {
  const onDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.provideService(effect, SqlClient.SqlClient, backend.client())

  describe(`a poison body on ${backend.label}`, () => {
    it.scoped("a body nested 1,500 deep is dead-lettered alone; the loop lives and handles the two beside it", () =>
      Effect.gen(function*() {
        // Another sender's mailbox on the same queue, with a schema that takes anything: the poison gets in.
        const anything = yield* MailboxSql.make({ name: "nodes", schema: Schema.Unknown, prefix })
        const nodes = yield* MailboxSql.make({ name: "nodes", schema: Node, prefix })
        yield* anything.send({ next: null })
        const poison = yield* anything.send(deep(1500))
        yield* anything.send({ next: { next: null } })
        const handled = yield* drain(nodes, 2)
        expect(handled).toEqual([{ next: null }, { next: { next: null } }])
        const [letter, ...others] = yield* (yield* MailboxSqlAdmin.deadLetters({ prefix })).list()
        expect(others).toEqual([])
        expect(letter!.id).toBe(poison)
        expect(letter!.errorTag).toBe("SerializationError")
        expect(letter!.error).toContain("Maximum call stack size exceeded")
        expect(yield* nodes.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("sending that body through the recursive schema is a SerializationError, and nothing is stored", () =>
      Effect.gen(function*() {
        const nodes = yield* MailboxSql.make({ name: "nodes", schema: Node, prefix })
        const error = yield* Effect.flip(nodes.send(deep(1500)))
        expect(error._tag).toBe("SerializationError")
        expect(error.message).toContain("Maximum call stack size exceeded")
        expect(yield* nodes.approximateCount).toBe(0)
      }).pipe(onDb))

    it.scoped("a schema whose transformation throws sets aside that message alone, at send and at receive", () =>
      Effect.gen(function*() {
        const Picky = Schema.transform(Schema.String, Schema.String, {
          strict: true,
          decode: (text) => {
            // eslint-disable-next-line no-restricted-syntax -- the user's schema throws: what the mailbox must survive
            if (text === "boom") throw new Error("picky decode")
            return text
          },
          encode: (text) => {
            // eslint-disable-next-line no-restricted-syntax -- as above
            if (text === "bang") throw new Error("picky encode")
            return text
          }
        })
        const anything = yield* MailboxSql.make({ name: "picky", schema: Schema.Unknown, prefix })
        const picky = yield* MailboxSql.make({ name: "picky", schema: Picky, prefix })
        const refused = yield* Effect.flip(picky.send("bang"))
        expect(refused._tag).toBe("SerializationError")
        expect(refused.message).toContain("picky encode")
        yield* anything.send("one")
        yield* anything.send("boom")
        yield* anything.send("two")
        expect(yield* drain(picky, 2)).toEqual(["one", "two"])
        const [letter] = yield* (yield* MailboxSqlAdmin.deadLetters({ prefix })).list()
        expect(letter!.error).toContain("picky decode")
      }).pipe(onDb))
  })

  describe(`bodies JSON cannot hold exactly on ${backend.label}`, () => {
    it.scoped("NaN behind toJSON, an invalid Date and undefined in an array are refused at send", () =>
      Effect.gen(function*() {
        const anything = yield* MailboxSql.make({ name: "any", schema: Schema.Unknown, prefix })
        const cases: ReadonlyArray<readonly [unknown, string]> = [
          [{ toJSON: () => ({ x: Number.NaN }) }, "NaN at .x"],
          [{ d: new Date(Number.NaN) }, "invalid Date at .d"],
          [{ list: [1, { toJSON: () => Number.POSITIVE_INFINITY }] }, "Infinity at .list[1]"],
          [[1, undefined], "undefined at [1]"],
          [{ nested: { deeper: [null, Number.NEGATIVE_INFINITY] } }, "-Infinity at .nested.deeper[1]"]
        ]
        for (const [body, reason] of cases) {
          const error = yield* Effect.flip(anything.send(body))
          expect(error._tag).toBe("SerializationError")
          expect(error.message).toContain(reason)
        }
        // What JSON holds as written (a null, a valid Date as its string) is accepted.
        yield* anything.send({ a: null, d: new Date(0), list: [null] })
        const [message] = yield* anything.receive()
        expect(message!.body).toEqual({ a: null, d: "1970-01-01T00:00:00.000Z", list: [null] })
        expect(yield* anything.approximateCount).toBe(1)
      }).pipe(onDb))
  })

  describe(`batched statements on ${backend.label}`, () => {
    /** A trigger that refuses any message whose body mentions "poison": a fault the checks before a batch cannot see. */
    const refusePoison = Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const table = `${prefix}mailbox_messages`
      yield* sql.onDialectOrElse({
        pg: () =>
          Effect.zipRight(
            sql.unsafe(`CREATE FUNCTION ${prefix}refuse() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN IF NEW.body LIKE '%poison%' THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$`),
            sql.unsafe(`CREATE TRIGGER ${prefix}refuse BEFORE INSERT ON ${table} FOR EACH ROW
              EXECUTE FUNCTION ${prefix}refuse()`)
          ),
        orElse: () =>
          sql.unsafe(`CREATE TRIGGER ${prefix}refuse BEFORE INSERT ON ${table} FOR EACH ROW
            WHEN NEW.body LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poison refused'); END`)
      })
    })

    it.scoped("a send the database refuses fails alone: the others of its batch are stored", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, prefix })
        yield* refusePoison
        const outcomes = yield* Effect.all(
          ["a", "b", "poison", "c", "d"].map((body) => Effect.either(jobs.send(body))),
          { concurrency: "unbounded" }
        )
        expect(outcomes.map(Either.isRight)).toEqual([true, true, false, true, true])
        expect(Either.isLeft(outcomes[2]!) && outcomes[2].left._tag).toBe("MailboxConnectionError")
        const received = yield* jobs.receive({ maxMessages: 10 })
        expect(received.map((message) => message.body)).toEqual(["a", "b", "c", "d"])
      }).pipe(onDb))

    it.scoped("a reply the database refuses fails its own settle alone: the other acknowledgements commit", () =>
      Effect.gen(function*() {
        const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.String, replySchema: Schema.String, prefix })
        const replies = yield* MailboxSql.make({ name: "replies", schema: Schema.String, prefix })
        for (const body of ["a", "b", "c"]) yield* jobs.send(body, { replyTo: "replies" })
        yield* refusePoison
        const received = yield* jobs.receive({ maxMessages: 10 })
        const outcomes = yield* Effect.all(
          received.map((message) =>
            Effect.either(message.replyAndAcknowledge(message.body === "b" ? "poison" : `re ${message.body}`))
          ),
          { concurrency: "unbounded" }
        ).pipe(Effect.provide(MailboxSql.layer({ prefix })))
        expect(outcomes.map(Either.isRight)).toEqual([true, false, true])
        expect((yield* replies.receive({ maxMessages: 10 })).map((message) => message.body)).toEqual(["re a", "re c"])
        // The refused one was not acknowledged: it stays in flight, to come back.
        expect(yield* jobs.approximateCount).toBe(1)
      }).pipe(onDb))
  })

  describe(`stored text and operator filters on ${backend.label}`, () => {
    it.scoped("a dead letter whose error holds a NUL and a lone surrogate is stored (as U+FFFD), once", () =>
      Effect.gen(function*() {
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        const sink = letters.sink(Schema.String)
        const letter = {
          messageId: "m1",
          body: "body",
          sourceMailbox: "jobs",
          deliveryCount: 5,
          lastError: "bad \u0000 byte and \ud800 half",
          lastErrorTag: "Bo\u0000om",
          enqueuedAt: DateTime.unsafeMake(0),
          deadLetteredAt: DateTime.unsafeMake(1),
          requestId: undefined,
          replyTo: undefined,
          traceId: undefined
        }
        yield* sink.send(letter)
        yield* sink.send({ ...letter, lastError: "x".repeat(200_000) })
        const [stored, ...others] = yield* letters.list()
        expect(others).toEqual([])
        expect(stored!.errorTag).toBe("Bo\ufffdom")
        expect(stored!.error.length).toBe(64 * 1024)
        yield* sink.send(letter)
        expect((yield* letters.list())[0]!.error).toBe("bad \ufffd byte and \ufffd half")
      }).pipe(onDb))

    it.scoped("a filter no queue name or id can match selects nothing, and peek names the bad queue", () =>
      Effect.gen(function*() {
        const letters = yield* MailboxSqlAdmin.deadLetters({ prefix })
        const queues = yield* MailboxSqlAdmin.queues({ prefix })
        const jobs = yield* MailboxSql.make({ name: "\ufffd", schema: Schema.String, prefix })
        yield* jobs.send("kept")
        for (const queue of ["\ud800", "a\u0000b"]) {
          expect(yield* letters.count({ queue })).toBe(0)
          expect(yield* letters.redrive({ queue })).toBe(0)
          expect(yield* letters.purge({ queue })).toBe(0)
          expect(yield* queues.purge(queue)).toBe(0)
          const refused = yield* Effect.flip(queues.peek(queue))
          expect(refused._tag).toBe("InvalidParameterError")
        }
        expect(yield* letters.purge({ ids: ["1\u0000"] })).toBe(0)
        // The queue whose name a lone surrogate would have become on PostgreSQL is untouched.
        expect(yield* jobs.approximateCount).toBe(1)
      }).pipe(onDb))
  })

  describe(`MailboxSql.make's options on ${backend.label}`, () => {
    it.scoped("from plain JavaScript, a missing or wrong schema is a ParseError naming it", () =>
      Effect.gen(function*() {
        for (const options of [{ name: "q" }, { name: "q", schema: "string" }, { name: "q", schema: null }]) {
          const make = MailboxSql.make as (options: unknown) => ReturnType<typeof MailboxSql.make>
          const error = yield* Effect.flip(make(options))
          expect(ParseResult.isParseError(error)).toBe(true)
          expect(refusedOptions(error)).toEqual(["schema"])
        }
        const make = MailboxSql.make as (options: unknown) => ReturnType<typeof MailboxSql.make>
        const error = yield* Effect.flip(make({ name: "q", schema: Schema.String, replySchema: 3 }))
        expect(refusedOptions(error)).toEqual(["replySchema"])
      }).pipe(onDb))
  })
}

/** JSON values, with strings of any UTF-16 units (lone surrogates, NUL, controls) and no -0 (JSON writes 0). */
const jsonBody: FastCheck.Arbitrary<unknown> = FastCheck.letrec((tie) => ({
  value: FastCheck.oneof(
    { depthSize: "small", withCrossShrink: true },
    FastCheck.constant(null),
    FastCheck.boolean(),
    FastCheck.double({ noNaN: true, noDefaultInfinity: true }).filter((n) => !Object.is(n, -0)),
    FastCheck.integer(),
    FastCheck.string({ unit: "binary" }),
    FastCheck.array(tie("value"), { maxLength: 5 }),
    FastCheck.dictionary(FastCheck.string({ unit: "binary" }), tie("value"), { maxKeys: 5 })
  )
})).value

describe("every body send accepts comes back exactly as sent", () => {
  const roundTrips = (make: () => Effect.Effect<Mailbox<unknown, unknown>, unknown, Scope.Scope>) =>
    Effect.scoped(Effect.gen(function*() {
      const mailbox = yield* make()
      yield* Effect.promise(() =>
        FastCheck.assert(
          FastCheck.asyncProperty(jsonBody, (body) =>
            Effect.runPromise(Effect.gen(function*() {
              yield* mailbox.send(body)
              const [message] = yield* mailbox.receive()
              expect(message!.body).toStrictEqual(body)
              yield* message!.acknowledge
            }))),
          { numRuns: 150 }
        )
      )
    }))

  it.effect("memory", () => roundTrips(() => MailboxMemory.make<unknown, unknown>({ name: "bodies" })))
  for (const backend of backends) {
    it.effect(
      backend.label,
      () =>
        roundTrips(() =>
          MailboxSql.make<unknown, unknown, unknown, unknown>({
            name: "bodies",
            schema: Schema.Unknown,
            replySchema: Schema.Unknown,
            prefix
          }).pipe(
            Effect.provideService(SqlClient.SqlClient, backend.client())
          )
        ),
      60_000
    )
  }
})

describe("PostgreSQL array parameters", () => {
  // The settle's ids, receipt handles and reply queues travel as array literals built here (`arrayLiteral`),
  // not by the driver: whatever a row of the table holds — a handle written by hand, quotes, backslashes,
  // braces, commas, spaces, the word NULL — must reach the statement as it was.
  it.effect("arrayLiteral: any strings and nulls reach PostgreSQL as they were", () =>
    Effect.gen(function*() {
      const sql = backends[1].client()
      const text = FastCheck.string({ unit: "binary" }).map((value) => value.replace(/\u0000/g, ""))
      const element = FastCheck.oneof(
        text,
        FastCheck.constantFrom("NULL", "null", "", " ", "a b", "{", "}", ",", "\"", "\\", "\\\"", "a,b"),
        FastCheck.constant(null)
      )
      yield* Effect.promise(() =>
        FastCheck.assert(
          FastCheck.asyncProperty(FastCheck.array(element, { maxLength: 8 }), (values) =>
            Effect.runPromise(Effect.gen(function*() {
              const rows = yield* sql<{ value: string | null }>`SELECT value
                FROM unnest(${arrayLiteral(values)}::text[]) WITH ORDINALITY AS t(value, n) ORDER BY n`
              expect(rows.map((row) => row.value)).toStrictEqual(values)
            }))),
          { numRuns: 300 }
        )
      )
    }), 60_000)
})
