/**
 * A throwaway PostgreSQL cluster for tests: `initdb` in a temporary
 * directory, `pg_ctl start` on a free port as the `postgres` OS user (the
 * server refuses to run as root), stopped and removed when the scope closes.
 *
 * Where `initdb` is missing the layer fails, naming the fix, rather than
 * letting PostgreSQL tests skip: `.ci/run` installs the Debian package.
 */
import { Effect } from "effect"
import { execFile, execFileSync } from "node:child_process"
import { chmodSync, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"

/** A running cluster: a connection URL for the `postgres` superuser. */
export interface Cluster {
  readonly url: string
  readonly port: number
  /** Stops the server at once (`-m immediate`, like a crash): the database goes away. */
  readonly stop: Effect.Effect<void>
  /** Starts it again on the same port. */
  readonly start: Effect.Effect<void>
}

/** A TCP port on loopback that nothing listens on (the bench's Redis takes one too). */
export const freePort = Effect.async<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

/**
 * Runs a PostgreSQL binary, as the `postgres` user when this process is root. Asynchronously: `initdb` and
 * `pg_ctl start -w` take tens of seconds on a loaded machine, and a test worker blocked that long misses
 * vitest's 60 s answer to its progress report ("Timeout calling onTaskUpdate"), which fails the whole run.
 */
const run = (binary: string, args: ReadonlyArray<string>) =>
  Effect.async<string, Error>((resume) => {
    const asRoot = process.getuid?.() === 0
    const [command, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", binary, ...args]] : [binary, [...args]]
    execFile(command as string, argv as Array<string>, { encoding: "utf8" }, (error, stdout, stderr) =>
      resume(
        error === null
          ? Effect.succeed(stdout)
          : Effect.fail(new Error(`${binary} ${args.join(" ")}: ${error.message} ${stderr}`))
      ))
  })

/** Starts a cluster for the scope. */
export const cluster: Effect.Effect<Cluster, Error, import("effect/Scope").Scope> = Effect.acquireRelease(
  Effect.gen(function*() {
    const port = yield* freePort
    const dir = mkdtempSync(join(tmpdir(), "leasehold-pg-"))
    const data = join(dir, "data")
    const start = run("pg_ctl", [
      "-D",
      data,
      "-l",
      join(dir, "server.log"),
      "-w",
      "-o",
      `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off`,
      "start"
    ])
    const stop = run("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"])
    yield* Effect.gen(function*() {
      chmodSync(dir, 0o777)
      if (process.getuid?.() === 0) execFileSync("chown", ["postgres", dir])
      yield* run("initdb", ["-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
      yield* start
    }).pipe(
      Effect.catchAllDefect((defect) => Effect.fail(new Error(String(defect)))),
      Effect.mapError((error) =>
        new Error(
          `Cannot start a throwaway PostgreSQL cluster (${String(error)}). ` +
            "Install the server (apt-get install postgresql) so that initdb and pg_ctl are on the PATH."
        )
      ),
      Effect.tapError(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
    )
    return {
      dir,
      data,
      port,
      url: `postgres://postgres@127.0.0.1:${port}/postgres`,
      stop: Effect.orDie(stop).pipe(Effect.asVoid),
      start: Effect.orDie(start).pipe(Effect.asVoid)
    }
  }),
  ({ data, dir }) =>
    Effect.ignore(run("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"])).pipe(
      Effect.zipRight(Effect.ignore(Effect.try(() => rmSync(dir, { recursive: true, force: true }))))
    )
)
