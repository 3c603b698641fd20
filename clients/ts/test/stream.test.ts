// The rebuild rule of docs/protocol.md §8.1 ("Compact streams") without a host: the unit tests
// of the Rust reference (racp-proto/src/stream.rs), ported, plus the edges a client relies on.

import assert from "node:assert/strict";
import { test } from "node:test";
import { StreamState, skipLines, type JsonValue } from "../src/index.js";

function update(step: JsonValue): JsonValue {
  return { type: "message_update", message: { role: "assistant", timestamp: 1 }, assistantMessageEvent: step };
}

function content(state: StreamState): JsonValue[] {
  const message = state.message() as { content: JsonValue[] };
  return message.content;
}

test("a message is rebuilt from blocks and deltas", () => {
  const state = new StreamState();
  const skeleton = { role: "assistant", content: [], model: "m", timestamp: 1 };
  state.apply("agent.message_start", { message: skeleton });
  const steps: JsonValue[] = [
    { type: "start", partial: skeleton },
    { type: "thinking_start", contentIndex: 0, block: { type: "thinking", thinking: "" } },
    { type: "thinking_delta", contentIndex: 0, delta: "hmm" },
    { type: "thinking_end", contentIndex: 0, block: { type: "thinking", thinkingSignature: "sig" } },
    { type: "text_start", contentIndex: 1, block: { type: "text", text: "" } },
    { type: "text_delta", contentIndex: 1, delta: "Hel" },
    { type: "text_delta", contentIndex: 1, delta: "lo\n" },
    { type: "text_end", contentIndex: 1, block: { type: "text" } },
    { type: "toolcall_start", contentIndex: 2, block: { type: "toolCall", id: "c1", name: "bash", arguments: {}, partialArgs: "" } },
    { type: "toolcall_delta", contentIndex: 2, delta: '{"command":' },
    { type: "toolcall_delta", contentIndex: 2, delta: '"ls"}' },
  ];
  for (const step of steps) state.apply("agent.message_update", update(step));
  assert.equal((content(state)[2] as { partialArgs: string }).partialArgs, '{"command":"ls"}');
  state.apply(
    "agent.message_update",
    update({ type: "toolcall_end", contentIndex: 2, block: { type: "toolCall", id: "c1", name: "bash" } }),
  );
  state.apply("agent.message_end", {});
  const rebuilt = state.finishedMessage() as { content: JsonValue };
  assert.ok(rebuilt, "message_end finishes the message");
  assert.deepEqual(rebuilt.content, [
    { type: "thinking", thinking: "hmm", thinkingSignature: "sig" },
    { type: "text", text: "Hello\n" },
    { type: "toolCall", id: "c1", name: "bash", arguments: { command: "ls" } },
  ]);
  assert.equal(state.message(), undefined);
  // The skeleton the consumer holds was copied, not streamed into.
  assert.deepEqual(skeleton.content, []);
});

test("fields sent at the end override the deltas", () => {
  const state = new StreamState();
  state.apply("agent.message_start", { message: { role: "assistant", content: [] } });
  const steps: JsonValue[] = [
    { type: "toolcall_start", contentIndex: 0, block: { type: "toolCall", id: "c", name: "n", partialArgs: "" } },
    { type: "toolcall_delta", contentIndex: 0, delta: '{"a":' },
    { type: "toolcall_end", contentIndex: 0, block: { type: "toolCall", id: "c", name: "n", arguments: { a: "repaired" } } },
  ];
  for (const step of steps) state.apply("agent.message_update", update(step));
  assert.deepEqual(content(state)[0], { type: "toolCall", id: "c", name: "n", arguments: { a: "repaired" } });
});

test("tool output appends and slides", () => {
  const state = new StreamState();
  state.apply("agent.tool_execution_update", { toolCallId: "t1", partialResult: { content: [], details: null } });
  assert.deepEqual((state.toolOutput("t1") as { content: JsonValue }).content, []);
  state.apply("agent.tool_execution_update", { toolCallId: "t1", outputUpdate: { append: "a\nb\n" } });
  assert.deepEqual(state.toolOutput("t1"), { content: [{ type: "text", text: "a\nb\n" }] }, "no details when the update had none");
  state.apply("agent.tool_execution_update", {
    toolCallId: "t1",
    outputUpdate: { dropLines: 1, append: "c\n" },
    details: { truncation: { truncated: true } },
  });
  assert.deepEqual(state.toolOutput("t1"), {
    content: [{ type: "text", text: "b\nc\n" }],
    details: { truncation: { truncated: true } },
  });
  state.apply("agent.tool_execution_end", { toolCallId: "t1" });
  assert.equal(state.toolOutput("t1"), undefined);
});

