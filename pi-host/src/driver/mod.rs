//! The agent driver: one [`Driver`] per session drives its agent, runs its turns, queue and
//! approvals, and turns what the agent says into events.
//!
//! One [`Driver`] per session owns the agent process (started with the first turn, restarted by
//! the next turn after a crash) and the turn that runs on it. A pump task reads the agent's
//! output in batches and appends each batch as one group of events, waiting for the commit
//! before reading more, so a slow disk pushes back on the agent, never on subscribers.

mod approvals;
mod branch;
mod lifecycle;
mod permissions;
mod pump;
mod queue;
mod shell;
mod turn_end;

use pump::{on_agent_event, pump};
use turn_end::{earlier_turn, end_of_turn, ended_by_exit, record_turn, settled};

pub use lifecycle::stop_idle_agents;

pub use approvals::Approvals;

use crate::agent::failure::{self, RetryTrail};
use crate::agent::sandbox::AgentPlace;
use crate::agent::{Agent, AgentError, AgentOutput, AgentSpec, RunEnd, UiAnswer};
use crate::auth::Caller;
use crate::models::ModelHost;
use crate::sessions::{HostEvent, Session};
use crate::workspace::WatchHost;
use racp_proto::events::{
    AgentStopReason, AgentStoppedData, TurnFinishedData, TurnOutcome, WithdrawReason,
};
use racp_proto::methods::model::ModelRef;
use racp_proto::methods::turn::{TurnRef, TurnStartParams, TurnStartResult, TurnSteerParams};
use racp_proto::permission::{GrantScope, PermissionMode};
use racp_proto::pi::{self, Kind};
use racp_proto::{Ack, AppError, ErrorCode};
use serde_json::json;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Most agent outputs appended as one group.
const PUMP_BATCH: usize = 1024;
/// Most of the pump's batches committing at once.
const PUMP_DEPTH: usize = 4;

/// How long a failed run that pi may retry waits for pi's `auto_retry_start` (or overflow
/// compaction) before its failure is final. pi decides at once after `agent_end`, but only pi
/// knows whether its retries are enabled, so silence is the only "no" (docs/protocol.md §8.7).
const RETRY_SETTLE: Duration = Duration::from_millis(1500);

/// The running turn of a session.
struct ActiveTurn {
    turn_id: String,
    abort_requested: bool,
    /// pi's automatic retries during this turn.
    retries: RetryTrail,
    /// A failed run pi may still retry: it ends the turn unless pi retries or recovers.
    pending: Option<UnsettledFailure>,
    /// The failed run pi is waiting to retry: it ends the turn if pi gives the wait up (an
    /// abort cancels it: pi then says `auto_retry_end` and nothing more).
    retrying: Option<UnsettledFailure>,
}

struct UnsettledFailure {
    end: RunEnd,
    /// pi is compacting after a context overflow: wait for `compaction_end`, however long.
    held: bool,
}

impl ActiveTurn {
    fn new(turn_id: String) -> Self {
        ActiveTurn {
            turn_id,
            abort_requested: false,
            retries: RetryTrail::default(),
            pending: None,
            retrying: None,
        }
    }
}

use failure::trace_id;

/// A session's agent and its running turn.
#[derive(Default)]
struct DriverState {
    agent: Option<Agent>,
    active: Option<ActiveTurn>,
    /// An agent already ran for this session in this host process.
    spawned_before: bool,
    /// The running agent has run a turn: only then is its stop worth an `agent_stopped` event
    /// (an agent started ahead of a prompt that never came goes quietly).
    ran_turn: bool,
    /// When the agent last started, ran a turn, said something or had a subscriber.
    last_used: Option<Instant>,
    /// The settings generation (`models::Models::generation`) the agent started with.
    generation: u64,
    /// What the agent's sandbox was made from: a new grant or a change of mode retires it.
    place: AgentPlace,
    /// The models the agent has a credential for, once asked (`ready`); `Err` when the agent
    /// does not answer `get_available_models` (not pi), so there is nothing to check.
    available: Option<Result<Vec<ModelRef>, ()>>,
    /// The follow-ups waiting for the running turn to complete, in order (queue.rs).
    follow_ups: VecDeque<queue::Held>,
}

