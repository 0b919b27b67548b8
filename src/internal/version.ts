/** This release's version, as package.json says (test/Workers.test.ts checks they agree): the CLI's `--version`, and what a worker records of itself. */
export const version = "0.1.0"
