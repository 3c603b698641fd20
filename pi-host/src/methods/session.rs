//! The `session/*` methods (docs/protocol.md §7.4-§7.32): sessions made, read, renamed,
//! configured and closed here; what runs on the session's agent (a queue, a compaction, a
//! branch, a shell command) handed to its driver (`crate::driver`), the export in
//! `session/export.rs`.

mod export;

pub use export::export;

use crate::agent::{Agent, AgentError};
use crate::auth::Caller;
use crate::driver;
use crate::fence::Fence;
use crate::sessions::history::{self, PageBounds};
use crate::sessions::{HostEvent, Session};
use crate::state::HostState;
use racp_proto::events::{SessionClosedData, SessionConfiguredData, SessionRenamedData};
use racp_proto::methods::session::{
    SessionBashParams, SessionBashResult, SessionClearQueueParams, SessionClearQueueResult,
    SessionCloneParams, SessionCommandsResult, SessionCompactParams, SessionCompactResult,
    SessionConfigureParams, SessionCreateParams, SessionCreateResult, SessionForkParams,
    SessionForkResult, SessionGetResult, SessionHistoryParams, SessionHistoryResult,
    SessionListResult, SessionRef, SessionRenameParams, SessionSettings, SessionStatsResult,
    SessionStreamParams, SessionStreamResult,
};
use racp_proto::pi::{self, Command};
use racp_proto::{Ack, AppError, Empty, ErrorCode};
use racp_server::clock::now_ms;
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;

