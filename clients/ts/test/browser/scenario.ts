// Runs in Chromium: the client as a browser loads it (ES modules from tsc, the platform's
// WebSocket, the token in the `racp.bearer.` subprotocol). The Node test drives these steps.

import { RacpClient, RacpError, pair, type Subscription } from "../../src/index.js";

let client: RacpClient | undefined;
let deviceToken: string | undefined;
let subscription: Subscription | undefined;
const seqs: number[] = [];
/** Links lost and reopened since the first connection. */
let reconnects = 0;

function show(text: string): void {
  const item = document.createElement("li");
  item.textContent = text;
  document.getElementById("log")?.append(item);
}

function showState(): void {
  const state = document.getElementById("state");
  if (client?.state.status === "connecting") reconnects++;
  if (state && client) state.textContent = `${client.state.status} (reconnected ${reconnects} times)`;
}

type Outcome = { ok: true; detail?: unknown } | { ok: false; code: string; message: string };

function failed(error: unknown): Outcome {
  return error instanceof RacpError
    ? { ok: false, code: error.code, message: error.message }
    : { ok: false, code: "NOT_A_RACP_ERROR", message: String(error) };
}

const racpTest = {
  /** Pairs from a racps:// link (the browser's TLS trust stands in for the pin), then connects at `url`. */
  async pairAndConnect(link: string, url: string): Promise<Outcome> {
    try {
      const device = await pair(link, { deviceName: "chromium" });
      deviceToken = device.token;
      client = await RacpClient.connect({ url, token: device.token, minBackoffMs: 20, maxBackoffMs: 200 });
      client.addEventListener("statechange", showState);
      showState();
      return { ok: true, detail: { roles: device.roles, principal: client.hello?.principal } };
    } catch (error) {
      return failed(error);
    }
  },

  /** Creates a session, subscribes from its start and starts a turn. */
  async startTurn(workspace: string, text: string): Promise<Outcome> {
    try {
      if (!client) throw new Error("not connected");
      const { session } = await client.call("session/create", { workspace, title: "browser" });
      subscription = await client.subscribe(session.sessionId, { cursor: session.cursor });
      await client.call("turn/start", { sessionId: session.sessionId, idempotencyKey: "browser-1", text });
      return { ok: true, detail: session.sessionId };
    } catch (error) {
      return failed(error);
    }
  },

  /** Reads events until `count` were seen, or until `turn.finished`; returns every seq so far. */
  async readEvents(count: number): Promise<{ seqs: number[]; finished: boolean; resynced: boolean }> {
    if (!subscription) throw new Error("no subscription");
    let resynced = false;
    while (seqs.length < count) {
      const { value, done } = await subscription.next();
      if (done) break;
      if (value.kind === "resynced") resynced = true;
      if (value.kind !== "event") continue;
      seqs.push(value.event.seq);
      show(`${value.event.seq} ${value.event.type}`);
      if (value.event.type === "turn.finished") return { seqs, finished: true, resynced };
    }
    return { seqs, finished: false, resynced };
  },

  /** Opens a raw WebSocket as the paired device, says hello, closes with 1000: the close code
   * the page then sees (1000 when the host answers the close frame, 1006 when it does not). */
  closeCode(url: string): Promise<number> {
    return new Promise((resolve, reject) => {
      if (!deviceToken) return reject(new Error("not paired"));
      const socket = new WebSocket(url, ["racp.v1", `racp.bearer.${deviceToken}`]);
      socket.onopen = () =>
        socket.send(JSON.stringify({ id: 1, method: "hello", params: { protocol: { min: 1, max: 1 }, client: { name: "page", version: "0" } } }));
      socket.onmessage = () => socket.close(1000, "done");
      socket.onclose = (event) => resolve(event.code);
      socket.onerror = () => {};
    });
  },

  state(): { status: string; reconnects: number } {
    return { status: client?.state.status ?? "none", reconnects };
  },

  /** Marks where the test cuts the link. */
  markCut(): void {
    show("--- link cut here ---");
  },

  waitConnected(): Promise<void> {
    return client ? client.waitConnected() : Promise.reject(new Error("no client"));
  },
};

declare global {
  interface Window {
    racpTest: typeof racpTest;
  }
}

window.racpTest = racpTest;
const origin = document.getElementById("origin");
if (origin) origin.textContent = location.origin;
document.getElementById("state")!.textContent = "ready";
