/**
 * The database the console reads, kept honest. Over a SQLite file every look first compares the file the path
 * names now (links resolved: SQLite keeps `-wal` and `-shm` beside the file a link names) with the one opened
 * (device and inode): a replaced file is opened anew, its throughput started over; a file gone or unopenable is
 * a `problem` the page shows instead of old contents. PostgreSQL is read as it is.
 *
 * `identity` is the file's device and inode (PostgreSQL: the database's oid and name) plus the mailbox's own
 * random identity, read anew each time, so a copy over the file in place or tables made again is another
 * database; server.ts acts only on a database with the identity its form carries.
 *
 * Why the connections are handled so: a file written in place is read through a new connection (SQLite's cache
 * of the old pages is not trusted) and the one before closed at the next change; a file replaced while its
 * `-wal` or `-shm` stays is not opened (it would be read through the old log); a replaced file's connection is
 * never closed, since closing a WAL database's last connection deletes the `-wal` its name now gives the new
 * file (one connection per replacement, left to the process's end).
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Clock from "effect/Clock"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { realpathSync, statSync } from "node:fs"
import * as Journal from "../../internal/mailbox/sql/journal.js"
import * as Snapshot from "./snapshot.js"

/** What the console reads now: a database and its sampler, or why there is none. */
export type Current =
  | {
    readonly _tag: "Open"
    readonly sql: SqlClient.SqlClient
    readonly sampler: Snapshot.Sampler
    /**
     * Which database `sql` reads: `sqlite:<device>:<inode>` of the file it opened, or (no file) what the
     * database says it is, asked anew each time (`pg:<oid>:<name>` on PostgreSQL).
     */
    readonly identity: Effect.Effect<string, { readonly message: string }>
  }
  | { readonly _tag: "Problem"; readonly problem: string }

/** The file behind a SQLite console, and how to open it again. */
export interface File {
  readonly path: string
  /** Opens the file (a new client, kept open until the process ends: see the module comment). */
  readonly open: Effect.Effect<SqlClient.SqlClient, { readonly message: string }, Scope.Scope>
}

export interface Source {
  /** Looks at the file (if any) and answers what to read now. */
  readonly current: Effect.Effect<Current>
}

/** A file as `stat` sees it: which file (device and inode) and what it holds now (size, times). */
type Identity =
  | {
    readonly dev: number
    readonly ino: number
    readonly size: number
    readonly mtimeMs: number
    readonly ctimeMs: number
  }
  | undefined

const identity = (path: string): Identity => {
  const stats = statSync(path, { throwIfNoEntry: false })
  return stats === undefined
    ? undefined
    : { dev: stats.dev, ino: stats.ino, size: stats.size, mtimeMs: stats.mtimeMs, ctimeMs: stats.ctimeMs }
}

const same = (a: Identity, b: Identity) => a !== undefined && b !== undefined && a.dev === b.dev && a.ino === b.ino

/** The same file, and nothing wrote it since (its size and times are as they were). */
const unwritten = (a: Identity, b: Identity) =>
  same(a, b) && a!.size === b!.size && a!.mtimeMs === b!.mtimeMs && a!.ctimeMs === b!.ctimeMs

/**
 * The file `path` names, its symbolic links followed (SQLite finds a database's `-wal` and `-shm` beside the
 * file a link names, not beside the link); `path` itself when it names nothing now.
 */
const real = (path: string): string => {
  try {
    return realpathSync(path)
  } catch {
    return path
  }
}

const iso = (millis: number) => new Date(millis).toISOString()

/**
 * The mailbox's own identity under `prefix` (`<prefix>mailbox_identity`, drawn at random by mailbox migration
 * 12), read anew each time: a copy of another database, tables made again or an emptied file is another
 * database even where the file (or the PostgreSQL database) is the same. `none` where there is no such row.
 */
const mailboxIdentity = (sql: SqlClient.SqlClient, prefix: string): Effect.Effect<string> =>
  sql<{ id: string }>`SELECT id FROM ${sql(Journal.identityTable(prefix))} WHERE one = 1`.pipe(
    Effect.map((rows) => rows[0] === undefined ? "none" : String(rows[0].id)),
    Effect.orElseSucceed(() => "none")
  )

