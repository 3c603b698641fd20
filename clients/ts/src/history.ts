// A session's history (docs/protocol.md §7.24): the events that hold its conversation, kept by
// the host past the replay window. `session/get` carries the most recent entries up to its
// cursor (`snapshot.history`, §7.11); older ones are read a page at a time, back from a page's
// `earlier`. The history up to a cursor and a subscription from that cursor see every entry
// exactly once (§8.4), so a client shows the whole conversation, each message once.

import type { Cursor, Event, HistoryPage, SessionGetResult, SessionHistoryParams, SessionHistoryResult } from "../racp.js";
import type { CallOptions } from "./connection.js";
import type { JsonObject } from "./stream.js";

/** The event types of history entries: a message whole, or a compaction's end
 * (`agent.auto_compaction_end` is an older pi's name for an automatic one). */
const ENTRY_TYPES = new Set(["agent.message_end", "agent.compaction_end", "agent.auto_compaction_end"]);
const COMPACTION_END_TYPES = new Set(["agent.compaction_end", "agent.auto_compaction_end"]);

/** Whether a live event is one the history keeps: a view built from a snapshot's history
 * appends exactly these from its subscription. */
export function isHistoryEntry(event: Event): boolean {
  return ENTRY_TYPES.has(event.type);
}

export interface HistoryOptions extends CallOptions {
  /** The page ends with the last entry at or before this cursor; absent: the head. */
  upTo?: Cursor;
  /** Most entries in a page, 1 to 1000 [100]. */
  limit?: number;
  /** Most bytes of entries in a page, 4 KiB to 16 MiB [256 KiB]; a larger entry comes alone, cut (§8.6). */
  maxBytes?: number;
}

export interface HistoryPagesOptions extends Omit<HistoryOptions, "upTo"> {
  /**
   * Where to page back from:
   * - a `session/get` result (a `resynced` item's `snapshot`): the pages before its
   *   `snapshot.history`, which the caller already has; from its cursor if the host sent none;
   * - a page already read (a snapshot's `history`, a `session/history` result): the pages
   *   before it, so an iteration cut short by a lost link continues from its last page;
   * - absent: from the head, the newest page first.
   */
  from?: SessionGetResult | HistoryPage;
}

/** One `session/history` call, as the client makes it. */
type HistoryCall = (params: SessionHistoryParams, options: CallOptions) => Promise<SessionHistoryResult>;

/** The `upTo` of the first page to read, or `null` when nothing is older than `from`. */
function startOf(from: SessionGetResult | HistoryPage | undefined): { upTo?: Cursor } | null {
  if (from === undefined) return {};
  if ("snapshot" in from) return from.snapshot.history ? startOf(from.snapshot.history) : { upTo: from.cursor };
  return from.earlier ? { upTo: from.earlier } : null;
}

/** Pages back, newest first, until a page has no `earlier` (the start of what the host keeps). */
export async function* pagesBack(call: HistoryCall, sessionId: string, options: HistoryPagesOptions = {}): AsyncGenerator<SessionHistoryResult, void, undefined> {
  const { from, limit, maxBytes, ...callOptions } = options;
  let next = startOf(from);
  while (next !== null) {
    const page = await call({ sessionId, ...next, limit, maxBytes }, callOptions);
    yield page;
    next = page.earlier ? { upTo: page.earlier } : null;
  }
}

/**
 * A pi message as pi's own session holds it: `user`, `assistant`, `toolResult`, an extension's
 * `custom`, or `compactionSummary` (what a compaction left in place of older messages).
 */
export type PiMessage = JsonObject & { role: string };

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * The pi message an entry holds: `agent.message_end`'s `data.message`, or for a compaction's end
 * a `compactionSummary` built as pi builds it from `data.result`. `undefined` for any other
 * event, a compaction that left no result (aborted or failed), or an entry whose data the host
 * had to cut away (`elided` with `data: null`, §8.6).
 */
export function messageOf(entry: Event): PiMessage | undefined {
  const data = entry.data;
  if (!isObject(data)) return undefined;
  if (entry.type === "agent.message_end") {
    const message = data.message;
    return isObject(message) && typeof message.role === "string" ? (message as PiMessage) : undefined;
  }
  if (COMPACTION_END_TYPES.has(entry.type)) {
    const result = data.result;
    if (!isObject(result) || typeof result.summary !== "string") return undefined;
    const summary: PiMessage = { role: "compactionSummary", summary: result.summary };
    if (result.tokensBefore !== undefined) summary.tokensBefore = result.tokensBefore;
    summary.timestamp = entry.at;
    return summary;
  }
  return undefined;
}

/** The pi messages of history entries (or live events), in their order; see `messageOf`. */
export function messagesOf(entries: readonly Event[]): PiMessage[] {
  const messages: PiMessage[] = [];
  for (const entry of entries) {
    const message = messageOf(entry);
    if (message !== undefined) messages.push(message);
  }
  return messages;
}
