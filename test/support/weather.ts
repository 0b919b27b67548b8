/**
 * The provider tests' shared agent task: a `lookup_weather` tool (Paris is 21 °C) and a prompt that must use it
 * and answer `{ city, celsius }` as JSON. Each provider's stub scripts the model's side of it.
 */
import { Effect, Schema } from "effect"
import * as Prompt from "../../src/Prompt.js"
import * as Tool from "../../src/Tool.js"

export const weather = Tool.make({
  name: "lookup_weather",
  description: "Current temperature of a city",
  parameters: Schema.Struct({ city: Schema.String }),
  success: Schema.Struct({ celsius: Schema.Number }),
  handler: ({ city }) => Effect.succeed({ celsius: city === "Paris" ? 21 : 0 })
})

export const weatherPrompt = Prompt.make({
  name: "weather",
  instructions: "Answer with JSON.",
  input: "How warm is Paris?",
  tools: [weather],
  output: Schema.Struct({ city: Schema.String, celsius: Schema.Number })
})
