import WebSocket from "ws";
import { RacpClient, eventData, pair } from "racp-client";
import { nodeTransport } from "racp-client/node";

const [link, workspace, prompt] = process.argv.slice(2);
const transport = nodeTransport(WebSocket); // pins the host's certificate from the link

// Pair once, then keep `device` (URL, token, certificate pin) in the OS keychain.
const device = await pair(link, { deviceName: "my-desktop", transport });
const client = await RacpClient.connect({ ...device, transport });

const { session } = await client.call("session/create", { workspace, title: "Quickstart" });
const events = await client.subscribe(session.sessionId, { cursor: session.cursor });
await client.call("turn/start", { sessionId: session.sessionId, idempotencyKey: crypto.randomUUID(), text: prompt });

for await (const item of events) {
  if (item.kind !== "event") continue; // "resynced": replace your view with item.snapshot
  console.log(item.event.seq, item.event.type);
  const approval = eventData(item.event, "approval.requested");
  if (approval) await client.call("approval/respond", { approvalId: approval.approvalId, decision: "allow" });
  if (item.event.type === "turn.finished") break;
}
client.close();
