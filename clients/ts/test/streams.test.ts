// Compact streams (docs/protocol.md §8.1) through a real host with the stand-in agent, which
// writes pi's own shapes (each `message_update` with the whole message so far, each tool update
// with the whole output so far): `subscription.stream` rebuilds exactly what pi held, across a
// cut and from a snapshot, as the Rust client does in pi-host/tests/streams.rs.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { RacpClient, singleText, type Event, type JsonValue, type Subscription, type SubscriptionItem } from "../src/index.js";
import { FaultProxy, HostProcess, assertContiguous, connectClient, within } from "./harness.js";

const TEST_TIMEOUT = 60_000;

// One host for the file: the three turns run in sessions of their own.
let host: HostProcess;
let token: string;
before(async () => {
  host = await HostProcess.start();
  token = (await host.pairDevice("laptop")).token;
});
after(async () => {
  await host.stop();
});

async function nextEvent(sub: Subscription): Promise<Event> {
  const result = await within(sub.next(), "a subscription item");
  assert.ok(!result.done, "subscription open");
  const item: SubscriptionItem = result.value;
  if (item.kind !== "event") assert.fail(`expected an event, got ${JSON.stringify(item)}`);
  return item.event;
}

async function startTurn(client: RacpClient, text: string): Promise<{ sessionId: string; sub: Subscription }> {
  const { session } = await client.call("session/create", { workspace: host.workspace("w") });
  const sub = await client.subscribe(session.sessionId, { cursor: session.cursor });
  await client.call("turn/start", { sessionId: session.sessionId, idempotencyKey: text, text });
  return { sessionId: session.sessionId, sub };
}

function field(value: unknown, name: string): unknown {
  return typeof value === "object" && value !== null ? (value as Record<string, unknown>)[name] : undefined;
}

/** The assistant message an `agent.message_end` carries (pi's own, whole copy). */
function assistantEnd(event: Event): JsonValue | undefined {
  if (event.type !== "agent.message_end") return undefined;
  const message = field(event.data, "message");
  return field(message, "role") === "assistant" ? (message as JsonValue) : undefined;
}

function textOf(message: unknown): string {
  const content = field(message, "content");
  assert.ok(Array.isArray(content));
  return content.map((block) => field(block, "text")).filter((text) => typeof text === "string").join("");
}

function chunks(from: number, to: number): string {
  let text = "";
  for (let i = from; i < to; i++) text += `chunk${i} `;
  return text;
}

test("a long reply cut mid-message rebuilds exactly, nothing lost or repeated", { timeout: TEST_TIMEOUT }, async () => {
  const proxy = await FaultProxy.start(host.port);
  const client = await connectClient(host, token, proxy.url(host));
  try {
    let reconnects = 0;
    client.addEventListener("statechange", () => client.state.status === "connecting" && reconnects++);
    const { sub } = await startTurn(client, "deltas:1000:1");
    const seqs: number[] = [];
    let deltas = 0;
    let cut = false;
    let messageEnd: JsonValue | undefined;
    while (messageEnd === undefined) {
      const event = await nextEvent(sub);
      seqs.push(event.seq);
      if (event.type === "agent.message_update") {
        const step = field(event.data, "assistantMessageEvent");
        if (field(step, "type") === "text_delta") deltas++;
        // Only `start` keeps pi's `partial` (the skeleton); every other step is compact.
        if (field(step, "type") !== "start") assert.equal(field(step, "partial"), undefined, "a compact step");
        if (!cut && seqs.length > 300) {
          // Mid-message: the client resumes by cursor and keeps rebuilding.
          proxy.cut();
          cut = true;
        }
      }
      messageEnd = assistantEnd(event);
    }
    assert.ok(cut && reconnects >= 1, "the link was cut and resumed");
    assertContiguous(seqs);
    assert.equal(deltas, 1000);
    assert.deepEqual(sub.stream.finishedMessage(), messageEnd, "the message rebuilt from compact updates is pi's message_end");
    assert.equal(textOf(messageEnd), chunks(0, 1000));
    assert.equal(sub.stream.message(), undefined);
  } finally {
    client.close();
    proxy.close();
  }
});

