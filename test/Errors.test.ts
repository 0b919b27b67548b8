import { SqlError } from "@effect/sql/SqlError"
import { describe, expect, it } from "@effect/vitest"
import * as Errors from "../src/Errors.js"
import { isUnreachable } from "../src/internal/errors.js"
import { MailboxConnectionError } from "../src/Mailbox.js"

const sqlError = (cause: object) => new SqlError({ cause, message: "Failed to execute statement" })

describe("Errors", () => {
  it("tells a store that cannot be reached from one that refused a statement", () => {
    const unreachable = [
      { code: "ECONNREFUSED", message: "connect ECONNREFUSED 127.0.0.1:5432" },
      { code: "57P01", message: "terminating connection due to administrator command" },
      { code: "08006", message: "connection failure" },
      { message: "Connection terminated unexpectedly" },
      { code: "SQLITE_BUSY", message: "database is locked" },
      { code: "SQLITE_CANTOPEN", message: "unable to open database file" }
    ]
    const refused = [
      { code: "23505", message: "duplicate key value violates unique constraint" },
      { code: "2201W", message: "LIMIT must not be negative" },
      { code: "SQLITE_CONSTRAINT_PRIMARYKEY", message: "UNIQUE constraint failed" },
      { code: "42P01", message: "relation \"x\" does not exist" }
    ]
    for (const cause of unreachable) expect(isUnreachable(sqlError(cause)), cause.message).toBe(true)
    for (const cause of refused) expect(isUnreachable(sqlError(cause)), cause.message).toBe(false)
  })

  it("a MailboxConnectionError says which it was, with the driver's own words", () => {
    const down = new MailboxConnectionError({
      mailbox: "jobs",
      cause: sqlError({ code: "ECONNREFUSED", message: "connect ECONNREFUSED" })
    })
    expect(down.message).toBe(
      `Mailbox "jobs" cannot reach its store: SqlError: Failed to execute statement (connect ECONNREFUSED)`
    )
    const refused = new MailboxConnectionError({
      mailbox: "jobs",
      cause: sqlError({ code: "23505", message: "duplicate key value violates unique constraint" })
    })
    expect(refused.message).toBe(
      `Mailbox "jobs": its store refused a statement: SqlError: Failed to execute statement (duplicate key value violates unique constraint)`
    )
  })

  it("describe keeps a tagged error's fields as JSON details, and no more", () => {
    const info = Errors.describe(new Errors.InvalidParameterError({ parameter: "limit", value: -1, reason: "bad" }))
    expect(info).toEqual({
      tag: "InvalidParameterError",
      message: "Invalid limit -1: bad",
      details: { parameter: "limit", value: -1, reason: "bad" }
    })
    expect(Errors.describe(new Error("plain"))).toEqual({ tag: "Error", message: "plain" })
    expect(Errors.describe("text")).toEqual({ tag: "Error", message: "text" })
  })
})
