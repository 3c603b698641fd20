// Rebuilding what the agent streams from compact events (docs/protocol.md §8.1, "Compact
// streams"): the assistant message in progress from `agent.message_update` steps, and each
// running tool's output from `agent.tool_execution_update` appends.
//
// pi writes every update with everything streamed so far; the host relays only what is new, so
// a reply costs bytes linear in its length. `StreamState` applies those events in order and
// holds the message and tool outputs pi held at that point. It is the same rule as the Rust
// reference (racp-proto/src/pi/stream.rs): a client and the host's snapshot must agree exactly.

import type { Snapshot } from "../racp.js";

/** A JSON value as events carry it. */
export type JsonValue = null | boolean | number | string | JsonValue[] | JsonObject;
export type JsonObject = { [field: string]: JsonValue };

/** The field of a content block that its deltas extend (rule 4). */
function streamedField(blockType: unknown): "text" | "thinking" | "partialArgs" | undefined {
  switch (blockType) {
    case "text":
      return "text";
    case "thinking":
      return "thinking";
    case "toolCall":
      return "partialArgs";
    default:
      return undefined;
  }
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function has(object: JsonObject, field: string): boolean {
  return Object.prototype.hasOwnProperty.call(object, field);
}

/** A field of `value` when it is an object (like `value["field"]` on a serde `Value`). */
function field(value: unknown, name: string): unknown {
  return isObject(value) && has(value, name) ? value[name] : undefined;
}

/** A non-negative integer, or undefined (serde's `as_u64`). */
function count(value: unknown): number | undefined {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? value : undefined;
}

/** The state keeps its own copies: applying an event never changes the event the consumer holds. */
function copy<T>(value: T): T {
  return structuredClone(value);
}

/** The agent event kinds that change the state; the others need not be read. */
const STREAMING_KINDS = new Set(["message_start", "message_update", "message_end", "tool_execution_update", "tool_execution_end"]);

/** What the agent is streaming in one session, rebuilt from its events (§8.1, "Rebuilding"). */
export class StreamState {
  /** The assistant message being streamed, as pi holds it (between `message_start` and `message_end`). */
  #message: JsonValue | undefined;
  /** The output of each running tool so far, by tool call id, as pi's `partialResult`. */
  readonly #toolOutputs = new Map<string, JsonValue>();
  #finished: JsonValue | undefined;

  /** The state a `session/get` snapshot describes, to continue from its cursor (§7.11). */
  static fromSnapshot(snapshot: Snapshot): StreamState {
    const state = new StreamState();
    state.resume(snapshot);
    return state;
  }

  /** Replaces the state with the one a snapshot (or `session/stream`) describes: a resync, or a subscription from its cursor. */
  resume(snapshot: Pick<Snapshot, "streamingMessage" | "toolOutputs">): void {
    const message = snapshot.streamingMessage;
    this.#message = message === undefined || message === null ? undefined : copy(message as JsonValue);
    this.#toolOutputs.clear();
    for (const [id, output] of Object.entries(snapshot.toolOutputs ?? {})) this.#toolOutputs.set(id, copy(output as JsonValue));
    this.#finished = undefined;
  }

  /** The assistant message in progress, if one is streaming. Read-only: it is the state itself. */
  message(): JsonValue | undefined {
    return this.#message;
  }

  /** The output so far of a running tool (pi's `partialResult` shape). */
  toolOutput(toolCallId: string): JsonValue | undefined {
    return this.#toolOutputs.get(toolCallId);
  }

  /** The running tools' outputs so far, by tool call id. */
  toolOutputs(): ReadonlyMap<string, JsonValue> {
    return this.#toolOutputs;
  }

  /**
   * The last message `message_end` finished, as rebuilt just before it (pi's own copy is in
   * that event: the two are equal).
   */
  finishedMessage(): JsonValue | undefined {
    return this.#finished;
  }

  /** Forgets what was streaming: a turn that ended ends its streams (rule 8, `turn.finished`). */
  clear(): void {
    this.#message = undefined;
    this.#toolOutputs.clear();
  }

  /** True for the agent event kinds (pi `type`, without `agent.`) that change the state. */
  static streams(kind: string): boolean {
    return STREAMING_KINDS.has(kind);
  }

  /**
   * Applies one event, given its wire type (`agent.message_update`, ...) and `data`. Events that
   * stream nothing are ignored; so is anything malformed (the state is a view, never a reason
   * to refuse an event).
   */
  apply(eventType: string, data: unknown): void {
    if (eventType.startsWith("agent.")) this.applyAgent(eventType.slice("agent.".length), data);
  }

  /** `apply` for an agent event given by its pi `type`. */
  applyAgent(kind: string, data: unknown): void {
    switch (kind) {
      case "message_start": {
        const message = field(data, "message");
        if (field(message, "role") === "assistant") this.#message = copy(message as JsonValue);
        break;
      }
      case "message_update":
        this.applyMessageUpdate(data);
        break;
      case "message_end":
        if (this.#message !== undefined) {
          this.#finished = this.#message;
          this.#message = undefined;
        }
        break;
      case "tool_execution_update":
        this.applyToolUpdate(data);
        break;
      case "tool_execution_end": {
        const id = field(data, "toolCallId");
        if (typeof id === "string") this.#toolOutputs.delete(id);
        break;
      }
    }
  }

  private applyMessageUpdate(data: unknown): void {
    const step = field(data, "assistantMessageEvent");
    const kind = field(step, "type");
    if (!isObject(step) || typeof kind !== "string") return;
    if (kind === "start") {
      // Rule 1: the step's `partial` is the message's skeleton.
      if (has(step, "partial")) this.#message = copy(step.partial as JsonValue);
      return;
    }
    const message = this.#message;
    if (message === undefined) return;
    // Rule 2: the update's `message` holds the fields that changed, never its content.
    const fields = field(data, "message");
    if (isObject(message) && isObject(fields)) {
      for (const [name, value] of Object.entries(fields)) if (name !== "content") message[name] = copy(value);
    }
    // Rule 6: pi's own full partial (a step the host did not compact) is authoritative.
    if (has(step, "partial")) {
      this.#message = copy(step.partial as JsonValue);
      return;
    }
    const index = count(step.contentIndex);
    const content = field(message, "content");
    if (index === undefined || !Array.isArray(content)) return;
    if (kind.endsWith("_start")) {
      // Rule 3. The deltas carry the streamed field from its start: pi may already have put a
      // few of them into the block it started, and those deltas still follow.
      if (has(step, "block")) {
        while (content.length <= index) content.push(null);
        const block = copy(step.block as JsonValue);
        const name = isObject(block) ? streamedField(block.type) : undefined;
        if (name !== undefined) (block as JsonObject)[name] = "";
        content[index] = block;
      }
    } else if (kind.endsWith("_delta")) {
      // Rule 4.
      const block = content[index];
      if (block !== undefined && typeof step.delta === "string") extendStreamed(block, step.delta);
    } else if (kind.endsWith("_end")) {
      // Rule 5.
      const block = content[index];
      if (block !== undefined) endBlock(block, step.block);
    }
  }

  /** Rule 7. */
  private applyToolUpdate(data: unknown): void {
    if (!isObject(data) || typeof data.toolCallId !== "string") return;
    const id = data.toolCallId;
    if (has(data, "partialResult")) {
      this.#toolOutputs.set(id, copy(data.partialResult as JsonValue));
      return;
    }
    const append = field(data.outputUpdate, "append");
    if (typeof append !== "string") return;
    const dropLines = count(field(data.outputUpdate, "dropLines")) ?? 0;
    const previous = singleText(this.#toolOutputs.get(id)) ?? "";
    const output: JsonObject = { content: [{ type: "text", text: skipLines(previous, dropLines) + append }] };
    // `details` only when this update had one: pi's own shape (§8.1).
    if (has(data, "details")) output.details = copy(data.details as JsonValue);
    this.#toolOutputs.set(id, output);
  }
}

/** Adds a delta to the block's streamed field. */
function extendStreamed(block: JsonValue, delta: string): void {
  if (!isObject(block)) return;
  const name = streamedField(block.type);
  if (name === undefined) return;
  const current = block[name];
  block[name] = typeof current === "string" ? current + delta : delta;
}

/**
 * A block ends: the fields the host sent override; a tool call's arguments are its streamed
 * argument text, parsed, unless the host sent pi's own (when they differ from that text).
 */
function endBlock(block: JsonValue, end: unknown): void {
  if (!isObject(block)) return;
  if (isObject(end)) for (const [name, value] of Object.entries(end)) block[name] = copy(value);
  if (block.type !== "toolCall") return;
  const streamed = has(block, "partialArgs") ? block.partialArgs : undefined;
  delete block.partialArgs;
  if (isObject(end) && has(end, "arguments")) return;
  if (typeof streamed !== "string") return;
  try {
    block.arguments = JSON.parse(streamed) as JsonValue;
  } catch {
    // Arguments that are not JSON stay as pi's start left them.
  }
}

/**
 * The text of a tool result whose content is exactly one text block: the only shape whose
 * updates the host sends as appends (§8.1).
 */
export function singleText(result: unknown): string | undefined {
  const content = field(result, "content");
  if (!Array.isArray(content) || content.length !== 1) return undefined;
  const [block] = content;
  if (field(block, "type") !== "text") return undefined;
  const text = field(block, "text");
  return typeof text === "string" ? text : undefined;
}

/** `text` without its first `lines` lines (each up to and including its `\n`). */
export function skipLines(text: string, lines: number): string {
  let start = 0;
  for (let i = 0; i < lines; i++) {
    const end = text.indexOf("\n", start);
    if (end < 0) return "";
    start = end + 1;
  }
  return text.slice(start);
}
