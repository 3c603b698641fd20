// The client against a real host through the faults the Rust client is tested with
// (pi-host/tests/client.rs): cut, stall, delay, host restart, CURSOR_EXPIRED, CLIENT_TOO_SLOW,
// revoke. Each event is delivered exactly once, in order.

import assert from "node:assert/strict";
import { createServer as createTlsServer } from "node:tls";
import { createServer as createNetServer } from "node:net";
import { test } from "node:test";
import WebSocket from "ws";
import { RacpClient, RacpError, type Subscription, type SubscriptionItem } from "../src/index.js";
import {
  FaultProxy,
  HostProcess,
  assertContiguous,
  connectClient,
  cursorSeq,
  eventually,
  transport,
  within,
} from "./harness.js";

const TEST_TIMEOUT = 120_000;

async function next(sub: Subscription): Promise<SubscriptionItem> {
  const result = await within(sub.next(), "a subscription item");
  assert.ok(!result.done, "subscription open");
  return result.value;
}

/** Reads items until `turn.finished`, collecting seqs; a resync restarts them at its cursor. */
async function readTurn(sub: Subscription, seqs: number[]): Promise<boolean> {
  let resynced = false;
  for (;;) {
    const item = await next(sub);
    if (item.kind === "event") {
      seqs.push(item.event.seq);
      if (item.event.type === "turn.finished") return resynced;
    } else if (item.kind === "resynced") {
      resynced = true;
      seqs.length = 0;
      seqs.push(cursorSeq(item.snapshot.cursor));
    } else {
      assert.fail(`unexpected ${JSON.stringify(item)}`);
    }
  }
}

async function sessionAndSubscription(client: RacpClient, host: HostProcess): Promise<{ sessionId: string; sub: Subscription }> {
  const { session } = await client.call("session/create", { workspace: host.workspace("w") });
  const sub = await client.subscribe(session.sessionId, { cursor: session.cursor });
  return { sessionId: session.sessionId, sub };
}

function turn(sessionId: string, key: string, text: string) {
  return { sessionId, idempotencyKey: key, text };
}

async function waitIdle(client: RacpClient, sessionId: string): Promise<void> {
  await eventually("the session to be idle", async () => {
    const got = await client.call("session/get", { sessionId });
    return got.snapshot.state === "idle" || undefined;
  });
}

/** A host, a device, a proxy in front, and cleanup. */
async function setup(extra: string[] = []) {
  const host = await HostProcess.start(extra);
  const device = await host.pairDevice("laptop");
  const proxy = await FaultProxy.start(host.port);
  const clients: RacpClient[] = [];
  const connect = async (url = proxy.url(host), token = device.token) => {
    const client = await connectClient(host, token, url);
    clients.push(client);
    return client;
  };
  const done = async () => {
    for (const client of clients) client.close();
    proxy.close();
    await host.stop();
  };
  return { host, device, proxy, connect, done };
}

test("a cut link is resumed with every event once", { timeout: TEST_TIMEOUT }, async () => {
  const { host, proxy, connect, done } = await setup();
  try {
    const client = await connect();
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    await client.call("turn/start", turn(sessionId, "k", "deltas:400:2"));
    const seqs: number[] = [];
    while (seqs.length < 50) {
      const item = await next(sub);
      if (item.kind === "event") seqs.push(item.event.seq);
    }
    proxy.cut();
    await readTurn(sub, seqs);
    assert.equal(seqs[0], 1);
    assertContiguous(seqs);
    assert.ok(seqs.length > 400, `${seqs.length} events`);
  } finally {
    await done();
  }
});

test("through a hop that batches frames, a subscribe's replay is delivered whole, every time", { timeout: TEST_TIMEOUT }, async () => {
  // Plain, so the proxy's one write is one read of several WebSocket frames, as behind a
  // TLS-terminating balancer that batches (TLS records the proxy cannot merge would not show it).
  const { host, proxy, connect, done } = await setup(["--plain"]);
  try {
    const direct = await connect(host.url);
    const { session } = await direct.call("session/create", { workspace: host.workspace("w") });
    await direct.call("turn/start", turn(session.sessionId, "k", "deltas:3"));
    await waitIdle(direct, session.sessionId);
    // The subscribe's reply and the replay's first push reach the client in one read.
    proxy.batch(5);
    const client = await connect();
    for (let trial = 0; trial < 20; trial++) {
      const sub = await client.subscribe(session.sessionId, { cursor: session.cursor });
      const seqs: number[] = [];
      await readTurn(sub, seqs);
      assert.equal(seqs[0], 1, `trial ${trial}`);
      assertContiguous(seqs);
      sub.close();
    }
  } finally {
    await done();
  }
});

