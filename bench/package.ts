/**
 * The package as users get it: cold starts of the command line and of `import("leasehold")`, next to bare
 * Node and to how the package ran before it was compiled (TypeScript through tsx), in the same run; and the
 * size of a fresh project that installs the core only, or every optional peer too.
 *
 * Each process is started `PROCESS_ROUNDS` times, the cases alternating round by round; figures are medians.
 */
import { Effect, Layer, Schema } from "effect"
import { MailboxSql } from "leasehold"
import { spawnSync } from "node:child_process"
import { mkdtempSync, readdirSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { install, pack, peersFor, root } from "../test/support/consumer.js"

export const PROCESS_ROUNDS = 15

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

/** Bytes under `dir` (a node_modules), and the number of packages at its top level. */
const sizeOf = (dir: string): { readonly bytes: number; readonly packages: number } => {
  let bytes = 0
  const walk = (path: string) => {
    for (const entry of readdirSync(path, { withFileTypes: true })) {
      const full = join(path, entry.name)
      if (entry.isDirectory()) walk(full)
      else if (entry.isFile()) bytes += statSync(full).size
    }
  }
  walk(dir)
  const top = readdirSync(dir).filter((name) => !name.startsWith("."))
  const packages = top.reduce((sum, name) => sum + (name.startsWith("@") ? readdirSync(join(dir, name)).length : 1), 0)
  return { bytes, packages }
}

interface Case {
  readonly label: string
  readonly argv: ReadonlyArray<string>
  readonly cwd: string
  /** A fresh temporary directory per start: the command line finds no code cache (its first run). */
  readonly firstRun?: boolean
}

/** Milliseconds from spawn to exit, median per case, cases alternating. Every run must exit 0. */
const coldStarts = async (cases: ReadonlyArray<Case>): Promise<Map<string, number>> => {
  const times = new Map(cases.map((c) => [c.label, [] as Array<number>]))
  for (let round = 0; round < PROCESS_ROUNDS; round++) {
    for (const c of cases) {
      const started = performance.now()
      const env = {
        ...process.env,
        NO_COLOR: "1",
        ...(c.firstRun === true ? { TMPDIR: mkdtempSync(join(tmpdir(), "leasehold-bench-first-")) } : {})
      }
      const result = spawnSync("node", c.argv, { cwd: c.cwd, stdio: "pipe", env })
      const elapsed = performance.now() - started
      if (result.status !== 0) {
        return Promise.reject(
          new Error(`${c.label}: node ${c.argv.join(" ")} exited ${result.status}\n${result.stderr}`)
        )
      }
      times.get(c.label)!.push(elapsed)
    }
  }
  return new Map([...times].map(([label, values]) => [label, median(values)]))
}

/** A SQLite file with one mailbox on it, for `leasehold mailbox stats`. */
const mailboxFile = async (): Promise<string> => {
  const filename = join(mkdtempSync(join(tmpdir(), "leasehold-bench-cli-")), "stats.db")
  await Effect.runPromise(
    Effect.gen(function*() {
      const requests = yield* MailboxSql.make({ name: "requests", schema: Schema.String })
      yield* requests.send("hello")
    }).pipe(Effect.scoped, Effect.provide(Layer.orDie(MailboxSql.layerSqlite({ filename }))))
  )
  return filename
}

export interface PackageFigures {
  readonly starts: Map<string, number>
  readonly core: { readonly bytes: number; readonly packages: number }
  readonly full: { readonly bytes: number; readonly packages: number }
  readonly tarballBytes: number
}

export const measurePackage = async (): Promise<PackageFigures> => {
  const tarball = await Effect.runPromise(pack)
  const core = await Effect.runPromise(install(tarball, "core", peersFor(false)))
  const full = await Effect.runPromise(install(tarball, "full", peersFor(true)))
  const database = await mailboxFile()
  const cli = join(core, "node_modules", "leasehold", "dist", "bin", "leasehold.cjs")
  // The same bundle, where better-sqlite3 is built (the projects install without running install scripts).
  const built = join(root, "dist", "bin", "leasehold.cjs")
  const starts = await coldStarts([
    { label: "node -e 0", argv: ["-e", "0"], cwd: core },
    { label: "import leasehold (compiled root)", argv: ["-e", "await import('leasehold')"], cwd: core },
    { label: "import effect (its root)", argv: ["-e", "await import('effect')"], cwd: core },
    {
      label: "import leasehold from source through tsx (as before)",
      argv: ["--conditions=leasehold-source", "--import", "tsx", "-e", "await import('leasehold')"],
      cwd: root
    },
    { label: "leasehold --help (bundled)", argv: [cli, "--help"], cwd: core },
    { label: "leasehold --help (bundled), first run", argv: [cli, "--help"], cwd: core, firstRun: true },
    { label: "leasehold mailbox stats (bundled)", argv: [built, "mailbox", "stats", "--db", database], cwd: root },
    {
      label: "leasehold --help from source through tsx (as before)",
      argv: ["--conditions=leasehold-source", "--import", "tsx", "src/bin/leasehold.ts", "--help"],
      cwd: root
    }
  ])
  return {
    starts,
    core: sizeOf(join(core, "node_modules")),
    full: sizeOf(join(full, "node_modules")),
    tarballBytes: statSync(tarball).size
  }
}
