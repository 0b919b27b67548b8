/**
 * A package registry on loopback serving what the npm cache holds, so that a test can run a plain
 * `npm install <specs>` — the README's install line, ranges and all — without the network. (`--offline`
 * alone cannot: npm 11 asks for whole package documents when it resolves a range, and our own install cached
 * only the abbreviated ones, which npm will not take for the whole.)
 *
 * A package's document is the cached one with its versions cut to those whose tarball is in the cache (and
 * its tags to those versions): npm resolves each range among what is there, which for the Effect packages is
 * what the registry's own answer was when the cache was filled (its newest release in range), and for a
 * transitive dependency may be an older release than the registry's newest. Tarballs are served from the
 * cache by integrity. Packages given to `start` (the packed leasehold) are served beside them.
 */
import { Effect } from "effect"
import { createHash } from "node:crypto"
import { existsSync, readFileSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { join } from "node:path"

/** A package the registry serves that is not in the cache: its manifest and its tarball. */
export interface Extra {
  readonly manifest: Record<string, unknown> & { readonly name: string; readonly version: string }
  readonly tarball: string
}

interface Version {
  readonly dist?: { readonly integrity?: string; tarball?: string }
  readonly [key: string]: unknown
}

interface Document {
  readonly versions: Record<string, Version>
  readonly "dist-tags"?: Record<string, string>
  readonly [key: string]: unknown
}

/** Where cacache keeps the entry for `key`: index-v5, by the key's SHA-256. */
const bucketOf = (cache: string, key: string) => {
  const hash = createHash("sha256").update(key).digest("hex")
  return join(cache, "index-v5", hash.slice(0, 2), hash.slice(2, 4), hash.slice(4))
}

/** Where cacache keeps the content with `integrity` (its SHA-512 part), if it keeps it. */
const contentOf = (cache: string, integrity: string): string | undefined => {
  const sha512 = integrity.split(/\s+/).find((part) => part.startsWith("sha512-"))
  if (sha512 === undefined) return undefined
  const hex = Buffer.from(sha512.slice("sha512-".length), "base64").toString("hex")
  const path = join(cache, "content-v2", "sha512", hex.slice(0, 2), hex.slice(2, 4), hex.slice(4))
  return existsSync(path) ? path : undefined
}

/** The cached body of a request for `url` (the newest entry; a null integrity is a deletion). */
const cached = (cache: string, url: string): Buffer | undefined => {
  const key = `make-fetch-happen:request-cache:${url}`
  const bucket = bucketOf(cache, key)
  if (!existsSync(bucket)) return undefined
  const entries = readFileSync(bucket, "utf8").split("\n").filter((line) => line.length > 0).map((line) =>
    JSON.parse(line.slice(line.indexOf("\t") + 1)) as { readonly key: string; readonly integrity: string | null }
  ).filter((entry) => entry.key === key)
  const integrity = entries.at(-1)?.integrity
  const path = integrity == null ? undefined : contentOf(cache, integrity)
  return path === undefined ? undefined : readFileSync(path)
}

const integrityOf = (file: string) => `sha512-${createHash("sha512").update(readFileSync(file)).digest("base64")}`

/**
 * Serves the npm cache at `cache` (the `_cacache` directory) and `extras` on a loopback port for the scope;
 * the registry's URL.
 */
export const start = (cache: string, extras: ReadonlyArray<Extra>) =>
  Effect.acquireRelease(
    Effect.async<{ readonly url: string; readonly close: () => void }>((resume) => {
      let base = ""
      const extraTarballs = new Map(extras.map((extra) => [integrityOf(extra.tarball), extra.tarball]))
      const documentOf = (name: string): Document | undefined => {
        const extra = extras.find((candidate) => candidate.manifest.name === name)
        if (extra !== undefined) {
          const { manifest } = extra
          const integrity = integrityOf(extra.tarball)
          return {
            name,
            "dist-tags": { latest: manifest.version },
            versions: { [manifest.version]: { ...manifest, dist: { integrity, tarball: "" } } }
          }
        }
        const body = cached(cache, `https://registry.npmjs.org/${name.replace("/", "%2f")}`)
        if (body === undefined) return undefined
        const document = JSON.parse(body.toString("utf8")) as Document
        const versions = Object.fromEntries(
          Object.entries(document.versions).filter(([, version]) =>
            version.dist?.integrity !== undefined && contentOf(cache, version.dist.integrity) !== undefined
          )
        )
        const tags = Object.fromEntries(
          Object.entries(document["dist-tags"] ?? {}).filter(([, version]) => versions[version] !== undefined)
        )
        return { ...document, "dist-tags": tags, versions }
      }
      const server = createServer((request, response) => {
        const path = decodeURIComponent((request.url ?? "/").split("?")[0]!.slice(1))
        if (path.startsWith("-/tarball/")) {
          const integrity = path.slice("-/tarball/".length)
          const file = extraTarballs.get(integrity) ?? contentOf(cache, integrity)
          if (file === undefined) return response.writeHead(404).end()
          return response.writeHead(200, { "content-type": "application/octet-stream" }).end(readFileSync(file))
        }
        const document = documentOf(path)
        if (document === undefined) return response.writeHead(404, { "content-type": "application/json" }).end("{}")
        for (const version of Object.values(document.versions)) {
          version.dist!.tarball = `${base}/-/tarball/${encodeURIComponent(version.dist!.integrity!)}`
        }
        response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(document))
      })
      server.listen(0, "127.0.0.1", () => {
        base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
        resume(Effect.succeed({ url: `${base}/`, close: () => server.close() }))
      })
    }),
    (registry) => Effect.sync(registry.close)
  ).pipe(Effect.map((registry) => registry.url))
