//! Follow-ups and compaction: what a session's agent does between and after its turns
//! (docs/protocol.md §7.25, §7.26).
//!
//! pi runs a follow-up in the run it was queued during: when the run would stop, pi takes the
//! next follow-up from its queue (a `queue_update` without it, then the follow-up's user
//! message) and goes on, with one `agent_end` at the very end. The host ends the running turn
//! there and starts the follow-up's own, so that one turn stays one prompt a person sent and
//! everything it caused.

use super::{
    ActiveTurn, DriverState, TurnHost, Turns, closed, earlier_turn, end_of_turn, running_agent,
};
use crate::agent::AgentError;
use crate::auth::Caller;
use crate::clock::now_ms;
use crate::sessions::HostEvent;
use crate::store::TurnRow;
use racp_proto::events::{TurnOutcome, TurnStartedData};
use racp_proto::methods::session::{SessionCompactParams, SessionCompactResult};
use racp_proto::methods::turn::{TurnFollowUpParams, TurnFollowUpResult, TurnStartParams};
use racp_proto::pi::{self, Command};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::MutexGuard;

/// How long a compaction may take: its summary is a model request over the whole
/// conversation, far longer than a command's usual deadline.
const COMPACT_DEADLINE: Duration = Duration::from_secs(600);

/// The longest provider message a failed compaction's error quotes.
const MAX_REASON_CHARS: usize = 1000;

/// A follow-up sent to the agent, waiting in pi's queue for its turn.
pub(super) struct QueuedFollowUp {
    pub turn_id: String,
    /// Its idempotency key: a resend racing the first attempt finds it here before the store
    /// has it.
    pub key: String,
    pub text: String,
    pub device_id: Option<String>,
}

impl Turns {
    /// `turn/follow_up`: queued in pi while a turn runs, a turn of its own at once otherwise.
    pub async fn follow_up(
        &self,
        host: &Arc<impl TurnHost>,
        caller: &Caller,
        params: TurnFollowUpParams,
    ) -> Result<TurnFollowUpResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let start = TurnStartParams {
            session_id: params.session_id,
            idempotency_key: params.idempotency_key,
            text: params.text,
            images: Vec::new(),
        };
        let mut state = driver.state.lock().await;
        // The key is checked under the driver's lock, so two racing resends see one follow-up.
        if let Some(earlier) = earlier_follow_up(host, &session, &state, &start)? {
            return Ok(earlier);
        }
        if session.is_closing() {
            return Err(closed(&session));
        }
        let Some(running) = state.active.as_ref().map(|a| a.turn_id.clone()) else {
            drop(state);
            let started = self.start(host, caller, start).await?;
            return Ok(TurnFollowUpResult {
                turn_id: started.turn_id,
                queued: false,
            });
        };
        let agent = running_agent(host, &session, &state, &running)?;
        let turn_id = host.secrets().new_id("turn_").map_err(crate::internal)?;
        // Known before pi has it, so that the pump recognises it whenever pi takes it.
        state.follow_ups.push_back(QueuedFollowUp {
            turn_id: turn_id.clone(),
            key: start.idempotency_key.clone(),
            text: start.text.clone(),
            device_id: caller.device_id().map(str::to_string),
        });
        drop(state);
        let message = &start.text;
        if let Err(err) = agent.call(&Command::FollowUp { message }).await {
            let mut state = driver.state.lock().await;
            state.follow_ups.retain(|f| f.turn_id != turn_id);
            return Err(err.to_app_error());
        }
        let row = TurnRow {
            turn_id: turn_id.clone(),
            idempotency_key: start.idempotency_key,
            text: start.text,
            started_at: now_ms(),
        };
        host.store()
            .insert_turn(&session.id, &row)
            .map_err(crate::internal)?;
        Ok(TurnFollowUpResult {
            turn_id,
            queued: true,
        })
    }

    /// `session/compact`: pi summarises the conversation. Refused while a turn runs (pi would
    /// abort it first) and while another compaction goes on; a turn waits for it to end.
    pub async fn compact(
        &self,
        host: &Arc<impl TurnHost>,
        params: SessionCompactParams,
    ) -> Result<SessionCompactResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let agent = self.agent_for(host, &session).await?;
        let _compacting = {
            let mut state = driver.state.lock().await;
            if let Some(active) = &state.active {
                return Err(AppError::new(
                    ErrorCode::AgentBusy,
                    "a turn is running: compact once it has finished (or abort it)",
                )
                .with_details(json!({"turnId": active.turn_id})));
            }
            let guard = Compacting::begin(&driver)?;
            driver.ready(host, &agent, &mut state).await?;
            guard
        };
        let command = Command::Compact {
            custom_instructions: params.instructions.as_deref(),
        };
        let data = agent
            .call_within(&command, COMPACT_DEADLINE)
            .await
            .map_err(|err| compaction_failed(&err))?;
        tracing::info!(session_id = %session.id, "session compacted");
        serde_json::from_value(data).map_err(crate::internal)
    }
}

