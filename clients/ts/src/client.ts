// The reconnecting client (docs/protocol.md §9.3). When the link drops (a close, an error, or
// two heartbeat intervals of silence) every call in flight fails with HOST_DISCONNECTED, the
// client reconnects with backoff and full jitter, says hello again, and resubscribes each
// subscription from the cursor of the last event it buffered, so a consumer sees each event
// once, in order. A cursor the host no longer has (CURSOR_EXPIRED) is recovered through
// `session/get` (§8.4). A refused credential stops the client: retrying cannot help.

import type {
  Cursor,
  Event as RacpEvent,
  HelloResult,
  RacpMethodName,
  RacpMethods,
  SessionEventsParams,
  SessionGetResult,
  SessionHistoryResult,
  SessionStreamResult,
  SessionSubscribeResult,
  Snapshot,
  SubscriptionEndedParams,
} from "../racp.js";
import { METHODS } from "../racp.js";
import { Backoff } from "./backoff.js";
import { Link, type CallOptions, type LinkEnd } from "./connection.js";
import { RacpError, hostDisconnected, isFatal } from "./errors.js";
import { pagesBack, type HistoryOptions, type HistoryPagesOptions } from "./history.js";
import { checkUrl, type Endpoint } from "./pairing.js";
import { Subscription, type SubscriptionControl } from "./subscription.js";
import { webSocketTransport, type Transport } from "./transport.js";

export const CLIENT_VERSION = "0.1.0";

/** A link up this long counts as healthy again: only then does the backoff start over. */
const STABLE_LINK_MS = 2000;
/** How often a resubscription retries a snapshot the window moved past (§8.4). */
const RESYNC_ATTEMPTS = 5;

export interface ClientOptions extends Endpoint {
  /** How the WebSocket is opened; the platform's WebSocket by default (browsers). */
  transport?: Transport;
  /** Send the token over plain `ws://` (loopback only), for a host run with `--plain`. */
  allowPlainWs?: boolean;
  clientName?: string;
  clientVersion?: string;
  /** How long a call waits for its reply before failing with TIMEOUT [30 s]. */
  callTimeoutMs?: number;
  /** How long opening a link and `hello` may take [10 s]. */
  connectTimeoutMs?: number;
  /** First reconnect ceiling; it doubles up to `maxBackoffMs` [250 ms, 30 s]. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Items a subscription buffers before its delivery is paused [1000]: when the consumer has
   * not caught up after its turn, or at twice this at once. The host is asked for pushes of at
   * most half of it, so a consumer that keeps up is never paused. */
  maxBufferedEvents?: number;
  /** The jitter source (tests). */
  random?: () => number;
}

export type ClientState =
  | { status: "connecting" }
  | { status: "connected"; hello: HelloResult }
  /** Stopped for good, with the reason (e.g. REMOTE_AUTH_FAILED: pair again). */
  | { status: "stopped"; error: RacpError };

type Params<M extends RacpMethodName> = RacpMethods[M]["params"];
type Result<M extends RacpMethodName> = RacpMethods[M]["result"];
/** Params may be left out for methods that take none. */
type CallArgs<M extends RacpMethodName> = {} extends Params<M>
  ? [params?: Params<M>, options?: CallOptions]
  : [params: Params<M>, options?: CallOptions];

export interface SubscribeOptions {
  /** Deliver every event after this cursor; without it, from now on. */
  cursor?: Cursor;
  /** Overrides the client's `maxBufferedEvents` for this subscription. */
  maxBufferedEvents?: number;
  /**
   * The `session/get` snapshot `cursor` came from: seeds `subscription.stream` with the message
   * and tool outputs streaming at that cursor (§7.11). Without it, a subscription from a cursor
   * asks the host what was streaming there (`session/stream`), so a reply in progress rebuilds
   * whole from a cursor the application kept itself.
   */
  snapshot?: Snapshot;
}

