// The Socket.IO peer: a Socket.IO 4.8 server with connection state recovery on, WebSocket
// transport, an auth middleware checking a token (the counterpart of pi-host's device token),
// broadcasting the stand-in agent's 200-byte payloads to every connected socket.
//
// Usage: node server.mjs --token TOKEN
// Prints {"port": N} once listening on 127.0.0.1, then takes JSON commands on stdin:
//   {"cmd": "stream", "n", "rate", "tag"}  broadcast n payloads at rate/s (0: as fast as it can);
//                                          answers {"streamed": tag} when the last one is emitted
//   {"cmd": "clients"}                     answers {"clients": connected socket count}
//   {"cmd": "gc"}                          runs the GC when started with --expose-gc

import { createServer } from "node:http";
import { Server } from "socket.io";
import { arg, commands, nowUs, payload, send } from "./common.mjs";

const token = arg("token");
const httpServer = createServer();
const io = new Server(httpServer, {
  transports: ["websocket"],
  serveClient: false,
  connectionStateRecovery: {
    maxDisconnectionDuration: 2 * 60 * 1000,
    skipMiddlewares: true,
  },
});

io.use((socket, next) => {
  if (socket.handshake.auth?.token === token) next();
  else next(new Error("unauthorized"));
});

// Lines per emit burst when there is no rate to keep, as in the stand-in agent.
const CHUNK = 256;

function stream(n, rate, tag) {
  const start = nowUs();
  let sent = 0;
  const step = () => {
    const due =
      rate === 0
        ? Math.min(n, sent + CHUNK)
        : Math.min(n, Math.floor(((nowUs() - start) * rate) / 1e6) + 1);
    if (due > sent) {
      const t = Math.round(nowUs());
      for (let i = sent; i < due; i++) io.emit("ev", payload(tag, i, t));
      sent = due;
    }
    if (sent >= n) {
      send({ streamed: tag });
      return;
    }
    if (rate === 0) {
      // Yield to I/O between bursts so sockets drain as the stream goes.
      setImmediate(step);
    } else {
      // At most one burst per millisecond, like the stand-in agent.
      const waitMs = (start + (sent * 1e6) / rate - nowUs()) / 1000;
      setTimeout(step, Math.max(1, waitMs));
    }
  };
  step();
}

commands((cmd) => {
  switch (cmd.cmd) {
    case "stream":
      stream(cmd.n, cmd.rate ?? 0, cmd.tag ?? 0);
      break;
    case "clients":
      send({ clients: io.engine.clientsCount });
      break;
    case "gc":
      globalThis.gc?.();
      send({ gc: typeof globalThis.gc === "function" });
      break;
    default:
      send({ error: `unknown command ${cmd.cmd}` });
  }
});

httpServer.listen(0, "127.0.0.1", () => {
  send({ port: httpServer.address().port, version: process.version });
});
