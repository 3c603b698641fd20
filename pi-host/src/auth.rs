//! Who a call comes from: a paired device, a pairing token, or the host's owner at the admin
//! socket (`server/upgrade.rs` finds it from a presented token).

use racp_proto::{Method, Principal, Role};

/// Who a call comes from, as the host knows it: what the protocol's [`Principal`] says
/// ([`Caller::principal`]), plus the pairing token's id and the rate bucket. The gateway's
/// `Caller` is the same concept.
#[derive(Debug, Clone)]
pub enum Caller {
    Device {
        device_id: String,
        /// Its name, as it was paired (read with its token, once per connection), for the
        /// events its calls record; `None` when a gateway older than the field routed the call.
        name: Option<String>,
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

impl Caller {
    /// The paired device calling (`None` for a pairing token or the owner).
    pub fn device_id(&self) -> Option<&str> {
        match self {
            Caller::Device { device_id, .. } => Some(device_id),
            Caller::Pairing { .. } | Caller::Owner => None,
        }
    }

    /// The paired device's name, for the events its calls record (`deviceName`).
    pub fn device_name(&self) -> Option<&str> {
        match self {
            Caller::Device { name, .. } => name.as_deref(),
            Caller::Pairing { .. } | Caller::Owner => None,
        }
    }

    /// The rate bucket the caller's calls draw on: its device's, or its pairing token's.
    pub fn rate_key(&self) -> String {
        match self {
            Caller::Device { device_id, .. } => device_id.clone(),
            Caller::Pairing { token_id, .. } => format!("pairing:{token_id}"),
            Caller::Owner => "owner".to_string(),
        }
    }

    /// Whether the caller may start agents: whoever may start a turn (an operator or owner).
    /// An observer reads what the host has and starts no agent, so it never stops another
    /// session's agent to make room either (docs/protocol.md §6.1).
    pub fn may_start_agents(&self) -> bool {
        let turn = Method::TurnStart;
        turn.spec()
            .access
            .check(turn.as_str(), &self.principal())
            .is_ok()
    }

    /// The caller as the protocol's access rules see it.
    pub fn principal(&self) -> Principal {
        match self {
            Caller::Device {
                device_id, roles, ..
            } => Principal::Device {
                device_id: device_id.clone(),
                roles: roles.clone(),
            },
            Caller::Pairing { .. } => Principal::Pairing,
            Caller::Owner => Principal::Owner,
        }
    }
}
