/**
 * A stubbed `HttpClient` for the streaming provider tests: each request is answered with server-sent events
 * from a script, each event sent after its own delay slept on Effect's `Clock` — so `TestClock` decides when
 * every chunk arrives — and a script can stall (the connection stays open and nothing more comes). The bytes
 * go through a web `Response` body (a large event in pieces of 64 Ki characters, as a socket splits it), so the provider's own SSE parsing (`@effect/experimental`'s `Sse`) reads
 * them as it would read a socket. The request bodies are recorded, and so are the bytes the stub wrote: a reply
 * can be an endless iterable (a provider that never stops writing), pulled one event at a time as the reader
 * asks for them, so `written` shows how far the reader read before it cancelled.
 */
import { HttpClient, HttpClientResponse } from "@effect/platform"
import type { Duration } from "effect"
import { Effect, Stream } from "effect"

/** One event of a reply: its SSE `event:` name, its JSON `data:`, and how long after the previous one it comes. */
export interface SseEvent {
  readonly after?: Duration.DurationInput
  readonly event?: string
  readonly data: unknown
}

/** A reply: events in order (an iterable, maybe endless); `"stall"` keeps the connection open and sends nothing more. */
export type SseReply = Iterable<SseEvent | "stall">

const encodeEvent = (event: SseEvent): string =>
  `${event.event === undefined ? "" : `event: ${event.event}\n`}data: ${JSON.stringify(event.data)}\n\n`

const decoder = new TextDecoder()
const piece = 64 * 1024

/** A client answering the n-th request with `replies[n]` (a 500 past the last), and the bodies it received. */
export const sseClient = (replies: ReadonlyArray<SseReply>) => {
  const bodies: Array<Record<string, unknown>> = []
  const written = { bytes: 0 }
  const client = HttpClient.make((request) =>
    Effect.map(Effect.runtime<never>(), (runtime) => {
      const body = request.body
      bodies.push(body._tag === "Uint8Array" ? JSON.parse(decoder.decode(body.body)) : {})
      const reply = replies[bodies.length - 1]
      if (reply === undefined) {
        return HttpClientResponse.fromWeb(request, new Response("{\"error\":\"script over\"}", { status: 500 }))
      }
      const events = Stream.fromIteratorSucceed(reply[Symbol.iterator]() as IterableIterator<SseEvent | "stall">, 1)
        .pipe(
          Stream.mapEffect((step) =>
            step === "stall" ? Effect.never : Effect.as(Effect.sleep(step.after ?? 0), encodeEvent(step))
          ),
          // In pieces of 64 Ki characters, as a socket delivers a large event.
          Stream.mapConcat((text) =>
            Array.from({ length: Math.ceil(text.length / piece) }, (_, i) => text.slice(i * piece, (i + 1) * piece))
          ),
          Stream.encodeText,
          Stream.tap((bytes) => Effect.sync(() => (written.bytes += bytes.length)))
        )
      // Run on the caller's runtime: its services carry the TestClock.
      const readable = Stream.toReadableStreamRuntime(events, runtime)
      return HttpClientResponse.fromWeb(
        request,
        new Response(readable, { status: 200, headers: { "content-type": "text/event-stream" } })
      )
    })
  )
  return { client, bodies, written }
}
