/**
 * Every constructor fed junk. Whatever lands in its options — NaN, ±Infinity, negatives, zero, huge numbers,
 * NaN in a `[seconds, nanos]` tuple, durations that are too long or malformed, forged `Duration`s, bigints,
 * wrong types — the answer is a `ParseError` whose message names the option, or a service that works (one cheap
 * operation shows it): never a defect, an interruption or a hang (each run has 3 s of real time).
 */
import { FetchHttpClient } from "@effect/platform"
import { SqlClient } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { afterAll, beforeAll, describe, expect, it, vi } from "@effect/vitest"
import {
  Cause,
  Context,
  Duration,
  Effect,
  Exit,
  FastCheck as fc,
  Fiber,
  Layer,
  Logger,
  LogLevel,
  Option,
  ParseResult,
  Redacted,
  Schedule,
  Schema,
  Scope
} from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { inspect } from "node:util"
import * as Anthropic from "../src/adapters/Anthropic.js"
import * as ScriptedAdapter from "../src/adapters/ScriptedAdapter.js"
import * as Budget from "../src/Budget.js"
import * as Database from "../src/Database.js"
import * as DeadLetter from "../src/DeadLetter.js"
import * as Deadline from "../src/Deadline.js"
import * as EvalLoop from "../src/EvalLoop.js"
import * as Evaluator from "../src/Evaluator.js"
import * as Health from "../src/Health.js"
import * as Heartbeat from "../src/Heartbeat.js"
import * as LeaseExtender from "../src/LeaseExtender.js"
import * as LoopGroup from "../src/LoopGroup.js"
import { MailboxResolver } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxWorker from "../src/MailboxWorker.js"
import * as MainLoop from "../src/MainLoop.js"
import * as MergeQueue from "../src/MergeQueue.js"
import * as Prompt from "../src/Prompt.js"
import * as Session from "../src/Session.js"
import * as ShutdownCoordinator from "../src/ShutdownCoordinator.js"
import * as Watchdog from "../src/Watchdog.js"
import * as WorkLease from "../src/WorkLease.js"
import * as WorkLeaseSql from "../src/WorkLeaseSql.js"
import { refusedOptions } from "./helpers.js"

// ---------------------------------------------------------------------------
// Junk
// ---------------------------------------------------------------------------

/**
 * An object that passes `Duration.isDuration` with any `value`: what another copy of effect, or a hand, can make.
 * It shows itself (Duration's own `toJSON` would throw on such a value, in a failure's report).
 */
const forged = (value: unknown): unknown => {
  const shown = () => `forged Duration ${inspect(value)}`
  return Object.assign(Object.create(Object.getPrototypeOf(Duration.zero)), {
    value,
    toJSON: shown,
    toString: shown,
    [inspect.custom]: shown
  })
}

const junkValues: ReadonlyArray<unknown> = [
  NaN,
  Infinity,
  -Infinity,
  -1,
  0,
  -0,
  0.5,
  1,
  1e300,
  Number.MAX_SAFE_INTEGER + 2,
  2 ** 31,
  [NaN, 0],
  [0, NaN],
  [1, -1],
  [Infinity, 0],
  [1, 0.5],
  [0, 2e9],
  [1e300, 0],
  "13 hours",
  "1e9 hours",
  "",
  "abc",
  "-5 seconds",
  "Infinity millis",
  "NaN seconds",
  "1".repeat(400) + " millis",
  "9".repeat(40) + " nanos",
  "x".repeat(100_000),
  "30 seconds",
  "0 seconds",
  "1 millis",
  null,
  {},
  [],
  true,
  false,
  Duration.infinity,
  Duration.zero,
  Duration.millis(1),
  Duration.seconds(30),
  Duration.hours(13),
  forged({ _tag: "Millis", millis: NaN }),
  forged({ _tag: "Millis", millis: -5 }),
  forged({ _tag: "Nanos", nanos: 5 }),
  forged(undefined),
  BigInt(10) ** BigInt(400),
  BigInt(-1),
  BigInt(0),
  BigInt(1_000_000),
  Symbol("junk"),
  () => Effect.void
]

