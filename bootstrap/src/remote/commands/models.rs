//! `pi-remote models`, `credentials set|list|delete` and `configure`: what the host's agent can
//! run, the provider keys it is given (owner only) and a session's model settings.

use crate::remote::Failure;
use crate::remote::out::{Out, aligned, enum_name, now_ms};
use racp_proto::client::RacpClient;
use racp_proto::methods::model::{
    CredentialInfo, CredentialSetParams, ModelInfo, ModelRef, ProviderRef, QueueMode, ThinkingLevel,
};
use racp_proto::methods::session::SessionConfigureParams;
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};
use serde_json::json;
use std::io::{BufRead, IsTerminal};

/// `PROVIDER/MODEL` as pi names a model, e.g. `anthropic/claude-sonnet-4-5`.
pub fn parse_model(text: &str) -> Result<ModelRef, String> {
    match text.split_once('/') {
        Some((provider, id)) if !provider.is_empty() && !id.is_empty() => Ok(ModelRef {
            provider: provider.to_string(),
            id: id.to_string(),
        }),
        _ => Err(format!(
            "{text:?} is not PROVIDER/MODEL (pi-remote models lists them)"
        )),
    }
}

/// A thinking level by pi's name (`off` … `xhigh`).
pub fn parse_thinking(text: &str) -> Result<ThinkingLevel, String> {
    serde_json::from_value(json!(text))
        .map_err(|_| format!("{text:?} is not one of off, minimal, low, medium, high, xhigh"))
}

/// A permission mode: `ask`, `accept-edits`, `auto` or `plan` (docs/protocol.md, "Permissions").
pub fn parse_permission_mode(text: &str) -> Result<racp_proto::permission::PermissionMode, String> {
    racp_proto::permission::PermissionMode::from_name(text)
        .ok_or_else(|| format!("{text:?} is not one of ask, accept-edits, auto, plan"))
}

/// A queue mode: `all` or `one-at-a-time`.
pub fn parse_queue_mode(text: &str) -> Result<QueueMode, String> {
    serde_json::from_value(json!(text)).map_err(|_| format!("{text:?} is not all or one-at-a-time"))
}

/// Which models `pi-remote models` shows: `FILTER` (a substring of the provider, id or name, in
/// any case) and `--provider` (exactly that provider).
#[derive(Debug, Default, Clone)]
pub struct ModelFilter {
    pub text: Option<String>,
    pub provider: Option<String>,
}

impl ModelFilter {
    fn keeps(&self, m: &ModelInfo) -> bool {
        let text = self.text.as_deref().map(str::to_lowercase);
        let matches = |field: &str| {
            text.as_ref()
                .is_none_or(|t| field.to_lowercase().contains(t))
        };
        self.provider.as_ref().is_none_or(|p| m.provider == *p)
            && (matches(&m.provider) || matches(&m.id) || matches(&m.name))
    }

    fn is_empty(&self) -> bool {
        self.text.is_none() && self.provider.is_none()
    }
}

/// Lists models as aligned columns (model, name, context, traits, key, the default marked), or
/// the list as JSON; either only the models `filter` keeps.
pub async fn list(out: &Out, client: &RacpClient, filter: &ModelFilter) -> Result<(), Failure> {
    let mut list = client.call::<calls::ModelList>(Empty {}).await?;
    let all = list.models.len();
    list.models.retain(|m| filter.keeps(m));
    if out.json {
        out.json_value(&list);
        return Ok(());
    }
    if list.models.is_empty() {
        out.note(&format!(
            "no model matches (the host's agent knows {all}; `pi-remote models` lists them all)"
        ));
        return Ok(());
    }
    for line in model_table(&list.models, list.default_model.as_ref()) {
        out.line(&line);
    }
    if !filter.is_empty() {
        out.note(&format!("{} of {all} models", list.models.len()));
    }
    Ok(())
}

