//! `host/info`, `host/list`, `device/list`, `device/revoke` and `pairing/create`: the host
//! itself and who may reach it (docs/protocol.md §5, §7.1-§7.2).

use crate::auth::Caller;
use crate::state::HostState;
use racp_proto::limits::{
    DEFAULT_PAIRING_TTL_SECONDS, MAX_PAIRING_TTL_SECONDS, MIN_PAIRING_TTL_SECONDS,
};
use racp_proto::methods::handshake::{HostIdentity, Limits};
use racp_proto::methods::host::{
    DeviceInfo, DeviceListResult, DeviceRevokeParams, HostInfoResult, HostListResult,
    PairingCreateParams, PairingCreateResult,
};
use racp_proto::{Ack, AppError, Capability, Empty, ErrorCode, Role};
use racp_server::clock::now_ms;
use serde_json::json;
use std::sync::Arc;

/// The capabilities this host has on, as `hello` and `host/info` report them.
pub fn capabilities(state: &HostState) -> Vec<String> {
    Capability::HOST
        .iter()
        .filter(|c| **c != Capability::Fs || state.config.fs_enabled)
        .filter(|c| **c != Capability::Sandbox || state.sandbox.enforced())
        .map(|c| c.to_string())
        .collect()
}

pub fn require(state: &HostState, capability: Capability, method: &str) -> Result<(), AppError> {
    if capabilities(state).iter().any(|c| c == capability.as_str()) {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::CapabilityUnavailable,
        format!("{method} needs the `{capability}` capability, which this host has off"),
    )
    .with_details(json!({"capability": capability.as_str(), "method": method})))
}

/// `host/info`: what the host is and runs, with its agent's status.
pub async fn info(state: Arc<HostState>, _: Empty) -> Result<HostInfoResult, AppError> {
    let agent = state.agent.status().await;
    Ok(HostInfoResult {
        host: host_identity(&state),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        started_at: state.started_at,
        capabilities: capabilities(&state),
        limits: limits(&state),
        agents: state.drivers.agents_info(&state),
        agent,
        sandbox: Some(state.sandbox.info()),
    })
}

/// `host/list` needs a gateway.
pub fn list(_: &HostState, _: Empty) -> Result<HostListResult, AppError> {
    Err(AppError::new(
        ErrorCode::MethodNotFound,
        "host/list needs a gateway; this is a single pi-host",
    )
    .with_details(json!({"method": "host/list"})))
}

/// The limits `host/info` reports: the host's own, before any `hello` agreed smaller ones.
fn limits(state: &HostState) -> Limits {
    let l = &state.config.limits;
    racp_server::hello::limits(l.into(), l.max_frame_bytes, l.max_events_per_frame)
}

pub fn host_identity(state: &HostState) -> HostIdentity {
    HostIdentity {
        version: env!("CARGO_PKG_VERSION").to_string(),
        id: state.host_id.clone(),
    }
}

/// `device/list`.
pub fn device_list(
    state: &HostState,
    caller: &Caller,
    _: Empty,
) -> Result<DeviceListResult, AppError> {
    let current = caller.device_id();
    let devices = state
        .store
        .devices()
        .map_err(|e| state.internal(e))?
        .into_iter()
        .map(|d| DeviceInfo {
            current: current == Some(d.device_id.as_str()),
            device_id: d.device_id,
            name: d.name,
            roles: d.roles,
            created_at: d.created_at,
            last_seen_at: d.last_seen_at,
        })
        .collect();
    Ok(DeviceListResult { devices })
}

/// Revokes a device. When this returns, none of its calls is running, none can start, and its
/// connections have stopped sending (racp-server/src/connections.rs); the revoke itself holds
/// no pass, so a device revoking itself does not wait for its own call.
pub async fn device_revoke(
    state: Arc<HostState>,
    params: DeviceRevokeParams,
) -> Result<Ack, AppError> {
    let store_state = state.clone();
    let device_id = params.device_id.clone();
    let known = tokio::task::spawn_blocking(move || -> Result<bool, AppError> {
        let store = &store_state.store;
        let revoked = store
            .revoke_device(&device_id, now_ms())
            .map_err(|e| store_state.internal(e))?;
        Ok(revoked
            || store
                .device(&device_id)
                .map_err(|e| store_state.internal(e))?
                .is_some())
    })
    .await
    .unwrap_or_else(|e| Err(state.internal(e)))?;
    if !known {
        return Err(AppError::new(ErrorCode::NotFound, "no such device")
            .with_details(json!({"deviceId": params.device_id})));
    }
    state.rate.forget(&params.device_id);
    let killed = state
        .connections
        .revoke(&params.device_id, &racp_server::connection::revoked())
        .await;
    tracing::info!(device_id = %params.device_id, connections = killed, "device revoked");
    Ok(Ack {})
}

/// Roles for `pi-host pair` without `--roles`: owner for the first device, operator after.
pub fn default_pairing_roles(state: &HostState) -> Result<Vec<Role>, AppError> {
    let count = state
        .store
        .active_device_count()
        .map_err(|e| state.internal(e))?;
    Ok(if count == 0 {
        vec![Role::Owner]
    } else {
        vec![Role::Operator]
    })
}

/// `pairing/create`: a token for this host (a gateway's token names hosts; a host's cannot).
pub fn pairing_create(
    state: &HostState,
    params: PairingCreateParams,
) -> Result<PairingCreateResult, AppError> {
    if params.hosts.is_some() {
        return Err(racp_proto::validate::invalid(
            "hosts",
            "names hosts behind a gateway; this is a single pi-host",
        ));
    }
    let ttl = params.ttl_seconds.unwrap_or(DEFAULT_PAIRING_TTL_SECONDS);
    mint_pairing(state, &params.roles, ttl)
}

/// Mints a single-use pairing token (`pairing/create`, which the admin socket's `pair` is too).
fn mint_pairing(
    state: &HostState,
    roles: &[Role],
    ttl_seconds: u64,
) -> Result<PairingCreateResult, AppError> {
    let params = PairingCreateParams {
        roles: roles.to_vec(),
        ttl_seconds: Some(ttl_seconds),
        hosts: None,
    };
    racp_proto::validate::Validate::validate(&params)?;
    let ttl = ttl_seconds.clamp(MIN_PAIRING_TTL_SECONDS, MAX_PAIRING_TTL_SECONDS);
    let token_id = state.secrets.new_id("").map_err(|e| state.internal(e))?;
    let minted = state
        .secrets
        .mint_pairing(token_id)
        .map_err(|e| state.internal(e))?;
    let now = now_ms();
    let expires_at = now + ttl * 1000;
    state
        .store
        .insert_pairing_token(&minted.id, &minted.tag, roles, now, expires_at)
        .map_err(|e| state.internal(e))?;
    tracing::info!(roles = ?roles, expires_at, "pairing token minted");
    Ok(PairingCreateResult {
        url: pairing_url(&state.config, &minted.token),
        token: minted.token,
        expires_at,
        roles: roles.to_vec(),
        cert_sha256: state.config.cert_sha256.map(|sha256| sha256.to_hex()),
    })
}

/// The pairing link for `token` (docs/protocol.md §5.3): with TLS it names the certificate
/// fingerprint the new device pins.
pub fn pairing_url(config: &crate::config::ServeConfig, token: &str) -> String {
    racp_server::identity::pairing_link(
        &config.listen.to_string(),
        config.cert_sha256.as_ref(),
        config.tls.is_some(),
        token,
    )
}
