// One WebSocket to the host: opened, greeted with `hello`, then carrying calls and pushes until
// it ends. A link never reconnects itself; the client opens a new one (client.ts).

import { PROTOCOL_VERSION, type HelloResult, type RacpMethodName } from "../racp.js";
import { RacpError, codeForCloseCode, hostDisconnected } from "./errors.js";
import { decodeHostFrame, encodeRequest } from "./frames.js";
import type { LinkSocket, Transport } from "./transport.js";

/** Frames before `hello` is answered are bounded at 64 KiB both ways (§5.2). */
const PRE_HELLO_FRAME_BYTES = 65536;

export interface LinkOptions {
  transport: Transport;
  url: string;
  token: string;
  certSha256?: string;
  clientName: string;
  clientVersion: string;
  connectTimeoutMs: number;
  /** Most events the host may put in one push (half the client's buffer, so one push never
   * fills it and a consumer that keeps up is never paused). */
  maxEventsPerPush: number;
}

/** How a link ended: a reason to reconnect, or an error that stops the client. */
export type LinkEnd = { reason: string; error?: RacpError };

interface Waiting {
  method: RacpMethodName;
  /** Runs as the reply is read, before any later frame is dispatched (see `request`). */
  onResult: ((result: unknown) => void) | undefined;
  resolve: (result: unknown) => void;
  reject: (error: RacpError) => void;
}

export interface CallOptions {
  /** Fail with TIMEOUT after this long without a reply. */
  timeoutMs?: number;
  /** Abort waiting; the call rejects with the signal's reason. The host may still run it. */
  signal?: AbortSignal;
}

export class Link {
  readonly hello: HelloResult;
  /** Resolves once, when the link ends for any reason. */
  readonly ended: Promise<LinkEnd>;
  private endLink!: (end: LinkEnd) => void;
  private isEnded = false;
  private nextId = 1;
  private readonly waiting = new Map<number, Waiting>();
  private silence: ReturnType<typeof setTimeout> | undefined;
  /** A connection error the host sent before closing (§3.1). */
  private connectionError: RacpError | undefined;

  private constructor(
    private readonly socket: LinkSocket,
    hello: HelloResult,
    private readonly onPush: (method: string, params: unknown) => void,
  ) {
    this.hello = hello;
    this.ended = new Promise((resolve) => (this.endLink = resolve));
  }

