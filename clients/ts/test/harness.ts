// Test harness: a real `pi-host serve` on a port the OS chooses, with its own temporary data
// directory and the stand-in agent; a TCP proxy that cuts, stalls and delays the link. Like the
// Rust harness (tests/src/lib.rs), nothing here is mocked.

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, existsSync } from "node:fs";
import { createServer, connect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { RacpClient, pair, type ClientOptions, type PairedDevice } from "../src/index.js";
import { nodeTransport } from "../src/node.js";

/** Generous bound for anything a test waits on: a loaded 2-core machine is slow, not stuck. */
export const PATIENCE_MS = 30_000;

const here = fileURLToPath(new URL(".", import.meta.url));
/** clients/ts, whether running from test/ or dist/test/. */
export const PACKAGE_DIR = resolve(here, here.includes("/dist/") ? "../.." : "..");
export const REPO_DIR = resolve(PACKAGE_DIR, "../..");
const TARGET_DIR = process.env.CARGO_TARGET_DIR ? resolve(REPO_DIR, process.env.CARGO_TARGET_DIR) : join(REPO_DIR, "target");
export const PI_HOST_BIN = process.env.PI_HOST_BIN ?? join(TARGET_DIR, "debug/pi-host");
export const STAND_IN_AGENT = process.env.STAND_IN_AGENT ?? join(TARGET_DIR, "debug/stand-in-agent");

export const transport = nodeTransport(WebSocket);

for (const bin of [PI_HOST_BIN, STAND_IN_AGENT]) {
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run \`cargo build -p pi-host -p tests --bins\` first`);
}

/** Resolves when `check` returns a value, polling; rejects after `ms` with `what`. */
export async function eventually<T>(what: string, check: () => T | undefined | Promise<T | undefined>, ms = PATIENCE_MS): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Rejects if `promise` does not settle within `ms`. */
export function within<T>(promise: Promise<T>, what: string, ms = PATIENCE_MS): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms))),
  ]);
}

export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `racp-ts-${prefix}-`));
}

/** A running `pi-host serve`. */
export class HostProcess {
  private constructor(
    private child: ChildProcess,
    public port: number,
    /** The certificate fingerprint; undefined for a `--plain` host. */
    public certSha256: string | undefined,
    readonly dataDir: string,
    readonly root: string,
    private readonly logFile: string,
    private readonly args: string[],
  ) {}

  /** Starts a host with the stand-in agent and 200 ms heartbeats, plus `extra` serve flags. */
  static async start(extra: string[] = []): Promise<HostProcess> {
    const dataDir = tempDir("data");
    const root = tempDir("root");
    const heartbeat = extra.includes("--heartbeat-ms") ? [] : ["--heartbeat-ms", "200"];
    const args = ["--agent", STAND_IN_AGENT, ...heartbeat, ...extra];
    const logFile = join(dataDir, "..", `${dataDir.split("/").pop()}.log`);
    const host = new HostProcess(undefined as unknown as ChildProcess, 0, undefined, dataDir, root, logFile, args);
    await host.spawn();
    return host;
  }

  private async spawn(): Promise<void> {
    const { openSync } = await import("node:fs");
    const log = openSync(this.logFile, "a");
    const child = spawn(
      PI_HOST_BIN,
      ["serve", "--listen", "127.0.0.1:0", "--data-dir", this.dataDir, "--root", this.root, ...this.args],
      { stdio: ["ignore", "pipe", log], env: { ...process.env, PI_HOST_LOG: process.env.PI_HOST_TEST_LOG ?? "debug", NO_COLOR: "1" } },
    );
    this.child = child;
    const lines = createInterface({ input: child.stdout! });
    const started = new Promise<void>((resolveStarted, reject) => {
      let cert: string | undefined;
      lines.on("line", (line) => {
        const pin = /^pi-host certificate SHA-256 ([0-9a-f]{64})/.exec(line);
        if (pin) cert = pin[1];
        const listening = /^pi-host listening on wss?:\/\/127\.0\.0\.1:(\d+)\/racp/.exec(line);
        if (listening) {
          this.port = Number(listening[1]);
          this.certSha256 = cert;
          resolveStarted();
        }
      });
      child.once("exit", (code) => reject(new Error(`pi-host exited (${code}) before listening:\n${this.log().slice(-4000)}`)));
    });
    await within(started, "pi-host to listen");
  }

  /** `wss://` with the host's own certificate, or `ws://` for a `--plain` host. */
  get url(): string {
    return `${this.certSha256 ? "wss" : "ws"}://127.0.0.1:${this.port}/racp`;
  }

  /** Client options reaching this host at `url` (itself or a proxy in front of it). */
  options(token: string, url = this.url, extra: Partial<ClientOptions> = {}): ClientOptions {
    return {
      url,
      token,
      transport,
      allowPlainWs: this.certSha256 === undefined,
      ...(this.certSha256 ? { certSha256: this.certSha256 } : {}),
      minBackoffMs: 20,
      maxBackoffMs: 200,
      callTimeoutMs: PATIENCE_MS,
      ...extra,
    };
  }

  /** Runs a `pi-host` admin command against this host. */
  cli(args: string[]): Promise<{ ok: boolean; stdout: string; stderr: string }> {
    return new Promise((resolveCli) => {
      execFile(PI_HOST_BIN, [...args, "--data-dir", this.dataDir], { env: { ...process.env, PI_HOST_LOG: "warn" } }, (error, stdout, stderr) =>
        resolveCli({ ok: error === null, stdout, stderr }),
      );
    });
  }

