/**
 * Metric helpers. Every leasehold counter only ever grows; declaring it
 * `incremental` is what makes the Prometheus exporter render it as a counter
 * rather than a gauge, so counters are made here, in one place.
 */
import * as Metric from "effect/Metric"

/** A monotonic counter named `name` (Prometheus style, ending in `_total`). */
export const counter = (name: string, description: string) => Metric.counter(name, { description, incremental: true })
