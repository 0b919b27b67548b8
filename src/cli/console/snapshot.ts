/**
 * What the operator's console shows, read from the database in one go: the
 * mailboxes (counts, in-flight leases, dead letters), the worker processes
 * (their loops and heartbeat ages, judged STALLED or LOST), the merge queue (lock,
 * entries, audit tail) and the work-lease domains. Nothing is ever created:
 * a part whose tables are not there is `Absent` (workers may make them
 * later; the next snapshot looks again), and a part whose read failed — a
 * dead database — is `Failed` with the error's message, so the page still
 * renders and says what is wrong.
 *
 * Throughput comes from `Sampler`: every `sampleEvery` it counts each
 * queue's rows and how many of the rows it saw last time are still there.
 * Rows that left (acknowledged or dead-lettered) are exact for messages that
 * lived across a sample; a message sent and finished between two samples is
 * not seen by its queue's rate, so the page also gives the total for all
 * queues from the messages' sequence, which counts those too (and, on
 * PostgreSQL, also the numbers a rolled-back send or a stale
 * acknowledgement's reply drew: a sequence has gaps). Every read has a
 * time limit, so a database that hangs is a failed part, not a page that
 * never comes.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as QueueTable from "../../internal/mailbox/sql/queues.js"
import { openExisting } from "../../internal/mailbox/sql/schema.js"
import * as WorkersTable from "../../internal/mailbox/sql/workers.js"
import { look } from "../../internal/mergeQueue/look.js"
import * as Sql from "../../internal/sql/common.js"
import * as WorkLeaseTables from "../../internal/sql/workLease/schema.js"
import * as MergeQueue from "../../MergeQueue.js"

/** A part of the page: its data, or why there is none. */
export type Section<A> =
  | { readonly _tag: "Present"; readonly value: A }
  | { readonly _tag: "Absent"; readonly reason: string }
  | { readonly _tag: "Failed"; readonly error: string }

export interface QueueView {
  readonly queue: string
  readonly queued: number
  readonly inFlight: number
  readonly delayed: number
  readonly deadLetters: number
  /** When the longest-waiting visible message became visible (epoch millis). */
  readonly oldestVisibleAt: number | undefined
  /** Messages that left the queue per minute, over the last `window` (observed by the sampler). */
  readonly perMinute: number
  /** Messages that left per sampling bucket, oldest first (the sparkline). */
  readonly recent: ReadonlyArray<number>
  /** Paused: its receivers get nothing (the queues table, mailbox migration 10). */
  readonly paused: boolean
  /** In the queues table: listed until dropped, even empty. */
  readonly recorded: boolean
}

export interface InFlightView {
  readonly id: string
  readonly queue: string
  readonly deliveryCount: number
  /** When the lease ends unless extended (epoch millis). */
  readonly leaseUntil: number
  readonly enqueuedAt: number
  /** The process that received it (`host:pid`), where the workers record it (mailbox migration 7). */
  readonly receivedBy: string | undefined
  /** When its lease was last extended (epoch millis); undefined when it was not, or is not recorded. */
  readonly extendedAt: number | undefined
  readonly body: string
}

/** A dead letter as the page shows it: its body and error cut to a preview by the database. */
export interface DeadLetterView {
  readonly id: string
  readonly queue: string
  readonly deliveryCount: number
  /** Epoch millis. */
  readonly deadLetteredAt: number
  readonly errorTag: string
  readonly error: string
  readonly body: string
}

/** Which page of the queue table, and which queues (those whose name contains `q`, in any case). */
export interface Query {
  readonly q: string
  /** 1-based; past the last page reads as the last. */
  readonly page: number
}

/** Where the shown page of queues lies among them. */
export interface QueuePage {
  readonly q: string
  readonly page: number
  readonly pages: number
  /** Queues whose name contains `q` (all of them without one). */
  readonly matching: number
  /** Queues in all. */
  readonly total: number
  /** The position of the page's first queue among the matching ones (0-based). */
  readonly offset: number
}