test("a ws client that closes with 1000 sees 1000: the host answers its close frame", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start(["--plain"]);
  try {
    const device = await host.pairDevice("laptop");
    const code = await new Promise<number>((resolve, reject) => {
      const socket = new WebSocket(host.url, ["racp.v1"], { headers: { authorization: `Bearer ${device.token}` } });
      socket.on("open", () =>
        socket.send(JSON.stringify({ id: 1, method: "hello", params: { protocol: { min: 1, max: 1 }, client: { name: "t", version: "0" } } })),
      );
      socket.on("message", () => socket.close(1000, "done"));
      socket.on("close", (closeCode) => resolve(closeCode));
      socket.on("error", reject);
    });
    assert.equal(code, 1000);
  } finally {
    await host.stop();
  }
});

test("a device paired over plain ws:// connects again with no second opt-in", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start(["--plain"]);
  try {
    const device = await host.pairDevice("laptop");
    assert.equal(device.allowPlainWs, true);
    assert.equal(device.certSha256, undefined);
    const client = await RacpClient.connect({ ...device, transport });
    try {
      const list = await client.call("session/list");
      assert.ok(Array.isArray(list.sessions));
    } finally {
      client.close();
    }
  } finally {
    await host.stop();
  }
});

test("a consumer that keeps up is never paused: pushes are at most half its buffer", { timeout: TEST_TIMEOUT }, async () => {
  const { host, connect, done } = await setup();
  try {
    // The default buffer (1 000 items) asks for pushes of at most 500.
    const client = await connect(host.url);
    assert.equal(client.state.status === "connected" && client.state.hello.limits.maxEventsPerPush, 500);
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    await client.call("turn/start", turn(sessionId, "k", "burst:20000"));
    const seqs: number[] = [];
    let paused = 0;
    for (;;) {
      const item = await next(sub);
      if (sub.paused) paused++;
      assert.equal(item.kind, "event");
      if (item.kind !== "event") break;
      seqs.push(item.event.seq);
      if (item.event.type === "turn.finished") break;
    }
    assertContiguous(seqs);
    assert.ok(seqs.length > 20000, `${seqs.length} events`);
    assert.equal(paused, 0, "never paused");
  } finally {
    await done();
  }
});

test("subscribe() with a cursor the host no longer holds starts with a resync", { timeout: TEST_TIMEOUT }, async () => {
  const { host, connect, done } = await setup(["--retain-events", "20"]);
  try {
    const client = await connect(host.url);
    const { session } = await client.call("session/create", { workspace: host.workspace("w") });
    await client.call("turn/start", turn(session.sessionId, "k", "burst:200"));
    await waitIdle(client, session.sessionId);
    const sub = await client.subscribe(session.sessionId, { cursor: session.cursor });
    const first = await next(sub);
    assert.equal(first.kind, "resynced", JSON.stringify(first));
    const seqs = [first.kind === "resynced" ? cursorSeq(first.snapshot.cursor) : 0];
    await client.call("turn/start", turn(session.sessionId, "k2", "deltas:3"));
    assert.ok(!(await readTurn(sub, seqs)), "one resync is enough");
    assertContiguous(seqs);
  } finally {
    await done();
  }
});

