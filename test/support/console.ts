/**
 * `leasehold console …` as the command line ships (a child process) for the console's tests: its URL once it
 * listens, and a stop that signals it and waits for the exit.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { commandLine } from "../helpers.js"

/** A console that listens, and how to stop it. */
export interface RunningConsole {
  readonly url: string
  /** SIGTERM, and wait for the exit (SIGKILL after 5 s); resolves with how long the exit took (ms). */
  readonly stop: Effect.Effect<number>
  /** Whether the process has exited. */
  readonly exited: () => boolean
}

/** Starts `leasehold console args`; stopped with the scope. */
export const startConsole = (args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.async<RunningConsole, Error>((resume) => {
      let resumed = false
      let exited = false
      const once: typeof resume = (effect) => {
        if (!resumed) resume(effect)
        resumed = true
      }
      const child = spawn("node", [commandLine(), "console", ...args], {
        env: { ...process.env, NO_COLOR: "1", LEASEHOLD_DATABASE_URL: "", DATABASE_URL: "" },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      const seen = (chunk: Buffer) => {
        output += chunk.toString()
        const url = /http:\/\/\S+\//.exec(output)?.[0]
        if (url !== undefined) {
          once(Effect.succeed({
            url,
            exited: () => exited,
            // No console outlives its test.
            stop: Effect.suspend(() => {
              if (exited) return Effect.succeed(0)
              const started = performance.now()
              const gone = Effect.async<void>((done) => void child.once("exit", () => done(Effect.void)))
              child.kill("SIGTERM")
              return gone.pipe(
                Effect.timeout("5 seconds"),
                Effect.orElse(() => Effect.sync(() => void child.kill("SIGKILL"))),
                Effect.map(() => performance.now() - started)
              )
            })
          }))
        }
      }
      child.stdout.on("data", seen)
      child.stderr.on("data", seen)
      child.on("exit", () => (exited = true))
      child.on("exit", (code) => once(Effect.fail(new Error(`console exited ${code}: ${output}`))))
      return Effect.sync(() => child.kill("SIGKILL"))
    }),
    (running) => running.stop
  )
