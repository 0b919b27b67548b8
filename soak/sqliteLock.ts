/**
 * The nemesis's SQLite fault: another process takes the database file's write lock (`BEGIN IMMEDIATE` on its
 * own connection, as any other program on the machine could) and holds it for a few seconds, then commits.
 * Meanwhile every leasehold writer waits on the busy timeout — receives, acknowledgements, lease extensions.
 * The hold is shorter than the busy timeout (5 s), so writers wait rather than fail; a lease that was due for
 * an extension during the hold may lapse, which is the fault's point.
 *
 * History (its own file): `sqlite-lock-held` once it holds the lock, `sqlite-lock-released` once it let go.
 *
 * Usage (the nemesis runs it): node sqliteLock.mjs '<config json>' <proc> <hold-ms>
 */
import { createRequire } from "node:module"
import * as History from "./history.js"
import * as Protocol from "./protocol.js"

const { config, proc } = Protocol.fromArgv()
const holdMs = Number(process.argv[4] ?? "3000")
const history = History.open(config.dir, proc)

// better-sqlite3 ships no types of its own; the two calls used here.
const Sqlite = createRequire(import.meta.url)("better-sqlite3") as new(
  filename: string,
  options: { readonly timeout: number }
) => { exec: (sql: string) => void; close: () => void }
const db = new Sqlite(config.target, { timeout: 30_000 })
db.exec("BEGIN IMMEDIATE")
history.append({ ev: "sqlite-lock-held" })
// Node's timer, not a busy loop: the process holds the lock while idle, like a program that forgot a transaction.
setTimeout(() => {
  db.exec("COMMIT")
  history.append({ ev: "sqlite-lock-released" })
  db.close()
  history.close()
}, holdMs)
