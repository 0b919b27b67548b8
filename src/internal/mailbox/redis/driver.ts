/**
 * The Redis mailbox driver (issue 46, first part): a queue's storage on a Redis server, under the front end every
 * backend shares (`../frontEnd.ts`), so what a user sees is what memory and SQL give. Each state change is one
 * Lua script (`scripts.ts`) judged by the server's clock, guarded by the receipt handle and the lease's end.
 *
 * Its messages: acknowledgements group-committed (`GroupCommit`, one script call for many); a reply to a queue of
 * the same server stored in the acknowledging script; the step journal (`internal/journal.ts`) kept beside the
 * message, appended under its lease, deleted with the acknowledgement unless kept. Receivers of other processes
 * are woken by pub/sub, with the front end's bounded poll behind it.
 *
 * On a Redis Cluster each queue's keys share one slot (one hash tag); a reply to a queue of another slot is sent,
 * then the request acknowledged (at least once), as to another store.
 *
 * A message whose body cannot be decoded is set aside as a dead letter (`scripts.ts`), with why.
 *
 * Not yet here (issue 46 goes on): an operator's view of the dead letters and their redrive, the workers' pulse, scheduling by key, browse,
 * retention, and a public module. Its client is the caller's
 * (`ioredis`), held for the mailbox's life.
 */
