/**
 * The value-import graph of a source tree, read with the TypeScript parser: an edge for every `import` or
 * `export … from` that loads a module at run time. `import type`, `export type` and declarations whose every
 * specifier is `type` are left out (they vanish when compiled), as are dynamic `import()`s (they load on demand,
 * after both modules finished loading, so they close no loading circle).
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import ts from "typescript"

/** Files (relative to the root, `/`-separated) and the files each imports at run time. */
export type Graph = ReadonlyMap<string, ReadonlyArray<string>>

const isTypeOnlyImport = (node: ts.ImportDeclaration): boolean => {
  const clause = node.importClause
  if (clause === undefined) return false // `import "x"`: run for its effects
  if (clause.isTypeOnly) return true
  if (clause.name !== undefined) return false
  const bindings = clause.namedBindings
  if (bindings === undefined) return false
  if (ts.isNamespaceImport(bindings)) return false
  return bindings.elements.length > 0 && bindings.elements.every((e) => e.isTypeOnly)
}

const isTypeOnlyExport = (node: ts.ExportDeclaration): boolean => {
  if (node.isTypeOnly) return true
  const clause = node.exportClause
  if (clause === undefined || !ts.isNamedExports(clause)) return false // `export *`, `export * as X`
  return clause.elements.length > 0 && clause.elements.every((e) => e.isTypeOnly)
}

/** The modules `text` loads at run time, as the specifiers written. */
export const valueImports = (fileName: string, text: string): ReadonlyArray<string> => {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, false, ts.ScriptKind.TS)
  const specifiers: Array<string> = []
  for (const statement of source.statements) {
    if (ts.isImportDeclaration(statement)) {
      if (!isTypeOnlyImport(statement) && ts.isStringLiteral(statement.moduleSpecifier)) {
        specifiers.push(statement.moduleSpecifier.text)
      }
    } else if (ts.isExportDeclaration(statement)) {
      const specifier = statement.moduleSpecifier
      if (specifier !== undefined && ts.isStringLiteral(specifier) && !isTypeOnlyExport(statement)) {
        specifiers.push(specifier.text)
      }
    } else if (ts.isImportEqualsDeclaration(statement) && !statement.isTypeOnly) {
      const reference = statement.moduleReference
      if (ts.isExternalModuleReference(reference) && ts.isStringLiteral(reference.expression)) {
        specifiers.push(reference.expression.text)
      }
    }
  }
  return specifiers
}

/** A relative specifier's file under `root` (`./x.js` → `x.ts`), or undefined for a package or a file outside. */
const resolveSpecifier = (root: string, from: string, specifier: string): string | undefined => {
  if (!specifier.startsWith(".")) return undefined
  const base = resolve(dirname(join(root, from)), specifier)
  const candidates = [
    base.replace(/\.js$/, ".ts"),
    base.replace(/\.cjs$/, ".cts"),
    `${base}.ts`,
    join(base, "index.ts")
  ]
  const found = candidates.find((c) => existsSync(c) && statSync(c).isFile())
  if (found === undefined) return undefined
  const rel = relative(root, found).split("\\").join("/")
  return rel.startsWith("..") ? undefined : rel
}

const sources = (root: string, dir = ""): Array<string> =>
  readdirSync(join(root, dir), { withFileTypes: true }).flatMap((entry) => {
    const rel = dir === "" ? entry.name : `${dir}/${entry.name}`
    if (entry.isDirectory()) return sources(root, rel)
    return /\.(m|c)?ts$/.test(entry.name) && !entry.name.endsWith(".d.ts") ? [rel] : []
  })

/** The value-import graph of every `.ts` file under `root`. */
export const graphOf = (root: string): Graph => {
  const graph = new Map<string, ReadonlyArray<string>>()
  for (const file of sources(root)) {
    const targets = valueImports(file, readFileSync(join(root, file), "utf8"))
      .map((s) => resolveSpecifier(root, file, s))
      .filter((t): t is string => t !== undefined)
    graph.set(file, [...new Set(targets)])
  }
  return graph
}

/** The strongly connected components of more than one file (or a file importing itself): the import circles. */
export const cycles = (graph: Graph): ReadonlyArray<ReadonlyArray<string>> => {
  // Tarjan's algorithm, iterative so a deep tree cannot overflow the stack.
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const onStack = new Set<string>()
  const stack: Array<string> = []
  const found: Array<Array<string>> = []
  let next = 0
  for (const start of graph.keys()) {
    if (index.has(start)) continue
    const work: Array<{ node: string; edge: number }> = [{ node: start, edge: 0 }]
    index.set(start, next)
    low.set(start, next++)
    stack.push(start)
    onStack.add(start)
    while (work.length > 0) {
      const frame = work[work.length - 1]!
      const edges = graph.get(frame.node) ?? []
      if (frame.edge < edges.length) {
        const to = edges[frame.edge++]!
        if (!index.has(to)) {
          index.set(to, next)
          low.set(to, next++)
          stack.push(to)
          onStack.add(to)
          work.push({ node: to, edge: 0 })
        } else if (onStack.has(to)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!))
        }
        continue
      }
      work.pop()
      const parent = work[work.length - 1]
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!))
      if (low.get(frame.node) === index.get(frame.node)) {
        const component: Array<string> = []
        for (;;) {
          const member = stack.pop()!
          onStack.delete(member)
          component.push(member)
          if (member === frame.node) break
        }
        if (component.length > 1 || (graph.get(frame.node) ?? []).includes(frame.node)) {
          found.push(component.sort())
        }
      }
    }
  }
  return found
}

/** Every edge `from → to` where `from` matches `importer` and `to` matches `imported`. */
export const edges = (
  graph: Graph,
  importer: (file: string) => boolean,
  imported: (file: string) => boolean
): ReadonlyArray<string> =>
  [...graph].flatMap(([from, targets]) => importer(from) ? targets.filter(imported).map((to) => `${from} → ${to}`) : [])
