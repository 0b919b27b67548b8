/**
 * What the processes of a soak share: the run's configuration (the orchestrator passes it to every child as
 * one JSON argument), the queue names, the request and reply bodies, and the database each process opens.
 */
import type { SqlClient } from "@effect/sql"
import { Cause, Data, HashMap, Layer, Logger, LogLevel, Schema } from "effect"
import { Database, MailboxSql } from "leasehold"
import type { History, Kind } from "./history.js"

/** The run's settings, as every process sees them. Durations in milliseconds. */
export interface Config {
  readonly backend: "sqlite" | "postgres"
  /** The SQLite file, or the PostgreSQL URL. */
  readonly target: string
  /** The history directory: one `<proc>.jsonl` per process. */
  readonly dir: string
  readonly seed: number
  /** Length of the fault phase: the producer sends and the nemesis strikes for this long. */
  readonly seconds: number
  /** Requests per second the producer aims at. */
  readonly rate: number
  /** Request workers, and MainLoops per worker process (each handles one request at a time). */
  readonly workers: number
  readonly loops: number
  /** The requests' visibility: a lease lives this long unless extended. */
  readonly visibilityMs: number
  /** The lease extender: at most one extension per `extenderIntervalMs`, each to `extensionMs` from now. */
  readonly extenderIntervalMs: number
  readonly extensionMs: number
  /** How often slow work beats (`Heartbeat.beat`). */
  readonly beatEveryMs: number
  /** A SIGTERM'd worker's drain limit (MainLoop.layer's shutdownTimeout). */
  readonly shutdownTimeoutMs: number
  /** The dead-letter policy's maxDeliveryCount (poison is dead-lettered at once by its tag). */
  readonly maxDeliveryCount: number
  /** Whether the producer sends `stubborn` requests (dead-lettered after maxDeliveryCount attempts). */
  readonly stubborn: boolean
  /** Merge queue: worker processes, lock timeout, and how often the producer enqueues an entry (0: none). */
  readonly mergeWorkers: number
  readonly lockTimeoutMs: number
  readonly mergeEveryMs: number
  /** Work leases: worker processes (0: off), domains, lease timeout, and how often an offset arrives. */
  readonly leaseWorkers: number
  readonly leaseDomains: number
  readonly leaseTimeoutMs: number
  readonly leaseOffsetEveryMs: number
  /** WorkLeaseSql's maxRetries: a takeover counts as a failed attempt, and one past these gives the offset up. */
  readonly leaseMaxRetries: number
  /** The simulated tenants: each request is sent with one of them as its key (absent: no keys). */
  readonly tenants?: ReadonlyArray<string>
  /** The requests queue's default limit of live leases per key, set before the fleet starts. */
  readonly keyLimit?: number
}

/** The table prefix of every leasehold table of a soak. */
export const prefix = "soak_"
/** The requests queue the workers serve, and the queue their replies go to. */
export const requestsQueue = "soak_requests"
export const repliesQueue = "soak_replies"

/** A request's body: what kind of work, and how long it takes. */
export const Body = Schema.Struct({
  kind: Schema.Literal("fast", "slow", "poison", "stubborn"),
  workMs: Schema.Number
})
export type Body = typeof Body.Type

/** A successful reply's output. */
export const Output = Schema.Struct({ worker: Schema.String, workMs: Schema.Number })
export type Output = typeof Output.Type

/** What a poison request fails with every time: the policy dead-letters it at once (its tag is included). */
export class PoisonError extends Data.TaggedError("PoisonError")<{ readonly requestId: string }> {
  override get message() {
    return `poison request ${this.requestId}`
  }
}

/** What a stubborn request fails with every time: retried with backoff until maxDeliveryCount. */
export class StubbornError extends Data.TaggedError("StubbornError")<{ readonly requestId: string }> {
  override get message() {
    return `stubborn request ${this.requestId}`
  }
}

/** Kinds that are meant to end in the dead letters. */
export const deadLetterKinds: ReadonlyArray<Kind> = ["poison", "stubborn"]

/** The child's configuration from its command line (`node <bundle> '<json>' <proc>`). */
export const fromArgv = (): { readonly config: Config; readonly proc: string } => {
  const [json = "{}", proc = `proc-${process.pid}`] = process.argv.slice(2)
  return { config: JSON.parse(json) as Config, proc }
}

/**
 * The process's one `SqlClient` (and the mailbox resolver on it). On PostgreSQL the pool is small: a soak runs
 * a dozen processes against one server.
 */
export const database = (config: Config): Layer.Layer<MailboxSql.Services, unknown> =>
  Layer.provideMerge(
    MailboxSql.layer({ prefix }),
    config.backend === "postgres"
      ? Database.layerPg({ url: config.target, maxConnections: 4, minConnections: 1 })
      : Database.layerSqlite({ filename: config.target })
  ) as Layer.Layer<MailboxSql.Services, unknown>

/** The SqlClient alone. */
export type Sql = SqlClient.SqlClient

/**
 * The processes' logger: warnings and errors the library logs go to the history as `log` events, with the
 * log's annotations (the request id, the loop) — evidence for the checker's report — and every line to stderr
 * (the orchestrator keeps it in `logs/<proc>.log`).
 */
export const logger = (history: History): Layer.Layer<never> =>
  Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ annotations, cause, logLevel, message }) => {
      const notes = HashMap.reduce(annotations, "", (text, value, key) => `${text} ${key}=${String(value)}`)
      const text = (Array.isArray(message) ? message.join(" ") : String(message)) + notes +
        (Cause.isEmpty(cause) ? "" : ` ${Cause.pretty(cause)}`)
      if (LogLevel.greaterThanEqual(logLevel, LogLevel.Warning)) {
        history.append({ ev: "log", level: logLevel.label, message: text.slice(0, 2000) })
      }
      process.stderr.write(`${new Date().toISOString()} ${logLevel.label} ${text}\n`)
    })
  )