pub struct Driver {
    session: Arc<Session>,
    state: Mutex<DriverState>,
    /// The running agent's pid (0 when none), readable without the state's lock: counting and
    /// reporting agents must not wait on a turn.
    agent_pid: AtomicU32,
    /// Held by `session/configure` and `session/rename` from reading the settings to storing
    /// them, so that two changes store and log in the same order.
    pub(crate) configuring: Mutex<()>,
    /// A `session/compact` is going on: no turn starts meanwhile (queue.rs).
    compacting: AtomicBool,
    /// A shell command runs (`shell.rs`): the agent is in use.
    shell_running: AtomicBool,
    /// A `session/fork` or `session/clone` of this session is going on: no turn starts
    /// meanwhile (branch.rs).
    branching: AtomicBool,
}

/// One of a driver's flags (`compacting`, `branching`) raised for as long as the work that
/// raised it lives, and lowered however it ends (the call's task may be dropped with its
/// connection).
struct Raised {
    driver: Arc<Driver>,
    flag: fn(&Driver) -> &AtomicBool,
}

impl Raised {
    /// Raises `flag`; AGENT_BUSY with `busy` when it already is.
    fn raise(
        driver: &Arc<Driver>,
        flag: fn(&Driver) -> &AtomicBool,
        busy: &'static str,
    ) -> Result<Raised, AppError> {
        flag(driver)
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| AppError::new(ErrorCode::AgentBusy, busy))?;
        Ok(Raised {
            driver: driver.clone(),
            flag,
        })
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        (self.flag)(&self.driver).store(false, Ordering::Release);
    }
}

/// What turns need of the host (state.rs implements it), so that the host can own its turns
/// without the turns knowing the host's state.
pub trait DriverHost: WatchHost {
    fn store(&self) -> &crate::store::Store;
    fn secrets(&self) -> &crate::secrets::Secrets;
    fn drivers(&self) -> &Drivers;
    fn is_draining(&self) -> bool;
}

/// A shared host is a host.
impl<T: DriverHost> DriverHost for Arc<T> {
    fn store(&self) -> &crate::store::Store {
        (**self).store()
    }
    fn secrets(&self) -> &crate::secrets::Secrets {
        (**self).secrets()
    }
    fn drivers(&self) -> &Drivers {
        (**self).drivers()
    }
    fn is_draining(&self) -> bool {
        (**self).is_draining()
    }
}

/// Every session's driver, created on first use.
#[derive(Default)]
pub struct Drivers {
    drivers: dashmap::DashMap<String, Arc<Driver>>,
    pub approvals: Approvals,
    /// Held from the agent count to the spawn, so two starts cannot both take the last slot.
    spawn_gate: Mutex<()>,
    /// Agents' starts and stops, for the host's metrics.
    pub counts: crate::metrics::AgentCounts,
}

impl Drivers {
    /// The session's driver, created on first use.
    pub(crate) fn driver(&self, session: &Arc<Session>) -> Arc<Driver> {
        self.drivers
            .entry(session.id.clone())
            .or_insert_with(|| {
                Arc::new(Driver {
                    session: session.clone(),
                    state: Mutex::new(DriverState::default()),
                    agent_pid: AtomicU32::new(0),
                    configuring: Mutex::new(()),
                    compacting: Default::default(),
                    shell_running: Default::default(),
                    branching: Default::default(),
                })
            })
            .clone()
    }

