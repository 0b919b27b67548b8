/**
 * Keys' concurrency limits across real processes, on SQLite and PostgreSQL (issue 45): four worker processes
 * (test/fixtures/keyed-worker.ts, three fibers each) receive from one queue whose messages have five keys — the
 * queue's default limit 2, one key limited to 1 — and one worker is SIGKILLed mid-run. The limit is a claim's
 * promise across processes (internal/mailbox/sql/keys.ts: the claim counts live leases in its write
 * transaction), so it is proven two ways from the database's clock:
 * - sampling: many times during the run, one statement counts each key's live leases (a receipt handle and a
 *   visibility still ahead) — never over the key's limit;
 * - the workers' events: each claim against the leases that were certainly live all through it (claimed before
 *   its statement began, neither settled nor past their visibility before it committed) — never over the limit.
 * The killed worker's leases count until their visibility passes, and then stop: each of its unsettled
 * messages is claimed again, never before its lease's end. Every message is settled; nothing is left.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Schema } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as MailboxSql from "../src/MailboxSql.js"
import * as MailboxSqlAdmin from "../src/MailboxSqlAdmin.js"
import { type Child, spawnBundled } from "./helpers.js"
import { processBackends } from "./support/processBackends.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-keys-"))
const backends = processBackends(join(directory, "mailbox.db"))

const WORKER = "test/fixtures/keyed-worker.ts"
const KEYS = ["k0", "k1", "k2", "k3", "k4"] as const
/** The queue's default limit, and the one key with a limit of its own. */
const DEFAULT_LIMIT = 2
const OWN = { key: "k4", limit: 1 } as const
const limitOf = (key: string) => key === OWN.key ? OWN.limit : DEFAULT_LIMIT
const PER_KEY = 16
const WORKERS = 4
const FIBERS = 3
const JOB = 200
const VISIBILITY = 2000

interface Claim {
  readonly n: number
  readonly key: string
  readonly delivery: number
  readonly pid: number
  /** The claim statement's time: the lease's end less the visibility. */
  readonly at: number
  readonly end: number
  /** The database's time read after the claim returned (it had committed by then). */
  readonly seen: number
  /** The database's time just before the acknowledgement began; Infinity when never settled. */
  readonly settling: number
}

const parse = (outputs: ReadonlyArray<string>) => {
  const settles = new Map<string, { before: number; expired: boolean }>()
  const raw: Array<Omit<Claim, "settling">> = []
  for (const output of outputs) {
    for (
      const [, n, key, delivery, pid, end, seen] of output.matchAll(/^claim (\d+) (\S+) (\d+) (\d+) (\d+) (\d+)$/gm)
    ) {
      raw.push({
        n: Number(n),
        key: key!,
        delivery: Number(delivery),
        pid: Number(pid),
        at: Number(end) - VISIBILITY,
        end: Number(end),
        seen: Number(seen)
      })
    }
    for (const [, kind, n, , delivery, before] of output.matchAll(/^(settle|expired) (\d+) (\S+) (\d+) (\d+) \d+$/gm)) {
      settles.set(`${n}/${delivery}`, { before: Number(before), expired: kind === "expired" })
    }
  }
  const claims = raw.map((claim): Claim => ({
    ...claim,
    settling: settles.get(`${claim.n}/${claim.delivery}`)?.before ?? Infinity
  }))
  return { claims, settles }
}

/**
 * The claims that took more of a key than its limit: each claim (with the others of its key in the same claim
 * statement: one process, one time) against the leases certainly live all through it.
 */
