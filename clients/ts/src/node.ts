// The Node transport: the `ws` package (injected, so it stays an optional peer dependency),
// the token in an `Authorization` header, and TLS that trusts exactly the certificate pinned at
// pairing (docs/protocol.md §2.4). The pin is checked right after the TLS handshake, before the
// HTTP upgrade is handed a socket, so nothing (no token, no request) reaches another endpoint.

import { createHash } from "node:crypto";
import { isIP } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import type { IncomingMessage } from "node:http";
import { SUBPROTOCOL } from "../racp.js";
import { RacpError } from "./errors.js";
import type { LinkSocket, Transport } from "./transport.js";

/**
 * The `ws` package's WebSocket class (`import WebSocket from "ws"`). Typed loosely so this module
 * needs no types from `ws`; the instance is used through the WHATWG subset in LinkSocket.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type WsConstructor = new (url: string, protocols: string[], options: any) => unknown;

interface WsSocket extends LinkSocket {
  on(event: "unexpected-response", listener: (request: { destroy(): void }, response: IncomingMessage) => void): unknown;
  terminate(): void;
}

export interface NodeTransportOptions {
  /** An `Origin` header to send (a non-browser client sends none; tests use it). */
  origin?: string;
  /** The largest message accepted from the host [64 MiB, as the Rust client]. */
  maxPayloadBytes?: number;
}

/** SHA-256 of a DER certificate, as 64 lowercase hex digits (the pairing fingerprint). */
export function certificateSha256(der: Uint8Array): string {
  return createHash("sha256").update(der).digest("hex");
}

/** A transport for Node over `ws`; pins the certificate when the endpoint carries a fingerprint. */
export function nodeTransport(WebSocket: WsConstructor, options: NodeTransportOptions = {}): Transport {
  return (request) => {
    let failure: RacpError | undefined;
    const secure = request.url.startsWith("wss:");
    const wsOptions: Record<string, unknown> = {
      headers: { Authorization: `Bearer ${request.token}` },
      perMessageDeflate: false,
      maxPayload: options.maxPayloadBytes ?? 64 << 20,
    };
    if (options.origin !== undefined) wsOptions.origin = options.origin;
    if (secure && request.certSha256 !== undefined) {
      wsOptions.createConnection = pinnedConnection(request.certSha256.toLowerCase(), (error) => (failure = error));
    }
    const socket = new WebSocket(request.url, [SUBPROTOCOL], wsOptions) as WsSocket;
    // A refused upgrade carries `{"error": AppError}` (§2.3): read it instead of a bare status.
    socket.on("unexpected-response", (_request, response) => {
      const chunks: Buffer[] = [];
      response.on("data", (chunk: Buffer) => chunks.push(chunk));
      response.on("end", () => {
        failure = refusal(response.statusCode ?? 0, Buffer.concat(chunks).toString("utf8"));
        socket.terminate();
      });
      response.on("error", () => socket.terminate());
    });
    Object.defineProperty(socket, "failure", { get: () => failure });
    return socket;
  };
}

function refusal(status: number, body: string): RacpError {
  try {
    const parsed = JSON.parse(body) as { error?: unknown };
    if (typeof parsed.error === "object" && parsed.error !== null) return RacpError.fromWire(parsed.error);
  } catch {
    // Not JSON: report the status.
  }
  return new RacpError({
    code: "REMOTE_CONNECTION_FAILED",
    message: `the host refused the upgrade: HTTP ${status}`,
    retriable: status >= 500,
  });
}

type ConnectionCallback = (error: Error | null, socket?: TLSSocket) => void;

/**
 * `createConnection` for the HTTP request under `ws`: completes TLS accepting any certificate,
 * then hands over the socket only if the certificate's SHA-256 is the pin. The handshake's
 * signatures are still verified against that certificate's key, so the peer must hold it.
 */
function pinnedConnection(pin: string, onMismatch: (error: RacpError) => void) {
  return (options: { host?: string; hostname?: string; port?: number | string }, callback: ConnectionCallback): undefined => {
    const host = (options.host ?? options.hostname ?? "localhost").replace(/^\[|\]$/g, "");
    const port = Number(options.port ?? 443);
    const socket = tlsConnect({
      host,
      port,
      ...(isIP(host) === 0 ? { servername: host } : {}),
      // The pin is the whole trust decision: no name, chain or expiry check (§2.4).
      rejectUnauthorized: false,
    });
    let answered = false;
    const answer = (error: Error | null) => {
      if (answered) return;
      answered = true;
      if (error) {
        socket.destroy();
        callback(error);
      } else callback(null, socket);
    };
    socket.once("secureConnect", () => {
      const certificate = socket.getPeerCertificate();
      const found = certificate?.raw ? certificateSha256(certificate.raw) : "none";
      if (found === pin) return answer(null);
      const error = new RacpError({
        code: "HOST_IDENTITY_MISMATCH",
        message:
          `the endpoint at ${host}:${port} is not the host this device paired with: its certificate has SHA-256 ${found}, ` +
          `the pinned one is ${pin}. Nothing was sent. Another process may hold the port, or the host's identity was reset; ` +
          `re-pair only if you trust the change`,
        details: { expected: pin, found },
      });
      onMismatch(error);
      answer(error);
    });
    socket.once("error", (error) => answer(error));
    return undefined;
  };
}
