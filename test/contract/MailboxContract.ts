/**
 * The mailbox contract: every behaviour a `Mailbox` backend must have, run
 * against whatever `make` builds. Time is driven with `TestClock`, so a
 * backend passes only if it reads time from `Clock`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Exit, Fiber, Option, type Scope, TestClock } from "effect"
import { type Mailbox, MailboxResolver, parentSpan, settleAll } from "../../src/Mailbox.js"
import { refusedOptions } from "../helpers.js"

/** Builds an empty mailbox of string bodies and string replies, removed when the scope closes. */
export type MakeMailbox = (options: {
  readonly name: string
  readonly maxSize?: number
}) => Effect.Effect<Mailbox<string, string>, unknown, Scope.Scope>

const bodies = (messages: ReadonlyArray<{ readonly body: string }>) => messages.map((m) => m.body)

/** Lets forked fibers run up to their next wait. */
const settle = Effect.repeatN(Effect.yieldNow(), 20)

/** How a backend pauses and resumes a mailbox's queue (the SQL backends: in the database; memory: in process). */
export interface Pausing {
  readonly pause: (mailbox: Mailbox<string, string>) => Effect.Effect<void, unknown>
  readonly resume: (mailbox: Mailbox<string, string>) => Effect.Effect<void, unknown>
}