export interface Mailboxes {
  /** The page's queues, by name. */
  readonly queues: ReadonlyArray<QueueView>
  readonly queuePage: QueuePage
  /** Those whose leases end first, at most `inFlightLimit`. */
  readonly inFlight: ReadonlyArray<InFlightView>
  /** Messages in flight in all queues. */
  readonly inFlightTotal: number
  /** The oldest, at most `pageLimit`. */
  readonly deadLetters: ReadonlyArray<DeadLetterView>
  /** Dead letters of all queues. */
  readonly deadLetterTotal: number
  /** Messages that left any queue per minute, exact (from the sequence); undefined until two samples exist. */
  readonly totalPerMinute: number | undefined
  /** When the throughput sampler last looked (epoch ms, the console's clock); undefined before its first look. */
  readonly sampledAt: number | undefined
}

export interface MergeQueueView {
  readonly stats: MergeQueue.QueueStats
  /** The first `pageLimit` pending or in progress, in the order they are taken. */
  readonly entries: ReadonlyArray<MergeQueue.QueueEntry>
  /** The newest `auditLimit` rows, oldest first. */
  readonly audit: ReadonlyArray<MergeQueue.AuditRecord>
}

export interface Domains {
  /** The first `pageLimit` by id. */
  readonly domains: ReadonlyArray<DomainView>
  /** Domains in all. */
  readonly total: number
}

export interface DomainView {
  readonly domainId: string
  readonly leaseOffset: number | undefined
  readonly leaseFencing: number | undefined
  readonly acquiredAt: number | undefined
  readonly retryCount: number
  readonly fencingToken: number
  readonly lowWater: number
  readonly backlog: number
}

/** The worker processes (the mailbox's workers table), judged by the database's clock. */
export interface WorkersView {
  /** The first `pageLimit` by process id. */
  readonly processes: ReadonlyArray<WorkersTable.ListedWorker>
  /** The thresholds they were judged by (milliseconds): STALLED and LOST. */
  readonly stalledAfter: number
  readonly lostAfter: number
}

export interface Snapshot {
  readonly at: number
  readonly mailboxes: Section<Mailboxes>
  readonly workers: Section<WorkersView>
  readonly mergeQueue: Section<MergeQueueView>
  readonly workLeases: Section<Domains>
}

/**
 * How many queues, dead letters, merge-queue entries and domains a page shows at most. With every other list
 * bounded too, and every value cut to a preview (here for the bodies, on the page for the rest), a page is
 * bounded whatever the database holds, and it is refreshed every second.
 */
export const pageLimit = 50

/** How many in-flight messages a page shows at most (those whose leases end first). */
export const inFlightLimit = 20

/** How many audit rows a page shows (the newest). */
export const auditLimit = 15

/** How much of a body (and of a dead letter's error) is read: the page shows less. */
export const previewLength = 500

/** The longest search taken (a queue name is at most 200 characters). */
const maxSearch = 200

/** The page and search a request asks for (`?q=…&page=…`); anything malformed reads as none. */
export const query = (params: URLSearchParams): Query => {
  const page = params.get("page") ?? ""
  return {
    q: (params.get("q") ?? "").trim().slice(0, maxSearch),
    page: /^\d{1,9}$/.test(page) ? Math.max(1, Number(page)) : 1
  }
}

const num = (value: number | string | bigint | null | undefined) =>
  value === null || value === undefined ? undefined : Number(value)

/** How long a part's read may take before the page says the database did not answer. */
export const readLimit = "5 seconds"

/** Runs a part's read: a `TablesNotFoundError` is `Absent`, any other failure `Failed`. */
const section = <A, E extends { readonly _tag: string; readonly message: string }, R>(
  read: Effect.Effect<A, E, R>
): Effect.Effect<Section<A>, never, R> =>
  read.pipe(
    Effect.timeoutFail({
      duration: readLimit,
      onTimeout: () => ({ _tag: "Timeout", message: `the database did not answer within ${readLimit}` })
    }),
    Effect.map((value): Section<A> => ({ _tag: "Present", value })),
    Effect.catchAll((error) =>
      Effect.succeed<Section<A>>(
        error._tag === "TablesNotFoundError"
          ? { _tag: "Absent", reason: error.message }
          : { _tag: "Failed", error: error.message }
      )
    ),
    Effect.catchAllDefect((defect) => Effect.succeed<Section<A>>({ _tag: "Failed", error: String(defect) }))
  )