  /** Opens the socket and says hello; rejects with why it could not. */
  static open(options: LinkOptions, onPush: (method: string, params: unknown) => void): Promise<Link> {
    return new Promise((resolve, reject) => {
      let socket: LinkSocket;
      try {
        socket = options.transport({
          url: options.url,
          token: options.token,
          ...(options.certSha256 ? { certSha256: options.certSha256 } : {}),
        });
      } catch (error) {
        reject(connectionFailed(`cannot open a WebSocket: ${String(error)}`));
        return;
      }
      let settled = false;
      const fail = (error: RacpError) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.onopen = socket.onmessage = socket.onclose = socket.onerror = null;
        try {
          socket.close();
        } catch {
          // Closing a socket that never opened may throw in some implementations.
        }
        reject(error);
      };
      const timer = setTimeout(() => fail(connectionFailed("the host did not answer in time")), options.connectTimeoutMs);
      let connectionError: RacpError | undefined;
      socket.onopen = () => {
        const hello = {
          protocol: { min: PROTOCOL_VERSION, max: PROTOCOL_VERSION },
          client: { name: options.clientName, version: options.clientVersion },
          maxEventsPerPush: options.maxEventsPerPush,
        };
        socket.send(encodeRequest(0, "hello", hello, PRE_HELLO_FRAME_BYTES));
      };
      socket.onmessage = (event) => {
        const frame = typeof event.data === "string" ? decodeHostFrame(event.data) : undefined;
        if (frame === undefined) return;
        if (frame.kind === "connection-error") {
          connectionError = frame.error;
          return;
        }
        if (frame.kind === "error" && frame.id === 0) {
          fail(RacpError.fromWire(frame.error, "hello"));
          return;
        }
        if (frame.kind !== "result" || frame.id !== 0) return;
        const result = frame.result as HelloResult;
        if (result.protocol !== PROTOCOL_VERSION) {
          fail(
            new RacpError({
              code: "PROTOCOL_MISMATCH",
              message: `the host chose protocol ${String(result.protocol)}; this client speaks ${PROTOCOL_VERSION}`,
              details: { supported: { min: PROTOCOL_VERSION, max: PROTOCOL_VERSION } },
            }),
          );
          return;
        }
        settled = true;
        clearTimeout(timer);
        resolve(new Link(socket, result, onPush).start());
      };
      socket.onerror = () => {
        // The close event follows and says more (a close code, or the transport's failure).
      };
      socket.onclose = (event) => {
        fail(connectionError ?? socket.failure ?? closedBeforeHello(event.code));
      };
    });
  }

  /** The largest frame either side may send on this link (§5.2). */
  get maxFrameBytes(): number {
    return this.hello.limits.maxFrameBytes;
  }

  get open(): boolean {
    return !this.isEnded;
  }

  private start(): this {
    this.socket.onmessage = (event) => {
      this.heard();
      if (typeof event.data !== "string") return;
      const frame = decodeHostFrame(event.data);
      if (frame === undefined) return;
      switch (frame.kind) {
        case "result": {
          const waiting = this.take(frame.id);
          waiting?.onResult?.(frame.result);
          waiting?.resolve(frame.result);
          break;
        }
        case "error": {
          const waiting = frame.id === null ? undefined : this.take(frame.id);
          if (waiting) waiting.reject(RacpError.fromWire(frame.error, waiting.method));
          break;
        }
        case "push":
          this.onPush(frame.method, frame.params);
          break;
        case "connection-error":
          this.connectionError = frame.error;
          break;
      }
    };
    this.socket.onerror = () => {};
    this.socket.onclose = (event) => {
      const error = this.connectionError ?? closeError(event.code);
      const reason = error ? `${error.code}: ${error.message}` : `the host closed the connection (${event.code})`;
      this.end(error ? { reason, error } : { reason });
    };
    this.heard();
    return this;
  }

  /** Any frame proves the link alive; two heartbeat intervals of silence end it (§9.2). */
  private heard(): void {
    if (this.isEnded) return;
    clearTimeout(this.silence);
    this.silence = setTimeout(
      () => this.end({ reason: "no frame for two heartbeat intervals" }),
      Math.max(this.hello.heartbeatMs, 10) * 2,
    );
  }

  private take(id: number | string): Waiting | undefined {
    if (typeof id !== "number") return undefined;
    const waiting = this.waiting.get(id);
    this.waiting.delete(id);
    return waiting;
  }

  /**
   * Sends a request and waits for its reply. `onResult` sees a result synchronously, as its frame
   * is read: a promise settles only after the frames that came in the same read (a subscribe's
   * reply and its first push, batched by a proxy) have been dispatched, so whoever must be ready
   * for those frames gets ready here.
   */
  request(
    method: RacpMethodName,
    params: unknown,
    options: CallOptions = {},
    onResult?: (result: unknown) => void,
  ): Promise<unknown> {
    if (this.isEnded) return Promise.reject(hostDisconnected("the link is closed", method));
    const { signal, timeoutMs } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    const id = this.nextId++;
    let text: string;
    try {
      text = encodeRequest(id, method, params, this.maxFrameBytes);
    } catch (error) {
      return Promise.reject(error);
    }
    return new Promise((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const onAbort = () => {
        this.waiting.delete(id);
        done();
        reject(signal?.reason);
      };
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      this.waiting.set(id, {
        method,
        onResult,
        resolve: (result) => {
          done();
          resolve(result);
        },
        reject: (error) => {
          done();
          reject(error);
        },
      });
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          this.waiting.delete(id);
          done();
          reject(new RacpError({ code: "TIMEOUT", message: `no reply to ${method} within ${timeoutMs} ms`, method }));
        }, timeoutMs);
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        this.socket.send(text);
      } catch (error) {
        this.end({ reason: `send failed: ${String(error)}` });
      }
    });
  }

  /** Sends a request whose reply nobody waits for. */
  notify(method: RacpMethodName, params: unknown): void {
    this.request(method, params).catch(() => {});
  }

  /** Closes the link; calls in flight fail with HOST_DISCONNECTED. */
  close(reason = "the client closed the link"): void {
    this.end({ reason });
  }

  private end(end: LinkEnd): void {
    if (this.isEnded) return;
    this.isEnded = true;
    clearTimeout(this.silence);
    this.socket.onmessage = this.socket.onclose = this.socket.onerror = null;
    try {
      this.socket.close(1000);
    } catch {
      // Already closing.
    }
    const waiting = [...this.waiting.values()];
    this.waiting.clear();
    for (const call of waiting) call.reject(hostDisconnected(end.reason, call.method));
    this.endLink(end);
  }
}

function connectionFailed(message: string): RacpError {
  return new RacpError({ code: "REMOTE_CONNECTION_FAILED", message, retriable: true });
}

/** The error a 4xxx close stands for, when its connection error was lost (§13). */
function closeError(closeCode: number): RacpError | undefined {
  if (closeCode === 1001) {
    return new RacpError({ code: "HOST_SHUTTING_DOWN", message: "the host is shutting down", source: "host" });
  }
  const code = closeCode >= 4000 && closeCode < 5000 ? codeForCloseCode(closeCode) : undefined;
  return code ? new RacpError({ code, message: `the host closed the connection with ${closeCode}`, source: "host" }) : undefined;
}

function closedBeforeHello(closeCode: number): RacpError {
  return (
    closeError(closeCode) ??
    connectionFailed(`cannot connect: the connection closed before hello was answered (close ${closeCode})`)
  );
}
