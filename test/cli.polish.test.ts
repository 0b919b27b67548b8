/**
 * The command line's rough edges (issue 35, finding 8), each run as a child process (src/bin/leasehold.ts
 * bundled) against a real SQLite file and a throwaway PostgreSQL: what acts on everything needs `--yes` and says
 * how many rows it would touch (exit 2); `dlq delete`; a queue or dead letter that is not there exits 1 naming
 * it; targets and URLs that name nothing it opens are usage errors (exit 2); help pages fit 100 columns, carry
 * no ANSI colour unless on a terminal without NO_COLOR, and name each command by its whole path; the dead-letter
 * table shows an error's cause first.
 */
import { SqlClient } from "@effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Logger, LogLevel, Schema, Scope } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { causeOf } from "../src/cli/errorText.js"
import * as MailboxSql from "../src/MailboxSql.js"
import { bundle } from "./helpers.js"
import * as Postgres from "./support/postgres.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-cli-polish-"))
const sqliteFile = join(directory, "mailbox.db")

interface Run {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/** Runs `command args` (the CLI, or `script` giving it a terminal); resolves with its exit code and output. */
const execute = (command: string, args: ReadonlyArray<string>, env: Record<string, string | undefined> = {}) =>
  Effect.async<Run>((resume) => {
    const child = execFile(
      command,
      args,
      { timeout: 60_000, env: { ...process.env, LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "", ...env } },
      (error, stdout, stderr) =>
        resume(Effect.succeed({ code: error === null ? 0 : Number(error.code ?? 1), stdout, stderr }))
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** Runs the CLI with stdout and stderr piped, NO_COLOR unset. */
const leasehold = (...args: ReadonlyArray<string>) =>
  execute("node", [bundle("src/bin/leasehold.ts"), ...args], { NO_COLOR: undefined })

/** Runs the CLI on a terminal (util-linux `script`), with `env`; its output as the terminal showed it. */
const onTerminal = (args: ReadonlyArray<string>, env: Record<string, string | undefined>) =>
  execute(
    "script",
    ["-qec", ["node", bundle("src/bin/leasehold.ts"), ...args].map((arg) => `'${arg}'`).join(" "), "/dev/null"],
    env
  )

/** A task schema whose type dump is long: a decode error names the failing field only at its end. */
const Task = Schema.Struct({
  id: Schema.String,
  task: Schema.String,
  owner: Schema.String,
  attempt: Schema.Number,
  tags: Schema.Array(Schema.String),
  deadline: Schema.String
})
const task = (id: string) => ({ id, task: "summarise", owner: "ops", attempt: 1, tags: ["a"], deadline: "soon" })

/**
 * Under `prefix`: queue "jobs" with one message in flight and two dead letters whose body no longer decodes
 * (`task` is 1), queue "other" with one dead letter. Resolves with the dead letters' ids, by queue.
 */
const seed = (layer: Layer.Layer<MailboxSql.Services, unknown>, prefix: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const messages = sql(`${prefix}mailbox_messages`)
    const jobs = yield* MailboxSql.make({ name: "jobs", schema: Task, prefix })
    const broken = [yield* jobs.send(task("a")), yield* jobs.send(task("b"))]
    yield* jobs.send(task("c"))
    for (const id of broken) {
      yield* sql`UPDATE ${messages} SET body = ${JSON.stringify({ ...task(id), task: 1 })} WHERE seq = ${Number(id)}`
    }
    const received = yield* jobs.receive({ maxMessages: 10, visibilityTimeout: "10 minutes" })
    expect(received.map((message) => message.body.id)).toEqual(["c"])
    const other = yield* MailboxSql.make({ name: "other", schema: Schema.Struct({ n: Schema.Number }), prefix })
    const third = yield* other.send({ n: 1 })
    yield* sql`UPDATE ${messages} SET body = ${"{\"n\":\"x\"}"} WHERE seq = ${Number(third)}`
    expect(yield* other.receive({ maxMessages: 10 })).toEqual([])
    return { jobs: broken.map(String), other: String(third) }
  }).pipe(Effect.scoped, Effect.provide(layer), Logger.withMinimumLogLevel(LogLevel.Error))

const suiteScope = Effect.runSync(Scope.make())
let pgUrl = ""
beforeAll(async () => {
  pgUrl = (await Effect.runPromise(Scope.extend(Postgres.cluster, suiteScope))).url
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(suiteScope, Exit.void)))

let prefixes = 0
const backends = [
  ["SQLite", () => sqliteFile, () => MailboxSql.layerSqlite({ filename: sqliteFile })],
  ["PostgreSQL", () => pgUrl, () => MailboxSql.layerPg({ url: pgUrl })]
] as const

for (const [backend, target, layer] of backends) {
  describe(`leasehold mailbox on ${backend}`, () => {
    /** A fresh seed under a prefix of its own: the commands' common arguments and the dead letters' ids. */
    const fresh = Effect.suspend(() => {
      const prefix = `polish${++prefixes}_`
      return Effect.map(seed(layer(), prefix), (ids) => ({ ids, db: ["--db", target(), "--prefix", prefix] }))
    })

    it.live(
      "dlq redrive without --queue or --id needs --yes, says how many, and moves nothing without it",
      () =>
        Effect.gen(function*() {
          const { db } = yield* fresh
          const refused = yield* leasehold("mailbox", "dlq", "redrive", ...db)
          expect(refused.code).toBe(2)
          expect(refused.stderr).toContain("redrive would redrive 3 dead letters of every queue; add --yes")
          const still = yield* leasehold("mailbox", "dlq", "list", ...db, "--json")
          expect(JSON.parse(still.stdout)).toHaveLength(3)
          // A filter is its own confirmation.
          const one = yield* leasehold("mailbox", "dlq", "redrive", ...db, "--queue", "other", "--json")
          expect(one.code).toBe(0)
          expect(JSON.parse(one.stdout)).toEqual({ redriven: 1 })
          const all = yield* leasehold("mailbox", "dlq", "redrive", ...db, "--yes")
          expect(all.code).toBe(0)
          expect(all.stdout).toContain("moved 2 dead letters back to their source queue")
          const stats = yield* leasehold("mailbox", "stats", ...db, "--json")
          expect(JSON.parse(stats.stdout)).toMatchObject([
            { queue: "jobs", queued: 2, inFlight: 1, deadLetters: 0 },
            { queue: "other", queued: 1, deadLetters: 0 }
          ])
        }),
      60_000
    )

    it.live(
      "dlq delete: by --id at once; all of a queue, or of every queue, only with --yes",
      () =>
        Effect.gen(function*() {
          const { db, ids } = yield* fresh
          const byId = yield* leasehold("mailbox", "dlq", "delete", ...db, "--id", ids.jobs[0]!, "--json")
          expect(byId.code).toBe(0)
          expect(JSON.parse(byId.stdout)).toEqual({ deleted: 1 })
          const queueRefused = yield* leasehold("mailbox", "dlq", "delete", ...db, "--queue", "jobs")
          expect(queueRefused.code).toBe(2)
          expect(queueRefused.stderr).toContain("delete would delete 1 dead letter of \"jobs\"; add --yes")
          const allRefused = yield* leasehold("mailbox", "dlq", "delete", ...db)
          expect(allRefused.code).toBe(2)
          expect(allRefused.stderr).toContain("delete would delete 2 dead letters of every queue; add --yes")
          const queue = yield* leasehold("mailbox", "dlq", "delete", ...db, "--queue", "jobs", "--yes")
          expect(queue.code).toBe(0)
          expect(queue.stdout).toContain("deleted 1 dead letter")
          const rest = yield* leasehold("mailbox", "dlq", "delete", ...db, "--yes", "--json")
          expect(JSON.parse(rest.stdout)).toEqual({ deleted: 1 })
          const empty = yield* leasehold("mailbox", "dlq", "list", ...db)
          expect(empty.stdout).toContain("no dead letters")
          // The message in flight was not touched.
          const stats = yield* leasehold("mailbox", "stats", ...db, "--json")
          expect(JSON.parse(stats.stdout)).toMatchObject([{ queue: "jobs", inFlight: 1, deadLetters: 0 }])
        }),
      60_000
    )

    it.live(
      "a queue or dead letter that is not there exits 1 naming it, and changes nothing",
      () =>
        Effect.gen(function*() {
          const { db, ids } = yield* fresh
          for (
            const [args, message] of [
              [["peek", "nosuchqueue"], "no queue \"nosuchqueue\""],
              [["purge", "nosuch", "--yes"], "no queue \"nosuch\""],
              [["purge", "nosuch"], "no queue \"nosuch\""],
              [["dlq", "list", "--queue", "nosuch"], "no queue \"nosuch\""],
              [["dlq", "redrive", "--queue", "nosuch"], "no queue \"nosuch\""],
              [["dlq", "delete", "--queue", "nosuch", "--yes"], "no queue \"nosuch\""],
              [["dlq", "redrive", "--id", "999"], "no dead letter with id 999"],
              [["dlq", "delete", "--id", "999"], "no dead letter with id 999"],
              // An id that is there, but not from that queue.
              [
                ["dlq", "redrive", "--id", ids.other, "--queue", "jobs"],
                `no dead letter with id ${ids.other} from "jobs"`
              ]
            ] as const
          ) {
            const run = yield* leasehold("mailbox", ...args, ...db)
            expect(run.code, args.join(" ")).toBe(1)
            expect(run.stderr, args.join(" ")).toContain(message)
          }
          const missing = yield* leasehold("mailbox", "peek", "nosuchqueue", ...db)
          expect(missing.stderr).toContain("its queues: \"jobs\", \"other\"")
          // Some ids there, some not: those there are acted on, the rest named, exit 1.
          const partly = yield* leasehold(
            "mailbox",
            "dlq",
            "redrive",
            ...db,
            "--id",
            ids.jobs[0]!,
            "--id",
            "999",
            "--json"
          )
          expect(partly.code).toBe(1)
          expect(JSON.parse(partly.stdout)).toEqual({ redriven: 1, notFound: ["999"] })
          expect(partly.stderr).toContain("no dead letter with id 999")
          const stats = yield* leasehold("mailbox", "stats", ...db, "--json")
          expect(JSON.parse(stats.stdout)).toMatchObject([
            { queue: "jobs", queued: 1, inFlight: 1, deadLetters: 1 },
            { queue: "other", queued: 0, deadLetters: 1 }
          ])
          // A queue that holds only dead letters is there: peek says it has no messages, exit 0.
          const onlyLetters = yield* leasehold("mailbox", "peek", "other", ...db)
          expect(onlyLetters.code).toBe(0)
          expect(onlyLetters.stdout).toContain("no messages in other (only dead letters)")
        }),
      60_000
    )

    it.live("dlq list shows an error's cause first, whole; --json keeps the whole error", () =>
      Effect.gen(function*() {
        const { db } = yield* fresh
        const list = yield* leasehold("mailbox", "dlq", "list", ...db, "--queue", "jobs")
        expect(list.code).toBe(0)
        const rows = list.stdout.trim().split("\n").slice(2)
        expect(rows).toHaveLength(2)
        for (const row of rows) expect(row).toMatch(/SerializationError: \["task"\] Expected string, actual 1$/)
        const json = yield* leasehold("mailbox", "dlq", "list", ...db, "--json")
        const letters = JSON.parse(json.stdout) as Array<{ queue: string; error: string; cause: string }>
        const jobs = letters.find((letter) => letter.queue === "jobs")!
        // The whole error: the type dump first, the cause last.
        expect(jobs.error).toContain("readonly deadline: string")
        expect(jobs.error.trimEnd()).toMatch(/Expected string, actual 1$/)
        expect(jobs.cause).toBe("[\"task\"] Expected string, actual 1")
        expect(letters.find((letter) => letter.queue === "other")!.cause).toBe("[\"n\"] Expected number, actual \"x\"")
      }), 60_000)
  })
}

describe("leasehold's targets", () => {
  it.live(
    "health --url that is not an http(s) URL is a usage error (exit 2) naming the option",
    () =>
      Effect.gen(function*() {
        for (const url of ["notaurl", "127.0.0.1:9464", "ftp://me:hunter22@host/"]) {
          const run = yield* leasehold("health", "--url", url)
          expect(run.code, url).toBe(2)
          expect(run.stderr, url).toContain("Invalid --url")
          expect(run.stderr, url).toContain("must be an http:// or https:// URL")
          expect(run.stderr, url).not.toContain("hunter22")
        }
      }),
    60_000
  )

  it.live(
    "a mysql:// or malformed --db is named as such for every command (exit 2), never 'no such file'",
    () =>
      Effect.gen(function*() {
        for (
          const args of [["queue", "status"], ["mailbox", "dlq", "delete", "--id", "1"], ["mailbox", "purge", "q"], [
            "console"
          ]]
        ) {
          for (
            const [target, reason] of [
              ["mysql://root:hunter22@127.0.0.1/app", "unsupported scheme \"mysql:\""],
              ["postgres://me:hunter22@127.0.0.1:port/app", "not a valid URL"],
              // No file by that name, and a URL that lost its colon.
              ["postgres//me:hunter22@127.0.0.1/app", "no file by that name, and not a URL leasehold takes"]
            ] as const
          ) {
            const run = yield* leasehold(...args, "--db", target)
            expect(run.code, `${args.join(" ")} ${target}`).toBe(2)
            expect(run.stderr, target).toContain(reason)
            expect(run.stderr, target).not.toContain("no such file")
            expect(run.stderr, target).not.toContain("hunter22")
          }
        }
      }),
    60_000
  )
})

/** Every command's words, read from the root's help page (`leasehold` first). */
const commandsOf = (rootHelp: string): Array<Array<string>> => [
  ["leasehold"],
  ...rootHelp.split("\n").flatMap((line) => {
    const match = /^ {2}(leasehold(?: [a-z-]+)+)(?: {2,}|$)/.exec(line)
    return match === null ? [] : [match[1]!.split(" ")]
  })
]

describe("leasehold's help", () => {
  it.live(
    "every command's page, piped: no ANSI, lines of at most 100 columns, a usage naming the whole command",
    () =>
      Effect.gen(function*() {
        const root = yield* leasehold("--help")
        expect(root.code).toBe(0)
        const commands = commandsOf(root.stdout)
        expect(commands.map((words) => words.join(" "))).toEqual(expect.arrayContaining([
          "leasehold queue list",
          "leasehold mailbox dlq list",
          "leasehold mailbox dlq redrive",
          "leasehold mailbox dlq delete",
          "leasehold console"
        ]))
        expect(root.stdout).not.toContain("mailbox mailbox")
        for (const words of commands) {
          const page = yield* leasehold(...words.slice(1), "--help")
          const name = words.join(" ")
          expect(page.code, name).toBe(0)
          expect(page.stdout, name).not.toContain("\u001b")
          for (const line of page.stdout.split("\n")) expect(line.length, `${name}: ${line}`).toBeLessThanOrEqual(100)
          const usage = page.stdout.split("\n")[page.stdout.split("\n").indexOf("USAGE") + 1]!
          expect(usage, name).toMatch(new RegExp(`^  ${name}( |$)`))
        }
        // A group with no subcommand shows its page too.
        const group = yield* leasehold("mailbox", "dlq")
        expect(group.code).toBe(0)
        expect(group.stdout).toContain("  leasehold mailbox dlq <command>")
        expect(group.stdout).toMatch(/^ {2}leasehold mailbox dlq delete +Deletes dead letters/m)
      }),
    120_000
  )

  it.live("options that may be left out or repeated look optional in the usage", () =>
    Effect.gen(function*() {
      const usage = (run: Run) => run.stdout.slice(run.stdout.indexOf("USAGE"), run.stdout.indexOf("DESCRIPTION"))
      const redrive = usage(yield* leasehold("mailbox", "dlq", "redrive", "--help"))
      expect(redrive).toContain("[--id text...]")
      expect(redrive).toContain("[--queue text]")
      expect(redrive).toContain("[--yes]")
      expect(usage(yield* leasehold("console", "--help"))).toContain("[--allow-host text...]")
      expect(usage(yield* leasehold("queue", "list", "--help"))).toMatch(/\[--status pending \| claimed/)
      // Still repeatable.
      const list = yield* leasehold("queue", "list", "--status", "pending", "--status", "merged", "--db", "x.db")
      expect(list.stderr).toContain("no such file")
    }), 60_000)

  it.live("colour only on a terminal without NO_COLOR; errors piped carry none either", () =>
    Effect.gen(function*() {
      const colored = yield* onTerminal(["mailbox", "--help"], { NO_COLOR: undefined })
      expect(colored.code).toBe(0)
      expect(colored.stdout).toContain("\u001b[1mUSAGE\u001b[0m")
      const noColor = yield* onTerminal(["mailbox", "--help"], { NO_COLOR: "1" })
      expect(noColor.stdout).toContain("USAGE")
      expect(noColor.stdout).not.toContain("\u001b")
      const error = yield* leasehold("queue", "list", "--status", "shipped")
      expect(error.code).toBe(2)
      expect(error.stdout + error.stderr).not.toContain("\u001b")
    }), 60_000)
})

describe("causeOf", () => {
  it("puts each innermost line of a schema error after its path; any other error's first line", () => {
    const tree = [
      "Cannot read: (parseJson <-> { readonly a: string; readonly b: { readonly c: ReadonlyArray<number> } })",
      "└─ Type side transformation failure",
      "   └─ { readonly a: string; readonly b: { readonly c: ReadonlyArray<number> } }",
      "      ├─ [\"a\"]",
      "      │  └─ Expected string, actual 1",
      "      └─ [\"b\"]",
      "         └─ { readonly c: ReadonlyArray<number> }",
      "            └─ [\"c\"]",
      "               └─ ReadonlyArray<number>",
      "                  └─ [0]",
      "                     └─ Expected number, actual \"x\""
    ].join("\n")
    expect(causeOf(tree)).toBe("[\"a\"] Expected string, actual 1; [\"b\"][\"c\"][0] Expected number, actual \"x\"")
    expect(causeOf("Error: boom\n    at somewhere")).toBe("Error: boom")
  })
})
