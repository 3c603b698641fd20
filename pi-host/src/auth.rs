//! Who a call comes from: a paired device, a pairing token, or the host's owner at the admin
//! socket (`server/upgrade.rs` finds it from a presented token).

use racp_proto::methods::handshake::{PrincipalInfo, PrincipalKind};
use racp_proto::{Principal, Role};

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
