// A pi extension for pi-host's end-to-end test (pi-host/tests/real_pi.rs): every tool call needs
// the user's confirmation. In `--mode rpc` the confirm dialog becomes an `extension_ui_request`
// (method "confirm") on pi's stdout, which pi-host turns into an RACP-WS approval.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function (pi: ExtensionAPI) {
	pi.on("tool_call", async (event, ctx) => {
		const details = JSON.stringify(event.input);
		const allowed = await ctx.ui.confirm(`Allow ${event.toolName}?`, details);
		if (!allowed) {
			return { block: true, reason: `The user refused ${event.toolName}` };
		}
		return undefined;
	});
}
