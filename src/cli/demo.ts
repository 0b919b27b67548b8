/** `leasehold demo`: the tour of every capability on a SQLite file (see src/demo/Demo.ts). */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as DemoModule from "../demo/Demo.js"
import * as Faults from "../demo/faults.js"

const size = Options.integer("size").pipe(
  Options.withDescription("How many requests to enqueue (10 … 5000)."),
  Options.withDefault(200)
)
const workers = Options.integer("workers").pipe(
  Options.withDescription(
    "Worker processes to start (2 … 8; one is killed part way when --size is at least 8 per worker)."
  ),
  Options.withDefault(3)
)
const workMs = Options.integer("work-ms").pipe(
  Options.withDescription("How long each request's tool works, in milliseconds (lower is faster)."),
  Options.withDefault(150)
)
const dir = Options.text("dir").pipe(
  Options.withDescription("Where the demo's SQLite file goes (recreated on every run)."),
  Options.withDefault("./.leasehold")
)
const json = Options.boolean("json").pipe(
  Options.withDescription("Print the summary as JSON on stdout (progress goes to stderr).")
)

/** A number option outside its range: reported like any other bad argument. */
export class DemoArgumentError extends Error {
  readonly _tag = "DemoArgumentError"
}

export const command = Command.make("demo", { size, workers, workMs, dir, json }, (options) =>
  Effect.gen(function*() {
    const checks: Array<[string, number, number, number]> = [
      ["--size", options.size, 10, 5000],
      ["--workers", options.workers, 2, 8],
      ["--work-ms", options.workMs, 1, 60_000]
    ]
    for (const [flag, value, min, max] of checks) {
      if (value < min || value > max) {
        return yield* Effect.fail(new DemoArgumentError(`${flag} must be between ${min} and ${max}, got ${value}`))
      }
    }
    // Test-only, hidden: faults the demo's tests inject to show its accounting catches them (see demo/faults.ts).
    const faults = Faults.parse(process.env[Faults.variable])
    if (Either.isLeft(faults)) return yield* Effect.fail(new DemoArgumentError(faults.left))
    // Loaded when the demo runs, so that `--help` does not load it.
    const Demo: typeof DemoModule = yield* Effect.promise(() => import("../demo/Demo.js"))
    const summary = yield* Demo.run({
      size: options.size,
      workers: options.workers,
      workMs: options.workMs,
      dir: options.dir,
      faults: faults.right,
      live: !options.json && process.stderr.isTTY === true,
      print: (line) => void (options.json ? process.stderr : process.stdout).write(line + "\n")
    }).pipe(Effect.scoped)
    // How to look inside what the demo left: from a checkout (`npm start`) through the script, else the bin.
    const consoleCommand = `${
      process.env.npm_lifecycle_event === "start" ? "npm run leasehold --" : "npx leasehold"
    } console --db ${summary.database}`
    if (options.json) {
      yield* Console.log(
        JSON.stringify(
          {
            ...summary,
            killed: Option.getOrNull(summary.killed),
            notKilled: Option.getOrNull(summary.notKilled),
            consoleCommand
          },
          null,
          2
        )
      )
    } else {
      yield* Console.log(`\n${Demo.format(summary)}\n\nLook inside in a browser: ${consoleCommand}`)
    }
    // Lost, doubly-settled or unknown ids fail the run (exit 1); a duplicate reply is at-least-once, reported only.
    if (!summary.accountedFor) return yield* Effect.fail(new Error(summary.proved))
  })).pipe(
    Command.withDescription(
      "Runs every capability on a SQLite file: worker processes answer requests while one is killed, a deadline " +
        "stops a slow request, a work lease keeps order, a merge queue heals a crash. Ctrl-C drains and reports.\n" +
        "Every request id is matched to its reply or dead letter: exit 1 if one is lost or settled twice.\n" +
        "Example: leasehold demo --size 100 --json"
    )
  )
