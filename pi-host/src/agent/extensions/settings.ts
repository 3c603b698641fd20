// pi-host's settings extension (docs/protocol.md §7.19-§7.22): what a desktop set for this
// host's agents, applied when pi starts. pi-host's launcher hands it the contents of two files
// of the host's data directory (which the agent's sandbox hides) on the descriptor named by
// PI_HOST_SETTINGS_FD, read once, at the agent's start, and closed so that nothing the agent
// runs inherits it:
// - credentials.json: provider API keys set with `credential/set`. Each becomes pi's runtime
//   API key for its provider, which pi prefers over the remote user's auth.json and
//   environment (desktop-set wins; the user's own keep working where none is set). The keys
//   stay in this process's memory: nothing here writes them anywhere.
// - providers.json: model servers added with `provider/set`, registered in pi's model
//   registry over a provider of the same name in the user's models.json.
// With PI_HOST_CATALOGUE=1 (the host's one-off catalogue agent, started for `model/list`), it
// also reports every model pi knows with whether its provider has a credential, as one
// `notify` (pi's own channel from an extension to its RPC client). Failures are swallowed:
// pi treats a throwing handler as an error the user sees, and a missing file means none set.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { closeSync, readFileSync } from "node:fs";

type Credential = { apiKey: string };
type CustomModel = {
	id: string;
	name?: string;
	contextWindow?: number;
	maxTokens?: number;
	reasoning?: boolean;
	images?: boolean;
};
type Provider = { baseUrl: string; api: string; requiresKey?: boolean; models: CustomModel[] };

// Sent as the key to a server that needs none; pi wants one for every provider with models.
const NO_KEY = "pi-host-no-key";

// `{"credentials": <credentials.json>, "providers": <providers.json>}`, each null when unset.
function handed(): any {
	const fd = Number(process.env.PI_HOST_SETTINGS_FD);
	if (!Number.isInteger(fd) || fd < 3) return {};
	try {
		return JSON.parse(readFileSync(fd, "utf8")) ?? {};
	} catch {
		return {};
	} finally {
		try {
			closeSync(fd);
		} catch {
			// Already closed.
		}
	}
}

function read<T>(file: any, kind: string): Record<string, T> {
	return file?.version === 1 && typeof file[kind] === "object" ? file[kind] : {};
}

function register(pi: ExtensionAPI, providers: Record<string, Provider>): void {
	for (const [name, provider] of Object.entries(providers)) {
		try {
			pi.registerProvider(name, {
				baseUrl: provider.baseUrl,
				api: provider.api as never,
				apiKey: NO_KEY,
				models: provider.models.map((m) => ({
					id: m.id,
					name: m.name ?? m.id,
					reasoning: m.reasoning === true,
					input: m.images === true ? ["text", "image"] : ["text"],
					contextWindow: m.contextWindow ?? 128000,
					maxTokens: m.maxTokens ?? 16384,
					cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
					// Local model servers rarely know OpenAI's `developer` role.
					compat: { supportsDeveloperRole: false },
				})),
			} as never);
		} catch {
			// A provider pi refuses is left out; the catalogue then does not list it.
		}
	}
}

// The catalogue `model/list` answers with (racp-proto's ModelListResult).
function catalogue(
	registry: any,
	defaultModel: any,
	keys: Set<string>,
	providers: Record<string, Provider>,
	agentAuth: Map<string, boolean>,
) {
	const models = registry.getAll().map((m: any) => ({
		provider: m.provider,
		id: m.id,
		name: m.name ?? m.id,
		contextWindow: m.contextWindow ?? 0,
		maxTokens: m.maxTokens ?? 0,
		reasoning: m.reasoning === true,
		images: Array.isArray(m.input) && m.input.includes("image"),
	}));
	const info = new Map<string, any>();
	for (const m of models) {
		if (info.has(m.provider)) continue;
		const custom = m.provider in providers;
		const host = keys.has(m.provider);
		const agent = !custom && agentAuth.get(m.provider) === true;
		const needsNone = custom && providers[m.provider].requiresKey !== true;
		info.set(m.provider, {
			provider: m.provider,
			credential: host || agent || needsNone,
			credentialSource: host ? "host" : agent ? "agent" : undefined,
			custom,
		});
	}
	return {
		models: models.map((m: any) => ({ ...m, credential: info.get(m.provider).credential })),
		providers: [...info.values()],
		defaultModel: defaultModel ? { provider: defaultModel.provider, id: defaultModel.id } : undefined,
	};
}

export default function (pi: ExtensionAPI) {
	const settings = handed();
	const credentials = read<Credential>(settings.credentials, "credentials");
	const providers = read<Provider>(settings.providers, "providers");
	register(pi, providers);
	pi.on("session_start", (_event, ctx) => {
		try {
			const registry = ctx.modelRegistry as any;
			// Whose key each provider has before the desktop's are applied: the catalogue says
			// where a credential comes from.
			const agentAuth = new Map<string, boolean>();
			if (process.env.PI_HOST_CATALOGUE === "1") {
				for (const m of registry.getAll()) {
					if (!agentAuth.has(m.provider)) agentAuth.set(m.provider, registry.hasConfiguredAuth(m));
				}
			}
			const keys = new Set<string>();
			for (const [provider, credential] of Object.entries(credentials)) {
				if (typeof credential?.apiKey !== "string") continue;
				registry.authStorage.setRuntimeApiKey(provider, credential.apiKey);
				keys.add(provider);
			}
			if (process.env.PI_HOST_CATALOGUE === "1") {
				const result = catalogue(registry, ctx.model, keys, providers, agentAuth);
				ctx.ui.notify(JSON.stringify({ piHostCatalogue: result }), "info");
			}
		} catch {
			// Without them the agent runs on the user's own configuration.
		}
	});
}