/** What each field gets first (see `examples`): what was accepted before, or read as zero. */
const worst: ReadonlyArray<unknown> = [
  NaN,
  Infinity,
  1e300,
  0,
  [NaN, 0],
  "13 hours",
  Duration.infinity,
  forged({ _tag: "Millis", millis: NaN }),
  forged(undefined),
  null
]

const junk: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...junkValues) },
  { weight: 1, arbitrary: fc.double() },
  { weight: 1, arbitrary: fc.integer() },
  { weight: 1, arbitrary: fc.bigInt() },
  { weight: 1, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 200_000 }).map(Duration.millis) },
  { weight: 1, arbitrary: fc.tuple(fc.double(), fc.double()) }
)

/** `value` at `path` (`"config.timeout"`) in a copy of `options`. */
const place = (options: Record<string, unknown>, path: string, value: unknown): Record<string, unknown> => {
  const [head, ...rest] = path.split(".") as [string, ...Array<string>]
  if (rest.length === 0) return { ...options, [head]: value }
  const inner = options[head]
  const base = typeof inner === "object" && inner !== null && !Array.isArray(inner)
    ? inner as Record<string, unknown>
    : {}
  return { ...options, [head]: place(base, rest.join("."), value) }
}

const show = (value: unknown) => inspect(value, { depth: 4, maxStringLength: 60, maxArrayLength: 4, breakLength: 200 })

// ---------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------

interface Case {
  readonly label: string
  /** The option fields junk goes into (`config.timeout` for a nested one), one or several at a time. */
  readonly fields: ReadonlyArray<string>
  /** What is there before junk replaces some of it (a mailbox, callbacks, a safe `onStall`…). */
  readonly base?: Record<string, unknown> | undefined
  /** Junk for a field that wants its own (signal names). */
  readonly junkFor?: Readonly<Record<string, fc.Arbitrary<unknown>>> | undefined
  /** Builds the service from `options` and uses it once: fails only as the constructor does. */
  readonly use: (options: Record<string, unknown>) => Effect.Effect<unknown, unknown, Scope.Scope>
  /** A typed failure that is as good an answer as a `ParseError` for these options. */
  readonly alsoAccepts?: ((error: unknown, options: Record<string, unknown>) => boolean) | undefined
}

const hang = { _tag: "Hang" } as const

/** Fails the property (with what was given) unless `exit` is a success or a `ParseError` naming an option. */
const judge = (c: Case, options: Record<string, unknown>, exit: Exit.Exit<unknown, unknown>): void => {
  if (Exit.isSuccess(exit)) return
  const given = `${c.label}(${show(options)})`
  const failure = Cause.failureOption(exit.cause)
  if (Option.isNone(failure)) {
    expect.fail(`${given} did not answer with a typed failure:\n${Cause.pretty(exit.cause)}`)
  }
  const error = failure.value
  if (error === hang) expect.fail(`${given} did not answer within 3 s`)
  if (c.alsoAccepts?.(error, options) === true) return
  if (!ParseResult.isParseError(error)) {
    expect.fail(`${given} failed with something else than a ParseError: ${show(error)}`)
  }
  const refused = refusedOptions(error)
  if (typeof refused === "string") expect.fail(`${given}: ${refused}`)
  // Each refusal is of an option of this constructor: the field itself, a part of it, or (from a constructor it
  // hands a nested object to, `leaseExtender` → `LeaseExtender.make`) the field's own name. Junk in place of
  // such an object (`leaseExtender: NaN`) is refused whole, by that constructor.
  for (const path of refused) {
    if (path === "" && error.message.includes("options\n└─ must be an object")) continue
    const ours = c.fields.some((field) =>
      field === path || field.startsWith(`${path}.`) || path.startsWith(`${field}.`) || field.endsWith(`.${path}`)
    )
    if (!ours) expect.fail(`${given} refused ${path}, not one of its options: ${error.message}`)
  }
}

