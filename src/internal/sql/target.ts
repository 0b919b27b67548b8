/**
 * A database target as a string: which dialect a URL names, and how to show
 * it without its secrets (in errors and in the command line's output).
 */

/** A PostgreSQL URL: `postgres://`, `postgresql://` or `pg://`, in any case. */
export const isPostgresUrl = (target: string): boolean => /^(postgres(ql)?|pg):\/\//i.test(target)

/**
 * A database target without its secrets: the password of a URL's user part (`//user:pw@`, `//:pw@`) and of
 * any `password=` query parameter, whatever the scheme. A file path is shown as it is.
 */
export const redact = (target: string): string =>
  /^[a-z][a-z0-9+.-]*:\/\//i.test(target)
    ? target
      .replace(/^([a-z][a-z0-9+.-]*:\/\/[^:@/?#]*):[^@/?#]*@/i, "$1:***@")
      .replace(/([?&][a-z_]*password=)[^&#]*/gi, "$1***")
    : target
