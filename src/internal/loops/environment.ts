/**
 * What a worker's fibers run with: the loop's fiber its context (the worker's services and the reply
 * resolver), heartbeat, log annotations and loggers; a failed settle's handling what `run`'s caller has.
 *
 * The loop's fiber does nothing but the loop, so it sets these once, for the rest of its life
 * (`FiberRef.set`). Around the loop instead (`Effect.provide`, `Effect.locally`, `Heartbeat.within`), each
 * would keep a frame on the fiber's stack for the whole run, and thousands of loops run at once. For the same
 * reason a worker keeps only data here (no closures or effects made in advance): the effects are made when a
 * run starts, and dropped once they ran.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"
import * as FiberRef from "effect/FiberRef"
import * as FiberRefs from "effect/FiberRefs"
import * as HashMap from "effect/HashMap"
import * as Option from "effect/Option"
import * as Runtime from "effect/Runtime"
import type { Heartbeat } from "../../Heartbeat.js"
import { MailboxResolver } from "../../Mailbox.js"
import { setCurrent } from "../heartbeat.js"
import { type AnnotationCell, setAnnotated } from "./annotations.js"

/** One worker's environment: its name, heartbeat and context (`Req` and the reply resolver). */
export interface Environment {
  readonly name: string
  readonly heartbeat: Heartbeat
  readonly context: Context.Context<MailboxResolver>
}

/** The environment of worker `name`, made with `context` (its services) and `heartbeat`. */
export const make = (name: string, context: Context.Context<never>, heartbeat: Heartbeat): Environment => {
  // Replies need the resolver; a worker without one (the dead-letter consumer) only acknowledges.
  const resolver = Option.getOrElse(Context.getOption(context, MailboxResolver), () => MailboxResolver.fromMailboxes())
  return { name, heartbeat, context: Context.add(context, MailboxResolver, resolver) }
}

/** Adds worker `name`'s `module` and `worker` annotations to the logs of `effect`. */
export const annotateLogs = (name: string) => Effect.annotateLogs({ module: "MailboxWorker", worker: name })

/**
 * The worker's context over the one the loop fiber inherits from `run`'s caller, as `Effect.provide` would
 * make it. Nearly always the caller has no service the worker lacks: then the worker's context as it is,
 * rather than a merged copy per run.
 */
const over = (inherited: Context.Context<never>, own: Context.Context<never>): Context.Context<never> => {
  for (const key of inherited.unsafeMap.keys()) {
    if (!own.unsafeMap.has(key)) return Context.merge(inherited, own)
  }
  return own
}

/** The loop fiber's first steps; `cell` when the worker annotates its messages' logs. */
export const setUpLoop = (environment: Environment, cell: AnnotationCell | undefined): Effect.Effect<void> => {
  const { context, heartbeat, name } = environment
  const setUp = Effect.zipRight(
    Effect.zipRight(
      FiberRef.update(FiberRef.currentContext, (inherited) => over(inherited, context as Context.Context<never>)),
      setCurrent(heartbeat)
    ),
    FiberRef.update(
      FiberRef.currentLogAnnotations,
      (annotations) => HashMap.set(HashMap.set(annotations, "module", "MailboxWorker"), "worker", name)
    )
  )
  return cell === undefined ? setUp : Effect.zipRight(setUp, setAnnotated(cell))
}

/**
 * Starts `body` (a failed settle's handling) on a fiber as a fork of `run`'s fiber (`caller`, waiting for the
 * loop meanwhile) would be: with its context and fiber refs, not the loop fiber's (its span, message
 * annotations and heartbeat). Synchronous: the scheduler starts it.
 */
export const forkSettler = <A>(
  environment: Environment,
  caller: Fiber.RuntimeFiber<unknown, unknown>,
  body: Effect.Effect<A, never, MailboxResolver>
): Fiber.RuntimeFiber<A> => {
  const fiberRefs = caller.getFiberRefs()
  const runtime = Runtime.make({
    context: caller.currentContext,
    runtimeFlags: FiberRefs.getOrDefault(fiberRefs, FiberRef.currentRuntimeFlags),
    fiberRefs
  })
  return Runtime.runFork(
    runtime,
    Effect.interruptible(body).pipe(
      Effect.provideService(MailboxResolver, Context.get(environment.context, MailboxResolver)),
      annotateLogs(environment.name)
    ),
    { immediate: false }
  )
}