/// The answer to a resent `turn/follow_up` (same key): the turn it started or queued, from
/// the store or, while pi has not answered the first attempt yet, from the driver;
/// IDEMPOTENCY_CONFLICT when the key came with other text.
fn earlier_follow_up(
    host: &impl TurnHost,
    session: &crate::sessions::Session,
    state: &DriverState,
    start: &TurnStartParams,
) -> Result<Option<TurnFollowUpResult>, AppError> {
    if let Some(earlier) = earlier_turn(host, session, start)? {
        let queued = state
            .follow_ups
            .iter()
            .any(|f| f.turn_id == earlier.turn_id);
        return Ok(Some(TurnFollowUpResult {
            turn_id: earlier.turn_id,
            queued,
        }));
    }
    let Some(sent) = state
        .follow_ups
        .iter()
        .find(|f| f.key == start.idempotency_key)
    else {
        return Ok(None);
    };
    if sent.text != start.text {
        return Err(AppError::new(
            ErrorCode::IdempotencyConflict,
            "this idempotency key already queued a follow-up with other input",
        )
        .with_details(json!({"idempotencyKey": sent.key, "turnId": sent.turn_id})));
    }
    Ok(Some(TurnFollowUpResult {
        turn_id: sent.turn_id.clone(),
        queued: true,
    }))
}

impl super::Driver {
    /// AGENT_BUSY while a compaction goes on: pi would run the turn on the context it replaces.
    pub(super) fn refuse_while_compacting(&self) -> Result<(), AppError> {
        if self.compacting.load(Ordering::Acquire) {
            return Err(AppError::new(
                ErrorCode::AgentBusy,
                "the session is compacting its conversation: start the turn once it has finished",
            ));
        }
        if self.branching.load(Ordering::Acquire) {
            return Err(AppError::new(
                ErrorCode::AgentBusy,
                "the session is being forked or cloned: start the turn once that has finished",
            ));
        }
        Ok(())
    }
}

/// The driver's compaction flag, lowered when the compaction ends however it ends (the call's
/// task may be dropped with its connection).
struct Compacting(Arc<super::Driver>);

impl Compacting {
    fn begin(driver: &Arc<super::Driver>) -> Result<Compacting, AppError> {
        driver
            .compacting
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| {
                AppError::new(
                    ErrorCode::AgentBusy,
                    "the session is already compacting its conversation",
                )
            })?;
        Ok(Compacting(driver.clone()))
    }
}

impl Drop for Compacting {
    fn drop(&mut self) {
        self.0.compacting.store(false, Ordering::Release);
    }
}

/// A compaction pi refused or could not finish: CONFLICT when there was nothing to summarise,
/// PROVIDER_ERROR when the summary's model request failed (pi's message says why).
fn compaction_failed(err: &AgentError) -> AppError {
    match err {
        AgentError::Rejected { command, message }
            if pi::Response::is_nothing_to_compact(command, message) =>
        {
            AppError::new(
                ErrorCode::Conflict,
                format!("nothing to compact: {message}"),
            )
            .with_retriable(false)
            .with_details(json!({"reason": message}))
        }
        AgentError::Rejected { message, .. } if !err.is_unknown_command() => {
            let reason: String = message.chars().take(MAX_REASON_CHARS).collect();
            AppError::new(
                ErrorCode::ProviderError,
                format!("the compaction failed: {reason}"),
            )
            // The summary's model request failed, as a turn's may: trying again may work.
            .with_retriable(true)
            .with_source(racp_proto::ErrorSource::Agent)
            .with_details(json!({"reason": reason}))
        }
        _ => err.to_app_error(),
    }
}

/// pi's queue changed: when it took a follow-up the host sent, that follow-up's turn starts
/// here. The running turn ends first (completed: pi takes follow-ups only once its run would
/// stop), unless it has not finished a step yet: then pi delivers the follow-up with the
/// turn's own prompt (its queue mode `all`, or a follow-up left from an aborted run), and it is
/// part of that turn.
pub(super) fn on_queue_update(
    host: &impl TurnHost,
    state: &mut MutexGuard<'_, DriverState>,
    payload: &RawValue,
    events: &mut Vec<HostEvent>,
) {
    let Some(queue) = pi::event::queue_update(payload.get()) else {
        return;
    };
    let taken = pi::event::taken_from(&state.pi_follow_ups, &queue.follow_up);
    state.pi_follow_ups = queue.follow_up;
    let Some(text) = taken else { return };
    let Some(at) = state.follow_ups.iter().position(|f| f.text == text) else {
        // Not one the host sent (an expanded template reads otherwise): it stays in the turn.
        return;
    };
    let Some(follow_up) = state.follow_ups.remove(at) else {
        return;
    };
    if let Some(active) = &state.active {
        if !active.answered {
            return;
        }
        let turn_id = active.turn_id.clone();
        events.extend(end_of_turn(host, &turn_id, TurnOutcome::Completed, None));
    }
    tracing::info!(turn_id = %follow_up.turn_id, "a follow-up's turn starts");
    events.push(HostEvent::of_turn(
        &follow_up.turn_id,
        TurnStartedData {
            text: follow_up.text,
            images: Vec::new(),
            device_id: follow_up.device_id,
        },
    ));
    state.ran_turn = true;
    state.active = Some(ActiveTurn::new(follow_up.turn_id));
}
