/** Plain-text tables for the command line: columns padded to their widest cell. */

/** Renders `rows` under `headers`. */
export const table = (headers: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = headers.map((header, i) => Math.max(header.length, ...rows.map((row) => (row[i] ?? "").length)))
  const line = (cells: ReadonlyArray<string>) => cells.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()
  return [line(headers), line(widths.map((width) => "-".repeat(width))), ...rows.map(line)].join("\n")
}

/** Renders label/value pairs, one per line. */
export const pairs = (entries: ReadonlyArray<readonly [string, string]>): string => {
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
