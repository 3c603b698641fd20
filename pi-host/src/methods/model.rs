//! `model/list`, `credential/*` and `provider/*` (docs/protocol.md §7.19-§7.22): what a
//! desktop reads and sets of the host's models; the keys, providers and catalogue themselves
//! are `crate::models`.

use crate::auth::Caller;
use crate::models::ModelHost;
use crate::state::HostState;
use racp_proto::limits::MAX_PROVIDERS;
use racp_proto::methods::model::{
    CredentialListResult, CredentialSetParams, CredentialSetResult, Deleted, ModelListResult,
    ProviderRef, ProviderSetParams,
};
use racp_proto::{Ack, AppError, ErrorCode};
use racp_server::clock::now_ms;
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;

/// `model/list`. A caller who may not start agents (an observer) gets the catalogue the host
/// last made, whatever its age, and never has an agent started for it (docs/protocol.md §6.1).
pub async fn list(state: Arc<HostState>, caller: Caller) -> Result<Box<RawValue>, AppError> {
    to_raw(&*catalogue(&*state, caller.may_start_agents()).await?)
}

async fn catalogue(
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

fn too_many(what: &str) -> AppError {
    AppError::new(
        ErrorCode::LimitExceeded,
        format!("a host keeps at most {MAX_PROVIDERS} {what}; delete one first"),
    )
    .with_details(json!({ "limit": MAX_PROVIDERS }))
}

/// `credential/set`.
pub fn credential_set(
    host: &HostState,
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
pub fn credential_delete(host: &HostState, params: ProviderRef) -> Result<Deleted, AppError> {
    let provider = params.provider.as_str();
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
pub fn credential_list(host: &HostState) -> Result<CredentialListResult, AppError> {
    Ok(CredentialListResult {
        credentials: host.models().credentials.list(),
    })
}

/// `provider/set`.
pub fn provider_set(host: &HostState, params: ProviderSetParams) -> Result<Ack, AppError> {
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
pub fn provider_delete(host: &HostState, params: ProviderRef) -> Result<Deleted, AppError> {
    let provider = params.provider.as_str();
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
