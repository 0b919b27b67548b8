/** Test helpers shared by several test files. */
import { SqlClient } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Clock, Effect, Logger, type LogLevel, ParseResult, TestClock } from "effect"
import { buildSync } from "esbuild"
import { execFile, execFileSync, spawn } from "node:child_process"
import { basename, join } from "node:path"

/** A logger that records level and message, and the layer that installs it. */
export const captureLogs = () => {
  const lines: Array<{ readonly level: LogLevel.LogLevel["label"]; readonly message: string }> = []
  const logger = Logger.make(({ logLevel, message }) => {
    lines.push({ level: logLevel.label, message: Array.isArray(message) ? message.join(" ") : String(message) })
  })
  return { lines, layer: Logger.replace(Logger.defaultLogger, logger) }
}

/** Runs a TypeScript file with tsx in a child process; resolves with its exit code and output. */
export const runTsx = (file: string, args: ReadonlyArray<string> = [], timeoutMs = 60_000) =>
  Effect.async<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      "node",
      ["--conditions=leasehold-source", "--import", "tsx", file, ...args],
      { timeout: timeoutMs, env: { ...process.env, NO_COLOR: "1" } },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : null
        resume(Effect.succeed({ code, stdout, stderr }))
      }
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** A child process running a TypeScript file, with its output collected as it comes. */
export interface Child {
  readonly pid: number
  readonly output: () => string
  /** Resolves once the output matches `pattern` (fails after `timeoutMs`). */
  readonly waitFor: (pattern: RegExp, timeoutMs?: number) => Effect.Effect<void>
  readonly signal: (signal: NodeJS.Signals) => Effect.Effect<void>
  /** Resolves when the process exits, with its code (null if a signal ended it) and signal. */
  readonly exited: Effect.Effect<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

/** Spawns `node --import tsx file args`, killed when the scope closes if still running. */
export const spawnTsx = (file: string, args: ReadonlyArray<string> = []) =>
  spawnNode(["--conditions=leasehold-source", "--import", "tsx", file, ...args])

const bundles = new Map<string, string>()

/**
 * Bundles a TypeScript file into one ES module (once per test run), so a
 * process starts in ~0.4 s instead of tsx's ~2.4 s: for tests that start
 * many processes (crash tests restart killed workers).
 */
export const bundle = (file: string): string => {
  let out = bundles.get(file)
  if (out === undefined) {
    out = join("node_modules", ".cache", "leasehold-tests", `${basename(file, ".ts")}-${process.pid}.mjs`)
    buildSync({
      entryPoints: [file],
      bundle: true,
      platform: "node",
      format: "esm",
      outfile: out,
      external: ["better-sqlite3", "pg-native"],
      conditions: ["leasehold-source"],
      logLevel: "warning",
      // Bundled CommonJS dependencies call `require`.
      banner: { js: "import { createRequire } from 'node:module'; const require = createRequire(import.meta.url);" }
    })
    bundles.set(file, out)
  }
  return out
}

let commandLineBuilt: string | undefined

/**
 * The `leasehold` command line as the package ships it (scripts/build-cli.mjs: one CommonJS bundle run by the
 * code-cache launcher), built once per test process; run it with `node`.
 */
export const commandLine = (): string => {
  if (commandLineBuilt === undefined) {
    const out = join("node_modules", ".cache", "leasehold-tests", `cli-${process.pid}`)
    execFileSync("node", ["scripts/build-cli.mjs", out])
    commandLineBuilt = join(out, "leasehold.cjs")
  }
  return commandLineBuilt
}

/** Spawns `node bundle(file) args`, killed when the scope closes if still running. */
export const spawnBundled = (file: string, args: ReadonlyArray<string> = []) => spawnNode([bundle(file), ...args])

const spawnNode = (argv: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.sync((): Child => {
      const child = spawn("node", argv, {
        env: { ...process.env, NO_COLOR: "1" },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout.on("data", (chunk) => (output += chunk))
      child.stderr.on("data", (chunk) => (output += chunk))
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
        child.on("exit", (code, signal) => resolve({ code, signal }))
      )
      return {
        pid: child.pid!,
        output: () => output,
        waitFor: (pattern, timeoutMs = 30_000) =>
          Effect.promise(() =>
            new Promise<void>((resolve, reject) => {
              const started = performance.now()
              const check = () => {
                if (pattern.test(output)) return resolve()
                if (performance.now() - started > timeoutMs || child.exitCode !== null) {
                  return reject(new Error(`timed out waiting for ${pattern}; output so far:\n${output}`))
                }
                setTimeout(check, 20)
              }
              check()
            })
          ),
        signal: (signal) => Effect.sync(() => void child.kill(signal)),
        exited: Effect.promise(() => exited)
      }
    }),
    // Already gone is the usual case: then kill fails and that is fine.
    (child) => Effect.ignore(Effect.try(() => process.kill(child.pid, "SIGKILL")))
  )

/**
 * The test's `TestClock` with a wall clock that can jump (NTP stepping it, a VM resumed) while the monotonic
 * clock (`currentTimeNanos`) and sleeps run as they did. Provide it with `Effect.withClock(clock)`;
 * `TestClock.adjust` still drives both.
 */
export const jumpingClock = Effect.map(TestClock.testClock(), (test) => {
  let offset = 0
  const clock: TestClock.TestClock = Object.create(test)
  Object.assign(clock, {
    unsafeCurrentTimeMillis: () => test.unsafeCurrentTimeMillis() + offset,
    currentTimeMillis: Effect.sync(() => test.unsafeCurrentTimeMillis() + offset),
    unsafeCurrentTimeNanos: () => test.unsafeCurrentTimeNanos(),
    currentTimeNanos: test.currentTimeNanos
  })
  return {
    clock,
    /** Steps the wall clock by `duration` (negative: back). */
    jump: (millis: number) => Effect.sync(() => void (offset += millis))
  }
})

/**
 * The live clock with its wall-clock reading `skew` ms off (a machine whose clock drifted: NTP not running, a
 * VM resumed); monotonic time and sleeps are the live ones. Provide it with `Effect.withClock`.
 */
export const skewedClock = (skew: number): Clock.Clock => {
  const live = Clock.make()
  return {
    ...live,
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: () => live.unsafeCurrentTimeMillis() + skew,
    currentTimeMillis: Effect.sync(() => live.unsafeCurrentTimeMillis() + skew),
    unsafeCurrentTimeNanos: () => live.unsafeCurrentTimeNanos(),
    currentTimeNanos: live.currentTimeNanos,
    sleep: (duration) => live.sleep(duration)
  }
}

/**
 * The options a constructor refused: every path its `ParseError` names (`"maxSize"`, `"config.timeout"`),
 * each key checked to appear in the message as Schema writes it (`["maxSize"]`). Anything but a `ParseError` is
 * reported by its tag, so an assertion on the result fails saying what came instead.
 */
export const refusedOptions = (error: unknown): ReadonlyArray<string> | string => {
  if (!ParseResult.isParseError(error)) {
    return `not a ParseError: ${(error as { readonly _tag?: unknown } | undefined)?._tag ?? String(error)}`
  }
  const paths = ParseResult.ArrayFormatter.formatErrorSync(error).map((issue) => issue.path)
  for (const key of paths.flat()) {
    const shown = `[${JSON.stringify(key)}]`
    if (!error.message.includes(shown)) return `the message does not name ${shown}: ${error.message}`
  }
  return paths.map((path) => path.join("."))
}

/** Someone else's SQLite database at `file`: a table of its own, one row, rollback-journal mode. */
export const foreignSqlite = (file: string) =>
  Effect.provide(
    Effect.flatMap(SqlClient.SqlClient, (sql) =>
      Effect.zipRight(
        sql`CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)`,
        sql`INSERT INTO notes (text) VALUES ('x')`
      )),
    SqliteClient.layer({ filename: file, disableWAL: true })
  ).pipe(Effect.scoped)

/**
 * Runs the bundled `leasehold` command line with `args` (no colour, no database URL from the environment);
 * resolves with its exit code and output.
 */
export const leasehold = (...args: ReadonlyArray<string>) =>
  Effect.async<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      "node",
      [bundle("src/bin/leasehold.ts"), ...args],
      { timeout: 60_000, env: { ...process.env, NO_COLOR: "1", LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "" } },
      (error, stdout, stderr) =>
        resume(Effect.succeed({ code: error === null ? 0 : Number(error.code ?? 1), stdout, stderr }))
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })
