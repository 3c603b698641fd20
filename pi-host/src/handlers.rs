//! Method handlers: [`endpoint`] and [`host`], one exhaustive match each over the method
//! table's places, say where each method is answered; short methods are answered here.

use crate::auth::Caller;
use crate::fence::Fence;
use crate::sessions::HostEvent;
use crate::sessions::history::{self, PageBounds};
use crate::state::HostState;
use crate::store::{DeviceRow, PairingOutcome};
use racp_proto::events::SessionClosedData;
use racp_proto::limits::{
    DEFAULT_EXPORT_BYTES, DEFAULT_PAIRING_TTL_SECONDS, MAX_PAIRING_TTL_SECONDS,
    MIN_PAIRING_TTL_SECONDS,
};
use racp_proto::methods::handshake::{HostIdentity, Limits, PairParams, PairResult};
use racp_proto::methods::host::{
    AgentStatus, DeviceInfo, DeviceListResult, DeviceRevokeParams, HostInfoResult, HostListResult,
    PairingCreateParams, PairingCreateResult,
};
use racp_proto::methods::session::{
    SessionCreateParams, SessionCreateResult, SessionGetResult, SessionHistoryParams,
    SessionHistoryResult, SessionListResult, SessionSettings, SessionStreamParams,
    SessionStreamResult,
};
use racp_proto::{Ack, AppError, Call, Capability, EndpointCall, ErrorCode, HostCall, Role};
use racp_server::clock::now_ms;
use racp_server::connection::Answer;
use racp_server::wire::to_raw;
use serde::Serialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::future::Future;
use std::sync::Arc;

/// The capabilities this host has on, as `hello` and `host/info` report them.
pub fn capabilities(state: &HostState) -> Vec<String> {
    Capability::HOST
        .iter()
        .filter(|c| **c != Capability::Fs || state.config.fs_enabled)
        .map(|c| c.to_string())
        .collect()
}

fn require(state: &HostState, capability: Capability, method: &str) -> Result<(), AppError> {
    if capabilities(state).iter().any(|c| c == capability.as_str()) {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::CapabilityUnavailable,
        format!("{method} needs the `{capability}` capability, which this host has off"),
    )
    .with_details(json!({"capability": capability.as_str(), "method": method})))
}

async fn session_create(
    state: &Arc<HostState>,
    params: SessionCreateParams,
) -> Result<SessionCreateResult, AppError> {
    if let Some(model) = &params.model {
        crate::models::check(state, model).await?;
    }
    let created = on_blocking_pool(state, move |s| record_session(s, params)).await?;
    // Start the agent now: it loads while the user types (docs/architecture.md).
    if let Some(session) = state.sessions.get(&created.session.session_id) {
        state.drivers.warm(state, &session);
    }
    Ok(created)
}

