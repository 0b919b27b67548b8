/**
 * The extensions of a SQL mailbox's deliveries, group-committed: extensions
 * submitted while a statement is in flight go together in the next one (one
 * UPDATE of many rows, each guarded by its receipt handle and `visible_at >
 * now` on the database's clock, each caller told whether its own row was
 * current). A process holding thousands of leases must land their
 * extensions before they run out; one statement per extension cannot.
 * On PostgreSQL the batch skips a row another transaction has locked (an
 * operator's `SELECT … FOR UPDATE`, a long UPDATE) rather than wait on it
 * with every other lease of the batch: that one extension fails (its
 * extender tries again at its next turn), the rest land.
 *
 * Extensions come first: the waiting ones are taken by how soon their
 * lease ends, and the mailbox's claims pass through `beforeClaim`, which
 * waits while extensions are waiting to be taken, or while the batch in
 * flight is late (see `Pending.lateAt`) — a worker that cannot keep the
 * leases it holds claims no more. With no extension outstanding the gate
 * costs a comparison.
 */
import { SqlError } from "@effect/sql/SqlError"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Metric from "effect/Metric"
import * as MetricBoundaries from "effect/MetricBoundaries"
import * as Scope from "effect/Scope"
import * as Sql from "../../sql/common.js"
import * as Keys from "./keys.js"
import { arrayLiteral, type Now, type Statements } from "./statements.js"
import type { Store } from "./store.js"

/** One delivery's extension. */
export interface Extension {
  readonly seq: string
  readonly handle: string
  readonly timeoutMillis: number
  /** When the delivery's lease ends as this process last knew it (its clock's millis): the earliest goes first. */
  readonly leaseEnd: number
}

/** Rows per extension statement (`count` is the statements, `sum` the rows, `max` the largest). */
export const batchRows = Metric.histogram(
  "leasehold_mailbox_extension_batch_rows",
  MetricBoundaries.exponential({ start: 1, factor: 4, count: 7 }),
  "Deliveries extended per extension statement"
)

/** At most this many rows in one statement: a handful of bytes each. */
const maxItems = 1000

/**
 * An extension is late once it has waited a quarter of the lease it had left when submitted: claims then wait
 * for it (backpressure), so a worker falling behind on its leases stops taking more.
 */
const lateShare = 0.25

interface Pending {
  readonly item: Extension
  /** When it was submitted plus `lateShare` of the lease it had left then (at once when none was left). */
  readonly lateAt: number
  readonly done: (exit: Exit.Exit<boolean, SqlError>) => void
}

/**
 * An extension's outcome: whether its row was current (and is now extended), or `"locked"` when another
 * transaction held the row's lock and the statement passed it by.
 */
export type Outcome = boolean | "locked"

/** Runs a batch: each extension's outcome, in order. */
type Commit = (items: ReadonlyArray<Extension>) => Effect.Effect<ReadonlyArray<Outcome>, SqlError>

const lockedError = () =>
  new SqlError({
    message: "the message's row is locked by another transaction: not extended this time (tried again at the next turn)"
  })

/** The `index`th extension's result from its batch's. */
const outcomeAt = (exit: Exit.Exit<ReadonlyArray<Outcome>, SqlError>, index: number): Exit.Exit<boolean, SqlError> => {
  if (Exit.isFailure(exit)) return Exit.failCause(exit.cause)
  const outcome = exit.value[index]!
  return outcome === "locked" ? Exit.fail(lockedError()) : Exit.succeed(outcome)
}

export class ExtensionBatcher {
  private pending: Array<Pending> = []
  /** The batch in flight (its waiters are ended too if the committer stops). */
  private inFlight: Array<Pending> = []
  /**
   * A committer runs. Written by the batcher only; while it is false nothing is pending or in flight, so no claim
   * waits, and the mailbox's claim reads it in line rather than passing `beforeClaim`.
   */
  flushing = false
  /** The earliest `lateAt` of the batch in flight; `Infinity` when none is. */
  private inFlightLateAt = Infinity
  /** Claims waiting at `beforeClaim`. */
  private gated: Array<() => void> = []

