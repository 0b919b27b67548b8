/**
 * SQLite's coordination calls on one connection, held for the call: its statements — compiled once from
 * parameterised `sql` templates (`compiled.ts`) — run on the connection directly, without a span or the
 * client's semaphore per statement, and its writes under the one write discipline (`Sql.writeTransactionOn`:
 * `BEGIN IMMEDIATE`, a failed COMMIT rolled back and failed). Inside a caller's transaction the call runs on
 * that transaction's connection, its writes under a savepoint.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import type { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Sql from "../sql/common.js"
import type { Compiled } from "./compiled.js"

/** A connection held for one call. */
export interface Held {
  /** Runs a compiled statement with `params` on the connection; the time is read when it runs. */
  readonly run: <P, A extends object>(compiled: Compiled<P, A>, params: P) => Effect.Effect<ReadonlyArray<A>, SqlError>
  /** Runs `effect` as one write transaction on the connection: committed when it succeeds, else rolled back. */
  readonly write: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | SqlError, R>
}

const hold = (connection: Connection, depth: number, testNow: (() => number) | undefined): Held => ({
  run: <P, A extends object>(compiled: Compiled<P, A>, params: P) =>
    Effect.suspend(() =>
      connection.execute(compiled.text, compiled.values(params, testNow?.()), undefined) as Effect.Effect<
        ReadonlyArray<A>,
        SqlError
      >
    ),
  write: Sql.writeTransactionOn("sqlite", connection, depth)
})

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
          ? body(hold(outer.value[0], outer.value[1] + 1, testNow))
          : Effect.scoped(Effect.flatMap(sql.reserve, (connection) => body(hold(connection, 0, testNow))))
    )
