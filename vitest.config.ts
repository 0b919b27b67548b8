import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Two test files at a time: most of the suite waits on child processes and servers, not on the CPU, and one
    // file at a time (vitest's default on 2 cores) left the machine half idle.
    poolOptions: { forks: { maxForks: 2, minForks: 1 } }
  }
})
