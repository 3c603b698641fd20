// How a link is opened: the WebSocket is injected, so one client runs in browsers (the platform's
// WebSocket) and in Node (the `ws` package through ./node.ts, which can pin the certificate).

import { BEARER_SUBPROTOCOL_PREFIX, SUBPROTOCOL } from "../racp.js";
import type { RacpError } from "./errors.js";

/** The part of the WHATWG WebSocket interface the client uses. */
export interface LinkSocket {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  /**
   * Why the link could not open, when the transport knows more than a browser tells (a refused
   * upgrade's JSON body, a certificate that is not the pinned one).
   */
  readonly failure?: RacpError | undefined;
}

export interface LinkRequest {
  url: string;
  token: string;
  /** The pinned certificate fingerprint; a transport that cannot check it leaves trust to the platform. */
  certSha256?: string;
}

/** Opens a WebSocket to the host, presenting the token. */
export type Transport = (request: LinkRequest) => LinkSocket;

export type WebSocketConstructor = new (url: string, protocols: string[]) => LinkSocket;

/**
 * A transport over a WHATWG WebSocket constructor (the browser's by default). Browsers cannot
 * set headers on a WebSocket, so the token travels in the `racp.bearer.<token>` subprotocol
 * (§2.2), and they cannot pin a certificate from script: the browser's own certificate trust
 * decides (see README).
 */
export function webSocketTransport(WebSocketClass?: WebSocketConstructor): Transport {
  return (request) => {
    const Ctor = WebSocketClass ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (Ctor === undefined) {
      throw new TypeError("no WebSocket in this environment: pass a transport (e.g. nodeTransport from racp-client/node)");
    }
    return new Ctor(request.url, [SUBPROTOCOL, BEARER_SUBPROTOCOL_PREFIX + request.token]);
  };
}