// ---------------------------------------------------------------------------
// Throughput
// ---------------------------------------------------------------------------

interface Sample {
  /** When it was taken, on the console's clock (only ever compared with the console's clock). */
  readonly at: number
  /** Rows per queue with a sequence number up to `sequence`. */
  readonly rows: ReadonlyMap<string, number>
  /** The highest sequence number handed out when the sample began (every message, every queue). */
  readonly sequence: number
}

/** Between two samples: what left each queue, and what left in all. */
export interface Bucket {
  readonly start: number
  readonly end: number
  readonly left: ReadonlyMap<string, number>
  readonly total: number
}

export interface Rates {
  /** The last sample, which the next one compares with. */
  readonly last: Sample | undefined
  /** Oldest first, covering at most `window`. */
  readonly buckets: ReadonlyArray<Bucket>
}

/** The sampler's buckets cover this long. */
export const window = 5 * 60_000

/** How many bars the sparkline has (each a tenth of a minute over `window`). */
export const bars = 30

/** Counts what leaves each queue (see the module comment). */
export interface Sampler {
  readonly sample: Effect.Effect<void>
  readonly rates: Effect.Effect<Rates>
}

/**
 * One sample: the sequence first, then each queue's rows up to it and how many of those the last sample saw
 * are still there (a row sent after the sequence was read waits for the next sample, so nothing is counted as
 * having been there that was not).
 */
export const makeSampler = (sql: SqlClient.SqlClient, prefix: string, seed?: Rates): Effect.Effect<Sampler> =>
  Effect.map(Ref.make<Rates>(seed ?? { last: undefined, buckets: [] }), (ref) => ({
    rates: Ref.get(ref),
    sample: Effect.gen(function*() {
      const store = yield* openExisting(prefix)
      const messages = sql(store.messages)
      const { last } = yield* Ref.get(ref)
      const seen = last?.sequence ?? 0
      const sequence = yield* sequenceOf(sql, store.messages)
      const rows = yield* sql<{ queue: string; n: number | string; survivors: number | string }>`SELECT queue,
          SUM(CASE WHEN seq <= ${sequence} THEN 1 ELSE 0 END) AS n,
          SUM(CASE WHEN seq <= ${seen} THEN 1 ELSE 0 END) AS survivors
        FROM ${messages} GROUP BY queue`
      const at = yield* Clock.currentTimeMillis
      const now: Sample = { at, rows: new Map(rows.map((row) => [row.queue, Number(row.n)])), sequence }
      yield* Ref.update(ref, (rates): Rates => {
        if (rates.last === undefined) return { last: now, buckets: [] }
        const survivors = new Map(rows.map((row) => [row.queue, Number(row.survivors)]))
        const left = new Map<string, number>()
        // Only queues that something left: with thousands of queues, a bucket holds the busy ones.
        for (const [queue, before] of rates.last.rows) {
          const gone = before - (survivors.get(queue) ?? 0)
          if (gone > 0) left.set(queue, gone)
        }
        const before = [...rates.last.rows.values()].reduce((a, b) => a + b, 0)
        const after = [...now.rows.values()].reduce((a, b) => a + b, 0)
        // Everything sent since, less what is still there: what left, in every queue.
        const total = Math.max(0, now.sequence - rates.last.sequence + before - after)
        return {
          last: now,
          buckets: [...rates.buckets, { start: rates.last.at, end: at, left, total }].filter((bucket) =>
            bucket.start >= at - window
          )
        }
      })
    }).pipe(
      // No tables yet is how a console over a new database starts; anything else is worth a line.
      Effect.catchAllCause((cause) =>
        Cause.failureOption(cause).pipe(
          Option.filter((error) => error._tag === "TablesNotFoundError"),
          Option.match({
            onNone: () => Effect.logWarning("leasehold console: a throughput sample failed", cause),
            onSome: () => Effect.void
          })
        )
      ),
      Effect.provideService(SqlClient.SqlClient, sql)
    )
  }))

/** Per minute over the buckets, on the sampler's own clock; 0 before the first bucket. */
export const perMinute = (buckets: ReadonlyArray<Bucket>, count: (bucket: Bucket) => number): number =>
  buckets.length === 0
    ? 0
    : buckets.reduce((sum, bucket) => sum + count(bucket), 0) /
      (Math.max(1, buckets[buckets.length - 1]!.end - buckets[0]!.start) / 60_000)

