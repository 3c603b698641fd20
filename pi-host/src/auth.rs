//! Who a presented token belongs to. Every refusal says the same thing to the caller, so a guess
//! learns nothing about which part was wrong.

use crate::clock::now_ms;
use crate::secrets::{self, DEVICE_PREFIX, PAIRING_PREFIX};
use crate::state::HostState;
use racp_proto::methods::handshake::{PrincipalInfo, PrincipalKind};
use racp_proto::{AppError, ErrorCode, Principal, Role};

/// An authenticated connection's credential.
#[derive(Debug, Clone)]
pub enum Credential {
    Device {
        device_id: String,
        roles: Vec<Role>,
    },
    Pairing {
        token_id: String,
        roles: Vec<Role>,
    },
    /// The host's owner at the admin socket (`pi-host pair|devices|revoke|status`), never a
    /// connection's: the socket is the owner's alone (0600).
    Owner,
}

impl Credential {
    /// The paired device behind the credential (`None` for a pairing token).
    pub fn device_id(&self) -> Option<&str> {
        match self {
            Credential::Device { device_id, .. } => Some(device_id),
            Credential::Pairing { .. } | Credential::Owner => None,
        }
    }

    /// The rate bucket the credential's calls draw on: its device's, or its pairing token's.
    pub fn rate_key(&self) -> String {
        match self {
            Credential::Device { device_id, .. } => device_id.clone(),
            Credential::Pairing { token_id, .. } => format!("pairing:{token_id}"),
            Credential::Owner => "owner".to_string(),
        }
    }

    /// The caller as `hello` names it.
    pub fn hello_principal(&self) -> PrincipalInfo {
        match self {
            Credential::Device { device_id, roles } => racp_server::hello::device(device_id, roles),
            Credential::Pairing { .. } => racp_server::hello::pairing(),
            Credential::Owner => PrincipalInfo {
                kind: PrincipalKind::Device,
                device_id: None,
                roles: vec![Role::Owner],
            },
        }
    }

    pub fn principal(&self) -> Principal {
        match self {
            Credential::Device { device_id, roles } => Principal::Device {
                device_id: device_id.clone(),
                roles: roles.clone(),
            },
            Credential::Pairing { .. } => Principal::Pairing,
            Credential::Owner => Principal::Owner,
        }
    }
}

fn refused() -> AppError {
    AppError::new(
        ErrorCode::RemoteAuthFailed,
        "the token was not accepted: pair this device again",
    )
}

pub fn authenticate(state: &HostState, token: &str) -> Result<Credential, AppError> {
    if let Some(presented) = secrets::split(token, DEVICE_PREFIX) {
        let device = state
            .store
            .device(presented.id)
            .map_err(|e| state.internal(e))?
            .ok_or_else(refused)?;
        if device.revoked || !state.secrets.verify(presented.secret, &device.token_tag) {
            return Err(refused());
        }
        return Ok(Credential::Device {
            device_id: device.device_id,
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
        return Ok(Credential::Pairing {
            token_id: row.token_id,
            roles: row.roles,
        });
    }
    Err(refused())
}
