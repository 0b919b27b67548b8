/**
 * A database target as a string: what it names (a PostgreSQL URL or a SQLite file, see `parse`), and how to
 * show it without its secrets (`redact`) wherever a target can be shown — errors, logs, the command line, the
 * console's page. Redaction errs on the side of hiding: where parsers disagree about where a password ends, it
 * hides the most any of them would read as one.
 */
import * as Either from "effect/Either"

/** What a target names. */
export type Target =
  | { readonly _tag: "Postgres"; readonly url: string }
  | { readonly _tag: "Sqlite"; readonly filename: string }

/** The URL schemes of PostgreSQL: libpq's two, and `pg` (which leasehold has always taken). */
const postgresSchemes: ReadonlySet<string> = new Set(["postgres", "postgresql", "pg"])

/** A scheme of two letters or more (`C:` is a drive). */
const schemeOf = (target: string): string | undefined => /^([a-z][a-z0-9+.-]+):/i.exec(target)?.[1]

const keyValueString = /^[a-z_]+\s*=/i

/**
 * What `target` names, or why it names nothing leasehold opens (a reason that never quotes the target, so it
 * cannot show a secret). Surrounding whitespace is ignored.
 *
 * - `postgres://…`, `postgresql://…`, `pg://…` (any case): PostgreSQL, if `postgresUrlProblem` finds none.
 * - `sqlite:PATH` or `sqlite://PATH`: the file PATH (so `sqlite:///var/app.db` is `/var/app.db`, and
 *   `sqlite:app.db` or `sqlite://app.db` is `app.db` in the working directory).
 * - `file:PATH`, `file:///PATH`, `file://localhost/PATH` (RFC 8089): the file PATH; another host is refused.
 * - In both SQLite forms PATH is percent-decoded (`%20` a space, `%3F` a `?`); a query or fragment (`?mode=ro`),
 *   a malformed escape and an empty PATH are refused.
 * - Anything else with a scheme (`mysql://`, `http://`, `backup:1.db`) is refused, naming the scheme; a file
 *   whose name has a colon before any slash is written `./name`.
 * - A key=value connection string (`host=… password=…`, starting with `word=`) is refused: give a URL.
 * - Anything else is the path of a SQLite file, as it is.
 */
export const parse = (input: string): Either.Either<Target, string> => {
  const target = input.trim()
  if (target === "") return Either.left("the target is empty: name a SQLite file or a postgres:// URL")
  if (keyValueString.test(target)) {
    return Either.left(
      "a key=value connection string is not supported: give PostgreSQL as a URL, " +
        "postgres://user:password@host:port/database"
    )
  }
  const scheme = schemeOf(target)
  if (scheme === undefined) return Either.right({ _tag: "Sqlite", filename: target })
  const lower = scheme.toLowerCase()
  if (postgresSchemes.has(lower)) {
    const problem = postgresUrlProblem(target)
    return problem === undefined ? Either.right({ _tag: "Postgres", url: target }) : Either.left(problem)
  }
  if (lower === "sqlite" || lower === "file") return sqliteUrl(lower, target.slice(scheme.length + 1))
  return Either.left(
    `unsupported scheme "${scheme}:". leasehold opens PostgreSQL (postgres://user:password@host:port/database) ` +
      "and SQLite files (a path, sqlite:PATH or file:PATH; a file whose name has a colon is written ./name)"
  )
}

