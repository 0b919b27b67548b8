/**
 * Spans on per-message paths. Effect's default tracer keeps spans that nobody
 * exports, and making one (trace and span ids, attributes, clock reads, a
 * context update) costs more than a no-op handler's whole turn. `perMessage`
 * adds the span only once an exporting tracer is installed
 * (`Layer.setTracer`, `@effect/opentelemetry`); with the default tracer the
 * effect runs as it is. Below: the W3C trace context a message carries from
 * its sender's span to the worker's, and a reply back.
 */
import * as Context from "effect/Context"
import * as DefaultServices from "effect/DefaultServices"
import * as Effect from "effect/Effect"
import * as Tracer from "effect/Tracer"

/** The tracer every fiber has unless one is installed (a per-message path compares a fiber's with it in line). */
export const defaultTracer: Tracer.Tracer = Context.get(DefaultServices.liveServices, Tracer.Tracer)

/** Whether the fiber's tracer exports spans (one was installed); a loop reads it once per run. */
export const exporting: Effect.Effect<boolean> = Effect.map(Effect.tracer, (tracer) => tracer !== defaultTracer)

/** `Effect.withSpan(name, options)`, skipped while no exporting tracer is installed. */
export const perMessage =
  (name: string, options: Tracer.SpanOptions) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.tracerWith((tracer) => tracer === defaultTracer ? effect : Effect.withSpan(effect, name, options))

/*
 * W3C trace context across the mailbox. A message stores the `traceparent` of the span current where it was
 * sent (`00-<32 hex trace id>-<16 hex span id>-<flags>`), so the worker's span can continue the sender's
 * trace. Only the ids travel (no `tracestate`, no baggage): what a parent needs. Formatting happens only
 * when a span is current, so a process without spans pays one field read per send; a stored value is checked
 * when read, and a malformed one counts as absent — a trace is never a reason to refuse a message.
 */

const traceparentPattern = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/
const hex32 = /^[0-9a-f]{32}$/
const hex16 = /^[0-9a-f]{16}$/
const zeros32 = "0".repeat(32)
const zeros16 = "0".repeat(16)

/**
 * The `traceparent` of `span` (a span of this process or an external parent), or `undefined` without one or
 * when its ids are not W3C's (a tracer of its own kind).
 */
export const traceparentOf = (span: Tracer.AnySpan | undefined): string | undefined => {
  if (span === undefined) return undefined
  const { spanId, traceId } = span
  if (!hex32.test(traceId) || traceId === zeros32 || !hex16.test(spanId) || spanId === zeros16) return undefined
  return `00-${traceId}-${spanId}-${span.sampled ? "01" : "00"}`
}

/** The `traceparent` of the fiber's current span (an `Effect.withSpan` or a parent set with `withParentSpan`). */
export const currentTraceparent = <A, E, R>(
  f: (traceparent: string | undefined) => Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> => Effect.withFiberRuntime((fiber) => f(traceparentOf(fiber.currentSpan)))

/**
 * The parts of a well-formed `traceparent` (W3C: lower-case hex, ids not all zeros, version not `ff`, nothing
 * after the flags in version 00).
 */
const partsOf = (value: string | null | undefined): RegExpExecArray | undefined => {
  if (typeof value !== "string") return undefined
  const match = traceparentPattern.exec(value)
  if (match === null) return undefined
  const [, version, traceId, spanId, , rest] = match
  return version === "ff" || (version === "00" && rest !== undefined) || traceId === zeros32 || spanId === zeros16
    ? undefined
    : match
}

/** The span a stored `traceparent` names, as a parent; `undefined` when it is absent or malformed. */
export const parseTraceparent = (value: string | null | undefined): Tracer.ExternalSpan | undefined => {
  const parts = partsOf(value)
  return parts === undefined
    ? undefined
    : Tracer.externalSpan({ traceId: parts[2]!, spanId: parts[3]!, sampled: (parseInt(parts[4]!, 16) & 1) === 1 })
}

/** `value` when it is a well-formed `traceparent`, else `undefined` (what a received message exposes). */
export const validTraceparent = (value: string | null | undefined): string | undefined =>
  partsOf(value) === undefined ? undefined : value!

/**
 * The trace and span ids of a received message's `traceparent` (already checked: see `validTraceparent`), for
 * a run context: `undefined` each without one.
 */
export const idsOf = (traceparent: string | undefined) =>
  traceparent === undefined
    ? undefined
    : { traceId: traceparent.slice(3, 35), spanId: traceparent.slice(36, 52) }
