/**
 * A filesystem a test can fill, for the claims about a full disk: a small tmpfs mounted for the scope when this
 * process may mount one (root), else a file size limit (`RLIMIT_FSIZE`, through `prlimit`) on the child process
 * that writes — a write past the limit fails with EFBIG, which SQLite reports as a full disk, as it does ENOSPC.
 * Either way the test says "full" and "free" and the worker process sees a disk that is full, then is not.
 */
import { Effect, type Scope } from "effect"
import { execFileSync } from "node:child_process"
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

export interface SmallDisk {
  /** How the disk fills: a tmpfs, or a file size limit on the writing process. */
  readonly kind: "tmpfs" | "rlimit"
  /** The directory to keep the database in. */
  readonly directory: string
  /** Fills the disk (tmpfs) or lowers the writing process's limit to the size its files have (rlimit). */
  readonly fill: (pid: number) => Effect.Effect<void>
  /** Frees the space again. */
  readonly free: (pid: number) => Effect.Effect<void>
}

const tryMount = (directory: string): boolean => {
  if (process.getuid?.() !== 0 || process.env.LEASEHOLD_TEST_FULL_DISK === "rlimit") return false
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=8m", "tmpfs", directory], { stdio: "pipe" })
    return true
  } catch {
    return false
  }
}

/** Writes zeros into `file` until the filesystem refuses (ENOSPC). */
const fillUp = (file: string) => {
  const fd = openSync(file, "w")
  const chunk = Buffer.alloc(64 * 1024)
  try {
    for (;;) writeSync(fd, chunk)
  } catch {
    // Full: a last, smaller write takes what is left.
    try {
      for (;;) writeSync(fd, chunk.subarray(0, 512))
    } catch {
      // Full to the last block.
    }
  } finally {
    closeSync(fd)
  }
}

/** A small disk for the scope (unmounted and removed when it closes). */
export const smallDisk: Effect.Effect<SmallDisk, never, Scope.Scope> = Effect.acquireRelease(
  Effect.sync((): SmallDisk & { readonly mounted: boolean } => {
    const directory = mkdtempSync(join(tmpdir(), "leasehold-full-"))
    const filler = join(directory, "filler")
    if (tryMount(directory)) {
      return {
        kind: "tmpfs",
        mounted: true,
        directory,
        fill: () => Effect.sync(() => fillUp(filler)),
        free: () => Effect.sync(() => rmSync(filler, { force: true }))
      }
    }
    // The soft limit is set on the running process (lowered, then raised again: no privilege needed): every
    // file it writes is already larger than 1 KiB, so no write of it can grow a file or add a page.
    const limit = (pid: number, value: string) =>
      Effect.sync(() => execFileSync("prlimit", ["--pid", String(pid), `--fsize=${value}:`], { stdio: "pipe" }))
    return {
      kind: "rlimit",
      mounted: false,
      directory,
      fill: (pid) => limit(pid, "1024"),
      free: (pid) => limit(pid, "unlimited")
    }
  }),
  (disk) =>
    Effect.sync(() => {
      if (disk.mounted) {
        try {
          execFileSync("umount", ["-l", disk.directory], { stdio: "pipe" })
        } catch {
          // Left for the system to clean.
        }
      }
      rmSync(disk.directory, { recursive: true, force: true })
    })
)
