/**
 * The layout's one-way rules (DESIGN.md, "Layout"), checked on the sources: no circle of run-time imports, nothing
 * outside the command line imports `cli/`, loop machinery never imports `Health`, agent code never imports a
 * transport. The graph function is tested on planted fixtures first, so a rule that passes is a rule that can fail.
 */
import { describe, expect, it } from "@effect/vitest"
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { cycles, edges, graphOf, valueImports } from "./support/importGraph.js"

const src = fileURLToPath(new URL("../src/", import.meta.url))
const graph = graphOf(src)

const isPublic = (file: string) => !file.includes("/")
const isCli = (file: string) => file.startsWith("cli/") || file.startsWith("bin/")
const agentModules = new Set([
  "Tool.ts",
  "Prompt.ts",
  "Session.ts",
  "ProviderAdapter.ts",
  "InnerLoop.ts",
  "ToolExecutor.ts",
  "Subagent.ts",
  "internal/agent.ts"
])
/** The loops and their machinery (`internal/loops/`). */
const isLoop = (file: string) =>
  /^(MailboxWorker|MainLoop|EvalLoop|LoopGroup)\.ts$/.test(file) || file.startsWith("internal/loops/")
const isAgent = (file: string) => agentModules.has(file) || file.startsWith("adapters/")
/** A transport: a mailbox or its drivers (the journal's step contract, `internal/journal.ts`, is not one). */
const isTransport = (file: string) =>
  /^Mailbox(Memory|Sql|SqlAdmin)?\.ts$/.test(file) || file.startsWith("internal/mailbox/") ||
  file.startsWith("internal/sql/")

const fixture = (files: Record<string, string>): string => {
  const root = mkdtempSync(join(tmpdir(), "leasehold-layout-"))
  for (const [file, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, file)), { recursive: true })
    writeFileSync(join(root, file), text)
  }
  return root
}

describe("the import graph", () => {
  it("counts value imports and re-exports, not type-only ones", () => {
    const text = [
      `import type { A } from "./a.js"`,
      `import { type B, type C } from "./b.js"`,
      `import { type D, e } from "./d.js"`,
      `import * as F from "./f.js"`,
      `import "./g.js"`,
      `import h from "./h.js"`,
      `export type { I } from "./i.js"`,
      `export { type J } from "./j.js"`,
      `export { k } from "./k.js"`,
      `export * from "./l.js"`,
      `export * as M from "./m.js"`,
      `const n = () => import("./n.js")`
    ].join("\n")
    expect(valueImports("x.ts", text)).toEqual(["./d.js", "./f.js", "./g.js", "./h.js", "./k.js", "./l.js", "./m.js"])
  })

  it("finds a planted circle through an internal module, and none when the way back is type-only", () => {
    const planted = fixture({
      "X.ts": `import { run } from "./internal/x.js"\nexport const x = run`,
      "internal/x.ts": `import { helper } from "../Y.js"\nexport const run = helper`,
      "Y.ts": `import * as X from "./X.js"\nexport const helper = 1\nexport const back = X`,
      "Z.ts": `import { x } from "./X.js"\nexport const z = x`
    })
    expect(cycles(graphOf(planted))).toEqual([["X.ts", "Y.ts", "internal/x.ts"]])

    const typeOnly = fixture({
      "X.ts": `import { run } from "./internal/x.js"\nexport const x = run\nexport interface Shape { a: number }`,
      "internal/x.ts": `import type { Shape } from "../X.js"\nexport const run = (s: Shape) => s.a`
    })
    expect(cycles(graphOf(typeOnly))).toEqual([])
  })

  it("finds a module that imports itself, and an edge by rule", () => {
    const root = fixture({
      "A.ts": `import { a } from "./A.js"\nexport { a }`,
      "internal/w.ts": `import { b } from "../cli/t.js"\nexport const c = b`,
      "cli/t.ts": `export const b = 1`
    })
    const g = graphOf(root)
    expect(cycles(g)).toEqual([["A.ts"]])
    expect(edges(g, (f) => !f.startsWith("cli/"), (f) => f.startsWith("cli/"))).toEqual(["internal/w.ts → cli/t.ts"])
  })
})

describe("src/ layout", () => {
  it("reads the sources", () => {
    expect(graph.get("index.ts")?.length).toBeGreaterThan(10)
    expect(graph.get("MainLoop.ts")).toContain("MailboxWorker.ts")
  })

  it("has no circle of run-time imports through a public module", () => {
    expect(cycles(graph).filter((component) => component.some(isPublic))).toEqual([])
  })

  it("has no circle of run-time imports at all", () => {
    expect(cycles(graph)).toEqual([])
  })

  it("nothing outside cli/ and bin/ imports cli/", () => {
    expect(edges(graph, (f) => !isCli(f), (f) => f.startsWith("cli/"))).toEqual([])
  })

  it("no loop machinery imports Health", () => {
    expect(edges(graph, isLoop, (f) => f === "Health.ts")).toEqual([])
  })

  it("the step-storage contract (internal/journal.ts) is a leaf", () => {
    expect(graph.get("internal/journal.ts")).toEqual([])
  })

  it("agent code imports no transport", () => {
    expect(edges(graph, isAgent, isTransport)).toEqual([])
  })
})
