/**
 * Every program in examples/ runs in a child process and prints what its
 * README promises; a new example without an entry here fails the suite.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { readdirSync } from "node:fs"
import { runTsx } from "./helpers.js"

/** Examples that run until signalled are driven by their own test file instead. */
const drivenElsewhere: Record<string, string> = {
  "loop-group-signals.ts": "test/signals.test.ts",
  "worker.ts": "test/worker-example.test.ts"
}

const expectations: Record<string, ReadonlyArray<RegExp>> = {
  "agent-tools.ts": [
    /tool: image for unit ready/,
    /tool: suite unit finished after 2.4 s/,
    /unit: 41 passed, 1 failed: look at test_parser/,
    /tool: suite e2e interrupted at the deadline/,
    /e2e: failed: .*Deadline exceeded at/,
    /lease extensions: [1-9]\d*; requests left: 0/
  ],
  "resumable-agent.ts": [
    /worker 1: model calls 2, tools run: lookup_order, refund/,
    /journal step 1.1: Turn/,
    /journal step 1.2: Tool lookup_order/,
    /journal step 1.3: Tool refund/,
    /worker 2: model calls 1, tools run: 0/,
    /reply to ticket-7 \(attempt 2\): Order A-42 was refunded: 30 EUR\./,
    /refunds made: 1 \([0-9a-f-]{36}\.\d+\/1\.3\)/, // the message's own key, not the request id
    /journal after the ack: gone/
  ],
  "main-loop.ts": [
    /r1: ok HELLO/,
    /r2: error DeadlineExceededError/,
    /r3: error Error/,
    /dead letter r3 after 1 delivery: cannot handle "%%%" \(attempt 1\)/
  ],
  "durable-mailbox.ts": [
    /r1: ok HELLO/,
    /r2: error cannot handle "%%%"/,
    /dead letter 2 from "requests": Error: cannot handle "%%%"/,
    /dead letter 3 from "requests": SerializationError: \["requestId"\] is missing/,
    /redrove 1; requests queued: 1/
  ],
  "merge-queue.ts": [
    /agent-a claimed hotfix\/crash \(token 1\), then hangs/,
    /agent-b while agent-a's lock is live: nothing/,
    /lock stale: true/,
    /agent-b claimed hotfix\/crash \(token 2, attempt 2\)/,
    /agent-a wakes up: LockLostError: Merge queue entry \d+ cannot be changed under fencing token 1: /,
    /merged 3 of 3; entries healed after a crash: 1/
  ],
  "work-lease.ts": [
    /repo-a 1: Enqueued/,
    /repo-a 0 fails: RetryScheduled/,
    /repo-a 0 succeeds: NextHint 1/,
    /repo-a 2 before 1: BacklogOrderingError/,
    /repo-a 1: Acquired with fencing token 2 \(was 1\)/,
    /zombie write with token 1: StaleFencingTokenError/,
    /repo-a 0 again: AlreadyProcessed/,
    /repo-c 0 after 1 s of beating work: AlreadyAcquired \(B's\)/,
    /repo-c 0 taken over: fencing token 2 \(A had 1\), retry count 1/,
    /repo-c 1 while B works: Enqueued/,
    /A wakes and settles: TokenMismatchError/,
    /B settles: NextHint 1/
  ],
  "health-server.ts": [
    /GET \/health\/live -> 200/,
    /GET \/health\/ready -> 200/,
    /GET \/metrics -> leasehold_messages_processed_total\{.*\} 3/,
    /after shutdown: GET \/health\/ready -> 503 .*shutting down/
  ],
  "eval-loop.ts": [
    /careful: pass rate 1, mean score 1/,
    /sloppy: pass rate 0.5, mean score 0.5/,
    /sloppy vs careful: pass rate -0.5/
  ],
  "deadline.ts": [
    /Deadline.make\("2030-01-01T00:00:00"\) refused: naive/,
    /Deadline.make\("next tuesday"\) refused: invalid/,
    /Deadline.make\("2000-01-01T00:00:00Z"\) refused: past/,
    /slow tool: interrupted, cleaning up/,
    /evaluation stopped: Deadline exceeded at \d{4}-/,
    /subagent runs under the parent's deadline: true/,
    /budget check: Budget exceeded: totalTokens used 1050 of 1000/
  ],
  "heartbeat-lease.ts": [
    /worker-A received "steady-job" \(delivery 1\)/,
    /worker-C received "stuck-job" \(delivery 2\): the stuck lease ran out/,
    /worker-B wakes up and tries to ack: ReceiptHandleExpiredError/,
    /worker-A finished "steady-job" after \d+ lease extensions: never redelivered/,
    /done: 0 messages left in the mailbox/
  ]
}

describe("examples", () => {
  const files = readdirSync("examples").filter((file) => file.endsWith(".ts"))

  it("each example has expectations", () => {
    expect(files.filter((file) => !(file in expectations) && !(file in drivenElsewhere))).toEqual([])
  })

  for (const file of files.filter((file) => !(file in drivenElsewhere))) {
    it.live(`examples/${file} runs and prints its story`, () =>
      Effect.gen(function*() {
        const { code, stderr, stdout } = yield* runTsx(`examples/${file}`)
        expect(stderr).toBe("")
        expect(code).toBe(0)
        for (const pattern of expectations[file] ?? []) expect(stdout).toMatch(pattern)
        expect(stdout).not.toMatch(/never printed/)
      }), 60_000)
  }
})
