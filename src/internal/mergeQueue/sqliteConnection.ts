/**
 * SQLite's coordination calls on one connection, held for the call: its statements — compiled once from
 * parameterised `sql` templates (`compiled.ts`) — run on the connection directly, and its writes in one
 * transaction begun with `BEGIN IMMEDIATE` (the file's write lock first, waited for, as
 * `Sql.writeTransaction` does).
 * SQLite does a statement's work in microseconds; going through the client for each one (a span, the
 * connection's semaphore) and through `withTransaction` for each transaction cost the merge queue several
 * times SQLite's own work. Inside a caller's transaction the call runs on that transaction's connection,
 * its writes under a savepoint.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import type { Compiled } from "./compiled.js"

/** A connection held for one call. */
export interface Held {
  /** Runs a compiled statement with `params` on the connection; the time is read when it runs. */
  readonly run: <P, A extends object>(compiled: Compiled<P, A>, params: P) => Effect.Effect<ReadonlyArray<A>, SqlError>
  /** Runs `effect` as one write transaction on the connection: committed when it succeeds, else rolled back. */
  readonly write: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | SqlError, R>
}

const run = (connection: Connection, text: string) => connection.execute(text, [], undefined)

const hold = (connection: Connection, nested: boolean, testNow: (() => number) | undefined): Held => {
  const [begin, commit, rollback] = nested
    ? ["SAVEPOINT merge_queue", "RELEASE merge_queue", "ROLLBACK TO merge_queue"]
    : ["BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"]
  const undo = nested
    ? Effect.zipRight(run(connection, rollback), run(connection, commit))
    : run(connection, rollback)
  return {
    run: <P, A extends object>(compiled: Compiled<P, A>, params: P) =>
      Effect.suspend(() =>
        connection.execute(compiled.text, compiled.values(params, testNow?.()), undefined) as Effect.Effect<
          ReadonlyArray<A>,
          SqlError
        >
      ),
    write: <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(
          run(connection, begin),
          Effect.flatMap(Effect.exit(restore(effect)), (exit): Effect.Effect<A, E | SqlError> =>
            Exit.isSuccess(exit)
              ? Effect.as(Effect.tapError(run(connection, commit), () => Effect.ignore(undo)), exit.value)
              : Effect.zipRight(Effect.ignore(undo), exit))
        )
      )
  }
}

/**
 * Runs `body` with a connection of `sql` held for it (the caller's transaction's, when there is one).
 * `testNow`: the test's time, bound to compiled statements that read the clock (see `compiled.ts`).
 */
export const withConnection =
  (sql: SqlClient.SqlClient, testNow: (() => number) | undefined) =>
  <A, E, R>(body: (held: Held) => Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError, R> =>
    Effect.flatMap(
      Effect.serviceOption(SqlClient.TransactionConnection),
      (outer): Effect.Effect<A, E | SqlError, R> =>
        Option.isSome(outer)
          ? body(hold(outer.value[0], true, testNow))
          : Effect.scoped(Effect.flatMap(sql.reserve, (connection) => body(hold(connection, false, testNow))))
    )