    /// `turn/start`: idempotent by key; AGENT_BUSY while another turn runs.
    pub async fn start(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: TurnStartParams,
    ) -> Result<TurnStartResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let mut state = driver.state.lock().await;
        // The key is checked under the driver's lock, so two racing resends see one turn.
        if let Some(earlier) = earlier_turn(host, &session, &params)? {
            return Ok(earlier);
        }
        if session.is_closing() {
            return Err(closed(&session));
        }
        if let Some(active) = &state.active {
            return Err(AppError::new(
                ErrorCode::AgentBusy,
                "a turn is already running: steer it, abort it, queue a follow-up, or wait for \
                 it to finish",
            )
            .with_details(json!({"turnId": active.turn_id})));
        }
        driver.refuse_while_compacting()?;
        let agent = self.current_agent(host, &driver, &mut state).await?;
        driver.ready(host, &agent, &mut state).await?;
        let turn_id = record_turn(host, &session, caller, &params).await?;
        state.ran_turn = true;
        state.active = Some(ActiveTurn::new(turn_id.clone()));
        // Not under the lock: the pump needs it to read what the agent says meanwhile.
        drop(state);
        let prompt = (params.text.as_str(), params.images.as_slice());
        driver
            .send_prompt(&**host, &agent, &turn_id, prompt, queue::START_PATIENCE)
            .await;
        Ok(TurnStartResult { turn_id })
    }

    /// The session's agent for a command outside a turn's prompt (compaction, a shell command,
    /// stats, ...): the running one, or one started now (resuming the session's own pi session,
    /// making room as a turn does). CONFLICT for a closed session. Callers send their command
    /// without holding the driver's lock: pi's answers come through the pump, which needs it.
    pub async fn agent_for(
        &self,
        host: &Arc<impl DriverHost>,
        session: &Arc<Session>,
    ) -> Result<Agent, AppError> {
        if session.is_closing() {
            return Err(closed(session));
        }
        let driver = self.driver(session);
        let mut state = driver.state.lock().await;
        self.current_agent(host, &driver, &mut state).await
    }

    /// The session's agent under the driver's lock: the running one unless the host's model
    /// settings changed since it started, else one started now (room made for it).
    async fn current_agent(
        &self,
        host: &Arc<impl DriverHost>,
        driver: &Arc<Driver>,
        state: &mut DriverState,
    ) -> Result<Agent, AppError> {
        driver.retire_stale(host, state);
        driver.retire_for_sandbox(&**host, state).await;
        let agent = match state.agent.clone() {
            Some(agent) => agent,
            None => {
                let _slot = self.make_room(host, driver).await?;
                driver.ensure_agent(host, state).await?
            }
        };
        state.last_used = Some(Instant::now());
        Ok(agent)
    }

    pub async fn steer(
        &self,
        host: &Arc<impl DriverHost>,
        params: TurnSteerParams,
    ) -> Result<Ack, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let agent = running_agent(host, &session, &*driver.state.lock().await, &params.turn_id)?;
        agent
            .steer(&params.text)
            .await
            .map_err(|e| e.to_app_error())?;
        Ok(Ack {})
    }

    /// `turn/abort`: aborting a finished turn succeeds and changes nothing; aborting a queued
    /// follow-up's turn withdraws it (`session/clear_queue`).
    pub async fn abort(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: TurnRef,
    ) -> Result<Ack, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let agent = {
            let mut state = driver.state.lock().await;
            if state
                .follow_ups
                .iter()
                .any(|held| held.queued.turn_id == params.turn_id)
            {
                drop(state);
                let clear = racp_proto::methods::session::SessionClearQueueParams {
                    session_id: params.session_id,
                    turn_id: Some(params.turn_id),
                };
                self.clear_queue(host, caller, clear).await?;
                return Ok(Ack {});
            }
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
        // pi ends an aborted run only once an extension's dialog returns: answer the turn's
        // dialogs (cancelled) before the abort, or it waits for their deadline.
        self.approvals.cancel_for_abort(host, &params.turn_id).await;
        agent.abort().await.map_err(|e| e.to_app_error())?;
        Ok(Ack {})
    }

    /// The session's agent if one runs now; never starts one.
    pub(crate) async fn running_agent(&self, session: &Arc<Session>) -> Option<Agent> {
        let driver = self.drivers.get(&session.id).map(|d| d.clone())?;
        driver.agent().await
    }

    /// Stops the session's agent (its whole process tree), ending a running turn as aborted.
    pub async fn stop_session(&self, host: &Arc<impl DriverHost>, session: &Arc<Session>) {
        let Some(driver) = self.drivers.get(&session.id).map(|d| d.clone()) else {
            return;
        };
        let agent = {
            let mut state = driver.state.lock().await;
            if let Some(active) = state.active.as_mut() {
                active.abort_requested = true;
            }
            driver.take_agent(&mut state, &self.counts)
        };
        // Not under the lock: the pump drains the agent's last output meanwhile.
        if let Some(agent) = agent {
            agent.shutdown().await;
        }
        let mut state = driver.state.lock().await;
        let mut events = Vec::new();
        if let Some(active) = state.active.take() {
            let error = AppError::new(ErrorCode::TurnAborted, "the session was closed");
            events = end_of_turn(host, &active.turn_id, TurnOutcome::Aborted, Some(error));
        }
        events.extend(queue::withdraw_all(
            &mut state,
            WithdrawReason::AgentStopped,
        ));
        if !events.is_empty()
            && let Err(err) = host.sessions().commit(session, events).await
        {
            tracing::warn!(error = %err, "cannot record the end of a turn");
        }
    }

    /// Stops every agent (host drain).
    pub async fn stop_all(&self, host: &Arc<impl DriverHost>) {
        let drivers: Vec<Arc<Driver>> = self.drivers.iter().map(|d| d.clone()).collect();
        for driver in drivers {
            self.stop_session(host, &driver.session).await;
        }
    }
}

