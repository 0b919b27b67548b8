/** What the demo's requests and replies carry. */
import * as Schema from "effect/Schema"

export const DemoRequest = Schema.Struct({ task: Schema.String, workMs: Schema.Number })
export type DemoRequest = typeof DemoRequest.Type

export const DemoResponse = Schema.Struct({ answer: Schema.String, worker: Schema.String })
export type DemoResponse = typeof DemoResponse.Type
