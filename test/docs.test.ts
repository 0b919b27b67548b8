/**
 * The documentation cannot drift from the code: every `ts` block of README.md and docs/*.md is type-checked
 * against the sources, and every relative link points at a file (and heading) that exists.
 *
 * Each block becomes a module of its own under node_modules/.cache/leasehold-docs/ (ignored by git and
 * ESLint), where `leasehold` and `leasehold/Module` resolve to src/ through the package's self-reference and
 * the `leasehold-source` condition of the repository's tsconfig. One TypeScript program checks them all; a
 * failure names the document, the line and the diagnostic. A block that is deliberately partial is fenced
 * `ts no-check` (keep those rare).
 *
 * The migration tables of docs/versioning.md and the versions docs/operating.md names are checked against the
 * migration list the code runs (src/internal/sql/migrations.ts): a migration without its row fails, and so does
 * a row, a range or a version the code does not have.
 */
import { describe, expect, it } from "@effect/vitest"
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import ts from "typescript"
import { migrationNames } from "./support/migrationList.js"

const documents = ["README.md", ...readdirSync("docs").filter((file) => file.endsWith(".md")).map((f) => `docs/${f}`)]

interface Block {
  readonly document: string
  /** 1-based line of the block's first line of code. */
  readonly line: number
  readonly language: string
  readonly flags: ReadonlyArray<string>
  readonly code: string
}

const fence = /^(\s*)```(\S*)\s*(.*)$/

/** The fenced code blocks of a Markdown document. */
const blocksOf = (document: string): ReadonlyArray<Block> => {
  const lines = readFileSync(document, "utf8").split("\n")
  const blocks: Array<Block> = []
  for (let i = 0; i < lines.length; i++) {
    const open = fence.exec(lines[i]!)
    if (open === null) continue
    const start = i + 1
    let end = start
    while (end < lines.length && !/^\s*```\s*$/.test(lines[end]!)) end++
    blocks.push({
      document,
      line: start + 1,
      language: open[2]!,
      flags: open[3]!.split(/\s+/).filter((flag) => flag.length > 0),
      code: lines.slice(start, end).join("\n")
    })
    i = end
  }
  return blocks
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
const slug = (heading: string): string =>
  heading.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, "").replace(/ /g, "-")