test("a stalled link fails calls in flight with HOST_DISCONNECTED and recovers", { timeout: TEST_TIMEOUT }, async () => {
  const { proxy, connect, done } = await setup();
  try {
    const client = await connect();
    proxy.stall(true);
    const started = Date.now();
    const error = await client.call("session/list").then(
      () => assert.fail("the call should fail"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof RacpError);
    assert.equal(error.code, "HOST_DISCONNECTED");
    assert.equal(error.retriable, true);
    assert.equal(error.method, "session/list");
    assert.equal(error.safeToResend, true);
    assert.equal(error.mayResend, true);
    // Two heartbeat intervals of silence (2 x 200 ms), with slack for a loaded machine.
    assert.ok(Date.now() - started < 10_000, `${Date.now() - started} ms`);
    proxy.stall(false);
    proxy.cut();
    await within(client.waitConnected(), "reconnect");
    await client.call("session/list");

    // A cut (rather than silence) fails the call held in flight too.
    proxy.stall(true);
    const held = client.call("turn/steer", { sessionId: "ses_x", turnId: "turn_x", text: "t" });
    proxy.cut();
    const cutError = await held.catch((e: unknown) => e);
    assert.ok(cutError instanceof RacpError && cutError.code === "HOST_DISCONNECTED", String(cutError));
    assert.equal(cutError.safeToResend, false, "turn/steer is not safe to resend");
    assert.equal(cutError.mayResend, false);
    proxy.stall(false);
    await within(client.waitConnected(), "reconnect");
    await client.call("session/list");
  } finally {
    await done();
  }
});

test("a per-call timeout and an AbortSignal end the wait, not the link", { timeout: TEST_TIMEOUT }, async () => {
  const { proxy, connect, done } = await setup();
  try {
    const client = await connect();
    // Held traffic: no reply can arrive, and 50 ms is well inside two heartbeat intervals.
    proxy.stall(true);
    const timedOut = await client.call("session/list", {}, { timeoutMs: 50 }).catch((e: unknown) => e);
    assert.ok(timedOut instanceof RacpError && timedOut.code === "TIMEOUT", String(timedOut));
    assert.equal(timedOut.source, "client");
    assert.equal(timedOut.method, "session/list");
    const controller = new AbortController();
    const pending = client.call("session/list", {}, { signal: controller.signal });
    controller.abort(new Error("the user navigated away"));
    await assert.rejects(pending, /navigated away/);
    proxy.stall(false);
    await within(client.waitConnected(), "the link");
    await client.call("session/list");
  } finally {
    await done();
  }
});

test("a host restart is resumed by cursor", { timeout: TEST_TIMEOUT }, async () => {
  const { host, proxy, connect, done } = await setup();
  try {
    const client = await connect();
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    await client.call("turn/start", turn(sessionId, "a", "deltas:5"));
    const seqs: number[] = [];
    await readTurn(sub, seqs);
    await host.restart();
    proxy.retarget(host.port);
    proxy.cut();
    await within(client.waitConnected(), "reconnect");
    // Calls may still meet the old link once; resend what is safe to resend.
    let started = false;
    for (let attempt = 0; attempt < 20 && !started; attempt++) {
      try {
        await client.call("turn/start", turn(sessionId, "b", "deltas:5"));
        started = true;
      } catch (error) {
        assert.ok(error instanceof RacpError && error.mayResend, String(error));
        await within(client.waitConnected(), "reconnect");
      }
    }
    assert.ok(started);
    await readTurn(sub, seqs);
    assert.equal(seqs[0], 1);
    assertContiguous(seqs);
  } finally {
    await done();
  }
});

test("an expired cursor resyncs from a snapshot, then events without a gap", { timeout: TEST_TIMEOUT }, async () => {
  const { host, proxy, connect, done } = await setup(["--retain-events", "50"]);
  try {
    const client = await connect();
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    const direct = await connect(host.url);
    proxy.stall(true);
    await direct.call("turn/start", turn(sessionId, "k", "burst:500"));
    await waitIdle(direct, sessionId);
    proxy.stall(false);
    proxy.cut();
    // Events buffered before the stall may still arrive; then the resync.
    let snapshotSeq: number;
    for (;;) {
      const item = await next(sub);
      if (item.kind === "resynced") {
        snapshotSeq = cursorSeq(item.snapshot.cursor);
        assert.equal(item.snapshot.snapshot.state, "idle");
        break;
      }
      assert.equal(item.kind, "event");
    }
    await direct.call("turn/start", turn(sessionId, "k2", "deltas:3"));
    const seqs = [snapshotSeq];
    const resyncedAgain = await readTurn(sub, seqs);
    assert.ok(!resyncedAgain, "one resync is enough");
    assertContiguous(seqs);
  } finally {
    await done();
  }
});

test("a refused or revoked credential stops the client", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start();
  try {
    const refused = await RacpClient.connect(host.options("pdt_nobody.secret")).catch((e: unknown) => e);
    assert.ok(refused instanceof RacpError, String(refused));
    assert.equal(refused.code, "REMOTE_AUTH_FAILED");
    assert.equal(refused.recovery, "reauthorize");

    const device = await host.pairDevice("phone", ["--roles", "observer"]);
    const client = await connectClient(host, device.token);
    const { ok, stderr } = await host.cli(["revoke", device.deviceId]);
    assert.ok(ok, stderr);
    await eventually("the client to stop", () => (client.state.status === "stopped" ? true : undefined));
    const state = client.state;
    assert.ok(state.status === "stopped");
    assert.equal(state.error.code, "REMOTE_AUTH_FAILED");
    const refusedCall = await client.call("session/list").catch((e: unknown) => e);
    assert.ok(refusedCall instanceof RacpError);
    assert.equal(refusedCall.code, "REMOTE_AUTH_FAILED");
    await assert.rejects(client.waitConnected(), (e: unknown) => e instanceof RacpError && e.code === "REMOTE_AUTH_FAILED");
    client.close();
  } finally {
    await host.stop();
  }
});

