// pi-host's permissions extension (docs/protocol.md, "Permissions"): before each tool call,
// asks the host whether it may run, and blocks it when the host says no. The policy is the
// host's (pi-host/src/policy/); this is only its bridge. The question goes out as an `editor`
// dialog with a reserved title and the call as JSON (pi's RPC mode relays both); the host
// answers it itself, nobody sees it, and the answer is the decision as JSON. Only what the
// policy needs travels: a write's size, never its content.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

const TITLE = "pi-host.policy.v1";

type Call = {
	tool: string;
	toolCallId: string;
	cwd: string;
	path?: string;
	command?: string;
	bytes?: number;
	edits?: number;
};

function summarise(tool: string, toolCallId: string, input: any, cwd: string): Call {
	const call: Call = { tool, toolCallId, cwd };
	if (typeof input?.path === "string") call.path = input.path;
	if (tool === "bash" && typeof input?.command === "string") call.command = input.command;
	if (tool === "write" && typeof input?.content === "string") {
		call.bytes = Buffer.byteLength(input.content, "utf8");
	}
	if (tool === "edit") call.edits = Array.isArray(input?.edits) ? input.edits.length : 1;
	return call;
}

// The refusal the model reads when the host gives no usable answer (its approval was
// cancelled, or the agent runs outside pi-host).
const NO_ANSWER = "TOOL_DENIED: pi-host's permission policy gave no answer (the turn ended or the approval was cancelled)";

export default function (pi: ExtensionAPI) {
	pi.on("tool_call", async (event, ctx) => {
		const call = summarise(event.toolName, event.toolCallId, event.input, ctx.cwd);
		let answer: string | undefined;
		try {
			answer = await ctx.ui.editor(TITLE, JSON.stringify(call));
		} catch {
			answer = undefined;
		}
		let decision: { allow?: boolean; message?: string } = {};
		try {
			decision = answer === undefined ? {} : JSON.parse(answer);
		} catch {
			decision = {};
		}
		if (decision.allow === true) return undefined;
		return { block: true, reason: typeof decision.message === "string" ? decision.message : NO_ANSWER };
	});
}
