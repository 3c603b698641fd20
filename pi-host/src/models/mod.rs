//! What a desktop sets for the host's agents (docs/protocol.md §7.19-§7.22): provider keys
//! (`credentials.rs`), model servers (`providers.rs`), and the catalogue of models the agent
//! can run (`catalogue.rs`). Changes apply to the next agent started: each change bumps a
//! generation, an idle agent started before it is replaced when it is next used, and a running
//! turn keeps its agent until it ends (`driver::Driver::ensure_agent`).

mod catalogue;
mod credentials;
mod file;
mod providers;

pub use credentials::Credentials;
pub use file::FileError;
pub use providers::Providers;

use racp_proto::limits::MAX_PROVIDERS;
use racp_proto::methods::model::{
    CredentialListResult, CredentialSetParams, CredentialSetResult, Deleted, ModelListResult,
    ModelRef, ProviderSetParams,
};
use racp_proto::{Ack, AppError, ErrorCode};
use racp_server::clock::now_ms;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the models need of the host (state.rs implements it): its settings and files, and how
/// to start the one-off agent that lists the catalogue.
pub trait ModelHost: Send + Sync + 'static {
    fn models(&self) -> &Models;
    fn config(&self) -> &crate::config::ServeConfig;
    fn agent(&self) -> &crate::agent::check::AgentCheck;
    fn agent_command(&self, resume: bool) -> String;
    fn agent_options(&self) -> crate::agent::AgentOptions;
}

/// A shared host is a host.
impl<T: ModelHost> ModelHost for Arc<T> {
    fn models(&self) -> &Models {
        (**self).models()
    }
    fn config(&self) -> &crate::config::ServeConfig {
        (**self).config()
    }
    fn agent(&self) -> &crate::agent::check::AgentCheck {
        (**self).agent()
    }
    fn agent_command(&self, resume: bool) -> String {
        (**self).agent_command(resume)
    }
    fn agent_options(&self) -> crate::agent::AgentOptions {
        (**self).agent_options()
    }
}

pub struct Models {
    pub credentials: Credentials,
    pub providers: Providers,
    catalogue: catalogue::Catalogue,
    generation: AtomicU64,
}

impl Models {
    /// `redactor` learns the provider keys, to scrub them from what the agents write.
    pub fn open(
        data_dir: &std::path::Path,
        redactor: crate::redact::Redactor,
    ) -> Result<Models, FileError> {
        Ok(Models {
            credentials: Credentials::open(data_dir, redactor)?,
            providers: Providers::open(data_dir)?,
            catalogue: catalogue::Catalogue::default(),
            generation: AtomicU64::new(0),
        })
    }

