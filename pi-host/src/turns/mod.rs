//! Turns and approvals: driving each session's agent and turning what it says into events.
//!
//! One [`Driver`] per session owns the agent process (started with the first turn, restarted by
//! the next turn after a crash) and the turn that runs on it. A pump task reads the agent's
//! output in batches and appends each batch as one group of events, waiting for the commit
//! before reading more, so a slow disk pushes back on the agent, never on subscribers.

mod approvals;

pub use approvals::Approvals;

use crate::agent::{Agent, AgentError, AgentOutput, AgentSpec};
use crate::auth::Credential;
use crate::clock::now_ms;
use crate::sessions::{Effect, EventDraft, Session};
use crate::state::HostState;
use crate::store::TurnRow;
use racp_proto::events::{EventType, TurnFinishedData, TurnOutcome, TurnStartedData};
use racp_proto::methods::turn::{
    TurnInfo, TurnRef, TurnStartParams, TurnStartResult, TurnState, TurnSteerParams,
};
use racp_proto::{Ack, AppError, ErrorCode, ErrorSource};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc};

/// Most agent outputs appended as one group.
const PUMP_BATCH: usize = 1024;

/// The running turn of a session.
struct ActiveTurn {
    turn_id: String,
    abort_requested: bool,
}

/// A session's agent and its running turn.
#[derive(Default)]
struct DriverState {
    agent: Option<Agent>,
    active: Option<ActiveTurn>,
    /// An agent already ran for this session in this host process.
    spawned_before: bool,
}

pub struct Driver {
    session: Arc<Session>,
    state: Mutex<DriverState>,
}

/// Every session's driver, created on first use.
#[derive(Default)]
pub struct Turns {
    drivers: dashmap::DashMap<String, Arc<Driver>>,
    pub approvals: Approvals,
}

fn device_of(credential: &Credential) -> Option<String> {
    match credential {
        Credential::Device { device_id, .. } => Some(device_id.clone()),
        Credential::Pairing { .. } => None,
    }
}

impl Turns {
    fn driver(&self, session: &Arc<Session>) -> Arc<Driver> {
        self.drivers
            .entry(session.id.clone())
            .or_insert_with(|| {
                Arc::new(Driver {
                    session: session.clone(),
                    state: Mutex::new(DriverState::default()),
                })
            })
            .clone()
    }

