// The client in a real browser: Debian's Chromium, driven by playwright-core (which downloads
// nothing), loads the tsc output as ES modules from a tiny static server and talks to a real
// host over TLS. Chromium cannot be given a pin from script, so it is launched with the host's
// key pinned by SPKI (--ignore-certificate-errors-spki-list): it accepts that key and no other.

import assert from "node:assert/strict";
import { X509Certificate, createHash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { extname, join, normalize } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { RacpClient, RacpError } from "../src/index.js";
import { nodeTransport } from "../src/node.js";
import { FaultProxy, HostProcess, PACKAGE_DIR, assertContiguous, tempDir, within } from "./harness.js";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(PACKAGE_DIR, "test-artifacts");
const TYPES: Record<string, string> = { ".html": "text/html", ".js": "text/javascript", ".map": "application/json" };

/** Serves the package directory: `/` is the test page, `/dist/...` the compiled modules. */
async function staticServer(): Promise<{ server: Server; origin: string }> {
  const server = createServer((request, response) => {
    const path = new URL(request.url ?? "/", "http://x").pathname;
    const file = path === "/" ? join(PACKAGE_DIR, "test/browser/page.html") : normalize(join(PACKAGE_DIR, path));
    if (!file.startsWith(PACKAGE_DIR) || !existsSync(file) || !(path === "/" || path.startsWith("/dist/"))) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    createReadStream(file).pipe(response);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, origin: `http://127.0.0.1:${(server.address() as { port: number }).port}` };
}

/** Base64 SHA-256 of the certificate's SubjectPublicKeyInfo, as Chromium's SPKI list wants it. */
function spkiSha256(pem: string): string {
  const spki = new X509Certificate(pem).publicKey.export({ type: "spki", format: "der" });
  return createHash("sha256").update(spki).digest("base64");
}

async function openPage(context: BrowserContext, origin: string): Promise<Page> {
  const page = await context.newPage();
  await page.goto(origin + "/");
  await page.waitForFunction(() => document.getElementById("state")?.textContent === "ready");
  page.on("console", (message) => console.log(`[chromium] ${message.text()}`));
  return page;
}

test("in Chromium: browser-form auth, the Origin allowlist, a session streamed across a cut", { timeout: 120_000 }, async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing (scripts/test installs Debian's chromium)`);
  const allowed = await staticServer();
  const foreign = await staticServer();
  const host = await HostProcess.start(["--allow-origin", allowed.origin]);
  const proxy = await FaultProxy.start(host.port);
  const profile = tempDir("chromium");
  let context: BrowserContext | undefined;
  try {
    // The same Origin rule seen from Node, where the refusal's body is readable.
    const minted = await host.pairingToken();
    const device = await host.pairDevice("node");
    for (const [origin, expected] of [
      [allowed.origin, "connected"],
      [foreign.origin, "FORBIDDEN"],
    ] as const) {
      const outcome = await RacpClient.connect({ ...host.options(device.token), transport: nodeTransport(WebSocket, { origin }) }).then(
        (client) => {
          client.close();
          return "connected";
        },
        (error: unknown) => {
          assert.ok(error instanceof RacpError);
          assert.deepEqual(error.details, { reason: "origin_not_allowed" });
          return error.code;
        },
      );
      assert.equal(outcome, expected, origin);
    }

    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        `--ignore-certificate-errors-spki-list=${spkiSha256(host.certificatePem())}`,
      ],
    });
    const proxyUrl = proxy.url(host);

    // A page from an Origin the host does not list cannot connect (the browser sees only a failure).
    const stranger = await openPage(context, foreign.origin);
    const refused = await stranger.evaluate(([link, url]) => window.racpTest.pairAndConnect(link, url), [minted.url, proxyUrl] as const);
    assert.equal(refused.ok, false);
    assert.ok(!refused.ok && refused.code === "REMOTE_CONNECTION_FAILED", JSON.stringify(refused));
    await stranger.close();

    // The allowed Origin pairs from the racps:// link (token in the racp.bearer. subprotocol).
    const page = await openPage(context, allowed.origin);
    const connected = await page.evaluate(([link, url]) => window.racpTest.pairAndConnect(link, url), [minted.url, proxyUrl] as const);
    assert.ok(connected.ok, JSON.stringify(connected));
    // A page that closes with 1000 sees 1000: the host answers its close frame.
    assert.equal(await page.evaluate(([url]) => window.racpTest.closeCode(url), [proxyUrl] as const), 1000);
    const started = await page.evaluate(([workspace]) => window.racpTest.startTurn(workspace, "deltas:300:3"), [host.workspace("b")] as const);
    assert.ok(started.ok, JSON.stringify(started));
    const before = await page.evaluate(() => window.racpTest.readEvents(40));
    assert.equal(before.seqs.length, 40);

    await page.evaluate(() => window.racpTest.markCut());
    proxy.cut();
    const after = await within(page.evaluate(() => window.racpTest.readEvents(100_000)), "the turn in the browser");
    assert.ok(after.finished, "turn.finished arrived");
    assert.ok(!after.resynced);
    assert.equal(after.seqs[0], 1);
    assertContiguous(after.seqs);
    assert.ok(after.seqs.length > 300, `${after.seqs.length} events`);
    // The last events can arrive while the client is still settling (on a loaded machine a
    // heartbeat may even make it reconnect once more): wait for it to be connected.
    const state = await within(
      (async () => {
        for (;;) {
          const now = await page.evaluate(() => window.racpTest.state());
          if (now.status === "connected") return now;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      })(),
      "the page to be connected again",
    );
    assert.equal(state.status, "connected");
    assert.ok(state.reconnects >= 1, "the cut made the page reconnect");

    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, "browser-session.png"), fullPage: true });
    console.log(`browser: ${after.seqs.length} events in order across a cut; screenshot in test-artifacts/browser-session.png`);
  } finally {
    await context?.close();
    proxy.close();
    await host.stop();
    allowed.server.close();
    foreign.server.close();
    rmSync(profile, { recursive: true, force: true });
  }
});
