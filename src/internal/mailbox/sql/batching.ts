/**
 * Sharing statements between concurrent callers of one mailbox: `ClaimBatcher`
 * (receivers asking at once share one claim), `SingleFlight` (idle receivers
 * share one look-up of the next visible time) and the settle batcher (the
 * acknowledgements and replies of concurrent loops committed together).
 */
import type { SqlError } from "@effect/sql/SqlError"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import type * as Scope from "effect/Scope"
import * as Sql from "../../sql/common.js"
import { GroupCommit } from "./groupCommit.js"
import type { Now, SettleItem, Statements } from "./statements.js"
import type { Row } from "./store.js"

/**
 * Group claims: receivers of one mailbox that ask while a claim is running
 * are served together by the next statement, rows handed out in queue
 * order, each receiver taking at most its `max` (the claim-side twin of the
 * settle batcher: eight loops claiming ten each cost one statement, not
 * eight). A receiver interrupted while it waits takes nothing, and rows
 * that nobody takes are released at once. The claimer runs on a fiber forked
 * uninterruptibly in `scope` (the mailbox's): closing it waits for the claim
 * in flight and its hand-out.
 */
export class ClaimBatcher {
  private waiting: Array<ClaimRequest> = []
  private claiming = false

  constructor(
    private readonly claim: (
      now: Now,
      visibilityMillis: number,
      max: number
    ) => Effect.Effect<ReadonlyArray<Row>, SqlError>,
    private readonly release: (rows: ReadonlyArray<Row>, now: Now) => Effect.Effect<void>,
    private readonly now: () => Now,
    private readonly scope: Scope.Scope
  ) {}

  /** Claims up to `max` rows; only the wait is interruptible (through `restore`). */
  submit(
    max: number,
    visibilityMillis: number,
    restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  ): Effect.Effect<Claimed, SqlError> {
    return Effect.suspend(() => {
      const request: ClaimRequest = { max, visibilityMillis, outcome: undefined, resume: undefined, cancelled: false }
      this.waiting.push(request)
      const start = this.claiming
        ? Effect.void
        : Effect.asVoid(Effect.uninterruptible(Effect.forkIn(this.drain(), this.scope)))
      this.claiming = true
      // A callback, not a Deferred: one per receive, and a Deferred costs more than the rest of the wait.
      const wait = Effect.async<Claimed, SqlError>((resume) => {
        if (request.outcome !== undefined) return resume(request.outcome)
        request.resume = resume
      })
      return Effect.zipRight(start, restore(wait)).pipe(
        Effect.onInterrupt(() =>
          Effect.suspend(() => {
            // Not served yet: the claim skips this receiver. Served already: give its rows back.
            request.cancelled = true
            const outcome = request.outcome
            return outcome !== undefined && Exit.isSuccess(outcome)
              ? this.release(outcome.value.rows, outcome.value.now)
              : Effect.void
          })
        )
      )
    })
  }

  private drain(): Effect.Effect<void> {
    return Effect.gen(this, function*() {
      yield* Effect.yieldNow() // let receivers that are ready in this tick join the claim
      while (this.waiting.length > 0) {
        const visibilityMillis = this.waiting[0]!.visibilityMillis
        // At most `maxClaimRows` rows a statement: a process that claims more at once than it can start before
        // their visibility ends loses them, and between two claims its extensions go first (extensions.ts).
        const batch: Array<ClaimRequest> = []
        const rest: Array<ClaimRequest> = []
        let taken = 0
        for (const request of this.waiting) {
          if (request.visibilityMillis !== visibilityMillis || (taken > 0 && taken + request.max > maxClaimRows)) {
            rest.push(request)
          } else {
            batch.push(request)
            if (!request.cancelled) taken += request.max
          }
        }
        this.waiting = rest
        const open = batch.filter((request) => !request.cancelled)
        if (open.length === 0) continue
        const now = this.now()
        const total = open.reduce((sum, request) => sum + request.max, 0)
        const claimed = yield* Effect.exit(this.claim(now, visibilityMillis, total))
        if (Exit.isFailure(claimed)) {
          for (const request of open) this.serve(request, Exit.failCause(claimed.cause))
          continue
        }
        const rows = claimed.value.length > 1
          ? [...claimed.value].sort((a, b) =>
            a.order !== undefined && b.order !== undefined ? a.order - b.order : Number(a.seq) - Number(b.seq)
          )
          : claimed.value
        let next = 0
        for (const request of open) {
          if (request.cancelled) continue
          const mine = rows.slice(next, next + request.max)
          next += mine.length
          this.serve(request, Exit.succeed({ rows: mine, now }))
        }
        if (next < rows.length) yield* this.release(rows.slice(next), now)
      }
      this.claiming = false
    })
  }

