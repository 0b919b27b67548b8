/**
 * Redis for the benchmark's BullMQ rows: the throwaway server of test/support/redis.ts (persistence off, like
 * the PostgreSQL cluster's fsync=off: the figures measure the software, not the disk), and the CPU a server
 * spends, read from `/proc`. A server that cannot start is a failure naming the reason, so the caller can skip
 * the Redis rows and say why.
 */
import { Redis as IORedis } from "ioredis"
import { readdirSync, readFileSync } from "node:fs"
import { schedstats, type ServerCpu } from "./mailboxSql.js"

export { type Server, server } from "../test/support/redis.js"

/** The CPU time of every thread of `pid` (`/proc/<pid>/task/<tid>/schedstat`). */
const cpuOf = (pid: number): ServerCpu => () => {
  try {
    return schedstats(`/proc/${pid}/task`, readdirSync(`/proc/${pid}/task`))
  } catch {
    return undefined
  }
}

/**
 * The CPU time of the server at `host`:`port`, by the process id it reports (`INFO server`): for a process that
 * did not start it, such as a benchmark's child. `undefined` readings where that process is not on this machine.
 */
export const cpuAt = async (host: string, port: number): Promise<ServerCpu> => {
  const client = new IORedis({ host, port, lazyConnect: true, maxRetriesPerRequest: 1 })
  await client.connect()
  const info = await client.info("server")
  client.disconnect()
  const pid = Number(/^process_id:(\d+)/m.exec(info)?.[1])
  const comm = (() => {
    try {
      return readFileSync(`/proc/${pid}/comm`, "utf8").trim()
    } catch {
      return undefined
    }
  })()
  return Number.isInteger(pid) && comm?.startsWith("redis") === true ? cpuOf(pid) : () => undefined
}
