/**
 * What every WorkLease backend shares, on top of its `Backend`: the
 * `domainId` rule checked before anything is stored, takeovers counted and
 * logged, and `extendable` / `keepAlive` renewing through `renew` (a loss
 * found once and for all). Also the `leaseTimeout` option's schema and its
 * whole milliseconds, which the STM and SQL backends read alike.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as FiberId from "effect/FiberId"
import * as Metric from "effect/Metric"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import type { InvalidParameterError } from "../../Errors.js"
import * as LeaseExtender from "../../LeaseExtender.js"
import { refusedName } from "../names.js"
import * as Options_ from "../options.js"
import {
  type Backend,
  type ExtendableLease,
  type KeepAlive,
  type LeaseNotFoundError,
  type LeaseView,
  type Takeover,
  takeoverGiveUps,
  takeovers,
  type TokenMismatchError,
  type WorkLease
} from "./model.js"

/** The longest `leaseTimeout`: a day (a holder silent longer is not coming back). */
const maxLeaseTimeout = Duration.hours(24)

/** The `leaseTimeout` option of `make` (memory and SQL alike): 1 ms..24 h, finite. */
export const LeaseTimeout = Schema.optionalWith(
  Options_.duration({
    min: Duration.millis(1),
    max: maxLeaseTimeout,
    range: "must be at least 1 millisecond and at most 24 hours"
  }),
  { exact: true }
)

/** Milliseconds of `timeout`, whole (a lease expires on a millisecond, as in SQL). */
export const timeoutMillis = (timeout: Duration.Duration): number => Math.ceil(Duration.toMillis(timeout))

/** The longest renewal interval: what a `LeaseExtender` takes. */
const maxInterval = Duration.hours(12)

const logTakeover = (domainId: string, takeover: Takeover) => {
  const held = `offset ${takeover.offset} was held under fencing token ${takeover.staleFencingToken}, stale for ` +
    Duration.format(Duration.millis(takeover.staleForMillis))
  return Effect.zipRight(
    Metric.increment(takeover.fencingToken === undefined ? takeoverGiveUps : takeovers),
    Effect.logWarning(
      takeover.fencingToken === undefined
        ? `Work lease of domain "${domainId}" not taken over: ${held}, and its retries were used up ` +
          `(${takeover.retryCount}): the offset is given up (failed)`
        : `Work lease of domain "${domainId}" taken over: ${held}; now fencing token ${takeover.fencingToken}, ` +
          `retry ${takeover.retryCount}`
    ).pipe(
      Effect.annotateLogs({
        module: "WorkLease",
        domainId,
        offset: takeover.offset,
        staleFencingToken: takeover.staleFencingToken,
        staleForMillis: takeover.staleForMillis,
        retryCount: takeover.retryCount,
        ...(takeover.fencingToken === undefined ? { gaveUp: true } : { fencingToken: takeover.fencingToken })
      })
    )
  )
}

/** A renewal's failure that is final: the lease was taken over, or is gone. */
const isLoss = (error: { readonly _tag: string }): error is LeaseNotFoundError | TokenMismatchError =>
  error._tag === "LeaseNotFoundError" || error._tag === "TokenMismatchError"

/** Logs, once per lease, that a renewal found it lost; says who holds the domain now if it can tell. */
const logLost = (
  domainId: string,
  error: LeaseNotFoundError | TokenMismatchError,
  current: Effect.Effect<Option.Option<LeaseView>, unknown>
) =>
  Effect.flatMap(
    Effect.orElseSucceed(current, () => Option.none<LeaseView>()),
    (lease) =>
      Effect.logWarning(
        error._tag === "TokenMismatchError"
          ? `Work lease of domain "${domainId}" was taken over (${
            Option.match(lease, {
              onNone: () => "and settled since",
              onSome: (held) => `fencing token ${held.fencingToken}`
            })
          }); no longer renewing`
          : `Work lease of domain "${domainId}" is no longer held (settled, given up, or taken over and settled since); no longer renewing`
      ).pipe(Effect.annotateLogs({ module: "WorkLease", domainId }))
  )

/**
 * The WorkLease of a `backend`: every operation refuses a `domainId` that breaks the name rule
 * (`InvalidParameterError`), on every backend alike and before anything is stored — a lone surrogate has no
 * UTF-8 form, and PostgreSQL's driver sent U+FFFD in its place, so `"\udc00"` was answered with the lease of
 * domain `"\ufffd"`; a takeover is counted and logged; `extendable` and `keepAlive` renew through `renew`.
 * Used by `make` and `WorkLeaseSql.make`.
 */
