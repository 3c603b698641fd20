//! `pair`: a pairing connection's token exchanged for a device credential
//! (docs/protocol.md §5.3); `hello` is the connection core's.

use crate::auth::Caller;
use crate::state::HostState;
use crate::store::{DeviceRow, PairingOutcome};
use racp_proto::methods::handshake::{PairParams, PairResult};
use racp_proto::{AppError, ErrorCode};
use racp_server::clock::now_ms;

/// `pair`.
pub fn pair(
    state: &HostState,
    caller: &Caller,
    params: PairParams,
) -> Result<PairResult, AppError> {
    let Caller::Pairing { token_id, roles } = caller else {
        return Err(state.internal("pair called by a caller without a pairing token"));
    };
    let device_id = state
        .secrets
        .new_id("dev_")
        .map_err(|e| state.internal(e))?;
    let minted = state
        .secrets
        .mint_device(device_id)
        .map_err(|e| state.internal(e))?;
    let row = DeviceRow {
        device_id: minted.id.clone(),
        name: params.device_name,
        roles: roles.clone(),
        token_tag: minted.tag,
        created_at: now_ms(),
        last_seen_at: None,
        revoked: false,
    };
    match state
        .store
        .exchange_pairing_token(token_id, &row, now_ms())
        .map_err(|e| state.internal(e))?
    {
        PairingOutcome::Paired => {
            tracing::info!(device_id = %row.device_id, name = %row.name, "device paired");
            Ok(PairResult {
                device_id: row.device_id,
                device_token: minted.token,
                roles: row.roles,
            })
        }
        PairingOutcome::Expired => Err(AppError::new(
            ErrorCode::PairingTokenExpired,
            "this pairing token has expired: mint a new one with `pi-host pair`",
        )),
        PairingOutcome::AlreadyUsed | PairingOutcome::Unknown => Err(AppError::new(
            ErrorCode::PairingFailed,
            "this pairing token was already used: mint a new one with `pi-host pair`",
        )),
    }
}
