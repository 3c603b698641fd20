// A subscription's items as an async iterator with a bounded buffer. A consumer that stops
// reading does not make the buffer grow: at the bound the client pauses the subscription on the
// host and resumes it from the last buffered cursor once the consumer has caught up (client.ts).
// Each item is applied to the subscription's `stream` as the consumer takes it, so `stream`
// always describes the point the consumer has reached (docs/protocol.md §8.1, "Compact streams").

import type { Cursor, Event, RacpEventData, SessionGetResult, Snapshot } from "../racp.js";
import type { RacpError } from "./errors.js";
import { StreamState } from "./stream.js";

/** What a subscription yields, in order. */
export type SubscriptionItem =
  | { kind: "event"; event: Event }
  /** The host no longer had the events after the last cursor: here is the session's
   * `session/get` result, whole; events continue right after its cursor (§8.4). Replace the view
   * of the session with it: its state, approvals, streams, and the conversation from
   * `snapshot.history` (the most recent entries; `client.historyPages(id, {from: snapshot})`
   * reads the older ones). */
  | { kind: "resynced"; snapshot: SessionGetResult }
  /** The host ended the subscription (the session was closed). Last item. */
  | { kind: "ended" }
  /** The subscription cannot continue (e.g. the credential was revoked). Last item. */
  | { kind: "failed"; error: RacpError };

/** The event's `data`, typed, when it has this type. */
export function eventData<T extends keyof RacpEventData>(event: Event, type: T): RacpEventData[T] | undefined {
  return event.type === type ? (event.data as RacpEventData[T]) : undefined;
}

/** How the client hears about the consumer's pace. */
export interface SubscriptionControl {
  /** The consumer took items and the buffer is at or below the low-water mark. */
  drained(subscription: Subscription): void;
  /** The consumer is done with the subscription. */
  closed(subscription: Subscription): void;
}

export class Subscription implements AsyncIterableIterator<SubscriptionItem> {
  private readonly items: SubscriptionItem[] = [];
  private readonly readers: Array<(result: IteratorResult<SubscriptionItem>) => void> = [];
  private finished = false;
  /** Set by the client while the host is told to hold this subscription's events. */
  paused = false;
  /**
   * The assistant message and tool outputs streaming as of the last item the consumer took,
   * rebuilt from the compact events (§8.1). The same object for the subscription's life.
   */
  readonly stream = new StreamState();

  constructor(
    readonly sessionId: string,
    /** Where delivery started. */
    readonly cursor: Cursor,
    /** Items buffered before the client pauses delivery. */
    readonly highWater: number,
    private readonly control: SubscriptionControl,
  ) {}

  /** Items waiting for the consumer. */
  get buffered(): number {
    return this.items.length;
  }

  get done(): boolean {
    return this.finished;
  }

  /** Whether the buffer is at its bound (the client then pauses delivery). */
  get full(): boolean {
    return this.items.length >= this.highWater;
  }

  /**
   * Seeds `stream` from the `session/get` snapshot whose cursor this subscription started from
   * (§7.11): a message already streaming then rebuilds whole. Call it before taking an item.
   */
  resumeStream(snapshot: Pick<Snapshot, "streamingMessage" | "toolOutputs">): void {
    this.stream.resume(snapshot);
  }

  /** Adds an item for the consumer (client side). */
  deliver(item: SubscriptionItem): void {
    if (this.finished) return;
    if (item.kind === "ended" || item.kind === "failed") this.finished = true;
    const reader = this.readers.shift();
    if (reader) reader({ value: this.take(item), done: false });
    else this.items.push(item);
    if (this.finished) for (const waiting of this.readers.splice(0)) waiting({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<SubscriptionItem>> {
    const item = this.items.shift();
    if (item !== undefined) {
      if (this.paused && this.items.length <= this.highWater / 2) this.control.drained(this);
      return Promise.resolve({ value: this.take(item), done: false });
    }
    if (this.finished) return Promise.resolve({ value: undefined, done: true });
    if (this.paused) this.control.drained(this);
    return new Promise((resolve) => this.readers.push(resolve));
  }

  /** Hands an item to the consumer, applying it to `stream` first (as the Rust client's `Subscription::next`). */
  private take(item: SubscriptionItem): SubscriptionItem {
    if (item.kind === "event") {
      // A finished turn ends whatever it was streaming (§8.1, rule 8).
      if (item.event.type === ("turn.finished" satisfies keyof RacpEventData)) this.stream.clear();
      else this.stream.apply(item.event.type, item.event.data);
    } else if (item.kind === "resynced") {
      // Events continue after the snapshot's cursor: it holds the streams up to there (§8.4).
      this.stream.resume(item.snapshot.snapshot);
    }
    return item;
  }

  /** Stops the subscription (also what `break` in `for await` does). */
  return(): Promise<IteratorResult<SubscriptionItem>> {
    this.close();
    return Promise.resolve({ value: undefined, done: true });
  }

  close(): void {
    if (this.finished && this.items.length === 0) return;
    this.finished = true;
    this.items.length = 0;
    for (const waiting of this.readers.splice(0)) waiting({ value: undefined, done: true });
    this.control.closed(this);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