/// After a restart no agent runs: a turn that was running when the host stopped was cut off by
/// the host, not by its agent, so it ends as aborted with HOST_UNAVAILABLE (docs/protocol.md
/// §8.7), never as a sidecar crash.
pub async fn end_interrupted_turns(host: &impl DriverHost) {
    for session in host.sessions().list() {
        let mut events = Approvals::cancel_stored(host, &session.id);
        events.extend(queue::withdrawn_by_restart(&session.queued_follow_ups()));
        if let Some(turn_id) = session.active_turn() {
            let error = AppError::new(
                ErrorCode::HostUnavailable,
                "the host stopped during this turn; start a new turn to continue",
            )
            .with_details(json!({"reason": "host_restarted"}));
            events.push(HostEvent::of_turn(
                turn_id,
                TurnFinishedData {
                    outcome: TurnOutcome::Aborted,
                    error: Some(error),
                    files: Vec::new(),
                },
            ));
        }
        if events.is_empty() {
            continue;
        }
        if let Err(err) = host.sessions().commit(&session, events).await {
            tracing::warn!(error = %err, "cannot end an interrupted turn");
        }
    }
}

/// Where a session's agent writes its HTML export (`session/export`): a directory of its own,
/// the only one of the data directory's exports its sandbox lets it write.
pub(crate) fn export_dir(host: &impl DriverHost, session_id: &str) -> std::path::PathBuf {
    host.config().data_dir.join("exports").join(session_id)
}

pub(crate) fn closed(session: &Session) -> AppError {
    AppError::new(ErrorCode::Conflict, "the session is closed")
        .with_details(json!({"sessionId": session.id}))
}