/** What left in each tenth of the window, oldest first (a bucket counts in the bar where it ended). */
export const recent = (buckets: ReadonlyArray<Bucket>, count: (bucket: Bucket) => number): ReadonlyArray<number> => {
  const counts = new Array<number>(bars).fill(0)
  const end = buckets[buckets.length - 1]?.end ?? 0
  for (const bucket of buckets) {
    const bar = bars - 1 - Math.floor((end - bucket.end) / (window / bars))
    if (bar >= 0) counts[bar]! += count(bucket)
  }
  return counts
}

/** The last sequence number given to a message (0 before the first). */
const sequenceOf = (sql: SqlClient.SqlClient, table: string) =>
  Effect.map(
    sql.onDialectOrElse({
      pg: () =>
        sql<{ n: string | number | null }>`SELECT pg_sequence_last_value(
          pg_get_serial_sequence(${table}, 'seq')::regclass) AS n`,
      orElse: () => sql<{ n: string | number | null }>`SELECT seq AS n FROM sqlite_sequence WHERE name = ${table}`
    }),
    (rows) => num(rows[0]?.n) ?? 0
  )

// ---------------------------------------------------------------------------
// The snapshot
// ---------------------------------------------------------------------------

/**
 * The mailboxes part: one grouped count per table (each queue's counts, each queue's dead letters) joined by
 * name in one pass, filtered by the search and sorted, then only the page's queues are built; the in-flight
 * and dead-letter lists are the first few, with previews of their bodies.
 */
