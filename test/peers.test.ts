/**
 * Install lines that resolve: every version leasehold tells someone to install is on the Effect 3 line its
 * package.json's peers give. The table a missing-package message takes its range from (src/internal/peers.ts)
 * is package.json's peer ranges; every message built from it, every `name@range` written in README.md,
 * CHANGELOG.md, docs/*.md and src/ lies within the range package.json gives that package (its peer range,
 * else its devDependency range: the version the tests run), and no `npm install` line of the docs, nor the
 * README's table of optional peers, names an Effect package without a range (a bare name resolves Effect 4).
 * The packaging test (package.test.ts) runs the README's line itself.
 */
import { describe, expect, it } from "@effect/vitest"
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import semver from "semver"
import { MissingPackageError } from "../src/Errors.js"
import * as Peers from "../src/internal/peers.js"

const manifest = JSON.parse(readFileSync("package.json", "utf8")) as {
  readonly peerDependencies: Record<string, string>
  readonly devDependencies: Record<string, string>
}

/** The range package.json gives `name`: its peer range, else its devDependency range. */
const rangeOf = (name: string): string | undefined => manifest.peerDependencies[name] ?? manifest.devDependencies[name]

const isEffect = (name: string) => name === "effect" || name.startsWith("@effect/")

const documents = [
  "README.md",
  "CHANGELOG.md",
  ...readdirSync("docs").filter((file) => file.endsWith(".md")).map((file) => `docs/${file}`)
]

const sources = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory()
      ? sources(join(dir, entry.name))
      : entry.name.endsWith(".ts")
      ? [join(dir, entry.name)]
      : []
  )

/** Every `name@range` in `text` (a range written as npm takes it: `^1.2.3`, `~1.2.3`, `1.2.3`). */
const versionsNamed = (text: string) =>
  [...text.matchAll(/(?<![\w/@.:-])((?:@[a-z0-9-]+\/)?[a-z0-9][a-z0-9._-]*)@([~^]?\d+\.\d+\.\d+[\w.+-]*)/g)].map((
    [, name, range]
  ) => ({ name: name!, range: range! }))

/** The `npm install` lines of `text` (a line ending in `\` goes on), split into words. */
const installLines = (text: string) =>
  [...text.replace(/\\\n\s*/g, " ").matchAll(/npm install ([^\n`]*)/g)].map(([, rest]) =>
    rest!.trim().split(/\s+/).filter((word) => !word.startsWith("-"))
  )

describe("install lines", () => {
  it("the table a missing-package message reads is package.json's peer ranges, and the drivers' own dependencies", () => {
    const peers = Object.fromEntries(Object.keys(manifest.peerDependencies).map((name) => [name, Peers.versions[name]]))
    expect(peers).toEqual(manifest.peerDependencies)
    const driverDependencies = {
      ...JSON.parse(readFileSync("node_modules/@effect/sql-sqlite-node/package.json", "utf8")).dependencies,
      ...JSON.parse(readFileSync("node_modules/@effect/sql-pg/package.json", "utf8")).dependencies
    }
    for (const name of Object.keys(Peers.versions).filter((name) => manifest.peerDependencies[name] === undefined)) {
      expect(Peers.versions[name], name).toBe(driverDependencies[name])
    }
  })

  it("a missing-package message gives a line that installs the range the peers give", () => {
    for (const [name, range] of Object.entries(manifest.peerDependencies)) {
      const message = new MissingPackageError({ packageName: name, neededBy: "Database.layerPg" }).message
      expect(message).toBe(
        `Database.layerPg needs the package ${name}, which is not installed: npm install ${name}@${range}`
      )
    }
    // Not one of ours: the bare name, not a range we cannot vouch for.
    expect(new MissingPackageError({ packageName: "left-pad", neededBy: "x" }).message).toMatch(/npm install left-pad$/)
  })

  it("every version the docs and the sources name lies within package.json's range for that package", () => {
    const named = [...documents, ...sources("src")].flatMap((file) =>
      versionsNamed(readFileSync(file, "utf8")).map((version) => ({ ...version, file }))
    )
    const effectNames = named.filter(({ name }) => isEffect(name))
    // The README's install line and the optional peers' table at least.
    expect(effectNames.filter(({ file }) => file === "README.md").length).toBeGreaterThanOrEqual(9)
    for (const { file, name, range } of named) {
      const allowed = rangeOf(name)
      if (allowed === undefined) {
        // An Effect package must be one package.json knows; another one (an OpenTelemetry exporter) may not be.
        expect(isEffect(name), `${file}: ${name}@${range} is not in package.json`).toBe(false)
        continue
      }
      expect(semver.subset(range, allowed), `${file}: ${name}@${range} is not within ${allowed}`).toBe(true)
    }
  })

  it("no install line, nor the README's table of optional peers, names an Effect package without a range", () => {
    for (const file of documents) {
      for (const words of installLines(readFileSync(file, "utf8"))) {
        for (const word of words.filter((word) => word !== "leasehold")) {
          if (isEffect(word.replace(/@[^@/]*$/, ""))) {
            expect(versionsNamed(word), `${file}: npm install … ${word}`).toHaveLength(1)
          }
        }
      }
    }
    const readme = readFileSync("README.md", "utf8")
    const install = readme.slice(
      readme.indexOf("\n## Install\n"),
      readme.indexOf("\n## ", readme.indexOf("\n## Install\n") + 1)
    )
    const rows = install.split("\n").filter((line) => line.startsWith("| ") && !line.startsWith("| to use"))
    expect(rows.length).toBeGreaterThanOrEqual(5)
    for (const row of rows) {
      const add = row.split(" | ").at(-1)!
      const packages = [...add.matchAll(/`([^`]+)`/g)].flatMap(([, span]) => span!.split(/\s+/))
      for (const spec of packages) expect(versionsNamed(spec), `README's table: ${spec}`).toHaveLength(1)
    }
  })
})
