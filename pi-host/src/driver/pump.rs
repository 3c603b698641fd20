//! The pump: a task per agent that reads its output in batches and appends each batch as one
//! group of events, waiting for the commit before reading more, so a slow disk pushes back on
//! the agent, never on subscribers; and what each agent event means for the running turn.

use super::turn_end::{end_of_turn, outcome_of, settled};
use super::{
    ActiveTurn, Driver, DriverHost, DriverState, PUMP_BATCH, PUMP_DEPTH, RETRY_SETTLE,
    UnsettledFailure, queue, trace_id,
};
use crate::agent::failure::RetryTrail;
use tokio::sync::MutexGuard;

use crate::agent::failure::{self, RunSignal};
use crate::agent::{Agent, AgentEvent, AgentOutput};
use crate::sessions::{HostEvent, Session};
use racp_proto::AppError;
use racp_proto::events::TurnOutcome;
use racp_proto::pi::Kind;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Reads the agent's output until it exits, appending each batch as one committed group.
///
/// Up to `PUMP_DEPTH` batches are committing while the next is read and translated, so the
/// agent's output is not held up by each fsync; the depth bounds what waits in memory.
pub(super) async fn pump(
    host: Arc<impl DriverHost>,
    driver: Arc<Driver>,
    agent: Agent,
    mut output: mpsc::Receiver<AgentOutput>,
) {
    let session = driver.session.clone();
    let mut committing = Committing::default();
    loop {
        let next = if driver.awaits_retry().await {
            match tokio::time::timeout(RETRY_SETTLE, output.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    // pi said nothing after a failed run it could retry: it did not retry.
                    committing.wait_all(&session).await;
                    let events = driver.settle_pending(&host).await;
                    if !events.is_empty()
                        && let Err(err) = host.sessions().commit(&session, events).await
                    {
                        tracing::warn!(error = %err, session_id = %session.id, "turn end not recorded");
                    }
                    continue;
                }
            }
        } else {
            output.recv().await
        };
        let Some(first) = next else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < PUMP_BATCH {
            match output.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let exited = matches!(batch.last(), Some(AgentOutput::Exited { .. }));
        #[cfg(debug_assertions)]
        if exited {
            crate::test_hooks::before_exit_is_read().await;
        }
        let events = driver.translate(&host, &agent, batch).await;
        if !events.is_empty() {
            match host.sessions().append(&session, events) {
                Ok(committed) => committing.push(committed, &session).await,
                Err(err) => {
                    tracing::warn!(error = %err, session_id = %session.id, "agent output not recorded");
                }
            }
        }
        if exited {
            break;
        }
    }
    committing.wait_all(&session).await;
}

/// Batches of the pump that are queued for commit, oldest first.
#[derive(Default)]
struct Committing(VecDeque<oneshot::Receiver<racp_proto::Cursor>>);

impl Committing {
    /// Adds a batch, first waiting for the oldest when `PUMP_DEPTH` are in flight.
    async fn push(&mut self, committed: oneshot::Receiver<racp_proto::Cursor>, session: &Session) {
        if self.0.len() >= PUMP_DEPTH
            && let Some(oldest) = self.0.pop_front()
        {
            Self::wait(oldest, session).await;
        }
        self.0.push_back(committed);
    }

    async fn wait_all(&mut self, session: &Session) {
        while let Some(oldest) = self.0.pop_front() {
            Self::wait(oldest, session).await;
        }
    }

    async fn wait(committed: oneshot::Receiver<racp_proto::Cursor>, session: &Session) {
        if committed.await.is_err() {
            tracing::warn!(session_id = %session.id, "agent output not recorded: the host is shutting down");
        }
    }
}

