// The parts of the client that need no host: pairing links, URL checks, backoff, errors, frames,
// reading pi's messages out of history entries.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Backoff, ERROR_CODES, RacpError, checkUrl, isHistoryEntry, messagesOf, parsePairingLink, type Event, type SessionHistoryParams } from "../src/index.js";
import { pagesBack } from "../src/history.js";
import { callTimeoutFor } from "../src/client.js";
import { decodeHostFrame, encodeRequest } from "../src/frames.js";

const PIN = "3f1c9a0e5b7d2468ace013579bdf2468ace013579bdf2468ace013579bdf2468";

function refusal(f: () => unknown): RacpError {
  try {
    f();
  } catch (error) {
    assert.ok(error instanceof RacpError, String(error));
    return error;
  }
  assert.fail("expected a refusal");
}

test("a racps:// link gives a pinned wss:// endpoint and the token from the fragment", () => {
  const endpoint = parsePairingLink(`racps://127.0.0.1:7878/pair?cert=sha256:${PIN.toUpperCase()}#ppt_secret`);
  assert.deepEqual(endpoint, { url: "wss://127.0.0.1:7878/racp", token: "ppt_secret", certSha256: PIN });
  const v6 = parsePairingLink(`racps://[::1]:7878/pair?cert=sha256:${PIN}#ppt_x`);
  assert.equal(v6.url, "wss://[::1]:7878/racp");
});

test("a racp:// link needs the plain opt-in; racps:// needs a fingerprint", () => {
  assert.deepEqual(refusal(() => parsePairingLink("racp://127.0.0.1:7878/pair#ppt_x")).details, { reason: "plain_refused" });
  assert.deepEqual(parsePairingLink("racp://127.0.0.1:7878/pair#ppt_x", { allowPlainWs: true }), {
    url: "ws://127.0.0.1:7878/racp",
    token: "ppt_x",
  });
  assert.deepEqual(refusal(() => parsePairingLink("racp://192.168.1.5:7878/pair#ppt_x", { allowPlainWs: true })).details, {
    reason: "plain_not_loopback",
  });
  assert.deepEqual(refusal(() => parsePairingLink("racps://127.0.0.1:7878/pair#ppt_x")).details, { reason: "no_fingerprint" });
  // The fingerprint may come apart from the link, but not contradict it.
  assert.equal(parsePairingLink("racps://h.example:7878/pair#ppt_x", { certSha256: PIN }).certSha256, PIN);
  assert.deepEqual(
    refusal(() => parsePairingLink(`racps://h:1/pair?cert=sha256:${PIN}#t`, { certSha256: "0".repeat(64) })).details,
    { reason: "bad_fingerprint" },
  );
  assert.deepEqual(refusal(() => parsePairingLink("racps://h:1/pair?cert=sha256:abc#t")).details, { reason: "bad_fingerprint" });
  assert.deepEqual(refusal(() => parsePairingLink(`racps://h:1/pair?cert=sha256:${PIN}`)).details, { reason: "bad_url" });
});

test("a bare token needs the host, and pins when given a fingerprint", () => {
  assert.deepEqual(parsePairingLink(" ppt_tok ", { host: "127.0.0.1:7878", certSha256: PIN }), {
    url: "wss://127.0.0.1:7878/racp",
    token: "ppt_tok",
    certSha256: PIN,
  });
  assert.deepEqual(refusal(() => parsePairingLink("ppt_tok")).details, { reason: "bad_url" });
});

test("plain ws:// only to loopback and only when asked for", () => {
  for (const url of ["ws://127.0.0.1:7878/racp", "ws://localhost:1/racp", "ws://[::1]:1/racp"]) {
    checkUrl(url, { allowPlainWs: true, pinned: false });
    const refused = refusal(() => checkUrl(url, { allowPlainWs: false, pinned: false }));
    assert.equal(refused.code, "REMOTE_CONNECTION_FAILED");
    assert.equal(refused.retriable, false);
    assert.deepEqual(refused.details, { reason: "plain_refused" });
    // A pin cannot be checked without TLS, whatever the opt-in says.
    refusal(() => checkUrl(url, { allowPlainWs: true, pinned: true }));
  }
  checkUrl("wss://example.com:7878/racp", { allowPlainWs: false, pinned: false });
  for (const bad of ["ws://192.168.1.5:7878/racp", "ws://example.com/racp", "http://127.0.0.1/racp", "nonsense"]) {
    assert.equal(refusal(() => checkUrl(bad, { allowPlainWs: true, pinned: false })).code, "REMOTE_CONNECTION_FAILED");
  }
});

