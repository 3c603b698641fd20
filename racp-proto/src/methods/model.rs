//! `model/list`, `credential/*`, `provider/*`: what a host's agent can run, the provider keys a
//! desktop hands it, and model servers the owner adds (docs/protocol.md §7.19-§7.22). The
//! per-session choice of model and thinking level is `session/configure` (`session.rs`).

use crate::AppError;
use crate::limits::{MAX_API_KEY_CHARS, MAX_CUSTOM_MODELS, MAX_ID_CHARS, MAX_PATH_CHARS};
use crate::validate::{IDENTIFIER_PATTERN, Validate, identifier, invalid, length, range};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model by its provider and the provider's own model id, as pi names it
/// (`provider/id` on pi's command line).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelRef {
    /// The provider, e.g. `anthropic`, `openai`, or one added with `provider/set`.
    #[schemars(length(min = 1, max = MAX_PROVIDER_CHARS), regex(pattern = IDENTIFIER_PATTERN))]
    pub provider: String,
    /// The provider's model id, e.g. `claude-sonnet-4-5`.
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub id: String,
}

/// Longest provider name (characters).
pub const MAX_PROVIDER_CHARS: u64 = 64;

impl ModelRef {
    pub fn check(&self, path: &str) -> Result<(), AppError> {
        identifier(
            &format!("{path}.provider"),
            &self.provider,
            MAX_PROVIDER_CHARS,
        )?;
        length(&format!("{path}.id"), &self.id, 1, MAX_ID_CHARS)?;
        if self.id.chars().any(char::is_control) {
            return Err(invalid(
                &format!("{path}.id"),
                "must not contain control characters",
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider, self.id)
    }
}

/// How much the model reasons before it answers (pi's thinking levels). A model without
/// reasoning ignores it; `xhigh` only some models support (pi uses the highest they have).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingLevel {
    Off,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl ThinkingLevel {
    /// pi's name for it (`set_thinking_level`'s `level`).
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingLevel::Off => "off",
            ThinkingLevel::Minimal => "minimal",
            ThinkingLevel::Low => "low",
            ThinkingLevel::Medium => "medium",
            ThinkingLevel::High => "high",
            ThinkingLevel::Xhigh => "xhigh",
        }
    }
}

/// How pi delivers the messages queued while it works (`set_steering_mode`,
/// `set_follow_up_mode`): every queued message at once, or one per step (pi's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum QueueMode {
    All,
    OneAtATime,
}

impl QueueMode {
    /// pi's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::All => "all",
            QueueMode::OneAtATime => "one-at-a-time",
        }
    }
}

/// One model the host's agent knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    pub provider: String,
    pub id: String,
    /// A name for people.
    pub name: String,
    /// Tokens of context the model takes.
    pub context_window: u64,
    /// Most tokens it writes in one reply.
    pub max_tokens: u64,
    /// It can think before answering (`thinkingLevel` applies).
    pub reasoning: bool,
    /// It takes images with a prompt.
    pub images: bool,
    /// A credential for its provider is present (set from a desktop, or in the remote user's
    /// own pi configuration or environment): a turn on it can reach the provider.
    pub credential: bool,
}

/// A provider the host's agent knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInfo {
    pub provider: String,
    /// A credential is present (see [`ModelInfo::credential`]).
    pub credential: bool,
    /// Where it comes from: `host` (set with `credential/set`, which wins) or `agent` (the
    /// remote user's own pi configuration or environment). Absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_source: Option<CredentialSource>,
    /// Added by an owner with `provider/set`.
    pub custom: bool,
}

/// Where a provider's credential comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CredentialSource {
    /// Set from a desktop with `credential/set`.
    Host,
    /// The remote user's own pi configuration (`~/.pi/agent`) or environment.
    Agent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelListResult {
    /// Every model the agent knows, by provider then id.
    pub models: Vec<ModelInfo>,
    pub providers: Vec<ProviderInfo>,
    /// The model a session without a `model` of its own runs on (pi's default), when there is
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<ModelRef>,
}

/// Sets (or replaces) the API key of a provider. The key is write-only: no reply, event or log
/// ever carries it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialSetParams {
    #[schemars(length(min = 1, max = MAX_PROVIDER_CHARS), regex(pattern = IDENTIFIER_PATTERN))]
    pub provider: String,
    /// The provider's API key, as the provider issued it.
    #[schemars(length(min = 1, max = MAX_API_KEY_CHARS), regex(pattern = API_KEY_PATTERN))]
    pub api_key: String,
}

