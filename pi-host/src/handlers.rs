//! Method handlers: one function per method, each returning the method's result or an error.

use crate::auth::Credential;
use crate::clock::now_ms;
use crate::sessions::{Effect, EventDraft};
use crate::state::HostState;
use crate::store::{DeviceRow, PairingOutcome};
use racp_proto::events::{EventType, SessionClosedData};
use racp_proto::limits::{
    DEFAULT_PAIRING_TTL_SECONDS, MAX_PAIRING_TTL_SECONDS, MIN_PAIRING_TTL_SECONDS,
};
use racp_proto::methods::handshake::{HostIdentity, Limits, PairParams, PairResult};
use racp_proto::methods::host::{
    DeviceInfo, DeviceListResult, DeviceRevokeParams, HostInfoResult, PairingCreateParams,
    PairingCreateResult,
};
use racp_proto::methods::session::{
    SessionCreateParams, SessionCreateResult, SessionGetResult, SessionListResult,
};
use racp_proto::{Ack, AppError, Call, ErrorCode, Role};
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// Capabilities a host can have on; `fs` is off when the operator disabled file browsing.
const ALL_CAPABILITIES: &[&str] = &["pairing", "devices", "sessions", "turns", "approvals", "fs"];

/// The capabilities this host has on, as `hello` and `host/info` report them.
pub fn capabilities(state: &HostState) -> Vec<String> {
    ALL_CAPABILITIES
        .iter()
        .filter(|c| **c != "fs" || state.config.fs_enabled)
        .map(|c| c.to_string())
        .collect()
}

fn require(state: &HostState, capability: &str, method: &str) -> Result<(), AppError> {
    if capabilities(state).iter().any(|c| c == capability) {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::CapabilityUnavailable,
        format!("{method} needs the `{capability}` capability, which this host has off"),
    )
    .with_details(json!({"capability": capability, "method": method})))
}

fn to_value<T: Serialize>(state: &HostState, result: T) -> Result<Value, AppError> {
    serde_json::to_value(result).map_err(|e| state.internal(e))
}

/// Runs a decoded call for an authenticated, admitted caller.
pub fn dispatch(state: &HostState, credential: &Credential, call: Call) -> Result<Value, AppError> {
    match call {
        // `hello` is answered by the connection itself (it changes the connection's state).
        Call::Hello(_) => Err(state.internal("hello reached the dispatcher")),
        Call::Pair(params) => to_value(state, pair(state, credential, params)?),
        Call::HostInfo(_) => to_value(state, host_info(state)),
        Call::HostList(_) => Err(AppError::new(
            ErrorCode::MethodNotFound,
            "host/list needs a gateway; this is a single pi-host",
        )
        .with_details(json!({"method": "host/list"}))),
        Call::DeviceList(_) => to_value(state, device_list(state, credential)?),
        Call::DeviceRevoke(params) => to_value(state, device_revoke(state, params)?),
        Call::FsList(params) => {
            require(state, "fs", "fs/list")?;
            to_value(state, crate::fs::list(&params.path, &state.config.roots)?)
        }
        Call::FsStat(params) => {
            require(state, "fs", "fs/stat")?;
            to_value(state, crate::fs::stat(&params.path, &state.config.roots)?)
        }
        Call::SessionCreate(params) => to_value(state, session_create(state, params)?),
        Call::SessionList(_) => to_value(
            state,
            SessionListResult {
                sessions: state.sessions.list().iter().map(|s| s.info()).collect(),
            },
        ),
        Call::SessionGet(params) => {
            let (session, snapshot, cursor) = find_session(state, &params.session_id)?.snapshot();
            to_value(
                state,
                SessionGetResult {
                    session,
                    snapshot,
                    cursor,
                },
            )
        }
        Call::PairingCreate(params) => {
            let ttl = params.ttl_seconds.unwrap_or(DEFAULT_PAIRING_TTL_SECONDS);
            to_value(state, mint_pairing(state, &params.roles, ttl)?)
        }
        // Turns, approvals and session/close run in `dispatch_async`.
        other => Err(state.internal(format!(
            "{} reached the blocking dispatcher",
            other.method().as_str()
        ))),
    }
}

