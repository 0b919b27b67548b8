import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit } from "effect"
import * as MailboxMemory from "../src/MailboxMemory.js"
import { mailboxContract } from "./contract/MailboxContract.js"
import { schedulingContract } from "./contract/SchedulingContract.js"

mailboxContract("memory", (options) => MailboxMemory.make<string, string>(options), {
  pause: MailboxMemory.pause,
  resume: MailboxMemory.resume
})

describe("MailboxMemory.make", () => {
  it.scoped("refuses a maxSize that is not a positive integer, naming it", () =>
    Effect.gen(function*() {
      for (const maxSize of [0, -1, 1.5]) {
        const exit = yield* Effect.exit(MailboxMemory.make({ name: "q", maxSize }))
        expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toContain("maxSize")
      }
      const exit = yield* Effect.exit(MailboxMemory.make({ name: "" }))
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toContain("name")
    }))
})

schedulingContract("memory", {
  make: (name, options) => MailboxMemory.make<string, string>({ name, ...options }),
  setKeySettings: MailboxMemory.setKeySettings,
  keys: MailboxMemory.keys
})
