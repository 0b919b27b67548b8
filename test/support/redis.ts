/**
 * A throwaway Redis server: `redis-server` on a free loopback port in a temporary directory, with persistence
 * off (`--save ""`, `--appendonly no`), stopped and removed when the scope closes — for the tests of the Redis
 * mailbox (test/MailboxRedis.test.ts) and the benchmark's Redis rows (bench/redis.ts), as PostgreSQL's
 * throwaway clusters are (./postgres.ts).
 *
 * Where `redis-server` is missing and this process is root, Debian's `redis-server` package is installed first
 * (`.ci/run` installs it before the tests). Anything that stops the server from starting is a failure naming the
 * reason.
 */
import { Effect } from "effect"
import { execFileSync, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { freePort } from "./postgres.js"

/** A running server. */
export interface Server {
  readonly host: string
  readonly port: number
  readonly pid: number
  /** `redis-server --version`'s version, e.g. `7.0.15`. */
  readonly version: string
}

const versionOf = (): string | undefined => {
  try {
    const output = execFileSync("redis-server", ["--version"], { stdio: "pipe", encoding: "utf8" })
    return /v=(\S+)/.exec(output)?.[1] ?? output.trim()
  } catch {
    return undefined
  }
}

/** The installed version, installing Debian's package first when it is missing and we are root. */
const ensureInstalled = Effect.suspend(() => {
  const installed = versionOf()
  if (installed !== undefined) return Effect.succeed(installed)
  if (process.getuid?.() !== 0) {
    return Effect.fail(new Error("redis-server is not installed and this process is not root to install it"))
  }
  return Effect.flatMap(
    Effect.try({
      try: () => {
        const options = { stdio: "pipe", env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } } as const
        execFileSync("apt-get", ["update"], options)
        execFileSync("apt-get", ["install", "-y", "--no-install-recommends", "redis-server"], options)
      },
      catch: (error) => new Error(`apt-get install redis-server failed: ${String(error).split("\n")[0]}`)
    }),
    () => {
      const version = versionOf()
      return version === undefined
        ? Effect.fail(new Error("redis-server is still missing after apt-get install"))
        : Effect.succeed(version)
    }
  )
})

/** Starts a server for the scope; fails with the reason when it cannot be installed or started. */
export const server: Effect.Effect<Server, Error, import("effect/Scope").Scope> = Effect.suspend(() => serverWith([]))

/**
 * `server` with more of `redis-server`'s options (`--cluster-enabled yes`, say), on `at`'s port and directory when
 * given (a server started again over the files of one that was killed: the directory is then the caller's).
 */
export const serverWith = (
  extra: ReadonlyArray<string>,
  at?: { readonly port: number; readonly dir: string }
): Effect.Effect<Server & { readonly dir: string }, Error, import("effect/Scope").Scope> =>
  Effect.gen(function*() {
    const version = yield* ensureInstalled
    const port = at?.port ?? (yield* freePort)
    const dir = at?.dir ?? mkdtempSync(join(tmpdir(), "leasehold-redis-"))
    if (at === undefined) {
      yield* Effect.addFinalizer(() => Effect.ignore(Effect.try(() => rmSync(dir, { recursive: true, force: true }))))
    }
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn("redis-server", [
          "--port",
          String(port),
          "--bind",
          "127.0.0.1",
          "--save",
          "",
          "--appendonly",
          "no",
          "--dir",
          dir,
          "--daemonize",
          "no",
          ...extra
        ], { stdio: ["ignore", "pipe", "pipe"] })
      ),
      (child) =>
        child.exitCode !== null || child.signalCode !== null
          ? Effect.void
          : Effect.async<void>((resume) => {
            child.once("exit", () => resume(Effect.void))
            child.kill("SIGTERM")
          }).pipe(Effect.timeout("10 seconds"), Effect.ignore)
    )
    yield* Effect.async<void, Error>((resume) => {
      let output = ""
      // Once ready the output is dropped: removing the listeners leaves the pipes flowing, so the server
      // never blocks on a full one.
      const detach = () => {
        child.stdout!.off("data", onData)
        child.stderr!.off("data", onData)
        child.off("error", onError)
        child.off("exit", onExit)
      }
      const settle = (result: Effect.Effect<void, Error>) => {
        detach()
        resume(result)
      }
      const onData = (chunk: Buffer) => {
        output += chunk
        if (/Ready to accept connections/.test(output)) settle(Effect.void)
      }
      const onError = (error: Error) => settle(Effect.fail(new Error(`cannot run redis-server: ${error.message}`)))
      const onExit = (code: number | null) =>
        settle(Effect.fail(new Error(`redis-server exited (${code}): ${output.trim()}`)))
      child.stdout!.on("data", onData)
      child.stderr!.on("data", onData)
      child.once("error", onError)
      child.once("exit", onExit)
      return Effect.sync(detach)
    }).pipe(
      Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("redis-server not ready after 10 s") })
    )
    return { host: "127.0.0.1", port, pid: child.pid!, version, dir }
  })

/**
 * A throwaway Redis Cluster of `nodes` masters (no replicas): a server per node in cluster mode, joined with
 * `redis-cli --cluster create`, ready once every node reports `cluster_state:ok`. Stopped with the scope.
 */
export const cluster = (nodes = 3): Effect.Effect<ReadonlyArray<Server>, Error, import("effect/Scope").Scope> =>
  Effect.gen(function*() {
    const servers = yield* Effect.all(
      Array.from({ length: nodes }, () => serverWith(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])),
      { concurrency: "unbounded" }
    )
    yield* Effect.try({
      try: () =>
        execFileSync("redis-cli", [
          "--cluster",
          "create",
          ...servers.map((node) => `${node.host}:${node.port}`),
          "--cluster-replicas",
          "0",
          "--cluster-yes"
        ], { stdio: "pipe" }),
      catch: (error) => new Error(`redis-cli --cluster create failed: ${String(error).split("\n")[0]}`)
    })
    const ready = () =>
      servers.every((node) => {
        const info = execFileSync("redis-cli", ["-h", node.host, "-p", String(node.port), "cluster", "info"], {
          encoding: "utf8"
        })
        return /cluster_state:ok/.test(info)
      })
    for (let tries = 0; !ready(); tries++) {
      if (tries > 100) return yield* Effect.fail(new Error("the cluster did not become ready in 10 s"))
      yield* Effect.sleep("100 millis")
    }
    return servers
  })