const property = (c: Case) =>
  it.live.prop(
    `${c.label}: a ParseError naming the option, or a service that works`,
    {
      picked: fc.subarray([...c.fields], { minLength: 1 }),
      values: fc.record(Object.fromEntries(c.fields.map((field) => [field, c.junkFor?.[field] ?? junk])))
    },
    ({ picked, values }) =>
      Effect.gen(function*() {
        const options = picked.reduce((options, field) => place(options, field, values[field]), c.base ?? {})
        const exit = yield* Effect.scoped(c.use(options)).pipe(
          Effect.disconnect,
          Effect.timeoutFail({ duration: "3 seconds", onTimeout: () => hang }),
          Effect.exit,
          Logger.withMinimumLogLevel(LogLevel.None)
        )
        judge(c, options, exit)
      }),
    {
      timeout: 60_000,
      fastCheck: {
        numRuns: 60,
        // The worst junk in every field, one field at a time, before the random runs. Each example is the
        // property's one argument in a tuple, as fast-check runs it (@effect/vitest's type leaves the tuple out).
        examples: c.fields.flatMap((field) =>
          worst.map((value) => [{ picked: [field], values: Object.fromEntries(c.fields.map((f) => [f, value])) }])
        ) as unknown as Array<{ picked: Array<string>; values: Record<string, unknown> }>,
        // No shrinking: a failure is reported as found (shrinking a bigint towards a limit takes a long while,
        // and runs that fail at once never give the timers a turn).
        endOnFailure: true
      }
    }
  )

// ---------------------------------------------------------------------------
// What the services need
// ---------------------------------------------------------------------------

const directory = mkdtempSync(join(tmpdir(), "leasehold-options-"))
const sqlScope = Effect.runSync(Scope.make())
let sql: Context.Context<SqlClient.SqlClient> = Context.empty() as Context.Context<SqlClient.SqlClient>
beforeAll(async () => {
  sql = await Effect.runPromise(
    Layer.buildWithScope(SqliteClient.layer({ filename: join(directory, "options.db") }), sqlScope)
  )
})
afterAll(() => Effect.runPromise(Scope.close(sqlScope, Exit.void)))

const onSql = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provide(effect, sql)

/** The default stall action exits the process: a valid junk threshold (1 ns) must not end the test run. */
const keepProcess = Effect.acquireRelease(
  Effect.sync(() => vi.spyOn(process, "exit").mockImplementation((() => undefined) as never)),
  (spy) => Effect.sync(() => spy.mockRestore())
)

let unique = 0
const fresh = (stem: string) => `${stem}-${++unique}`

/** A loop that does nothing with its messages. */
const idleLoop = Effect.gen(function*() {
  const mailbox = yield* MailboxMemory.make<string>({ name: fresh("idle") })
  return yield* MailboxWorker.make({
    name: fresh("idle-loop"),
    mailbox,
    handle: () => Effect.void,
    onSuccess: () => Effect.succeedNone,
    onFailure: () => Effect.void
  })
})

/** A MainLoop's mailboxes, its resolver, and a request sent with a reply address. */
const mainLoopSetup = Effect.gen(function*() {
  const requests = yield* MailboxMemory.make<MainLoop.MainLoopRequest<string>, MainLoop.MainLoopResult<string>>({
    name: fresh("requests")
  })
  const responses = yield* MailboxMemory.make<MainLoop.MainLoopResult<string>>({ name: fresh("responses") })
  yield* requests.send(MainLoop.request("hello"), { replyTo: responses.name })
  return { requests, responses, resolver: MailboxResolver.fromMailboxes(requests, responses) }
})

const TablesNotFound = Schema.Struct({ _tag: Schema.Literal("TablesNotFoundError") })

/** The options as the constructor's type says, which is what the junk pretends to be. */
const as = <T>(options: Record<string, unknown>): T => options as T

// ---------------------------------------------------------------------------
// The constructors
// ---------------------------------------------------------------------------

