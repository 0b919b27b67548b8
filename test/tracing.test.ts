/**
 * Traces across the mailbox, exported through `@effect/opentelemetry` to the SDK's in-memory exporter, on
 * every backend (memory, a SQLite file, a throwaway PostgreSQL cluster): a client's span sends a request,
 * a MainLoop agent handles it (its `execute` calls a tool) and replies, and every span of the way — and the
 * reply's stored context — is one trace. A message sent without a span, or whose stored context is
 * malformed, is handled in a root span, as before traces crossed the mailbox.
 */
import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { SqlClient } from "@effect/sql"
import { beforeEach, describe, expect, it } from "@effect/vitest"
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Effect, Option, Schema, type Scope } from "effect"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import { type Mailbox, MailboxResolver, parentSpan } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MainLoop from "../src/MainLoop.js"
import { sqlBackends } from "./support/sqlBackends.js"
import { weatherPrompt } from "./support/weather.js"

/**
 * Runs `test` under an exporting tracer whose spans go to a fresh in-memory exporter (the tracer's shutdown
 * stops and empties its exporter, so each test has its own and reads the spans before it ends).
 */
const withTracer = <A, E, R>(test: (exporter: InMemorySpanExporter) => Effect.Effect<A, E, R>) =>
  Effect.suspend(() => {
    const exporter = new InMemorySpanExporter()
    return Effect.provide(test(exporter), NodeSdk.layer(() => ({ spanProcessor: new SimpleSpanProcessor(exporter) })))
  })

const City = Schema.Struct({ city: Schema.String })
const Weather = Schema.Struct({ city: Schema.String, celsius: Schema.Number })
type Request = MainLoop.MainLoopRequest<typeof City.Type>
type Result = MainLoop.MainLoopResult<typeof Weather.Type>

/** A backend's requests and replies mailboxes, and a way to overwrite a stored traceparent (SQL only). */
interface Backend {
  readonly requests: Mailbox<Request, Result>
  readonly replies: Mailbox<Result>
  readonly overwriteTraceparent: ((id: string, value: string) => Effect.Effect<void>) | undefined
}

let tables = 0
let prefix = "t0_"
beforeEach(() => {
  prefix = `t${++tables}_`
})
const [sqlite, pg] = sqlBackends("tracing")

const memory: Effect.Effect<Backend, unknown, Scope.Scope> = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<Request, Result>({ name: "requests" })
  const replies = yield* MailboxMemory.make<Result>({ name: "replies" })
  return { requests, replies, overwriteTraceparent: undefined }
})

const sql = (client: () => SqlClient.SqlClient): Effect.Effect<Backend, unknown, Scope.Scope> =>
  Effect.suspend(() => sql_(client()))

const sql_ = (db: SqlClient.SqlClient): Effect.Effect<Backend, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const requests = yield* MailboxSql.make({
      name: "requests",
      schema: MainLoop.requestSchema(City),
      replySchema: MainLoop.resultSchema(Weather),
      prefix
    })
    const replies = yield* MailboxSql.make({ name: "replies", schema: MainLoop.resultSchema(Weather), prefix })
    const overwriteTraceparent = (id: string, value: string) =>
      Effect.orDie(db`UPDATE ${db(`${prefix}mailbox_messages`)} SET traceparent = ${value} WHERE seq = ${Number(id)}`)
    return { requests, replies, overwriteTraceparent }
  }).pipe(Effect.provideService(SqlClient.SqlClient, db))

const backends = [
  { label: "memory", make: memory },
  { label: "SQLite", make: sql(sqlite.client) },
  { label: "PostgreSQL", make: sql(pg.client) }
] as const

/** The agent's work: one tool call, then the answer. */
const script = [
  { toolCalls: [{ name: "lookup_weather", params: { city: "Paris" } }] },
  { output: { city: "Paris", celsius: 21 } }
]

/** The spans exported so far, by name (one each, or the test says otherwise). */
const exported = (exporter: InMemorySpanExporter) => {
  const spans = exporter.getFinishedSpans()
  const byName = (name: string): ReadableSpan => {
    const found = spans.filter((span) => span.name === name)
    expect(found.map((span) => span.name)).toEqual([name])
    return found[0]!
  }
  return { spans, byName }
}
const ids = (span: ReadableSpan) => span.spanContext()
const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId

