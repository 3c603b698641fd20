//! Follow-ups and compaction: what a session's agent does between and after its turns
//! (docs/protocol.md §7.25, §7.26).
//!
//! The host holds the follow-up queue, not pi: pi's own queue cannot be cleared over its RPC
//! mode, goes with its process, and runs a follow-up after a failed run too. Held here, a
//! follow-up waits (`turn.queued`) until the turn before it completes, then is sent as the
//! next prompt (`turn.started`); a clear, an abort or a failure withdraws it (`turn.withdrawn`)
//! with its text, so a client can put it back where it was typed.

use super::turn_end::{earlier_turn, store_turn};
use super::{ActiveTurn, DriverHost, DriverState, Drivers, Raised, closed, known_turn};
use crate::agent::{Agent, AgentError};
use crate::auth::Caller;
use crate::sessions::HostEvent;
use racp_proto::events::{
    TurnOutcome, TurnQueuedData, TurnStartedData, TurnWithdrawnData, WithdrawReason,
};
use racp_proto::limits::{MAX_IMAGES, MAX_QUEUED_FOLLOW_UPS};
use racp_proto::methods::model::QueueMode;
use racp_proto::methods::session::{
    QueuedFollowUp, SessionClearQueueParams, SessionClearQueueResult, SessionCompactParams,
    SessionCompactResult,
};
use racp_proto::methods::turn::{ImageAttachment, TurnFollowUpParams, TurnFollowUpResult};
use racp_proto::pi::{self, Command};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a compaction may take: its summary is a model request over the whole
/// conversation, far longer than a command's usual deadline.
const COMPACT_DEADLINE: Duration = Duration::from_secs(600);

/// The longest provider message a failed compaction's error quotes.
const MAX_REASON_CHARS: usize = 1000;

/// How long a turn/start waits for pi to wind down the run before (its `agent_end` comes
/// before pi takes prompts again) before its turn fails with AGENT_BUSY.
pub(super) const START_PATIENCE: Duration = Duration::from_secs(10);

/// How long a follow-up's prompt waits for pi: after a run pi may compact the conversation
/// (a model request) before it takes the next prompt.
const FOLLOW_UP_PATIENCE: Duration = COMPACT_DEADLINE;

/// A follow-up the host holds for its turn, with the images it goes to the agent with.
pub(super) struct Held {
    pub queued: QueuedFollowUp,
    pub images: Vec<ImageAttachment>,
}

impl Held {
    fn new(turn_id: String, params: TurnFollowUpParams, caller: &Caller) -> Held {
        Held {
            queued: QueuedFollowUp {
                turn_id,
                text: params.text,
                images: params.images.iter().map(ImageAttachment::info).collect(),
                device_id: caller.device_id().map(str::to_string),
                device_name: caller.device_name().map(str::to_string),
            },
            images: params.images,
        }
    }
}

/// LIMIT_EXCEEDED when the queue is full, or when `images` more would bring it past the images
/// it holds: they wait in memory until their turn, all of them in one prompt with
/// `followUpMode: "all"`.
fn room_for(state: &DriverState, images: usize) -> Result<(), AppError> {
    if state.follow_ups.len() >= MAX_QUEUED_FOLLOW_UPS {
        return Err(AppError::new(
            ErrorCode::LimitExceeded,
            format!(
                "{MAX_QUEUED_FOLLOW_UPS} follow-ups already wait: let one run, or clear the \
                 queue (session/clear_queue)"
            ),
        )
        .with_details(json!({"limit": MAX_QUEUED_FOLLOW_UPS})));
    }
    let queued: usize = state.follow_ups.iter().map(|h| h.images.len()).sum();
    if queued + images > MAX_IMAGES {
        return Err(AppError::new(
            ErrorCode::LimitExceeded,
            format!(
                "the queued follow-ups carry {queued} images and a queue holds at most \
                 {MAX_IMAGES}: send this one once the queue has run, or clear it"
            ),
        )
        .with_details(
            json!({"path": "params.images", "limit": MAX_IMAGES, "count": queued + images}),
        ));
    }
    Ok(())
}