/// What an API key may hold: printable ASCII without spaces (a key is pasted into a header).
pub const API_KEY_PATTERN: &str = "^[!-~]+$";

/// Never prints the key: a debug log of the call shows its length only.
impl std::fmt::Debug for CredentialSetParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSetParams")
            .field("provider", &self.provider)
            .field(
                "api_key",
                &format_args!("[{} characters]", self.api_key.len()),
            )
            .finish()
    }
}

impl Validate for CredentialSetParams {
    fn validate(&self) -> Result<(), AppError> {
        identifier("provider", &self.provider, MAX_PROVIDER_CHARS)?;
        length("apiKey", &self.api_key, 1, MAX_API_KEY_CHARS)?;
        if !self.api_key.bytes().all(|b| b.is_ascii_graphic()) {
            // The reason never repeats the value.
            return Err(invalid(
                "apiKey",
                "must be printable ASCII without spaces or line breaks",
            ));
        }
        Ok(())
    }
}

/// A stored credential, without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialInfo {
    pub provider: String,
    /// When it was set (ms since the Unix epoch).
    pub set_at: u64,
    /// `sha256:` and the first 8 hex digits of the key's SHA-256: enough to tell two keys
    /// apart, nothing to recover one from.
    pub fingerprint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialSetResult {
    pub credential: CredentialInfo,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialListResult {
    pub credentials: Vec<CredentialInfo>,
}

/// Names one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderRef {
    #[schemars(length(min = 1, max = MAX_PROVIDER_CHARS), regex(pattern = IDENTIFIER_PATTERN))]
    pub provider: String,
}

impl Validate for ProviderRef {
    fn validate(&self) -> Result<(), AppError> {
        identifier("provider", &self.provider, MAX_PROVIDER_CHARS)
    }
}

/// Whether a delete found something to delete (deleting again is not an error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub deleted: bool,
}

/// The wire API a custom provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderApi {
    /// `POST {baseUrl}/chat/completions` (llama.cpp, vLLM, Ollama, LM Studio, ...).
    OpenaiCompletions,
    /// OpenAI's Responses API, `POST {baseUrl}/responses`.
    OpenaiResponses,
}

impl ProviderApi {
    /// pi's name for it (`api` in its models configuration).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderApi::OpenaiCompletions => "openai-completions",
            ProviderApi::OpenaiResponses => "openai-responses",
        }
    }
}

/// Adds (or replaces) an OpenAI-compatible provider: a model server on the remote's network.
/// It is registered in the agent's model registry at the next agent start, before the remote
/// user's own configuration of a provider with the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderSetParams {
    #[schemars(length(min = 1, max = MAX_PROVIDER_CHARS), regex(pattern = IDENTIFIER_PATTERN))]
    pub provider: String,
    /// The API's base URL as the agent reaches it, e.g. `http://127.0.0.1:8080/v1`
    /// (`http` or `https`; no credentials in it: set a key with `credential/set`).
    #[schemars(length(min = 1, max = MAX_PATH_CHARS))]
    pub base_url: String,
    pub api: ProviderApi,
    /// Whether its server wants an API key (`credential/set`). Without one the agent sends a
    /// placeholder, which servers run without keys ignore. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_key: bool,
    /// The models it serves, at least one.
    #[schemars(length(min = 1, max = MAX_CUSTOM_MODELS))]
    pub models: Vec<CustomModel>,
}

/// A model of a custom provider. Unset numbers take pi's defaults (128 000 tokens of context,
/// 16 384 out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomModel {
    /// The id the server knows it by (sent as the request's `model`).
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_MODEL_TOKENS))]
    pub context_window: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_MODEL_TOKENS))]
    pub max_tokens: Option<u64>,
    /// It reasons (`thinkingLevel` is sent as the request's `reasoning_effort`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reasoning: bool,
    /// It takes images.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub images: bool,
}

/// The largest token count a custom model may declare.
pub const MAX_MODEL_TOKENS: u64 = 100_000_000;

