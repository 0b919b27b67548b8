/** What every part of the console's HTML needs (a leaf, so the page and its panels import it, not each other). */

const escapes: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" }

/** Text made safe for HTML content and attribute values. */
export const escape = (value: unknown): string => String(value).replace(/[&<>"']/g, (c) => escapes[c]!)