/// The agent of the running turn `turn_id`: TURN_NOT_FOUND for an unknown turn, CONFLICT for
/// one that already finished or is a follow-up still queued.
fn running_agent(
    host: &impl DriverHost,
    session: &Session,
    state: &DriverState,
    turn_id: &str,
) -> Result<Agent, AppError> {
    if let (Some(active), Some(agent)) = (&state.active, &state.agent)
        && active.turn_id == turn_id
    {
        return Ok(agent.clone());
    }
    if state.follow_ups.iter().any(|f| f.queued.turn_id == turn_id) {
        return Err(AppError::new(
            ErrorCode::Conflict,
            "this follow-up waits in the queue: its turn has not started yet (withdraw it with \
             session/clear_queue)",
        )
        .with_details(json!({"turnId": turn_id, "queued": true})));
    }
    known_turn(host, session, turn_id)?;
    Err(
        AppError::new(ErrorCode::Conflict, "the turn has already finished")
            .with_details(json!({"turnId": turn_id})),
    )
}

/// TURN_NOT_FOUND unless the session ever had the turn `turn_id`.
fn known_turn(host: &impl DriverHost, session: &Session, turn_id: &str) -> Result<(), AppError> {
    let known = host
        .store()
        .turn_exists(&session.id, turn_id)
        .map_err(crate::internal)?;
    if known {
        return Ok(());
    }
    Err(
        AppError::new(ErrorCode::TurnNotFound, "no such turn in this session")
            .with_details(json!({"turnId": turn_id})),
    )
}

impl Driver {
    /// The running agent, if any.
    pub(crate) async fn agent(&self) -> Option<Agent> {
        self.state.lock().await.agent.clone()
    }

    /// Starts the session's agent if none runs; the pump for its output starts with it.
    async fn ensure_agent(
        self: &Arc<Self>,
        host: &Arc<impl DriverHost>,
        state: &mut DriverState,
    ) -> Result<Agent, AppError> {
        if let Some(agent) = &state.agent {
            return Ok(agent.clone());
        }
        let (spec, place) = self.agent_spec(host, state.spawned_before);
        let generation = host.models().generation();
        let counts = &host.drivers().counts;
        counts.starting.inc();
        let spawned = host.agent().spawn(&spec, host.agent_options()).await;
        counts.starting.dec();
        let (agent, output) = spawned?;
        counts.started.inc();
        tokio::spawn(pump(host.clone(), self.clone(), agent.clone(), output));
        self.agent_pid.store(agent.pid(), Ordering::Relaxed);
        state.agent = Some(agent.clone());
        state.spawned_before = true;
        state.ran_turn = false;
        state.last_used = Some(Instant::now());
        state.generation = generation;
        state.place = place;
        state.available = None;
        let settings = self.session.settings();
        if !settings.is_empty()
            && let Err(err) = agent.configure(&settings).await
        {
            // The turn's readiness check reports a model the agent did not take.
            tracing::warn!(session_id = %self.session.id, error = %err, "the agent refused the session's settings");
        }
        Ok(agent)
    }

    /// How the session's agent is started: its command (resuming its own session files when
    /// the session ran before), its sandbox, and its own directories (session files, export,
    /// a temp directory emptied at each start so no other session's agent reads what it left).
    fn agent_spec(&self, host: &impl DriverHost, spawned_before: bool) -> (AgentSpec, AgentPlace) {
        let session_dir = branch::agent_dir(host, &self.session.id);
        let export_dir = export_dir(host, &self.session.id);
        let temp_dir = host
            .config()
            .data_dir
            .join("agent-tmp")
            .join(&self.session.id);
        let _ = std::fs::remove_dir_all(&temp_dir);
        for dir in [&session_dir, &export_dir, &temp_dir] {
            if let Err(err) = racp_server::private_file::create_private_dir(dir) {
                tracing::warn!(error = %err, "cannot create the agent's own directory");
            }
        }
        // A session made by a fork starts with pi's session file already there (branch.rs).
        let resume =
            spawned_before || self.session.has_turns() || branch::holds_session_file(&session_dir);
        let workspace = PathBuf::from(&self.session.workspace);
        let place = AgentPlace {
            own: vec![session_dir.clone(), export_dir, temp_dir.clone()],
            ..self.place(host, &workspace)
        };
        let env = |name: &str, path: &Path| (name.to_string(), path.display().to_string());
        let spec = AgentSpec {
            command: host.agent_command(resume),
            launch: Some(host.agent_launch(&place)),
            workspace,
            env: vec![
                env("PI_CODING_AGENT_SESSION_DIR", &session_dir),
                env("TMPDIR", &temp_dir),
            ],
        };
        (spec, place)
    }

