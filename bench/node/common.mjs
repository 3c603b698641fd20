// Shared by the Socket.IO peer server and its load workers: the clock, the payload and the
// latency histogram, all matching pi-bench's Rust side (bench/src/hist.rs, the stand-in agent's
// `stream` directive).

import { createInterface } from "node:readline";

/** Wall clock in microseconds (CLOCK_REALTIME with sub-millisecond resolution). */
export function nowUs() {
  return (performance.timeOrigin + performance.now()) * 1000;
}

const LINE_BYTES = 200;
const PAD = "x".repeat(LINE_BYTES);

/** The same 200-byte object the stand-in agent writes for `stream:N:RATE:TAG`. */
export function payload(tag, i, t) {
  const bare = `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"","tag":${tag},"i":${i},"t":${t}}}`;
  const fill = Math.max(0, LINE_BYTES - bare.length);
  return {
    type: "message_update",
    assistantMessageEvent: { type: "text_delta", delta: PAD.slice(0, fill), tag, i, t },
  };
}

/** Log-linear bucket of a latency in µs: exact below 64, then 32 buckets per power of two. */
export function bucket(v) {
  v = Math.min(Math.max(0, Math.floor(v)), 0x7fffffff);
  if (v < 64) return v;
  const msb = 31 - Math.clz32(v);
  const shift = msb - 5;
  return 64 + (msb - 6) * 32 + ((v >>> shift) - 32);
}

/** Per-tag receipt statistics: count, first and last receipt, latency histogram. */
export class Tally {
  constructor() {
    this.tags = new Map();
  }
  record(tag, latencyUs, at) {
    let s = this.tags.get(tag);
    if (!s) {
      s = { received: 0, firstUs: at, lastUs: at, hist: new Map() };
      this.tags.set(tag, s);
    }
    s.received += 1;
    s.lastUs = at;
    const b = bucket(latencyUs);
    s.hist.set(b, (s.hist.get(b) || 0) + 1);
  }
  received(tag) {
    return this.tags.get(tag)?.received ?? 0;
  }
  take(tag) {
    const s = this.tags.get(tag) ?? { received: 0, firstUs: 0, lastUs: 0, hist: new Map() };
    this.tags.delete(tag);
    return {
      tag,
      received: s.received,
      first_us: Math.round(s.firstUs),
      last_us: Math.round(s.lastUs),
      hist: [...s.hist.entries()].sort((a, b) => a[0] - b[0]),
    };
  }
}

export function send(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

/** Calls `handle` with each JSON command read from stdin; exits when stdin closes. */
export function commands(handle) {
  const rl = createInterface({ input: process.stdin });
  rl.on("line", (line) => {
    if (!line.trim()) return;
    let cmd;
    try {
      cmd = JSON.parse(line);
    } catch (err) {
      send({ error: `bad command: ${err.message}` });
      return;
    }
    Promise.resolve(handle(cmd)).catch((err) => send({ error: String(err?.stack ?? err) }));
  });
  rl.on("close", () => process.exit(0));
}

export function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i === -1 || i + 1 >= process.argv.length) {
    if (fallback === undefined) throw new Error(`missing --${name}`);
    return fallback;
  }
  return process.argv[i + 1];
}
