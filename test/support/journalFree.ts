/**
 * Narrows an evaluation that runs without a journal to its prompt failures: a journal failure cannot happen
 * there, so one is a defect of the test.
 */
import * as Effect from "effect/Effect"

export const journalFree = <A, E, R>(
  self: Effect.Effect<A, E, R>
): Effect.Effect<A, Exclude<E, { readonly _tag: "JournalDivergedError" | "JournalStoreError" }>, R> =>
  Effect.catchIf(
    self,
    (error): error is Extract<E, { readonly _tag: "JournalDivergedError" | "JournalStoreError" }> =>
      typeof error === "object" && error !== null && "_tag" in error &&
      (error._tag === "JournalDivergedError" || error._tag === "JournalStoreError"),
    (error) => Effect.die(error)
  ) as Effect.Effect<A, Exclude<E, { readonly _tag: "JournalDivergedError" | "JournalStoreError" }>, R>
