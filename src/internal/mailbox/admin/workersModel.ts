/**
 * The models of `MailboxSqlAdmin.workers` (re-exported there): the worker processes and their loops as the
 * workers table says and the database's clock judges them.
 */
import type * as DateTime from "effect/DateTime"
import type * as Duration from "effect/Duration"
import type * as Option from "effect/Option"

/**
 * A loop of a worker process: its queue, its state, the message in its hand and how long ago its heartbeat beat.
 *
 * @category models
 */
export interface WorkerLoop {
  readonly name: string
  readonly queue: string
  readonly state: "running" | "draining" | "stopped"
  readonly messageId: Option.Option<string>
  /** Since its heartbeat last beat, on the database's clock: it keeps growing when the loop or its process stalls. */
  readonly heartbeatAge: Duration.Duration
  /** Running or draining with a heartbeat older than `stalledAfter`: no proof of progress. */
  readonly stalled: boolean
}

/**
 * A worker process, as its row in the workers table says (mailbox migration 9) and the database's clock judges it.
 *
 * @category models
 */
export interface WorkerProcess {
  /** `host:pid`: what an in-flight message's "received by" names. */
  readonly process: string
  /**
   * The random id of the store that wrote the row (one per SQL mailbox layer of the process, drawn when it
   * opens): two rows with one `host:pid` — two layers in one process, two containers with the same host name and
   * pid — are told apart by it. None for a row a process of the previous release wrote (mailbox migration 9).
   */
  readonly instance: Option.Option<string>
  /** The name it was started with (`LEASEHOLD_WORKER_NAME`), if any. */
  readonly name: Option.Option<string>
  /** When it registered (its clock). */
  readonly startedAt: DateTime.Utc
  /** Its leasehold version. */
  readonly version: string
  /** When it last refreshed its row (the database's clock). */
  readonly refreshedAt: DateTime.Utc
  /** Not refreshed for longer than `lostAfter`: the process is gone (killed, frozen, cut off). */
  readonly lost: boolean
  readonly loops: ReadonlyArray<WorkerLoop>
}

/**
 * The verdicts of `Workers.list`: a loop whose heartbeat is older than `stalledAfter` is stalled (default
 * `LEASEHOLD_WORKER_STALLED_AFTER`, else 60 s), a process not refreshed for longer than `lostAfter` is lost
 * (default `LEASEHOLD_WORKER_LOST_AFTER`, else 30 s; workers refresh every `LEASEHOLD_WORKER_REFRESH`, 5 s).
 *
 * @category models
 */
export interface WorkersOptions {
  readonly stalledAfter?: Duration.DurationInput | undefined
  readonly lostAfter?: Duration.DurationInput | undefined
}