pub fn find_session(
    state: &HostState,
    session_id: &str,
) -> Result<Arc<crate::sessions::Session>, AppError> {
    state.sessions.get(session_id).ok_or_else(|| {
        AppError::new(ErrorCode::SessionNotFound, "no such session")
            .with_details(json!({"sessionId": session_id}))
    })
}

fn session_create(
    state: &HostState,
    params: SessionCreateParams,
) -> Result<SessionCreateResult, AppError> {
    let workspace = crate::paths::confine(&params.workspace, "workspace", &state.config.roots)?;
    if !workspace.is_dir() {
        return Err(racp_proto::validate::invalid(
            "workspace",
            "must be a directory",
        ));
    }
    let row = crate::store::SessionRow {
        session_id: state
            .secrets
            .new_id("ses_")
            .map_err(|e| state.internal(e))?,
        workspace: workspace.display().to_string(),
        title: params.title,
        epoch: state.secrets.random_u64().map_err(|e| state.internal(e))?,
        created_at: now_ms(),
        closed: false,
    };
    let session = state
        .sessions
        .create(&state.store, row)
        .map_err(|e| state.internal(e))?;
    tracing::info!(session_id = %session.id, "session created");
    Ok(SessionCreateResult {
        session: session.info(),
    })
}

/// Runs a call on the async runtime: turns, approvals and session/close talk to agents; the
/// rest are short store operations run on the blocking pool.
pub async fn dispatch_async(
    state: Arc<HostState>,
    credential: Credential,
    call: Call,
) -> Result<Value, AppError> {
    match call {
        Call::TurnStart(params) => {
            let result = state.turns.start(&state, &credential, params).await?;
            to_value(&state, result)
        }
        Call::TurnSteer(params) => to_value(&state, state.turns.steer(&state, params).await?),
        Call::TurnAbort(params) => to_value(&state, state.turns.abort(&state, params).await?),
        Call::ApprovalRespond(params) => {
            let result = state
                .turns
                .approvals
                .respond(&state, &credential, params)
                .await?;
            to_value(&state, result)
        }
        Call::SessionClose(params) => {
            let ack = session_close(&state, &credential, &params.session_id).await?;
            to_value(&state, ack)
        }
        other => {
            let host = state.clone();
            tokio::task::spawn_blocking(move || dispatch(&host, &credential, other))
                .await
                .unwrap_or_else(|e| Err(state.internal(e)))
        }
    }
}

/// Closes a session: its agent's process tree ends, a running turn ends as aborted, and
/// `session.closed` is the last event. Closing a closed session succeeds and changes nothing.
async fn session_close(
    state: &Arc<HostState>,
    credential: &Credential,
    session_id: &str,
) -> Result<Ack, AppError> {
    let session = find_session(state, session_id)?;
    if session.is_closing() {
        return Ok(Ack {});
    }
    state.turns.stop_session(state, &session).await;
    let device_id = match credential {
        Credential::Device { device_id, .. } => Some(device_id.clone()),
        Credential::Pairing { .. } => None,
    };
    let draft = EventDraft::new(
        EventType::SessionClosed.as_str(),
        None,
        json!(SessionClosedData { device_id }),
    )
    .with_effect(Effect::Closed);
    let committed = match state.sessions.append(&session, vec![draft]) {
        Ok(committed) => committed,
        // Another close won the race.
        Err(_) if session.is_closing() => return Ok(Ack {}),
        Err(error) => return Err(error),
    };
    state
        .store
        .mark_session_closed(session_id, now_ms())
        .map_err(|e| state.internal(e))?;
    committed
        .await
        .map_err(|_| state.internal("the event writer stopped before committing"))?;
    tracing::info!(%session_id, "session closed");
    Ok(Ack {})
}