  private constructor(
    private readonly commit: Commit,
    private readonly clock: Clock.Clock,
    /** The mailbox's scope: the committer is forked in it, and stops when the mailbox closes. */
    private readonly scope: Scope.Scope
  ) {}

  /** The mailbox closed: later extensions run alone, on the caller's fiber. */
  private closed = false

  /** A batcher whose committer lives in `scope`, closed with it. */
  static make(commit: Commit, clock: Clock.Clock, scope: Scope.Scope): Effect.Effect<ExtensionBatcher> {
    return Effect.suspend(() => {
      const batcher = new ExtensionBatcher(commit, clock, scope)
      return Effect.as(Scope.addFinalizer(scope, Effect.sync(() => batcher.closed = true)), batcher)
    })
  }

  /** Extends one delivery once its batch has run: false when its handle was stale. */
  submit(item: Extension): Effect.Effect<boolean, SqlError> {
    return Effect.suspend(() => {
      // The mailbox closed, its store may not have: the extension runs alone, as a settle does after a close (a
      // job still running keeps its lease, or learns from the store why not).
      if (this.closed) return Effect.flatMap(Effect.exit(this.commit([item])), (exit) => outcomeAt(exit, 0))
      const submitted = this.clock.unsafeCurrentTimeMillis()
      const wait = Effect.async<boolean, SqlError>((resume) => {
        this.pending.push({
          item,
          lateAt: submitted + Math.max(0, item.leaseEnd - submitted) * lateShare,
          done: resume
        })
      })
      if (this.flushing) return wait
      this.flushing = true
      return Effect.zipRight(Effect.forkIn(this.flush(), this.scope), wait)
    })
  }

  /** Whether a claim must wait: extensions are waiting to be taken, or the batch in flight is late. */
  private blocking(): boolean {
    return this.pending.length > 0 ||
      (this.inFlightLateAt !== Infinity && this.clock.unsafeCurrentTimeMillis() >= this.inFlightLateAt)
  }

  /** Waits, before a claim, until no extension waits to be taken and none in flight is late. */
  get beforeClaim(): Effect.Effect<void> {
    return Effect.suspend(() =>
      this.blocking() ?
        Effect.async<void>((resume) => {
          this.gated.push(() => resume(Effect.void))
        }) :
        Effect.void
    )
  }

  /** Lets the waiting claims go if nothing holds them any more. */
  private release(): void {
    if (this.gated.length === 0 || this.blocking()) return
    const gated = this.gated
    this.gated = []
    for (const open of gated) open()
  }

  /** The next batch: the extensions whose lease ends soonest, at most `maxItems`. */
  private take(): Array<Pending> {
    if (this.pending.length > maxItems) this.pending.sort((a, b) => a.item.leaseEnd - b.item.leaseEnd)
    const batch = this.pending.length > maxItems ? this.pending.slice(0, maxItems) : this.pending
    this.pending = this.pending.length > maxItems ? this.pending.slice(maxItems) : []
    let lateAt = Infinity
    for (const entry of batch) if (entry.lateAt < lateAt) lateAt = entry.lateAt
    this.inFlightLateAt = lateAt
    this.inFlight = batch
    return batch
  }

  /** Runs `items`; suspended, so a statement that throws while it is built fails them, not the committer. */
  private attempt(items: ReadonlyArray<Extension>) {
    return Effect.exit(Effect.suspend(() => this.commit(items)))
  }

