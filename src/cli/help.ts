/**
 * The command line's help pages, rendered here from what @effect/cli knows of each command (its usage and help
 * documents) rather than by @effect/cli's own printer, which colours whatever the output is, pads its command
 * list to its longest usage (200 columns) and names a nested command by its last word (`$ redrive`) or twice
 * (`mailbox mailbox dlq list`). A page is plain text unless the stream is a terminal and `NO_COLOR` is unset,
 * every line fits `width` (100 columns, or a narrower terminal's), the usage names the command by its whole path,
 * and a group lists its commands by path with the first line of each one's description.
 */
import * as CliConfig from "@effect/cli/CliConfig"
import type * as Command from "@effect/cli/Command"
import * as Descriptor from "@effect/cli/CommandDescriptor"
import type * as HelpDoc from "@effect/cli/HelpDoc"
import type * as Span from "@effect/cli/HelpDoc/Span"
import type * as Usage from "@effect/cli/Usage"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"

/** The widest a help line is. */
export const maxWidth = 100

/** Whether output to `stream` may carry ANSI colour: a terminal, and no `NO_COLOR` (https://no-color.org). */
export const colorFor = (stream: { readonly isTTY?: boolean | undefined }): boolean =>
  stream.isTTY === true && (process.env.NO_COLOR ?? "") === ""

