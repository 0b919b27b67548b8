/**
 * Where a round's Node CPU goes: V8's sampling profiler over the timed span only (setup and enqueueing left out),
 * each sample put in one of a few places by the file its function is in (a built-in's: its caller's) —
 * leasehold's compiled package, the
 * Effect runtime, the SQL layer and drivers, the peer's own code, the garbage collector, and Node with the rest.
 * `npm run bench` runs one extra round of a few systems with `BENCH_PROFILE=1` (bench/system.ts prints the shares
 * with the round's figures; set to a directory, the round also writes its profile there); without it nothing is
 * started. The profiler costs time of its own, so the shares
 * are read against the round's CPU, not its rate.
 */
import { writeFileSync } from "node:fs"
import { Session } from "node:inspector"
import { join } from "node:path"

/** The places a sample can be in, in the order the table shows them. */
export const places = ["leasehold", "Effect", "SQL and driver", "peer", "GC", "Node and other"] as const
export type Place = (typeof places)[number]

/** Shares of the profiled span's busy samples (0..1), by place. */
export type Shares = Readonly<Record<Place, number>>

interface CallFrame {
  readonly url: string
  readonly functionName: string
}
interface Profile {
  readonly nodes: ReadonlyArray<
    { readonly id: number; readonly callFrame: CallFrame; readonly children?: ReadonlyArray<number> }
  >
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

const placeOf = ({ functionName, url }: CallFrame): Place | undefined => {
  if (functionName === "(idle)" || functionName === "(root)") return undefined
  if (functionName === "(garbage collector)") return "GC"
  if (
    /\/node_modules\/(@effect\/sql[^/]*|pg|pg-protocol|pg-pool|pg-cursor|postgres|better-sqlite3|ioredis)\//.test(url)
  ) {
    return "SQL and driver"
  }
  if (/\/node_modules\/effect\//.test(url)) return "Effect"
  if (/\/node_modules\/(graphile-worker|pg-boss|bullmq)\//.test(url)) return "peer"
  if (/\/dist\//.test(url) && !url.includes("/node_modules/")) return "leasehold"
  return "Node and other"
}

/** Starts the profiler when `BENCH_PROFILE` is set; the result stops it and gives the shares (else undefined). */
export const startProfile = (): () => Shares | undefined => {
  if (process.env["BENCH_PROFILE"] === undefined) return () => undefined
  const session = new Session()
  session.connect()
  // The in-process inspector answers synchronously: each post has returned its answer when it returns.
  session.post("Profiler.enable")
  session.post("Profiler.setSamplingInterval", { interval: 200 })
  session.post("Profiler.start")
  return () => {
    let profile: Profile | undefined
    session.post("Profiler.stop", (error, result) => {
      if (error === null) profile = result.profile as Profile
    })
    session.disconnect()
    if (profile === undefined) return undefined
    // `BENCH_PROFILE=<directory>`: the profile itself too, for DevTools or a closer look.
    const directory = process.env["BENCH_PROFILE"]!
    if (directory !== "1") writeFileSync(join(directory, `round-${process.pid}.cpuprofile`), JSON.stringify(profile))
    // A built-in (`JSON.parse`, a native binding: no URL) counts where its caller is.
    const parent = new Map<number, number>()
    for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
    const frames = new Map(profile.nodes.map((node) => [node.id, node.callFrame]))
    const placeAt = (id: number): Place | undefined => {
      const frame = frames.get(id)!
      if (frame.url === "" && !frame.functionName.startsWith("(") && parent.has(id)) return placeAt(parent.get(id)!)
      return placeOf(frame)
    }
    const byNode = new Map(profile.nodes.map((node) => [node.id, placeAt(node.id)]))
    const totals = new Map<Place, number>()
    let busy = 0
    profile.samples.forEach((id, index) => {
      const place = byNode.get(id)
      if (place === undefined) return
      const micros = profile!.timeDeltas[index] ?? 0
      totals.set(place, (totals.get(place) ?? 0) + micros)
      busy += micros
    })
    return Object.fromEntries(
      places.map((place) => [place, busy === 0 ? 0 : (totals.get(place) ?? 0) / busy])
    ) as Shares
  }
}