/** What the client tracks per subscription across links. */
interface Tracked {
  subscription: Subscription;
  /** The cursor after the last event buffered (or where the subscription started). */
  last: Cursor;
  /** The seq of the last event buffered in this epoch; unknown after a resync. */
  lastSeq: number | undefined;
  /** The host's id for it on the current link. */
  serverId: string | undefined;
  /** A check whether the consumer caught up is scheduled (see `onEvent`). */
  pauseCheck?: boolean;
}

/** How long a call waits for its reply: the client's call timeout, plus the method's own
 * deadline from the method table (`session/bash` is answered when its command ends). */
export function callTimeoutFor(method: RacpMethodName, callTimeoutMs: number): number {
  return callTimeoutMs + (METHODS[method].deadlineMs ?? 0);
}

export class RacpClient extends EventTarget implements SubscriptionControl {
  private current: ClientState = { status: "connecting" };
  private link: Link | undefined;
  private readonly subscriptions = new Set<Tracked>();
  private readonly backoff: Backoff;
  private closedByUser = false;
  private wakeFromBackoff: (() => void) | undefined;
  private readonly options: Required<Omit<ClientOptions, "certSha256" | "transport" | "random">> &
    Pick<ClientOptions, "certSha256">;
  private readonly transport: Transport;

  private constructor(options: ClientOptions) {
    super();
    this.options = {
      url: options.url,
      token: options.token,
      allowPlainWs: options.allowPlainWs ?? false,
      clientName: options.clientName ?? "racp-client-ts",
      clientVersion: options.clientVersion ?? CLIENT_VERSION,
      callTimeoutMs: options.callTimeoutMs ?? 30_000,
      connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
      minBackoffMs: options.minBackoffMs ?? 250,
      maxBackoffMs: options.maxBackoffMs ?? 30_000,
      maxBufferedEvents: options.maxBufferedEvents ?? 1000,
      ...(options.certSha256 ? { certSha256: options.certSha256.toLowerCase() } : {}),
    };
    this.transport = options.transport ?? webSocketTransport();
    this.backoff = new Backoff(this.options.minBackoffMs, this.options.maxBackoffMs, options.random);
  }

  /**
   * Starts a client and waits for its first link. An error then is thrown as is: the client
   * retries only after it has been connected once.
   */
  static async connect(options: ClientOptions): Promise<RacpClient> {
    checkUrl(options.url, { allowPlainWs: options.allowPlainWs ?? false, pinned: options.certSha256 !== undefined });
    const client = new RacpClient(options);
    const first = await client.openLink();
    if (first instanceof RacpError) {
      client.setState({ status: "stopped", error: first });
      throw first;
    }
    void client.run(first);
    return client;
  }

  get state(): ClientState {
    return this.current;
  }

  /** The last `hello` result (protocol, principal, capabilities, limits). */
  get hello(): HelloResult | undefined {
    return this.link?.hello;
  }