/** `sqlite:` / `file:` with what follows the scheme's colon. */
const sqliteUrl = (scheme: "sqlite" | "file", rest: string): Either.Either<Target, string> => {
  let path = rest
  if (path.startsWith("//")) {
    path = path.slice(2)
    if (scheme === "file") {
      const slash = path.indexOf("/")
      const host = slash < 0 ? path : path.slice(0, slash)
      if (host !== "" && host.toLowerCase() !== "localhost") {
        return Either.left(
          "a file:// URL that names a host is not a local file: write file:///absolute/path or file:relative/path"
        )
      }
      path = slash < 0 ? "" : path.slice(slash)
    }
  }
  if (/[?#]/.test(path)) {
    return Either.left(
      `a ${scheme}: URL takes no query or fragment (SQLite URI parameters are not supported); percent-encode a ` +
        "'?' or '#' of the file's name (%3F, %23)"
    )
  }
  const filename = decoded(path)
  if (filename === undefined) return Either.left(`a malformed percent-escape in the ${scheme}: URL (write '%' as %25)`)
  if (filename === "") return Either.left(`the ${scheme}: URL names no file`)
  return Either.right({ _tag: "Sqlite", filename })
}

const decoded = (text: string): string | undefined => {
  try {
    return decodeURIComponent(text)
  } catch {
    return undefined
  }
}

const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/**
 * Why the PostgreSQL driver would misread `url`, if it would: the driver (node-postgres) reads a URL as WHATWG's
 * parser does, so its user and password end at the last `@` before the first `/`, `?` or `#`, while `redact`
 * hides up to the last `@` of all. Requiring both to be the same `@` (raw `/ ? #` in a user or password, or an
 * `@` after the host, percent-encoded) makes the password the driver sends the text `redact` hides. Spaces,
 * control characters and stray `%` are refused too: the driver rewrites URLs that hold them and can change
 * what their escapes mean.
 */
export const postgresUrlProblem = (url: string): string | undefined => {
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(url)
  if (scheme === null) return "not a valid URL: write postgres://user:password@host:port/database"
  const rest = url.slice(scheme[0].length)
  const at = rest.lastIndexOf("@")
  if (at >= 0 && /[/?#]/.test(rest.slice(0, at))) {
    return "not a valid URL: the last '@' must end the user and password, so percent-encode '/', '?' and '#' in " +
      "them (%2F, %3F, %23) and '@' anywhere after the host (%40)"
  }
  if (loneSurrogate.test(url)) return "not a valid URL: it holds text that is not Unicode"
  if (/[\u0000-\u0020\u007f]/.test(url)) {
    return "not a valid URL: percent-encode spaces and control characters (a space is %20)"
  }
  if (/%(?![0-9a-f]{2})/i.test(url)) return "not a valid URL: a malformed percent-escape (write '%' as %25)"
  // As the driver reads it: an empty host (`user@/db?host=/run/postgresql`) is allowed.
  const parsed = URL.canParse(url)
    ? new URL(url)
    : URL.canParse(url.replace("@/", "@___DUMMY___/"))
    ? new URL(url.replace("@/", "@___DUMMY___/"))
    : undefined
  if (parsed === undefined) return "not a valid URL (is the port a number, the host well formed?)"
  try {
    decodeURIComponent(parsed.username)
    decodeURIComponent(parsed.password)
    decodeURIComponent(parsed.hostname)
    decodeURI(parsed.pathname)
  } catch {
    return "not a valid URL: a percent-escape that is not UTF-8"
  }
  return undefined
}

/** Keys whose values are secrets: `password`, `sslpassword`, and anything else naming a pass, secret or token. */
const isSecretKey = (key: string) => /pass|pwd|secret|token/i.test(decoded(key.replace(/\+/g, " ")) ?? key)

/** `key=` at the start, after whitespace (key=value strings) or after `?`, `&`, `;` (queries). */
const parameter = /(^|[\s?&;])([^\s?&;=]*)\s*=\s*/g

/** Schemes whose URLs have a `//user:password@host` authority (with or without `jdbc:`). */
const authoritySchemes: ReadonlySet<string> = new Set([
  ...postgresSchemes,
  "mysql",
  "mariadb",
  "sqlserver",
  "mssql",
  "oracle",
  "mongodb",
  "mongodb+srv",
  "redis",
  "rediss",
  "amqp",
  "amqps",
  "http",
  "https",
  "ws",
  "wss",
  "ftp",
  "sqlite",
  "file"
])

/**
 * Where the password is: in a URL of a known scheme, from the first `:` after `//` to the last `@` (the user
 * before it is shown); in anything else — no scheme, an unknown one, where `me://…` could as well be user
 * `me` — from the first `:` of all to the last `@`.
 */
const passwordSpan = (target: string): readonly [number, number] | undefined => {
  const url = /^(?:jdbc:)?([a-z][a-z0-9+.-]*):\/\//i.exec(target)
  const start = url !== null && authoritySchemes.has(url[1]!.toLowerCase()) ? url[0].length : 0
  const at = target.lastIndexOf("@")
  if (at < start) return undefined
  const colon = target.indexOf(":", start)
  return colon >= 0 && colon < at ? [colon + 1, at] : undefined
}

/** Where the first secret parameter's value begins (it is taken to run to the end). */
const secretValueStart = (target: string): number | undefined => {
  for (const match of target.matchAll(parameter)) {
    if (isSecretKey(match[2]!)) return match.index + match[0].length
  }
  return undefined
}

/**
 * `target` without its secrets, for any string and any scheme:
 *
 * - the password of a user part: from the first `:` after `//` to the *last* `@` of the target, so a password
 *   holding `@ / # ? :` is hidden whole (`postgres://u:p@ss@host/db` shows `postgres://u:***@host/db`); in a
 *   target without a known scheme (`me:pw@host`, `foo://me:pw@host`), from its first `:` to the last `@`;
 * - the value of the first secret parameter — a query's (`?password=`, `&sslpassword=`) or a key=value string's
 *   (`password=…`) — and everything after it (a value with a raw `&` or space would otherwise leave a piece).
 *
 * A file path is shown as it is (unless it has `@` after a `:`, or a `password=` word). Redacting twice
 * changes nothing.
 */
export const redact = (target: string): string => {
  const span = passwordSpan(target)
  const shown = span === undefined ? target : `${target.slice(0, span[0])}***${target.slice(span[1])}`
  const value = secretValueStart(shown)
  return value === undefined ? shown : `${shown.slice(0, value)}***`
}

/**
 * The secrets `redact` hides, each as written and percent-decoded (a key=value string's quoted value also
 * unquoted), at least 4 characters long: what `scrub` removes from a text that may quote them.
 */
export const secrets = (target: string): ReadonlyArray<string> => {
  const found: Array<string> = []
  const span = passwordSpan(target)
  if (span !== undefined) found.push(target.slice(span[0], span[1]))
  const value = secretValueStart(target)
  if (value !== undefined) {
    const tail = target.slice(value)
    found.push(tail, tail.split(/[&\s]/)[0]!)
    const quoted = /^'((?:[^'\\]|\\.)*)'?/.exec(tail)
    if (quoted !== null) found.push(quoted[1]!.replace(/\\(.)/g, "$1"))
  }
  const forms = found.flatMap((secret) => [secret, decoded(secret) ?? secret])
  return [...new Set(forms)].filter((secret) => secret.length >= 4).sort((a, b) => b.length - a.length)
}

/** `text` (a driver's message, say) with every secret of `target` in it replaced by `***`. */
export const scrub = (text: string, target: string): string =>
  secrets(target).reduce((scrubbed, secret) => scrubbed.split(secret).join("***"), text)