pub fn limits(state: &HostState, max_frame_bytes: u32) -> Limits {
    let l = &state.config.limits;
    Limits {
        max_frame_bytes,
        max_in_flight: l.max_in_flight,
        max_subscriptions: l.max_subscriptions,
        requests_per_second: l.requests_per_second,
        request_burst: l.request_burst,
    }
}

pub fn host_identity(state: &HostState) -> HostIdentity {
    HostIdentity {
        version: env!("CARGO_PKG_VERSION").to_string(),
        id: state.host_id.clone(),
    }
}

fn host_info(state: &HostState) -> HostInfoResult {
    HostInfoResult {
        host: host_identity(state),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        started_at: state.started_at,
        capabilities: capabilities(state),
        limits: limits(state, state.config.limits.max_frame_bytes),
    }
}

fn pair(
    state: &HostState,
    credential: &Credential,
    params: PairParams,
) -> Result<PairResult, AppError> {
    let Credential::Pairing { token_id, roles } = credential else {
        return Err(state.internal("pair called without a pairing credential"));
    };
    let device_id = state
        .secrets
        .new_id("dev_")
        .map_err(|e| state.internal(e))?;
    let minted = state
        .secrets
        .mint_device(device_id)
        .map_err(|e| state.internal(e))?;
    let row = DeviceRow {
        device_id: minted.id.clone(),
        name: params.device_name,
        roles: roles.clone(),
        token_tag: minted.tag,
        created_at: now_ms(),
        last_seen_at: None,
        revoked: false,
    };
    match state
        .store
        .exchange_pairing_token(token_id, &row, now_ms())
        .map_err(|e| state.internal(e))?
    {
        PairingOutcome::Paired => {
            tracing::info!(device_id = %row.device_id, name = %row.name, "device paired");
            Ok(PairResult {
                device_id: row.device_id,
                device_token: minted.token,
                roles: row.roles,
            })
        }
        PairingOutcome::Expired => Err(AppError::new(
            ErrorCode::PairingTokenExpired,
            "this pairing token has expired: mint a new one with `pi-host pair`",
        )),
        PairingOutcome::AlreadyUsed | PairingOutcome::Unknown => Err(AppError::new(
            ErrorCode::PairingFailed,
            "this pairing token was already used: mint a new one with `pi-host pair`",
        )),
    }
}

fn device_list(state: &HostState, credential: &Credential) -> Result<DeviceListResult, AppError> {
    let current = match credential {
        Credential::Device { device_id, .. } => Some(device_id.as_str()),
        Credential::Pairing { .. } => None,
    };
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

/// Revokes a device and closes its open connections at once.
pub fn device_revoke(state: &HostState, params: DeviceRevokeParams) -> Result<Ack, AppError> {
    let revoked = state
        .store
        .revoke_device(&params.device_id, now_ms())
        .map_err(|e| state.internal(e))?;
    state.rate.forget(&params.device_id);
    let killed = state.kill_device(
        &params.device_id,
        &AppError::new(ErrorCode::RemoteAuthFailed, "this device was revoked"),
    );
    if !revoked {
        let known = state
            .store
            .device(&params.device_id)
            .map_err(|e| state.internal(e))?
            .is_some();
        if !known {
            return Err(AppError::new(ErrorCode::NotFound, "no such device")
                .with_details(json!({"deviceId": params.device_id})));
        }
    }
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

/// Mints a single-use pairing token (shared by `pairing/create` and the admin socket).
pub fn mint_pairing(
    state: &HostState,
    roles: &[Role],
    ttl_seconds: u64,
) -> Result<PairingCreateResult, AppError> {
    let params = PairingCreateParams {
        roles: roles.to_vec(),
        ttl_seconds: Some(ttl_seconds),
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
        url: crate::server::identity::pairing_url(&state.config, &minted.token),
        token: minted.token,
        expires_at,
        roles: roles.to_vec(),
        cert_sha256: state.config.cert_sha256.map(|sha256| sha256.to_hex()),
    })
}
