/**
 * Headless Chromium for the console's browser tests: Debian's `chromium`
 * (or the binary `LEASEHOLD_CHROMIUM` names), driven by playwright-core —
 * no browser download. Where Chromium is missing the browser fails, naming
 * the fix, rather than letting the tests skip: `.ci/run` installs it.
 */
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { type Browser, chromium } from "playwright-core"

const executable = (): string | undefined => {
  if (process.env.LEASEHOLD_CHROMIUM !== undefined) return process.env.LEASEHOLD_CHROMIUM
  for (const name of ["chromium", "chromium-browser"]) {
    try {
      return execFileSync("which", [name], { encoding: "utf8" }).trim()
    } catch {
      // not this one
    }
  }
  return undefined
}

/** A headless browser for the scope. */
export const browser: Effect.Effect<Browser, Error, import("effect/Scope").Scope> = Effect.acquireRelease(
  Effect.suspend(() => {
    const path = executable()
    if (path === undefined) {
      return Effect.fail(
        new Error("Chromium not found: apt-get install chromium (Debian's package; .ci/run installs it)")
      )
    }
    return Effect.tryPromise({
      try: () => chromium.launch({ executablePath: path, args: ["--no-sandbox", "--disable-gpu"] }),
      catch: (cause) => new Error(`could not start ${path}: ${String(cause)}`)
    })
  }),
  (browser) => Effect.promise(() => browser.close())
)
