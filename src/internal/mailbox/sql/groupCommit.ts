/**
 * Group commit: items submitted while a statement is in flight go together
 * in the next one — a durable mailbox's acknowledgements (with their replies)
 * and its sends. An idle mailbox pays no delay (the first item flushes after
 * one yield); a busy one sends one statement and one commit for many items.
 * Waiters are plain callbacks (a `Deferred` per item costs more than the rest
 * of the path). A waiter interrupted once it has submitted stops waiting; its
 * item still commits with the batch.
 *
 * A batch holds at most `maxItems` items and `maxBytes` of them (an item
 * larger than that goes alone), so the statement that carries a batch is
 * never too large to build. One bad item must not fail the others: when a
 * batch of several fails in a way one item can cause (`retryAlone` says which:
 * the database refused the data, or building the statement threw), its items
 * are committed again one by one, and only the one at fault fails. Whatever
 * else goes wrong with one batch — the store is down — ends that batch's
 * waiters with it and nothing else: the committer goes on with the next batch,
 * and a later submit starts a new one if none is running.
 *
 * The committer is a fiber forked in the owner's scope (a mailbox's), never a
 * daemon; it runs uninterruptibly, so closing that scope waits for what was
 * submitted to commit instead of leaving its waiters hanging, and a submit
 * after the scope closed still commits (its committer is never interrupted).
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Scope from "effect/Scope"

interface Pending<I, O, E> {
  readonly item: I
  readonly done: (result: Exit.Exit<O, E>) => void
}

/** Limits of one batch. */
export interface Limits<I, E = never> {
  readonly maxItems: number
  readonly maxBytes: number
  /** An item's share of the statement, in bytes (roughly: its encoded body's length). */
  readonly sizeOf: (item: I) => number
  /**
   * Whether a batch that failed with `error` is worth committing again item by item: one item could have
   * caused it, and nothing of the batch was written. A batch whose statement threw while being built always
   * is. Without it, a failed batch fails all its items.
   */
  readonly retryAlone?: ((error: E) => boolean) | undefined
}

export class GroupCommit<I, O, E> {
  private pending: Array<Pending<I, O, E>> = []
  private flushing = false

  /** `commit` writes a batch and gives each item's result, in order; the committer is forked in `scope`. */
  constructor(
    private readonly commit: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<O>, E>,
    private readonly limits: Limits<I, E>,
    private readonly scope: Scope.Scope
  ) {}

  /** Resolves with the item's result once its batch has committed. */
  submit(item: I): Effect.Effect<O, E> {
    return Effect.suspend(() => {
      // The item is queued before the committer starts: a committer that runs at once (its scope closed) sees it.
      let result: Exit.Exit<O, E> | undefined
      let resume: ((result: Exit.Exit<O, E>) => void) | undefined
      this.pending.push({
        item,
        done: (exit) => resume === undefined ? (result = exit) : resume(exit)
      })
      return this.start(Effect.async<O, E>((callback) => {
        if (result !== undefined) return callback(result)
        resume = callback
      }))
    })
  }

  /**
   * `submit` without the wait: the item joins the next batch at once and `done` hears its result once that
   * batch has committed (on the committer's fiber, so `done` must not block or throw). Returns the effect that
   * starts the committer, to be run at once, when none is running; else `undefined` (nothing to run).
   */
  offer(item: I, done: (result: Exit.Exit<O, E>) => void): Effect.Effect<void> | undefined {
    this.pending.push({ item, done })
    if (this.flushing) return undefined
    this.flushing = true
    return Effect.asVoid(Effect.uninterruptible(Effect.forkIn(this.flush(), this.scope)))
  }

  /** `submit` for many items with one wait: each item's result, in order, once all have committed. */
  submitAll(items: ReadonlyArray<I>): Effect.Effect<ReadonlyArray<Exit.Exit<O, E>>> {
    return Effect.suspend(() => {
      if (items.length === 0) return Effect.succeed([])
      const results = new Array<Exit.Exit<O, E>>(items.length)
      let left = items.length
      let resume: ((results: Exit.Exit<ReadonlyArray<Exit.Exit<O, E>>>) => void) | undefined
      const collect = (index: number) => (result: Exit.Exit<O, E>) => {
        results[index] = result
        if (--left === 0 && resume !== undefined) resume(Exit.succeed(results))
      }
      items.forEach((item, index) => this.pending.push({ item, done: collect(index) }))
      return this.start(Effect.async<ReadonlyArray<Exit.Exit<O, E>>>((callback) => {
        if (left === 0) return callback(Exit.succeed(results))
        resume = callback
      }))
    })
  }

  /** Starts the committer unless it is running, then `wait`s. */
  private start<A, X>(wait: Effect.Effect<A, X>): Effect.Effect<A, X> {
    if (this.flushing) return wait
    this.flushing = true
    // Forked uninterruptible, so the committer starts so: a closing scope waits for it (see the top comment).
    return Effect.zipRight(Effect.uninterruptible(Effect.forkIn(this.flush(), this.scope)), wait)
  }

  /** The next batch: items in order, up to the count and byte limits (at least one item). */
  private take(): Array<Pending<I, O, E>> {
    const { maxBytes, maxItems, sizeOf } = this.limits
    let count = 0
    let bytes = 0
    while (count < this.pending.length && count < maxItems) {
      const size = sizeOf(this.pending[count]!.item)
      if (count > 0 && bytes + size > maxBytes) break
      bytes += size
      count++
    }
    const batch = this.pending.slice(0, count)
    this.pending = this.pending.slice(count)
    return batch
  }

  /** Commits `items`; suspended, so a statement that throws while it is built fails them, not the committer. */
  private attempt(items: ReadonlyArray<I>): Effect.Effect<Exit.Exit<ReadonlyArray<O>, E>> {
    return Effect.exit(Effect.suspend(() => this.commit(items)))
  }

  /** Whether one item could have failed the batch (see `Limits.retryAlone`). */
  private oneItemCouldCause(cause: Cause.Cause<E>): boolean {
    const retryAlone = this.limits.retryAlone
    if (retryAlone === undefined || Cause.isInterrupted(cause)) return false
    const failure = Cause.failureOption(cause)
    return failure._tag === "Some" ? retryAlone(failure.value) : true
  }

  private flush(): Effect.Effect<void> {
    const loop: Effect.Effect<void> = Effect.suspend(() => {
      if (this.pending.length === 0) {
        this.flushing = false
        return Effect.void
      }
      const batch = this.take()
      return Effect.flatMap(this.attempt(batch.map((entry) => entry.item)), (committed) => {
        if (Exit.isFailure(committed) && batch.length > 1 && this.oneItemCouldCause(committed.cause)) {
          return Effect.zipRight(
            Effect.forEach(
              batch,
              (entry) =>
                Effect.map(
                  this.attempt([entry.item]),
                  (alone) => entry.done(Exit.map(alone, (results) => results[0]!))
                ),
              {
                discard: true
              }
            ),
            loop
          )
        }
        batch.forEach((entry, index) => entry.done(Exit.map(committed, (results) => results[index]!)))
        return loop
      })
    })
    return Effect.zipRight(Effect.yieldNow(), loop).pipe( // let fibers that are ready in this tick join the batch
      Effect.onExit((exit) => {
        if (Exit.isSuccess(exit)) return Effect.void
        // Never expected (each batch's failure is caught above): end every waiter rather than leave it hanging.
        this.flushing = false
        const stranded = this.pending
        this.pending = []
        for (const entry of stranded) entry.done(Exit.failCause(exit.cause))
        return Effect.logError("Group commit stopped", Cause.pretty(exit.cause))
      })
    )
  }
}
