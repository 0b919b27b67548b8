/**
 * The command line's one printer. What a command prints often holds what another party stored (a body, a queue
 * name, a request id, an error, a worker's name) or sent (a health server's reasons): every character a terminal
 * could act on, or that changes how the rest of the line reads, is written as `\uXXXX` — C0 controls (ESC, BEL),
 * DEL, C1 controls (U+009B is a CSI on its own), the bidirectional overrides and isolates, the line and paragraph
 * separators and lone surrogates. A stored value can then neither move the cursor, recolour, retitle or
 * hyperlink the operator's terminal, nor reorder what it shows. `--json` output stays JSON that parses to the
 * same values: the same characters are written as JSON's own `\uXXXX` escapes.
 */
import * as Console from "effect/Console"

/** The characters shown escaped (tabs and newlines too: a stored value cannot forge a line). */
const unsafe =
  /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

/** The same, a newline excepted: for a whole text that the command laid out in lines. */
const unsafeButNewline =
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

const escape = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`

/** `text` with every character a terminal could act on written as `\uXXXX` (newlines too): one value, one line. */
export const printable = (text: string): string => text.replace(unsafe, escape)

/** `text` as `printable` writes it, its newlines kept: a text the command itself laid out in lines. */
export const printableLines = (text: string): string => text.replace(unsafeButNewline, escape)

/**
 * A line whose interpolated values are `printable` (`line\`message ${id} in ${queue}\``): for a header or a
 * message that names stored values.
 */
export const line = (parts: TemplateStringsArray, ...values: ReadonlyArray<unknown>): string =>
  parts.reduce((text, part, i) => `${text}${printable(String(values[i - 1]))}${part}`)

/** What JSON.stringify leaves as it is of `unsafe` (it escapes C0 controls and lone surrogates itself). */
const unsafeInJson = /[\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/g

/** `value` as indented JSON whose strings carry no character a terminal could act on (escaped the JSON way). */
export const jsonText = (value: unknown): string =>
  // Outside a string JSON is ASCII: each of these stands inside one, where `\uXXXX` means the same character.
  JSON.stringify(value, null, 2).replace(unsafeInJson, escape)

/** Prints a command's text output (stdout). */
export const say = (text: string) => Console.log(printableLines(text))

/** Prints `value` as JSON (stdout). */
export const sayJson = (value: unknown) => Console.log(jsonText(value))

/** Prints `value` as JSON with `--json`, else `text()`. */
export const print = (asJson: boolean, value: unknown, text: () => string) => asJson ? sayJson(value) : say(text())

/** Prints a warning or an error (stderr). */
export const warn = (text: string) => Console.error(printableLines(text))