  /** Mints a pairing token with `pi-host pair --json`: `{token, url, certSha256, ...}`. */
  async pairingToken(extra: string[] = []): Promise<{ token: string; url: string; certSha256?: string }> {
    const { ok, stdout, stderr } = await this.cli(["pair", "--json", ...extra]);
    if (!ok) throw new Error(`pi-host pair failed: ${stdout} ${stderr}`);
    return JSON.parse(stdout.trim());
  }

  /** Pairs a new device through the client's own pairing, from the host's pairing link. */
  async pairDevice(name: string, extra: string[] = []): Promise<PairedDevice> {
    const minted = await this.pairingToken(extra);
    return pair(minted.url, { deviceName: name, transport, allowPlainWs: this.certSha256 === undefined });
  }

  /** A new workspace directory inside the root. */
  workspace(name: string): string {
    const path = join(this.root, name);
    mkdirSync(path, { recursive: true });
    return path;
  }

  log(): string {
    try {
      return readFileSync(this.logFile, "utf8");
    } catch {
      return "";
    }
  }

  /** Kills the host (kill -9) and starts it again on the same data directory (a new port). */
  async restart(): Promise<void> {
    await this.kill();
    await this.spawn();
  }

  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((r) => this.child.once("exit", r));
    this.child.kill("SIGKILL");
    await exited;
  }

  async stop(): Promise<void> {
    await this.kill();
    for (const dir of [this.dataDir, this.root]) rmSync(dir, { recursive: true, force: true });
    rmSync(this.logFile, { force: true });
  }

  /** The host's certificate (PEM), for a browser's SPKI pin. */
  certificatePem(): string {
    return readFileSync(join(this.dataDir, "tls-cert.pem"), "utf8");
  }

  keyPem(): string {
    return readFileSync(join(this.dataDir, "tls-key.pem"), "utf8");
  }
}

/** Connects a client to `host` (or a proxy URL) with a device token. */
export function connectClient(host: HostProcess, token: string, url?: string, extra: Partial<ClientOptions> = {}): Promise<RacpClient> {
  return RacpClient.connect(host.options(token, url, extra));
}

/**
 * A TCP proxy on loopback between a client and a host that can cut every connection, stall
 * (hold) all traffic, or delay it. Its target can change, so a restarted host stays reachable.
 */
export class FaultProxy {
  private readonly pairs = new Set<[Socket, Socket]>();
  private stalled = false;
  private delayMs = 0;
  private batchMs = 0;

  private constructor(
    private readonly server: Server,
    readonly port: number,
    private targetPort: number,
  ) {}

  static async start(targetPort: number): Promise<FaultProxy> {
    const server = createServer();
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no proxy address");
    const proxy = new FaultProxy(server, address.port, targetPort);
    server.on("connection", (client) => proxy.accept(client));
    return proxy;
  }

  /** The proxy's URL for a host that serves TLS (or plain). */
  url(host: HostProcess): string {
    return `${host.certSha256 ? "wss" : "ws"}://127.0.0.1:${this.port}/racp`;
  }

  private accept(client: Socket): void {
    const upstream = connect(this.targetPort, "127.0.0.1");
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    const pair: [Socket, Socket] = [client, upstream];
    this.pairs.add(pair);
    const drop = () => {
      this.pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    for (const socket of pair) {
      socket.on("error", drop);
      socket.on("close", drop);
    }
    this.forward(client, upstream);
    this.forward(upstream, client);
    if (this.stalled) for (const socket of pair) socket.pause();
  }

  /** Copies `from` to `to`, in order, after the current delay; pauses on back-pressure. */
  private forward(from: Socket, to: Socket): void {
    let last = Promise.resolve();
    let batch: Buffer[] | undefined;
    from.on("data", (chunk: Buffer) => {
      if (this.batchMs > 0) {
        // As a TLS-terminating load balancer does: what arrives within the window goes out in
        // one write, so the peer reads several frames (a reply and a push) at once.
        if (batch === undefined) {
          const held: Buffer[] = (batch = []);
          setTimeout(() => {
            batch = undefined;
            if (!to.destroyed) to.write(Buffer.concat(held));
          }, this.batchMs);
        }
        batch.push(chunk);
        return;
      }
      const delay = this.delayMs;
      if (delay === 0) {
        if (!to.write(chunk)) {
          from.pause();
          to.once("drain", () => this.stalled || from.resume());
        }
        return;
      }
      last = last.then(() => new Promise((r) => setTimeout(r, delay))).then(() => {
        if (!to.destroyed) to.write(chunk);
      });
    });
  }

  /** Drops every connection now. */
  cut(): void {
    for (const [client, upstream] of this.pairs) {
      client.destroy();
      upstream.destroy();
    }
    this.pairs.clear();
  }

  /** Holds (or releases) all traffic without closing anything. */
  stall(on: boolean): void {
    this.stalled = on;
    for (const pair of this.pairs) for (const socket of pair) on ? socket.pause() : socket.resume();
  }

  /** Holds what arrives for `ms` and sends it in one write, in both directions (0: off). */
  batch(ms: number): void {
    this.batchMs = ms;
  }

  /** Adds `ms` of latency to every chunk, in both directions (0 removes it). */
  delay(ms: number): void {
    this.delayMs = ms;
  }

  retarget(port: number): void {
    this.targetPort = port;
  }

  close(): void {
    this.cut();
    this.server.close();
  }
}

/** The seq in a cursor; tests only (clients treat cursors as opaque). */
export function cursorSeq(cursor: string): number {
  return Number(cursor.split("-").pop());
}

export function assertContiguous(seqs: number[]): void {
  for (let i = 1; i < seqs.length; i++) {
    if (seqs[i] !== seqs[i - 1]! + 1) throw new Error(`gap or duplicate at ${i}: ${seqs.slice(Math.max(0, i - 3), i + 3).join(",")}`);
  }
}