const named = (opened: Identity, sql: SqlClient.SqlClient, prefix: string) =>
  Effect.map(
    mailboxIdentity(sql, prefix),
    (mailbox) => `${opened === undefined ? "sqlite:unknown" : `sqlite:${opened.dev}:${opened.ino}`}:${mailbox}`
  )

/**
 * What a database without a file says it is: on PostgreSQL its oid and name (a database dropped and created
 * again under the same name has a new oid); elsewhere (a SQLite database that is no file) one fixed name.
 */
const asked = (sql: SqlClient.SqlClient, prefix: string): Effect.Effect<string, { readonly message: string }> =>
  Effect.zipWith(
    sql.onDialectOrElse({
      pg: () =>
        sql<{ oid: string; name: string }>`SELECT oid::text AS oid, datname AS name FROM pg_database
        WHERE datname = current_database()`.pipe(
          Effect.map((rows) => rows[0] === undefined ? "pg:unknown" : `pg:${rows[0].oid}:${rows[0].name}`),
          Effect.mapError((error) => ({ message: `could not tell which database this is: ${error.message}` }))
        ),
      orElse: () => Effect.succeed("sqlite:no file")
    }),
    mailboxIdentity(sql, prefix),
    (database, mailbox) => `${database}:${mailbox}`
  )

/**
 * The console's source over `sql` (open already); with `file`, watched as the module comment says. Each
 * database's throughput sampler runs every `sampleEvery` until the database is replaced or `Scope` closes.
 */
