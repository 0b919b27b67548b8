/**
 * Redaction: one URL-aware function hides every secret a database target can hold — a URL's password (which
 * ends at the last `@` before the host, and may hold raw `@ / # ? :`), `password=` / `sslpassword=` query
 * parameters and key=value connection strings — and every message that can show a target goes through it.
 * Property tests draw passwords from a rich alphabet and check that neither the raw nor the percent-decoded
 * (nor the percent-encoded) password ever appears: in `redact`'s output, in `Database.layerPg`'s and
 * `Database.layerFromEnv`'s `DatabaseError`s and the services' PostgreSQL layers' errors (message, fields and
 * pretty cause).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, ConfigProvider, Effect, Layer, Redacted } from "effect"
import * as Database from "../src/Database.js"
import { redact } from "../src/internal/sql/target.js"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MergeQueue from "../src/MergeQueue.js"
import { expectNoPassword, password } from "./support/secrets.js"

/** Every way a target can carry a password: the password as written in it, and the target. */
const targets = (secret: string): ReadonlyArray<readonly [written: string, target: string]> => {
  const encoded = encodeURIComponent(secret)
  const quoted = `'${secret.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`
  return [
    [secret, `postgres://me:${secret}@db.example:5432/app`],
    [encoded, `postgres://me:${encoded}@db.example:5432/app`],
    [secret, `postgresql://:${secret}@db.example/app`],
    [secret, `POSTGRES://me:${secret}@db.example/app?sslmode=require`],
    [secret, `pg://me:${secret}@[::1]:5432/app`],
    [secret, `mysql://root:${secret}@db.example/app`],
    [secret, `https://me:${secret}@db.example/`],
    [secret, `jdbc:postgresql://me:${secret}@db.example/app`],
    [secret, `me:${secret}@db.example/app`],
    [encoded, `postgres://db.example/app?user=me&password=${encoded}&sslmode=require`],
    [secret, `postgres://db.example/app?password=${secret}`],
    [encoded, `postgres://me@db.example/app?sslmode=verify-full&sslpassword=${encoded}`],
    [secret, `postgres://db.example/app?application_name=x&PassWord=${secret}`],
    [secret, `host=db.example port=5432 password=${secret} dbname=app`],
    [quoted, `host=db.example password = ${quoted} dbname=app`]
  ]
}

describe("redact", () => {
  it("hides the password up to the last @ before the host, whatever it holds", () => {
    expect(redact("postgres://u:p@ss@host/db")).toBe("postgres://u:***@host/db")
    expect(redact("postgres://u:pa/ss#x@host")).toBe("postgres://u:***@host")
    expect(redact("postgres://u:pa?ss:x@host:5432/db")).toBe("postgres://u:***@host:5432/db")
    expect(redact("postgres://me:secret@db:5432/x")).toBe("postgres://me:***@db:5432/x")
    expect(redact("postgres://:secret@db/x")).toBe("postgres://:***@db/x")
    expect(redact("POSTGRESQL://me:secret@db/x")).toBe("POSTGRESQL://me:***@db/x")
    expect(redact("pg://me:secret@db/x")).toBe("pg://me:***@db/x")
    expect(redact("postgres://me@db/x")).toBe("postgres://me@db/x")
  })

  it("hides passwords of every scheme, and of a URL with no scheme", () => {
    expect(redact("mysql://root:pw@db/x")).toBe("mysql://root:***@db/x")
    expect(redact("jdbc:postgresql://me:pw@db/x")).toBe("jdbc:postgresql://me:***@db/x")
    expect(redact("me:pw@db:5432/x")).toBe("me:***@db:5432/x")
  })

  it("hides secret query parameters (and what follows them) and key=value passwords", () => {
    expect(redact("postgres://db/x?user=me&password=secret&sslmode=require")).toBe(
      "postgres://db/x?user=me&password=***"
    )
    expect(redact("postgres://db/x?PASSWORD=secret")).toBe("postgres://db/x?PASSWORD=***")
    expect(redact("postgres://db/x?sslmode=require&sslpassword=secret")).toBe(
      "postgres://db/x?sslmode=require&sslpassword=***"
    )
    expect(redact("postgres://db/x?pass%77ord=secret")).toBe("postgres://db/x?pass%77ord=***")
    expect(redact("host=db password=secret dbname=x")).toBe("host=db password=***")
    expect(redact("host=db password = 'se cret' dbname=x")).toBe("host=db password = ***")
  })

  it("shows files and SQLite URLs as they are; redacting twice changes nothing", () => {
    for (const file of ["./queue.db", "/var/lib/leasehold/app.db", "sqlite:app.db", "file:///tmp/x.db"]) {
      expect(redact(file)).toBe(file)
    }
    const once = redact("postgres://me:p@ss@db/x?password=y")
    expect(redact(once)).toBe(once)
  })

  it.prop("never shows a password, raw, percent-encoded or decoded", { secret: password }, ({ secret }) => {
    for (const [written, target] of targets(secret)) expectNoPassword(redact(target), target, written, secret)
  }, { fastCheck: { numRuns: 300 } })
})

