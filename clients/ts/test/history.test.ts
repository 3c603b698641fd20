// A session's history (docs/protocol.md §7.24) through a real host: a client that comes back
// after the replay window moved on rebuilds the conversation from the `resynced` snapshot's
// history, the pages before it and the live events after it, and gets exactly what a client
// that watched it live got, each entry once (§8.4).

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  RacpError,
  isHistoryEntry,
  messagesOf,
  type Event,
  type HistoryPagesOptions,
  type RacpClient,
  type SessionHistoryResult,
  type Subscription,
  type SubscriptionItem,
} from "../src/index.js";
import { FaultProxy, HostProcess, connectClient, within } from "./harness.js";

const TEST_TIMEOUT = 180_000;

async function next(sub: Subscription): Promise<SubscriptionItem> {
  const result = await within(sub.next(), "a subscription item");
  assert.ok(!result.done, "subscription open");
  return result.value;
}

/**
 * Runs `call`, and again once reconnected while it fails in a way that may be resent (§6.3): on
 * a loaded machine a link can miss two heartbeats, and the client's contract is that the caller
 * resends.
 */
async function resending<T>(client: RacpClient, call: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      return await call();
    } catch (error) {
      if (!(error instanceof RacpError) || !error.mayResend) throw error;
      await within(client.waitConnected(), "the client to reconnect");
    }
  }
}

/** Every page back from `options.from`; when the link drops mid-way, on from the last page read. */
async function pagesBack(client: RacpClient, sessionId: string, options: HistoryPagesOptions): Promise<SessionHistoryResult[]> {
  const pages: SessionHistoryResult[] = [];
  return resending(client, async () => {
    const from = pages.at(-1) ?? options.from;
    for await (const page of client.historyPages(sessionId, { ...options, ...(from ? { from } : {}) })) pages.push(page);
    return pages;
  });
}

/**
 * A conversation as an application shows it: on `resynced`, replaced by the snapshot's history
 * and the pages before it; then extended by the live events the history keeps.
 */
class Conversation {
  entries: Event[] = [];
  resyncs = 0;
  /** Whether a snapshot's history said older entries exist (so paging back was needed). */
  pagedBack = false;

  constructor(
    private readonly client: RacpClient,
    private readonly sub: Subscription,
  ) {}

  /** Applies items until one satisfies `stop` (applied too). */
  async readUntil(stop: (item: SubscriptionItem) => boolean): Promise<void> {
    for (;;) {
      const item = await next(this.sub);
      if (item.kind === "resynced") {
        this.resyncs++;
        const history = item.snapshot.snapshot.history;
        assert.ok(history, "the snapshot carries its history");
        const entries = [...history.entries];
        if (history.earlier) this.pagedBack = true;
        // Small pages, so going back takes several of them.
        for (const page of await pagesBack(this.client, this.sub.sessionId, { from: item.snapshot, limit: 5 })) {
          assert.ok(page.entries.length > 0 && page.entries.length <= 5, `${page.entries.length} entries in a page`);
          entries.unshift(...page.entries);
        }
        this.entries = entries;
      } else if (item.kind === "event") {
        if (isHistoryEntry(item.event)) this.entries.push(item.event);
      } else {
        assert.fail(`unexpected ${JSON.stringify(item)}`);
      }
      if (stop(item)) return;
    }
  }

  /** Applies items until the turn `turnId` finished. */
  readTurn(turnId: string): Promise<void> {
    return this.readUntil((item) => item.kind === "event" && item.event.type === "turn.finished" && item.event.turnId === turnId);
  }
}

function assertIncreasing(entries: Event[]): void {
  for (let i = 1; i < entries.length; i++) assert.ok(entries[i]!.seq > entries[i - 1]!.seq, `seq ${entries[i]!.seq} after ${entries[i - 1]!.seq}`);
}

