/**
 * Spans on per-message paths. Effect's default tracer keeps spans that nobody
 * exports, and making one (trace and span ids, attributes, clock reads, a
 * context update) costs more than a no-op handler's whole turn. `perMessage`
 * adds the span only once an exporting tracer is installed
 * (`Layer.setTracer`, `@effect/opentelemetry`); with the default tracer the
 * effect runs as it is.
 */
import * as Context from "effect/Context"
import * as DefaultServices from "effect/DefaultServices"
import * as Effect from "effect/Effect"
import * as Tracer from "effect/Tracer"

/** The tracer every fiber has unless one is installed. */
const defaultTracer: Tracer.Tracer = Context.get(DefaultServices.liveServices, Tracer.Tracer)

/** Whether the fiber's tracer exports spans (one was installed); a loop reads it once per run. */
export const exporting: Effect.Effect<boolean> = Effect.map(Effect.tracer, (tracer) => tracer !== defaultTracer)

/** `Effect.withSpan(name, options)`, skipped while no exporting tracer is installed. */
export const perMessage =
  (name: string, options: Tracer.SpanOptions) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.tracerWith((tracer) => tracer === defaultTracer ? effect : Effect.withSpan(effect, name, options))