const mailboxes = (
  sql: SqlClient.SqlClient,
  prefix: string,
  rates: Rates,
  now: number,
  query: Query
) =>
  Effect.gen(function*() {
    const store = yield* openExisting(prefix)
    const messages = sql(store.messages)
    const letters = sql(store.deadLetters)
    // Workers of a version before mailbox migration 7 record neither: the console reads what is there.
    const recorded = (yield* columnsOf(sql, store.messages)).has("received_by")
    // Before mailbox migration 10 there is no queues table: a queue is listed while it has rows, never paused.
    const registry = (yield* QueueTable.present(store)) ? yield* QueueTable.list(store) : []
    const [counts, dead, inFlight, deadLetters] = yield* Effect.all([
      sql<{
        queue: string
        queued: number | string
        in_flight: number | string
        delayed: number | string
        oldest_visible: number | string | null
      }>`SELECT queue,
          SUM(CASE WHEN visible_at <= ${now} THEN 1 ELSE 0 END) AS queued,
          SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NOT NULL THEN 1 ELSE 0 END) AS in_flight,
          SUM(CASE WHEN visible_at > ${now} AND receipt_handle IS NULL THEN 1 ELSE 0 END) AS delayed,
          MIN(CASE WHEN visible_at <= ${now} THEN visible_at END) AS oldest_visible
        FROM ${messages} GROUP BY queue`,
      sql<{ queue: string; n: number | string }>`SELECT queue, count(*) AS n FROM ${letters} GROUP BY queue`,
      sql<{
        seq: number | string
        queue: string
        delivery_count: number | string
        visible_at: number | string
        enqueued_at: number | string
        received_by: string | null
        extended_at: number | string | null
        body: string
      }>`SELECT seq, queue, delivery_count, visible_at, enqueued_at, substr(body, 1, ${previewLength}) AS body,
          ${recorded ? sql`received_by, extended_at` : sql`NULL AS received_by, NULL AS extended_at`}
        FROM ${messages} WHERE receipt_handle IS NOT NULL AND visible_at > ${now}
        ORDER BY visible_at LIMIT ${inFlightLimit}`,
      // What MailboxSqlAdmin's list reads, but only a preview of each letter: a body may be megabytes.
      sql<{
        id: string
        queue: string
        delivery_count: number | string
        dead_lettered_at: number | string
        error_tag: string
        error: string
        body: string
      }>`SELECT id, queue, delivery_count, dead_lettered_at, substr(error_tag, 1, ${previewLength}) AS error_tag,
          substr(error, 1, ${previewLength}) AS error, substr(body, 1, ${previewLength}) AS body
        FROM ${letters} ORDER BY dead_lettered_at, id LIMIT ${pageLimit}`
    ])
    const counted = new Map(counts.map((row) => [row.queue, row]))
    const deadByQueue = new Map(dead.map((row) => [row.queue, Number(row.n)]))
    // A queue stays on the page while it had traffic in the window, even once it is empty, and while it is
    // recorded in the queues table (until dropped).
    const paused = new Set(registry.filter((row) => row.paused).map((row) => row.name))
    const recordedNames = new Set(registry.map((row) => row.name))
    const names = new Set(counted.keys())
    for (const row of registry) names.add(row.name)
    for (const queue of deadByQueue.keys()) names.add(queue)
    for (const bucket of rates.buckets) for (const queue of bucket.left.keys()) names.add(queue)
    for (const queue of rates.last?.rows.keys() ?? []) names.add(queue)
    const search = query.q.toLowerCase()
    const matching = (search === "" ? [...names] : [...names].filter((name) => name.toLowerCase().includes(search)))
      .sort()
    const pages = Math.max(1, Math.ceil(matching.length / pageLimit))
    const page = Math.min(query.page, pages)
    const offset = (page - 1) * pageLimit
    const queues = matching.slice(offset, offset + pageLimit).map((queue): QueueView => {
      const row = counted.get(queue)
      const leftOf = (bucket: Bucket) => bucket.left.get(queue) ?? 0
      return {
        queue,
        queued: Number(row?.queued ?? 0),
        inFlight: Number(row?.in_flight ?? 0),
        delayed: Number(row?.delayed ?? 0),
        deadLetters: deadByQueue.get(queue) ?? 0,
        oldestVisibleAt: num(row?.oldest_visible),
        perMinute: perMinute(rates.buckets, leftOf),
        recent: recent(rates.buckets, leftOf),
        paused: paused.has(queue),
        recorded: recordedNames.has(queue)
      }
    })
    return {
      queues,
      queuePage: { q: query.q, page, pages, matching: matching.length, total: names.size, offset },
      inFlight: inFlight.map((row): InFlightView => ({
        id: String(row.seq),
        queue: row.queue,
        deliveryCount: Number(row.delivery_count),
        leaseUntil: Number(row.visible_at),
        enqueuedAt: Number(row.enqueued_at),
        receivedBy: row.received_by ?? undefined,
        extendedAt: num(row.extended_at),
        body: row.body
      })),
      inFlightTotal: counts.reduce((sum, row) => sum + Number(row.in_flight), 0),
      deadLetters: deadLetters.map((row): DeadLetterView => ({
        id: row.id,
        queue: row.queue,
        deliveryCount: Number(row.delivery_count),
        deadLetteredAt: Number(row.dead_lettered_at),
        errorTag: row.error_tag,
        error: row.error,
        body: row.body
      })),
      deadLetterTotal: dead.reduce((sum, row) => sum + Number(row.n), 0),
      totalPerMinute: rates.buckets.length === 0 ? undefined : perMinute(rates.buckets, (bucket) => bucket.total),
      sampledAt: rates.last?.at
    } satisfies Mailboxes
  })

/** The columns `table` has. */
const columnsOf = (sql: SqlClient.SqlClient, table: string) =>
  Effect.map(
    sql.onDialectOrElse({
      pg: () =>
        sql<{ name: string }>`SELECT column_name AS name FROM information_schema.columns
          WHERE table_schema = current_schema() AND table_name = ${table}`,
      orElse: () => sql<{ name: string }>`SELECT name FROM pragma_table_info(${table})`
    }),
    (rows) => new Set(rows.map((row) => row.name))
  )

/** The workers part: absent until the mailbox tables are at migration 9 (workers of an older release record none). */
const workers = (sql: SqlClient.SqlClient, prefix: string) =>
  Effect.gen(function*() {
    const store = yield* openExisting(prefix)
    const table = WorkersTable.workersTable(prefix)
    if ((yield* Sql.missingTables(sql, [table])).length > 0) {
      return yield* Effect.fail({
        _tag: "TablesNotFoundError",
        message: `no workers table "${table}" yet (mailbox migration 9: leasehold migrate adds it)`
      })
    }
    const thresholds = yield* WorkersTable.thresholdsFromEnv
    const processes = yield* WorkersTable.list(store, thresholds, pageLimit)
    return {
      processes,
      stalledAfter: Duration.toMillis(thresholds.stalledAfter),
      lostAfter: Duration.toMillis(thresholds.lostAfter)
    } satisfies WorkersView
  })

