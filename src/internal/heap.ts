/**
 * A binary min-heap keyed by a number, with ties broken by insertion order (or by a given tie-breaker).
 * Used for timers (visibility expiry, delays) where stale entries are skipped
 * lazily by the caller instead of being removed.
 */
export class MinHeap<A> {
  private readonly keys: Array<number> = []
  private readonly seqs: Array<number> = []
  private readonly values: Array<A> = []
  private seq = 0

  get size(): number {
    return this.values.length
  }

  /** The smallest key, or undefined when empty. */
  peekKey(): number | undefined {
    return this.keys[0]
  }

  /** The tie-breaker of the smallest entry, or undefined when empty. */
  peekTie(): number | undefined {
    return this.seqs[0]
  }

  peek(): A | undefined {
    return this.values[0]
  }

  /** Adds `value` under `key`; ties go by `tie` when given (a message's first-enqueue order), else by insertion. */
  push(key: number, value: A, tie?: number): void {
    this.keys.push(key)
    this.seqs.push(tie ?? this.seq++)
    this.values.push(value)
    this.up(this.values.length - 1)
  }

  pop(): A | undefined {
    const n = this.values.length
    if (n === 0) return undefined
    const top = this.values[0]
    this.swap(0, n - 1)
    this.keys.pop()
    this.seqs.pop()
    this.values.pop()
    if (n > 1) this.down(0)
    return top
  }

  /** Every key and value, in no particular order. */
  forEach(f: (key: number, value: A) => void): void {
    for (let i = 0; i < this.values.length; i++) f(this.keys[i]!, this.values[i]!)
  }

  clear(): void {
    this.keys.length = 0
    this.seqs.length = 0
    this.values.length = 0
  }

  private less(i: number, j: number): boolean {
    const ki = this.keys[i]!
    const kj = this.keys[j]!
    return ki < kj || (ki === kj && this.seqs[i]! < this.seqs[j]!)
  }

  private swap(i: number, j: number): void {
    const k = this.keys[i]!
    this.keys[i] = this.keys[j]!
    this.keys[j] = k
    const s = this.seqs[i]!
    this.seqs[i] = this.seqs[j]!
    this.seqs[j] = s
    const v = this.values[i]!
    this.values[i] = this.values[j]!
    this.values[j] = v
  }

  private up(i: number): void {
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (!this.less(i, parent)) return
      this.swap(i, parent)
      i = parent
    }
  }

  private down(i: number): void {
    const n = this.values.length
    for (;;) {
      const left = 2 * i + 1
      const right = left + 1
      let smallest = i
      if (left < n && this.less(left, smallest)) smallest = left
      if (right < n && this.less(right, smallest)) smallest = right
      if (smallest === i) return
      this.swap(i, smallest)
      i = smallest
    }
  }
}
