/**
 * A stored error as one line that starts with its cause. A schema error (Effect's tree formatter) names the
 * type it failed on first — often a long dump — and what was wrong last, nested under the path that led there:
 * the one-line view is each innermost line with its path (`["task"] Expected string, actual 1`), so a table
 * shows the cause even when it cuts the rest. Any other error's line is its first. Shared by the command line
 * (`leasehold dlq list`) and the console's message page, which shows each cause above the whole error.
 */

/** A line of the tree formatter: `├─ `/`└─ ` after the ancestors' `│  ` or `   `. */
const treeLine = /^((?:[│ ] {2})*)[├└]─ (.*)$/

/** A path segment of the tree: `["task"]`, `[0]`. */
const pathSegment = /^\[.*\]$/

/** The causes of `error`: each innermost line of a schema error's tree after its path, else its first line. */
export const causesOf = (error: string): ReadonlyArray<string> => {
  const lines = error.split("\n")
  const nodes = lines.flatMap((line) => {
    const match = treeLine.exec(line)
    return match === null ? [] : [{ depth: match[1]!.length / 3, text: match[2]! }]
  })
  if (nodes.length === 0) return [(lines[0] ?? "").trim()]
  const path: Array<string> = []
  const causes: Array<string> = []
  nodes.forEach((node, i) => {
    path.length = node.depth
    const next = nodes[i + 1]
    if (next === undefined || next.depth <= node.depth) {
      const where = path.filter((segment) => pathSegment.test(segment)).join("")
      causes.push(where === "" ? node.text : `${where} ${node.text}`)
    }
    path.push(node.text)
  })
  return causes
}

/** The cause of `error` on one line: its causes (`causesOf`) joined by "; ". */
export const causeOf = (error: string): string => causesOf(error).join("; ")

/** At most `max` characters of `text`; what is cut ends in "…". */
export const clip = (text: string, max: number): string => text.length > max ? `${text.slice(0, max - 1)}…` : text
