// The README's example is examples/quickstart.mjs verbatim, and it runs as written (an ES module in a fresh npm project) against a
// real host: it pairs from a racps:// link, creates a session, prompts, follows the events and
// answers the approval the prompt causes.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { HostProcess, PACKAGE_DIR, REPO_DIR, connectClient, tempDir, within } from "./harness.js";

const EXAMPLE = join(PACKAGE_DIR, "examples/quickstart.mjs");

function run(command: string, args: string[], cwd: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    execFile(command, args, { cwd }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} ${args.join(" ")}: ${error.message}\n${stdout}\n${stderr}`)) : resolve(stdout),
    );
  });
}

test("the README shows examples/quickstart.mjs verbatim", () => {
  const readme = readFileSync(join(REPO_DIR, "README.md"), "utf8");
  const example = readFileSync(EXAMPLE, "utf8");
  assert.ok(readme.includes("```js\n" + example + "```\n"), "README.md must include examples/quickstart.mjs verbatim in a ```js block");
  assert.ok(readme.includes("npm init -y && npm install /path/to/pi-host/clients/ts ws"), "README.md gives the project's set-up");
  assert.ok(example.split("\n").length <= 26, "the example stays short");
});

test("the README example runs as written in a fresh npm project: pair, session, prompt, events, approval", { timeout: 120_000 }, async () => {
  const host = await HostProcess.start();
  try {
    // A new project as `npm init -y` makes it (CommonJS by default), with the README's two
    // packages in node_modules as `npm install /path/to/pi-host/clients/ts ws` puts them (a link
    // to the folder, and ws, taken from the client's own install: tests reach no registry).
    const project = tempDir("quickstart-project");
    await run("npm", ["init", "-y"], project);
    mkdirSync(join(project, "node_modules"));
    symlinkSync(PACKAGE_DIR, join(project, "node_modules/racp-client"));
    symlinkSync(join(PACKAGE_DIR, "node_modules/ws"), join(project, "node_modules/ws"));
    copyFileSync(EXAMPLE, join(project, "quickstart.mjs"));
    const minted = await host.pairingToken();
    const workspace = host.workspace("quickstart");
    // `approve:confirm` makes the stand-in agent ask for a confirmation before its tool runs.
    const output = await within(run(process.execPath, ["quickstart.mjs", minted.url, workspace, "approve:confirm"], project), "the example to finish");
    const types = output.trim().split("\n").map((line) => line.split(" ")[1]);
    for (const type of ["turn.started", "approval.requested", "approval.settled", "turn.finished"]) assert.ok(types.includes(type), `${type} in\n${output}`);
    assert.equal(types.at(-1), "turn.finished");

    // The approval was allowed by the example's device and the tool ran.
    const observer = await host.pairDevice("checker", ["--roles", "observer"]);
    const client = await connectClient(host, observer.token);
    const { sessions } = await client.call("session/list");
    assert.equal(sessions.length, 1);
    const sub = await client.subscribe(sessions[0]!.sessionId, { cursor: sessions[0]!.cursor.replace(/-\d+$/, "-0") });
    const seen: string[] = [];
    for await (const item of sub) {
      if (item.kind !== "event") continue;
      if (item.event.type === "approval.settled") seen.push(`settled:${(item.event.data as { outcome: string }).outcome}`);
      if (item.event.type === "agent.tool_execution_end") seen.push(JSON.stringify(item.event.data).includes("stand-in tool ran") ? "tool ran" : "tool blocked");
      if (item.event.type === "turn.finished") {
        seen.push(`finished:${(item.event.data as { outcome: string }).outcome}`);
        break;
      }
    }
    assert.deepEqual(seen, ["settled:allowed", "tool ran", "finished:completed"]);
    client.close();
  } finally {
    await host.stop();
  }
});
