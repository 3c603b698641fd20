// Pairing links and endpoint URLs (docs/protocol.md §2.4, §5.3): where a token may be sent.

import { ENDPOINT_PATH } from "../racp.js";
import { RacpError } from "./errors.js";

/** Where to connect with which token, and the host certificate to pin. */
export interface Endpoint {
  /** `wss://HOST:PORT/racp`, or `ws://` on loopback for a host run with `--plain`. */
  url: string;
  token: string;
  /** SHA-256 of the host's certificate (DER), 64 lowercase hex digits. */
  certSha256?: string;
  /** Set on a device paired over plain `ws://` (a host run with `--plain`), so that connecting
   * with the stored device needs no opt-in again. */
  allowPlainWs?: boolean;
}

export interface PairingLinkOptions {
  /** For a bare text token: `HOST:PORT` of the host. */
  host?: string;
  /** The fingerprint, when given apart from the link (or for a bare token). */
  certSha256?: string;
  /** Accept a `racp://` link (a host run with `--plain`). */
  allowPlainWs?: boolean;
}

function refused(url: string, why: string, reason: string): RacpError {
  return new RacpError({
    code: "REMOTE_CONNECTION_FAILED",
    message: `cannot connect to ${url}: ${why}`,
    retriable: false,
    details: { reason },
  });
}

const HEX64 = /^[0-9a-f]{64}$/;

function checkFingerprint(hex: string, where: string): string {
  const lower = hex.toLowerCase();
  if (!HEX64.test(lower)) throw refused(where, "the certificate fingerprint must be 64 hex digits", "bad_fingerprint");
  return lower;
}

/**
 * Reads a pairing link (`racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN`, `racp://HOST:PORT/pair#TOKEN`)
 * or a bare token (with `options.host`). The token is in the fragment, which is never sent.
 */
export function parsePairingLink(link: string, options: PairingLinkOptions = {}): Endpoint {
  const text = link.trim();
  const scheme = /^(racps?):\/\//.exec(text)?.[1];
  if (scheme === undefined) {
    if (options.host === undefined) {
      throw refused(text.slice(0, 16) + "…", "a bare token needs the host's HOST:PORT", "bad_url");
    }
    const plain = options.allowPlainWs === true && options.certSha256 === undefined;
    const endpoint: Endpoint = { url: `${plain ? "ws" : "wss"}://${options.host}${ENDPOINT_PATH}`, token: text };
    if (options.certSha256 !== undefined) endpoint.certSha256 = checkFingerprint(options.certSha256, options.host);
    checkUrl(endpoint.url, { allowPlainWs: options.allowPlainWs ?? false, pinned: endpoint.certSha256 !== undefined });
    return endpoint;
  }
  let parsed: URL;
  try {
    // URL only parses special schemes' authorities fully; read it as https.
    parsed = new URL(text.replace(/^racps?:/, "https:"));
  } catch {
    throw refused(scheme + "://…", "not a pairing link", "bad_url");
  }
  const token = decodeURIComponent(parsed.hash.replace(/^#/, ""));
  const where = `${scheme}://${parsed.host}`;
  if (token === "") throw refused(where, "the pairing link has no token", "bad_url");
  if (parsed.pathname !== "/pair") throw refused(where, "a pairing link's path is /pair", "bad_url");
  const cert = parsed.searchParams.get("cert");
  let certSha256 = options.certSha256 === undefined ? undefined : checkFingerprint(options.certSha256, where);
  if (cert !== null) {
    if (!cert.startsWith("sha256:")) throw refused(where, "cert= must be sha256:<hex>", "bad_fingerprint");
    const fromLink = checkFingerprint(cert.slice("sha256:".length), where);
    if (certSha256 !== undefined && certSha256 !== fromLink) {
      throw refused(where, "the link's fingerprint differs from the one given", "bad_fingerprint");
    }
    certSha256 = fromLink;
  }
  const url = `${scheme === "racps" ? "wss" : "ws"}://${parsed.host}${ENDPOINT_PATH}`;
  if (scheme === "racps" && certSha256 === undefined) {
    throw refused(where, "a racps:// link needs the host's certificate fingerprint (cert=sha256:…)", "no_fingerprint");
  }
  checkUrl(url, { allowPlainWs: options.allowPlainWs ?? false, pinned: certSha256 !== undefined });
  return certSha256 === undefined ? { url, token } : { url, token, certSha256 };
}

/**
 * Refuses a URL over which the token could reach someone other than the host: `ws://` to a
 * non-loopback address always, `ws://` with a pin (TLS is what checks it), and `ws://` at all
 * unless the caller opted in (§2.4). Nothing is connected when this throws.
 */
export function checkUrl(url: string, options: { allowPlainWs: boolean; pinned: boolean }): void {
  // Judged on the URL as the WebSocket will parse it, so the host checked is the host dialled:
  // `ws://127.0.0.1:1@evil.example/` names evil.example, not loopback.
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw refused(url, "not a URL", "bad_url");
  }
  if (parsed.username !== "" || parsed.password !== "" || /^[a-z]+:\/\/[^/?#]*@/i.test(url)) {
    throw refused(url, "the URL carries a user name or password before the host; give the host's URL without them", "userinfo");
  }
  const scheme = parsed.protocol.replace(/:$/, "");
  const host = parsed.hostname.toLowerCase();
  const loopback = host === "localhost" || host === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
  if (scheme === "wss") return;
  if (scheme !== "ws") throw refused(url, "the scheme must be ws:// or wss://", "bad_url");
  if (!loopback) throw refused(url, "ws:// is only allowed to a loopback address; use wss://", "plain_not_loopback");
  if (options.pinned) {
    throw refused(url, "this host's identity is pinned, which needs wss://; a plain ws:// endpoint cannot prove it is the host", "plain_refused");
  }
  if (!options.allowPlainWs) {
    throw refused(
      url,
      "refusing to send a token over plain ws://: nothing proves the endpoint is the host; use the host's wss:// URL and its certificate fingerprint, or opt into plain WebSocket for a host run with --plain",
      "plain_refused",
    );
  }
}