const anchorsOf = (document: string): ReadonlySet<string> => {
  const anchors = new Set<string>()
  const seen = new Map<string, number>()
  let inFence = false
  for (const line of readFileSync(document, "utf8").split("\n")) {
    if (/^\s*```/.test(line)) inFence = !inFence
    const heading = inFence ? null : /^#{1,6}\s+(.*)$/.exec(line)
    if (heading === null) continue
    const base = slug(heading[1]!)
    const count = seen.get(base) ?? 0
    seen.set(base, count + 1)
    anchors.add(count === 0 ? base : `${base}-${count}`)
  }
  return anchors
}

const cacheDir = join("node_modules", ".cache", "leasehold-docs")

describe("documentation", () => {
  const blocks = documents.flatMap(blocksOf)
  const checked = blocks.filter((block) =>
    (block.language === "ts" || block.language === "typescript") && !block.flags.includes("no-check")
  )

  it("has TypeScript blocks to check, and few left unchecked", () => {
    expect(checked.length).toBeGreaterThan(10)
    const unchecked = blocks.filter((block) => block.flags.includes("no-check"))
    expect(unchecked.length).toBeLessThanOrEqual(3)
  })

  it("every ts block type-checks", () => {
    rmSync(cacheDir, { recursive: true, force: true })
    mkdirSync(cacheDir, { recursive: true })
    const files = new Map<string, Block>()
    for (const block of checked) {
      const name = `${block.document.replace(/[/.]/g, "_")}_L${block.line}.ts`
      // `export {}` makes every block a module of its own (its names do not meet the other blocks').
      writeFileSync(join(cacheDir, name), `${block.code}\nexport {}\n`)
      files.set(resolve(cacheDir, name), block)
    }
    const configPath = join(cacheDir, "tsconfig.json")
    writeFileSync(
      configPath,
      JSON.stringify({
        extends: relative(cacheDir, "tsconfig.json"),
        // Snippets show a step, not a program: a name they introduce need not be used.
        compilerOptions: { noEmit: true, noUnusedLocals: false, noUnusedParameters: false },
        include: [],
        files: [...files.keys()].map((file) => relative(cacheDir, file))
      })
    )
    const config = ts.getParsedCommandLineOfConfigFile(configPath, {}, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (diagnostic) => {
        expect.fail(ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n"))
      }
    })!
    expect(config.errors).toEqual([])
    const program = ts.createProgram({ rootNames: config.fileNames, options: config.options })
    const problems: Array<string> = program.getOptionsDiagnostics().map((diagnostic) =>
      ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n")
    )
    for (const [file, block] of files) {
      const source = program.getSourceFile(file)
      if (source === undefined) {
        problems.push(`${block.document}:${block.line}: not compiled`)
        continue
      }
      for (
        const diagnostic of [...program.getSyntacticDiagnostics(source), ...program.getSemanticDiagnostics(source)]
      ) {
        const line = source.getLineAndCharacterOfPosition(diagnostic.start ?? 0).line
        const text = ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n  ")
        problems.push(`${block.document}:${block.line + line}: TS${diagnostic.code} ${text}`)
      }
    }
    expect(problems).toEqual([])
  }, 120_000)

  it("every relative link points at a file and heading that exist", () => {
    const broken: Array<string> = []
    for (const document of documents) {
      const text = readFileSync(document, "utf8").replace(/```[\s\S]*?```/g, "")
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/i.test(target!)) continue
        const [path, anchor] = target!.split("#") as [string, string | undefined]
        const file = path === "" ? document : join(dirname(document), path)
        if (!existsSync(file)) broken.push(`${document}: ${target} (no such file)`)
        else if (anchor !== undefined && file.endsWith(".md") && !anchorsOf(file).has(anchor)) {
          broken.push(`${document}: ${target} (no such heading)`)
        }
      }
    }
    expect(broken).toEqual([])
  })

  describe("migrations", () => {
    /** The Markdown table rows of `document` under the heading `heading`: each row's cells, trimmed. */
    const tableRows = (document: string, heading: string) => {
      const text = readFileSync(document, "utf8")
      const start = text.indexOf(`\n## ${heading}\n`)
      expect(start, `${document}: ## ${heading}`).toBeGreaterThan(-1)
      const end = text.indexOf("\n## ", start + 1)
      return text.slice(start, end === -1 ? undefined : end).split("\n")
        .filter((line) => /^\|.*\|$/.test(line) && !/^\|\s*-/.test(line))
        .map((line) => line.slice(1, -1).split("|").map((cell) => cell.trim()))
    }
    /** `1–11, 13`: the ids as runs. */
    const ranges = (ids: ReadonlyArray<number>) => {
      const runs: Array<[number, number]> = []
      for (const id of [...ids].sort((a, b) => a - b)) {
        const last = runs[runs.length - 1]
        if (last !== undefined && id === last[1] + 1) last[1] = id
        else runs.push([id, id])
      }
      return runs.map(([from, to]) => from === to ? String(from) : `${from}–${to}`).join(", ")
    }
    const idOf = (name: string) => Number.parseInt(name, 10)
    const tables: Record<string, string> = {
      mailbox: "`<prefix>mailbox_migrations`",
      "work lease": "`<prefix>work_lease_migrations`",
      "merge queue": "`<prefix>merge_queue_migrations`"
    }

    it("docs/versioning.md lists every migration the code runs, and no other", async () => {
      const names = await migrationNames()
      const rows = tableRows("docs/versioning.md", "How migrations are versioned")
      const listed = rows.filter((row) => row.length === 3 && /^`\d+_\w+`$/.test(row[1]!))
        .map((row) => `${row[0]} ${row[1]!.slice(1, -1)}`)
      const known = Object.entries(names).flatMap(([service, list]) => list.map((name) => `${service} ${name}`))
      expect(listed).toEqual(known)
      // The summary table: each service's ids as ranges ("1–11, 13").
      for (const [service, list] of Object.entries(names)) {
        const summary = rows.find((row) => row[1] === tables[service])
        expect(summary, `the summary row of ${service}`).toBeDefined()
        expect(summary![2], service).toBe(ranges(list.map(idOf)))
      }
    })

    it("docs/operating.md names the versions this release needs", async () => {
      const names = await migrationNames()
      const text = readFileSync("docs/operating.md", "utf8").replace(/\s+/g, " ")
      const needs = /a release needs the latest migration it knows \(this one: ([^;)]*)/.exec(text)
      expect(needs, "docs/operating.md's Migrations section names the versions").not.toBeNull()
      expect(needs![1]).toBe(
        Object.entries(names).map(([service, list]) => `${service} ${Math.max(...list.map(idOf))}`).join(", ")
      )
    })
  })
})
