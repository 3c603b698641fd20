//! How a turn is recorded and how it ends: its row under the idempotency key and
//! `turn.started`; `turn.finished` with the outcome pi's run, a retry, an abort or the agent's
//! death decides (docs/protocol.md §8.7).

use super::{ActiveTurn, DriverHost, UnsettledFailure, trace_id};

use crate::agent::failure::{self, Verdict};
use crate::auth::Caller;
use crate::sessions::{HostEvent, Session};
use crate::store::TurnRow;
use racp_proto::events::{TurnFinishedData, TurnOutcome, TurnStartedData};
use racp_proto::methods::turn::{TurnStartParams, TurnStartResult};
use racp_proto::{AppError, ErrorCode, ErrorSource};
use racp_server::clock::now_ms;
use serde_json::json;
use std::sync::Arc;

/// The events that end a turn: its pending approvals settled as cancelled, then
/// `turn.finished`.
pub(super) fn end_of_turn(
    host: &impl DriverHost,
    turn_id: &str,
    outcome: TurnOutcome,
    error: Option<AppError>,
) -> Vec<HostEvent> {
    let mut events = host.drivers().approvals.cancel_turn(host, turn_id);
    if let Some(error) = &error {
        // The traceId in the event finds this line (protocol.md §8.7).
        tracing::warn!(
            turn_id,
            ?outcome,
            code = %error.code(),
            trace_id = error.trace_id().unwrap_or(""),
            message = error.message(),
            details = %error.details().cloned().unwrap_or_default(),
            "turn did not complete"
        );
    }
    let files = host.workspaces().take_turn(turn_id);
    events.push(HostEvent::of_turn(
        turn_id,
        TurnFinishedData {
            outcome,
            error,
            files,
        },
    ));
    events
}

/// The earlier turn of a resent `turn/start` (same idempotency key); IDEMPOTENCY_CONFLICT when
/// the key started a turn with other input.
pub(super) fn earlier_turn(
    host: &impl DriverHost,
    session: &Session,
    params: &TurnStartParams,
) -> Result<Option<TurnStartResult>, AppError> {
    let Some(turn) = host
        .store()
        .turn_by_key(&session.id, &params.idempotency_key)
        .map_err(crate::internal)?
    else {
        return Ok(None);
    };
    if turn.text != params.text {
        return Err(AppError::new(
            ErrorCode::IdempotencyConflict,
            "this idempotency key already started a turn with other input",
        )
        .with_details(json!({"idempotencyKey": params.idempotency_key, "turnId": turn.turn_id})));
    }
    Ok(Some(TurnStartResult {
        turn_id: turn.turn_id,
    }))
}

/// Stores a new turn under its idempotency key and commits `turn.started`; returns its id.
pub(super) async fn record_turn(
    host: &impl DriverHost,
    session: &Arc<Session>,
    caller: &Caller,
    params: &TurnStartParams,
) -> Result<String, AppError> {
    let turn_id = store_turn(host, session, params)?;
    let started = HostEvent::of_turn(
        &turn_id,
        TurnStartedData {
            text: params.text.clone(),
            images: params.images.iter().map(|image| image.info()).collect(),
            device_id: caller.device_id().map(str::to_string),
            device_name: caller.device_name().map(str::to_string),
        },
    );
    host.sessions().commit(session, vec![started]).await?;
    Ok(turn_id)
}

/// Stores a new turn (started or queued) under its idempotency key; returns its id.
pub(super) fn store_turn(
    host: &impl DriverHost,
    session: &Session,
    params: &TurnStartParams,
) -> Result<String, AppError> {
    let turn_id = host.secrets().new_id("turn_").map_err(crate::internal)?;
    let row = TurnRow {
        turn_id: turn_id.clone(),
        idempotency_key: params.idempotency_key.clone(),
        text: params.text.clone(),
        started_at: now_ms(),
    };
    host.store()
        .insert_turn(&session.id, &row)
        .map_err(crate::internal)?;
    Ok(turn_id)
}

/// A turn's outcome and error from the classifier's verdict; `None` while pi may still retry.
pub(super) fn outcome_of(
    verdict: Verdict,
    abort_requested: bool,
) -> Option<(TurnOutcome, Option<AppError>)> {
    if abort_requested {
        let error = AppError::new(ErrorCode::TurnAborted, "the turn was aborted");
        return Some((TurnOutcome::Aborted, Some(error)));
    }
    match verdict {
        Verdict::Completed => Some((TurnOutcome::Completed, None)),
        Verdict::Aborted(error) => Some((TurnOutcome::Aborted, Some(error))),
        Verdict::Failed(error) => Some((TurnOutcome::Failed, Some(error))),
        Verdict::FailedUnlessRetried(_) => None,
    }
}

/// The end of a turn whose failed run pi did not retry (or gave up on).
pub(super) fn settled(
    active: &mut ActiveTurn,
    pending: &UnsettledFailure,
) -> (TurnOutcome, Option<AppError>) {
    // Nothing more will come of this run: its verdict is final.
    active.retries.gave_up = true;
    let verdict = failure::verdict(&pending.end, &active.retries, &trace_id());
    outcome_of(verdict, active.abort_requested).unwrap_or((TurnOutcome::Failed, None))
}

/// The events that end the running turn when its agent process exits. A run that already
/// failed explains the turn better than the exit does.
pub(super) fn ended_by_exit(
    host: &impl DriverHost,
    mut active: ActiveTurn,
    status: Option<i32>,
    signal: Option<i32>,
    stderr_tail: String,
) -> Vec<HostEvent> {
    let (outcome, error) = match active.pending.take() {
        Some(pending) if !active.abort_requested => settled(&mut active, &pending),
        _ => {
            let (outcome, error) =
                died_during_turn(active.abort_requested, status, signal, stderr_tail);
            (outcome, Some(error))
        }
    };
    end_of_turn(host, &active.turn_id, outcome, error)
}

/// The error a turn ends with when its agent process dies under it: AGENT_SIDECAR_OOM when V8
/// reported its heap limit (the same input fails the same way), else AGENT_SIDECAR_CRASHED, and
/// the turn settles as aborted (docs/protocol.md §8.7).
fn died_during_turn(
    abort_requested: bool,
    status: Option<i32>,
    signal: Option<i32>,
    stderr_tail: String,
) -> (TurnOutcome, AppError) {
    if abort_requested {
        let error = AppError::new(ErrorCode::TurnAborted, "the turn was aborted");
        return (TurnOutcome::Aborted, error);
    }
    let details = json!({
        "exitCode": status,
        "signal": signal,
        "stderrTail": stderr_tail,
    });
    if failure::is_heap_exhausted(&stderr_tail) {
        let error = AppError::new(
            ErrorCode::AgentSidecarOom,
            "the agent process ran out of JavaScript heap during the turn",
        )
        .with_source(ErrorSource::Agent)
        .with_details(details)
        .with_trace_id(trace_id());
        return (TurnOutcome::Failed, error);
    }
    let error = AppError::new(
        ErrorCode::AgentSidecarCrashed,
        "the agent process died during the turn; the next turn restarts it",
    )
    .with_source(ErrorSource::Agent)
    .with_details(details)
    .with_trace_id(trace_id());
    (TurnOutcome::Aborted, error)
}