    /// `turn/start`: idempotent by key; AGENT_BUSY while another turn runs.
    pub async fn start(
        &self,
        host: &Arc<HostState>,
        credential: &Credential,
        params: TurnStartParams,
    ) -> Result<TurnStartResult, AppError> {
        let session = crate::handlers::find_session(host, &params.session_id)?;
        let driver = self.driver(&session);
        let mut state = driver.state.lock().await;
        // The key is checked under the driver's lock, so two racing resends see one turn.
        if let Some(turn) = host
            .store
            .turn_by_key(&session.id, &params.idempotency_key)
            .map_err(|e| host.internal(e))?
        {
            return if turn.text == params.text {
                Ok(TurnStartResult {
                    turn_id: turn.turn_id,
                })
            } else {
                Err(AppError::new(
                    ErrorCode::IdempotencyConflict,
                    "this idempotency key already started a turn with other input",
                )
                .with_details(
                    json!({"idempotencyKey": params.idempotency_key, "turnId": turn.turn_id}),
                ))
            };
        }
        if session.is_closing() {
            return Err(closed(&session));
        }
        if let Some(active) = &state.active {
            return Err(AppError::new(
                ErrorCode::AgentBusy,
                "a turn is already running: steer it, abort it, or wait for it to finish",
            )
            .with_details(json!({"turnId": active.turn_id})));
        }
        let agent = match &state.agent {
            Some(agent) => agent.clone(),
            None => {
                // Each session keeps the agent's own session files in its own directory; an
                // agent started again for a session that already ran resumes from them.
                let session_dir = host
                    .config
                    .data_dir
                    .join("agent-sessions")
                    .join(&session.id);
                if let Err(err) = crate::fsutil::create_private_dir(&session_dir) {
                    tracing::warn!(error = %err, "cannot create the agent's session directory");
                }
                let resume = state.spawned_before || session.has_turns();
                let command = if resume && !host.config.agent_resume_args.is_empty() {
                    format!("{} {}", host.config.agent, host.config.agent_resume_args)
                } else {
                    host.config.agent.clone()
                };
                let spec = AgentSpec {
                    command,
                    workspace: session.workspace.clone().into(),
                    env: vec![(
                        "PI_CODING_AGENT_SESSION_DIR".to_string(),
                        session_dir.display().to_string(),
                    )],
                };
                let (agent, output) = Agent::spawn(&spec).await.map_err(|e| e.to_app_error())?;
                tokio::spawn(pump(host.clone(), driver.clone(), agent.clone(), output));
                state.agent = Some(agent.clone());
                state.spawned_before = true;
                agent
            }
        };
        let turn_id = host.secrets.new_id("turn_").map_err(|e| host.internal(e))?;
        let started_at = now_ms();
        host.store
            .insert_turn(
                &session.id,
                &TurnRow {
                    turn_id: turn_id.clone(),
                    idempotency_key: params.idempotency_key.clone(),
                    text: params.text.clone(),
                    started_at,
                },
            )
            .map_err(|e| host.internal(e))?;
        let info = TurnInfo {
            turn_id: turn_id.clone(),
            state: TurnState::Running,
            text: params.text.clone(),
            started_at,
            finished_at: None,
            error: None,
        };
        let draft = EventDraft::new(
            EventType::TurnStarted.as_str(),
            Some(turn_id.clone()),
            json!(TurnStartedData {
                text: params.text.clone(),
                device_id: device_of(credential),
            }),
        )
        .with_effect(Effect::TurnStarted(info));
        wait_committed(host, &session, vec![draft]).await?;
        state.active = Some(ActiveTurn {
            turn_id: turn_id.clone(),
            abort_requested: false,
        });
        // Not under the lock: the pump needs it to read what the agent says meanwhile.
        drop(state);
        if let Err(err) = agent.prompt(&params.text).await {
            // The turn is recorded; end it so the session is usable again.
            let mut state = driver.state.lock().await;
            if state.active.as_ref().is_some_and(|a| a.turn_id == turn_id) {
                state.active = None;
                let mut drafts = self.approvals.cancel_turn(host, &turn_id);
                drafts.push(finished_draft(
                    &turn_id,
                    TurnOutcome::Failed,
                    Some(err.to_app_error()),
                ));
                if let Err(err) = wait_committed(host, &session, drafts).await {
                    tracing::warn!(error = %err, "cannot record the end of a turn");
                }
            }
        }
        Ok(TurnStartResult { turn_id })
    }

    pub async fn steer(
        &self,
        host: &Arc<HostState>,
        params: TurnSteerParams,
    ) -> Result<Ack, AppError> {
        let session = crate::handlers::find_session(host, &params.session_id)?;
        let driver = self.driver(&session);
        let agent = running_agent(host, &session, &*driver.state.lock().await, &params.turn_id)?;
        agent
            .steer(&params.text)
            .await
            .map_err(|e| e.to_app_error())?;
        Ok(Ack {})
    }

    /// `turn/abort`: aborting a finished turn succeeds and changes nothing.
    pub async fn abort(&self, host: &Arc<HostState>, params: TurnRef) -> Result<Ack, AppError> {
        let session = crate::handlers::find_session(host, &params.session_id)?;
        let driver = self.driver(&session);
        let agent = {
            let mut state = driver.state.lock().await;
            let agent = match running_agent(host, &session, &state, &params.turn_id) {
                Ok(agent) => agent,
                Err(err) if err.code() == ErrorCode::Conflict => return Ok(Ack {}),
                Err(err) => return Err(err),
            };
            if let Some(active) = state.active.as_mut() {
                active.abort_requested = true;
            }
            agent
        };
        agent.abort().await.map_err(|e| e.to_app_error())?;
        Ok(Ack {})
    }

    /// Stops the session's agent (its whole process tree), ending a running turn as aborted.
    pub async fn stop_session(&self, host: &Arc<HostState>, session: &Arc<Session>) {
        let Some(driver) = self.drivers.get(&session.id).map(|d| d.clone()) else {
            return;
        };
        let agent = {
            let mut state = driver.state.lock().await;
            if let Some(active) = state.active.as_mut() {
                active.abort_requested = true;
            }
            state.agent.take()
        };
        // Not under the lock: the pump drains the agent's last output meanwhile.
        if let Some(agent) = agent {
            agent.shutdown().await;
        }
        let active = driver.state.lock().await.active.take();
        if let Some(active) = active {
            let mut drafts = self.approvals.cancel_turn(host, &active.turn_id);
            let error = AppError::new(ErrorCode::TurnAborted, "the session was closed");
            drafts.push(finished_draft(
                &active.turn_id,
                TurnOutcome::Aborted,
                Some(error),
            ));
            if let Err(err) = wait_committed(host, session, drafts).await {
                tracing::warn!(error = %err, "cannot record the end of a turn");
            }
        }
    }