test("plain ws:// to a non-loopback address is refused; a refused socket is transient", { timeout: TEST_TIMEOUT }, async () => {
  const refused = await RacpClient.connect({ url: "ws://192.0.2.1:7878/racp", token: "t", allowPlainWs: true, transport }).catch((e: unknown) => e);
  assert.ok(refused instanceof RacpError);
  assert.equal(refused.code, "REMOTE_CONNECTION_FAILED");
  assert.equal(refused.toJSON().retriable, false);
  assert.deepEqual(refused.details, { reason: "plain_not_loopback" });

  const closed = createNetServer();
  await new Promise<void>((r) => closed.listen(0, "127.0.0.1", r));
  const port = (closed.address() as { port: number }).port;
  await new Promise((r) => closed.close(r));
  const unreachable = await RacpClient.connect({ url: `wss://127.0.0.1:${port}/racp`, token: "t", certSha256: "0".repeat(64), transport }).catch(
    (e: unknown) => e,
  );
  assert.ok(unreachable instanceof RacpError, String(unreachable));
  assert.equal(unreachable.code, "REMOTE_CONNECTION_FAILED");
  assert.equal(unreachable.retriable, true);
});

test("a squatter with another certificate gets HOST_IDENTITY_MISMATCH and no credential", { timeout: TEST_TIMEOUT }, async () => {
  const host = await HostProcess.start();
  // Another host's identity stands in for a process that took over the port.
  const other = await HostProcess.start();
  const received: Buffer[] = [];
  const squatter = createTlsServer({ cert: other.certificatePem(), key: other.keyPem() }, (socket) => {
    socket.on("data", (chunk: Buffer) => received.push(chunk));
    socket.on("error", () => {});
  });
  squatter.on("tlsClientError", () => {});
  await new Promise<void>((r) => squatter.listen(0, "127.0.0.1", r));
  const port = (squatter.address() as { port: number }).port;
  try {
    const minted = await host.pairingToken();
    const link = minted.url.replace(/127\.0\.0\.1:\d+/, `127.0.0.1:${port}`);
    const { pair } = await import("../src/index.js");
    const error = await pair(link, { deviceName: "laptop", transport }).catch((e: unknown) => e);
    assert.ok(error instanceof RacpError, String(error));
    assert.equal(error.code, "HOST_IDENTITY_MISMATCH");
    assert.equal(error.retriable, false);
    assert.equal(error.recovery, "stop_and_report");
    assert.deepEqual(error.details, { expected: host.certSha256, found: other.certSha256 });
    assert.equal(Buffer.concat(received).length, 0, "the squatter read nothing after the handshake");
    // The real host, pinned, pairs fine with the same token.
    const device = await host.pairDevice("laptop");
    const client = await connectClient(host, device.token);
    await client.call("session/list");
    client.close();
  } finally {
    squatter.close();
    await other.stop();
    await host.stop();
  }
});

test("a client cut off as CLIENT_TOO_SLOW resumes without loss", { timeout: TEST_TIMEOUT }, async () => {
  // Heartbeats far apart: the host notices the stalled socket long before the client notices
  // the silence.
  const { host, proxy, connect, done } = await setup([
    "--heartbeat-ms",
    "10000",
    "--send-stall-ms",
    "200",
    // Room for every byte of the turn (its agent_end repeats each message): nothing to expire.
    "--retain-bytes",
    String(512 << 20),
  ]);
  try {
    const client = await connect();
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    const direct = await connect(host.url);
    proxy.stall(true);
    // ~12 MB: more than the socket buffers between host and client hold, so the host's writes
    // stall and it gives up on the link with CLIENT_TOO_SLOW.
    await direct.call("turn/start", turn(sessionId, "k", "big:500000 ".repeat(25)));
    await eventually("the host to cut the stalled client", () => host.log().includes("code=CLIENT_TOO_SLOW") || undefined);
    proxy.stall(false);
    proxy.cut();
    const seqs: number[] = [];
    const resynced = await readTurn(sub, seqs);
    assert.ok(!resynced, "the window still held the missed events");
    assert.equal(seqs[0], 1);
    assertContiguous(seqs);
  } finally {
    await done();
  }
});

