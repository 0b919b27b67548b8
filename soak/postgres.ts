/**
 * A throwaway PostgreSQL cluster for a soak, the way test/support/postgres.ts makes one for the tests —
 * `initdb` in a temporary directory, `pg_ctl start` on a free port as the `postgres` OS user (the server
 * refuses to run as root, so as root we go through `runuser -u postgres`) — but with asynchronous commands:
 * the nemesis stops and starts the server while the orchestrator keeps recording exits and signals, and a
 * blocking `pg_ctl -w start` would stall it. Stopped (`-m immediate`) and removed by `destroy`.
 */
import { execFile } from "node:child_process"
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"

/** A running cluster. */
export interface Cluster {
  readonly url: string
  readonly dir: string
  /** `pg_ctl stop -m immediate`: the server dies as in a crash; connections break. */
  readonly stop: () => Promise<void>
  /** Starts it again on the same port, resolving once it accepts connections. */
  readonly start: () => Promise<void>
  /** Stops it and deletes its directory. */
  readonly destroy: () => Promise<void>
}

/** A TCP port on loopback that nothing listens on. */
export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = createServer()
    server.on("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })

/** Where Debian keeps the server's binaries when they are not on the PATH. */
const binDir = (): string | undefined => {
  const base = "/usr/lib/postgresql"
  if (!existsSync(base)) return undefined
  const versions = readdirSync(base).filter((v) => existsSync(join(base, v, "bin", "initdb")))
  versions.sort((a, b) => Number(a) - Number(b))
  const last = versions.at(-1)
  return last === undefined ? undefined : join(base, last, "bin")
}

/** Runs a server binary, as the `postgres` user when this process is root. */
const run = (binary: string, args: ReadonlyArray<string>): Promise<string> => {
  const dir = binDir()
  const path = dir === undefined ? process.env.PATH : `${process.env.PATH}:${dir}`
  const asRoot = process.getuid?.() === 0
  const [command, argv] = asRoot
    ? ["runuser", ["-u", "postgres", "--", "env", `PATH=${path}`, binary, ...args]]
    : [binary, [...args]]
  return new Promise((resolve, reject) =>
    execFile(
      command as string,
      argv as Array<string>,
      { env: { ...process.env, PATH: path } },
      (error, stdout, stderr) =>
        error === null ? resolve(stdout) : reject(new Error(`${binary} ${args.join(" ")}: ${error.message}\n${stderr}`))
    )
  )
}

/** Starts a cluster. */
export const start = async (): Promise<Cluster> => {
  const port = await freePort()
  const dir = mkdtempSync(join(tmpdir(), "leasehold-soak-pg-"))
  chmodSync(dir, 0o777)
  if (process.getuid?.() === 0) {
    await new Promise<void>((resolve, reject) =>
      execFile("chown", ["postgres", dir], (error) => error === null ? resolve() : reject(error))
    )
  }
  const data = join(dir, "data")
  await run("initdb", ["-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off ` +
    "-c max_connections=300"
  const startServer = () => run("pg_ctl", ["-D", data, "-l", join(dir, "server.log"), "-w", "-o", options, "start"])
  const stopServer = () => run("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"])
  await startServer()
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    dir,
    stop: async () => {
      await stopServer()
    },
    start: async () => {
      await startServer()
    },
    destroy: async () => {
      await stopServer().catch(() => undefined)
      rmSync(dir, { recursive: true, force: true })
    }
  }
}