/// The follow-up whose turn the host just started: its prompt is sent once the driver's lock
/// is released (pi's answer comes through the pump, which needs it).
pub(super) struct NextPrompt {
    pub turn_id: String,
    /// Its `turn.started`, whose text is the prompt.
    pub started: TurnStartedData,
    pub images: Vec<ImageAttachment>,
}

impl Drivers {
    /// `turn/follow_up`: held while a turn runs, a turn of its own at once otherwise.
    pub async fn follow_up(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        start: TurnFollowUpParams,
    ) -> Result<TurnFollowUpResult, AppError> {
        let session = host.sessions().find(&start.session_id)?;
        let driver = self.driver(&session);
        let mut state = driver.state.lock().await;
        // The key is checked under the driver's lock, so two racing resends see one follow-up.
        if let Some(earlier) = earlier_turn(host, &session, &start)? {
            let queued = state
                .follow_ups
                .iter()
                .any(|held| held.queued.turn_id == earlier.turn_id);
            return Ok(TurnFollowUpResult {
                turn_id: earlier.turn_id,
                queued,
            });
        }
        if session.is_closing() {
            return Err(closed(&session));
        }
        // While a compaction goes on it waits, as a local pi keeps what is typed meanwhile.
        if state.active.is_none() && !driver.compacting.load(Ordering::Acquire) {
            drop(state);
            let started = self.start(host, caller, start).await?;
            return Ok(TurnFollowUpResult {
                turn_id: started.turn_id,
                queued: false,
            });
        }
        room_for(&state, start.images.len())?;
        let turn_id = store_turn(host, &session, &start)?;
        let held = Held::new(turn_id.clone(), start, caller);
        let event = HostEvent::of_turn(
            &turn_id,
            TurnQueuedData {
                text: held.queued.text.clone(),
                images: held.queued.images.clone(),
                device_id: held.queued.device_id.clone(),
                device_name: held.queued.device_name.clone(),
            },
        );
        // Under the driver's lock, so the running turn cannot end between the two.
        host.sessions().commit(&session, vec![event]).await?;
        state.follow_ups.push_back(held);
        Ok(TurnFollowUpResult {
            turn_id,
            queued: true,
        })
    }

    /// `session/clear_queue`: withdraws the follow-up named, or all; TURN_NOT_FOUND for a turn
    /// the session never had. One that already left the queue is not withdrawn again.
    pub async fn clear_queue(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionClearQueueParams,
    ) -> Result<SessionClearQueueResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let mut state = driver.state.lock().await;
        let withdrawn: Vec<Held> = match &params.turn_id {
            None => state.follow_ups.drain(..).collect(),
            Some(turn_id) => {
                let at = state
                    .follow_ups
                    .iter()
                    .position(|held| &held.queued.turn_id == turn_id);
                match at.and_then(|at| state.follow_ups.remove(at)) {
                    Some(held) => vec![held],
                    None => {
                        known_turn(host, &session, turn_id)?;
                        Vec::new()
                    }
                }
            }
        };
        let events = withdrawal(&withdrawn, WithdrawReason::Cleared, None, Some(caller));
        if !events.is_empty() {
            host.sessions().commit(&session, events).await?;
            tracing::info!(session_id = %session.id, count = withdrawn.len(), "follow-ups withdrawn");
        }
        Ok(SessionClearQueueResult {
            withdrawn: withdrawn.into_iter().map(|held| held.queued).collect(),
        })
    }

    /// `session/compact`: pi summarises the conversation. Refused while a turn runs (pi would
    /// abort it first) and while another compaction goes on; a turn waits for it to end.
    pub async fn compact(
        &self,
        host: &Arc<impl DriverHost>,
        params: SessionCompactParams,
    ) -> Result<SessionCompactResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let agent = self.agent_for(host, &session).await?;
        let compacting = {
            let mut state = driver.state.lock().await;
            if let Some(active) = &state.active {
                return Err(AppError::new(
                    ErrorCode::AgentBusy,
                    "a turn is running: compact once it has finished (or abort it)",
                )
                .with_details(json!({"turnId": active.turn_id})));
            }
            let guard = Raised::raise(
                &driver,
                |d| &d.compacting,
                "the session is already compacting its conversation",
            )?;
            driver.ready(host, &agent, &mut state).await?;
            guard
        };
        // Follow-ups queued meanwhile start at pi's `compaction_end` (the pump's on_agent_event),
        // which pi writes however its compaction ends. A task of its own, so that an agent that
        // refuses the command as unknown (and says nothing) still has them started, even if the
        // caller has gone.
        let (host, driver) = (host.clone(), driver.clone());
        let compaction = tokio::spawn(async move {
            let command = Command::Compact {
                custom_instructions: params.instructions.as_deref(),
            };
            let done = agent.call_within(&command, COMPACT_DEADLINE).await;
            drop(compacting);
            if let Err(err) = &done
                && err.is_unknown_command()
            {
                driver.start_queued(&host).await;
            }
            done
        });
        let data = compaction
            .await
            .map_err(crate::internal)?
            .map_err(|err| compaction_failed(&err))?;
        tracing::info!(session_id = %session.id, "session compacted");
        serde_json::from_value(data).map_err(crate::internal)
    }
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

