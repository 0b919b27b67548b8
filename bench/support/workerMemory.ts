/**
 * The memory benchmark's child process (bench/scale.ts runs it with `--expose-gc`): brings a worker to one
 * state, collects garbage twice and prints `process.memoryUsage()` as its last line (JSON), then exits.
 *
 *   node --expose-gc --import tsx bench/support/workerMemory.ts <mode> <sqlite file> <leases>   (after npm run build)
 *
 * Modes: `baseline` imports only `effect` and runs a program that waits; `idle` runs one MainLoop on a
 * SQLite MailboxSql, in its long poll on an empty queue; `received` holds `leases` messages received from
 * one mailbox (10 a call), unacknowledged; `loops` runs `leases` MainLoops on one mailbox, each holding a
 * request in `execute` (lease extender attached; no extension has run: `execute` does not beat). Each mode imports only what it uses,
 * so the baseline carries no leasehold or driver code.
 */
import { performance } from "node:perf_hooks"

export type MemoryMode = "baseline" | "idle" | "received" | "loops"

export interface MemoryFigures {
  readonly rss: number
  readonly heapUsed: number
  readonly external: number
}

const [mode, filename, leasesArgument] = process.argv.slice(2) as [MemoryMode, string, string | undefined]
const leases = Number(leasesArgument ?? 10_000)

/** Settles the heap, then prints the figures. */
const report = async () => {
  const gc = (globalThis as { gc?: () => void }).gc
  for (let i = 0; i < 2; i++) {
    gc?.()
    await new Promise((resolve) => setImmediate(resolve))
  }
  const { external, heapUsed, rss } = process.memoryUsage()
  process.stdout.write(JSON.stringify({ rss, heapUsed, external } satisfies MemoryFigures) + "\n")
  process.exit(0)
}

const main = async () => {
  const { Effect, Schema } = await import("effect")
  if (mode === "baseline") {
    // An empty program that waits, as a process that has only loaded Effect.
    Effect.runFork(Effect.never)
    await Effect.runPromise(Effect.sleep("500 millis"))
    return report()
  }
  const { MailboxSql, MainLoop } = await import("leasehold")
  const program = Effect.gen(function*() {
    const requests = yield* MailboxSql.make({
      name: "requests",
      schema: MainLoop.requestSchema(Schema.Number),
      replySchema: MainLoop.resultSchema(Schema.Number)
    })
    if (mode === "idle") {
      const loop = yield* MainLoop.make({ requests, execute: (n: number) => Effect.succeed(n) })
      yield* Effect.forkScoped(loop.run({ waitTime: "20 seconds" }))
      yield* Effect.sleep("1 second")
      return yield* Effect.promise(report)
    }
    yield* Effect.forEach(
      Array.from({ length: leases }, (_, i) => i),
      (i) => requests.send(MainLoop.request(i)),
      { concurrency: 64, discard: true }
    )
    if (mode === "received") {
      const held: Array<unknown> = []
      while (held.length < leases) held.push(...(yield* requests.receive({ maxMessages: 10 })))
      yield* Effect.promise(report)
      return held.length
    }
    let started = 0
    const loops = yield* Effect.all(
      Array.from({ length: leases }, () =>
        MainLoop.make({
          requests,
          execute: () =>
            Effect.zipRight(
              Effect.sync(() => {
                started++
              }),
              Effect.never
            )
        })),
      { concurrency: "unbounded" }
    )
    yield* Effect.forEach(loops, (loop) => Effect.forkScoped(loop.run({ waitTime: "20 seconds" })), { discard: true })
    const since = performance.now()
    while (started < leases) {
      if (performance.now() - since > 120_000) return yield* Effect.dieMessage(`only ${started} requests started`)
      yield* Effect.sleep("50 millis")
    }
    // Each loop's first beat extends its lease (one statement each): let them land.
    yield* Effect.sleep("2 seconds")
    yield* Effect.promise(report)
    return loops.length
  }).pipe(Effect.scoped, Effect.provide(MailboxSql.layerSqlite({ filename })))
  await Effect.runPromise(program)
}

main()
