/**
 * Plain-text tables for the command line: columns padded to their widest cell. Cells often hold what another
 * party stored (a body, an error, a journal's entry): each cell goes through the one printer (`./output.ts`), so
 * a stored value cannot move the cursor, recolour or retitle the operator's terminal.
 */

import { printable } from "./output.js"

export { printable }

/** Renders `rows` under `headers`. */
export const table = (headers: ReadonlyArray<string>, unsafe: ReadonlyArray<ReadonlyArray<string>>): string => {
  const rows = unsafe.map((row) => row.map(printable))
  const widths = headers.map((header, i) => Math.max(header.length, ...rows.map((row) => (row[i] ?? "").length)))
  const line = (cells: ReadonlyArray<string>) => cells.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()
  return [line(headers), line(widths.map((width) => "-".repeat(width))), ...rows.map(line)].join("\n")
}

/** Renders label/value pairs, one per line. */
export const pairs = (unsafe: ReadonlyArray<readonly [string, string]>): string => {
  const entries = unsafe.map(([label, value]) => [label, printable(value)] as const)
  const width = Math.max(...entries.map(([label]) => label.length))
  return entries.map(([label, value]) => `${label.padEnd(width)}  ${value}`).join("\n")
}

/** "12 s ago", "in 3 min": how far `millis` is from `now`. */
export const ago = (millis: number, now: number): string => {
  const delta = Math.abs(now - millis)
  const text = delta < 1000
    ? `${delta} ms`
    : delta < 120_000
    ? `${Math.round(delta / 1000)} s`
    : delta < 7_200_000
    ? `${Math.round(delta / 60_000)} min`
    : `${Math.round(delta / 3_600_000)} h`
  return millis <= now ? `${text} ago` : `in ${text}`
}