/// `MODEL  NAME  CONTEXT  CAN  KEY`, one model a line, the default marked.
pub fn model_table(models: &[ModelInfo], default: Option<&ModelRef>) -> Vec<String> {
    let rows: Vec<[String; 6]> = models
        .iter()
        .map(|m| {
            let is_default = default.is_some_and(|d| d.provider == m.provider && d.id == m.id);
            let traits: Vec<&str> = [(m.reasoning, "thinking"), (m.images, "images")]
                .into_iter()
                .filter_map(|(has, word)| has.then_some(word))
                .collect();
            [
                format!(
                    "{}/{}",
                    printable(&m.provider, false),
                    printable(&m.id, false)
                ),
                printable(&m.name, false).into_owned(),
                format!("{}k", m.context_window / 1000),
                if traits.is_empty() {
                    "-".into()
                } else {
                    traits.join(",")
                },
                if m.credential { "key" } else { "no key" }.into(),
                if is_default { "default" } else { "" }.into(),
            ]
        })
        .collect();
    aligned(["MODEL", "NAME", "CONTEXT", "CAN", "KEY", ""], &rows)
}

/// Sets a provider's key, read from stdin (one line) or typed without echo: never an argument,
/// which other users of the machine could read in the process list.
pub async fn set(out: &Out, client: &RacpClient, provider: String) -> Result<(), Failure> {
    let api_key = read_key(&provider)?;
    let result = client
        .call::<calls::CredentialSet>(CredentialSetParams { provider, api_key })
        .await?;
    if out.json {
        out.json_value(&result.credential);
    } else {
        out.line(&format!(
            "set {} ({})",
            printable(&result.credential.provider, false),
            result.credential.fingerprint
        ));
    }
    Ok(())
}

fn read_key(provider: &str) -> Result<String, Failure> {
    let key = if std::io::stdin().is_terminal() {
        crate::ssh::prompt::ask_secret(&format!("API key for {provider}: "))
            .ok_or_else(|| Failure::local("no key typed"))?
    } else {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| Failure::local(format!("cannot read the key from stdin: {e}")))?;
        line
    };
    let key = key.trim().to_string();
    if key.is_empty() {
        return Err(Failure::local(
            "no key given: type it at the prompt, or pipe it on stdin",
        ));
    }
    Ok(key)
}

/// Lists the keys set from clients: `PROVIDER  FINGERPRINT  SET` (when, as "2 h ago (...)"; the
/// JSON keeps `setAt` in ms).
pub async fn credentials(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::CredentialList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
    } else if list.credentials.is_empty() {
        out.line("no credentials set");
    } else {
        for line in credential_table(&list.credentials, now_ms()) {
            out.line(&line);
        }
    }
    Ok(())
}

fn credential_table(credentials: &[CredentialInfo], now: u64) -> Vec<String> {
    let rows: Vec<[String; 3]> = credentials
        .iter()
        .map(|c| {
            [
                printable(&c.provider, false).into_owned(),
                c.fingerprint.clone(),
                racp_proto::human::moment(c.set_at, now),
            ]
        })
        .collect();
    aligned(["PROVIDER", "FINGERPRINT", "SET"], &rows)
}

pub async fn delete(out: &Out, client: &RacpClient, provider: String) -> Result<(), Failure> {
    let result = client
        .call::<calls::CredentialDelete>(ProviderRef {
            provider: provider.clone(),
        })
        .await?;
    if out.json {
        out.json_value(&result);
    } else if result.deleted {
        out.line(&format!("deleted {}", printable(&provider, false)));
    } else {
        out.line(&format!("{} had no key set", printable(&provider, false)));
    }
    Ok(())
}