  /** Waits until the client is connected (again), or throws why it stopped. */
  waitConnected(): Promise<void> {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.current.status === "connecting") return false;
        this.removeEventListener("statechange", check);
        if (this.current.status === "connected") resolve();
        else reject(this.current.error);
        return true;
      };
      if (!check()) this.addEventListener("statechange", check);
    });
  }

  /** Calls a method; params and result are checked against the schema's types. */
  call<M extends RacpMethodName>(method: M, ...args: CallArgs<M>): Promise<Result<M>> {
    const [params, options] = args;
    if (this.current.status === "stopped") return Promise.reject(this.current.error.forMethod(method));
    const link = this.link;
    if (link === undefined || !link.open) {
      // While disconnected, calls fail at once: the caller decides whether to resend (§6.3).
      return Promise.reject(hostDisconnected("not connected", method));
    }
    return link.request(method, params ?? {}, {
      timeoutMs: options?.timeoutMs ?? callTimeoutFor(method, this.options.callTimeoutMs),
      ...(options?.signal ? { signal: options.signal } : {}),
    }) as Promise<Result<M>>;
  }

  /**
   * Subscribes to a session's events, from `cursor` (or from now). The subscription survives
   * reconnects; iterate it with `for await`. A cursor the host no longer holds is not an error:
   * the subscription's first item is then `resynced` with the session's snapshot, and events
   * follow from the snapshot's cursor (§8.4).
   */
  async subscribe(sessionId: string, options: SubscribeOptions = {}): Promise<Subscription> {
    if (this.current.status === "stopped") return Promise.reject(this.current.error.forMethod("session/subscribe"));
    const link = this.link;
    if (link === undefined || !link.open) return Promise.reject(hostDisconnected("not connected", "session/subscribe"));
    const highWater = options.maxBufferedEvents ?? this.options.maxBufferedEvents;
    const track = (cursor: Cursor, serverId: string | undefined): Tracked => {
      const tracked = {
        subscription: new Subscription(sessionId, cursor, highWater, this),
        last: cursor,
        lastSeq: undefined,
        serverId,
      };
      this.subscriptions.add(tracked);
      return tracked;
    };
    let seed: Pick<Snapshot, "streamingMessage" | "toolOutputs"> | undefined = options.snapshot;
    if (seed === undefined && options.cursor !== undefined) {
      // What was streaming at the cursor. An error here is not the subscription's: an expired
      // cursor is met again (and resynced) by the subscribe itself.
      seed = (await link
        .request("session/stream", { sessionId, cursor: options.cursor }, { timeoutMs: this.options.callTimeoutMs })
        .catch(() => undefined)) as SessionStreamResult | undefined;
    }
    let tracked: Tracked | undefined;
    try {
      // Registered as the reply is read: the first push may come in the same read.
      await link.request(
        "session/subscribe",
        options.cursor === undefined ? { sessionId } : { sessionId, cursor: options.cursor },
        { timeoutMs: this.options.callTimeoutMs },
        (result) => {
          const subscribed = result as SessionSubscribeResult;
          tracked = track(subscribed.cursor, subscribed.subscriptionId);
          if (seed !== undefined) tracked.subscription.resumeStream(seed);
        },
      );
    } catch (error) {
      if (!(error instanceof RacpError) || error.code !== "CURSOR_EXPIRED") throw error;
      const snapshot = (await link.request(
        "session/get",
        { sessionId },
        { timeoutMs: this.options.callTimeoutMs },
      )) as SessionGetResult;
      tracked = track(snapshot.cursor, undefined);
      tracked.subscription.deliver({ kind: "resynced", snapshot });
      if (link.open) void this.resubscribe(link, tracked);
    }
    if (tracked === undefined) throw hostDisconnected("the link closed before the subscription started", "session/subscribe");
    return tracked.subscription;
  }

  /**
   * One page of a session's history (§7.24): the entries up to `upTo` (the head when absent),
   * oldest first, and `earlier` when older ones exist. Each entry is the `agent.message_end` or
   * `agent.compaction_end` event exactly as it was delivered live; `messagesOf` reads pi's
   * messages out of them.
   */
  history(sessionId: string, options: HistoryOptions = {}): Promise<SessionHistoryResult> {
    const { upTo, limit, maxBytes, ...callOptions } = options;
    return this.call("session/history", { sessionId, upTo, limit, maxBytes }, callOptions);
  }

  /**
   * Pages back through a session's history, newest page first, until a page has no `earlier`.
   * From a `session/get` result (a `resynced` item's `snapshot`), it reads what is older than
   * `snapshot.history`: that history, these pages and a subscription from the snapshot's cursor
   * hold every entry once (§8.4). Read pages as the user scrolls back; a call that fails (the
   * link dropped) ends the iteration with its error, and `from` the last page continues it.
   */
  historyPages(sessionId: string, options: HistoryPagesOptions = {}): AsyncGenerator<SessionHistoryResult, void, undefined> {
    return pagesBack((params, callOptions) => this.call("session/history", params, callOptions), sessionId, options);
  }

  /** Stops the client: the link closes, subscriptions end, calls fail. */
  close(): void {
    if (this.closedByUser) return;
    this.closedByUser = true;
    this.link?.close("the client was closed");
    this.wakeFromBackoff?.();
    this.stop(new RacpError({ code: "HOST_DISCONNECTED", message: "the client was closed", retriable: false }));
  }

  // SubscriptionControl: the consumer's pace.

  /** The consumer caught up with a paused subscription: resume it from its cursor. */
  drained(subscription: Subscription): void {
    const tracked = this.find(subscription);
    if (tracked === undefined || !subscription.paused) return;
    subscription.paused = false;
    if (this.link?.open) void this.resubscribe(this.link, tracked);
  }

  closed(subscription: Subscription): void {
    const tracked = this.find(subscription);
    if (tracked === undefined) return;
    this.subscriptions.delete(tracked);
    if (tracked.serverId !== undefined) this.link?.notify("session/unsubscribe", { subscriptionId: tracked.serverId });
  }

  private find(subscription: Subscription): Tracked | undefined {
    for (const tracked of this.subscriptions) if (tracked.subscription === subscription) return tracked;
    return undefined;
  }

  private setState(state: ClientState): void {
    if (state.status === "connecting" && this.current.status === "connecting") return;
    this.current = state;
    this.dispatchEvent(new Event("statechange"));
  }

  private stop(error: RacpError): void {
    if (this.current.status === "stopped") return;
    this.setState({ status: "stopped", error });
    for (const tracked of this.subscriptions) tracked.subscription.deliver({ kind: "failed", error });
    this.subscriptions.clear();
  }

  /** Opens a link and resubscribes; the error when it could not. */
  private async openLink(): Promise<Link | RacpError> {
    this.setState({ status: "connecting" });
    try {
      const link = await Link.open(
        {
          transport: this.transport,
          url: this.options.url,
          token: this.options.token,
          ...(this.options.certSha256 ? { certSha256: this.options.certSha256 } : {}),
          clientName: this.options.clientName,
          clientVersion: this.options.clientVersion,
          connectTimeoutMs: this.options.connectTimeoutMs,
          maxEventsPerPush: Math.max(1, Math.floor(this.options.maxBufferedEvents / 2)),
        },
        (method, params) => this.onPush(method, params),
      );
      if (this.closedByUser) {
        link.close();
        return hostDisconnected("the client was closed");
      }
      this.link = link;
      for (const tracked of this.subscriptions) {
        tracked.serverId = undefined;
        if (!tracked.subscription.paused) void this.resubscribe(link, tracked);
      }
      this.setState({ status: "connected", hello: link.hello });
      return link;
    } catch (error) {
      return error instanceof RacpError ? error : hostDisconnected(String(error));
    }
  }

  /** Serves links until the client stops. */
  private async run(first: Link): Promise<void> {
    let link: Link | undefined = first;
    for (;;) {
      let end: LinkEnd;
      if (link !== undefined) {
        const started = Date.now();
        end = await link.ended;
        this.link = undefined;
        // Only a link that lived a while resets the backoff: one that dies at once (a host that
        // keeps refusing something) must not make the client spin.
        if (Date.now() - started >= STABLE_LINK_MS) this.backoff.reset();
      } else {
        const opened = await this.openLink();
        if (opened instanceof Link) {
          link = opened;
          continue;
        }
        end = { reason: opened.message, error: opened };
      }
      link = undefined;
      if (this.closedByUser) return;
      if (end.error && isFatal(end.error.code)) {
        this.stop(end.error);
        return;
      }
      this.setState({ status: "connecting" });
      await this.sleep(this.backoff.nextDelay(end.error?.retryAfterMs ?? 0));
      if (this.closedByUser) return;
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(wake, ms);
      function wake() {
        clearTimeout(timer);
        resolve();
      }
      this.wakeFromBackoff = wake;
    });
  }

  /** Subscribes again from the last buffered cursor; CURSOR_EXPIRED becomes a resync (§8.4). */
  private async resubscribe(link: Link, tracked: Tracked): Promise<void> {
    const { subscription } = tracked;
    for (let attempt = 0; attempt < RESYNC_ATTEMPTS; attempt++) {
      try {
        // Registered as the reply is read: the first replayed push may come in the same read.
        await link.request(
          "session/subscribe",
          { sessionId: subscription.sessionId, cursor: tracked.last },
          {},
          (result) => {
            const { subscriptionId } = result as SessionSubscribeResult;
            if (!this.subscriptions.has(tracked) || this.link !== link || subscription.paused) {
              link.notify("session/unsubscribe", { subscriptionId });
            } else {
              tracked.serverId = subscriptionId;
            }
          },
        );
        return;
      } catch (error) {
        if (!(error instanceof RacpError) || error.code === "HOST_DISCONNECTED") return; // the next link redoes it
        if (error.code !== "CURSOR_EXPIRED") return this.fail(tracked, error);
      }
      let snapshot: SessionGetResult;
      try {
        snapshot = (await link.request("session/get", { sessionId: subscription.sessionId })) as SessionGetResult;
      } catch (error) {
        if (!(error instanceof RacpError) || error.code === "HOST_DISCONNECTED") return;
        return this.fail(tracked, error);
      }
      if (!this.subscriptions.has(tracked)) return;
      tracked.last = snapshot.cursor;
      tracked.lastSeq = undefined;
      subscription.deliver({ kind: "resynced", snapshot });
    }
    this.fail(
      tracked,
      new RacpError({ code: "CURSOR_EXPIRED", message: "the retained window kept moving past every snapshot" }),
    );
  }

  private fail(tracked: Tracked, error: RacpError): void {
    this.subscriptions.delete(tracked);
    tracked.subscription.deliver({ kind: "failed", error });
  }

  private onPush(method: string, params: unknown): void {
    if (method === "session/events") {
      const push = params as SessionEventsParams;
      const tracked = this.byServerId(push.subscriptionId);
      if (tracked !== undefined) for (const event of push.events) this.onEvent(tracked, event);
    } else if (method === "subscription/ended") {
      const push = params as SubscriptionEndedParams;
      const tracked = this.byServerId(push.subscriptionId);
      if (tracked === undefined) return;
      this.subscriptions.delete(tracked);
      tracked.subscription.deliver({ kind: "ended" });
    }
  }

  private onEvent(tracked: Tracked, event: RacpEvent): void {
    // After a reconnect the host replays from our cursor; never repeat an event.
    if (tracked.lastSeq !== undefined && event.seq <= tracked.lastSeq) return;
    // Paused: this event is after the last buffered cursor, so the resumed subscription replays it.
    if (tracked.subscription.paused) return;
    tracked.last = event.cursor;
    tracked.lastSeq = event.seq;
    const { subscription } = tracked;
    subscription.deliver({ kind: "event", event });
    if (!subscription.full) return;
    // Several pushes can arrive in one read and are dispatched before the consumer runs, so a
    // full buffer right now says nothing about its pace: pause only if it is still full once
    // the consumer had its turn, or at once at twice the bound (the hard limit on memory).
    if (subscription.buffered >= 2 * subscription.highWater) return this.pause(tracked);
    if (tracked.pauseCheck) return;
    tracked.pauseCheck = true;
    setTimeout(() => {
      tracked.pauseCheck = false;
      if (subscription.full && !subscription.paused && this.subscriptions.has(tracked)) this.pause(tracked);
    }, 0);
  }

  /** The consumer fell behind: stop the host's flow for this subscription until it catches up. */
  private pause(tracked: Tracked): void {
    tracked.subscription.paused = true;
    if (tracked.serverId !== undefined) this.link?.notify("session/unsubscribe", { subscriptionId: tracked.serverId });
    tracked.serverId = undefined;
  }

  private byServerId(serverId: string): Tracked | undefined {
    for (const tracked of this.subscriptions) if (tracked.serverId === serverId) return tracked;
    return undefined;
  }
}
