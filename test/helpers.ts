/** Test helpers shared by several test files. */
import { Effect, Logger, type LogLevel } from "effect"
import { execFile } from "node:child_process"

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
      ["--import", "tsx", file, ...args],
      { timeout: timeoutMs, env: { ...process.env, NO_COLOR: "1" } },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : null
        resume(Effect.succeed({ code, stdout, stderr }))
      }
    )
    return Effect.sync(() => child.kill("SIGKILL"))
  })