const overLimit = (claims: ReadonlyArray<Claim>) => {
  const violations: Array<string> = []
  const groups = new Map<string, Array<Claim>>()
  for (const claim of claims) {
    const id = `${claim.key}/${claim.pid}/${claim.at}`
    groups.set(id, [...(groups.get(id) ?? []), claim])
  }
  for (const group of groups.values()) {
    const first = group[0]!
    const committed = Math.max(...group.map((claim) => claim.seen))
    const live = claims.filter((other) =>
      other.key === first.key && !group.includes(other) && other.seen < first.at && other.end > first.at &&
      Math.min(other.end, other.settling) > committed
    )
    if (live.length + group.length > limitOf(first.key)) {
      violations.push(
        `${first.key} at ${first.at}: ${group.length} claimed by ${first.pid} with ${live.length} live (${
          live.map((other) => `${other.n}#${other.delivery} by ${other.pid}`).join(", ")
        })`
      )
    }
  }
  return violations
}

let tables = 0
for (const backend of backends) {
  describe(`MailboxSql keys across processes on ${backend.label}`, () => {
    it.live(
      `${WORKERS} workers, ${KEYS.length} keys at limit ${DEFAULT_LIMIT} (${OWN.key} at ${OWN.limit}), one SIGKILLed: ` +
        `no key over its limit, the killed leases count until their visibility, nothing lost`,
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const prefix = `kp${++tables}_`
          const jobs = yield* MailboxSql.make({ name: "jobs", schema: Schema.Number, prefix })
          const admin = yield* MailboxSqlAdmin.queues({ prefix })
          yield* admin.setKeySettings("jobs", undefined, { limit: DEFAULT_LIMIT })
          yield* admin.setKeySettings("jobs", OWN.key, { limit: OWN.limit })
          const total = KEYS.length * PER_KEY
          for (let n = 0; n < total; n++) yield* jobs.send(n, { key: KEYS[n % KEYS.length]! })

          // The sampler: each key's live leases, in one statement on the database's clock.
          const messages = sql(`${prefix}mailbox_messages`)
          const now = backend.label === "PostgreSQL"
            ? sql.literal("(floor(extract(epoch from clock_timestamp()) * 1000))::bigint")
            : sql.literal("CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)")
          const highest = new Map<string, number>()
          const sampled: Array<string> = []
          let samples = 0
          const sampler = yield* Effect.fork(Effect.forever(
            Effect.gen(function*() {
              const rows = yield* sql<{ key: string; n: number | string }>`SELECT key, COUNT(*) AS n
                FROM ${messages} WHERE queue = 'jobs' AND receipt_handle IS NOT NULL AND visible_at > ${now}
                GROUP BY key`
              samples++
              for (const row of rows) {
                const count = Number(row.n)
                highest.set(row.key, Math.max(highest.get(row.key) ?? 0, count))
                if (count > limitOf(row.key)) sampled.push(`${row.key}: ${count} live`)
              }
              yield* Effect.sleep("20 millis")
            })
          ))

          const workers: Array<Child> = []
          for (let i = 0; i < WORKERS; i++) {
            workers.push(
              yield* spawnBundled(WORKER, [
                backend.target(),
                prefix,
                String(FIBERS),
                String(JOB),
                String(VISIBILITY)
              ])
            )
          }
          const settledCount = () =>
            workers.reduce((sum, child) => sum + (child.output().match(/^settle /gm)?.length ?? 0), 0)
          // Mid-run, SIGKILL a worker holding leases (a claim with no settle after it).
          let victim: Child | undefined
          for (let round = 0; victim === undefined; round++) {
            if (round > 1000) {
              return yield* Effect.dieMessage(
                `no worker was ever holding a lease mid-run:\n${workers.map((child) => child.output()).join("\n")}`
              )
            }
            yield* Effect.sleep("10 millis")
            if (settledCount() < total / 4) continue
            victim = workers.find((child) => {
              const { claims, settles } = parse([child.output()])
              const held = claims.filter((claim) => !settles.has(`${claim.n}/${claim.delivery}`)).length
              return held >= (round < 300 ? 2 : 1)
            })
          }
          yield* victim.signal("SIGKILL")
          yield* victim.exited
          // The database's time after the kill: a lease of the victim's that is never claimed again was acknowledged
          // before it (the process died between the acknowledgement and printing it), so it counts until then.
          const killedAt = (yield* sql<{ killedAt: number | string }>`SELECT ${now} AS "killedAt"`)[0]!.killedAt
          const deadline = performance.now() + 40_000
          for (;;) {
            const { settles } = parse(workers.map((child) => child.output()))
            const done = new Set([...settles].filter(([, settle]) => !settle.expired).map(([id]) => id.split("/")[0]))
            // The table empty: the killed worker may have acknowledged its last message just before the SIGKILL,
            // without printing it (checked below).
            if (done.size === total || (yield* jobs.approximateCount) === 0) break
            if (performance.now() > deadline) {
              const rows = yield* sql`SELECT seq, key, visible_at, receipt_handle, delivery_count, ${now} AS now
                FROM ${messages} WHERE queue = 'jobs'`
              const state = yield* admin.keys("jobs")
              const all = parse(workers.map((child) => child.output())).claims
              const missing = rows.map((row) => JSON.stringify(row)).join("\n")
              return yield* Effect.dieMessage(
                `only ${done.size} of ${total} settled; left: ${missing}\nkeys: ${
                  JSON.stringify(state)
                }\nvictim ${victim.pid}; claims of the left: ${
                  JSON.stringify(all.filter((claim) => !done.has(String(claim.n))))
                }`
              )
            }
            yield* Effect.sleep("10 millis")
          }
          yield* Fiber.interrupt(sampler)
          for (const child of workers) if (child !== victim) yield* child.signal("SIGTERM")
          for (const child of workers) yield* child.exited

          const parsed = parse(workers.map((child) => child.output()))
          const { settles } = parsed
          const reclaimed = (lease: Claim) =>
            parsed.claims.some((claim) => claim.n === lease.n && claim.delivery === lease.delivery + 1)
          const claims = parsed.claims.map((claim): Claim =>
            claim.pid === victim.pid && claim.settling === Infinity && !reclaimed(claim)
              ? { ...claim, settling: Number(killedAt) }
              : claim
          )
          const killed = parsed.claims.filter((claim) => claim.pid === victim.pid && claim.settling === Infinity)
          const settled = new Map<number, number>()
          for (const [id, settle] of settles) {
            if (!settle.expired) settled.set(Number(id.split("/")[0]), (settled.get(Number(id.split("/")[0])) ?? 0) + 1)
          }
          const expired = [...settles.values()].filter((settle) => settle.expired).length
          const span = Math.max(...[...settles.values()].map((settle) => settle.before)) -
            Math.min(...claims.map((claim) => claim.at))
          yield* Effect.logInfo(
            `${backend.label}: ${claims.length} claims in ${span} ms of ${total} messages, ${samples} samples (highest ${
              JSON.stringify(Object.fromEntries(highest))
            }), ${killed.length} leases of the killed worker, ${expired} ran out under load`
          )

          // No key over its limit, sampled or claimed.
          expect(sampled).toEqual([])
          expect(overLimit(claims)).toEqual([])
          expect(samples).toBeGreaterThan(50)
          // The limits were reached (the test has teeth): every key at its limit at some sample.
          for (const key of KEYS) expect(highest.get(key)).toBe(limitOf(key))
          // The killed worker held leases; each was claimed again, and never before its end — unless its
          // acknowledgement landed before the SIGKILL took the process (no later claim, and the row is gone: only an
          // acknowledgement deletes one here).
          expect(killed.length).toBeGreaterThanOrEqual(1)
          const acknowledgedUnprinted = new Set<number>()
          let claimedAgain = 0
          for (const lease of killed) {
            const next = claims.find((claim) => claim.n === lease.n && claim.delivery === lease.delivery + 1)
            if (next === undefined) {
              acknowledgedUnprinted.add(lease.n)
              continue
            }
            claimedAgain++
            expect(next.at).toBeGreaterThanOrEqual(lease.end)
          }
          expect(claimedAgain).toBeGreaterThanOrEqual(1)
          // Every message settled once (a lease that ran out and was settled late fails its acknowledgement).
          for (const n of acknowledgedUnprinted) expect(settled.has(n), `${n} settled elsewhere too`).toBe(false)
          expect(settled.size + acknowledgedUnprinted.size).toBe(total)
          expect([...settled.values()].filter((count) => count !== 1)).toEqual([])
          expect(yield* jobs.approximateCount).toBe(0)
        }).pipe(Effect.provideService(SqlClient.SqlClient, backend.client()), Effect.scoped),
      60_000
    )
  })
}