/// Changes a session's model, thinking level or auto-compaction and prints what it runs with.
pub async fn configure(
    out: &Out,
    client: &RacpClient,
    params: SessionConfigureParams,
) -> Result<(), Failure> {
    let result = client.call::<calls::SessionConfigure>(params).await?;
    if out.json {
        out.json_value(&result.session);
        return Ok(());
    }
    let settings = &result.session.settings;
    let model = settings
        .model
        .as_ref()
        .map_or("the agent's default".to_string(), ModelRef::to_string);
    let thinking = settings.thinking_level.map_or("default", |l| l.as_str());
    let compaction = settings
        .auto_compaction
        .map_or("default", |on| if on { "on" } else { "off" });
    let steering = settings.steering_mode.map_or("default", |m| m.as_str());
    let follow_up = settings.follow_up_mode.map_or("default", |m| m.as_str());
    let mode = settings.permission_mode.map_or("default", |m| m.as_str());
    out.line(&format!(
        "{}\t{}\tmodel={}\tthinking={thinking}\tauto-compaction={compaction}\t\
         steering={steering}\tfollow-up={follow_up}\tmode={mode}",
        printable(&result.session.session_id, false),
        enum_name(&result.session.state),
        printable(&model, false),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(provider: &str, id: &str, name: &str, context: u64, credential: bool) -> ModelInfo {
        ModelInfo {
            provider: provider.into(),
            id: id.into(),
            name: name.into(),
            context_window: context,
            max_tokens: 8192,
            reasoning: provider == "anthropic",
            images: id.contains("vision"),
            credential,
        }
    }

    fn models() -> Vec<ModelInfo> {
        vec![
            model(
                "anthropic",
                "claude-sonnet-4-5",
                "Claude Sonnet 4.5",
                200_000,
                true,
            ),
            model("openai", "gpt-4o", "GPT-4o", 128_000, false),
            model(
                "openrouter",
                "meta/llama-vision",
                "Llama Vision (Claude-free)",
                8_000,
                false,
            ),
        ]
    }

    #[test]
    fn models_are_aligned_columns_with_the_default_marked() {
        let default = ModelRef {
            provider: "openai".into(),
            id: "gpt-4o".into(),
        };
        let lines = model_table(&models(), Some(&default));
        assert_eq!(
            lines,
            [
                "MODEL                         NAME                        CONTEXT  CAN       KEY",
                "anthropic/claude-sonnet-4-5   Claude Sonnet 4.5           200k     thinking  key",
                "openai/gpt-4o                 GPT-4o                      128k     -         no key  default",
                "openrouter/meta/llama-vision  Llama Vision (Claude-free)  8k       images    no key",
            ]
        );
        assert!(lines.iter().all(|l| !l.contains('\t')));
    }

    #[test]
    fn a_filter_matches_provider_id_or_name_in_any_case_and_provider_exactly() {
        let kept = |text: Option<&str>, provider: Option<&str>| -> Vec<String> {
            let filter = ModelFilter {
                text: text.map(String::from),
                provider: provider.map(String::from),
            };
            models()
                .into_iter()
                .filter(|m| filter.keeps(m))
                .map(|m| m.id)
                .collect()
        };
        assert_eq!(kept(None, None).len(), 3);
        // "claude" is in an id and in a name; "OPENR" in a provider, any case.
        assert_eq!(
            kept(Some("CLAUDE"), None),
            ["claude-sonnet-4-5", "meta/llama-vision"]
        );
        assert_eq!(kept(Some("openr"), None), ["meta/llama-vision"]);
        assert_eq!(
            kept(Some("claude"), Some("anthropic")),
            ["claude-sonnet-4-5"]
        );
        // --provider is the whole name, not a part of it.
        assert!(kept(None, Some("open")).is_empty());
        assert_eq!(kept(None, Some("openai")), ["gpt-4o"]);
    }

    #[test]
    fn credentials_read_as_moments_not_milliseconds() {
        let now = 1_796_169_600_000; // 2026-12-02 00:00 UTC
        let credentials = [CredentialInfo {
            provider: "openai".into(),
            set_at: now - 2 * 3_600_000,
            fingerprint: "sha256:0123abcd".into(),
        }];
        let lines = credential_table(&credentials, now);
        assert_eq!(
            lines,
            [
                "PROVIDER  FINGERPRINT      SET",
                "openai    sha256:0123abcd  2 h ago (2026-12-01 22:00 UTC)",
            ]
        );
    }
}