impl Validate for ProviderSetParams {
    fn validate(&self) -> Result<(), AppError> {
        identifier("provider", &self.provider, MAX_PROVIDER_CHARS)?;
        length("baseUrl", &self.base_url, 1, MAX_PATH_CHARS)?;
        check_base_url(&self.base_url)?;
        if self.models.is_empty() || self.models.len() as u64 > MAX_CUSTOM_MODELS {
            return Err(invalid(
                "models",
                format!("must list between 1 and {MAX_CUSTOM_MODELS} models"),
            ));
        }
        for (i, model) in self.models.iter().enumerate() {
            let at = |field: &str| format!("models.{i}.{field}");
            length(&at("id"), &model.id, 1, MAX_ID_CHARS)?;
            if model.id.chars().any(char::is_control) {
                return Err(invalid(&at("id"), "must not contain control characters"));
            }
            if let Some(name) = &model.name {
                crate::validate::name(&at("name"), name, 1, MAX_ID_CHARS)?;
            }
            for (field, value) in [
                ("contextWindow", model.context_window),
                ("maxTokens", model.max_tokens),
            ] {
                if let Some(value) = value {
                    range(&at(field), value, 1, MAX_MODEL_TOKENS)?;
                }
            }
        }
        Ok(())
    }
}

/// An `http`/`https` URL with a host and no userinfo: a key in the URL would be stored and
/// shown; it belongs in `credential/set`.
fn check_base_url(url: &str) -> Result<(), AppError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| invalid("baseUrl", "must start with http:// or https://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(invalid("baseUrl", "must name a host"));
    }
    if authority.contains('@') {
        return Err(invalid(
            "baseUrl",
            "must not carry credentials; set the provider's key with credential/set",
        ));
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            "baseUrl",
            "must be a plain URL: no query, fragment or spaces",
        ));
    }
    Ok(())
}

/// What a session runs with, where a client chose it; each absent field is the agent's own
/// default (the remote user's pi settings).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_level: Option<ThinkingLevel>,
    /// Whether the agent compacts its context by itself when it is nearly full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compaction: Option<bool>,
    /// How the agent delivers steering messages queued while it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering_mode: Option<QueueMode>,
    /// How the agent delivers follow-ups queued while it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up_mode: Option<QueueMode>,
    /// What the agent may do without asking (docs/protocol.md, "Permissions"); absent: the
    /// host's default (`--permission-mode`, `ask` unless configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<crate::permission::PermissionMode>,
}

impl SessionSettings {
    /// `self` with every field `change` sets replaced.
    pub fn with(&self, change: &SessionSettings) -> SessionSettings {
        SessionSettings {
            model: change.model.clone().or_else(|| self.model.clone()),
            thinking_level: change.thinking_level.or(self.thinking_level),
            auto_compaction: change.auto_compaction.or(self.auto_compaction),
            steering_mode: change.steering_mode.or(self.steering_mode),
            follow_up_mode: change.follow_up_mode.or(self.follow_up_mode),
            permission_mode: change.permission_mode.or(self.permission_mode),
        }
    }

    pub fn is_empty(&self) -> bool {
        self == &SessionSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(base_url: &str) -> ProviderSetParams {
        ProviderSetParams {
            provider: "local".into(),
            base_url: base_url.into(),
            api: ProviderApi::OpenaiCompletions,
            requires_key: false,
            models: vec![CustomModel {
                id: "qwen".into(),
                name: None,
                context_window: None,
                max_tokens: None,
                reasoning: false,
                images: false,
            }],
        }
    }

    #[test]
    fn base_urls_are_plain_http_urls_without_credentials() {
        for ok in [
            "http://127.0.0.1:8080/v1",
            "https://llm.lan/v1",
            "http://[::1]:1/",
        ] {
            assert!(provider(ok).validate().is_ok(), "{ok}");
        }
        for bad in [
            "ftp://x/v1",
            "http://",
            "http://user:pw@host/v1",
            "https://host/v1?key=abc",
            "http://host/v 1",
            "127.0.0.1:8080",
        ] {
            assert!(provider(bad).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_key_is_never_printed_or_echoed() {
        let params = CredentialSetParams {
            provider: "openai".into(),
            api_key: "sk-secret-value-1234567890".into(),
        };
        assert!(!format!("{params:?}").contains("secret"));
        let bad = CredentialSetParams {
            provider: "openai".into(),
            api_key: "sk-secret value".into(),
        };
        let err = bad.validate().unwrap_err();
        assert!(!serde_json::to_string(&err).unwrap().contains("secret"));
    }
}
