/** Passwords that break naive parsers, and the check that a printed text shows none of a password's forms. */
import { expect } from "@effect/vitest"
import { FastCheck as fc } from "effect"

/** Characters that break naive parsers, a few escapes and some non-ASCII text. */
const tricky = [
  "@",
  "/",
  "#",
  "?",
  ":",
  "%",
  "&",
  "=",
  " ",
  "'",
  "\\",
  ";",
  "+",
  "%41",
  "%2F",
  "%40",
  "é",
  "日本",
  "🔑"
]

/** A password of 8 to 24 pieces (characters, escapes), many of them tricky. */
export const password: fc.Arbitrary<string> = fc.array(
  fc.oneof(fc.constantFrom(...tricky), fc.char(), fc.fullUnicode()),
  { minLength: 8, maxLength: 24 }
).map((parts) => parts.join(""))

/** The percent-decoded form, when it has one. */
const decoded = (text: string): string | undefined => {
  try {
    return decodeURIComponent(text)
  } catch {
    return undefined
  }
}

/**
 * Checks that `shown` (what some path printed for `target`, where `secret` was written as `written`) shows
 * the password in none of its forms. A form that the target's other parts contain anyway (a password equal to
 * the host name, say) proves nothing and is skipped.
 */
export const expectNoPassword = (shown: string, target: string, written: string, secret: string) => {
  const rest = target.split(written).join("")
  for (const form of new Set([secret, written, decoded(secret), decoded(written), encodeURIComponent(secret)])) {
    if (form === undefined || form.length === 0 || rest.includes(form)) continue
    expect(shown, `${JSON.stringify(form)} shown for ${JSON.stringify(target)}`).not.toContain(form)
  }
}
