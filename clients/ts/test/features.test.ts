// What a local pi session does, from the TypeScript client through a real host (with the
// stand-in agent, docs/protocol.md §6.4): images with a prompt, a follow-up (run, and queued then
// withdrawn), a shell command,
// the session's totals, its slash commands, its export, a new title and a clone, each a typed
// call of the generated method table.

import assert from "node:assert/strict";
import { test } from "node:test";
import { type Event, type RacpClient, type Subscription } from "../src/index.js";
import { HostProcess, connectClient, within } from "./harness.js";

const TEST_TIMEOUT = 180_000;
/** A 1×1 PNG. */
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/** Events of `sub` up to the one `stop` accepts. */
async function eventsUntil(sub: Subscription, stop: (event: Event) => boolean): Promise<Event[]> {
  const events: Event[] = [];
  for (;;) {
    const result = await within(sub.next(), "an event");
    assert.ok(!result.done, "subscription open");
    const item = result.value;
    assert.equal(item.kind, "event", JSON.stringify(item));
    if (item.kind !== "event") continue;
    events.push(item.event);
    if (stop(item.event)) return events;
  }
}

const finished = (turnId: string) => (event: Event) => event.type === "turn.finished" && event.turnId === turnId;

test("a remote session offers what a local pi session does, each a typed call", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start();
  let client: RacpClient | undefined;
  try {
    client = await connectClient(host, (await host.pairDevice("desk")).token);
    const info = await client.call("host/info", {});
    for (const feature of ["attachments", "history", "followUps", "compaction", "shell", "stats", "commands", "export", "branches"]) {
      assert.ok(info.capabilities.includes(feature), `${feature} in ${info.capabilities.join(", ")}`);
    }
    const { session } = await client.call("session/create", { workspace: host.workspace("w") });
    const sessionId = session.sessionId;
    const sub = await client.subscribe(sessionId, { cursor: session.cursor });

    // A prompt with an image: turn.started names it, without its bytes.
    const withImage = await client.call("turn/start", {
      sessionId,
      idempotencyKey: "k1",
      text: "deltas:2",
      images: [{ mimeType: "image/png", data: PNG }],
    });
    const first = await eventsUntil(sub, finished(withImage.turnId));
    const started = first.find((e) => e.type === "turn.started");
    assert.deepEqual((started?.data as { images?: unknown }).images, [{ mimeType: "image/png", bytes: 70 }]);

    // A follow-up with no turn running is a turn at once.
    const followUp = await client.call("turn/follow_up", { sessionId, idempotencyKey: "k2", text: "deltas:1" });
    assert.equal(followUp.queued, false);
    await eventsUntil(sub, finished(followUp.turnId));

    // A shell command: its output, its event, and the session's totals count it.
    const ran = await client.call("session/bash", { sessionId, command: "git status" });
    assert.equal(ran.output, "stand-in ran: git status\n");
    const [bash] = (await eventsUntil(sub, (e) => e.type === "session.bash")).slice(-1);
    assert.equal((bash?.data as { command: string }).command, "git status");
    const stats = await client.call("session/stats", { sessionId });
    assert.equal(stats.shellCommands, 1);
    assert.equal(stats.userMessages, 2);

    const { commands } = await client.call("session/commands", { sessionId });
    assert.ok(commands.some((c) => c.name === "stand-in-template" && c.source === "prompt"), JSON.stringify(commands));
    const exported = await client.call("session/export", { sessionId });
    assert.ok(exported.html.startsWith("<!DOCTYPE html>") && exported.bytes === exported.html.length, exported.html);

    // Behind a running turn a follow-up waits in the host's queue; clearing it gives its text back.
    const hanging = await client.call("turn/start", { sessionId, idempotencyKey: "k-hang", text: "hang" });
    const queued = await client.call("turn/follow_up", { sessionId, idempotencyKey: "k3", text: "deltas:1" });
    assert.equal(queued.queued, true);
    const { snapshot } = await client.call("session/get", { sessionId });
    assert.deepEqual(snapshot.queue?.followUps?.map((f) => [f.turnId, f.text]), [[queued.turnId, "deltas:1"]]);
    const cleared = await client.call("session/clear_queue", { sessionId });
    assert.deepEqual(cleared.withdrawn.map((f) => [f.turnId, f.text]), [[queued.turnId, "deltas:1"]]);
    const [withdrawn] = (await eventsUntil(sub, (e) => e.type === "turn.withdrawn")).slice(-1);
    assert.equal(withdrawn?.turnId, queued.turnId);
    assert.equal((withdrawn?.data as { reason: string }).reason, "cleared");
    await client.call("turn/abort", { sessionId, turnId: hanging.turnId });
    await eventsUntil(sub, finished(hanging.turnId));

    const renamed = await client.call("session/rename", { sessionId, title: "login fix" });
    assert.equal(renamed.session.title, "login fix");

    // A clone holds the whole conversation as its own history.
    const source = await client.call("session/history", { sessionId });
    const cloned = await client.call("session/clone", { sessionId });
    assert.notEqual(cloned.session.sessionId, sessionId);
    const copy = await client.call("session/history", { sessionId: cloned.session.sessionId });
    assert.deepEqual(
      copy.entries.map((e) => [e.type, e.data]),
      source.entries.map((e) => [e.type, e.data]),
    );
    assert.ok(copy.entries.length >= 5, `${copy.entries.length} entries`);
  } finally {
    client?.close();
    await host.stop();
  }
});