const cases: ReadonlyArray<Case> = [
  {
    label: "LeaseExtender.make",
    fields: ["extension", "interval", "enabled"],
    use: (options) =>
      Effect.gen(function*() {
        const extender = yield* LeaseExtender.make(as(options))
        const mailbox = yield* MailboxMemory.make<string>({ name: "lease" })
        yield* mailbox.send("work")
        const [message] = yield* mailbox.receive({ visibilityTimeout: "30 seconds" })
        // The extension it asks for is one the mailbox takes.
        const extended: Array<Exit.Exit<void, unknown>> = []
        const recorded = {
          id: message!.id,
          extendVisibility: (timeout: Duration.Duration) =>
            Effect.onExit(message!.extendVisibility(timeout), (exit) => Effect.sync(() => extended.push(exit)))
        }
        const heartbeat = yield* Heartbeat.make
        yield* extender.extendWhile(
          recorded,
          heartbeat,
          Effect.zipRight(heartbeat.beat, Effect.repeatN(Effect.yieldNow(), 10))
        )
        expect(extended.map((exit) => exit._tag)).toEqual(extender.config.enabled ? ["Success"] : [])
        yield* message!.acknowledge
      })
  },
  {
    label: "Watchdog.make",
    fields: ["threshold", "interval", "schedule", "onStall"],
    base: { onStall: () => Effect.void },
    use: (options) =>
      Effect.gen(function*() {
        yield* keepProcess
        const watchdog = yield* Watchdog.make(as(options))
        yield* watchdog.register("loop", yield* Heartbeat.make)
        expect(Array.isArray(yield* watchdog.check)).toBe(true)
        yield* watchdog.start
      })
  },
  {
    label: "MergeQueue.make",
    fields: ["lockTimeout", "initialBackoff", "maxBackoff", "maxAttempts", "prefix", "create"],
    base: { prefix: "pq_" },
    use: (options) =>
      onSql(Effect.gen(function*() {
        const queue = yield* MergeQueue.make(as(options))
        // A claim takes the lock for `lockTimeout`: the lock must read back, and the stats with it.
        yield* queue.enqueue(fresh("workspace"))
        const claim = yield* queue.nextWithLock(fresh("agent"))
        expect(Option.isSome(claim)).toBe(true)
        yield* queue.getProcessingLock
        expect((yield* queue.stats).total).toBeGreaterThan(0)
        if (Option.isSome(claim)) yield* queue.releaseProcessingLock(claim.value)
      })),
    // Opening tables that are not there without creating them is refused so, whatever else is given.
    alsoAccepts: (error, options) => options.create === false && Schema.is(TablesNotFound)(error)
  },
  {
    label: "WorkLease.make",
    fields: ["maxRetries", "retention", "retention.maxOutOfOrder", "leaseTimeout"],
    use: (options) =>
      Effect.gen(function*() {
        const lease = yield* WorkLease.make(as(options))
        expect((yield* lease.tryAcquire("domain", 0))._tag).toBe("Acquired")
      })
  },
  {
    label: "WorkLeaseSql.make",
    fields: ["maxRetries", "prefix", "leaseTimeout"],
    base: { prefix: "pw_" },
    use: (options) =>
      onSql(Effect.gen(function*() {
        const lease = yield* WorkLeaseSql.make(as(options))
        expect((yield* lease.tryAcquire(fresh("domain"), 0))._tag).toBe("Acquired")
      }))
  },
  {
    label: "MailboxMemory.make",
    fields: ["maxSize", "name"],
    base: { name: "memory" },
    use: (options) =>
      Effect.gen(function*() {
        const mailbox = yield* MailboxMemory.make<string>(as(options))
        yield* mailbox.send("hello")
        const received = yield* mailbox.receive({ maxMessages: 10 })
        expect(received.length).toBe(1)
        yield* Effect.forEach(received, (message) => message.acknowledge)
      })
  },
  {
    label: "MailboxSql.make",
    fields: ["pollInterval", "maxSize", "maxBodyBytes", "name", "prefix", "schema", "replySchema"],
    base: { name: "sql", schema: Schema.String, prefix: "pm_" },
    use: (options) =>
      onSql(Effect.gen(function*() {
        const mailbox = yield* MailboxSql.make(as<MailboxSql.Options<string, string, never, never>>(options))
        // A body beyond a tiny `maxBodyBytes` is the send's own typed refusal: the mailbox works.
        const sent = yield* Effect.either(mailbox.send("hello"))
        const received = yield* mailbox.receive({ maxMessages: 10 })
        expect(received.length).toBe(sent._tag === "Right" ? 1 : 0)
        yield* Effect.forEach(received, (message) => message.acknowledge)
      }))
  },
  {
    label: "MailboxWorker.make",
    fields: ["leaseExtender", "leaseExtender.interval", "leaseExtender.extension", "name"],
    use: (options) =>
      Effect.gen(function*() {
        const mailbox = yield* MailboxMemory.make<string>({ name: fresh("worker") })
        yield* mailbox.send("work")
        const loop = yield* MailboxWorker.make({
          name: "worker",
          mailbox,
          handle: () => Effect.void,
          onSuccess: () => Effect.succeedNone,
          onFailure: () => Effect.void,
          ...as<object>(options)
        })
        yield* loop.run({ maxIterations: 1, waitTime: 0 })
        expect(yield* mailbox.approximateCount).toBe(0)
      })
  },
  {
    label: "MailboxWorker.runScoped",
    fields: [
      "shutdownTimeout",
      "run",
      "run.visibilityTimeout",
      "run.waitTime",
      "run.maxIterations",
      "run.maxMessages"
    ],
    use: (options) =>
      Effect.gen(function*() {
        const loop = yield* idleLoop
        yield* MailboxWorker.runScoped(loop, as(options))
      })
  },
  {
    label: "MainLoop.make",
    fields: [
      "config.timeout",
      "config.leaseExtender.extension",
      "config.leaseExtender.interval",
      "config",
      "config.leaseExtender",
      "config.workerId",
      "config.budget",
      "config.deadLetters",
      "name"
    ],
    use: (options) =>
      Effect.gen(function*() {
        const { requests, resolver, responses } = yield* mainLoopSetup
        const loop = yield* MainLoop.make({ requests, execute: Effect.succeed, ...as<object>(options) }).pipe(
          Effect.provideService(MailboxResolver, resolver)
        )
        yield* loop.run({ maxIterations: 1, waitTime: 0 }).pipe(Effect.provideService(MailboxResolver, resolver))
        const [reply] = yield* responses.receive()
        expect(reply?.body.output).toBe("hello")
      })
  },
  {
    label: "MainLoop.layer",
    fields: ["shutdownTimeout", "run", "run.waitTime", "run.visibilityTimeout", "config.timeout"],
    use: (options) =>
      Effect.gen(function*() {
        const { requests, resolver } = yield* mainLoopSetup
        yield* Layer.build(MainLoop.layer({ requests, execute: Effect.succeed, ...as<object>(options) })).pipe(
          Effect.provideService(MailboxResolver, resolver)
        )
      })
  },
  {
    label: "EvalLoop.make",
    fields: ["config.timeout", "config.leaseExtender.extension", "config.leaseExtender", "config"],
    use: (options) =>
      Effect.gen(function*() {
        const requests = yield* MailboxMemory.make<EvalLoop.EvalRequest<string, string>, EvalLoop.EvalResult>({
          name: fresh("samples")
        })
        const loop = yield* EvalLoop.make({
          requests,
          execute: Effect.succeed,
          evaluator: Evaluator.exactMatch,
          ...as<object>(options)
        }).pipe(Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests)))
        expect(yield* loop.running).toBe(false)
      })
  },
  {
    label: "Health.layerRegistry",
    fields: ["staleAfter"],
    use: (options) =>
      Effect.gen(function*() {
        const context = yield* Layer.build(Health.layerRegistry(as(options)))
        expect((yield* Context.get(context, Health.Health).readiness).ready).toBe(true)
      })
  },
  {
    label: "LoopGroup.make",
    fields: ["shutdownTimeout", "watchdog.threshold", "watchdog.interval", "watchdog", "supervision"],
    use: (options) =>
      Effect.gen(function*() {
        yield* keepProcess
        const loop = yield* idleLoop
        const group = LoopGroup.make([loop], as(options))
        const running = yield* Effect.fork(group.run({ waitTime: "1 second" }))
        // Started (or refused) before it is asked to stop: a stop before the start would stop nothing.
        yield* Effect.repeat(
          Effect.zipWith(Fiber.poll(running), loop.running, (done, started) => Option.isSome(done) || started),
          { until: (ready) => ready, schedule: Schedule.spaced("1 millis") }
        )
        yield* group.shutdown()
        yield* Fiber.join(running)
      })
  },
  {
    label: "ShutdownCoordinator.layer",
    fields: ["signals"],
    junkFor: {
      signals: fc.oneof(
        fc.array(
          fc.constantFrom(
            "SIGTERM",
            "SIGINT",
            "SIGHUP",
            "SIGUSR2",
            "SIGKILL",
            "SIGSTOP",
            "SIGSEGV",
            "SIGFOO",
            "exit",
            ""
          ),
          {
            maxLength: 3
          }
        ),
        junk
      )
    },
    use: (options) =>
      Effect.gen(function*() {
        const context = yield* Layer.build(ShutdownCoordinator.layer(as(options)))
        expect(yield* Context.get(context, ShutdownCoordinator.ShutdownCoordinator).triggered).toBe(false)
      })
  },
  {
    label: "DeadLetter.policy",
    fields: ["maxDeliveryCount", "includeErrors", "excludeErrors"],
    use: (options) =>
      Effect.gen(function*() {
        const policy = yield* DeadLetter.policy(as(options))
        expect(["retry", "dead-letter"]).toContain(DeadLetter.decide(policy, 1, "Failure"))
      })
  },
  {
    label: "Budget.make",
    fields: ["maxTotalTokens", "maxInputTokens", "maxOutputTokens", "deadline"],
    use: (options) =>
      Effect.gen(function*() {
        const budget = yield* Budget.make(as(options))
        yield* Budget.makeTracker(budget)
      })
  },
  {
    label: "Deadline.after",
    fields: ["duration"],
    use: (options) => Deadline.after(as<{ duration: Duration.DurationInput }>(options).duration),
    // An operation's argument: its refusal is InvalidDeadlineError.
    alsoAccepts: (error) => Schema.is(Deadline.InvalidDeadlineError)(error)
  },
  {
    label: "Database.layerSqlite",
    fields: ["busyTimeout", "keepJournalMode"],
    base: { filename: join(directory, "database.db") },
    use: (options) =>
      Effect.gen(function*() {
        const context = yield* Layer.build(Database.layerSqlite(as(options)))
        const client = Context.get(context, SqlClient.SqlClient)
        expect(yield* client`SELECT 1 AS one`).toEqual([{ one: 1 }])
      })
  },
  {
    label: "ScriptedAdapter.make (InnerLoop.makeAdapter, EffectAi.make)",
    fields: ["maxTurns", "retry", "beatInterval"],
    use: (options) =>
      Effect.gen(function*() {
        const adapter = yield* ScriptedAdapter.make([{ text: "done" }], as(options))
        const session = yield* Session.make
        const response = yield* adapter.evaluate(Prompt.make({ name: "p", instructions: "", input: "hi" }), { session })
        expect(response.output).toBe("done")
      })
  },
  {
    label: "Anthropic.make",
    fields: ["maxTokens", "maxTurns", "apiUrl", "model", "apiKey", "retry", "stream", "beatInterval"],
    base: { model: "claude-stub", apiKey: Redacted.make("key"), apiUrl: "http://127.0.0.1:9" },
    use: (options) =>
      Effect.gen(function*() {
        const adapter = yield* Anthropic.make(as(options))
        expect(typeof adapter.name).toBe("string")
      }).pipe(Effect.provide(FetchHttpClient.layer))
  }
]

describe("options that cannot work are refused at construction", () => {
  for (const c of cases) property(c)
})

describe("a scripted model's turns", () => {
  it.effect("a latency that cannot be slept is a ParseError naming the turn, not a defect at evaluate", () =>
    Effect.gen(function*() {
      for (const latency of [Number.NaN, -1, Number.POSITIVE_INFINITY, "soon", [Number.NaN, 0], "25 hours"]) {
        const error = yield* Effect.flip(
          ScriptedAdapter.make([{ text: "a" }, { text: "b", latency: latency as Duration.DurationInput }])
        )
        expect(refusedOptions(error)).toEqual(["turns.1.latency"])
      }
      yield* ScriptedAdapter.make([{ text: "a", latency: "1 second" }])
    }))
})