test("after the replay window moved on, the resynced snapshot's history, the pages before it and the live events are the live conversation, each entry once", { timeout: TEST_TIMEOUT }, async () => {
  // Each run is 48 events (a user message and six replies), under the 100 the host retains, and
  // the live client reads each run to its end before the next starts: it never falls out of the
  // window. Sixteen runs are 112 entries, more than a snapshot's 100, so the late clients page.
  const host = await HostProcess.start(["--retain-events", "100"]);
  const proxy = await FaultProxy.start(host.port);
  const clients: RacpClient[] = [];
  const connect = async (url?: string) => {
    const client = await connectClient(host, (await host.pairDevice(`device-${clients.length}`)).token, url);
    clients.push(client);
    return client;
  };
  try {
    const live = await connect();
    const { session } = await live.call("session/create", { workspace: host.workspace("w") });
    const sessionId = session.sessionId;
    const watched = new Conversation(live, await resending(live, () => live.subscribe(sessionId, { cursor: session.cursor })));
    // This one subscribes now, then its link is held until the runs are over and cut: it comes
    // back with a cursor the host no longer has (the client's resubscription resyncs).
    const away = await connect(proxy.url(host));
    const cut = new Conversation(away, await resending(away, () => away.subscribe(sessionId, { cursor: session.cursor })));
    proxy.stall(true);

    const RUNS = 16;
    for (let run = 0; run < RUNS; run++) {
      const text = "deltas:1 ".repeat(6).trim();
      const { turnId } = await resending(live, () => live.call("turn/start", { sessionId, idempotencyKey: `run-${run}`, text }));
      await watched.readTurn(turnId);
    }
    assert.equal(watched.resyncs, 0, "the live client stayed within the window");
    assert.equal(watched.entries.length, RUNS * 7);

    // This one subscribes from the session's start after the runs: CURSOR_EXPIRED, so
    // `subscribe()` resyncs.
    const late = await connect();
    const fresh = new Conversation(late, await resending(late, () => late.subscribe(sessionId, { cursor: session.cursor })));
    await fresh.readUntil((item) => item.kind === "resynced");
    proxy.stall(false);
    proxy.cut();
    await cut.readUntil((item) => item.kind === "resynced");

    // One more run, live for all three.
    const { turnId } = await resending(live, () => live.call("turn/start", { sessionId, idempotencyKey: "last", text: "deltas:2" }));
    await Promise.all([watched, fresh, cut].map((conversation) => conversation.readTurn(turnId)));

    assert.equal(watched.entries.length, RUNS * 7 + 2);
    assertIncreasing(watched.entries);
    for (const [name, conversation] of [["subscribed late", fresh], ["cut and resumed", cut]] as const) {
      assert.equal(conversation.resyncs, 1, name);
      assert.ok(conversation.pagedBack, `${name}: the snapshot's history had older entries`);
      // The same events: seq, cursor, type, at, turnId and data, as delivered live.
      assert.deepEqual(conversation.entries, watched.entries, name);
    }
    const messages = messagesOf(fresh.entries);
    assert.equal(messages.length, RUNS * 7 + 2);
    assert.deepEqual(
      messages.slice(0, 8).map((message) => message.role),
      ["user", "assistant", "assistant", "assistant", "assistant", "assistant", "assistant", "user"],
    );
  } finally {
    for (const client of clients) client.close();
    proxy.close();
    await host.stop();
  }
});

test("pages of one entry walk back through the whole history in order; the oldest has no earlier", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start();
  const clients: RacpClient[] = [];
  try {
    const client = await connectClient(host, (await host.pairDevice("laptop")).token);
    clients.push(client);
    const { session } = await client.call("session/create", { workspace: host.workspace("w") });
    const sessionId = session.sessionId;
    const watched = new Conversation(client, await resending(client, () => client.subscribe(sessionId, { cursor: session.cursor })));
    for (const text of ["deltas:3", "deltas:1 tool", "echo"]) {
      const { turnId } = await resending(client, () => client.call("turn/start", { sessionId, idempotencyKey: text, text }));
      await watched.readTurn(turnId);
    }
    const entries = watched.entries;
    assert.deepEqual(
      messagesOf(entries).map((message) => message.role),
      ["user", "assistant", "user", "assistant", "assistant", "toolResult", "assistant", "user", "assistant"],
    );

    const { cursor: head } = await resending(client, () => client.call("session/get", { sessionId }));
    const pages = await pagesBack(client, sessionId, { limit: 1 });
    assert.equal(pages.length, entries.length);
    assert.equal(pages[0]!.cursor, head, "the first page is read up to the head");
    for (const [i, page] of pages.entries()) {
      assert.equal(page.entries.length, 1);
      assert.deepEqual(page.entries[0], entries[entries.length - 1 - i]);
      if (i > 0) assert.equal(page.cursor, pages[i - 1]!.earlier, "each page is read up to the earlier of the one after it");
    }
    assert.ok(pages.slice(0, -1).every((page) => typeof page.earlier === "string"));
    assert.equal(pages.at(-1)!.earlier ?? undefined, undefined, "the oldest page has no earlier");
    assert.notEqual(pages.at(-1)!.truncated, true);

    // `upTo` is inclusive: a page up to an entry's cursor ends with that entry.
    const third = entries[2]!;
    const upToEntry = await resending(client, () => client.history(sessionId, { upTo: third.cursor, limit: 2 }));
    assert.deepEqual(upToEntry.entries, entries.slice(1, 3));
    assert.equal(upToEntry.cursor, third.cursor);
    const before = await resending(client, () => client.history(sessionId, { upTo: upToEntry.earlier! }));
    assert.deepEqual(before.entries, entries.slice(0, 1));
    assert.equal(before.earlier ?? undefined, undefined);
  } finally {
    for (const client of clients) client.close();
    await host.stop();
  }
});

test("an entry the snapshot cut to 16 KiB reads whole from session/history", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start();
  const clients: RacpClient[] = [];
  try {
    const client = await connectClient(host, (await host.pairDevice("laptop")).token);
    clients.push(client);
    const { session } = await client.call("session/create", { workspace: host.workspace("w") });
    const sessionId = session.sessionId;
    const watched = new Conversation(client, await resending(client, () => client.subscribe(sessionId, { cursor: session.cursor })));
    const { turnId } = await resending(client, () => client.call("turn/start", { sessionId, idempotencyKey: "big", text: "big:40000" }));
    await watched.readTurn(turnId);
    const reply = watched.entries.at(-1)!;
    assert.equal(reply.elided ?? undefined, undefined, "delivered live whole");

    const { snapshot } = await resending(client, () => client.call("session/get", { sessionId }));
    const cut = snapshot.history!.entries.at(-1)!;
    assert.equal(cut.seq, reply.seq);
    assert.ok(cut.elided && cut.elided.bytes > 16384, JSON.stringify(cut.elided));
    const whole = await resending(client, () => client.history(sessionId, { upTo: cut.cursor, limit: 1 }));
    assert.deepEqual(whole.entries, [reply]);
  } finally {
    for (const client of clients) client.close();
    await host.stop();
  }
});
