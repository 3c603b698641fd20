//! `pi-remote models`, `credentials set|list|delete` and `configure`: what the host's agent can
//! run, the provider keys it is given (owner only) and a session's model settings.

use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use racp_proto::client::RacpClient;
use racp_proto::methods::model::{
    CredentialSetParams, ModelRef, ProviderRef, QueueMode, ThinkingLevel,
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

/// Lists models: `PROVIDER/MODEL  CONTEXT  [thinking] [images]  key|no key`, the default marked.
pub async fn list(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::ModelList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
        return Ok(());
    }
    for m in &list.models {
        let default = list
            .default_model
            .as_ref()
            .is_some_and(|d| d.provider == m.provider && d.id == m.id);
        let mut traits = Vec::new();
        if m.reasoning {
            traits.push("thinking");
        }
        if m.images {
            traits.push("images");
        }
        out.line(&format!(
            "{}/{}\t{}k\t{}\t{}{}",
            printable(&m.provider, false),
            printable(&m.id, false),
            m.context_window / 1000,
            if traits.is_empty() {
                "-".to_string()
            } else {
                traits.join(",")
            },
            if m.credential { "key" } else { "no key" },
            if default { "\t(default)" } else { "" }
        ));
    }
    Ok(())
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

/// Lists the keys set from clients: `PROVIDER  FINGERPRINT  SET-AT(ms)`.
pub async fn credentials(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::CredentialList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
    } else if list.credentials.is_empty() {
        out.line("no credentials set");
    } else {
        for c in &list.credentials {
            out.line(&format!(
                "{}\t{}\t{}",
                printable(&c.provider, false),
                c.fingerprint,
                c.set_at
            ));
        }
    }
    Ok(())
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
