/**
 * Optional packages, loaded on first use. The light core (the root entry, time, liveness, mailboxes, loops,
 * work leases) imports no database driver, HTTP server, exporter or model provider; the modules that need
 * one import it here, when a layer is built, so a program that never opens SQLite never loads
 * better-sqlite3, and one that lacks the package is told which to install (`MissingPackageError`).
 */
import * as Effect from "effect/Effect"
import { MissingPackageError } from "../Errors.js"

/** Whether `error` says that `packageName` itself (not something it imports) cannot be found. */
const isMissing = (error: unknown, packageName: string): boolean =>
  typeof error === "object" && error !== null && "code" in error &&
  (error.code === "ERR_MODULE_NOT_FOUND" || error.code === "MODULE_NOT_FOUND") &&
  String((error as { readonly message?: unknown }).message).includes(`'${packageName}`)

/**
 * `load()` (a dynamic `import` of `packageName` or one of its subpaths), failing `MissingPackageError` when
 * the package is not installed; any other failure to load is a defect.
 */
export const load = <M>(
  packageName: string,
  neededBy: string,
  load: () => Promise<M>
): Effect.Effect<M, MissingPackageError> =>
  Effect.tryPromise({ try: load, catch: (error) => error }).pipe(
    Effect.catchAll((error) =>
      isMissing(error, packageName)
        ? Effect.fail(new MissingPackageError({ packageName, neededBy }))
        : Effect.die(error)
    )
  )