    /// Stops every agent (host drain).
    pub async fn stop_all(&self, host: &Arc<HostState>) {
        let drivers: Vec<Arc<Driver>> = self.drivers.iter().map(|d| d.clone()).collect();
        for driver in drivers {
            self.stop_session(host, &driver.session).await;
        }
    }
}

/// After a restart no agent runs: a turn that was running when the host died has failed.
pub async fn end_interrupted_turns(host: &HostState) {
    for session in host.sessions.list() {
        let mut drafts = Approvals::cancel_stored(host, &session.id);
        if let Some(turn_id) = session.active_turn() {
            let error = AppError::new(
                ErrorCode::AgentSidecarCrashed,
                "the host restarted during this turn; start a new turn to continue",
            );
            drafts.push(finished_draft(&turn_id, TurnOutcome::Failed, Some(error)));
        }
        if drafts.is_empty() {
            continue;
        }
        if let Err(err) = wait_committed(host, &session, drafts).await {
            tracing::warn!(error = %err, "cannot end an interrupted turn");
        }
    }
}

fn closed(session: &Session) -> AppError {
    AppError::new(ErrorCode::Conflict, "the session is closed")
        .with_details(json!({"sessionId": session.id}))
}

/// The agent of the running turn `turn_id`: TURN_NOT_FOUND for an unknown turn, CONFLICT for
/// one that already finished.
fn running_agent(
    host: &HostState,
    session: &Session,
    state: &DriverState,
    turn_id: &str,
) -> Result<Agent, AppError> {
    if let (Some(active), Some(agent)) = (&state.active, &state.agent)
        && active.turn_id == turn_id
    {
        return Ok(agent.clone());
    }
    let known = host
        .store
        .turn_exists(&session.id, turn_id)
        .map_err(|e| host.internal(e))?;
    if known {
        Err(
            AppError::new(ErrorCode::Conflict, "the turn has already finished")
                .with_details(json!({"turnId": turn_id})),
        )
    } else {
        Err(
            AppError::new(ErrorCode::TurnNotFound, "no such turn in this session")
                .with_details(json!({"turnId": turn_id})),
        )
    }
}

async fn wait_committed(
    host: &HostState,
    session: &Arc<Session>,
    drafts: Vec<EventDraft>,
) -> Result<(), AppError> {
    let committed = host.sessions.append(session, drafts)?;
    committed
        .await
        .map(drop)
        .map_err(|_| host.internal("the event writer stopped before committing"))
}

fn finished_draft(turn_id: &str, outcome: TurnOutcome, error: Option<AppError>) -> EventDraft {
    let state = match outcome {
        TurnOutcome::Completed => TurnState::Completed,
        TurnOutcome::Aborted => TurnState::Aborted,
        TurnOutcome::Failed => TurnState::Failed,
    };
    EventDraft::new(
        EventType::TurnFinished.as_str(),
        Some(turn_id.to_string()),
        json!(TurnFinishedData {
            outcome,
            error: error.clone(),
        }),
    )
    .with_effect(Effect::TurnFinished {
        turn_id: turn_id.to_string(),
        state,
        error,
        at: now_ms(),
    })
}