for (const backend of backends) {
  describe(`traces across the mailbox on ${backend.label}`, () => {
    /** A backend, a MainLoop agent over it (one receive per `run`), and a client that sends a request. */
    const setup = Effect.gen(function*() {
      const { overwriteTraceparent, replies, requests } = yield* backend.make
      const adapter = yield* ScriptedAdapter.make([...script, ...script])
      const loop = yield* MainLoop.agent({
        requests,
        adapter,
        prepare: () => Effect.succeed(weatherPrompt)
      }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, replies)))
      const send = requests.send(MainLoop.request({ city: "Paris" }), { replyTo: "replies" })
      // The loop runs outside the clients' spans: what its span continues came through the message.
      const work = (maxMessages: number) => loop.run({ maxIterations: 1, waitTime: 0, maxMessages })
      return { overwriteTraceparent, replies, send, work }
    })

    it.scoped("one trace: the client's span, the worker's, execute's, the tool's, and the reply", () =>
      withTracer((exporter) =>
        Effect.gen(function*() {
          const { replies, send, work } = yield* setup
          const client = yield* Effect.zipLeft(Effect.currentSpan, send).pipe(Effect.withSpan("client"))
          yield* work(1)
          const [reply] = yield* replies.receive()
          expect(reply!.body.output).toEqual({ city: "Paris", celsius: 21 })
          // The client goes on in the worker's trace from the reply.
          yield* Effect.void.pipe(
            Effect.withSpan("client.reply", { parent: Option.getOrUndefined(parentSpan(reply!)) })
          )

          const { byName, spans } = exported(exporter)
          const handle = byName("MailboxWorker.handle")
          const execute = byName("MainLoop.execute")
          const inner = byName("InnerLoop.run")
          const tool = byName("ToolExecutor.execute")
          const clientSpan = byName("client")
          const clientReply = byName("client.reply")
          const trace = client.traceId
          expect(ids(clientSpan)).toMatchObject({ traceId: trace, spanId: client.spanId })
          // The parent chain: client → handle → execute → the agent's inner loop → the tool.
          expect(parentOf(handle)).toBe(client.spanId)
          expect(parentOf(execute)).toBe(ids(handle).spanId)
          expect(parentOf(inner)).toBe(ids(execute).spanId)
          expect(parentOf(tool)).toBe(ids(inner).spanId)
          // The reply carries the worker's span back; the client's next span is its child.
          expect(reply!.traceparent).toBe(`00-${trace}-${ids(handle).spanId}-01`)
          // The reply's run context names the trace the request crossed the mailbox in, and the sender's span.
          expect(reply!.body.runContext).toMatchObject({ traceId: trace, spanId: client.spanId })
          expect(parentOf(clientReply)).toBe(ids(handle).spanId)
          // One trace holds all of them (the receives' own spans are the loop's, not the request's; the SQL
          // driver's statements, `sql.execute`, join the trace where they run, and so does a lease extension
          // when the work — its journal's writes included — takes long enough for the extender to act).
          const inTrace = spans.filter((span) =>
            ids(span).traceId === trace && !span.name.startsWith("sql.") && span.name !== "LeaseExtender.extend" &&
            span.name !== "MailboxSql.extendBatch"
          )
            .map((span) => span.name).sort()
          expect(inTrace).toEqual(
            [
              "InnerLoop.run",
              "MailboxWorker.handle",
              "MainLoop.execute",
              "ToolExecutor.execute",
              "client",
              "client.reply"
            ]
          )
          expect(handle.attributes).toMatchObject({ worker: "main-loop:requests" })
        })
      ))

    it.scoped("replies settled in the background still continue each request's own trace", () =>
      withTracer((exporter) =>
        Effect.gen(function*() {
          const { replies, send, work } = yield* setup
          const first = yield* Effect.zipLeft(Effect.currentSpan, send).pipe(Effect.withSpan("first"))
          const second = yield* Effect.zipLeft(Effect.currentSpan, send).pipe(Effect.withSpan("second"))
          // A batch of two: the first success is queued for the settler fiber, not settled in its span.
          yield* work(2)
          const received = yield* replies.receive({ maxMessages: 10 })
          const { spans } = exported(exporter)
          const handles = spans.filter((span) => span.name === "MailboxWorker.handle")
          expect(handles.map((span) => [ids(span).traceId, parentOf(span)]).sort()).toEqual(
            [[first.traceId, first.spanId], [second.traceId, second.spanId]].sort()
          )
          expect(received.map((reply) => reply.traceparent).sort()).toEqual(
            handles.map((span) => `00-${ids(span).traceId}-${ids(span).spanId}-01`).sort()
          )
        })
      ))

    it.scoped("a request sent without a span is handled in a root span, and its reply carries that trace", () =>
      withTracer((exporter) =>
        Effect.gen(function*() {
          const { replies, send, work } = yield* setup
          const id = yield* send
          yield* work(1)
          const [reply] = yield* replies.receive()
          const { byName } = exported(exporter)
          const handle = byName("MailboxWorker.handle")
          expect(parentOf(handle)).toBeUndefined()
          expect(handle.attributes).toMatchObject({ messageId: id })
          expect(reply!.traceparent).toBe(`00-${ids(handle).traceId}-${ids(handle).spanId}-01`)
        })
      ))

    if (backend.label !== "memory") {
      it.scoped("a malformed stored traceparent is no trace: the request is handled, in a root span", () =>
        withTracer((exporter) =>
          Effect.gen(function*() {
            const { overwriteTraceparent, replies, send, work } = yield* setup
            const [id, client] = yield* Effect.zip(send, Effect.currentSpan).pipe(Effect.withSpan("client"))
            yield* overwriteTraceparent!(id, `00-${client.traceId}-not-a-span-id-01`)
            yield* work(1)
            const [reply] = yield* replies.receive()
            expect(reply!.body.output).toEqual({ city: "Paris", celsius: 21 })
            const { byName } = exported(exporter)
            const handle = byName("MailboxWorker.handle")
            expect(parentOf(handle)).toBeUndefined()
            expect(ids(handle).traceId).not.toBe(client.traceId)
          })
        ))
    }
  })
}
