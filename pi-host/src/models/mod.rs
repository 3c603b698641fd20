//! What a desktop sets for the host's agents (docs/protocol.md §7.19-§7.22): provider keys
//! (`credentials.rs`), model servers (`providers.rs`), and the catalogue of models the agent
//! can run (`catalogue.rs`). Changes apply to the next agent started: each change bumps a
//! generation, an idle agent started before it is replaced when it is next used, and a running
//! turn keeps its agent until it ends (`driver::Driver::ensure_agent`).

mod catalogue;
mod credentials;
mod file;
mod providers;

pub use catalogue::Catalogue;
pub use credentials::{Credentials, FILE as CREDENTIALS_FILE};
pub use file::FileError;
pub use providers::{FILE as PROVIDERS_FILE, Providers};

use racp_proto::methods::model::{ModelListResult, ModelRef};
use racp_proto::{AppError, ErrorCode};
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
    /// How an agent at `place` is launched: its sandbox and the settings handed to it.
    fn agent_launch(
        &self,
        place: &crate::agent::sandbox::AgentPlace,
    ) -> crate::agent::sandbox::Launch;
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
    fn agent_launch(
        &self,
        place: &crate::agent::sandbox::AgentPlace,
    ) -> crate::agent::sandbox::Launch {
        (**self).agent_launch(place)
    }
}

pub struct Models {
    pub credentials: Credentials,
    pub providers: Providers,
    pub catalogue: Catalogue,
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
            catalogue: Catalogue::default(),
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

    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
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