/** `text` without ANSI escape sequences (colour and cursor codes). */
export const stripAnsi = (text: string): string => text.replace(/\u001b\[[0-9;?]*[A-Za-z]/g, "")

/** How a page is written. */
export interface Style {
  readonly color: boolean
  readonly width: number
}

/** The style for `stream`: colour as `colorFor` says, `maxWidth` columns or a narrower terminal's (40 at least). */
export const styleFor = (stream: { readonly isTTY?: boolean | undefined; readonly columns?: number | undefined }) => ({
  color: colorFor(stream),
  width: stream.isTTY === true && stream.columns !== undefined
    ? Math.max(40, Math.min(maxWidth, stream.columns))
    : maxWidth
})

// -----------------------------------------------------------------------------------------------------------------
// The command tree

/**
 * A node of @effect/cli's descriptor tree as its instructions hold it. Its API lists one level of subcommands and
 * drops a nested group's children. The shapes here are @effect/cli 0.77's (test/cli.polish.test.ts renders every
 * command's page, so a change of shape fails there).
 */
type Instruction =
  | { readonly _tag: "Standard" | "GetUserInput"; readonly name: string; readonly description: HelpDoc.HelpDoc }
  | { readonly _tag: "Map"; readonly command: Instruction }
  | { readonly _tag: "Subcommands"; readonly parent: Instruction; readonly children: ReadonlyArray<Instruction> }

/** A command and its subcommands, named by its path from the root. */
export interface Node {
  readonly path: ReadonlyArray<string>
  /** The command itself (without its subcommands): its usage, description and options. */
  readonly command: Descriptor.Command<unknown>
  readonly description: HelpDoc.HelpDoc
  readonly children: ReadonlyArray<Node>
}

const nodeOf = (instruction: Instruction, parentPath: ReadonlyArray<string>): Node => {
  switch (instruction._tag) {
    case "Standard":
    case "GetUserInput":
      return {
        path: [...parentPath, instruction.name],
        command: instruction as unknown as Descriptor.Command<unknown>,
        description: instruction.description,
        children: []
      }
    case "Map":
      return nodeOf(instruction.command, parentPath)
    case "Subcommands": {
      const parent = nodeOf(instruction.parent, parentPath)
      return { ...parent, children: instruction.children.map((child) => nodeOf(child, parent.path)) }
    }
  }
}

/** A command line's root command (what `tree` reads of it). */
export type Root<A> = Pick<Command.Command<string, unknown, unknown, A>, "descriptor">

/** The tree of `root`'s commands. */
export const tree = <A>(root: Root<A>): Node => nodeOf(root.descriptor as unknown as Instruction, [])

/** Every node of `node`'s tree, `node` first. */
export const nodes = (node: Node): ReadonlyArray<Node> => [node, ...node.children.flatMap(nodes)]

/** The command `args` name (the longest run of subcommand names from the root), and whether they name only it. */
const target = (root: Node, args: ReadonlyArray<string>): { readonly node: Node; readonly exactly: boolean } => {
  let node = root
  for (const [i, arg] of args.entries()) {
    const child = node.children.find((candidate) => candidate.path.at(-1) === arg)
    if (child === undefined) return { node, exactly: false }
    node = child
    if (i === args.length - 1) return { node, exactly: true }
  }
  return { node, exactly: args.length === 0 }
}

// -----------------------------------------------------------------------------------------------------------------
// Text

const spanText = (span: Span.Span): string => {
  switch (span._tag) {
    case "Text":
    case "URI":
      return span.value
    case "Sequence":
      return spanText(span.left) + spanText(span.right)
    case "Highlight":
    case "Strong":
    case "Weak":
      return spanText(span.value)
  }
}

const bold = (style: Style, text: string) => style.color ? `\u001b[1m${text}\u001b[0m` : text

/**
 * `words` in lines of at most `width` columns: the first after `first`, the rest after `rest` (both spaces). A
 * word too long for a line of its own is cut at its spaces, or where it must.
 */
const wrap = (words: ReadonlyArray<string>, width: number, first: string, rest: string): Array<string> => {
  const room = Math.max(10, width - rest.length)
  const pieces = words.flatMap((word) => word.length <= room ? [word] : split(word, room))
  const lines: Array<string> = []
  let line = ""
  for (const piece of pieces) {
    const indent = lines.length === 0 ? first : rest
    if (line !== "" && indent.length + line.length + 1 + piece.length > width) {
      lines.push(indent + line)
      line = piece
    } else {
      line = line === "" ? piece : `${line} ${piece}`
    }
  }
  if (line !== "" || lines.length === 0) lines.push((lines.length === 0 ? first : rest) + line)
  return lines
}

/** A word longer than `room`, as pieces that fit (at its spaces where it has some). */
const split = (word: string, room: number): Array<string> =>
  word.split(" ").flatMap((part) => {
    const pieces: Array<string> = []
    for (let at = 0; at < part.length; at += room) pieces.push(part.slice(at, at + room))
    return pieces.length === 0 ? [""] : pieces
  }).filter((piece) => piece !== "")

/** A paragraph's text (its own line breaks kept) at `indent`, wrapped; continuation lines indented `hang` more. */
const paragraph = (text: string, style: Style, indent: string, hang = ""): Array<string> =>
  text.split("\n").flatMap((line) =>
    wrap(line.split(/ +/).filter((word) => word !== ""), style.width, indent, indent + hang)
  )

/** A help document from @effect/cli as lines at `indent`. */
const docLines = (doc: HelpDoc.HelpDoc, style: Style, indent: string): Array<string> => {
  switch (doc._tag) {
    case "Empty":
      return []
    case "Header":
      return ["", bold(style, spanText(doc.value))]
    case "Paragraph":
      return paragraph(spanText(doc.value), style, indent)
    case "DescriptionList":
      return doc.definitions.flatMap(([term, definition], i) => [
        ...(i === 0 ? [] : [""]),
        ...wrap(spanText(term).split(" "), style.width, indent, `${indent}  `).map((line) => bold(style, line)),
        ...docLines(definition, style, `${indent}    `)
      ])
    case "Enumeration":
      return doc.elements.flatMap((element) => docLines(element, style, `${indent}- `))
    case "Sequence":
      return [...docLines(doc.left, style, indent), ...docLines(doc.right, style, indent)]
  }
}

/** A usage as words: each option or argument one (`[--db text]`, `[--id text...]`, `<queue>`). */
const usageWords = (usage: Usage.Usage): Array<string> => {
  switch (usage._tag) {
    case "Empty":
      return []
    case "Mixed":
      return ["<command>"]
    case "Named": {
      const type = Option.match(usage.acceptedValues, { onNone: () => "", onSome: (values) => ` ${values}` })
      return [usage.names.length > 1 ? `(${usage.names.join(", ")}${type})` : `${usage.names.join("")}${type}`]
    }
    case "Optional":
      return bracket(usageWords(usage.usage), "[", "]")
    case "Repeated":
      return bracket(usageWords(usage.usage), "", "...")
    case "Alternation":
      return [...usageWords(usage.left), "|", ...usageWords(usage.right)]
    case "Concat":
      return [...usageWords(usage.left), ...usageWords(usage.right)]
  }
}

const bracket = (words: Array<string>, open: string, close: string): Array<string> =>
  words.length === 0 ?
    [] :
    words.map((word, i) => `${i === 0 ? open : ""}${word}${i === words.length - 1 ? close : ""}`)

const firstLine = (doc: HelpDoc.HelpDoc): string => {
  const lines = docLines(doc, { color: false, width: Number.MAX_SAFE_INTEGER }, "")
  return lines.find((line) => line.trim() !== "")?.trim() ?? ""
}

/** The help page of `node`, in a tree whose root is the program `name` at `version`. */
export const render = (node: Node, style: Style, version: string): string => {
  const name = node.path.join(" ")
  // The command's own usage starts with its name: its path replaces it.
  const own = usageWords(Descriptor.getUsage(node.command)).slice(1)
  const usage = [name, ...own, ...(node.children.length > 0 ? ["<command>"] : [])]
  const lines = [
    bold(style, `${node.path[0]} ${version}`),
    "",
    bold(style, "USAGE"),
    ...wrap(usage, style.width, "  ", " ".repeat(Math.min(2 + name.length + 1, 40))),
    ...docLines(Descriptor.getHelp(node.command, CliConfig.defaultConfig), style, "  ")
  ]
  if (node.children.length > 0) {
    const commands = nodes(node).slice(1)
    const column = Math.min(Math.max(...commands.map((command) => command.path.join(" ").length)), 32)
    lines.push("", bold(style, "COMMANDS"))
    for (const command of commands) {
      const path = command.path.join(" ")
      const hang = " ".repeat(2 + column + 2)
      const head = path.length > column ? [`  ${path}`] : []
      const lead = path.length > column ? hang : `  ${path.padEnd(column)}  `
      lines.push(...head, ...wrap(firstLine(command.description).split(" "), style.width, lead, hang))
    }
  }
  return lines.join("\n").replace(/\n{3,}/g, "\n\n")
}

/**
 * The help page `args` ask for, as @effect/cli's parser finds it (`--help` or `-h` after a command's words), or a
 * group's named without a subcommand (`leasehold`, `leasehold mailbox`: @effect/cli shows its help too); none
 * when they ask for something else, or are wrong (the run reports that).
 */
export const requested = <A>(
  root: Root<A>,
  args: ReadonlyArray<string>,
  style: Style,
  version: string
) => {
  const top = tree(root)
  const { exactly, node } = target(top, args)
  return Descriptor.parse(root.descriptor, [top.path[0]!, ...args], CliConfig.defaultConfig).pipe(
    Effect.map((directive) =>
      (directive._tag === "BuiltIn" && directive.option._tag === "ShowHelp") ||
        (directive._tag === "UserDefined" && exactly && node.children.length > 0)
        ? Option.some(render(node, style, version))
        : Option.none()
    ),
    Effect.orElseSucceed(() => Option.none<string>())
  )
}