    /// Replaces an idle agent started before the host's settings last changed (a key or a
    /// provider): it would run on the old ones. A running turn keeps its agent; the next turn
    /// after it gets a new one.
    fn retire_stale(&self, host: &impl DriverHost, state: &mut DriverState) {
        if state.active.is_some() || state.generation == host.models().generation() {
            return;
        }
        if let Some(stale) = self.take_agent(state, &host.drivers().counts) {
            tracing::info!(session_id = %self.session.id, "restarting the agent: the host's model settings changed");
            // Not under the driver's lock: the pump drains the agent's last output meanwhile.
            tokio::spawn(async move { stale.shutdown().await });
        }
    }

    /// Between turns, an agent whose sandbox no longer matches its session (a grant since it
    /// started, or a move into or out of plan mode) is stopped, with `session.agent_stopped`
    /// (reason `sandbox`): the next agent starts with the new ruleset and resumes the same
    /// conversation (docs/reliability.md §4.19).
    async fn retire_for_sandbox(&self, host: &impl DriverHost, state: &mut DriverState) {
        if state.active.is_some() || state.agent.is_none() {
            return;
        }
        let now = self.place(host, Path::new(&self.session.workspace));
        if now.same_sandbox(&state.place) {
            return;
        }
        let idle_ms = state
            .last_used
            .map_or(0, |at| at.elapsed().as_millis() as u64);
        if let Some(stale) = self.take_agent(state, &host.drivers().counts) {
            tracing::info!(session_id = %self.session.id, "restarting the agent: its sandbox changed");
            tokio::spawn(async move { stale.shutdown().await });
            let event = HostEvent::of_session(AgentStoppedData {
                reason: AgentStopReason::Sandbox,
                idle_ms,
            });
            if let Err(err) = host.sessions().commit(&self.session, vec![event]).await {
                tracing::warn!(error = %err, "cannot record the agent's restart");
            }
        }
    }

