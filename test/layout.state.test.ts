/**
 * State has an owner: no module of `src/` keeps mutable state at its top level (a `let`, a mutable collection,
 * a `Ref` made outside any effect). Per-key state lives in a layer's scope or on the object it belongs to; a
 * constant lookup table is typed `Readonly…`. Checked by parsing every `src/**\/*.ts` with the TypeScript
 * compiler, and shown to catch a planted example.
 */
import { describe, expect, it } from "@effect/vitest"
import { readdirSync, readFileSync } from "node:fs"
import { join, relative } from "node:path"
import ts from "typescript"

const root = join(import.meta.dirname, "..")

/** Constructors of mutable collections. */
const collections: ReadonlySet<string> = new Set(["Map", "Set", "WeakMap", "WeakSet", "Array"])
/** Effect's mutable cells and collections, made outside an effect (`Ref.unsafeMake`, `MutableHashMap.empty`). */
const effectCells: ReadonlySet<string> = new Set([
  "Ref.unsafeMake",
  "SynchronizedRef.unsafeMake",
  "SubscriptionRef.unsafeMake",
  "Deferred.unsafeMake",
  "MutableRef.make",
  "MutableHashMap.empty",
  "MutableHashMap.make",
  "MutableHashMap.fromIterable",
  "MutableHashSet.empty",
  "MutableHashSet.make",
  "MutableList.empty",
  "MutableQueue.bounded",
  "MutableQueue.unbounded"
])

/** The top-level declarations of `source` that hold mutable state, as `name: why`. */
export const moduleState = (fileName: string, source: string): Array<string> => {
  const file = ts.createSourceFile(fileName, source, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS)
  const found: Array<string> = []
  for (const statement of file.statements) {
    if (!ts.isVariableStatement(statement)) continue
    const list = statement.declarationList
    const mutableBinding = (list.flags & (ts.NodeFlags.Let | ts.NodeFlags.Const | ts.NodeFlags.Using)) !==
      ts.NodeFlags.Const
    for (const declaration of list.declarations) {
      const name = declaration.name.getText(file)
      if (mutableBinding) {
        found.push(`${name}: a module-level ${list.flags & ts.NodeFlags.Let ? "let" : "var"}`)
        continue
      }
      const readonlyType = declaration.type !== undefined && /^Readonly/.test(declaration.type.getText(file))
      let init = declaration.initializer
      while (init !== undefined && (ts.isAsExpression(init) || ts.isSatisfiesExpression(init))) {
        if (ts.isAsExpression(init) && /^Readonly/.test(init.type.getText(file))) break
        init = init.expression
      }
      if (init === undefined || readonlyType) continue
      if (ts.isNewExpression(init) && collections.has(init.expression.getText(file))) {
        found.push(`${name}: a module-level new ${init.expression.getText(file)} (type it Readonly… if it is constant)`)
      } else if (ts.isCallExpression(init) && effectCells.has(init.expression.getText(file))) {
        found.push(`${name}: a module-level ${init.expression.getText(file)}`)
      }
    }
  }
  return found
}

const sources = (directory: string): Array<string> =>
  readdirSync(directory, { withFileTypes: true }).flatMap((entry) => {
    const path = join(directory, entry.name)
    if (entry.isDirectory()) return sources(path)
    return entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts") ? [path] : []
  })

describe("module-level state", () => {
  it("no module of src/ keeps mutable state at its top level", () => {
    const offences = sources(join(root, "src")).flatMap((path) =>
      moduleState(path, readFileSync(path, "utf8")).map((why) => `${relative(root, path)}: ${why}`)
    )
    expect(offences).toEqual([])
  })

  it("the check finds a planted example of each kind, and lets constants and locals be", () => {
    const planted = `
      import * as Ref from "effect/Ref"
      let counter = 0
      export let prefix = ""
      var legacy = 1
      const stores = new WeakMap<object, string>()
      export const registries: WeakMap<object, number> = new WeakMap()
      const seen = new Set<string>()
      const queue = new Array<number>()
      const cache = new Map() as Map<string, number>
      const cell = Ref.unsafeMake(0)
      const table: ReadonlySet<string> = new Set(["a", "b"])
      const names = new Set(["x"]) as ReadonlySet<string>
      const limit = 10
      const make = () => { let local = 0; const map = new Map(); return { local, map } }
      class Impl { private readonly open = new Map<string, number>() }
    `
    expect(moduleState("planted.ts", planted).map((why) => why.split(":")[0])).toEqual([
      "counter",
      "prefix",
      "legacy",
      "stores",
      "registries",
      "seen",
      "queue",
      "cache",
      "cell"
    ])
  })
})
