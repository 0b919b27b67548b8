/**
 * The soak's checker is tested: on a history recorded from a real soak (soak/fixtures/history, a short SQLite
 * run of the compiled package with every kind of fault, see its README), the checker passes the history as
 * recorded and fails the right property for each bug injected into a copy — a forgotten end (lost), an
 * overlapping start (unexplained duplicate), a second reply, a zombie's merge transition after a takeover, a
 * zombie's fenced work-lease write, a SIGTERM'd worker that exits 1, a message left after the drain.
 * Pure file work: well under a second.
 */
import { describe, expect, it } from "@effect/vitest"
import { join } from "node:path"
import * as SelfTest from "../soak/selfTest.js"

const fixture = join(import.meta.dirname, "..", "soak", "fixtures", "history")
const results = SelfTest.run(fixture)

describe("the soak's checker", () => {
  it("passes the history as recorded", () => {
    expect(results[0]).toMatchObject({ property: 0, ok: true })
  })

  for (const injection of SelfTest.injections) {
    it(`fails property ${injection.property} when the history holds: ${injection.name}`, () => {
      const result = results.find((r) => r.name === injection.name)!
      expect(result.detail).not.toMatch(/^skipped/)
      expect(result.ok, result.detail).toBe(true)
    })
  }
})