fn record_session(
    state: &HostState,
    params: SessionCreateParams,
) -> Result<SessionCreateResult, AppError> {
    let workspace = Fence::of(&state.config).confine(&params.workspace, "workspace")?;
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
        settings: SessionSettings {
            model: params.model,
            thinking_level: params.thinking_level,
            permission_mode: Some(
                params
                    .permission_mode
                    .unwrap_or(state.config.permission_mode),
            ),
            ..SessionSettings::default()
        },
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

/// The checks a call passes before it is answered, whichever way it came (a device's
/// WebSocket connection, or a call a gateway routed over NATS): racp-server's admit policy with
/// the host's rate buckets (`rate_key`: `None` for a call that pays none) and drain.
pub fn admit(
    state: &HostState,
    caller: &Caller,
    method: racp_proto::Method,
    params: Option<&serde_json::value::RawValue>,
    rate_key: Option<&str>,
) -> Result<Call, AppError> {
    let draining = state.is_draining().then(|| {
        AppError::new(
            ErrorCode::HostShuttingDown,
            "the host is shutting down; the call was not started",
        )
    });
    let rate = rate_key.map(|key| (&state.rate, key));
    racp_server::admission::admit(&caller.principal(), method, params, rate, draining)
}

/// The calls a host answers as the server the client reached (a gateway answers them for its
/// devices itself): one exhaustive match, so a method placed here without a handler does not
/// compile.
pub fn endpoint(state: Arc<HostState>, caller: Caller, call: EndpointCall) -> Answer {
    match call {
        EndpointCall::Pair(params) => blocking(state, move |s| pair(s, &caller, params)),
        EndpointCall::HostList(_) => blocking(state, |_| host_list()),
        EndpointCall::DeviceList(_) => blocking(state, move |s| device_list(s, &caller)),
        EndpointCall::PairingCreate(params) => blocking(state, move |s| {
            if params.hosts.is_some() {
                return Err(racp_proto::validate::invalid(
                    "hosts",
                    "names hosts behind a gateway; this is a single pi-host",
                ));
            }
            let ttl = params.ttl_seconds.unwrap_or(DEFAULT_PAIRING_TTL_SECONDS);
            mint_pairing(s, &params.roles, ttl)
        }),
        EndpointCall::DeviceRevoke(params) => task(async move {
            let ack = device_revoke(&state, params).await?;
            to_raw(&ack)
        }),
    }
}

/// The host's own calls, from a device's connection or routed by a gateway: one exhaustive
/// match. Short store operations run on the blocking pool; turns, approvals and
/// `session/close` wait on agents and run as async tasks. Longer than 60 lines by design: one
/// short arm per row of the method table's host place, so a new method is one arm here.
pub fn host(state: Arc<HostState>, caller: Caller, call: HostCall) -> Answer {
    match call {
        HostCall::HostInfo(_) => task(async move {
            let agent = state.agent.status().await;
            to_raw(&host_info(&state, agent))
        }),
        HostCall::FsList(params) => blocking(state, move |s| {
            require(s, Capability::Fs, "fs/list")?;
            crate::browse::list(&params.path, &Fence::of(&s.config))
        }),
        HostCall::FsStat(params) => blocking(state, move |s| {
            require(s, Capability::Fs, "fs/stat")?;
            crate::browse::stat(&params.path, &Fence::of(&s.config))
        }),
        HostCall::SessionCreate(params) => {
            reply(async move { session_create(&state, params).await })
        }
        HostCall::SessionList(_) => blocking(state, |s| Ok(session_list(s))),
        HostCall::SessionGet(params) => {
            blocking_raw(state, move |s| session_get(s, &params.session_id))
        }
        HostCall::SessionStream(params) => blocking(state, move |s| session_stream(s, params)),
        HostCall::SessionHistory(params) => {
            blocking_raw(state, move |s| session_history(s, params))
        }
        HostCall::SessionClose(params) => {
            reply(async move { session_close(&state, &caller, &params.session_id).await })
        }
        HostCall::TurnStart(params) => {
            reply(async move { state.drivers.start(&state, &caller, params).await })
        }
        HostCall::TurnSteer(params) => {
            reply(async move { state.drivers.steer(&state, params).await })
        }
        HostCall::TurnFollowUp(params) => {
            reply(async move { state.drivers.follow_up(&state, &caller, params).await })
        }
        HostCall::SessionClearQueue(params) => {
            reply(async move { state.drivers.clear_queue(&state, &caller, params).await })
        }
        HostCall::SessionCompact(params) => {
            reply(async move { state.drivers.compact(&state, params).await })
        }
        HostCall::TurnAbort(params) => {
            reply(async move { state.drivers.abort(&state, &caller, params).await })
        }
        HostCall::ApprovalRespond(params) => reply(async move {
            let approvals = &state.drivers.approvals;
            approvals.respond(&state, &caller, params).await
        }),
        HostCall::ModelList(_) => task(async move {
            let list = crate::models::list(&state, caller.may_start_agents()).await?;
            to_raw(&*list)
        }),
        HostCall::SessionFork(params) => {
            reply(async move { state.drivers.fork(&state, &caller, params).await })
        }
        HostCall::SessionClone(params) => {
            reply(async move { state.drivers.clone_session(&state, &caller, params).await })
        }
        HostCall::SessionConfigure(params) => {
            reply(async move { state.drivers.configure(&state, &caller, params).await })
        }
        HostCall::SessionRename(params) => {
            reply(async move { state.drivers.rename(&state, &caller, params).await })
        }
        HostCall::CredentialSet(params) => {
            blocking(state, move |s| crate::models::credential_set(s, params))
        }
        HostCall::CredentialDelete(params) => blocking(state, move |s| {
            crate::models::credential_delete(s, &params.provider)
        }),
        HostCall::CredentialList(_) => blocking(state, |s| Ok(crate::models::credential_list(s))),
        HostCall::ProviderSet(params) => {
            blocking(state, move |s| crate::models::provider_set(s, params))
        }
        HostCall::ProviderDelete(params) => blocking(state, move |s| {
            crate::models::provider_delete(s, &params.provider)
        }),
        HostCall::SessionBash(params) => {
            reply(async move { state.drivers.bash(&state, &caller, params).await })
        }
        HostCall::SessionBashAbort(params) => {
            reply(async move { state.drivers.bash_abort(&state, params).await })
        }
        HostCall::SessionStats(params) => {
            reply(async move { state.drivers.stats(&state, params).await })
        }
        HostCall::SessionCommands(params) => {
            reply(async move { state.drivers.commands(&state, &caller, params).await })
        }
        HostCall::SessionExport(params) => task(async move {
            // The page read back and its result written: `maxBytes` twice, held until the
            // result is written (docs/reliability.md §4.18).
            let asked = params.max_bytes.unwrap_or(DEFAULT_EXPORT_BYTES) as usize;
            let _held = state.budget.charge(asked * 2)?;
            to_raw(&state.drivers.export(&state, &caller, params).await?)
        }),
    }
}

/// An async handler whose result is the reply.
fn reply<T: Serialize>(
    handler: impl Future<Output = Result<T, AppError>> + Send + 'static,
) -> Answer {
    task(async move { to_raw(&handler.await?) })
}

fn task(answer: impl Future<Output = Result<Box<RawValue>, AppError>> + Send + 'static) -> Answer {
    Box::pin(answer)
}

/// A synchronous handler (SQLite, the file system) on the blocking pool, not on a runtime
/// thread that serves other connections meanwhile.
fn blocking<T: Serialize + Send + 'static>(
    state: Arc<HostState>,
    handler: impl FnOnce(&HostState) -> Result<T, AppError> + Send + 'static,
) -> Answer {
    task(async move { to_raw(&on_blocking_pool(&state, handler).await?) })
}

