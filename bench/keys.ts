/**
 * Scheduling by key (issue 45), what it costs: the durable mailbox's claim → acknowledge throughput with keys,
 * limits and shares on against plain claims of the same setup; a backlog of 1 M over 10,000 keys against 10 k
 * over the same keys; and plain claims — a queue that never uses a key — against the package as it was before
 * scheduling by key (commit `BEFORE_KEYS`, built from git into a temporary directory). Every round of every case
 * runs in a fresh process (bench/keysRound.ts, bundled next to bench/run.ts), cases alternating within a pair
 * (the order swapped round by round, so the machine's drift falls on both alike); the figures are medians of
 * the rounds after a warm-up round of each, and ratios of the same run.
 *
 * Run alone: `npm run bench -- --only keys` (its own throwaway PostgreSQL cluster and SQLite files; prints the
 * section, never touches BENCHMARKS.md). `KEYS_ROUNDS` sets the measured rounds (3), `KEYS_BACKLOG` the large
 * backlog (1000000), `KEYS_DRAIN` and `KEYS_BACKLOG_DRAIN` what a round drains (4000, 2000: the keyed claim is
 * slow enough that more makes the section long), `KEYS_DATABASE=PostgreSQL|SQLite` one database only.
 */
import { spawn, spawnSync } from "node:child_process"
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from "node:fs"
import * as os from "node:os"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { fileURLToPath } from "node:url"
import type { KeysRound } from "./keysRound.js"

/** The commit before scheduling by key: its parent of the first scheduling change (6fdd514). */
export const BEFORE_KEYS = "ff3f1f8"
export const KEYS_ROUNDS = Number(process.env.KEYS_ROUNDS ?? 3)
/** Claims with keys ÷ plain: the active keys, what is queued, what each round drains, the default limit. */
export const ACTIVE_KEYS = 1_000
export const PAIR_QUEUED = 20_000
export const PAIR_DRAIN = Number(process.env.KEYS_DRAIN ?? 4_000)
export const LIMIT = 2
/** The backlog: its keys, its sizes, what each round drains. */
export const BACKLOG_KEYS = 10_000
export const BACKLOG_LARGE = Number(process.env.KEYS_BACKLOG ?? 1_000_000)
export const BACKLOG_SMALL = 10_000
export const BACKLOG_DRAIN = Number(process.env.KEYS_BACKLOG_DRAIN ?? 2_000)
export const CONSUMERS = 8
/** The targets of issue 45. */
export const KEYED_TARGET = 0.7
export const BACKLOG_TARGET = 0.8

type DatabaseLabel = "PostgreSQL" | "SQLite"
const databaseLabels: ReadonlyArray<DatabaseLabel> = (["PostgreSQL", "SQLite"] as const).filter((label) =>
  process.env.KEYS_DATABASE === undefined || process.env.KEYS_DATABASE === label
)

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

/** A pair's figures: each side's rounds, and the rounds' ratios (subject ÷ baseline, round by round). */
export interface PairFigures {
  readonly subject: ReadonlyArray<KeysRound>
  readonly baseline: ReadonlyArray<KeysRound>
}

export interface KeysReport {
  readonly keyed: Partial<Record<DatabaseLabel, PairFigures>>
  readonly backlog: Partial<Record<DatabaseLabel, PairFigures & { readonly fillSeconds: number }>>
  /** Plain claims now ÷ before; `undefined` with why when the earlier build could not be made. */
  readonly noKeys: Partial<Record<DatabaseLabel, PairFigures>>
  readonly noKeysSkipped: string | undefined
  readonly load: { readonly before: ReadonlyArray<number>; readonly after: ReadonlyArray<number> }
  readonly seconds: number
}

/** One round in a fresh process: `entry` (a bundle of bench/keysRound.ts), its JSON line. */
const round = (entry: string, args: ReadonlyArray<string>): Promise<KeysRound> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [entry, ...args], { stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk))
    child.once("error", reject)
    child.once("close", (code, signal) => {
      const line = stdout.trim().split("\n").pop() ?? ""
      if (code !== 0 || !line.startsWith("{")) {
        reject(new Error(`keysRound ${args.join(" ")}: exited (${code ?? signal}): ${stderr.trim() || stdout}`))
      } else {
        resolve(JSON.parse(line) as KeysRound)
      }
    })
  })

