/**
 * The nemesis: every 2–5 s (seeded) it injects one fault into the running soak —
 *
 * - `SIGKILL` a worker (request, merge-queue or work-lease worker); the orchestrator starts a replacement;
 * - `SIGSTOP` one for 3–5 s, longer than its lease (visibility, lock or lease timeout: 2 s), then `SIGCONT` —
 *   it resumes as a zombie that must be refused;
 * - `SIGTERM` one, which must drain and exit 0 within its shutdown timeout; a replacement is started;
 * - PostgreSQL: `pg_ctl stop -m immediate`, then start again after 1–3 s (postgres backend);
 * - SQLite: another process holds the file's write lock for 2–4 s (sqlite backend; sqliteLock.ts).
 *
 * It lives in the orchestrator's process and acts through the `Fleet` the orchestrator gives it, recording each
 * fault (`fault`) in the orchestrator's history; signals and exits are recorded by the fleet itself. The
 * schedule — when, which kind, which victim by index, how long — comes from the seeded PRNG; the victims'
 * pids and what they were doing at that instant are the run's own.
 */
import type { FaultKind, History } from "./history.js"
import type { Random } from "./random.js"

/** A process the nemesis may strike. */
export interface Victim {
  readonly proc: string
  readonly role: "worker" | "merge" | "lease"
}

/** What the orchestrator lets the nemesis do. */
export interface Fleet {
  /** Processes that are ready, not stopped and not already terminating, in a stable order. */
  readonly victims: () => ReadonlyArray<Victim>
  /** SIGKILL, and a replacement is started. */
  readonly kill: (proc: string) => void
  /** SIGSTOP now, SIGCONT after `millis`; resolves after the SIGCONT. */
  readonly pause: (proc: string, millis: number) => Promise<void>
  /** SIGTERM, and a replacement is started. */
  readonly terminate: (proc: string) => void
  /** The database fault of the backend, for `millis`; resolves once the database is back. */
  readonly databaseFault: (millis: number) => Promise<void>
  readonly databaseFaultKind: "pg-restart" | "sqlite-lock"
}

const sleep = (millis: number) => new Promise<void>((resolve) => setTimeout(resolve, millis))

/**
 * Strikes for `seconds`, then waits for the faults still in progress (a paused process resumed, the database
 * back up). Resolves with the number of faults of each kind.
 */
export const run = async (options: {
  readonly fleet: Fleet
  readonly random: Random
  readonly history: History
  readonly seconds: number
  /** Weights of the kinds (a kind with weight 0 is never chosen). */
  readonly weights?: Partial<Record<FaultKind, number>>
}): Promise<Record<string, number>> => {
  const { fleet, history, random } = options
  const weights: Record<FaultKind, number> = {
    SIGKILL: 3,
    SIGSTOP: 2.5,
    SIGTERM: 2.5,
    "pg-restart": fleet.databaseFaultKind === "pg-restart" ? 2 : 0,
    "sqlite-lock": fleet.databaseFaultKind === "sqlite-lock" ? 2 : 0,
    ...options.weights
  }
  const counts: Record<string, number> = {}
  const inProgress = new Set<Promise<void>>()
  let databaseDown = false
  const track = (promise: Promise<void>) => {
    inProgress.add(promise)
    void promise.finally(() => inProgress.delete(promise))
  }
  const ends = performance.now() + options.seconds * 1000
  for (;;) {
    // Every draw is made whatever happens next, so the schedule of a seed stays the same.
    const wait = random.int(2000, 5000)
    const kind = random.pick<FaultKind>(Object.entries(weights) as Array<[FaultKind, number]>)
    const roleDraw = random.next()
    const victimDraw = random.next()
    const millis = kind === "SIGSTOP"
      ? random.int(3000, 5000)
      : kind === "pg-restart"
      ? random.int(1000, 3000)
      : random.int(2000, 4000)
    if (performance.now() + wait >= ends) break
    await sleep(wait)
    if (kind === "pg-restart" || kind === "sqlite-lock") {
      if (databaseDown) continue
      databaseDown = true
      history.append({ ev: "fault", kind, millis })
      counts[kind] = (counts[kind] ?? 0) + 1
      track(fleet.databaseFault(millis).finally(() => (databaseDown = false)))
      continue
    }
    // Request workers most of the time: they carry the properties with the most to check.
    const all = fleet.victims()
    const role = roleDraw < 0.6 ? "worker" : roleDraw < 0.8 ? "merge" : "lease"
    const ofRole = all.filter((victim) => victim.role === role)
    const pool = ofRole.length > 0 ? ofRole : all.filter((victim) => victim.role === "worker")
    if (pool.length === 0) continue
    const victim = pool[Math.floor(victimDraw * pool.length)]!
    history.append({ ev: "fault", kind, target: victim.proc, ...(kind === "SIGSTOP" ? { millis } : {}) })
    counts[kind] = (counts[kind] ?? 0) + 1
    if (kind === "SIGKILL") fleet.kill(victim.proc)
    else if (kind === "SIGTERM") fleet.terminate(victim.proc)
    else track(fleet.pause(victim.proc, millis))
  }
  await Promise.all([...inProgress])
  return counts
}