import * as Cause from "effect/Cause"
import * as DateTime from "effect/DateTime"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import type { Cluster, Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import {
  type InvalidParameterError,
  type Mailbox,
  MailboxConnectionError,
  MailboxFullError,
  MailboxResolver,
  type Message,
  ReceiptHandleExpiredError,
  type ReplyError,
  SerializationError
} from "../../../Mailbox.js"
import { type DeliveryJournal, Journaled, maxSteps, type StoredStep } from "../../journal.js"
import { storableText } from "../../names.js"
import * as Options_ from "../../options.js"
import { testTime } from "../../sql/common.js"
import { traceparentOf, validTraceparent } from "../../tracing.js"
import * as FrontEnd from "../frontEnd.js"
import { Settles, type Sink } from "../settle.js"
import { decoderOf, encoderOf, maxBodyBytesLimit } from "../sql/codec.js"
import { GroupCommit } from "../sql/groupCommit.js"
import { MaxSize, QueueName, validateVisibility } from "../validation.js"
import * as Scripts from "./scripts.js"

/** A server, or a Redis Cluster (a queue's keys share one hash tag: each script runs on the queue's slot). */
export type Client = Redis | Cluster

/** What a Redis mailbox carries for another mailbox's replies to it (`FrontEnd.LocalId`). */
interface Local {
  readonly keys: ReturnType<typeof Scripts.keysOf> & { readonly name: string }
  readonly redis: Client
  readonly wake: () => void
  readonly encode: (body: unknown) => Either.Either<string, string>
  readonly maxSize: number | undefined
}

/** Options of `make`. */
export interface Options<A, I> {
  /** The queue's name: the one name rule. */
  readonly name: string
  /** The bodies' schema (JSON on the server). */
  readonly schema: Schema.Schema<A, I, never>
  /** Bounds the unacknowledged messages: sends beyond it fail `MailboxFullError`. */
  readonly maxSize?: number | undefined
  /** What every key of this store begins with (default `leasehold:`). */
  readonly prefix?: string | undefined
}

const decodeOptions = Options_.decoder("MailboxRedis.make", {
  name: QueueName,
  maxSize: Schema.optionalWith(MaxSize, { exact: true }),
  // A Redis Cluster hashes a key by its first {…}: the queue's tag must be that, so the prefix has no braces.
  prefix: Schema.optionalWith(
    Options_.ruledString((value) =>
      typeof value !== "string"
        ? "must be a string"
        : /[{}]/.test(value)
        ? "may not hold { or } (a cluster hashes a key by its first {…}, which must be the queue's tag)"
        : undefined
    ),
    { exact: true }
  ),
  // The client's own key prefix, given here from the client: the scripts build keys the client would not prefix.
  clientKeyPrefix: Schema.optionalWith(
    Options_.ruledString((value) =>
      value === "" ? undefined : "must be empty: a client with ioredis' keyPrefix is not supported (give `prefix`)"
    ),
    { exact: true }
  )
})

/** A journal member (`<position> <JSON>`, `scripts.ts`) as a step; `undefined` for one that is not (a hand's). */
const stepOf = (member: string): StoredStep | undefined => {
  const space = member.indexOf(" ")
  const position = Number(member.slice(0, space))
  if (space < 1 || !Number.isSafeInteger(position)) return undefined
  let step: { readonly k?: unknown; readonly e?: unknown; readonly r?: unknown } | null
  try {
    step = JSON.parse(member.slice(space + 1)) as typeof step
  } catch {
    return undefined
  }
  if (step === null || typeof step !== "object" || typeof step.k !== "string" || typeof step.e !== "string") {
    return undefined
  }
  if (step.r !== undefined && typeof step.r !== "string") return undefined
  return { position, key: step.k, entry: step.e, requestId: step.r }
}

/** The `keyPrefix` a client was made with (ioredis': a server's options, or a cluster's `redisOptions`). */
const keyPrefixOf = (redis: Client): string | undefined => {
  const options = redis.options as { readonly keyPrefix?: string; readonly redisOptions?: { keyPrefix?: string } }
  return options.keyPrefix ?? options.redisOptions?.keyPrefix
}

type Script = keyof typeof scriptSources
const scriptSources = {
  lhSend: Scripts.send,
  lhClaim: Scripts.claim,
  lhAcknowledgeAll: Scripts.acknowledgeAll,
  lhNack: Scripts.nack,
  lhExtend: Scripts.extend,
  lhCheck: Scripts.check,
  lhReplyAndAcknowledge: Scripts.replyAndAcknowledge,
  lhNextVisible: Scripts.nextVisible,
  lhCount: Scripts.count,
  lhPurge: Scripts.purge,
  lhJournalAppend: Scripts.journalAppend,
  lhJournalTruncate: Scripts.journalTruncate,
  lhIdentity: Scripts.identity,
  lhRelease: Scripts.release,
  lhDeadLetter: Scripts.deadLetter
} as const

/** `redis` with the scripts defined (once per client: ioredis keeps them, sent by digest after the first call). */
const withScripts = (redis: Client) => {
  const defined = redis as Client & Partial<Record<Script, unknown>>
  for (const [name, source] of Object.entries(scriptSources)) {
    if (defined[name as Script] === undefined) redis.defineCommand(name, source)
  }
  return (script: Script, args: ReadonlyArray<string | number>): Promise<unknown> =>
    (defined[script] as unknown as (...args: ReadonlyArray<string | number>) => Promise<unknown>)(...args)
}

/**
 * A Redis-backed mailbox of queue `options.name` on `redis` (a connected `ioredis` client the caller owns),
 * closed when the scope closes.
 */
export const make = <A, I, R = never>(
  redis: Client,
  options: Options<A, I>
): Effect.Effect<Mailbox<A, R>, ParseResult.ParseError, Scope.Scope> =>
  Effect.flatMap(
    decodeOptions({ ...options, clientKeyPrefix: keyPrefixOf(redis) }),
    ({ maxSize, name, prefix }) =>
      Effect.flatMap(Effect.zip(Effect.clock, Effect.scope), ([clock, scope]) => {
        const keys = Scripts.keysOf(prefix ?? "leasehold:", name)
        const run = withScripts(redis)
        const encode = encoderOf(options.schema, maxBodyBytesLimit)
        const decode = decoderOf(options.schema)
        const time = testTime(clock)
        const nowArg = () => (time === undefined ? "" : time())
        const store = <X>(f: () => Promise<X>) =>
          Effect.tryPromise({ try: f, catch: (cause) => new MailboxConnectionError({ mailbox: name, cause }) })
        // Sends and nacks of this process wake its sleeping receivers; other processes' are found by the poll.
        let signal = Deferred.unsafeMake<void>(FiberId.none)
        const wake = () => {
          Deferred.unsafeDone(signal, Effect.void)
          signal = Deferred.unsafeMake<void>(FiberId.none)
        }
        // Other processes' messages: their scripts publish on the queue's wake channel. Subscribed when a receiver
        // first sleeps (a process that only sends opens no second connection), closed with the mailbox; the
        // bounded poll stays, for a message published while the subscription was down.
        let subscriber: Client | undefined
        const listen = () => {
          if (subscriber !== undefined) return
          const listening = redis.duplicate()
          subscriber = listening
          listening.on("error", () => undefined)
          listening.on("message", () => wake())
          listening.subscribe(keys.wake).catch(() => undefined)
        }
        const unlisten = Effect.suspend(() =>
          subscriber === undefined ? Effect.void : Effect.promise(() => subscriber!.quit().catch(() => undefined))
        )
        // The store's identity (drawn once, kept in Redis under the prefix): with the queue and the message's number,
        // a message's identity across stores, the base of its tools' idempotency keys.
        // Kept once read; a failed read (the server away, or over maxmemory) is not kept: the next one tries again.
        let identityRead: string | undefined
        const storeIdentity = Effect.suspend(() =>
          identityRead !== undefined ? Effect.succeed(identityRead) : Effect.map(
            store(() => run("lhIdentity", [`${prefix ?? "leasehold:"}identity`, randomUUID()])),
            (found) => (identityRead = String(found))
          )
        )
        const expired = (id: string, handle: string) =>
          new ReceiptHandleExpiredError({ mailbox: name, messageId: id, receiptHandle: handle })

        // Acknowledgements that arrive while a batch is on its way go together in the next script call (one round
        // trip for many: a worker's settles, `settleAll`'s group).
        const settler = new GroupCommit<
          { readonly id: string; readonly handle: string; readonly keep: boolean },
          boolean,
          MailboxConnectionError
        >(
          (items) =>
            Effect.map(
              store(() =>
                run("lhAcknowledgeAll", [
                  keys.hidden,
                  nowArg(),
                  keys.message,
                  keys.journal,
                  ...items.flatMap(({ handle, id, keep }) => [id, handle, keep ? "1" : "0"])
                ])
              ),
              (results) => (results as ReadonlyArray<number>).map((result) => result === 1)
            ),
          { maxItems: 500, maxBytes: 1 << 20, sizeOf: ({ handle, id }) => id.length + handle.length + 1 },
          scope
        )
        /** Each acknowledgement without a reply a row of the group commit; with one, settled in line. */
        const sink: Sink = {
          offer: (message, reply, _resolver, _traceparent, done) => {
            if (!(message instanceof RedisMessage) || (Option.isSome(reply) && Option.isSome(message.replyTo))) {
              return false
            }
            const start = settler.offer(
              { id: message.id, handle: message.receiptHandle, keep: message.kept },
              (result) => {
                if (Exit.isFailure(result)) {
                  return done(
                    new MailboxConnectionError({ mailbox: name, cause: Cause.squash(result.cause) }),
                    undefined
                  )
                }
                if (!result.value) return done(expired(message.id, message.receiptHandle), undefined)
                message.finalized = true
                done(undefined, undefined)
              }
            )
            return start ?? true
          }
        }

        class RedisMessage implements Message<A, R> {
          finalized = false
          /** The journal outlives the acknowledgement (the loop dead-letters the request: `DeliveryJournal.keep`). */
          kept = false
          constructor(
            readonly id: string,
            readonly body: A,
            readonly receiptHandle: string,
            readonly deliveryCount: number,
            private readonly enqueuedAtMillis: number,
            readonly replyTo: Option.Option<string>,
            readonly traceparent: string | undefined
          ) {}
          get enqueuedAt(): DateTime.Utc {
            return DateTime.unsafeMake(this.enqueuedAtMillis)
          }
          /** Runs `script` on this delivery; a 0 is a stale handle. */
          private leased(script: Script, keyArgs: ReadonlyArray<string>, extra: ReadonlyArray<string | number>) {
            return Effect.flatMap(
              store(() => run(script, [...keyArgs, nowArg(), this.id, this.receiptHandle, keys.message, ...extra])),
              (result) =>
                result === 0 || result === null ? Effect.fail(expired(this.id, this.receiptHandle)) : Effect.void
            )
          }
          get [Settles](): Sink {
            return sink
          }
          /** The message's step journal (`internal/journal.ts`): appended and cut only under this delivery's lease. */
          get [Journaled](): DeliveryJournal {
            return {
              identity: Effect.map(storeIdentity, (store) => `${store}.${keys.tag}.${this.id}`),
              // By position (the sorted set's score), at most maxSteps + 1; a member damaged by hand is the store's
              // failure (typed, as a statement refused), never a defect.
              load: Effect.flatMap(
                store(() => redis.zrange(keys.journal + this.id, 0, maxSteps)),
                (members) => {
                  const steps = members.map(stepOf)
                  const bad = members.find((_, index) => steps[index] === undefined)
                  return bad === undefined
                    ? Effect.succeed(steps as ReadonlyArray<StoredStep>)
                    : Effect.fail(
                      new MailboxConnectionError({
                        mailbox: name,
                        cause: new Error(`a journal step that is not one: ${bad.slice(0, 200)}`)
                      })
                    )
                }
              ),
              append: (step) =>
                this.leased("lhJournalAppend", [keys.hidden], [
                  keys.journal,
                  step.position,
                  JSON.stringify({
                    k: step.key,
                    e: step.entry,
                    ...(step.requestId === undefined ? {} : { r: step.requestId })
                  })
                ]),
              truncate: (from) => this.leased("lhJournalTruncate", [keys.hidden], [keys.journal, from]),
              keep: Effect.sync(() => {
                this.kept = true
              })
            }
          }
          get acknowledge(): Effect.Effect<void, ReceiptHandleExpiredError | MailboxConnectionError> {
            return Effect.flatMap(
              settler.submit({ id: this.id, handle: this.receiptHandle, keep: this.kept }),
              (settled) => {
                if (!settled) return Effect.fail(expired(this.id, this.receiptHandle))
                this.finalized = true
                return Effect.void
              }
            )
          }
          nack(
            visibilityTimeout?: Duration.DurationInput
          ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError | MailboxConnectionError> {
            return Either.match(validateVisibility("visibilityTimeout", visibilityTimeout), {
              onLeft: Effect.fail,
              onRight: (timeout) =>
                Effect.tap(
                  this.leased("lhNack", [keys.ready, keys.hidden], [Duration.toMillis(timeout), keys.wake]),
                  () =>
                    Effect.sync(() => {
                      this.finalized = true
                      wake()
                    })
                )
            })
          }
          extendVisibility(
            timeout: Duration.DurationInput
          ): Effect.Effect<void, ReceiptHandleExpiredError | InvalidParameterError | MailboxConnectionError> {
            return Either.match(validateVisibility("timeout", timeout), {
              onLeft: Effect.fail,
              onRight: (timeout) => this.leased("lhExtend", [keys.hidden], [Duration.toMillis(timeout)])
            })
          }
          reply(body: R): Effect.Effect<string, ReplyError, MailboxResolver> {
            return Effect.suspend((): Effect.Effect<string, ReplyError, MailboxResolver> => {
              const refused = FrontEnd.replyRefused(this.id, this.finalized, this.replyTo)
              if (refused !== undefined) return Effect.fail(refused)
              return Effect.flatMap(
                MailboxResolver,
                (resolver) =>
                  Effect.flatMap(
                    resolver.resolve(Option.getOrThrow(this.replyTo)),
                    (target) => target.send(body)
                  )
              )
            })
          }
          replyAndAcknowledge(
            body: R
          ): Effect.Effect<string, ReplyError | ReceiptHandleExpiredError, MailboxResolver> {
            return Effect.gen(this, function*() {
              const refused = FrontEnd.replyRefused(this.id, this.finalized, this.replyTo)
              if (refused !== undefined) return yield* Effect.fail(refused)
              const resolver = yield* MailboxResolver
              const target = yield* resolver.resolve(Option.getOrThrow(this.replyTo))
              const local = FrontEnd.fieldsOf(target)[FrontEnd.LocalId] as Local | undefined
              // One script only where both queues' keys are on one server: a cluster keeps each queue on the slot
              // of its own tag.
              if (local === undefined || local.redis !== redis || (redis.isCluster && local.keys.tag !== keys.tag)) {
                // Another store, or a cluster: the reply is sent, then the delivery acknowledged — between them the
                // lease can run out (then the request is redelivered and replied again: at least once). A stale
                // delivery sends none.
                yield* this.leased("lhCheck", [keys.hidden], [])
                const id = yield* target.send(body)
                yield* this.acknowledge
                return id
              }
              // A queue of this server: the reply and the acknowledgement in one script.
              const encoded: Either.Either<string, string> = local.encode(body)
              if (Either.isLeft(encoded)) {
                return yield* Effect.fail(new SerializationError({ mailbox: local.keys.name, reason: encoded.left }))
              }
              const text = encoded.right
              const traceparent = yield* Effect.withFiberRuntime<string | undefined>((fiber) =>
                Effect.succeed(traceparentOf(fiber.currentSpan))
              )
              const result = yield* store(() =>
                run("lhReplyAndAcknowledge", [
                  keys.hidden,
                  local.keys.ready,
                  local.keys.hidden,
                  local.keys.seq,
                  nowArg(),
                  this.id,
                  this.receiptHandle,
                  keys.message,
                  local.keys.message,
                  local.maxSize ?? 0,
                  text,
                  traceparent ?? "",
                  local.keys.wake,
                  keys.journal,
                  this.kept ? "1" : "0"
                ])
              )
              if (result === 0) return yield* Effect.fail(expired(this.id, this.receiptHandle))
              if (result === -1) {
                return yield* Effect.fail(new MailboxFullError({ mailbox: local.keys.name, maxSize: local.maxSize! }))
              }
              this.finalized = true
              local.wake()
              return String(result)
            })
          }
        }

        const insert: FrontEnd.Driver<A, R>["insert"] = (body, delayMillis, replyTo, traceparent) => {
          const encoded = encode(body)
          if (Either.isLeft(encoded)) {
            return Effect.fail(new SerializationError({ mailbox: name, reason: encoded.left }))
          }
          return Effect.flatMap(
            store(() =>
              run("lhSend", [
                keys.ready,
                keys.hidden,
                keys.seq,
                nowArg(),
                delayMillis,
                maxSize ?? 0,
                keys.message,
                encoded.right,
                replyTo ?? "",
                traceparent ?? "",
                keys.wake
              ])
            ),
            (id) => {
              if (id === -1) return Effect.fail(new MailboxFullError({ mailbox: name, maxSize: maxSize! }))
              wake()
              return Effect.succeed(String(id))
            }
          )
        }

        /**
         * Messages claimed for a receive that was interrupted while its script was on its way: given back (visible
         * again, the delivery not counted), or they would stay hidden for the whole visibility under a handle nobody
         * holds. In the background: the receiver has gone.
         */
        const releaseClaimed = (rows: unknown) => {
          const pairs = (rows as ReadonlyArray<ReadonlyArray<string | number>>).flatMap(([id, handle]) => [
            String(id),
            String(handle)
          ])
          if (pairs.length === 0) return
          run("lhRelease", [keys.hidden, keys.ready, nowArg(), keys.message, keys.wake, ...pairs]).catch(() =>
            undefined
          )
        }
        const claimScript = (args: ReadonlyArray<string | number>) =>
          Effect.async<unknown, MailboxConnectionError>((resume) => {
            let interrupted = false
            run("lhClaim", args).then(
              (rows) => (interrupted ? releaseClaimed(rows) : resume(Effect.succeed(rows))),
              (cause) => {
                if (!interrupted) resume(Effect.fail(new MailboxConnectionError({ mailbox: name, cause })))
              }
            )
            return Effect.sync(() => {
              interrupted = true
            })
          })
        const claim: FrontEnd.Driver<A, R>["claim"] = (max, visibilityMillis) =>
          Effect.flatMap(
            claimScript([
              keys.ready,
              keys.hidden,
              keys.paused,
              nowArg(),
              max,
              visibilityMillis,
              keys.message,
              ...Array.from({ length: max }, () => randomUUID())
            ]),
            (rows) => {
              const received: Array<Message<A, R>> = []
              const undecodable: Array<{ readonly id: string; readonly handle: string; readonly reason: string }> = []
              for (const row of rows as ReadonlyArray<ReadonlyArray<string | number>>) {
                const [id, handle, deliveries, text, enqueuedAt, replyTo, traceparent] = row
                const body = decode(String(text))
                if (Either.isLeft(body)) {
                  // Set aside as a dead letter (below): redelivered, it would come back at every visibility's end.
                  undecodable.push({ id: String(id), handle: String(handle), reason: storableText(body.left, 1_000) })
                  continue
                }
                received.push(
                  new RedisMessage(
                    String(id),
                    body.right,
                    String(handle),
                    Number(deliveries),
                    Number(enqueuedAt),
                    replyTo === "" ? Option.none() : Option.some(String(replyTo)),
                    traceparent === "" ? undefined : validTraceparent(String(traceparent))
                  )
                )
              }
              if (undecodable.length === 0) return Effect.succeed(received)
              return Effect.as(
                Effect.zipRight(
                  store(() =>
                    run("lhDeadLetter", [
                      keys.hidden,
                      keys.dead,
                      nowArg(),
                      keys.message,
                      keys.deadLetter,
                      ...undecodable.flatMap(({ handle, id, reason }) => [id, handle, reason])
                    ])
                  ).pipe(
                    Effect.catchAll((error) => Effect.logWarning("MailboxRedis: a dead letter not set aside", error))
                  ),
                  Effect.forEach(
                    undecodable,
                    ({ id, reason }) =>
                      Effect.logWarning(`MailboxRedis: message ${id} of "${name}" cannot be decoded: dead-lettered`)
                        .pipe(Effect.annotateLogs("reason", reason)),
                    { discard: true }
                  )
                ),
                received
              )
            }
          )

        const mailbox = FrontEnd.make<A, R>(name, {
          insert,
          claim,
          nextVisibleIn: Effect.map(
            store(() => run("lhNextVisible", [keys.ready, keys.hidden, keys.paused, nowArg()])),
            (result) => (result === null ? undefined : Number(result))
          ),
          arm: () => {
            listen()
            return signal
          },
          count: Effect.map(store(() => run("lhCount", [keys.ready, keys.hidden])), Number),
          purge: Effect.map(store(() => run("lhPurge", [keys.ready, keys.hidden, keys.message, keys.journal])), Number),
          poll: { firstMillis: 10, maxMillis: 250 },
          sink,
          local: { keys: { ...keys, name }, redis, wake, encode, maxSize } satisfies Local
        }, clock)
        return Effect.as(Effect.addFinalizer(() => Effect.zipRight(mailbox.close, unlisten)), mailbox)
      })
  )

/** Pauses the queue of `mailbox` (made by `make`): every process's receivers get nothing until `resume`. */
export const pause = (
  redis: Client,
  prefix: string | undefined,
  name: string
): Effect.Effect<void, MailboxConnectionError> =>
  Effect.tryPromise({
    try: () => redis.set(Scripts.keysOf(prefix ?? "leasehold:", name).paused, "1"),
    catch: (cause) => new MailboxConnectionError({ mailbox: name, cause })
  })

/** Resumes the queue: receivers get its messages again (this process's sleeping ones at once). */
export const resume = <A, R>(
  redis: Client,
  prefix: string | undefined,
  mailbox: Mailbox<A, R>
): Effect.Effect<void, MailboxConnectionError> =>
  Effect.tap(
    Effect.tryPromise({
      try: () => redis.del(Scripts.keysOf(prefix ?? "leasehold:", mailbox.name).paused),
      catch: (cause) => new MailboxConnectionError({ mailbox: mailbox.name, cause })
    }),
    () =>
      Effect.sync(() => {
        const local = FrontEnd.fieldsOf(mailbox)[FrontEnd.LocalId] as { readonly wake?: () => void } | undefined
        local?.wake?.()
      })
  )