/// `session/create`.
pub async fn create(
    state: Arc<HostState>,
    params: SessionCreateParams,
) -> Result<SessionCreateResult, AppError> {
    if let Some(model) = &params.model {
        crate::models::check(&*state, model).await?;
    }
    let created = super::on_blocking_pool(&state, move |s| record_session(s, params)).await?;
    // Start the agent now: it loads while the user types (docs/architecture.md).
    if let Some(session) = state.sessions.get(&created.session.session_id) {
        crate::workspace::Workspaces::watch_from(&state, &session.id).await;
        state.drivers.warm(&state, &session);
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

/// `session/list`.
pub fn list(state: &HostState, _: Empty) -> Result<SessionListResult, AppError> {
    Ok(SessionListResult {
        sessions: state.sessions.list().iter().map(|s| s.info()).collect(),
    })
}

/// The snapshot, with the most recent history up to its cursor: events after the cursor reach
/// a subscriber from it, so no entry is missed or seen twice (docs/protocol.md §8.4).
pub fn get(state: &HostState, params: SessionRef) -> Result<Box<RawValue>, AppError> {
    let session_id = params.session_id.as_str();
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
pub fn history(state: &HostState, params: SessionHistoryParams) -> Result<Box<RawValue>, AppError> {
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
pub fn stream(
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
pub async fn close(
    state: Arc<HostState>,
    caller: Caller,
    params: SessionRef,
) -> Result<Ack, AppError> {
    let session_id = params.session_id.as_str();
    let session = state.sessions.find(session_id)?;
    if session.is_closing() {
        return Ok(Ack {});
    }
    state.drivers.stop_session(&state, &session).await;
    state.workspaces.unwatch(&session);
    let closed = HostEvent::of_session(SessionClosedData {
        device_id: caller.device_id().map(str::to_string),
        device_name: caller.device_name().map(str::to_string),
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

/// `session/configure`: the agent running now takes the change at once (a running turn
/// from its next model request); the session's later agents start with it.
pub async fn configure(
    host: Arc<HostState>,
    caller: Caller,
    params: SessionConfigureParams,
) -> Result<SessionCreateResult, AppError> {
    let session = host.sessions.find(&params.session_id)?;
    if session.is_closing() {
        return Err(driver::closed(&session));
    }
    if let Some(model) = &params.model {
        crate::models::check(&*host, model).await?;
    }
    let change = params.settings();
    let driver = host.drivers.driver(&session);
    // Held across the change so that a turn or another change cannot come between.
    let _changing = driver.configuring.lock().await;
    let settings = session.settings().with(&change);
    if settings == session.settings() && !params.clear_grants {
        return Ok(SessionCreateResult {
            session: session.info(),
        });
    }
    let agent = driver.agent().await;
    if let Some(agent) = agent {
        // Not under the driver's lock: pi's answers come through the pump, which needs it.
        agent
            .configure(&change)
            .await
            .map_err(|err| match (&err, &change.model) {
                (AgentError::Rejected { .. }, Some(model)) => crate::models::not_configured(model),
                _ => err.to_app_error(),
            })?;
    }
    let stored = host.clone();
    let (id, to_store) = (session.id.clone(), settings.clone());
    tokio::task::spawn_blocking(racp_server::trace::blocking(move || {
        stored.store.set_session_settings(&id, &to_store)
    }))
    .await
    .map_err(crate::internal)?
    .map_err(crate::internal)?;
    if params.clear_grants {
        host.store
            .clear_grants(&session.id)
            .map_err(crate::internal)?;
    }
    let event = HostEvent::of_session(SessionConfiguredData {
        settings,
        device_id: caller.device_id().map(str::to_string),
        device_name: caller.device_name().map(str::to_string),
        grants_cleared: params.clear_grants,
    });
    host.sessions.commit(&session, vec![event]).await?;
    tracing::info!(session_id = %session.id, "session configured");
    Ok(SessionCreateResult {
        session: session.info(),
    })
}

/// `session/rename`: the title is stored, then `session.renamed` is committed; the running
/// agent's own session takes the name too (pi's `set_session_name`), at best: the title is
/// the host's.
pub async fn rename(
    host: Arc<HostState>,
    caller: Caller,
    params: SessionRenameParams,
) -> Result<SessionCreateResult, AppError> {
    let session = host.sessions.find(&params.session_id)?;
    if session.is_closing() {
        return Err(driver::closed(&session));
    }
    let driver = host.drivers.driver(&session);
    // Held across the change so that two renames store and log in the same order.
    let _changing = driver.configuring.lock().await;
    if session.info().title.as_deref() == Some(params.title.as_str()) {
        return Ok(SessionCreateResult {
            session: session.info(),
        });
    }
    let stored = host.clone();
    let (id, title) = (session.id.clone(), params.title.clone());
    tokio::task::spawn_blocking(racp_server::trace::blocking(move || {
        stored.store.set_session_title(&id, &title)
    }))
    .await
    .map_err(crate::internal)?
    .map_err(crate::internal)?;
    let event = HostEvent::of_session(SessionRenamedData {
        title: params.title.clone(),
        device_id: caller.device_id().map(str::to_string),
        device_name: caller.device_name().map(str::to_string),
    });
    host.sessions.commit(&session, vec![event]).await?;
    let agent = driver.agent().await;
    if let Some(agent) = agent {
        let name = pi::Command::SetSessionName {
            name: &params.title,
        };
        if let Err(err) = agent.call(&name).await {
            tracing::warn!(session_id = %session.id, error = %err, "the agent did not take the session's name");
        }
    }
    Ok(SessionCreateResult {
        session: session.info(),
    })
}

/// `session/clear_queue` (the driver's queue, driver/queue.rs).
pub async fn clear_queue(
    state: Arc<HostState>,
    caller: Caller,
    params: SessionClearQueueParams,
) -> Result<SessionClearQueueResult, AppError> {
    state.drivers.clear_queue(&state, &caller, params).await
}

/// `session/compact`: pi's compaction, run by the driver between turns (driver/queue.rs).
pub async fn compact(
    state: Arc<HostState>,
    params: SessionCompactParams,
) -> Result<SessionCompactResult, AppError> {
    state.drivers.compact(&state, params).await
}

/// `session/fork`: pi's fork, delivered as a new session (driver/branch.rs).
pub async fn fork(
    state: Arc<HostState>,
    caller: Caller,
    params: SessionForkParams,
) -> Result<SessionForkResult, AppError> {
    let forked = state.drivers.fork(&state, &caller, params).await?;
    crate::workspace::Workspaces::watch_from(&state, &forked.session.session_id).await;
    Ok(forked)
}

/// `session/clone`: pi's clone, delivered as a new session (driver/branch.rs).
pub async fn clone(
    state: Arc<HostState>,
    caller: Caller,
    params: SessionCloneParams,
) -> Result<SessionCreateResult, AppError> {
    let cloned = state.drivers.clone_session(&state, &caller, params).await?;
    crate::workspace::Workspaces::watch_from(&state, &cloned.session.session_id).await;
    Ok(cloned)
}

/// `session/bash`: pi's own shell, run by the session's agent (driver/shell.rs).
pub async fn bash(
    state: Arc<HostState>,
    caller: Caller,
    params: SessionBashParams,
) -> Result<SessionBashResult, AppError> {
    state.drivers.bash(&state, &caller, params).await
}

/// `session/bash_abort` (driver/shell.rs).
pub async fn bash_abort(state: Arc<HostState>, params: SessionRef) -> Result<Ack, AppError> {
    state.drivers.bash_abort(&state, params).await
}

/// `session/stats`: the whole session's totals from the stored history (so an observer
/// never starts an agent, and a stopped agent or a closed session still has them), and
/// what the context holds, as the agent counts it, when one already runs.
pub async fn stats(
    host: Arc<HostState>,
    params: SessionRef,
) -> Result<SessionStatsResult, AppError> {
    let session = host.sessions.find(&params.session_id)?;
    let (store, id, head) = (host.clone(), session.id.clone(), session.head_cursor());
    let mut stats = tokio::task::spawn_blocking(move || {
        crate::sessions::history::stats(&store.store, &id, head)
    })
    .await
    .map_err(crate::internal)??;
    if let Some(agent) = host.drivers.running_agent(&session).await {
        match agent.call(&Command::GetSessionStats).await {
            Ok(data) => {
                stats.context_usage = pi::reply::context_usage(&data);
                stats.context = pi::reply::context_stats(&data);
            }
            Err(err) => tracing::debug!(error = %err, "no context usage from the agent"),
        }
    }
    Ok(stats)
}

/// `session/commands`: pi's `get_commands` from the session's agent (for an operator
/// started if needed, as a turn would: the list depends on the workspace and the agent's
/// settings).
pub async fn commands(
    host: Arc<HostState>,
    caller: Caller,
    params: SessionRef,
) -> Result<SessionCommandsResult, AppError> {
    let session = host.sessions.find(&params.session_id)?;
    let agent = reading_agent(&host, &caller, &session, "session/commands").await?;
    let data = agent.call(&Command::GetCommands).await?;
    Ok(SessionCommandsResult {
        commands: pi::reply::commands(&data),
    })
}

/// The agent a read of the session's agent uses. A caller who may start turns gets the
/// running one or one started now ([`crate::driver::Drivers::agent_for`]); an observer only one that runs.
async fn reading_agent(
    host: &Arc<HostState>,
    caller: &Caller,
    session: &Arc<Session>,
    method: &str,
) -> Result<Agent, AppError> {
    if caller.may_start_agents() {
        return host.drivers.agent_for(host, session).await;
    }
    if session.is_closing() {
        return Err(driver::closed(session));
    }
    host.drivers
        .running_agent(session)
        .await
        .ok_or_else(|| not_running(session, method))
}

/// CONFLICT `agent_not_running`: an observer's read that would need the agent started.
fn not_running(session: &Session, method: &str) -> AppError {
    AppError::new(
        ErrorCode::Conflict,
        format!(
            "{method} needs the session's agent, which is not running, and an observer starts \
             none: call it again while the session is in use, or from a device with the \
             operator role"
        ),
    )
    .with_retriable(false)
    .with_details(json!({"sessionId": session.id, "reason": "agent_not_running"}))
}
