/**
 * The soak's checker is tested: on histories recorded from real soaks (soak/fixtures/history, a short SQLite
 * run of the compiled package with every kind of fault, and soak/fixtures/keys-history, one with keys; see their
 * READMEs), the checker passes each history as
 * recorded and fails the right property for each bug injected into a copy — a forgotten end (lost), an
 * overlapping start (unexplained duplicate), a second reply, a zombie's merge transition after a takeover, a
 * zombie's fenced work-lease write, a SIGTERM'd worker that exits 1, a message left after the drain, a key
 * sampled one live lease over its limit.
 * Pure file work: well under a second.
 */
import { describe, expect, it } from "@effect/vitest"
import { join } from "node:path"
import * as SelfTest from "../soak/selfTest.js"

const fixtures = ["history", "keys-history"].map((name) => join(import.meta.dirname, "..", "soak", "fixtures", name))
const results = fixtures.map((fixture) => SelfTest.run(fixture))

describe("the soak's checker", () => {
  it("passes the histories as recorded", () => {
    for (const run of results) expect(run[0]).toMatchObject({ property: 0, ok: true })
  })

  // Each bug is injected into every history that has a place for it (the older one has no keys, the one with
  // keys no merge queue nor work leases), and at least one has.
  for (const injection of SelfTest.injections) {
    it(`fails property ${injection.property} when the history holds: ${injection.name}`, () => {
      const outcomes = results.map((run) => run.find((r) => r.name === injection.name)!)
      const injected = outcomes.filter((result) => !/^skipped/.test(result.detail))
      expect(injected.length, outcomes.map((result) => result.detail).join("; ")).toBeGreaterThan(0)
      for (const result of injected) expect(result.ok, result.detail).toBe(true)
    })
  }
})
