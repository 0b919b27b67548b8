/**
 * A throwaway PgBouncer in front of a test cluster (test/support/postgres.ts): transaction pooling on a free
 * port, `trust` authentication for the users given, run as the `postgres` OS user (it refuses root) and
 * stopped when the scope closes. Where `pgbouncer` is missing the layer fails naming the fix: `.ci/run`
 * installs Debian's package.
 */
import { Effect } from "effect"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { freePort } from "./postgres.js"

const binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].find((path) => existsSync(path)) ?? "pgbouncer"

/** Whether something accepts connections on `port` of loopback. */
const accepts = (port: number) =>
  Effect.async<boolean>((resume) => {
    const socket = connect(port, "127.0.0.1")
    socket.once("connect", () => (socket.destroy(), resume(Effect.succeed(true))))
    socket.once("error", () => resume(Effect.succeed(false)))
  })

/**
 * PgBouncer on a free port forwarding database `postgres` to the cluster on `serverPort`, in `mode`; answers
 * the URL that reaches it as `user` (with `password`, which trust authentication does not check).
 */
export const pgbouncer = (options: {
  readonly serverPort: number
  readonly mode: "transaction" | "session"
  readonly users: ReadonlyArray<string>
}): Effect.Effect<{ readonly port: number }, Error, import("effect/Scope").Scope> =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const port = yield* freePort
      const dir = mkdtempSync(join(tmpdir(), "leasehold-pgbouncer-"))
      chmodSync(dir, 0o777)
      writeFileSync(join(dir, "users.txt"), options.users.map((user) => `"${user}" ""\n`).join(""))
      writeFileSync(
        join(dir, "pgbouncer.ini"),
        [
          "[databases]",
          `postgres = host=127.0.0.1 port=${options.serverPort} dbname=postgres`,
          "[pgbouncer]",
          "listen_addr = 127.0.0.1",
          `listen_port = ${port}`,
          "unix_socket_dir =",
          "auth_type = trust",
          `auth_file = ${join(dir, "users.txt")}`,
          `pool_mode = ${options.mode}`,
          "default_pool_size = 4",
          "max_client_conn = 200",
          "ignore_startup_parameters = extra_float_digits,options",
          `logfile = ${join(dir, "pgbouncer.log")}`
        ].join("\n") + "\n"
      )
      if (process.getuid?.() === 0) execFileSync("chown", ["-R", "postgres", dir])
      const asRoot = process.getuid?.() === 0
      const child: ChildProcess = yield* Effect.try({
        try: () =>
          asRoot
            ? spawn("runuser", ["-u", "postgres", "--", binary, join(dir, "pgbouncer.ini")], { stdio: "ignore" })
            : spawn(binary, [join(dir, "pgbouncer.ini")], { stdio: "ignore" }),
        catch: (error) => new Error(`Cannot start pgbouncer (${String(error)})`)
      })
      const exited = Effect.sync(() => child.exitCode !== null || child.signalCode !== null)
      // Up once it accepts connections; a missing binary or a bad configuration exits instead.
      for (let attempt = 0; attempt < 100; attempt++) {
        if (yield* accepts(port)) return { port, dir, child }
        if (yield* exited) break
        yield* Effect.sleep("100 millis")
      }
      child.kill("SIGKILL")
      return yield* Effect.fail(
        new Error(
          `PgBouncer did not start (${binary}). Install it (apt-get install pgbouncer): .ci/run does.`
        )
      )
    }),
    ({ child, dir }) =>
      Effect.sync(() => {
        child.kill("SIGTERM")
        rmSync(dir, { recursive: true, force: true })
      })
  )