export const make = (
  sql: SqlClient.SqlClient,
  prefix: string,
  sampleEvery: Duration.DurationInput,
  file: File | undefined
): Effect.Effect<Source, never, Scope.Scope> =>
  Effect.gen(function*() {
    const outer = yield* Effect.scope
    /** Starts a database's sampler in a scope of its own (closed when the database is replaced). */
    const start = (
      client: SqlClient.SqlClient,
      identity: Extract<Current, { _tag: "Open" }>["identity"],
      seed?: Snapshot.Rates
    ) =>
      Effect.gen(function*() {
        const scope = yield* Scope.fork(outer, ExecutionStrategy.sequential)
        const sampler = yield* Snapshot.makeSampler(client, prefix, seed)
        yield* sampler.sample.pipe(
          Effect.repeat(Schedule.spaced(sampleEvery)),
          Effect.forkIn(scope)
        )
        return { current: { _tag: "Open", sql: client, sampler, identity } as Current, scope }
      })
    if (file === undefined) {
      const state = yield* start(sql, asked(sql, prefix))
      return { current: Effect.succeed(state.current) }
    }

    let opened = identity(file.path)
    let state = yield* start(sql, named(opened, sql, prefix))
    /**
     * The `-wal` and `-shm` files seen beside the open file. SQLite finds them by name: a file replaced without
     * them would be read through the old file's log (its rows shown as the new file's, and written into).
     */
    let logs: { readonly wal: Identity; readonly shm: Identity } = { wal: undefined, shm: undefined }
    const logsOf = () => {
      const path = real(file.path)
      return { wal: identity(`${path}-wal`), shm: identity(`${path}-shm`) }
    }
    const remember = () => {
      const now = logsOf()
      logs = { wal: now.wal ?? logs.wal, shm: now.shm ?? logs.shm }
    }
    remember()
    /**
     * The connections opened for a file written in place, each in its own scope: the one before the newest is
     * closed at the next such opening (not at once: a page may still be reading through it).
     * A replaced file's are forgotten, never closed: see the module comment.
     */
    let connections: ReadonlyArray<Scope.CloseableScope> = []
    const lock = yield* Effect.makeSemaphore(1)
    const stop = Effect.suspend(() => Scope.close(state.scope, Exit.void))
    /** The file the path names is not the one open: says so, then opens it if it is there. */
    const changed = (now: Identity, at: number) =>
      Effect.gen(function*() {
        const gone = now === undefined
        yield* stop
        // The old file's connections stay open (closing the last would delete the -wal its name now names).
        connections = []
        const what = gone
          ? `The database file ${file.path} was deleted at ${iso(at)}; this console shows nothing until it is back.`
          : `The database file ${file.path} was replaced at ${iso(at)}`
        state = { current: { _tag: "Problem", problem: what }, scope: state.scope }
        opened = now
        if (gone) return
        const left = logsOf()
        const beside = real(file.path)
        const stale = [
          ...(same(left.wal, logs.wal) ? [`${beside}-wal`] : []),
          ...(same(left.shm, logs.shm) ? [`${beside}-shm`] : [])
        ]
        if (stale.length > 0) {
          state = {
            current: {
              _tag: "Problem",
              problem:
                `${what}, but ${stale.join(" and ")} ${
                  stale.length === 1 ? "is" : "are"
                } still the old file's: SQLite would read the new file through them (showing the old file's rows as ` +
                "its own) and write into them. Stop the old file's writers and move or delete them with the file; " +
                "this console reads the new file once they are gone."
            },
            scope: state.scope
          }
          // Looked at again at the next look.
          opened = undefined
          return
        }
        // Opened in the console's own scope: never closed early (see the module comment).
        const client = yield* Scope.extend(file.open, outer).pipe(Effect.either)
        if (client._tag === "Left") {
          state = {
            current: { _tag: "Problem", problem: `${what}, and could not be opened: ${client.left.message}` },
            scope: state.scope
          }
          // Tried again at the next look.
          opened = undefined
          return
        }
        // The file is the one stat named only if the path still names it once open: else it is looked at again
        // (and opened anew) at the next look, so an identity never names another file than the one read.
        const after = identity(file.path)
        opened = same(after, now) ? after : undefined
        state = yield* start(client.right, named(now, client.right, prefix))
        logs = { wal: undefined, shm: undefined }
        remember()
        yield* Effect.logInfo(`leasehold console: ${what}; reading the new file`)
      })
    /**
     * The file is the one open but was written since (its size or times changed): by SQLite's checkpoints, or
     * by a copy over it in place (`cp other.db live.db`) or a truncation, which SQLite's cache does not notice
     * (the old rows would still be shown, and written back). Read through a new connection from now on; its
     * identity (the mailbox's own, read anew) tells a copy of another database from this one.
     */
    const rewritten = (now: Identity) =>
      Effect.gen(function*() {
        const scope = yield* Scope.fork(outer, ExecutionStrategy.sequential)
        const client = yield* Scope.extend(file.open, scope).pipe(Effect.either)
        if (client._tag === "Left") {
          yield* Scope.close(scope, Exit.void)
          yield* stop
          state = {
            current: {
              _tag: "Problem",
              problem:
                `The database file ${file.path} was written in place and could not be opened again: ${client.left.message}`
            },
            scope: state.scope
          }
          // Tried again at the next look.
          opened = undefined
          return
        }
        // The same database written by a checkpoint keeps its throughput; another one starts over.
        const before = state.current
        const seed = before._tag === "Open"
          ? yield* Effect.zipWith(
            Effect.either(before.identity),
            Effect.either(named(now, client.right, prefix)),
            (a, b) => Either.isRight(a) && Either.isRight(b) && a.right === b.right
          ).pipe(
            Effect.flatMap((kept) =>
              kept
                ? Effect.map(before.sampler.rates, (r) => r as Snapshot.Rates | undefined)
                : Effect.succeed(undefined)
            )
          )
          : undefined
        yield* stop
        const after = identity(file.path)
        opened = same(after, now) ? after : undefined
        state = yield* start(client.right, named(now, client.right, prefix), seed)
        const [older, ...kept] = [...connections, scope].length > 2
          ? [...connections, scope]
          : [undefined, ...connections, scope]
        if (older !== undefined) yield* Scope.close(older, Exit.void)
        connections = kept
        remember()
      })
    const current = lock.withPermits(1)(Effect.gen(function*() {
      const now = identity(file.path)
      if (!same(now, opened) && !(now === undefined && opened === undefined)) {
        yield* changed(now, yield* Clock.currentTimeMillis)
      } else if (state.current._tag === "Open" && !unwritten(now, opened)) {
        yield* rewritten(now)
      } else if (state.current._tag === "Open") {
        remember()
      }
      return state.current
    }))
    // Looked at with each sample too, so a replaced file's sampler stops even while no page is open.
    yield* current.pipe(Effect.repeat(Schedule.spaced(sampleEvery)), Effect.forkScoped)
    return { current }
  })