test("tool output streams as appends and rebuilds pi's last window", { timeout: TEST_TIMEOUT }, async () => {
  const client = await connectClient(host, token);
  try {
    const { sub } = await startTurn(client, "output:1000000");
    let updates = 0;
    let lastWindow: string | undefined;
    let result: unknown;
    while (result === undefined) {
      const event = await nextEvent(sub);
      if (event.type === "agent.tool_execution_update") {
        updates++;
        assert.equal(field(event.data, "args"), undefined);
        assert.equal(field(event.data, "partialResult"), undefined, "an append");
        assert.equal(typeof field(field(event.data, "outputUpdate"), "append"), "string");
        const id = field(event.data, "toolCallId");
        assert.equal(typeof id, "string");
        lastWindow = singleText(sub.stream.toolOutput(id as string));
        // pi's window: its last 2000 lines or 50 KiB.
        assert.ok(lastWindow !== undefined && lastWindow.length <= 50 * 1024 && lastWindow.endsWith("\n"));
      }
      if (event.type === "agent.tool_execution_end") {
        result = field(event.data, "result");
        assert.equal(sub.stream.toolOutputs().size, 0, "the end ends the output");
      }
    }
    assert.ok(updates > 200, `${updates} updates`);
    const finalText = singleText(result);
    assert.equal(finalText?.split("\n").length, (50 * 1024) / 64 + 1);
    assert.equal(lastWindow, finalText, "the last rebuilt window is the tool's result");
  } finally {
    client.close();
  }
});

test("a snapshot mid-message seeds a subscription from its cursor", { timeout: TEST_TIMEOUT }, async () => {
  const client = await connectClient(host, token);
  try {
    const { sessionId, sub: first } = await startTurn(client, "deltas:400:3");
    let updates = 0;
    while (updates < 50) if ((await nextEvent(first)).type === "agent.message_update") updates++;
    first.close();
    const got = await client.call("session/get", { sessionId });
    const partial = got.snapshot.streamingMessage;
    assert.ok(partial !== undefined && partial !== null, "a message in progress");
    assert.ok(textOf(partial).startsWith(chunks(0, 2)), JSON.stringify(partial));
    const late = await client.subscribe(sessionId, { cursor: got.cursor, snapshot: got.snapshot });
    assert.deepEqual(late.stream.message(), partial);
    let messageEnd: JsonValue | undefined;
    while (messageEnd === undefined) messageEnd = assistantEnd(await nextEvent(late));
    assert.deepEqual(late.stream.finishedMessage(), messageEnd);
    assert.equal(textOf(messageEnd), chunks(0, 400));
    // After the turn, nothing streams.
    while ((await nextEvent(late)).type !== "turn.finished");
    assert.equal(late.stream.message(), undefined);
    const after = await client.call("session/get", { sessionId });
    assert.equal(after.snapshot.streamingMessage ?? undefined, undefined);
    assert.deepEqual(after.snapshot.toolOutputs ?? {}, {});
  } finally {
    client.close();
  }
});

test("a subscription from the application's own cursor mid-message rebuilds the reply in progress", { timeout: TEST_TIMEOUT }, async () => {
  const client = await connectClient(host, token);
  try {
    const { sessionId, sub: first } = await startTurn(client, "deltas:300:3");
    // The cursor a renderer stored before the page reloaded, in the middle of the reply.
    let updates = 0;
    let stored: Event | undefined;
    while (updates < 40) {
      const event = await nextEvent(first);
      if (event.type === "agent.message_update") {
        updates++;
        stored = event;
      }
    }
    const expected = first.stream.message();
    first.close();
    assert.ok(stored !== undefined && expected !== undefined);
    // A new subscription from that cursor, no snapshot: the client asks what was streaming there.
    const reloaded = await client.subscribe(sessionId, { cursor: stored.cursor });
    assert.deepEqual(reloaded.stream.message(), expected);
    let messageEnd: JsonValue | undefined;
    while (messageEnd === undefined) messageEnd = assistantEnd(await nextEvent(reloaded));
    assert.deepEqual(reloaded.stream.finishedMessage(), messageEnd);
    assert.equal(textOf(messageEnd), chunks(0, 300));
  } finally {
    client.close();
  }
});