  private serve(request: ClaimRequest, outcome: Exit.Exit<Claimed, SqlError>): void {
    request.outcome = outcome
    request.resume?.(outcome)
  }
}

/** The most rows one claim statement takes for its receivers. */
export const maxClaimRows = 1000

export interface Claimed {
  readonly rows: ReadonlyArray<Row>
  readonly now: Now
}

export interface ClaimRequest {
  readonly max: number
  readonly visibilityMillis: number
  /** What the claim gave this receiver, once it ran. */
  outcome: Exit.Exit<Claimed, SqlError> | undefined
  /** Wakes the waiting receiver (set when it starts waiting). */
  resume: ((outcome: Exit.Exit<Claimed, SqlError>) => void) | undefined
  cancelled: boolean
}

/**
 * Single flight: callers that ask while the query is running share its
 * answer. A queue's idle receivers all ask when its next message becomes
 * visible; one query answers them, where each asking would take as many
 * connections and scans. The query runs in a fiber of its own, forked in
 * `scope` (the mailbox's), so a caller interrupted while it waits does not
 * cut the query short for the others; closing the scope ends it, and its
 * callers with it.
 */
export class SingleFlight<A, E> {
  private running: Deferred.Deferred<A, E> | undefined

  constructor(private readonly query: () => Effect.Effect<A, E>, private readonly scope: Scope.Scope) {}

  get run(): Effect.Effect<A, E> {
    return Effect.suspend(() => {
      if (this.running !== undefined) return Deferred.await(this.running)
      const running = Deferred.unsafeMake<A, E>(FiberId.none)
      this.running = running
      const query = Effect.flatMap(Effect.exit(Effect.suspend(this.query)), (exit) => {
        this.running = undefined
        return Deferred.done(running, exit)
      })
      // Uninterruptible (a short read): a closing scope waits for it, so its callers are never left waiting.
      return Effect.zipRight(Effect.uninterruptible(Effect.forkIn(query, this.scope)), Deferred.await(running))
    })
  }
}

/** A settle's result: the reply id (or `undefined` without one), `false` for a stale handle, or the store's error. */
export type SettleExit = Exit.Exit<string | undefined | false, SqlError>

/** Acknowledgements with their replies, committed together. */
export type SettleBatcher = GroupCommit<SettleItem, string | undefined | false, SqlError>

/**
 * At most this many items, and about this many bytes of bodies, in one grouped statement: PostgreSQL takes
 * a batch as one JSON parameter, which must stay far below what one string can hold.
 */
export const batchLimits = { maxItems: 200, maxBytes: 16 * 1024 * 1024 } as const

export const settleBatcher = (statements: Statements, now: () => Now, scope: Scope.Scope): SettleBatcher =>
  new GroupCommit((items) => settleRounds(statements, now, items), {
    ...batchLimits,
    sizeOf: (item) => 64 + (item.reply?.body.length ?? 0),
    retryAlone: Sql.isDataError
  }, scope)

/**
 * Settles a batch, each message at most once per statement: a message twice in a batch (a delivery that
 * timed out and its redelivery, settled together, or the same delivery twice) goes to a second statement,
 * so each outcome is its own delivery's — the statements match rows by message, and only the current
 * handle settles.
 */
export const settleRounds = (
  statements: Statements,
  now: () => Now,
  items: ReadonlyArray<SettleItem>
): Effect.Effect<Array<string | undefined | false>, SqlError> => {
  const seen = new Set<string>()
  const first: Array<number> = []
  const again: Array<number> = []
  items.forEach((item, index) => {
    if (seen.has(item.seq)) return again.push(index)
    seen.add(item.seq)
    first.push(index)
  })
  const round = first.length === items.length ? items : first.map((index) => items[index]!)
  return Effect.flatMap(statements.settle(round, now()), (rows) => {
    const results = new Array<string | undefined | false>(items.length)
    for (const index of first) {
      const { seq } = items[index]!
      results[index] = rows.has(seq) ? rows.get(seq) : false
    }
    if (again.length === 0) return Effect.succeed(results)
    return Effect.map(settleRounds(statements, now, again.map((index) => items[index]!)), (later) => {
      again.forEach((index, k) => {
        results[index] = later[k]!
      })
      return results
    })
  })
}
