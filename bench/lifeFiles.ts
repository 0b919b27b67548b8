/**
 * The files of the compiled package one message's life enters on the SQL backend: V8 precise coverage
 * (call counts) while ONE message is sent, claimed, handled by a MainLoop and acknowledged, after a warm-up
 * that builds the layer, makes the mailbox, starts the loop and runs a few messages. A file counts when one of
 * its functions ran in that window. Prints the files with their function counts, then one JSON line.
 *
 * Alone (after `npm run build`):
 *   npx esbuild bench/lifeFiles.ts --bundle --platform=node --format=esm --packages=external \
 *     --outdir=bench/.build --out-extension:.js=.mjs && node bench/.build/lifeFiles.mjs [--url postgres://…]
 * Without `--url` it runs on a temporary SQLite file; with it, on that PostgreSQL database.
 * `npm run bench` runs it in a process of its own and writes the figure into BENCHMARKS.md.
 */
import { Deferred, Effect, Layer, Schema } from "effect"
import { mkdtempSync } from "node:fs"
import { Session } from "node:inspector/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"

/** One file's share of the window: how many of its functions ran. */
export interface LifeFile {
  readonly file: string
  readonly functions: number
}

/** What one run reports (the JSON line `npm run bench` reads). */
export interface LifeReport {
  readonly backend: string
  readonly files: ReadonlyArray<LifeFile>
  readonly functions: number
}

const WARM_UP = 20

/** better-sqlite3 itself (it ships no types), to see the row gone without entering the package. */
interface RawSqlite {
  readonly prepare: (sql: string) => { readonly get: () => unknown }
  readonly close: () => void
}
const Sqlite = createRequire(import.meta.url)("better-sqlite3") as new(
  file: string,
  options: { readonly readonly: boolean }
) => RawSqlite

const main = async () => {
  const { values } = parseArgs({ options: { url: { type: "string" } } })
  const session = new Session()
  session.connect()
  await session.post("Profiler.enable")
  // Started before the package loads, so every function of it keeps its counters.
  await session.post("Profiler.startPreciseCoverage", { callCount: true, detailed: true })

  const { MailboxSql, MainLoop } = await import("leasehold")
  const filename = join(mkdtempSync(join(tmpdir(), "leasehold-life-")), "life.db")
  const prefix = "life_"
  const database = values.url === undefined
    ? MailboxSql.layerSqlite({ filename })
    : MailboxSql.layerPg({ url: values.url })
  const backend = values.url === undefined ? "SQLite" : "PostgreSQL"
  // The window ends when the row is gone: read outside the package, so the check enters none of its files.
  let raw: RawSqlite | undefined

  const program = Effect.gen(function*() {
    const requests = yield* MailboxSql.make({
      name: "life",
      schema: MainLoop.requestSchema(Schema.Number),
      replySchema: MainLoop.resultSchema(Schema.Number),
      prefix
    })
    let handled = yield* Deferred.make<void>()
    const loop = yield* MainLoop.make({
      requests,
      execute: (n: number) => Effect.as(Deferred.succeed(handled, void 0), n)
    })
    yield* Effect.forkScoped(loop.run({ waitTime: "1 second" }))
    const acknowledged = yield* pendingCheck(requests)
    const once = (n: number) =>
      Effect.gen(function*() {
        yield* requests.send(MainLoop.request(n))
        yield* Deferred.await(handled)
        yield* acknowledged
      })
    for (let i = 0; i < WARM_UP; i++) {
      yield* once(i)
      handled = yield* Deferred.make<void>()
    }
    yield* Effect.promise(() => session.post("Profiler.takePreciseCoverage")) // resets the counters
    yield* once(WARM_UP)
    const { result } = yield* Effect.promise(() => session.post("Profiler.takePreciseCoverage"))
    yield* loop.shutdown()
    return result
  })

  /** Waits until no message is left, by a count that runs outside the package where it can. */
  const pendingCheck = (requests: { readonly approximateCount: Effect.Effect<number, unknown> }) =>
    Effect.succeed(
      Effect.gen(function*() {
        for (;;) {
          if (raw === undefined && backend === "SQLite") raw = new Sqlite(filename, { readonly: true })
          const left = raw !== undefined
            ? (raw.prepare(`SELECT count(*) AS n FROM ${prefix}mailbox_messages`).get() as { n: number }).n
            : yield* requests.approximateCount
          if (left === 0) return
          yield* Effect.sleep("1 millis")
        }
      })
    )

  const result = await Effect.runPromise(
    program.pipe(Effect.scoped, Effect.provide(Layer.fresh(database)))
  )
  raw?.close()
  await session.post("Profiler.stopPreciseCoverage")
  session.disconnect()

  const dist = fileURLToPath(new URL("../../dist/", import.meta.url))
  const files: Array<LifeFile> = []
  for (const script of result) {
    if (!script.url.startsWith("file://")) continue
    const path = fileURLToPath(script.url)
    if (!path.startsWith(dist)) continue
    const entered = script.functions.filter((f) => (f.ranges[0]?.count ?? 0) > 0).length
    if (entered > 0) files.push({ file: path.slice(dist.length), functions: entered })
    if (entered > 0 && process.env["LIFE_NAMES"] !== undefined) {
      const names = script.functions.filter((f) => (f.ranges[0]?.count ?? 0) > 0).map((f) =>
        f.functionName || "(anonymous)"
      )
      process.stdout.write(`${path.slice(dist.length)}: ${names.join(", ")}\n`)
    }
  }
  files.sort((a, b) => a.file.localeCompare(b.file))
  const report: LifeReport = { backend, files, functions: files.reduce((n, f) => n + f.functions, 0) }
  for (const f of files) process.stdout.write(`${String(f.functions).padStart(4)}  ${f.file}\n`)
  process.stdout.write(`${files.length} files, ${report.functions} functions (${backend})\n`)
  process.stdout.write(JSON.stringify(report) + "\n")
}

main()
