/**
 * The `leasehold` command line. Exit codes: 0 done, 1 the work failed (a
 * database that cannot be reached, a queue or dead letter that is not there —
 * the message names the fix), 2 bad arguments (the usage is printed; a
 * destructive command without `--yes` says what it would touch), 3 `status`
 * found a schema that is not current (run `leasehold migrate`). Help pages
 * are rendered by cli/help.ts; nothing it prints carries ANSI colour unless
 * the stream is a terminal and `NO_COLOR` is unset. `leasehold demo-worker
 * FILE NAME` is the demo's worker process (started by `leasehold demo`, not
 * listed).
 */
import * as Command from "@effect/cli/Command"
import * as ValidationError from "@effect/cli/ValidationError"
import * as NodeContext from "@effect/platform-node/NodeContext"
import * as Cause from "effect/Cause"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Option from "effect/Option"
import * as ParseResult from "effect/ParseResult"
import * as operatorConsole from "../cli/console.js"
import { InvalidDatabaseError, MissingDatabaseError } from "../cli/database.js"
import * as demo from "../cli/demo.js"
import * as health from "../cli/health.js"
import * as Help from "../cli/help.js"
import * as mailbox from "../cli/mailbox.js"
import * as migrate from "../cli/migrate.js"
import { warn } from "../cli/output.js"
import * as prune from "../cli/prune.js"
import * as queue from "../cli/queue.js"
import * as workers from "../cli/workers.js"
import { InvalidParameterError } from "../Errors.js"
import * as Target from "../internal/sql/target.js"
import { version } from "../internal/version.js"

const root = Command.make("leasehold").pipe(
  Command.withDescription(
    "Operate leasehold workers: schema migrations, merge queues, mailboxes, retention, health, the worker\n" +
      "processes and a browser console, on SQLite or PostgreSQL.\n" +
      "Example: leasehold queue status --db ./.leasehold/demo.db"
  ),
  Command.withSubcommands([
    demo.command,
    queue.command,
    mailbox.command,
    prune.command,
    health.command,
    workers.command,
    operatorConsole.command,
    migrate.migrateCommand,
    migrate.statusCommand
  ])
)

const cli = Command.run(root, { name: "leasehold", version })

/** The console, without ANSI codes on a stream that is not a terminal or when `NO_COLOR` is set. */
const plainWhereNeeded = Effect.consoleWith((console) => {
  const plain = (stream: NodeJS.WriteStream, write: (...args: ReadonlyArray<unknown>) => Effect.Effect<void>) =>
    Help.colorFor(stream)
      ? write
      : (...args: ReadonlyArray<unknown>) =>
        write(...args.map((arg) => typeof arg === "string" ? Help.stripAnsi(arg) : arg))
  return Effect.succeed<Console.Console>({
    ...console,
    log: plain(process.stdout, console.log),
    info: plain(process.stdout, console.info),
    error: plain(process.stderr, console.error),
    warn: plain(process.stderr, console.warn)
  })
})

// Logs go to stderr: stdout is the command's output (`--json` included), which scripts parse.
const program = Effect.gen(function*() {
  const args = process.argv.slice(2)
  const help = yield* Help.requested(root, args, Help.styleFor(process.stdout), version)
  return yield* Option.match(help, { onNone: () => cli(process.argv), onSome: (page) => Console.log(page) })
}).pipe(
  (run) => Effect.flatMap(plainWhereNeeded, (console) => Effect.withConsole(run, console)),
  Effect.provide([
    NodeContext.layer,
    Logger.replace(Logger.defaultLogger, Logger.withConsoleError(Logger.logfmtLogger))
  ]),
  Logger.withMinimumLogLevel(LogLevel.Warning)
)

/** The targets this run was given (`--db`, `--url`, the database URL variables): what may hold a password. */
const targets = (argv: ReadonlyArray<string>): ReadonlyArray<string> => [
  ...argv.flatMap((arg, i) =>
    arg === "--db" || arg === "--url"
      ? argv.slice(i + 1, i + 2)
      : arg.startsWith("--db=") || arg.startsWith("--url=")
      ? [arg.slice(arg.indexOf("=") + 1)]
      : []
  ),
  ...[process.env.LEASEHOLD_DATABASE_URL, process.env.DATABASE_URL].filter((value) => value !== undefined)
]

/**
 * An error's text without any password of this run's targets: every message that names a database already
 * redacts it, and this catches a message that quotes a target some other way (a driver's, a URL's).
 */
const scrubbed = (text: string) => targets(process.argv).reduce((shown, target) => Target.scrub(shown, target), text)

const runCli = () =>
  Effect.runPromiseExit(program).then((exit) => {
    if (Exit.isSuccess(exit)) return
    const failure = Cause.failureOption(exit.cause)
    if (failure._tag === "Some" && ValidationError.isValidationError(failure.value)) {
      // @effect/cli has printed what was wrong and the usage.
      process.exitCode = ValidationError.isHelpRequested(failure.value) ? 0 : 2
      return
    }
    const error = failure._tag === "Some" ? failure.value : Cause.squash(exit.cause)
    // Bad arguments: an option out of range (InvalidParameterError), or configuration a constructor refused
    // (a ParseError: a --prefix that breaks the prefix rule, say).
    const usage = error instanceof MissingDatabaseError || error instanceof InvalidDatabaseError ||
      error instanceof demo.DemoArgumentError ||
      error instanceof mailbox.ConfirmationRequiredError || error instanceof mailbox.AmbiguousJournalIdError ||
      error instanceof InvalidParameterError ||
      ParseResult.isParseError(error)
    return Effect.runPromise(
      // An error's message may quote what another party stored (a queue name, a request id): the one printer.
      warn(`leasehold: ${scrubbed(error instanceof Error ? error.message : String(error))}`)
    )
      .then(
        () => {
          process.exitCode = usage ? 2 : 1
        }
      )
  })

if (process.argv[2] === "demo-worker") {
  void import("../demo/worker.js").then((worker) => worker.main(process.argv.slice(3)))
} else {
  void runCli()
}
