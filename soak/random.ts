/**
 * The soak's randomness: a small seeded PRNG (mulberry32), so one `--seed` gives the same nemesis schedule
 * and the same producer mix on every run. The interleaving of processes is the operating system's and is
 * not replayed; what a seed replays is what the soak asks for and when.
 */

/** A stream of numbers in [0, 1) from a 32-bit seed. */
export interface Random {
  /** The next number in [0, 1). */
  readonly next: () => number
  /** An integer in [min, max]. */
  readonly int: (min: number, max: number) => number
  /** One of `choices`, each with its weight. */
  readonly pick: <A>(choices: ReadonlyArray<readonly [A, number]>) => A
}

/** mulberry32: 32 bits of state, good enough spread for a test schedule, and tiny. */
export const make = (seed: number, stream = 0): Random => {
  // Different streams of one seed (producer, nemesis) must not be the same sequence.
  let state = (seed ^ Math.imul(stream + 1, 0x9e3779b9)) >>> 0
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0
    let z = state
    z = Math.imul(z ^ (z >>> 15), z | 1)
    z ^= z + Math.imul(z ^ (z >>> 7), z | 61)
    return ((z ^ (z >>> 14)) >>> 0) / 4294967296
  }
  return {
    next,
    int: (min, max) => min + Math.floor(next() * (max - min + 1)),
    pick: (choices) => {
      const total = choices.reduce((sum, [, weight]) => sum + weight, 0)
      let x = next() * total
      for (const [choice, weight] of choices) {
        if (x < weight) return choice
        x -= weight
      }
      return choices[choices.length - 1]![0]
    }
  }
}

/** A fresh seed for a run that was given none (printed, so the run can be replayed). */
export const freshSeed = (): number => Math.floor(Math.random() * 2 ** 31)