/// How a run ended, read from pi's `agent_end` (its last assistant message's `stopReason`).
fn outcome_of(agent_end: &Value, abort_requested: bool) -> (TurnOutcome, Option<AppError>) {
    let last = agent_end["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "assistant"));
    let stop = last.and_then(|m| m["stopReason"].as_str()).unwrap_or("");
    if abort_requested || stop == "aborted" {
        let error = AppError::new(ErrorCode::TurnAborted, "the turn was aborted");
        return (TurnOutcome::Aborted, Some(error));
    }
    if stop == "error" {
        let message = last
            .and_then(|m| m["errorMessage"].as_str())
            .unwrap_or("the agent reported an error");
        let error = AppError::new(ErrorCode::Internal, message.to_string())
            .with_source(ErrorSource::Agent)
            .with_cause_code("agent_error");
        return (TurnOutcome::Failed, Some(error));
    }
    (TurnOutcome::Completed, None)
}

/// Reads the agent's output until it exits, appending events in committed batches.
async fn pump(
    host: Arc<HostState>,
    driver: Arc<Driver>,
    agent: Agent,
    mut output: mpsc::Receiver<AgentOutput>,
) {
    let session = driver.session.clone();
    while let Some(first) = output.recv().await {
        let mut batch = vec![first];
        while batch.len() < PUMP_BATCH {
            match output.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut drafts = Vec::with_capacity(batch.len());
        let mut state = driver.state.lock().await;
        let mut exited = false;
        for out in batch {
            let turn_id = state.active.as_ref().map(|a| a.turn_id.clone());
            match out {
                AgentOutput::Event { kind, payload } => {
                    // A run's end may come as a line too long to read (pi's `agent_end` holds
                    // every message of the run): its kept head still names the type.
                    let ends_run = kind == "agent_end"
                        || (kind == "invalid_output"
                            && payload["line"]
                                .as_str()
                                .is_some_and(|l| l.contains(r#""type":"agent_end""#)));
                    drafts.push(EventDraft::new(
                        format!("agent.{kind}"),
                        turn_id.clone(),
                        payload.clone(),
                    ));
                    if let Some(active) = ends_run.then(|| state.active.take()).flatten() {
                        let (outcome, error) = outcome_of(&payload, active.abort_requested);
                        drafts.extend(host.turns.approvals.cancel_turn(&host, &active.turn_id));
                        drafts.push(finished_draft(&active.turn_id, outcome, error));
                    }
                }
                AgentOutput::UiRequest {
                    id,
                    method,
                    title,
                    message,
                    options,
                    timeout_ms,
                    payload: _,
                } => match turn_id {
                    Some(turn_id) => {
                        let request = approvals::Request {
                            agent_request_id: id,
                            method,
                            title,
                            message,
                            options,
                            timeout_ms,
                        };
                        // The dialog reaches clients as `approval.requested`, not as an agent event.
                        drafts.push(
                            host.turns
                                .approvals
                                .open(&host, &session, &agent, &turn_id, request),
                        );
                    }
                    None => {
                        // A dialog outside any turn has nobody to answer it: cancel at once.
                        let _ = agent
                            .answer_ui(&id, crate::agent::UiAnswer::Cancelled)
                            .await;
                    }
                },
                AgentOutput::UiNotice { payload, .. } => {
                    drafts.push(EventDraft::new(
                        "agent.extension_ui_request",
                        turn_id,
                        payload,
                    ));
                }
                AgentOutput::Response { payload, .. } => {
                    drafts.push(EventDraft::new("agent.response", turn_id, payload));
                }
                AgentOutput::Exited {
                    status,
                    signal,
                    stderr_tail,
                } => {
                    exited = true;
                    if state.agent.as_ref().is_some_and(|a| a.pid() == agent.pid()) {
                        state.agent = None;
                    }
                    if let Some(active) = state.active.take() {
                        drafts.extend(host.turns.approvals.cancel_turn(&host, &active.turn_id));
                        let error = if active.abort_requested {
                            AppError::new(ErrorCode::TurnAborted, "the turn was aborted")
                        } else {
                            AppError::new(
                                ErrorCode::AgentSidecarCrashed,
                                "the agent process died during the turn; the next turn restarts it",
                            )
                            .with_source(ErrorSource::Agent)
                            .with_details(json!({
                                "exitCode": status,
                                "signal": signal,
                                "stderrTail": stderr_tail,
                            }))
                        };
                        let outcome = if active.abort_requested {
                            TurnOutcome::Aborted
                        } else {
                            TurnOutcome::Failed
                        };
                        drafts.push(finished_draft(&active.turn_id, outcome, Some(error)));
                    }
                }
            }
        }
        drop(state);
        if drafts.is_empty() {
            continue;
        }
        if let Err(err) = wait_committed(&host, &session, drafts).await {
            tracing::warn!(error = %err, session_id = %session.id, "agent output not recorded");
        }
        if exited {
            break;
        }
    }
}

impl From<AgentError> for AppError {
    fn from(err: AgentError) -> Self {
        err.to_app_error()
    }
}