test("a slow link delivers everything in order", { timeout: TEST_TIMEOUT }, async () => {
  const { host, proxy, connect, done } = await setup();
  try {
    const client = await connect();
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    // 60 ms each way is slower than nothing but well inside two heartbeat intervals (400 ms).
    proxy.delay(60);
    const started = Date.now();
    await client.call("turn/start", turn(sessionId, "k", "deltas:50"));
    assert.ok(Date.now() - started >= 120, "the delay applies");
    const seqs: number[] = [];
    await readTurn(sub, seqs);
    assert.equal(seqs[0], 1);
    assertContiguous(seqs);
    assert.equal(client.state.status, "connected");
  } finally {
    await done();
  }
});

test("a consumer that stops reading holds a bounded buffer and later gets every event", { timeout: TEST_TIMEOUT }, async () => {
  const { host, connect, done } = await setup();
  try {
    const client = await connect(host.url);
    const { session } = await client.call("session/create", { workspace: host.workspace("w") });
    const sub = await client.subscribe(session.sessionId, { cursor: session.cursor, maxBufferedEvents: 100 });
    await client.call("turn/start", turn(session.sessionId, "k", "burst:3000"));
    await waitIdle(client, session.sessionId);
    // Pushes already on the wire when the client paused are dropped, not buffered.
    const heldWhileIdle = sub.buffered;
    assert.ok(heldWhileIdle <= 200, `${heldWhileIdle} items buffered`);
    const seqs: number[] = [];
    let maxBuffered = heldWhileIdle;
    for (;;) {
      const item = await next(sub);
      maxBuffered = Math.max(maxBuffered, sub.buffered);
      assert.equal(item.kind, "event");
      if (item.kind !== "event") break;
      seqs.push(item.event.seq);
      if (item.event.type === "turn.finished") break;
    }
    assert.equal(seqs[0], 1);
    assertContiguous(seqs);
    assert.ok(seqs.length > 3000, `${seqs.length} events`);
    // Paused once the consumer had its turn and had not caught up, or at twice the bound.
    assert.ok(maxBuffered <= 200, `at most ${maxBuffered} buffered`);
    console.log(`bounded buffer: ${seqs.length} events through a 100-item buffer, ${heldWhileIdle} held while the consumer slept`);
  } finally {
    await done();
  }
});

test("subscription/ended ends the iterator after the session closes", { timeout: TEST_TIMEOUT }, async () => {
  const { host, connect, done } = await setup();
  try {
    const client = await connect(host.url);
    const { sessionId, sub } = await sessionAndSubscription(client, host);
    await client.call("session/close", { sessionId });
    const kinds: string[] = [];
    for await (const item of sub) kinds.push(item.kind === "event" ? item.event.type : item.kind);
    assert.deepEqual(kinds.slice(-2), ["session.closed", "ended"]);
  } finally {
    await done();
  }
});

test("typed errors carry the registry's fields and the method's safeToResend", { timeout: TEST_TIMEOUT }, async () => {
  const { connect, done, host } = await setup();
  try {
    const client = await connect(host.url);
    const notFound = await client.call("session/get", { sessionId: "ses_missing" }).catch((e: unknown) => e);
    assert.ok(notFound instanceof RacpError);
    assert.equal(notFound.code, "SESSION_NOT_FOUND");
    assert.equal(notFound.source, "host");
    assert.equal(notFound.recovery, "check_state");
    const created = await client.call("session/create", { workspace: "/nonexistent/outside" }).catch((e: unknown) => e);
    assert.ok(created instanceof RacpError);
    assert.equal(created.method, "session/create");
    assert.equal(created.safeToResend, false);
    assert.equal(created.mayResend, false);
    assert.equal(client.hello?.protocol, 1);
    assert.equal(client.hello?.principal.kind, "device");
  } finally {
    await done();
  }
});