    /// Bumped by every change of keys or providers: an agent started at an older generation
    /// runs on old settings.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A provider added with `provider/set` that wants a key and has none.
    pub fn lacks_key(&self, provider: &str) -> bool {
        self.providers.requires_key(provider) && !self.credentials.has(provider)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// `model/list`. A caller who may not start agents (an observer) gets the catalogue the host
/// last made, whatever its age, and never has an agent started for it (docs/protocol.md §6.1).
pub async fn list(
    host: &impl ModelHost,
    may_start_agents: bool,
) -> Result<Arc<ModelListResult>, AppError> {
    if may_start_agents {
        return host.models().catalogue.get(host, false).await;
    }
    host.models().catalogue.last().await.ok_or_else(|| {
        AppError::new(
            ErrorCode::Conflict,
            "the host has not listed its models yet, and an observer starts no agent to list \
             them: call it again once an operator has used the host, or from a device with the \
             operator role",
        )
        .with_retriable(false)
        .with_details(json!({"reason": "agent_not_running"}))
    })
}

/// Refuses a model the agent does not know (MODEL_NOT_CONFIGURED) or whose provider has no
/// credential (PROVIDER_SECRET_MISSING). A refusal asks the agent again first: the catalogue
/// may predate the remote user's own change.
pub async fn check(host: &impl ModelHost, model: &ModelRef) -> Result<(), AppError> {
    let cached = host.models().catalogue.get(host, false).await?;
    if verdict(&cached, model).is_ok() {
        return Ok(());
    }
    let fresh = host.models().catalogue.get(host, true).await?;
    verdict(&fresh, model)
}

fn verdict(list: &ModelListResult, model: &ModelRef) -> Result<(), AppError> {
    let Some(found) = list
        .models
        .iter()
        .find(|m| m.provider == model.provider && m.id == model.id)
    else {
        let known: Vec<&str> = list
            .models
            .iter()
            .filter(|m| m.provider == model.provider)
            .map(|m| m.id.as_str())
            .take(20)
            .collect();
        return Err(not_configured(model).with_details(json!({
            "provider": model.provider,
            "model": model.id,
            "providerModels": known,
        })));
    };
    if !found.credential {
        return Err(secret_missing(&model.provider));
    }
    Ok(())
}

pub fn not_configured(model: &ModelRef) -> AppError {
    AppError::new(
        ErrorCode::ModelNotConfigured,
        format!(
            "the host's agent has no model {model}: pick one that model/list shows \
             (pi-remote models)"
        ),
    )
}

pub fn secret_missing(provider: &str) -> AppError {
    AppError::new(
        ErrorCode::ProviderSecretMissing,
        format!(
            "provider {provider} has no API key on this host: an owner sets it with \
             credential/set (pi-remote credentials set {provider}), or pick another model"
        ),
    )
    .with_details(json!({ "provider": provider }))
}

fn too_many(what: &str) -> AppError {
    AppError::new(
        ErrorCode::LimitExceeded,
        format!("a host keeps at most {MAX_PROVIDERS} {what}; delete one first"),
    )
    .with_details(json!({ "limit": MAX_PROVIDERS }))
}

/// `credential/set`.
pub fn credential_set(
    host: &impl ModelHost,
    params: CredentialSetParams,
) -> Result<CredentialSetResult, AppError> {
    let models = &host.models();
    if !models.credentials.has(&params.provider) && models.credentials.count() >= MAX_PROVIDERS {
        return Err(too_many("credentials"));
    }
    let credential = models
        .credentials
        .set(&params.provider, &params.api_key, now_ms())
        .map_err(crate::internal)?;
    models.changed();
    tracing::info!(provider = %params.provider, fingerprint = %credential.fingerprint, "provider credential set");
    Ok(CredentialSetResult { credential })
}

/// `credential/delete`.
pub fn credential_delete(host: &impl ModelHost, provider: &str) -> Result<Deleted, AppError> {
    let deleted = host
        .models()
        .credentials
        .delete(provider)
        .map_err(crate::internal)?;
    if deleted {
        host.models().changed();
        tracing::info!(%provider, "provider credential deleted");
    }
    Ok(Deleted { deleted })
}

/// `credential/list`.
pub fn credential_list(host: &impl ModelHost) -> CredentialListResult {
    CredentialListResult {
        credentials: host.models().credentials.list(),
    }
}

/// `provider/set`.
pub fn provider_set(host: &impl ModelHost, params: ProviderSetParams) -> Result<Ack, AppError> {
    let providers = &host.models().providers;
    if !providers.contains(&params.provider) && providers.count() >= MAX_PROVIDERS {
        return Err(too_many("providers"));
    }
    let name = params.provider.clone();
    if providers.set(params).map_err(crate::internal)? {
        host.models().changed();
        tracing::info!(provider = %name, "custom provider set");
    }
    Ok(Ack {})
}

/// `provider/delete`.
pub fn provider_delete(host: &impl ModelHost, provider: &str) -> Result<Deleted, AppError> {
    let deleted = host
        .models()
        .providers
        .delete(provider)
        .map_err(crate::internal)?;
    if deleted {
        host.models().changed();
        tracing::info!(%provider, "custom provider deleted");
    }
    Ok(Deleted { deleted })
}
