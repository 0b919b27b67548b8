/**
 * Optional packages, loaded on first use. The light core (the root entry, time, liveness, mailboxes, loops,
 * work leases) imports no database driver, HTTP server, exporter or model provider; the modules that need
 * one import it here, when a layer is built, so a program that never opens SQLite never loads
 * better-sqlite3, and one that lacks the package is told which to install (`MissingPackageError`).
 */
import * as Effect from "effect/Effect"
import { MissingPackageError } from "../Errors.js"

/** Which of `packageNames` `error` says cannot be found, if it is a module-not-found error. */
const missingOf = (error: unknown, packageNames: ReadonlyArray<string>): string | undefined => {
  if (typeof error !== "object" || error === null || !("code" in error)) return undefined
  if (error.code !== "ERR_MODULE_NOT_FOUND" && error.code !== "MODULE_NOT_FOUND") return undefined
  const message = String((error as { readonly message?: unknown }).message)
  return packageNames.find((name) => message.includes(`'${name}'`) || message.includes(`'${name}/`))
}

/**
 * `load()` (a dynamic `import` of the first of `packageNames` or one of its subpaths), failing
 * `MissingPackageError` naming whichever of `packageNames` (the package and what it needs installed beside
 * it, like better-sqlite3 for the SQLite driver) is not installed; any other failure to load is a defect.
 */
export const load = <M>(
  packageNames: ReadonlyArray<string>,
  neededBy: string,
  load: () => Promise<M>
): Effect.Effect<M, MissingPackageError> =>
  Effect.tryPromise({ try: load, catch: (error) => error }).pipe(
    Effect.catchAll((error) => {
      const packageName = missingOf(error, packageNames)
      return packageName === undefined
        ? Effect.die(error)
        : Effect.fail(new MissingPackageError({ packageName, neededBy }))
    })
  )