const mergeQueue = (prefix: string) =>
  Effect.gen(function*() {
    const queue = yield* look({ prefix })
    const [stats, entries, audit] = yield* Effect.all([
      queue.stats,
      queue.list({ status: [...MergeQueue.inProgress, "pending"], limit: pageLimit }),
      queue.auditLog({ last: auditLimit })
    ])
    return { stats, entries, audit } satisfies MergeQueueView
  })

const workLeases = (sql: SqlClient.SqlClient, prefix: string) =>
  Effect.gen(function*() {
    const names = WorkLeaseTables.tables(prefix)
    const missing = yield* Sql.missingTables(sql, [names.domains, names.backlog])
    if (missing.length > 0) {
      return yield* Effect.fail({
        _tag: "TablesNotFoundError",
        message: `no work-lease tables with prefix "${prefix}" (missing: ${missing.join(", ")})`
      })
    }
    const [rows, total] = yield* Effect.all([
      sql<{
        domain_id: string
        lease_offset: number | string | null
        lease_fencing: number | string | null
        acquired_at: number | string | null
        retry_count: number | string
        fencing_token: number | string
        low_water: number | string
        backlog: number | string
      }>`SELECT d.domain_id, d.lease_offset, d.lease_fencing, d.acquired_at, d.retry_count, d.fencing_token,
        d.low_water, (SELECT count(*) FROM ${sql(names.backlog)} b WHERE b.domain_id = d.domain_id) AS backlog
      FROM ${sql(names.domains)} d ORDER BY d.domain_id LIMIT ${pageLimit}`,
      sql<{ n: number | string }>`SELECT
        count(*) AS n FROM ${sql(names.domains)}`
    ])
    const domains = rows.map((row): DomainView => ({
      domainId: row.domain_id,
      leaseOffset: num(row.lease_offset),
      leaseFencing: num(row.lease_fencing),
      acquiredAt: num(row.acquired_at),
      retryCount: Number(row.retry_count),
      fencingToken: Number(row.fencing_token),
      lowWater: Number(row.low_water),
      backlog: Number(row.backlog)
    }))
    return { domains, total: Number(total[0]?.n ?? 0) } satisfies Domains
  })

/** Reads every part, the queue table's page that `query` asks for; never fails (a failed part says why). */
export const snapshot = (
  sql: SqlClient.SqlClient,
  prefix: string,
  sampler: Sampler,
  query: Query
): Effect.Effect<Snapshot> =>
  Effect.gen(function*() {
    // The database's clock judges leases, so the page counts down from it too (a dead database: ours).
    const at = yield* databaseTime(sql).pipe(
      Effect.timeout(readLimit),
      Effect.orElse(() => Clock.currentTimeMillis)
    )
    const rates = yield* sampler.rates
    const [mailboxesPart, workersPart, mergeQueuePart, workLeasesPart] = yield* Effect.all([
      section(mailboxes(sql, prefix, rates, at, query)),
      section(workers(sql, prefix)),
      section(mergeQueue(prefix)),
      section(workLeases(sql, prefix))
    ])
    return {
      at,
      mailboxes: mailboxesPart,
      workers: workersPart,
      mergeQueue: mergeQueuePart,
      workLeases: workLeasesPart
    }
  }).pipe(Effect.provideService(SqlClient.SqlClient, sql))

const databaseTime = (sql: SqlClient.SqlClient) =>
  Effect.map(sql<{ now: number | string }>`SELECT ${Sql.databaseNow(sql)} AS now`, (rows) => Number(rows[0]!.now))

/** Milliseconds of a `DateTime`, for the page. */
export const millis = (time: DateTime.Utc) => DateTime.toEpochMillis(time)
export const optionalMillis = (time: Option.Option<DateTime.Utc>) => Option.getOrUndefined(Option.map(time, millis))