/**
 * The package at `commit`, compiled (`tsc -p tsconfig.build.json`) in a temporary directory from `git archive`
 * of the repository this runs in, with this checkout's node_modules linked, and this run's round bundle copied
 * into it (so its `leasehold` imports resolve to that build); reused while the directory lasts. Its entry, or
 * why it could not be made.
 */
const buildBefore = (commit: string, entry: string): { readonly entry: string } | { readonly skipped: string } => {
  const dir = join(tmpdir(), `leasehold-bench-${commit}`)
  if (!existsSync(join(dir, "dist", "index.js"))) {
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    const archive = spawnSync(
      "sh",
      ["-c", `git archive ${commit} package.json tsconfig.json tsconfig.build.json src | tar -x -C '${dir}'`],
      { encoding: "utf8" }
    )
    if (archive.status !== 0) return { skipped: `git archive ${commit} failed: ${archive.stderr.trim()}` }
    symlinkSync(join(process.cwd(), "node_modules"), join(dir, "node_modules"))
    const tsc = spawnSync(process.execPath, [
      join(process.cwd(), "node_modules/typescript/bin/tsc"),
      "-p",
      "tsconfig.build.json"
    ], {
      cwd: dir,
      encoding: "utf8"
    })
    if (tsc.status !== 0) {
      return { skipped: `building ${commit} failed: ${(tsc.stdout + tsc.stderr).trim().slice(0, 500)}` }
    }
  }
  mkdirSync(join(dir, "bench", ".build"), { recursive: true })
  const copied = join(dir, "bench", ".build", "keysRound.mjs")
  copyFileSync(entry, copied)
  return { entry: copied }
}

/** Rounds of two cases alternating (the order swapped each round), after a warm-up round of each. */
const alternate = async (
  subject: (round: number) => Promise<KeysRound>,
  baseline: (round: number) => Promise<KeysRound>,
  rounds: number
): Promise<PairFigures> => {
  const figures = { subject: [] as Array<KeysRound>, baseline: [] as Array<KeysRound> }
  for (let i = 0; i <= rounds; i++) {
    const order = i % 2 === 0 ? (["subject", "baseline"] as const) : (["baseline", "subject"] as const)
    for (const side of order) {
      const result = await (side === "subject" ? subject(i) : baseline(i))
      if (i > 0) figures[side].push(result)
    }
  }
  return figures
}

const fmt = (n: number) => Math.round(n).toLocaleString("en-US")
const rateOf = (runs: ReadonlyArray<KeysRound>) => median(runs.map((run) => run.rate))
/** Subject ÷ baseline throughput: of the medians, and round by round (median and range). */
export const ratios = (pair: PairFigures) => {
  const perRound = pair.subject.map((run, i) => run.rate / pair.baseline[i]!.rate)
  return {
    ofMedians: rateOf(pair.subject) / rateOf(pair.baseline),
    perRound: median(perRound),
    low: Math.min(...perRound),
    high: Math.max(...perRound)
  }
}
const cpuOf = (runs: ReadonlyArray<KeysRound>) => {
  const node = median(runs.map((run) => run.nodeCpuMicros))
  const servers = runs.map((run) => run.serverCpuMicros).filter((value): value is number => value !== undefined)
  return { node, server: servers.length === 0 ? undefined : median(servers) }
}
const cpuText = (runs: ReadonlyArray<KeysRound>) => {
  const { node, server } = cpuOf(runs)
  return `${node.toFixed(0)}${server === undefined ? "" : ` + ${server.toFixed(0)}`}`
}
const showPair = (pair: PairFigures) => {
  const r = ratios(pair)
  return `${fmt(rateOf(pair.subject))} ÷ ${fmt(rateOf(pair.baseline))} msg/s = ${r.ofMedians.toFixed(2)}× ` +
    `(per round ${r.perRound.toFixed(2)}×, ${r.low.toFixed(2)}–${r.high.toFixed(2)}); CPU µs/msg ${
      cpuText(pair.subject)
    } vs ${cpuText(pair.baseline)}`
}