test("skipLines counts newlines", () => {
  assert.equal(skipLines("a\nb\nc", 0), "a\nb\nc");
  assert.equal(skipLines("a\nb\nc", 2), "c");
  assert.equal(skipLines("a\nb\nc", 3), "");
  assert.equal(skipLines("", 1), "");
});

test("a started block's streamed field comes from the deltas alone", () => {
  const state = new StreamState();
  state.apply("agent.message_start", { message: { role: "assistant", content: [] } });
  // pi may write a start whose block already holds the first deltas; they follow anyway.
  state.apply("agent.message_update", update({ type: "text_start", contentIndex: 0, block: { type: "text", text: "He" } }));
  state.apply("agent.message_update", update({ type: "text_delta", contentIndex: 0, delta: "He" }));
  state.apply("agent.message_update", update({ type: "toolcall_start", contentIndex: 1, block: { type: "toolCall", id: "c", name: "n" } }));
  state.apply("agent.message_update", update({ type: "toolcall_delta", contentIndex: 1, delta: "{}" }));
  assert.deepEqual(content(state), [
    { type: "text", text: "He" },
    { type: "toolCall", id: "c", name: "n", partialArgs: "{}" },
  ]);
});

test("an append to an output that is not one text block starts from nothing", () => {
  const state = new StreamState();
  const twoBlocks = { content: [{ type: "text", text: "x\n" }, { type: "image", data: "" }] };
  state.apply("agent.tool_execution_update", { toolCallId: "t", partialResult: twoBlocks });
  state.apply("agent.tool_execution_update", { toolCallId: "t", outputUpdate: { append: "y\n" } });
  assert.deepEqual(state.toolOutput("t"), { content: [{ type: "text", text: "y\n" }] });
});

test("a step with partial replaces the message; M fields other than content are merged", () => {
  const state = new StreamState();
  state.apply("agent.message_start", { message: { role: "assistant", content: [], timestamp: 1 } });
  state.apply("agent.message_update", {
    message: { role: "assistant", timestamp: 1, usage: { output: 3 }, content: ["ignored"] },
    assistantMessageEvent: { type: "text_start", contentIndex: 0, block: { type: "text", text: "" } },
  });
  assert.deepEqual(state.message(), { role: "assistant", content: [{ type: "text", text: "" }], timestamp: 1, usage: { output: 3 } });
  const whole = { role: "assistant", content: [{ type: "text", text: "whole" }], timestamp: 1 };
  state.apply("agent.message_update", update({ type: "other_shape", partial: whole }));
  assert.deepEqual(state.message(), whole);
});

test("only an assistant message streams; a finished turn clears, a snapshot seeds", () => {
  const state = new StreamState();
  state.apply("agent.message_start", { message: { role: "user", content: [] } });
  assert.equal(state.message(), undefined);
  state.apply("agent.message_update", update({ type: "text_delta", contentIndex: 0, delta: "x" }));
  assert.equal(state.message(), undefined, "an update without a message is ignored");
  state.apply("agent.message_end", {});
  assert.equal(state.finishedMessage(), undefined);

  const seeded = StreamState.fromSnapshot({
    state: "running",
    turns: [],
    pendingApprovals: [],
    streamingMessage: { role: "assistant", content: [{ type: "text", text: "so far " }] },
    toolOutputs: { t: { content: [{ type: "text", text: "1\n" }] } },
  });
  seeded.apply("agent.message_update", update({ type: "text_delta", contentIndex: 0, delta: "and on" }));
  seeded.apply("agent.tool_execution_update", { toolCallId: "t", outputUpdate: { append: "2\n" } });
  assert.deepEqual(seeded.message(), { role: "assistant", content: [{ type: "text", text: "so far and on" }], timestamp: 1 });
  assert.deepEqual(seeded.toolOutput("t"), { content: [{ type: "text", text: "1\n2\n" }] });
  seeded.clear();
  assert.equal(seeded.message(), undefined);
  assert.equal(seeded.toolOutputs().size, 0);
  assert.ok(StreamState.streams("message_update") && !StreamState.streams("turn_end"));
});