export const assemble = <E extends { readonly _tag: string }>(
  backend: Backend<E>,
  leaseTimeout: Duration.Duration | undefined
): WorkLease<E> => {
  const guarded = <A, X>(
    domainId: string,
    effect: () => Effect.Effect<A, X>
  ): Effect.Effect<A, X | InvalidParameterError> => {
    const refused = refusedName("domainId", domainId)
    return refused === undefined ? effect() : Effect.fail(refused)
  }
  const renew: WorkLease<E>["renew"] = (domainId, token) => guarded(domainId, () => backend.renew(domainId, token))
  const extendable = (domainId: string, token: string): ExtendableLease => {
    // A loss is final — tokens never come back — so a zombie's later beats cost nothing: no round trip, no log.
    // Without this every beat sent a renewal and logged its failure (the extender only rate-limits successes).
    const lost = Deferred.unsafeMake<void>(FiberId.none)
    const loses = (error: LeaseNotFoundError | TokenMismatchError) =>
      Effect.flatMap(
        Deferred.succeed(lost, undefined),
        (first) => first ? logLost(domainId, error, Effect.map(backend.inspect(domainId), (d) => d.lease)) : Effect.void
      )
    return {
      id: `work-lease:${domainId}`,
      extendVisibility: () =>
        Effect.flatMap(
          Deferred.isDone(lost),
          (done) => done ? Effect.void : Effect.catchIf(renew(domainId, token), isLoss, loses)
        ),
      lost: Deferred.isDone(lost),
      awaitLost: Deferred.await(lost)
    }
  }
  // A renewal renews by `leaseTimeout`: the extension the extender asks for is never used, only bounded by its rules.
  const extension = leaseTimeout === undefined ? maxInterval : Duration.min(leaseTimeout, maxInterval)
  const decodeKeepAlive = Options_.decoder(
    "WorkLease.keepAlive",
    {
      interval: Schema.optionalWith(
        Options_.duration({ positive: true, max: maxInterval, range: "must be more than 0 and at most 12 hours" }),
        { exact: true }
      )
    },
    // At most half: a renewal comes at the first beat after `interval`, plus a round trip, so an interval just
    // below `leaseTimeout` let a holder that beats steadily go stale for part of nearly every cycle.
    ({ interval }) =>
      interval !== undefined && leaseTimeout !== undefined &&
        (Duration.greaterThan(Duration.times(interval, 2), leaseTimeout) ||
          Duration.greaterThanOrEqualTo(interval, extension))
        ? {
          field: "interval",
          message: `must be at most half of leaseTimeout (${Duration.format(leaseTimeout)}) and shorter than ` +
            "12 hours: a renewal comes at the first beat after interval, and the lease must not go stale meanwhile"
        }
        : undefined
  )
  const notKept: KeepAlive = { lost: Effect.succeed(false), awaitLost: Effect.never }
  const keepAlive: WorkLease<E>["keepAlive"] = (domainId, token, heartbeat, options) =>
    Effect.gen(function*() {
      const refused = refusedName("domainId", domainId)
      if (refused !== undefined) return yield* refused
      const { interval } = yield* decodeKeepAlive(options)
      if (leaseTimeout === undefined) return notKept
      // The checks above keep the interval below the extension, both within 12 h; were the extender to refuse
      // them anyway, its ParseError is keepAlive's own.
      const extender = yield* LeaseExtender.make({
        interval: interval ?? Duration.millis(Duration.toMillis(leaseTimeout) / 3),
        extension
      })
      const lease = extendable(domainId, token)
      const detach = yield* Effect.uninterruptible(
        Effect.tap(
          // Cannot fail: AlreadyAttachedError needs an earlier attach, and this extender was made just above.
          Effect.orDie(extender.attachUnscoped(lease, heartbeat)),
          (detach) => Effect.addFinalizer(() => detach)
        )
      )
      // Once lost, stop listening to the heartbeat (detaching twice is harmless): later beats do nothing at all.
      yield* Effect.forkScoped(Effect.interruptible(Effect.zipRight(lease.awaitLost, detach)))
      return { lost: lease.lost, awaitLost: lease.awaitLost }
    })
  return {
    tryAcquire: (domainId, offset) =>
      guarded(
        domainId,
        () =>
          Effect.flatMap(backend.tryAcquire(domainId, offset), ([result, takeover]) =>
            takeover === undefined ? Effect.succeed(result) : Effect.as(logTakeover(domainId, takeover), result))
      ),
    succeed: (domainId, token) => guarded(domainId, () => backend.succeed(domainId, token)),
    fail: (domainId, token) => guarded(domainId, () => backend.fail(domainId, token)),
    renew,
    inspect: (domainId) => guarded(domainId, () => backend.inspect(domainId)),
    assertCurrent: (domainId, fencingToken) => guarded(domainId, () => backend.assertCurrent(domainId, fencingToken)),
    extendable,
    keepAlive
  }
}