/** Every case, on the cluster at `pgUrl` and SQLite files in a temporary directory. */
export const measureKeys = async (pgUrl: string, log: (line: string) => void): Promise<KeysReport> => {
  const started = performance.now()
  const load = { before: os.loadavg(), after: [] as Array<number> }
  const entry = fileURLToPath(new URL("./keysRound.mjs", import.meta.url))
  const sqliteDir = mkdtempSync(join(tmpdir(), "leasehold-keys-"))
  let prefixes = 0
  const where = (database: DatabaseLabel, prefix: string) =>
    database === "PostgreSQL"
      ? ["--database", database, "--url", pgUrl, "--prefix", prefix]
      : ["--database", database, "--sqlite", join(sqliteDir, `${prefix}.db`), "--prefix", prefix]
  const fresh = (database: DatabaseLabel, at: string, kase: "plain" | "keyed", keys: number) => () =>
    round(at, [
      ...where(database, `kb${++prefixes}_`),
      "--case",
      kase,
      "--queued",
      String(PAIR_QUEUED),
      "--keys",
      String(keys),
      "--drain",
      String(PAIR_DRAIN),
      "--consumers",
      String(CONSUMERS),
      "--limit",
      String(LIMIT)
    ])
  const keyed: KeysReport["keyed"] = {}
  const backlog: KeysReport["backlog"] = {}
  const noKeys: KeysReport["noKeys"] = {}
  let noKeysSkipped: string | undefined
  try {
    for (const database of databaseLabels) {
      const pair = await alternate(
        fresh(database, entry, "keyed", ACTIVE_KEYS),
        fresh(database, entry, "plain", ACTIVE_KEYS),
        KEYS_ROUNDS
      )
      keyed[database] = pair
      log(`keys ${database}: keyed (1,000 keys, limit ${LIMIT}, weights) ÷ plain: ${showPair(pair)}`)
    }
    for (const database of databaseLabels) {
      const stores = [BACKLOG_LARGE, BACKLOG_SMALL].map((size) => {
        const prefix = `kq${size}_${++prefixes}_`
        const args = (kase: string) => [
          ...where(database, prefix),
          "--case",
          kase,
          "--queued",
          String(size),
          "--keys",
          String(BACKLOG_KEYS),
          "--drain",
          String(BACKLOG_DRAIN),
          "--consumers",
          String(CONSUMERS),
          "--limit",
          String(LIMIT)
        ]
        return { size, args }
      })
      let fillSeconds = 0
      for (const { args } of stores) fillSeconds += (await round(entry, args("fill"))).setupSeconds
      const [large, small] = stores
      const pair = await alternate(
        () => round(entry, large!.args("backlog")),
        () => round(entry, small!.args("backlog")),
        KEYS_ROUNDS
      )
      backlog[database] = { ...pair, fillSeconds }
      log(
        `keys ${database}: ${fmt(BACKLOG_LARGE)} ÷ ${fmt(BACKLOG_SMALL)} queued over ${fmt(BACKLOG_KEYS)} keys: ${
          showPair(pair)
        } (fills ${fillSeconds.toFixed(0)} s)`
      )
    }
    const before = buildBefore(BEFORE_KEYS, entry)
    if ("skipped" in before) {
      noKeysSkipped = before.skipped
      log(`keys: plain now ÷ before skipped: ${before.skipped}`)
    } else {
      for (const database of databaseLabels) {
        const pair = await alternate(
          fresh(database, entry, "plain", ACTIVE_KEYS),
          fresh(database, before.entry, "plain", ACTIVE_KEYS),
          KEYS_ROUNDS
        )
        noKeys[database] = pair
        log(`keys ${database}: plain claims now ÷ before (${BEFORE_KEYS}): ${showPair(pair)}`)
      }
    }
  } finally {
    rmSync(sqliteDir, { recursive: true, force: true })
  }
  load.after = os.loadavg()
  return { keyed, backlog, noKeys, noKeysSkipped, load, seconds: (performance.now() - started) / 1000 }
}