/// An agent event is relayed; one that ends the run also ends the running turn, unless the run
/// failed in a way pi may retry: then pi's next event decides (docs/protocol.md §8.7).
pub(super) fn on_agent_event(
    host: &impl DriverHost,
    session: &Session,
    state: &mut MutexGuard<'_, DriverState>,
    event: AgentEvent,
    events: &mut Vec<HostEvent>,
) -> Option<queue::NextPrompt> {
    let mut finished = None;
    if let Some(active) = state.active.as_mut() {
        finished = follow_retry(active, event.signal.as_ref());
        if let Some((outcome, error)) = finished.take() {
            let turn_id = active.turn_id.clone();
            state.active = None;
            let end = end_of_turn(host, &turn_id, outcome, error);
            if event.signal.is_some() {
                // pi's own verdict (`auto_retry_end`, `compaction_end`) belongs to the turn it
                // ends, and comes before `turn.finished`.
                events.push(HostEvent::relayed(event.kind, Some(turn_id), event.payload));
                events.extend(end);
            } else {
                // pi moved on without retrying: the turn ended before this event.
                events.extend(end);
                events.push(HostEvent::relayed(event.kind, None, event.payload));
            }
            return queue::after_turn(session, state, outcome, events);
        }
    }
    let turn_id = state.active.as_ref().map(|a| a.turn_id.clone());
    if let Some(turn_id) = &turn_id {
        host.workspaces()
            .tool_event(session, turn_id, &event.kind, event.payload.get());
    }
    // A compaction outside any turn (`session/compact`) ended: what was queued meanwhile runs,
    // its start logged after pi's `compaction_end` (queue.rs).
    let compacted = turn_id.is_none() && event.kind == Kind::CompactionEnd;
    events.push(HostEvent::relayed(event.kind, turn_id, event.payload));
    if compacted {
        return queue::after_turn(session, state, TurnOutcome::Completed, events);
    }
    if let Some(end) = event.run_end
        && let Some(active) = state.active.as_mut()
    {
        let verdict = failure::verdict(&end, &active.retries, &trace_id());
        match outcome_of(verdict, active.abort_requested) {
            Some(end) => finished = Some(end),
            None => active.pending = Some(UnsettledFailure { end, held: false }),
        }
    }
    if let Some((outcome, error)) = finished
        && let Some(active) = state.active.take()
    {
        events.extend(end_of_turn(host, &active.turn_id, outcome, error));
        return queue::after_turn(session, state, outcome, events);
    }
    None
}

/// Follows pi's retry and overflow-recovery events; returns the turn's end when one settles a
/// pending failure for good.
fn follow_retry(
    active: &mut ActiveTurn,
    signal: Option<&RunSignal>,
) -> Option<(TurnOutcome, Option<AppError>)> {
    match signal {
        Some(RunSignal::RetryStart { attempt }) => {
            active.retries.attempts = active.retries.attempts.max(*attempt);
            active.retrying = active.pending.take().or(active.retrying.take());
            None
        }
        Some(RunSignal::RetryEnd { success: true, .. }) => {
            active.retries = RetryTrail::default();
            active.retrying = None;
            None
        }
        Some(RunSignal::RetryEnd {
            success: false,
            attempt,
        }) => {
            active.retries.attempts = active.retries.attempts.max(*attempt);
            // After a last failed run pi gives up; during its wait, the wait was cancelled.
            let pending = active.pending.take().or(active.retrying.take())?;
            Some(settled(active, &pending))
        }
        Some(RunSignal::CompactionStart { overflow }) => {
            if let Some(pending) = active.pending.as_mut() {
                pending.held = *overflow;
            }
            None
        }
        Some(RunSignal::CompactionEnd { will_retry: true }) => {
            active.pending = None;
            None
        }
        Some(RunSignal::CompactionEnd { will_retry: false }) => {
            let pending = active.pending.take()?;
            Some(settled(active, &pending))
        }
        // Any other event after a failed run: pi moved on without retrying.
        None => {
            let pending = active.pending.take()?;
            Some(settled(active, &pending))
        }
    }
}