    /// Where the session's agent runs, as its sandbox sees it: plan mode reads only, and the
    /// directories a person granted writes in.
    fn place(&self, host: &impl DriverHost, workspace: &Path) -> AgentPlace {
        let read_only = self
            .session
            .settings()
            .permission_mode
            .unwrap_or(host.config().permission_mode)
            == PermissionMode::Plan;
        let granted = host
            .store()
            .grants(&self.session.id)
            .unwrap_or_default()
            .into_iter()
            .filter(|g| {
                g.scope == GrantScope::Directory && matches!(g.tool.as_str(), "write" | "edit")
            })
            .map(|g| PathBuf::from(g.value))
            .collect();
        let canonical = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.into());
        let unconfined = host.config().sandbox.off_in.iter().any(|dir| {
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            canonical.starts_with(dir)
        });
        AgentPlace {
            workspace: workspace.to_path_buf(),
            own: Vec::new(),
            read_only,
            granted,
            unconfined,
        }
    }

    /// Checks, before a turn is recorded, that the agent has a model it can run on: none is
    /// MODEL_NOT_CONFIGURED, one whose provider has no credential PROVIDER_SECRET_MISSING, and
    /// a session model the agent did not take (its `set_model` failed) whichever of the two the
    /// catalogue says; no request reaches a provider.
    async fn ready(
        &self,
        host: &impl DriverHost,
        agent: &Agent,
        state: &mut DriverState,
    ) -> Result<(), AppError> {
        let current = agent.current_model().await.map_err(|e| e.to_app_error())?;
        if let Some(wanted) = self.session.settings().model
            && current.as_ref() != Some(&wanted)
        {
            crate::models::check(host, &wanted).await?;
            return Err(crate::models::not_configured(&wanted));
        }
        let Some(current) = current else {
            return Err(AppError::new(
                ErrorCode::ModelNotConfigured,
                "the host's agent has no model to run on: pick one that model/list shows \
                 (session/configure, pi-remote configure), or set a provider's key",
            ));
        };
        // A model server added from a client that wants a key pi sees as keyed (pi-host's
        // extension registers it with a placeholder): the host knows better.
        if host.models().lacks_key(&current.provider) {
            return Err(crate::models::secret_missing(&current.provider));
        }
        if state.available.is_none() {
            state.available = Some(agent.available_models().await.map_err(drop));
        }
        match &state.available {
            Some(Ok(models)) if !models.contains(&current) => {
                Err(crate::models::secret_missing(&current.provider))
            }
            _ => Ok(()),
        }
    }

    /// The events of `agent`'s exit: the running turn ends and the queue behind it is
    /// withdrawn. An agent stopped while idle may exit after the next turn started another:
    /// only the exit of the agent that runs the turn (or of one taken out by `stop_session`)
    /// ends it.
    fn on_exit(
        &self,
        host: &impl DriverHost,
        state: &mut DriverState,
        agent: &Agent,
        (status, signal, stderr_tail): (Option<i32>, Option<i32>, String),
    ) -> Vec<HostEvent> {
        let runs_the_turn = match &state.agent {
            Some(current) => current.pid() == agent.pid(),
            None => true,
        };
        if !runs_the_turn {
            return Vec::new();
        }
        self.take_agent(state, &host.drivers().counts);
        let mut events = Vec::new();
        if let Some(active) = state.active.take() {
            events = ended_by_exit(host, active, status, signal, stderr_tail);
        }
        events.extend(queue::withdraw_all(state, WithdrawReason::AgentStopped));
        events
    }

    /// Takes the running agent out of the state (the caller stops it).
    fn take_agent(
        &self,
        state: &mut DriverState,
        counts: &crate::metrics::AgentCounts,
    ) -> Option<Agent> {
        self.agent_pid.store(0, Ordering::Relaxed);
        let taken = state.agent.take();
        if taken.is_some() {
            counts.stopped.inc();
        }
        taken
    }

    /// A failed run of the running turn waits for pi's retry decision.
    async fn awaits_retry(&self) -> bool {
        let state = self.state.lock().await;
        state
            .active
            .as_ref()
            .and_then(|a| a.pending.as_ref())
            .is_some_and(|p| !p.held)
    }

    /// Ends the running turn with its pending failure: pi did not retry it.
    async fn settle_pending(&self, host: &impl DriverHost) -> Vec<HostEvent> {
        let mut state = self.state.lock().await;
        let Some(active) = state.active.as_mut() else {
            return Vec::new();
        };
        let Some(pending) = active.pending.take() else {
            return Vec::new();
        };
        let (outcome, error) = settled(active, &pending);
        let turn_id = active.turn_id.clone();
        state.active = None;
        let mut events = end_of_turn(host, &turn_id, outcome, error);
        // Not completed: the queue is withdrawn, no prompt follows.
        queue::after_turn(&self.session, &mut state, outcome, &mut events);
        events
    }

    /// Ends `turn_id`, if it is still the running turn, when pi did not take its prompt. An
    /// agent that died under the prompt settles it as aborted, like a crash mid-run
    /// (protocol.md §8.7).
    async fn prompt_refused(&self, host: &impl DriverHost, turn_id: &str, err: &AgentError) {
        let error = err.to_app_error();
        let outcome = if error.code() == ErrorCode::AgentSidecarCrashed {
            TurnOutcome::Aborted
        } else {
            TurnOutcome::Failed
        };
        self.end_unprompted(host, turn_id, outcome, error).await;
    }

    /// Ends `turn_id`, if it is still the running turn, though its prompt never ran; the queue
    /// behind it is withdrawn.
    async fn end_unprompted(
        &self,
        host: &impl DriverHost,
        turn_id: &str,
        outcome: TurnOutcome,
        error: AppError,
    ) {
        let mut state = self.state.lock().await;
        if state.active.as_ref().is_none_or(|a| a.turn_id != turn_id) {
            return;
        }
        state.active = None;
        let mut events = end_of_turn(host, turn_id, outcome, Some(error));
        queue::after_turn(&self.session, &mut state, outcome, &mut events);
        if let Err(err) = host.sessions().commit(&self.session, events).await {
            tracing::warn!(error = %err, "cannot record the end of a turn");
        }
    }

    /// A dialog of the running turn becomes an approval (`approval.requested`, not an agent
    /// event); one outside any turn has nobody to answer it and is cancelled at once.
    async fn open_dialog(
        &self,
        host: &Arc<impl DriverHost>,
        agent: &Agent,
        turn_id: Option<String>,
        request: approvals::Request,
    ) -> Option<HostEvent> {
        match turn_id {
            Some(turn_id) => {
                let approvals = &host.drivers().approvals;
                Some(approvals.open(host, &self.session, agent, &turn_id, request))
            }
            None => {
                let id = request.id;
                let _ = agent.answer_ui(&id, UiAnswer::Cancelled).await;
                None
            }
        }
    }

    /// Turns a batch of agent output into events, under the driver's lock (which orders them
    /// with turn starts and aborts).
    async fn translate(
        self: &Arc<Self>,
        host: &Arc<impl DriverHost>,
        agent: &Agent,
        batch: Vec<AgentOutput>,
    ) -> Vec<HostEvent> {
        let mut events = Vec::with_capacity(batch.len());
        let mut state = self.state.lock().await;
        state.last_used = Some(Instant::now());
        for out in batch {
            // Not for an agent event, the bulk: on_agent_event names its turn itself.
            let turn_id = || state.active.as_ref().map(|a| a.turn_id.clone());
            match out {
                AgentOutput::Event(event) => {
                    let next = on_agent_event(host, &self.session, &mut state, event, &mut events);
                    if let Some(next) = next {
                        self.send_next(host, agent, next);
                    }
                }
                AgentOutput::UiRequest(dialog) if permissions::is_request(&dialog) => {
                    let turn_id = turn_id();
                    let decided = self.on_policy_request(host, agent, turn_id, dialog).await;
                    events.extend(decided);
                }
                AgentOutput::UiRequest(dialog) => {
                    let turn_id = turn_id();
                    let opened = self.open_dialog(host, agent, turn_id, dialog).await;
                    events.extend(opened);
                }
                AgentOutput::UiNotice { method, payload } => {
                    tracing::trace!(method, "agent notice");
                    events.push(HostEvent::relayed(
                        Kind::ExtensionUiRequest,
                        turn_id(),
                        payload,
                    ));
                }
                AgentOutput::Response { response, payload } => {
                    let pi::Response {
                        command,
                        success,
                        error,
                        ..
                    } = response;
                    tracing::debug!(command, success, ?error, "a response nobody waited for");
                    events.push(HostEvent::relayed(Kind::Response, turn_id(), payload));
                }
                AgentOutput::Exited {
                    status,
                    signal,
                    stderr_tail,
                } => {
                    let exit = (status, signal, stderr_tail);
                    events.extend(self.on_exit(host, &mut state, agent, exit));
                }
            }
        }
        events
    }
}

impl From<AgentError> for AppError {
    fn from(err: AgentError) -> Self {
        err.to_app_error()
    }
}