  private flush(): Effect.Effect<void> {
    const loop: Effect.Effect<void> = Effect.suspend(() => {
      if (this.pending.length === 0) {
        this.flushing = false
        this.inFlightLateAt = Infinity
        this.release()
        return Effect.void
      }
      const batch = this.take()
      this.release()
      return Effect.flatMap(this.attempt(batch.map((entry) => entry.item)), (exit) => {
        // The database refused the data (one row could cause it): each row again alone, so only that one fails.
        if (Exit.isFailure(exit) && batch.length > 1 && isDataFailure(exit)) {
          return Effect.zipRight(
            Effect.forEach(
              batch,
              (entry) => Effect.map(this.attempt([entry.item]), (alone) => entry.done(outcomeAt(alone, 0))),
              {
                discard: true
              }
            ),
            Effect.suspend(() => {
              this.inFlight = []
              return loop
            })
          )
        }
        this.inFlight = []
        batch.forEach((entry, index) => entry.done(outcomeAt(exit, index)))
        return loop
      })
    })
    return Effect.zipRight(Effect.yieldNow(), loop).pipe( // extensions ready in this tick join the batch
      Effect.onExit((exit) =>
        Effect.suspend(() => {
          if (Exit.isSuccess(exit)) return Effect.void
          // The mailbox closed (the committer was interrupted) or a defect: end every waiter and claim rather than
          // leave it hanging, the waiters with the store's error (an extension after its mailbox closed lands nowhere).
          this.flushing = false
          this.inFlightLateAt = Infinity
          const stranded = [...this.inFlight, ...this.pending]
          this.inFlight = []
          this.pending = []
          const failed = Exit.fail(closedError())
          for (const entry of stranded) entry.done(Exit.isInterrupted(exit) ? failed : Exit.failCause(exit.cause))
          this.release()
          return Exit.isInterrupted(exit) ? Effect.void : Effect.logError("Extension batcher stopped", exit.cause)
        })
      )
    )
  }
}

const closedError = () => new SqlError({ message: "the mailbox closed before the extension was written" })

const isDataFailure = (exit: Exit.Failure<unknown, SqlError>): boolean => {
  const failure = exit.cause._tag === "Fail" ? exit.cause.error : undefined
  return failure === undefined || Sql.isDataError(failure)
}

/**
 * Extends a batch, each message at most once per statement: a message twice in a batch goes to a second
 * statement (an UPDATE meets each row once), so the later extension lands after the earlier one.
 */
const rounds = (
  run: (items: ReadonlyArray<Extension>) => Effect.Effect<ReadonlyMap<string, Outcome>, SqlError>,
  items: ReadonlyArray<Extension>
): Effect.Effect<ReadonlyArray<Outcome>, SqlError> => {
  const seen = new Set<string>()
  const again: Array<number> = []
  const first: Array<Extension> = []
  items.forEach((item, index) => {
    if (seen.has(item.seq)) again.push(index)
    else {
      seen.add(item.seq)
      first.push(item)
    }
  })
  return Effect.flatMap(
    Metric.update(batchRows, first.length).pipe(
      Effect.zipRight(run(first)),
      Effect.withSpan("MailboxSql.extendBatch", { attributes: { rows: first.length } })
    ),
    (extended) => {
      const results = items.map((item): Outcome => extended.get(item.seq) ?? false)
      if (again.length === 0) return Effect.succeed(results)
      return Effect.map(rounds(run, again.map((index) => items[index]!)), (later) => {
        again.forEach((index, k) => {
          results[index] = later[k]!
        })
        return results
      })
    }
  )
}

/**
 * The batch statement of the store's dialect for the mailbox `queue`: every row whose handle is current and whose
 * visibility has not run out (both judged by `now`, the database's clock unless a test's) becomes visible its
 * timeout from now; an extension of zero on PostgreSQL notifies the queue's receivers, as a nack does. On
 * PostgreSQL a current row locked by another transaction is skipped (`SKIP LOCKED`) and reported `"locked"`:
 * the row is found current in the statement's snapshot but not taken by its lock.
 */
