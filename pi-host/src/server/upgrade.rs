//! The host's upgrade checks: draining, then the checks every RACP-WS server makes
//! (`racp_server::upgrade`), the device's token, and a place under the connection cap.

use crate::auth::Caller;
use crate::secrets::{self, DEVICE_PREFIX, PAIRING_PREFIX};
use crate::state::HostState;
use axum::http::HeaderMap;
use racp_proto::{AppError, ErrorCode};
use racp_server::clock::now_ms;
use racp_server::connections::Slot;

pub use racp_server::upgrade::*;

/// Runs every check and returns the caller and its place under the connection cap.
pub fn admit(state: &HostState, headers: &HeaderMap) -> Result<(Caller, Slot), AppError> {
    if state.is_draining() {
        return Err(crate::state::shutting_down());
    }
    check_host_header(headers, &state.config.allowed_hosts)?;
    let token = presented_token(headers, &state.config.allowed_origins)?;
    let caller = authenticate(state, token)?;
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
    Ok((caller, slot))
}

fn refused() -> AppError {
    AppError::new(
        ErrorCode::RemoteAuthFailed,
        "the token was not accepted: pair this device again",
    )
}

/// Who a presented token belongs to. Every refusal says the same thing to the caller, so a guess
/// learns nothing about which part was wrong.
fn authenticate(state: &HostState, token: &str) -> Result<Caller, AppError> {
    if let Some(presented) = secrets::split(token, DEVICE_PREFIX) {
        let device = state
            .store
            .device(presented.id)
            .map_err(|e| state.internal(e))?
            .ok_or_else(refused)?;
        if device.revoked || !state.secrets.verify(presented.secret, &device.token_tag) {
            return Err(refused());
        }
        return Ok(Caller::Device {
            device_id: device.device_id,
            name: Some(device.name),
            roles: device.roles,
        });
    }
    if let Some(presented) = secrets::split(token, PAIRING_PREFIX) {
        let now = now_ms();
        let row = state
            .store
            .pairing_token(presented.id)
            .map_err(|e| state.internal(e))?
            .ok_or_else(refused)?;
        if !state.secrets.verify(presented.secret, &row.token_tag) {
            state
                .store
                .fail_pairing_attempt(&row.token_id, state.config.limits.max_pairing_attempts, now)
                .map_err(|e| state.internal(e))?;
            return Err(refused());
        }
        if row.consumed {
            return Err(AppError::new(
                ErrorCode::PairingFailed,
                "this pairing token was already used: mint a new one with `pi-host pair`",
            ));
        }
        if row.expires_at <= now {
            return Err(AppError::new(
                ErrorCode::PairingTokenExpired,
                "this pairing token has expired: mint a new one with `pi-host pair`",
            )
            .with_details(serde_json::json!({"expiredAt": row.expires_at})));
        }
        return Ok(Caller::Pairing {
            token_id: row.token_id,
            roles: row.roles,
        });
    }
    Err(refused())
}