/// The `turn.withdrawn` of each follow-up in `held`.
fn withdrawal(
    held: &[Held],
    reason: WithdrawReason,
    joined_turn_id: Option<&str>,
    by: Option<&Caller>,
) -> Vec<HostEvent> {
    withdrawn(held.iter().map(|h| &h.queued), reason, joined_turn_id, by)
}

/// The `turn.withdrawn` of each of `queued`.
fn withdrawn<'a>(
    queued: impl Iterator<Item = &'a QueuedFollowUp>,
    reason: WithdrawReason,
    joined_turn_id: Option<&str>,
    by: Option<&Caller>,
) -> Vec<HostEvent> {
    queued
        .map(|queued| {
            HostEvent::of_turn(
                &queued.turn_id,
                TurnWithdrawnData {
                    text: queued.text.clone(),
                    reason,
                    joined_turn_id: joined_turn_id.map(str::to_string),
                    device_id: by.and_then(Caller::device_id).map(str::to_string),
                    device_name: by.and_then(Caller::device_name).map(str::to_string),
                },
            )
        })
        .collect()
}

/// What the queue does once the running turn has ended (its `turn.finished` is in `events`):
/// after a completed turn the next follow-up's turn starts (every queued one joined into it
/// with `followUpMode: "all"`, as pi delivers them), returned as the prompt to send; after any
/// other end, or with no agent left to run it, the queue is withdrawn.
pub(super) fn after_turn(
    session: &crate::sessions::Session,
    state: &mut DriverState,
    outcome: TurnOutcome,
    events: &mut Vec<HostEvent>,
) -> Option<NextPrompt> {
    if state.follow_ups.is_empty() {
        return None;
    }
    if outcome != TurnOutcome::Completed || state.agent.is_none() {
        let reason = if state.agent.is_none() {
            WithdrawReason::AgentStopped
        } else {
            WithdrawReason::TurnEnded
        };
        events.extend(withdraw_all(state, reason));
        return None;
    }
    let first = state.follow_ups.pop_front()?;
    let joined: Vec<Held> = if session.settings().follow_up_mode == Some(QueueMode::All) {
        state.follow_ups.drain(..).collect()
    } else {
        Vec::new()
    };
    let next = NextPrompt::joining(first, &joined);
    tracing::info!(turn_id = %next.turn_id, joined = joined.len(), "a follow-up's turn starts");
    events.push(HostEvent::of_turn(&next.turn_id, next.started.clone()));
    events.extend(withdrawal(
        &joined,
        WithdrawReason::Joined,
        Some(&next.turn_id),
        None,
    ));
    state.ran_turn = true;
    state.active = Some(ActiveTurn::new(next.turn_id.clone()));
    Some(next)
}

impl NextPrompt {
    /// The prompt of `first`'s turn, with the texts and images of the follow-ups `joined` to
    /// it after a blank line each.
    fn joining(first: Held, joined: &[Held]) -> NextPrompt {
        let Held { queued, mut images } = first;
        let mut text = queued.text;
        for held in joined {
            text.push_str("\n\n");
            text.push_str(&held.queued.text);
            images.extend(held.images.iter().cloned());
        }
        let started = TurnStartedData {
            text,
            images: images.iter().map(ImageAttachment::info).collect(),
            device_id: queued.device_id,
            device_name: queued.device_name,
        };
        NextPrompt {
            turn_id: queued.turn_id,
            started,
            images,
        }
    }
}

