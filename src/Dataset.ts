/**
 * Datasets: the samples an evaluation runs, loaded from JSON Lines.
 *
 * Each non-blank line is `{"id": ..., "input": ..., "expected": ...}`,
 * decoded with the caller's Schemas. A line that is not JSON, does not match
 * the Schemas or repeats an id fails the whole load with `DatasetError`,
 * naming the line — a half-loaded dataset would give a wrong report.
 */
import * as FileSystem from "@effect/platform/FileSystem"
import * as Effect from "effect/Effect"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

/**
 * One case to evaluate.
 *
 * @category models
 */
export interface Sample<I, E> {
  readonly id: string
  readonly input: I
  readonly expected: E
}

/**
 * A line of a dataset could not be used; `line` is 1-based (0 when the file itself could not be read).
 *
 * @category errors
 */
export class DatasetError extends Schema.TaggedError<DatasetError>()("DatasetError", {
  source: Schema.String,
  line: Schema.Number,
  reason: Schema.String
}) {
  override get message(): string {
    return this.line === 0
      ? `Cannot read dataset ${this.source}: ${this.reason}`
      : `Dataset ${this.source}, line ${this.line}: ${this.reason}`
  }
}

/**
 * Decodes JSON Lines text into samples.
 *
 * @category constructors
 */
export const fromJsonl = <I, II, E, EI>(
  text: string,
  schemas: { readonly input: Schema.Schema<I, II>; readonly expected: Schema.Schema<E, EI> },
  source = "<text>"
): Effect.Effect<ReadonlyArray<Sample<I, E>>, DatasetError> =>
  Effect.gen(function*() {
    const decode = Schema.decodeUnknownEither(
      Schema.Struct({ id: Schema.NonEmptyString, input: schemas.input, expected: schemas.expected })
    )
    const samples: Array<Sample<I, E>> = []
    const seen = new Set<string>()
    const lines = text.split(/\r?\n/)
    for (let index = 0; index < lines.length; index++) {
      const raw = lines[index]!.trim()
      if (raw === "") continue
      const line = index + 1
      let json: unknown
      try {
        json = JSON.parse(raw)
      } catch (error) {
        return yield* new DatasetError({ source, line, reason: `not JSON (${(error as Error).message})` })
      }
      const decoded = decode(json)
      if (decoded._tag === "Left") {
        return yield* new DatasetError({
          source,
          line,
          reason: ParseResult.TreeFormatter.formatErrorSync(decoded.left)
        })
      }
      if (seen.has(decoded.right.id)) {
        return yield* new DatasetError({
          source,
          line,
          reason: `duplicate sample id ${JSON.stringify(decoded.right.id)}`
        })
      }
      seen.add(decoded.right.id)
      samples.push(decoded.right)
    }
    return samples
  })

/**
 * Reads and decodes a JSON Lines file.
 *
 * @category constructors
 */
export const loadJsonl = <I, II, E, EI>(
  path: string,
  schemas: { readonly input: Schema.Schema<I, II>; readonly expected: Schema.Schema<E, EI> }
): Effect.Effect<ReadonlyArray<Sample<I, E>>, DatasetError, FileSystem.FileSystem> =>
  Effect.flatMap(FileSystem.FileSystem, (fs) =>
    fs.readFileString(path).pipe(
      Effect.mapError((error) => new DatasetError({ source: path, line: 0, reason: error.message })),
      Effect.flatMap((text) => fromJsonl(text, schemas, path))
    ))
