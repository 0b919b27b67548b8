/**
 * A worker's per-message log annotations (MainLoop's `requestId`), without a
 * FiberRef write per message.
 *
 * Two FiberRef writes and a HashMap per message cost more than a short
 * handler's whole turn, so a run keeps the annotations of the message in hand
 * in a cell that its loggers read: `setAnnotated` wraps the loop fiber's
 * loggers as the run starts, the loop fills the cell while a message is in
 * hand, and a fiber forked meanwhile keeps a copy of the cell as it was when
 * forked (it keeps the message it was forked for after the loop moves on). A
 * worker running inside another's handler chains its cell to the outer one,
 * the inner annotations winning.
 */
import * as Effect from "effect/Effect"
import * as FiberRef from "effect/FiberRef"
import * as FiberRefs from "effect/FiberRefs"
import { identity } from "effect/Function"
import * as HashMap from "effect/HashMap"
import * as HashSet from "effect/HashSet"
import * as Logger from "effect/Logger"
import * as Struct from "effect/Struct"

/** Annotations of the message in hand (`current`), and of the runs around this one (`outer`). */
export interface AnnotationCell {
  current: Readonly<Record<string, unknown>> | undefined
  readonly outer: AnnotationCell | undefined
}

/** The cell of a fiber outside any run: nothing to add. */
const none: AnnotationCell = Object.freeze({ current: undefined, outer: undefined })

/**
 * The annotation cell of the fiber's run. A fiber forked while a message is in hand gets a copy (so it keeps
 * that message's annotations after the loop moves on); joining a child leaves the parent's cell. Both hooks
 * are Effect's own functions, not closures of this module: they run on every fork of a loop's fiber.
 */
const annotationCell = FiberRef.unsafeMake<AnnotationCell>(none, {
  fork: Struct.pick("current", "outer"),
  join: identity
})

/**
 * The cells of the runs around, as they are now: a run started inside another's handler keeps the message that
 * handler had, as a fiber forked there does, after the outer loop moves on.
 */
const snapshot = (cell: AnnotationCell | undefined): AnnotationCell | undefined =>
  cell === undefined || (cell.current === undefined && cell.outer === undefined)
    ? undefined
    : { current: cell.current, outer: snapshot(cell.outer) }

/** A new, empty cell for a run, chained to the cells of the runs around it (if any), as they are now. */
export const makeCell: Effect.Effect<AnnotationCell> = Effect.map(
  FiberRef.get(annotationCell),
  (outer) => ({ current: undefined, outer: snapshot(outer) })
)

const addAnnotations = (
  annotations: HashMap.HashMap<string, unknown>,
  extra: Readonly<Record<string, unknown>>
): HashMap.HashMap<string, unknown> => {
  let result = annotations
  for (const key in extra) result = HashMap.set(result, key, extra[key])
  return result
}

/** Adds a cell's annotations to a log line's, the outer runs' first, so the innermost win. */
const addCell = (
  annotations: HashMap.HashMap<string, unknown>,
  cell: AnnotationCell
): HashMap.HashMap<string, unknown> => {
  const outer = cell.outer === undefined ? annotations : addCell(annotations, cell.outer)
  return cell.current === undefined ? outer : addAnnotations(outer, cell.current)
}

/** Marks a logger that already adds the cell's annotations (a field of it): a nested run does not wrap it again. */
const AnnotatingId: unique symbol = Symbol.for("leasehold/worker/annotating")

/** Wraps a logger so it adds the annotations of the logging fiber's cell, if any. */
const annotating = (logger: Logger.Logger<unknown, unknown>): Logger.Logger<unknown, unknown> => {
  if (AnnotatingId in logger) return logger
  const wrapped = Logger.mapInputOptions(logger, (options) => {
    const cell = FiberRefs.getOrDefault(options.context, annotationCell)
    return cell.current === undefined && cell.outer === undefined
      ? options
      : { ...options, annotations: addCell(options.annotations, cell) }
  })
  Object.defineProperty(wrapped, AnnotatingId, { value: true, enumerable: false })
  return wrapped
}

type Loggers = typeof FiberRef.currentLoggers extends FiberRef.FiberRef<infer A> ? A : never

/** The loggers, each wrapped (once: a set whose every logger is wrapped already is kept as it is). */
const wrapLoggers = (loggers: Loggers): Loggers =>
  HashSet.every(loggers, (logger) => AnnotatingId in logger) ? loggers : HashSet.map(loggers, annotating)

/**
 * Makes `cell` the calling fiber's cell and wraps the loggers it has to add the cell's annotations, for the rest
 * of the fiber's life: for a fiber that does nothing but the run (a worker's loop), where `Effect.locally` would
 * keep a frame on its stack for the whole run.
 */
export const setAnnotated = (cell: AnnotationCell): Effect.Effect<void> =>
  Effect.zipRight(FiberRef.update(FiberRef.currentLoggers, wrapLoggers), FiberRef.set(annotationCell, cell))
