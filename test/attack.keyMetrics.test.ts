/**
 * Attacks on the per-key gauge (`keyMetrics: true`): key names are the senders', and they become Prometheus
 * label values — quotes, backslashes, braces, `#` lines, Unicode — and their number is the senders' too. Through
 * the public API and the real `/metrics` endpoint; `promtool check metrics` judges the text when installed (CI
 * installs it).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Metric, Schema, TestClock } from "effect"
import { execFileSync } from "node:child_process"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Health from "../src/Health.js"
import * as Scheduling from "../src/internal/mailbox/scheduling.js"
import type { Message } from "../src/Mailbox.js"
import * as MailboxMemory from "../src/MailboxMemory.js"
import * as MailboxSql from "../src/MailboxSql.js"

const directory = mkdtempSync(join(tmpdir(), "leasehold-keymetrics-"))
const promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].find((path) => existsSync(path))

const hostile = [
  `a"b`,
  `back\\slash`,
  `}{le="x"} 1`,
  `# TYPE leasehold_fake counter`,
  `tenant 🦀 ünïcode`,
  `trailing\\`
]

describe("attack: per-key gauges", () => {
  it.live("hostile key names come out of /metrics escaped, as valid exposition text, one series each", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const mailbox = yield* MailboxMemory.make<string, string>({ name: "metered-hostile", keyMetrics: true })
      for (const key of hostile) yield* mailbox.send(key, { key })
      expect((yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 minute" })).length).toBe(hostile.length)
      const text = yield* Effect.promise(() => fetch(`${health.url}/metrics`).then((response) => response.text()))
      const lines = text.split("\n").filter((line) => line.startsWith("leasehold_mailbox_key_leases{"))
      expect(lines.length).toBe(hostile.length)
      // No key escaped into a line of its own: every other line is a series, a comment of ours, or blank.
      expect(text.split("\n").some((line) => line.startsWith("# TYPE leasehold_fake"))).toBe(false)
      expect(text).toContain(`key="a\\"b"`)
      expect(text).toContain(`key="back\\\\slash"`)
      if (promtool === undefined) {
        expect(process.env.CI, "promtool is missing: apt-get install prometheus (.ci/run does)").not.toBe("true")
        return
      }
      // promtool reads the exposition from stdin: exit 1 with "text format parsing error" when it cannot parse it;
      // lint findings (exit 3) are about names and help texts, not escaping.
      const outcome = yield* Effect.either(
        Effect.try(() => execFileSync(promtool, ["check", "metrics"], { input: text, encoding: "utf8", stdio: "pipe" }))
      )
      if (outcome._tag === "Left") {
        const error = outcome.left.error as { stdout?: string; stderr?: string; status?: number }
        expect(`${error.stdout ?? ""}${error.stderr ?? ""}`).not.toMatch(/parsing error/)
        expect(error.status).not.toBe(1)
      }
    }).pipe(Effect.provide(Layer.fresh(Health.layer({ port: 0, host: "127.0.0.1" }))), Effect.scoped))

  it.scoped("keyMetrics that is not a boolean is refused naming it, on memory and on SQLite", () =>
    Effect.gen(function*() {
      for (const bad of ["yes", 1, null]) {
        const memory = yield* Effect.flip(
          MailboxMemory.make<string, string>({ name: "q", keyMetrics: bad as unknown as boolean })
        )
        expect(String(memory)).toContain("keyMetrics")
        const sql = yield* Effect.flip(
          MailboxSql.make({ name: "q", schema: Schema.String, keyMetrics: bad as unknown as boolean }).pipe(
            Effect.provide(MailboxSql.layerSqlite({ filename: join(directory, "bad.db") }))
          )
        )
        expect(String(sql)).toContain("keyMetrics")
      }
    }))

  it.scoped("1,500 keys in flight: the gauge shows 1,000 of them, the most leases first; a settled key drops to 0", () =>
    Effect.gen(function*() {
      const name = "metered-many"
      const mailbox = yield* MailboxMemory.make<string, string>({ name, keyMetrics: true })
      for (let i = 0; i < 1_500; i++) yield* mailbox.send(`m${i}`, { key: `k${i}` })
      yield* mailbox.send("m-extra", { key: "k1499" })
      const leased: Array<Message<string, string>> = []
      for (;;) {
        const got = yield* mailbox.receive({ maxMessages: 10, visibilityTimeout: "1 hour" })
        if (got.length === 0) break
        leased.push(...got)
      }
      expect(leased.length).toBe(1_501)
      yield* TestClock.adjust("11 seconds")
      yield* mailbox.receive({ maxMessages: 10 })
      const series = (yield* Metric.snapshot).filter((pair) =>
        pair.metricKey.name === "leasehold_mailbox_key_leases" &&
        pair.metricKey.tags.some((tag) => tag.key === "queue" && tag.value === name)
      )
      const value = (key: string) =>
        series.find((pair) => pair.metricKey.tags.some((tag) => tag.key === "key" && tag.value === key))
      // The most leases first (k1499: two), then by name: 1,000 series in all.
      expect(series.length).toBe(1_000)
      expect((value("k1499")?.metricState as unknown as { value: number }).value).toBe(2)
      // k1499's leases settled: its series drops to 0 at the next refresh, and another key takes its place.
      yield* Effect.forEach(leased.filter((message) => message.key === "k1499"), (message) => message.acknowledge, {
        discard: true
      })
      yield* TestClock.adjust("11 seconds")
      yield* mailbox.receive({ maxMessages: 10 })
      const after = (yield* Metric.snapshot).find((pair) =>
        pair.metricKey.name === "leasehold_mailbox_key_leases" &&
        pair.metricKey.tags.some((tag) => tag.key === "queue" && tag.value === name) &&
        pair.metricKey.tags.some((tag) => tag.key === "key" && tag.value === "k1499")
      )
      expect((after?.metricState as unknown as { value: number }).value).toBe(0)
      expect(yield* Metric.value(Scheduling.keysActive.pipe(Metric.tagged("queue", name)))).toEqual(
        expect.objectContaining({ value: 1_499 })
      )
    }))
})
