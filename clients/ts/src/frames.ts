// Frames on the wire (docs/protocol.md §3.1): host frames are told apart by their keys.

import type { RacpMethodName, RacpPushes, RequestId } from "../racp.js";
import { RacpError } from "./errors.js";

export type HostFrame =
  | { kind: "result"; id: RequestId; result: unknown }
  | { kind: "error"; id: RequestId | null; error: unknown }
  | { kind: "push"; method: string; params: unknown }
  | { kind: "connection-error"; error: RacpError };

export type PushName = keyof RacpPushes;

/** Reads one text frame; `undefined` for anything that is not a host frame (logged by no one). */
export function decodeHostFrame(text: string): HostFrame | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined;
  const frame = value as Record<string, unknown>;
  const id = frame.id;
  const hasId = typeof id === "number" || typeof id === "string";
  if (hasId && "result" in frame) return { kind: "result", id, result: frame.result };
  if ((hasId || id === null) && "error" in frame) return { kind: "error", id: hasId ? id : null, error: frame.error };
  if (typeof frame.method === "string" && "params" in frame) {
    return { kind: "push", method: frame.method, params: frame.params };
  }
  if (!("id" in frame) && "error" in frame) {
    return { kind: "connection-error", error: RacpError.fromWire(frame.error) };
  }
  return undefined;
}

const encoder = new TextEncoder();

/** A request frame, or PAYLOAD_TOO_LARGE when it would exceed the frame bound (§5.2). */
export function encodeRequest(
  id: number,
  method: RacpMethodName,
  params: unknown,
  maxFrameBytes: number,
): string {
  const text = JSON.stringify({ id, method, params: params ?? {} });
  const size = encoder.encode(text).length;
  if (size > maxFrameBytes) {
    throw new RacpError({
      code: "PAYLOAD_TOO_LARGE",
      message: `${method} would be a ${size}-byte frame; the bound is ${maxFrameBytes}`,
      details: { size, limit: maxFrameBytes },
      method,
    });
  }
  return text;
}