/// The same for a handler that writes its result itself (one that charges what it builds to
/// the host's byte budget until the result is written: `session/history`, `session/get`).
fn blocking_raw(
    state: Arc<HostState>,
    handler: impl FnOnce(&HostState) -> Result<Box<RawValue>, AppError> + Send + 'static,
) -> Answer {
    task(async move { on_blocking_pool(&state, handler).await })
}

async fn on_blocking_pool<T: Send + 'static>(
    state: &Arc<HostState>,
    handler: impl FnOnce(&HostState) -> Result<T, AppError> + Send + 'static,
) -> Result<T, AppError> {
    let host = state.clone();
    tokio::task::spawn_blocking(move || handler(&host))
        .await
        .unwrap_or_else(|e| Err(state.internal(e)))
}

fn host_list() -> Result<HostListResult, AppError> {
    Err(AppError::new(
        ErrorCode::MethodNotFound,
        "host/list needs a gateway; this is a single pi-host",
    )
    .with_details(json!({"method": "host/list"})))
}

fn session_list(state: &HostState) -> SessionListResult {
    SessionListResult {
        sessions: state.sessions.list().iter().map(|s| s.info()).collect(),
    }
}

/// The snapshot, with the most recent history up to its cursor: events after the cursor reach
/// a subscriber from it, so no entry is missed or seen twice (docs/protocol.md §8.4).
fn session_get(state: &HostState, session_id: &str) -> Result<Box<RawValue>, AppError> {
    let (session, mut snapshot, cursor) = state.sessions.find(session_id)?.snapshot();
    // Held until the result is written, after the page is dropped.
    let mut held = state.budget.empty();
    let bounds = PageBounds::SNAPSHOT;
    snapshot.history = history::page(&state.store, session_id, cursor, bounds, &mut held)?;
    to_raw(&SessionGetResult {
        session,
        snapshot,
        cursor,
    })
}

