// pi-host's pi extension (docs/architecture.md, "Agent lifecycle", "Preload"): pi loads its
// model provider's code (the provider SDK) and Node's fetch only when its first prompt asks for
// them, which costs that prompt about 100 ms. This loads both when pi starts instead, so a warm
// agent answers its first prompt as fast as the later ones. It sends nothing to any model,
// writes nothing to the session and says nothing: pi treats a throwing handler as an error the
// user sees, so every failure here is swallowed (the prompt then loads what it needs itself).
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

// The module pi-ai imports on first use for each model API (its package's public exports).
const PROVIDER_MODULES: Record<string, string> = {
	"anthropic-messages": "anthropic",
	"azure-openai-responses": "azure-openai-responses",
	"google-generative-ai": "google",
	"google-vertex": "google-vertex",
	"mistral-conversations": "mistral",
	"openai-codex-responses": "openai-codex-responses",
	"openai-completions": "openai-completions",
	"openai-responses": "openai-responses",
};

async function preload(api: string | undefined): Promise<void> {
	const name = api === undefined ? undefined : PROVIDER_MODULES[api];
	if (name !== undefined) {
		// pi resolves `@mariozechner/pi-ai` for its extensions to its own copy; the provider
		// module next to that copy's entry is the very module (same URL) the first prompt imports.
		const entry = import.meta.resolve("@mariozechner/pi-ai");
		await import(new URL(`providers/${name}.js`, entry).href);
	}
	// Node sets up its fetch on first use; a `data:` URL does that without any network.
	await (await fetch("data:,")).arrayBuffer();
}

export default function (pi: ExtensionAPI) {
	// Awaited, so pi answers its first command (pi-host's warm start sends `get_state`) once this
	// is done too; a prompt that comes sooner waits for the same work it would do itself.
	const start = (api: string | undefined) => preload(api).catch(() => undefined);
	pi.on("session_start", (_event, ctx) => start(ctx.model?.api));
	pi.on("model_select", (event) => start(event.model?.api));
}
