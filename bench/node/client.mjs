// A socket.io-client load worker, driven by pi-bench over stdin/stdout (JSON lines), the
// counterpart of `pi-bench worker` for pi-host.
//
// Usage: node client.mjs --url http://127.0.0.1:PORT --token TOKEN --count K --mode MODE
// Modes:
//   fanout  K subscribers record every "ev" payload (per tag: count, latency histogram).
//           {"cmd": "await", "tag", "expect", "timeout_ms"} answers once every subscriber got
//           `expect` payloads of that tag (or at the timeout) with the tag's statistics.
//   idle    K authenticated connections that do nothing.
//   resume  one subscriber. {"cmd": "drop"} cuts its transport (a recoverable disconnect);
//           {"cmd": "resume", "tag", "expect", "timeout_ms"} reconnects with its session id and
//           offset and answers when `expect` payloads of `tag` arrived: {"ms", "received",
//           "recovered", "in_order"}.
// Every mode prints {"ready": true, "connected": K} once all its connections are up, and exits
// when stdin closes or on {"cmd": "quit"}.

import { io } from "socket.io-client";
import { Tally, arg, commands, nowUs, send } from "./common.mjs";

const url = arg("url");
const token = arg("token");
const count = Number(arg("count", "1"));
const mode = arg("mode", "fanout");
// Connections opened at once: more would overflow the server's accept backlog.
const CONNECT_WINDOW = 100;

const tally = new Tally();
const sockets = [];

function open() {
  return new Promise((resolve, reject) => {
    const socket = io(url, {
      transports: ["websocket"],
      forceNew: true,
      reconnection: false,
      timeout: 60_000,
      auth: { token },
    });
    socket.once("connect", () => resolve(socket));
    socket.once("connect_error", (err) => reject(new Error(`connect: ${err.message}`)));
  });
}

async function openAll(n, onSocket) {
  let next = 0;
  const lane = async () => {
    while (next < n) {
      next += 1;
      const socket = await open();
      onSocket(socket);
      sockets.push(socket);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, CONNECT_WINDOW) }, lane));
}

function record(p) {
  const e = p?.assistantMessageEvent;
  if (e === undefined || e.t === undefined) return;
  const now = nowUs();
  tally.record(e.tag, now - e.t, now);
}

/** Resolves when `done()` holds or after `timeoutMs`, checking every few milliseconds. */
function until(done, timeoutMs) {
  return new Promise((resolve) => {
    const deadline = Date.now() + timeoutMs;
    const check = () => {
      if (done() || Date.now() >= deadline) resolve();
      else setTimeout(check, 2);
    };
    check();
  });
}

let resumeState = null;

async function main() {
  if (mode === "fanout") {
    await openAll(count, (s) => s.on("ev", record));
  } else if (mode === "idle") {
    await openAll(count, () => {});
  } else if (mode === "resume") {
    await openAll(1, (s) =>
      s.on("ev", (p) => {
        const e = p?.assistantMessageEvent;
        if (resumeState === null || e?.tag !== resumeState.tag) return;
        if (e.i !== resumeState.received) resumeState.inOrder = false;
        resumeState.received += 1;
        if (resumeState.received === resumeState.expect) resumeState.doneUs = nowUs();
      }),
    );
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  send({ ready: true, connected: sockets.length });
}

commands(async (cmd) => {
  switch (cmd.cmd) {
    case "await": {
      const want = cmd.expect * sockets.length;
      await until(() => tally.received(cmd.tag) >= want, cmd.timeout_ms ?? 30_000);
      send(tally.take(cmd.tag));
      break;
    }
    case "drop": {
      const socket = sockets[0];
      const closed = new Promise((resolve) => socket.once("disconnect", resolve));
      socket.io.engine.close();
      const reason = await closed;
      send({ dropped: true, reason });
      break;
    }
    case "resume": {
      const socket = sockets[0];
      resumeState = { tag: cmd.tag, expect: cmd.expect, received: 0, inOrder: true, doneUs: 0 };
      const startUs = nowUs();
      socket.connect();
      await until(() => resumeState.doneUs > 0, cmd.timeout_ms ?? 60_000);
      const endUs = resumeState.doneUs || nowUs();
      send({
        ms: (endUs - startUs) / 1000,
        received: resumeState.received,
        recovered: socket.recovered === true,
        in_order: resumeState.inOrder,
      });
      break;
    }
    case "quit":
      for (const s of sockets) s.disconnect();
      process.exit(0);
      break;
    default:
      send({ error: `unknown command ${cmd.cmd}` });
  }
});

main().catch((err) => {
  send({ error: String(err?.message ?? err) });
  process.exit(1);
});
