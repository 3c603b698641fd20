//! The host's upgrade checks: draining, then the checks every RACP-WS server makes
//! (`racp_server::upgrade`), the device's token, and a place under the connection cap.

use crate::auth::{Credential, authenticate};
use crate::connections::Slot;
use crate::state::HostState;
use axum::http::HeaderMap;
use racp_proto::{AppError, ErrorCode};

pub use racp_server::upgrade::*;

/// Runs every check and returns the caller's credential and its place under the connection cap.
pub fn admit(state: &HostState, headers: &HeaderMap) -> Result<(Credential, Slot), AppError> {
    if state.is_draining() {
        return Err(crate::state::shutting_down());
    }
    check_host_header(headers, &state.config.allowed_hosts)?;
    let token = presented_token(headers, &state.config.allowed_origins)?;
    let credential = authenticate(state, token)?;
    // A place is taken here, not when the connection starts: concurrent upgrades cannot all
    // pass the cap before any of them is counted.
    let slot = state
        .connections
        .admit(state.config.limits.max_connections)
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::HostOverloaded,
                "the host has as many connections as it accepts",
            )
            .with_retry_after_ms(1000)
        })?;
    Ok((credential, slot))
}
