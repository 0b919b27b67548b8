/**
 * The readiness a loop counts in: `Runnable.Readiness`, and a `Health` service provided by hand (without the
 * `Readiness` its layers add). `Health` is found by its key, so that no loop imports the HTTP health service;
 * every `Health` has `Readiness`'s two members.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Runnable from "../Runnable.js"

/** The key of `Health.Health`. */
export const healthKey = "leasehold/Health"

const HealthAsReadiness = Context.GenericTag<"leasehold/Health/AsReadiness", Runnable.Readiness["Type"]>(healthKey)

/**
 * The readiness services in the environment: `Readiness` and `Health`, once each (`Health`'s layers provide
 * both from one registry); none when neither is there.
 */
export const current: Effect.Effect<Option.Option<Runnable.Readiness["Type"]>> = Effect.map(
  Effect.context<never>(),
  (context) => {
    const readiness = Context.getOption(context, Runnable.Readiness)
    const health = Context.getOption(context, HealthAsReadiness)
    if (Option.isNone(health) || (Option.isSome(readiness) && readiness.value.register === health.value.register)) {
      return readiness
    }
    if (Option.isNone(readiness)) return health
    const both = [readiness.value, health.value]
    return Option.some({
      register: (loop) => Effect.forEach(both, (service) => service.register(loop), { discard: true }),
      setShuttingDown: Effect.forEach(both, (service) => service.setShuttingDown, { discard: true })
    })
  }
)