export const commitOf = (store: Store, statements: Statements, queue: string, now: () => Now): Commit => {
  const { sql } = store
  const messages = sql(store.messages)
  const run = store.dialect === "pg"
    ? (items: ReadonlyArray<Extension>) =>
      Effect.map(
        store.onLane((lane) => {
          const at = statements.at(now())
          const zero = items.some((item) => item.timeoutMillis === 0)
          return lane<{ seq: string | number; extended: boolean }>`WITH input AS (
              SELECT * FROM unnest(${arrayLiteral(items.map((item) => item.seq))}::bigint[],
                ${arrayLiteral(items.map((item) => item.handle))}::text[],
                ${arrayLiteral(items.map((item) => String(item.timeoutMillis)))}::bigint[]) AS v(seq, handle, timeout)),
            target AS (SELECT m.seq, input.timeout FROM ${messages} m JOIN input ON m.seq = input.seq
              WHERE m.receipt_handle = input.handle AND m.visible_at > ${at} FOR UPDATE OF m SKIP LOCKED),
            ${
            // Only a queue this process claims through the scheduled claim has leases to charge (keys.ts).
            store.scheduled.has(queue)
              ? sql`charge AS (${
                Keys.chargeExtended(store, at, sql`FROM ${messages} m WHERE m.seq IN (SELECT seq FROM target)`)
              }),`
              : sql``}
            upd AS (UPDATE ${messages} m SET visible_at = ${at} + target.timeout, extended_at = ${at},
                ${Keys.chargedAfterExtension(store, at, sql`m`)}
              FROM target WHERE m.seq = target.seq
              RETURNING m.seq, target.timeout)
            SELECT seq, true AS extended${
            zero ? sql`, CASE WHEN timeout = 0 THEN pg_notify(${store.channel}, ${queue})::text END AS notified` : sql``
          } FROM upd
            UNION ALL
            SELECT m.seq, false${zero ? sql`, NULL::text` : sql``} FROM input JOIN ${messages} m ON m.seq = input.seq
              WHERE input.seq NOT IN (SELECT seq FROM target)
                AND m.receipt_handle = input.handle AND m.visible_at > ${at}`
        }),
        (rows) => new Map(rows.map((row): [string, Outcome] => [String(row.seq), row.extended ? true : "locked"]))
      )
    : (items: ReadonlyArray<Extension>) =>
      Effect.suspend(() => {
        const at = statements.at(now())
        const input = sql`(SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS handle,
              json_extract(value, '$[2]') AS timeout FROM json_each(${
          JSON.stringify(items.map((item) => [Number(item.seq), item.handle, item.timeoutMillis]))
        }))`
        const update = sql<
          { seq: number }
        >`UPDATE ${messages} SET visible_at = ${at} + input.timeout, extended_at = ${at},
              ${Keys.chargedAfterExtension(store, at, sql`${messages}`)}
            FROM ${input} AS input
            WHERE ${messages}.seq = input.seq AND ${messages}.receipt_handle = input.handle
              AND ${messages}.visible_at > ${at}
            RETURNING ${messages}.seq`
        // Keyed leases charge their keys up to twice their age (keys.ts), in the same transaction — only on a
        // queue this process claims through the scheduled claim (a plain claim's leases have nothing to charge).
        return Effect.map(
          store.scheduled.has(queue)
            ? Sql.writeTransaction(sql)(Effect.zipRight(
              Keys.chargeExtended(
                store,
                at,
                sql`FROM ${input} AS i JOIN ${messages} m ON m.seq = i.seq
                  WHERE m.receipt_handle = i.handle AND m.visible_at > ${at}`
              ),
              update
            ))
            : update,
          (rows) => new Map(rows.map((row): [string, Outcome] => [String(row.seq), true]))
        )
      })
  return (items) => rounds(run, items)
}

/** The extension batcher of a mailbox (`queue`) on `store`, for the mailbox's life (`scope`). */
export const extensionBatcher = (
  store: Store,
  statements: Statements,
  queue: string,
  now: () => Now,
  clock: Clock.Clock,
  scope: Scope.Scope
): Effect.Effect<ExtensionBatcher> => ExtensionBatcher.make(commitOf(store, statements, queue, now), clock, scope)
