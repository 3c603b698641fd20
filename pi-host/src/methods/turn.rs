//! The `turn/*` methods and `approval/respond` (docs/protocol.md §7.5-§7.10, §7.25, §10): each
//! handed to the session's driver (`crate::driver`), which runs turns on the agent.

use crate::auth::Caller;
use crate::state::HostState;
use racp_proto::methods::turn::{
    ApprovalRespondParams, ApprovalRespondResult, TurnFollowUpParams, TurnFollowUpResult, TurnRef,
    TurnStartParams, TurnStartResult, TurnSteerParams,
};
use racp_proto::{Ack, AppError};
use std::sync::Arc;

/// `turn/start`: idempotent by key; AGENT_BUSY while another turn runs.
pub async fn start(
    state: Arc<HostState>,
    caller: Caller,
    params: TurnStartParams,
) -> Result<TurnStartResult, AppError> {
    state.drivers.start(&state, &caller, params).await
}

/// `turn/steer`: guidance for the running turn.
pub async fn steer(state: Arc<HostState>, params: TurnSteerParams) -> Result<Ack, AppError> {
    state.drivers.steer(&state, params).await
}

/// `turn/follow_up`: queued behind the running turn, or started at once (driver/queue.rs).
pub async fn follow_up(
    state: Arc<HostState>,
    caller: Caller,
    params: TurnFollowUpParams,
) -> Result<TurnFollowUpResult, AppError> {
    state.drivers.follow_up(&state, &caller, params).await
}

/// `turn/abort`: a finished turn's abort changes nothing.
pub async fn abort(
    state: Arc<HostState>,
    caller: Caller,
    params: TurnRef,
) -> Result<Ack, AppError> {
    state.drivers.abort(&state, &caller, params).await
}

/// `approval/respond`: the first answer wins (driver/approvals.rs).
pub async fn approval_respond(
    state: Arc<HostState>,
    caller: Caller,
    params: ApprovalRespondParams,
) -> Result<ApprovalRespondResult, AppError> {
    state
        .drivers
        .approvals
        .respond(&state, &caller, params)
        .await
}