/// A page of a session's history up to `params.upTo` (the head when absent); read from the
/// store, so it needs no agent and works for a closed session.
fn session_history(
    state: &HostState,
    params: SessionHistoryParams,
) -> Result<Box<RawValue>, AppError> {
    let cursor = state
        .sessions
        .find(&params.session_id)?
        .history_position(params.up_to)?;
    let bounds = PageBounds::of(&params);
    // Held until the result is written, after the page is dropped.
    let mut held = state.budget.empty();
    let page = history::page(&state.store, &params.session_id, cursor, bounds, &mut held)?;
    to_raw(&SessionHistoryResult::new(cursor, page))
}

/// What is streaming in a session at `params.cursor`: the message and the tools' output so far.
fn session_stream(
    state: &HostState,
    params: SessionStreamParams,
) -> Result<SessionStreamResult, AppError> {
    let stream = state
        .sessions
        .find(&params.session_id)?
        .stream_at(params.cursor)?;
    Ok(SessionStreamResult {
        cursor: params.cursor,
        streaming_message: stream.message().cloned(),
        tool_outputs: stream.tool_outputs().clone(),
    })
}

/// Closes a session: its agent's process tree ends, a running turn ends as aborted, and
/// `session.closed` is the last event. Closing a closed session succeeds and changes nothing.
async fn session_close(
    state: &Arc<HostState>,
    caller: &Caller,
    session_id: &str,
) -> Result<Ack, AppError> {
    let session = state.sessions.find(session_id)?;
    if session.is_closing() {
        return Ok(Ack {});
    }
    state.drivers.stop_session(state, &session).await;
    let closed = HostEvent::of_session(SessionClosedData {
        device_id: caller.device_id().map(str::to_string),
    });
    let committed = match state.sessions.append(&session, vec![closed]) {
        Ok(committed) => committed,
        // Another close won the race.
        Err(_) if session.is_closing() => return Ok(Ack {}),
        Err(error) => return Err(error),
    };
    // The row is marked once the event is durable: a closed row always has its
    // `session.closed` (sessions/view.rs, `reconcile`).
    committed
        .await
        .map_err(|_| state.internal("the event writer stopped before committing"))?;
    state
        .store
        .mark_session_closed(session_id, now_ms())
        .map_err(|e| state.internal(e))?;
    tracing::info!(%session_id, "session closed");
    Ok(Ack {})
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

fn host_info(state: &HostState, agent: AgentStatus) -> HostInfoResult {
    HostInfoResult {
        host: host_identity(state),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        started_at: state.started_at,
        capabilities: capabilities(state),
        limits: limits(state),
        agents: state.drivers.agents_info(state),
        agent,
    }
}

fn pair(state: &HostState, caller: &Caller, params: PairParams) -> Result<PairResult, AppError> {
    let Caller::Pairing { token_id, roles } = caller else {
        return Err(state.internal("pair called by a caller without a pairing token"));
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

fn device_list(state: &HostState, caller: &Caller) -> Result<DeviceListResult, AppError> {
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
    state: &Arc<HostState>,
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