/** The section of BENCHMARKS.md. */
export const keysSection = (report: KeysReport): ReadonlyArray<string> => {
  const met = (ok: boolean) => ok ? "met" : "**missed**"
  const row = (label: string, database: DatabaseLabel, pair: PairFigures | undefined, target: number) => {
    if (pair === undefined) return `| ${label} | ${database} | not measured | | | | | |`
    const r = ratios(pair)
    const cpu = (runs: ReadonlyArray<KeysRound>) => {
      const { node, server } = cpuOf(runs)
      return `${node.toFixed(0)}${server === undefined ? "" : ` + ${server.toFixed(0)}`}`
    }
    return `| ${label} | ${database} | ${fmt(rateOf(pair.subject))} | ${fmt(rateOf(pair.baseline))} | ${
      r.ofMedians.toFixed(2)
    }× | ${r.perRound.toFixed(2)}× (${r.low.toFixed(2)}–${r.high.toFixed(2)}) | ${cpu(pair.subject)} / ${
      cpu(pair.baseline)
    } | ≥ ${target.toFixed(2)}×: ${met(r.ofMedians >= target)} |`
  }
  const load = (values: ReadonlyArray<number>) => values.map((value) => value.toFixed(2)).join(", ")
  const cpus = os.cpus()
  return [
    "## Scheduling by key: what keys, limits and shares cost",
    "",
    "bench/keys.ts; every round of every case in a fresh process (bench/keysRound.ts), the two cases of a row",
    `alternating (order swapped each round), medians of ${KEYS_ROUNDS} rounds after a warm-up round of each. Queues are`,
    "filled by one bulk `INSERT … SELECT` in the shape `send` stores (as in \"How cost grows with the work\"), a",
    "keyed one with its key round robin, its keys' rows made as the first keyed send makes them and the queue",
    `made scheduled through \`MailboxSqlAdmin\`'s \`setKeySettings\` — with a default limit of ${LIMIT} live leases a key,`,
    "counted by every claim — and every fourth key weighted 2 (shares on); then ANALYZE. The drain is the scale",
    `section's: ${CONSUMERS} consumer fibers, \`receive\` up to 10, \`Mailbox.settleAll\` of each batch.`,
    "",
    `- Keyed ÷ plain: ${fmt(PAIR_QUEUED)} messages over ${fmt(ACTIVE_KEYS)} keys (all ${
      fmt(ACTIVE_KEYS)
    } active through the drain), ${fmt(PAIR_DRAIN)} drained, against`,
    "  the same queue with no key (a fresh table, or SQLite file, each round).",
    `- Backlog: ${fmt(BACKLOG_LARGE)} queued over ${fmt(BACKLOG_KEYS)} keys ÷ ${
      fmt(BACKLOG_SMALL)
    } queued over the same ${fmt(BACKLOG_KEYS)} keys (one message a`,
    `  key: the issue's \"10 k queued\", read as the same keys with a small backlog, so only the backlog differs), keyed as`,
    `  above; each round drains ${
      fmt(BACKLOG_DRAIN)
    } and tops every key back up (untimed); one store per size, filled once.`,
    `- No keys: plain claims with this package ÷ the package of commit ${BEFORE_KEYS} (before scheduling by key), built`,
    "  from git into a temporary directory and run by the same round bundle: the cost a queue that never uses a",
    "  key pays for the feature. Target: no worse (ratio ≥ 1.00 within the rounds' spread).",
    "",
    "Throughput ratios are of the medians; \"per round\" is each round's pair (median and range). CPU is per",
    "message (µs): this round's Node process (which runs SQLite) + the PostgreSQL cluster's.",
    "",
    "| case | database | subject msg/s | baseline msg/s | ratio | per round | CPU µs/msg subject / baseline | target |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ...databaseLabels.map((database) =>
      row("keys, limits, shares on ÷ plain", database, report.keyed[database], KEYED_TARGET)
    ),
    ...databaseLabels.map((database) =>
      row(`${fmt(BACKLOG_LARGE)} ÷ ${fmt(BACKLOG_SMALL)} queued`, database, report.backlog[database], BACKLOG_TARGET)
    ),
    ...databaseLabels.map((database) => row(`plain now ÷ ${BEFORE_KEYS}`, database, report.noKeys[database], 1)),
    "",
    ...(report.noKeysSkipped === undefined ? [] : [`The no-keys rows were skipped: ${report.noKeysSkipped}.`, ""]),
    `Machine: ${cpus.length} × ${cpus[0]?.model.trim() ?? "unknown CPU"}; load average (1, 5, 15 min) ${
      load(report.load.before)
    } before, ${load(report.load.after)} after. The section took ${report.seconds.toFixed(0)} s (backlog fills: ${
      databaseLabels.map((database) => `${database} ${(report.backlog[database]?.fillSeconds ?? 0).toFixed(0)} s`)
        .join(", ")
    }).`,
    ""
  ]
}
