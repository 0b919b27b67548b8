/**
 * The versions of the packages leasehold runs beside, in one table: what a message telling someone to install
 * a package names. Effect 4 is out, and a bare `npm install @effect/sql-pg` resolves a release that needs it,
 * so every install line names the Effect 3 range this release works with. The peers' ranges are
 * package.json's `peerDependencies` (test/peers.test.ts checks they are equal); `better-sqlite3` and `pg` are
 * the drivers' own dependencies, at the ranges those drivers ask for.
 */

/** Each package's range on the Effect 3 line. */
export const versions: Readonly<Record<string, string>> = {
  "effect": "^3.22.4",
  "@effect/platform": "^0.97.2",
  "@effect/sql": "^0.52.1",
  "@effect/ai": "^0.37.0",
  "@effect/ai-anthropic": "^0.27.0",
  "@effect/opentelemetry": "^0.64.1",
  "@effect/platform-node": "^0.108.2",
  "@effect/sql-pg": "^0.53.0",
  "@effect/sql-sqlite-node": "^0.53.0",
  "@opentelemetry/exporter-prometheus": "^0.223.0",
  "@opentelemetry/resources": "^2.12.0",
  "@opentelemetry/sdk-metrics": "^2.12.0",
  // Dependencies of @effect/sql-sqlite-node and @effect/sql-pg (better-sqlite3 13 crashes on Node 20).
  "better-sqlite3": "^12.6.2",
  "pg": "^8.16.3"
}

/** What to give `npm install` for `name`: `name@range` when the table knows it, else the bare name. */
export const installSpec = (name: string): string => {
  const range = versions[name]
  return range === undefined ? name : `${name}@${range}`
}