export const mailboxContract = (label: string, make: MakeMailbox, pausing?: Pausing) =>
  describe(`Mailbox contract: ${label}`, () => {
    const fresh = (maxSize?: number) =>
      make(maxSize === undefined ? { name: "requests" } : { name: "requests", maxSize })

    describe("send and receive", () => {
      it.scoped("delivers in enqueue order: 5 messages, maxMessages 3", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          for (const body of ["a", "b", "c", "d", "e"]) yield* mailbox.send(body)
          const first = yield* mailbox.receive({ maxMessages: 3 })
          expect(bodies(first)).toEqual(["a", "b", "c"])
          const second = yield* mailbox.receive({ maxMessages: 3 })
          expect(bodies(second)).toEqual(["d", "e"])
          expect(yield* mailbox.receive({ maxMessages: 3 })).toEqual([])
        }))

      it.scoped("gives each message an id, a fresh receipt handle per delivery and a delivery count", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const id = yield* mailbox.send("a")
          const [first] = yield* mailbox.receive({ visibilityTimeout: "1 second" })
          expect(first!.id).toBe(id)
          expect(first!.deliveryCount).toBe(1)
          expect(Option.isNone(first!.replyTo)).toBe(true)
          yield* TestClock.adjust("1 second")
          const [second] = yield* mailbox.receive()
          expect(second!.id).toBe(id)
          expect(second!.deliveryCount).toBe(2)
          expect(second!.receiptHandle).not.toBe(first!.receiptHandle)
          expect(second!.receiptHandle.length).toBeGreaterThanOrEqual(32)
        }))

      it.scoped("clamps maxMessages to 1..10", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          for (let i = 0; i < 12; i++) yield* mailbox.send(`m${i}`)
          expect((yield* mailbox.receive({ maxMessages: 0 })).length).toBe(1)
          expect((yield* mailbox.receive({ maxMessages: -5 })).length).toBe(1)
          expect((yield* mailbox.receive({ maxMessages: 50 })).length).toBe(10)
        }))

      it.scoped("a delayed message stays invisible for its delay", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("later", { delay: "10 seconds" })
          expect(yield* mailbox.receive()).toEqual([])
          expect(yield* mailbox.approximateCount).toBe(1)
          yield* TestClock.adjust("10 seconds")
          expect(bodies(yield* mailbox.receive())).toEqual(["later"])
        }))

      it.scoped("4 senders × 25 messages are all received and acknowledged exactly once", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const sent = yield* Effect.forEach(
            [0, 1, 2, 3],
            (sender) =>
              Effect.forEach(
                Array.from({ length: 25 }, (_, i) => `${sender}-${i}`),
                (body) => Effect.zipRight(Effect.yieldNow(), mailbox.send(body))
              ),
            { concurrency: "unbounded" }
          )
          expect(sent.flat().length).toBe(100)
          const seen: Array<string> = []
          yield* Effect.forEach(
            [0, 1, 2, 3],
            () =>
              Effect.gen(function*() {
                for (;;) {
                  const batch = yield* mailbox.receive({ maxMessages: 3 })
                  if (batch.length === 0) return
                  for (const message of batch) {
                    seen.push(message.body)
                    yield* message.acknowledge
                  }
                  yield* Effect.yieldNow()
                }
              }),
            { concurrency: "unbounded", discard: true }
          )
          expect(seen.length).toBe(100)
          expect(new Set(seen).size).toBe(100)
          expect(yield* mailbox.approximateCount).toBe(0)
        }))
    })

    describe("acknowledge, nack, extend", () => {
      it.scoped("acknowledge deletes; a second acknowledge fails ReceiptHandleExpiredError", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive()
          yield* message!.acknowledge
          const error = yield* Effect.flip(message!.acknowledge)
          expect(error._tag).toBe("ReceiptHandleExpiredError")
          expect(yield* mailbox.approximateCount).toBe(0)
          yield* TestClock.adjust("1 hour")
          expect(yield* mailbox.receive()).toEqual([])
        }))

      it.scoped("nack(0) makes the message visible at once, with delivery count 2", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive()
          yield* message!.nack(0)
          const [again] = yield* mailbox.receive()
          expect(again!.body).toBe("a")
          expect(again!.deliveryCount).toBe(2)
          expect((yield* Effect.flip(message!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        }))

      it.scoped("nack(d) hides the message for d and kills the old handle", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive()
          yield* message!.nack("5 seconds")
          expect((yield* Effect.flip(message!.extendVisibility("1 minute")))._tag).toBe("ReceiptHandleExpiredError")
          expect((yield* Effect.flip(message!.nack()))._tag).toBe("ReceiptHandleExpiredError")
          yield* TestClock.adjust("4999 millis")
          expect(yield* mailbox.receive()).toEqual([])
          yield* TestClock.adjust("1 millis")
          const [again] = yield* mailbox.receive()
          expect(again!.deliveryCount).toBe(2)
        }))

      it.scoped("visibility 1 s, then +2 s: redelivered with count 2, and the old handle is stale", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive({ visibilityTimeout: "1 second" })
          expect(yield* mailbox.receive()).toEqual([])
          yield* TestClock.adjust("2 seconds")
          const [again] = yield* mailbox.receive()
          expect(again!.deliveryCount).toBe(2)
          for (
            const stale of [message!.acknowledge, message!.nack(0), message!.extendVisibility("1 minute")]
          ) {
            expect((yield* Effect.flip(stale))._tag).toBe("ReceiptHandleExpiredError")
          }
          yield* again!.acknowledge
        }))

      it.scoped("a handle expires at the instant its visibility ends", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive({ visibilityTimeout: "1 second" })
          yield* TestClock.adjust("1 second")
          expect((yield* Effect.flip(message!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        }))

      it.scoped("extendVisibility prevents redelivery and counts from now", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive({ visibilityTimeout: "2 seconds" })
          yield* TestClock.adjust("1 second")
          yield* message!.extendVisibility("10 seconds") // now visible at 11 s, not 2 s
          yield* TestClock.adjust("9999 millis")
          expect(yield* mailbox.receive()).toEqual([])
          yield* TestClock.adjust("1 millis")
          const [again] = yield* mailbox.receive()
          expect(again?.deliveryCount).toBe(2)
          yield* again!.extendVisibility("1 minute")
          yield* TestClock.adjust("59 seconds")
          expect(yield* mailbox.receive()).toEqual([])
          yield* again!.acknowledge
        }))

      it.scoped("a visibility timeout of 0 makes the message visible again at once", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [first] = yield* mailbox.receive({ visibilityTimeout: 0 })
          const [second] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
          expect(second!.id).toBe(first!.id)
          expect(second!.deliveryCount).toBe(2)
        }))
    })

    describe("long poll", () => {
      it.scoped("returns as soon as another fiber sends", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const receiving = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* settle
          expect(Option.isNone(yield* Fiber.poll(receiving))).toBe(true)
          yield* mailbox.send("hello")
          const received = yield* Fiber.join(receiving)
          expect(bodies(received)).toEqual(["hello"])
        }))

      it.scoped("an empty long poll returns empty after its wait", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const receiving = yield* Effect.fork(mailbox.receive({ waitTime: "5 seconds" }))
          yield* settle
          yield* TestClock.adjust("4999 millis")
          expect(Option.isNone(yield* Fiber.poll(receiving))).toBe(true)
          yield* TestClock.adjust("1 millis")
          expect(yield* Fiber.join(receiving)).toEqual([])
        }))

      it.scoped("returns when an in-flight message's visibility expires during the wait", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          yield* mailbox.receive({ visibilityTimeout: "3 seconds" })
          const receiving = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* settle
          yield* TestClock.adjust("3 seconds")
          const [again] = yield* Fiber.join(receiving)
          expect(again!.deliveryCount).toBe(2)
        }))

      it.scoped("returns when another receiver nacks", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive({ visibilityTimeout: "1 minute" })
          const receiving = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* settle
          yield* message!.nack(0)
          expect(bodies(yield* Fiber.join(receiving))).toEqual(["a"])
        }))

      it.scoped("close wakes a blocked receiver, which returns empty; later receives return empty at once", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const receiving = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* settle
          yield* mailbox.close
          expect(yield* Fiber.join(receiving)).toEqual([])
          expect(yield* mailbox.isClosed).toBe(true)
          expect(yield* mailbox.receive({ waitTime: "20 seconds" })).toEqual([])
          expect((yield* Effect.flip(mailbox.send("late")))._tag).toBe("MailboxClosedError")
        }))
    })

    if (pausing !== undefined) {
      describe("pause and resume", () => {
        it.scoped("a paused queue's receivers get nothing; sends go on; after resume they receive", () =>
          Effect.gen(function*() {
            const mailbox = yield* fresh()
            yield* mailbox.send("a")
            yield* pausing.pause(mailbox)
            yield* mailbox.send("b")
            expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
            expect(yield* mailbox.approximateCount).toBe(2)
            yield* pausing.resume(mailbox)
            expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual(["a", "b"])
          }))

        it.scoped("a long poll of a paused queue waits its whole wait and returns empty; one waiting when resumed receives", () =>
          Effect.gen(function*() {
            const mailbox = yield* fresh()
            yield* mailbox.send("a")
            yield* pausing.pause(mailbox)
            const waiting = yield* mailbox.receive({ waitTime: "5 seconds" }).pipe(Effect.fork)
            yield* settle
            yield* TestClock.adjust("2 seconds")
            yield* settle
            expect(Option.isNone(yield* Fiber.poll(waiting))).toBe(true)
            yield* TestClock.adjust("3 seconds")
            expect(yield* Fiber.join(waiting)).toEqual([])
            // A receiver waiting when the queue is resumed takes the message before its wait ends.
            const next = yield* mailbox.receive({ waitTime: "20 seconds" }).pipe(Effect.fork)
            yield* settle
            yield* pausing.resume(mailbox)
            yield* settle
            yield* TestClock.adjust("2 seconds")
            yield* settle
            expect(bodies(yield* Fiber.join(next))).toEqual(["a"])
          }))

        it.scoped("a delivery received before the pause is still settled: acknowledged, it is gone", () =>
          Effect.gen(function*() {
            const mailbox = yield* fresh()
            yield* mailbox.send("a")
            const [message] = yield* mailbox.receive()
            yield* pausing.pause(mailbox)
            yield* message!.extendVisibility("1 minute")
            yield* message!.acknowledge
            yield* pausing.resume(mailbox)
            expect(yield* mailbox.approximateCount).toBe(0)
          }))
      })
    }

    describe("capacity and housekeeping", () => {
      it.scoped("maxSize bounds unacknowledged messages: MailboxFullError, room again after an ack", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh(2)
          yield* mailbox.send("a")
          yield* mailbox.send("b")
          const error = yield* Effect.flip(mailbox.send("c"))
          expect(error._tag).toBe("MailboxFullError")
          const [message] = yield* mailbox.receive()
          yield* mailbox.send("c").pipe(Effect.flip) // in flight still counts
          yield* message!.acknowledge
          yield* mailbox.send("c")
        }))

      it.scoped("concurrent sends: each gets its own id, a bounded mailbox takes exactly maxSize of them", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh(5)
          const bodies = Array.from({ length: 8 }, (_, i) => `m${i}`)
          const results = yield* Effect.forEach(bodies, (body) => Effect.either(mailbox.send(body)), {
            concurrency: "unbounded"
          })
          const accepted = new Map(
            results.flatMap((result, i) => Either.isRight(result) ? [[result.right, bodies[i]]] : [])
          )
          expect(accepted.size).toBe(5)
          expect(results.flatMap((result) => Either.isLeft(result) ? [result.left._tag] : [])).toEqual(
            Array(3).fill("MailboxFullError")
          )
          const received = yield* mailbox.receive({ maxMessages: 10 })
          expect(new Map(received.map((message) => [message.id, message.body]))).toEqual(accepted)
        }))

      it.scoped("approximateCount counts visible, delayed and in-flight messages; purge deletes them all", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("visible")
          yield* mailbox.send("delayed", { delay: "1 minute" })
          yield* mailbox.send("in flight")
          yield* mailbox.receive() // takes "visible"
          expect(yield* mailbox.approximateCount).toBe(3)
          expect(yield* mailbox.purge).toBe(3)
          expect(yield* mailbox.approximateCount).toBe(0)
          yield* TestClock.adjust("2 minutes")
          expect(yield* mailbox.receive({ maxMessages: 10 })).toEqual([])
        }))

      it.scoped("a purged message's handle is stale", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive()
          yield* mailbox.purge
          expect((yield* Effect.flip(message!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        }))
    })

    describe("validation", () => {
      const invalid = <A, E extends { readonly _tag: string }>(effect: Effect.Effect<A, E>) =>
        Effect.map(Effect.flip(effect), (error) => {
          expect(error._tag).toBe("InvalidParameterError")
          return error as unknown as { readonly parameter: string; readonly message: string }
        })

      it.scoped("make: one rule for names and maxSize on every backend, refused with a ParseError naming it", () =>
        Effect.gen(function*() {
          const cases: ReadonlyArray<readonly [string, string, { readonly name: string; readonly maxSize?: number }]> =
            [
              ["name", "must be a non-empty string", { name: "" }],
              ["name", "must not contain control characters", { name: "a\u0000b" }],
              ["name", "must be at most 200 characters", { name: "x".repeat(201) }],
              ["name", "must not contain control characters", { name: "a\u0085b" }],
              // A lone surrogate has no UTF-8 form: PostgreSQL's driver sent U+FFFD for each, merging queues.
              ["name", "must be well-formed Unicode", { name: "\ud800" }],
              ["name", "must be well-formed Unicode", { name: "\udc00" }],
              ["name", "must be well-formed Unicode", { name: "a\ud83d" }],
              ["maxSize", "must be a positive integer", { name: "ok", maxSize: 0 }],
              ["maxSize", "must be a positive integer", { name: "ok", maxSize: -1 }],
              ["maxSize", "must be a positive integer", { name: "ok", maxSize: 1.5 }]
            ]
          for (const [option, reason, options] of cases) {
            // A typed failure on every backend (the memory backend's too), never a defect.
            const error = yield* Effect.flip(make(options))
            expect(refusedOptions(error)).toEqual([option])
            expect((error as Error).message).toContain(reason)
          }
          expect((yield* make({ name: "x".repeat(200) })).name).toHaveLength(200)
        }))

      it.scoped("names that differ are different queues: U+FFFD, an emoji's pair and their neighbours", () =>
        Effect.gen(function*() {
          const names = ["\ufffd", "\ud83d\ude00", "\ud83d\ude01", "x\ufffd"]
          const mailboxes = yield* Effect.forEach(names, (name) => make({ name }))
          yield* Effect.forEach(mailboxes, (mailbox, index) => mailbox.send(`to ${index}`))
          for (const [index, mailbox] of mailboxes.entries()) {
            expect(mailbox.name).toBe(names[index])
            expect(bodies(yield* mailbox.receive({ maxMessages: 10 }))).toEqual([`to ${index}`])
          }
        }))

      it.scoped("send: replyTo keeps the name rule, refused before anything is stored", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          for (const replyTo of ["", "a\u0000b", "tab\there", "x".repeat(100_000), "\ud800", "\udc00x"]) {
            const refused = yield* invalid(mailbox.send("hi", { replyTo }))
            expect(refused.parameter).toBe("replyTo")
          }
          expect(yield* mailbox.approximateCount).toBe(0)
          yield* mailbox.send("ok", { replyTo: "\ud83d\ude00 replies" })
          const [message] = yield* mailbox.receive()
          expect(message!.replyTo).toEqual(Option.some("\ud83d\ude00 replies"))
        }))

      it.scoped("one bad replyTo among concurrent sends fails only its own send", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const outcomes = yield* Effect.all(
            ["first", "a\u0000b", "third", "\udc00", "fifth"].map((replyTo, index) =>
              Effect.either(mailbox.send(`m${index}`, { replyTo }))
            ),
            { concurrency: "unbounded" }
          )
          expect(outcomes.map(Either.isRight)).toEqual([true, false, true, false, true])
          const received = yield* mailbox.receive({ maxMessages: 10 })
          expect(bodies(received).sort()).toEqual(["m0", "m2", "m4"])
        }))

      it.scoped("receive: visibilityTimeout 0..12 h and waitTime 0..20 s", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const vt = yield* invalid(
            mailbox.receive({ visibilityTimeout: "12 hours" }).pipe(
              Effect.zipRight(mailbox.receive({ visibilityTimeout: Duration.sum("12 hours", "1 millis") }))
            )
          )
          expect(vt.parameter).toBe("visibilityTimeout")
          expect(vt.message).toContain("12h")
          expect((yield* invalid(mailbox.receive({ visibilityTimeout: -1 }))).parameter).toBe("visibilityTimeout")
          expect((yield* invalid(mailbox.receive({ waitTime: "21 seconds" }))).parameter).toBe("waitTime")
          expect((yield* invalid(mailbox.receive({ waitTime: "-1 seconds" as Duration.DurationInput }))).parameter)
            .toBe("waitTime")
          expect((yield* invalid(mailbox.receive({ waitTime: "soon" as Duration.DurationInput }))).parameter)
            .toBe("waitTime")
          yield* mailbox.receive({ visibilityTimeout: 0, waitTime: 0 })
          const fiber = yield* Effect.fork(mailbox.receive({ waitTime: "20 seconds" }))
          yield* TestClock.adjust("20 seconds")
          expect(yield* Fiber.join(fiber)).toEqual([])
        }))

      it.scoped("send: delay 0..15 min", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("ok", { delay: "15 minutes" })
          expect((yield* invalid(mailbox.send("late", { delay: "16 minutes" }))).parameter).toBe("delay")
          expect((yield* invalid(mailbox.send("early", { delay: -1 }))).parameter).toBe("delay")
          expect(yield* mailbox.approximateCount).toBe(1)
        }))

      it.scoped("nack and extendVisibility: 0..12 h, and a bad value leaves the lease untouched", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          yield* mailbox.send("a")
          const [message] = yield* mailbox.receive()
          yield* invalid(message!.nack("13 hours"))
          yield* invalid(message!.nack(-1))
          yield* invalid(message!.extendVisibility("13 hours"))
          yield* invalid(message!.extendVisibility(Number.NaN))
          yield* message!.extendVisibility("12 hours")
          // A fraction of a millisecond is rounded up, the same everywhere (PostgreSQL's BIGINT refused "1.5").
          yield* message!.extendVisibility(Duration.millis(1.5))
          yield* message!.acknowledge
          yield* mailbox.send("b", { delay: 0.5 })
          yield* TestClock.adjust("1 millis")
          const [fractional] = yield* mailbox.receive({ visibilityTimeout: 2.5 })
          expect(fractional!.body).toBe("b")
          yield* fractional!.nack(0.25)
        }))
    })

    describe("replies", () => {
      it.scoped("reply goes to the mailbox named by replyTo, resolved through MailboxResolver", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          const responses = yield* make({ name: "responses" })
          yield* requests.send("ping", { replyTo: "responses" })
          const [message] = yield* requests.receive()
          expect(Option.getOrThrow(message!.replyTo)).toBe("responses")
          const replyId = yield* message!.reply("pong").pipe(
            Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, responses))
          )
          yield* message!.acknowledge
          const [reply] = yield* responses.receive()
          expect(reply!.body).toBe("pong")
          expect(reply!.id).toBe(replyId)
        }))

      it.scoped("reply fails ReplyNotAvailableError without replyTo and MessageFinalizedError after settling", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          const responses = yield* make({ name: "responses" })
          const resolver = MailboxResolver.fromMailboxes(requests, responses)
          yield* requests.send("no reply")
          yield* requests.send("acked", { replyTo: "responses" })
          yield* requests.send("nacked", { replyTo: "responses" })
          const [noReply, acked, nacked] = yield* requests.receive({ maxMessages: 3 })
          const reply = (message: typeof noReply) =>
            message!.reply("x").pipe(Effect.provideService(MailboxResolver, resolver), Effect.flip)
          expect((yield* reply(noReply))._tag).toBe("ReplyNotAvailableError")
          yield* acked!.acknowledge
          expect((yield* reply(acked))._tag).toBe("MessageFinalizedError")
          yield* nacked!.nack("1 minute")
          expect((yield* reply(nacked))._tag).toBe("MessageFinalizedError")
          expect(yield* responses.approximateCount).toBe(0)
        }))

      it.scoped("replyAndAcknowledge replies and acknowledges; a stale delivery sends no reply", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          const responses = yield* make({ name: "responses" })
          const resolver = MailboxResolver.fromMailboxes(requests, responses)
          yield* requests.send("ping", { replyTo: "responses" })
          const [stale] = yield* requests.receive({ visibilityTimeout: "1 second" })
          yield* TestClock.adjust("1 second")
          const [current] = yield* requests.receive()
          const staleError = yield* stale!.replyAndAcknowledge("late").pipe(
            Effect.provideService(MailboxResolver, resolver),
            Effect.flip
          )
          expect(staleError._tag).toBe("ReceiptHandleExpiredError")
          expect(yield* responses.approximateCount).toBe(0)
          const replyId = yield* current!.replyAndAcknowledge("pong").pipe(
            Effect.provideService(MailboxResolver, resolver)
          )
          expect(yield* requests.approximateCount).toBe(0)
          const [reply] = yield* responses.receive()
          expect(reply!.body).toBe("pong")
          expect(reply!.id).toBe(replyId)
          expect((yield* Effect.flip(current!.acknowledge))._tag).toBe("ReceiptHandleExpiredError")
        }))

      it.scoped("settleAll settles a group, one outcome per message in order, nothing lost or sent twice", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          const responses = yield* make({ name: "responses" })
          const resolver = MailboxResolver.fromMailboxes(requests, responses)
          yield* requests.send("stale", { replyTo: "responses" })
          const [stale] = yield* requests.receive({ visibilityTimeout: "1 second" })
          yield* TestClock.adjust("1 second")
          for (const body of ["reply", "ack-only", "no-reply-to"]) {
            yield* requests.send(body, body === "no-reply-to" ? undefined : { replyTo: "responses" })
          }
          yield* requests.send("lost", { replyTo: "nowhere" })
          const received = yield* requests.receive({ maxMessages: 10 })
          const byBody = new Map(received.map((message) => [message.body, message]))
          const outcomes = yield* settleAll([
            { message: byBody.get("reply")!, reply: Option.some("pong") },
            { message: stale!, reply: Option.some("late") },
            { message: byBody.get("ack-only")!, reply: Option.none() },
            { message: byBody.get("no-reply-to")!, reply: Option.some("dropped") },
            { message: byBody.get("lost")!, reply: Option.some("pong") }
          ]).pipe(Effect.provideService(MailboxResolver, resolver))
          const [replied, expired, acked, noReplyTo, unresolved] = outcomes
          expect(Either.isRight(replied!) && typeof replied.right).toBe("string")
          expect(Either.isLeft(expired!) && expired.left._tag).toBe("ReceiptHandleExpiredError")
          expect(acked).toEqual(Either.right(undefined))
          expect(noReplyTo).toEqual(Either.right(undefined))
          expect(Either.isLeft(unresolved!) && unresolved.left._tag).toBe("MailboxResolutionError")
          // One reply (the stale delivery sent none); only the unresolved request is left, still leased.
          const replies = yield* responses.receive({ maxMessages: 10 })
          expect(bodies(replies)).toEqual(["pong"])
          expect(replies[0]!.id).toBe(Either.getOrThrow(replied!))
          expect(yield* requests.approximateCount).toBe(2) // "stale"'s current delivery, and "lost"
          yield* byBody.get("lost")!.acknowledge
          expect(yield* Effect.provideService(settleAll([]), MailboxResolver, resolver)).toEqual([])
        }))

      it.scoped("a reply to an unknown name fails MailboxResolutionError naming it", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          yield* requests.send("ping", { replyTo: "nowhere" })
          const [message] = yield* requests.receive()
          const error = yield* message!.reply("pong").pipe(
            Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests)),
            Effect.flip
          )
          expect(error._tag).toBe("MailboxResolutionError")
          expect(error.message).toContain("nowhere")
          // The request is untouched and can still be settled.
          yield* message!.acknowledge
        }))
    })

    describe("trace context", () => {
      /** The W3C `traceparent` of the span current where this runs. */
      const traceparentHere = Effect.map(
        Effect.currentSpan,
        (span) => `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`
      )

      it.scoped("send stores the current span's W3C traceparent; without a span, none", () =>
        Effect.gen(function*() {
          const mailbox = yield* fresh()
          const sent = yield* Effect.zipLeft(traceparentHere, mailbox.send("traced")).pipe(Effect.withSpan("sender"))
          yield* mailbox.send("untraced")
          expect(sent).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/)
          const [traced, untraced] = yield* mailbox.receive({ maxMessages: 2 })
          expect(traced!.traceparent).toBe(sent)
          expect(untraced!.traceparent).toBeUndefined()
          // A parent for the receiver's span: the sender's trace and span.
          const parent = Option.getOrThrow(parentSpan(traced!))
          expect([parent.traceId, parent.spanId, parent.sampled]).toEqual([sent.slice(3, 35), sent.slice(36, 52), true])
          expect(Option.isNone(parentSpan(untraced!))).toBe(true)
          // Redelivered, it keeps it.
          yield* traced!.nack()
          const [again] = yield* mailbox.receive()
          expect(again!.traceparent).toBe(sent)
        }))

      it.scoped("a reply stores the span current where it is sent, or the span its settlement names", () =>
        Effect.gen(function*() {
          const requests = yield* make({ name: "requests" })
          const responses = yield* make({ name: "responses" })
          const resolve = Effect.provideService(MailboxResolver, MailboxResolver.fromMailboxes(requests, responses))
          for (const body of ["reply", "replyAndAcknowledge", "group-1", "group-2", "untraced"]) {
            yield* requests.send(body, { replyTo: "responses" })
          }
          const received = yield* requests.receive({ maxMessages: 10 })
          const byBody = new Map(received.map((message) => [message.body, message]))
          const expected = new Map<string, string | undefined>()
          expected.set(
            "reply",
            yield* Effect.zipLeft(traceparentHere, resolve(byBody.get("reply")!.reply("reply"))).pipe(
              Effect.withSpan("a")
            )
          )
          yield* byBody.get("reply")!.acknowledge
          expected.set(
            "replyAndAcknowledge",
            yield* Effect.zipLeft(
              traceparentHere,
              resolve(byBody.get("replyAndAcknowledge")!.replyAndAcknowledge("replyAndAcknowledge"))
            ).pipe(Effect.withSpan("b"))
          )
          // A group settled in one span, one settlement naming a span of its own (a worker's background settle).
          const own = yield* Effect.currentSpan.pipe(Effect.withSpan("own"))
          const group = yield* Effect.zipLeft(
            traceparentHere,
            resolve(settleAll([
              { message: byBody.get("group-1")!, reply: Option.some("group-1") },
              { message: byBody.get("group-2")!, reply: Option.some("group-2"), span: own }
            ]))
          ).pipe(Effect.withSpan("group"))
          expected.set("group-1", group)
          expected.set("group-2", `00-${own.traceId}-${own.spanId}-01`)
          yield* resolve(byBody.get("untraced")!.replyAndAcknowledge("untraced"))
          expected.set("untraced", undefined)
          const replies = yield* responses.receive({ maxMessages: 10 })
          expect(new Map(replies.map((reply) => [reply.body, reply.traceparent]))).toEqual(expected)
          expect(new Set(expected.values()).size).toBe(5)
        }))
    })

    it.scoped("closing the scope closes the mailbox", () =>
      Effect.gen(function*() {
        const mailbox = yield* Effect.scoped(fresh())
        expect(yield* mailbox.isClosed).toBe(true)
        expect(Exit.isFailure(yield* Effect.exit(mailbox.send("x")))).toBe(true)
      }))
  })
