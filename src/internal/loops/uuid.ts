/**
 * Ids for what a loop makes per request: a request's `requestId` (random) and an attempt's `runId` (unique).
 */
import * as Crypto from "node:crypto"

/**
 * `crypto.randomUUID()` as one flat string. Node builds a UUID by concatenation, a tree of some fifteen
 * strings held for as long as the UUID is, several times the size of the flat string. `toLowerCase` (a UUID is
 * lower case already) has V8 flatten it, for a fraction of what the UUID itself costs.
 */
export const randomUUID = (): string => Crypto.randomUUID().toLowerCase()

const runIdSpan = 2 ** 32

/**
 * Ids no other attempt has, in UUID form, one source per loop: a random UUID drawn once per 2^32 ids, its last
 * twelve hex digits replaced by a count — unique across loops and processes by the random part (the first 80
 * bits but the version's), within the loop by the count. Not a secret and not meant to be unguessable (a
 * `runId` names an attempt in logs, replies and traces); drawing a random UUID and flattening it for every
 * message cost a loop a fifth of what it allocated per message.
 */
export class RunIds {
  private prefix = ""
  private count = 0

  next(): string {
    if (this.count % runIdSpan === 0) this.prefix = randomUUID().slice(0, 24)
    return this.prefix + (this.count++ % runIdSpan).toString(16).padStart(12, "0")
  }
}