/** Everything a failure to build `layer` can print: its tag, and its message, fields and pretty cause. */
const printed = <A, E>(layer: Layer.Layer<A, E>) =>
  Effect.map(Effect.flip(Effect.scoped(Layer.build(Layer.fresh(layer)))), (error) => ({
    tag: (error as { readonly _tag?: string })._tag,
    text: [String(error), JSON.stringify(error), Cause.pretty(Cause.fail(error))].join("\n")
  }))

const fromEnv = (value: string) =>
  printed(Database.layerFromEnv).pipe(
    Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["LEASEHOLD_DATABASE_URL", value]])))
  )

describe("errors that name a database", () => {
  it.live.prop(
    "Database.layerPg's DatabaseError never shows the password (a closed local port)",
    { secret: password },
    ({ secret }) =>
      Effect.gen(function*() {
        const encoded = encodeURIComponent(secret)
        for (
          const [written, url] of [
            [secret, `postgres://me:${secret}@127.0.0.1:1/app`],
            [encoded, `postgres://me:${encoded}@127.0.0.1:1/app`],
            [encoded, `postgres://127.0.0.1:1/app?password=${encoded}`],
            [secret, `host=127.0.0.1 port=1 password=${secret}`]
          ] as const
        ) {
          for (const given of [url, Redacted.make(url)]) {
            const failure = yield* printed(Database.layerPg({ url: given, maxConnections: 1 }))
            expect(failure.tag).toBe("DatabaseError")
            // An encoded password makes a URL the driver takes: the server's refusal is what is shown.
            if (written === encoded && url.includes("@")) expect(failure.text).toContain("did not answer")
            expectNoPassword(failure.text, url, written, secret)
          }
          // The services' own PostgreSQL layers wrap that error in theirs.
          for (
            const failure of [
              yield* printed(MailboxSql.layerPg({ url, maxConnections: 1 })),
              yield* printed(MergeQueue.layerPg({ url }))
            ]
          ) {
            expectNoPassword(failure.text, url, written, secret)
          }
        }
      }),
    { timeout: 120_000, fastCheck: { numRuns: 25 } }
  )

  it.live.prop(
    "Database.layerFromEnv refuses other schemes naming the scheme, never the password",
    { secret: password },
    ({ secret }) =>
      Effect.gen(function*() {
        for (const scheme of ["mysql", "http", "redis"]) {
          const url = `${scheme}://root:${secret}@db.example/app`
          const failure = yield* fromEnv(url)
          expect(failure.tag).toBe("DatabaseError")
          expect(failure.text).toContain(`"${scheme}:"`)
          expectNoPassword(failure.text, url, secret, secret)
        }
        const kv = `host=db.example password=${secret}`
        const refused = yield* fromEnv(kv)
        expect(refused.tag).toBe("DatabaseError")
        expectNoPassword(refused.text, kv, secret, secret)
      }),
    { timeout: 60_000, fastCheck: { numRuns: 50 } }
  )
})