/// Every queued follow-up withdrawn for `reason` (the agent stopped, the host restarted).
pub(super) fn withdraw_all(state: &mut DriverState, reason: WithdrawReason) -> Vec<HostEvent> {
    let held: Vec<Held> = state.follow_ups.drain(..).collect();
    withdrawal(&held, reason, None, None)
}

/// The follow-ups a restarted host no longer holds, as the log last showed them.
pub(super) fn withdrawn_by_restart(queued: &[QueuedFollowUp]) -> Vec<HostEvent> {
    withdrawn(queued.iter(), WithdrawReason::HostRestarted, None, None)
}

impl super::Driver {
    /// Sends the prompt of the running turn `turn_id`, waiting while pi still winds down the
    /// run before: pi writes `agent_end` before its run has settled (its listeners, an automatic
    /// compaction) and refuses a prompt until then, though the host has already ended that turn.
    /// A prompt pi refuses ends the turn (and withdraws the queue behind it); so does an abort
    /// that comes while it waits, since no run of pi's would end it.
    pub(super) async fn send_prompt(
        &self,
        host: &impl DriverHost,
        agent: &Agent,
        turn_id: &str,
        (text, images): (&str, &[ImageAttachment]),
        patience: Duration,
    ) {
        let deadline = Instant::now() + patience;
        let mut pause = Duration::from_millis(10);
        loop {
            let refused = match agent.prompt(text, images).await {
                Ok(()) => return self.abort_if_asked(agent, turn_id).await,
                Err(err) => err,
            };
            if !refused.is_busy() || Instant::now() >= deadline {
                return self.prompt_refused(host, turn_id, &refused).await;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
            let state = self.state.lock().await;
            match &state.active {
                Some(active) if active.turn_id == turn_id && !active.abort_requested => {}
                Some(active) if active.turn_id == turn_id => {
                    drop(state);
                    let error = AppError::new(ErrorCode::TurnAborted, "the turn was aborted");
                    return self
                        .end_unprompted(host, turn_id, TurnOutcome::Aborted, error)
                        .await;
                }
                // Ended meanwhile (its agent exited, the session closed).
                _ => return,
            }
        }
    }

    /// An abort that came while a prompt was on its way may have reached pi before the prompt
    /// did, and ended nothing: the run the prompt started is aborted now.
    async fn abort_if_asked(&self, agent: &Agent, turn_id: &str) {
        let asked = self
            .state
            .lock()
            .await
            .active
            .as_ref()
            .is_some_and(|active| active.turn_id == turn_id && active.abort_requested);
        if asked && let Err(err) = agent.abort().await {
            tracing::warn!(turn_id, error = %err, "the agent did not take an abort");
        }
    }

    /// Starts the follow-ups queued while no turn ran (during a compaction the agent did not
    /// know), as a completed turn would.
    async fn start_queued(self: &Arc<Self>, host: &Arc<impl DriverHost>) {
        let mut state = self.state.lock().await;
        if state.active.is_some() || state.follow_ups.is_empty() {
            return;
        }
        let mut events = Vec::new();
        let next = after_turn(
            &self.session,
            &mut state,
            TurnOutcome::Completed,
            &mut events,
        );
        if let Err(err) = host.sessions().commit(&self.session, events).await {
            tracing::warn!(error = %err, "cannot record a follow-up's start");
        }
        if let (Some(next), Some(agent)) = (next, state.agent.clone()) {
            self.send_next(host, &agent, next);
        }
    }

    /// Sends the prompt of the follow-up whose turn `after_turn` started.
    pub(super) fn send_next(
        self: &Arc<Self>,
        host: &Arc<impl DriverHost>,
        agent: &Agent,
        next: NextPrompt,
    ) {
        let (host, driver, agent) = (host.clone(), self.clone(), agent.clone());
        tokio::spawn(async move {
            let prompt = (next.started.text.as_str(), next.images.as_slice());
            driver
                .send_prompt(&*host, &agent, &next.turn_id, prompt, FOLLOW_UP_PATIENCE)
                .await;
        });
    }
}