test("loopback is judged on the host dialled, and a URL with a user name or password is refused", () => {
  for (const url of [
    "ws://127.0.0.1:1@evil.example/racp",
    "ws://localhost:80@evil.example/racp",
    "ws://[::1]@evil.example/racp",
    "ws://user:pass@127.0.0.1:7878/racp",
    "wss://user@example.com/racp",
  ]) {
    assert.deepEqual(refusal(() => checkUrl(url, { allowPlainWs: true, pinned: false })).details, { reason: "userinfo" }, url);
  }
  for (const url of ["ws://127.0.0.1.evil.example/racp", "ws://localhost.evil.example:80/racp"]) {
    assert.deepEqual(refusal(() => checkUrl(url, { allowPlainWs: true, pinned: false })).details, { reason: "plain_not_loopback" }, url);
  }
  checkUrl("ws://127.0.0.2:7878/racp", { allowPlainWs: true, pinned: false });
  checkUrl("ws://LOCALHOST:7878/racp", { allowPlainWs: true, pinned: false });
});

test("full jitter stays within [0, ceiling) and the ceiling doubles up to its maximum, then resets", () => {
  const backoff = new Backoff(100, 400);
  const ceilings: number[] = [];
  for (let i = 0; i < 4; i++) {
    const ceiling = backoff.currentCeilingMs;
    ceilings.push(ceiling);
    const delay = backoff.nextDelay();
    assert.ok(delay >= 0 && delay < ceiling, `${delay} within [0, ${ceiling})`);
  }
  assert.deepEqual(ceilings, [100, 200, 400, 400]);
  backoff.reset();
  assert.equal(backoff.currentCeilingMs, 100);
  // Full jitter reaches both ends of the range.
  assert.equal(new Backoff(1000, 1000, () => 0).nextDelay(), 0);
  assert.ok(new Backoff(1000, 1000, () => 0.999).nextDelay() > 990);
  // A host's retryAfterMs is a floor.
  assert.equal(new Backoff(100, 100, () => 0).nextDelay(750), 750);
});

test("errors keep the registry's fields; an unknown code becomes INTERNAL with causeCode", () => {
  const wire = { code: "CURSOR_EXPIRED", message: "gone", retriable: false, recovery: "resnapshot", source: "host", details: { oldest: "a-1" } };
  const known = RacpError.fromWire(wire, "session/subscribe");
  assert.equal(known.code, "CURSOR_EXPIRED");
  assert.equal(known.causeCode, undefined);
  assert.equal(known.safeToResend, true);
  assert.equal(known.mayResend, false);
  assert.deepEqual(known.toJSON(), wire);

  const future = RacpError.fromWire({ code: "QUANTUM_FLUX", message: "new", retriable: true, recovery: "retry", source: "host" }, "session/create");
  assert.equal(future.code, "INTERNAL");
  assert.equal(future.causeCode, "QUANTUM_FLUX");
  assert.equal(future.retriable, true);
  assert.equal(future.recovery, "retry");
  assert.equal(future.safeToResend, false);
  assert.equal(future.mayResend, false);

  // Refused before it started: any call may be sent again (docs/protocol.md §6.3).
  const limited = RacpError.fromWire({ code: "RATE_LIMITED", message: "slow down", retriable: true, recovery: "retry_after", source: "host", retryAfterMs: 50 }, "pair");
  assert.equal(limited.mayResend, true);
  assert.equal(limited.retryAfterMs, 50);

  // Client-made errors default to the registry row.
  const disconnected = new RacpError({ code: "HOST_DISCONNECTED", message: "x", method: "turn/start" });
  assert.equal(disconnected.retriable, ERROR_CODES.HOST_DISCONNECTED.retriable === "yes");
  assert.equal(disconnected.recovery, "reconnect_and_resume");
  assert.equal(disconnected.source, "client");
  assert.equal(disconnected.mayResend, true);
  assert.ok(disconnected instanceof Error);
});

test("host frames are told apart by their keys", () => {
  assert.deepEqual(decodeHostFrame('{"id":3,"result":{}}'), { kind: "result", id: 3, result: {} });
  assert.deepEqual(decodeHostFrame('{"id":null,"error":{"code":"INVALID_ARGUMENT"}}'), {
    kind: "error",
    id: null,
    error: { code: "INVALID_ARGUMENT" },
  });
  assert.deepEqual(decodeHostFrame('{"method":"heartbeat","params":{"at":1}}'), { kind: "push", method: "heartbeat", params: { at: 1 } });
  const connectionError = decodeHostFrame('{"error":{"code":"CLIENT_TOO_SLOW","message":"m","retriable":true,"recovery":"reconnect_and_resume","source":"host"}}');
  assert.equal(connectionError?.kind, "connection-error");
  for (const junk of ["not json", "[]", "null", '{"id":1}', '{"method":"x"}']) assert.equal(decodeHostFrame(junk), undefined, junk);
});

