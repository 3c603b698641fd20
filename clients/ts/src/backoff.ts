// Reconnect delays: exponential with full jitter (docs/protocol.md §9.3), so many clients that
// lost the same host do not come back in step.

export class Backoff {
  private ceiling: number;

  constructor(
    private readonly minMs: number,
    private readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {
    this.ceiling = minMs;
  }

  /** The next wait: uniform in [0, ceiling), then the ceiling doubles up to the maximum. */
  nextDelay(atLeastMs = 0): number {
    const delay = this.random() * this.ceiling;
    this.ceiling = Math.min(this.ceiling * 2, this.maxMs);
    return Math.max(delay, atLeastMs);
  }

  /** Back to the shortest delay, after a link that stayed up. */
  reset(): void {
    this.ceiling = this.minMs;
  }

  /** The current ceiling (for tests and diagnostics). */
  get currentCeilingMs(): number {
    return this.ceiling;
  }
}
