/**
 * Stored times decoded for display: a time outside Date's range, or no number, is `invalid` (shown as
 * "invalid time", null in JSON) rather than an "Invalid date" failure of the whole listing.
 */
import { describe, expect, it } from "@effect/vitest"
import { DateTime } from "effect"
import * as StoredTime from "../src/internal/storedTime.js"

describe("StoredTime", () => {
  it("decodes times in range, as numbers, bigints or text", () => {
    for (const raw of [0, 1_700_000_000_000, "1700000000000", 1_700_000_000_000n, -1, 8_639_999_999_999_999]) {
      const time = StoredTime.decode(raw)
      expect(StoredTime.isValid(time)).toBe(true)
      expect(DateTime.toEpochMillis(time)).toBe(Number(raw))
    }
  })

  it("decodes anything else as invalid, shown as such, and a form's field round-trips it", () => {
    for (
      const raw of [
        "9000000000000000000",
        9e18,
        -9e18,
        8_640_000_000_000_000,
        -8_640_000_000_000_000,
        Number.NaN,
        Number.POSITIVE_INFINITY,
        "",
        " ",
        "abc",
        "1e400",
        null,
        undefined,
        {},
        9_000_000_000_000_000_000n
      ]
    ) {
      const time = StoredTime.decode(raw)
      expect({ raw: String(raw), valid: StoredTime.isValid(time) }).toEqual({ raw: String(raw), valid: false })
      expect(StoredTime.iso(time)).toBe("invalid time")
      expect(StoredTime.json(time)).toBeNull()
      expect(StoredTime.isValid(StoredTime.ofField(StoredTime.toField(time))!)).toBe(false)
    }
    expect(StoredTime.isoOfMillis(9e18)).toBe("invalid time")
  })

  it("a form's field takes only what the pages give", () => {
    expect(StoredTime.ofField("1000")).toEqual(DateTime.unsafeMake(1000))
    for (const text of ["", "abc", "1e3", "0x10", "12345678901234567", " 1", "1.5", "+1"]) {
      expect({ text, time: StoredTime.ofField(text) }).toEqual({ text, time: undefined })
    }
  })
})
