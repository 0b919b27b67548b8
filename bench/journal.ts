/**
 * The step journal's cost: what recording costs an agent run per step, and what resuming from a journal costs,
 * on each backend — the memory mailbox, SQLite (a temporary file) and PostgreSQL (the bench's cluster).
 *
 * A run is a `ScriptedAdapter` model that answers at once: `TURNS` turns, each calling one tool that returns at
 * once, then the answer — `2 × TURNS + 2` steps (turns, tool calls, the answer, the evaluation's outcome). With
 * a model that takes no time the difference between a run with its delivery's journal and the same run without
 * one is all the journal's: the appends (one write each, through the store's group commit) and building the
 * steps. A resumed run is the second delivery of a message whose first delivery recorded the whole run except
 * its outcome: it reads the journal once and replays every step.
 */
import { SqlClient } from "@effect/sql"
import { Effect, Layer, Schema, type Scope } from "effect"
import { Journal, type Mailbox, MailboxMemory, MailboxSql, Prompt, ScriptedAdapter, Session, Tool } from "leasehold"
import { performance } from "node:perf_hooks"

const TURNS = 10
const STEPS = 2 * TURNS + 2
const RUNS = 30
const ROUNDS = 5

const echo = Tool.make({
  name: "echo",
  description: "Returns its input.",
  parameters: Schema.Struct({ n: Schema.Number }),
  success: Schema.Number,
  handler: ({ n }) => Effect.succeed(n)
})
const prompt = Prompt.make({ name: "bench", instructions: "Count.", input: "go", tools: [echo] })
const script: ReadonlyArray<ScriptedAdapter.ScriptedTurn> = [
  ...Array.from({ length: TURNS }, (_, n) => ({
    toolCalls: [{ id: `c${n}`, name: "echo", params: { n } }],
    usage: { inputTokens: 100, outputTokens: 10 }
  })),
  { text: "done", usage: { inputTokens: 100, outputTokens: 10 } }
]

type Requests = Mailbox.Mailbox<string, never>

const evaluate = (journal: Journal.Journal | undefined, turns = script) =>
  Effect.gen(function*() {
    const adapter = yield* Effect.orDie(ScriptedAdapter.make(turns))
    const session = yield* Session.make
    return yield* Effect.orDie(adapter.evaluate(prompt, { session, journal }))
  })

/** Milliseconds per run: `RUNS` deliveries, each evaluated (with its journal or without) and acknowledged. */
const recordRound = (requests: Requests, journaled: boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < RUNS; i++) yield* Effect.orDie(requests.send(`r${i}`))
    const started = performance.now()
    for (let i = 0; i < RUNS; i++) {
      const [message] = yield* Effect.orDie(requests.receive({ visibilityTimeout: "5 minutes" }))
      yield* evaluate(journaled ? Journal.forDelivery(message!, message!.body) : undefined)
      yield* Effect.orDie(message!.acknowledge)
    }
    return (performance.now() - started) / RUNS
  })

/** Milliseconds per resumed run: the second delivery replays a journal of every step but the outcome. */
const replayRound = (requests: Requests) =>
  Effect.gen(function*() {
    let millis = 0
    for (let i = 0; i < RUNS; i++) {
      yield* Effect.orDie(requests.send(`r${i}`))
      const [first] = yield* Effect.orDie(requests.receive({ visibilityTimeout: "5 minutes" }))
      // The model fails at the answer: every turn and tool is recorded, the outcome is not.
      yield* Effect.exit(evaluate(Journal.forDelivery(first!, first!.body), [...script.slice(0, TURNS), { fail: "x" }]))
      yield* Effect.orDie(first!.nack())
      const started = performance.now()
      const [second] = yield* Effect.orDie(requests.receive({ visibilityTimeout: "5 minutes" }))
      yield* evaluate(Journal.forDelivery(second!, second!.body), [script[TURNS]!])
      yield* Effect.orDie(second!.acknowledge)
      millis += performance.now() - started
    }
    return millis / RUNS
  })

const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

interface Row {
  readonly label: string
  readonly plain: number
  readonly journaled: number
  readonly resumed: number
}

const measure = <R>(label: string, requests: Effect.Effect<Requests, unknown, Scope.Scope | R>) =>
  Effect.gen(function*() {
    const mailbox = yield* Effect.orDie(requests)
    yield* recordRound(mailbox, true) // warm-up
    yield* recordRound(mailbox, false)
    yield* replayRound(mailbox)
    const plain: Array<number> = []
    const journaled: Array<number> = []
    const resumed: Array<number> = []
    for (let round = 0; round < ROUNDS; round++) {
      plain.push(yield* recordRound(mailbox, false))
      journaled.push(yield* recordRound(mailbox, true))
      resumed.push(yield* replayRound(mailbox))
    }
    return { label, plain: median(plain), journaled: median(journaled), resumed: median(resumed) } satisfies Row
  }).pipe(Effect.scoped)

/** The journal section of BENCHMARKS.md, measured on memory, SQLite (`sqliteFile`) and PostgreSQL (`url`). */
export const journalSection = async (
  sqliteFile: string,
  url: string,
  log: (line: string) => void
): Promise<ReadonlyArray<string>> => {
  let tables = 0
  const sql = (label: string, layer: Layer.Layer<SqlClient.SqlClient, unknown>) =>
    Effect.provide(
      measure(label, MailboxSql.make({ name: "bench-agent", schema: Schema.String, prefix: `bj${++tables}_` })),
      Layer.orDie(layer)
    )
  const rows: Array<Row> = []
  for (
    const measured of [
      measure("memory", MailboxMemory.make<string>({ name: "bench-agent" })),
      sql("SQLite", MailboxSql.layerSqlite({ filename: sqliteFile })),
      sql("PostgreSQL", MailboxSql.layerPg({ url }))
    ]
  ) {
    const row = await Effect.runPromise(measured)
    const label = row.label
    rows.push(row)
    log(
      `journal ${label}: run ${row.plain.toFixed(2)} ms without, ${row.journaled.toFixed(2)} ms with (${
        perStep(row).toFixed(0)
      } µs per step); resumed run ${row.resumed.toFixed(2)} ms`
    )
  }
  return [
    "## Agent step journal: the cost of recording and of resuming",
    "",
    `A run: a model that answers at once, ${TURNS} turns each calling one tool that returns at once, then the answer`,
    `(${STEPS} steps), on one delivery of a message of each backend, acknowledged after. Medians of ${ROUNDS} rounds of`,
    `${RUNS} runs after a warm-up, the cases alternating. "Per step" is the difference between a run with its`,
    "delivery's journal and the same run without one, over its steps: each append is one lease-checked write",
    "through the store's group commit. A resumed run is a second delivery that reads the journal of every step",
    "but the outcome and replays them (no model call, no tool run), then records the outcome. Against a model",
    "call of a second or more, the per-step figure is what the journal adds to an agent's step.",
    "",
    "| backend | run without journal (ms) | run with journal (ms) | added per step (µs) | resumed run (ms) |",
    "| --- | ---: | ---: | ---: | ---: |",
    ...rows.map((row) =>
      `| ${row.label} | ${row.plain.toFixed(2)} | ${row.journaled.toFixed(2)} | ${perStep(row).toFixed(0)} | ${
        row.resumed.toFixed(2)
      } |`
    ),
    ""
  ]
}

const perStep = (row: Row) => ((row.journaled - row.plain) / STEPS) * 1000