test("a request over the frame bound fails locally with PAYLOAD_TOO_LARGE", () => {
  assert.equal(encodeRequest(1, "session/list", {}, 4096), '{"id":1,"method":"session/list","params":{}}');
  const tooLarge = refusal(() => encodeRequest(2, "turn/start", { text: "é".repeat(3000) }, 4096));
  assert.equal(tooLarge.code, "PAYLOAD_TOO_LARGE");
  assert.equal(tooLarge.method, "turn/start");
});

function entry(seq: number, type: string, data: unknown): Event {
  return { seq, cursor: `0f3a9c2e11d04b7a-${seq}`, type, at: 1764528000000 + seq, turnId: "turn_1", data };
}

test("messagesOf: a message_end's message as is, a compaction's end as pi's compactionSummary", () => {
  const user = { role: "user", content: [{ type: "text", text: "run the tests" }], timestamp: 1764528000001 };
  const assistant = { role: "assistant", content: [{ type: "text", text: "ok" }], stopReason: "stop", timestamp: 1764528000002 };
  const result = { summary: "Ran the tests; all pass.", firstKeptEntryId: "e9", tokensBefore: 52000 };
  const entries = [
    entry(4, "agent.message_end", { type: "message_end", message: user }),
    entry(9, "agent.message_end", { type: "message_end", message: assistant }),
    entry(12, "agent.compaction_end", { type: "compaction_end", reason: "threshold", result, aborted: false, willRetry: false }),
    // An aborted compaction left nothing in place of the messages.
    entry(13, "agent.compaction_end", { type: "compaction_end", reason: "manual", aborted: true, willRetry: false }),
    entry(15, "agent.auto_compaction_end", { type: "auto_compaction_end", result: { summary: "older pi" } }),
    // Cut away to fit a frame (docs/protocol.md §8.6): no message to show.
    { ...entry(16, "agent.message_end", null), elided: { bytes: 9000000, limit: 8192, from: "0f3a9c2e11d04b7a-15", cut: [] } },
    entry(17, "turn.finished", { outcome: "completed" }),
  ];
  assert.deepEqual(messagesOf(entries), [
    user,
    assistant,
    { role: "compactionSummary", summary: result.summary, tokensBefore: 52000, timestamp: 1764528000012 },
    { role: "compactionSummary", summary: "older pi", timestamp: 1764528000015 },
  ]);
  // The message is the event's own object: nothing is copied.
  assert.equal(messagesOf(entries)[0], user);
  assert.deepEqual(entries.map(isHistoryEntry), [true, true, true, true, true, true, false]);
});

test("history pages start before what the caller holds and stop at a page without earlier", async () => {
  const calls: SessionHistoryParams[] = [];
  const pages = new Map([
    ["e-9", { cursor: "e-9", entries: [entry(7, "agent.message_end", {})], earlier: "e-6" }],
    ["e-6", { cursor: "e-6", entries: [entry(3, "agent.message_end", {})] }],
    ["e-0", { cursor: "e-0", entries: [] }],
    ["head", { cursor: "e-20", entries: [entry(18, "agent.message_end", {})], earlier: "e-9" }],
  ]);
  const call = async (params: SessionHistoryParams) => {
    calls.push(params);
    return pages.get(params.upTo ?? "head")!;
  };
  const read = async (options: Parameters<typeof pagesBack>[2]) => {
    calls.length = 0;
    const cursors: string[] = [];
    for await (const page of pagesBack(call, "ses_1", options)) cursors.push(page.cursor);
    return cursors;
  };
  const snapshot = { state: "idle" as const, turns: [], pendingApprovals: [] };
  const got = { session: { sessionId: "ses_1", workspace: "/w", state: "idle" as const, createdAt: 0, cursor: "e-20" }, cursor: "e-20" };
  // From a snapshot: only what is older than its history.
  assert.deepEqual(await read({ from: { ...got, snapshot: { ...snapshot, history: { entries: [], earlier: "e-9" } } } }), ["e-9", "e-6"]);
  assert.deepEqual(await read({ from: { ...got, snapshot: { ...snapshot, history: { entries: [] } } } }), []);
  assert.equal(calls.length, 0);
  // A snapshot without history (an older host): everything up to its cursor.
  assert.deepEqual(await read({ from: { ...got, cursor: "e-0", snapshot } }), ["e-0"]);
  // From the head, with the caller's bounds; and on from a page already read.
  assert.deepEqual(await read({ limit: 1, maxBytes: 4096 }), ["e-20", "e-9", "e-6"]);
  assert.deepEqual(calls.map((c) => [c.upTo, c.limit, c.maxBytes]), [[undefined, 1, 4096], ["e-9", 1, 4096], ["e-6", 1, 4096]]);
  assert.deepEqual(await read({ from: pages.get("e-9")! }), ["e-6"]);
});

test("a call waits the client's timeout plus its method's own deadline, and only that", () => {
  assert.equal(callTimeoutFor("session/list", 30_000), 30_000);
  assert.equal(callTimeoutFor("session/bash", 30_000), 30_000 + 600_000);
});
