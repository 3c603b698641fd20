//! Roles, principals and the access rule every method declares.

use crate::error::{AppError, ErrorCode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A device's role. Ordered: `owner` can do everything `operator` can, which can do everything
/// `observer` can.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read and subscribe.
    Observer,
    /// Drive sessions and answer approvals.
    Operator,
    /// Everything, including devices and pairing.
    Owner,
}

impl Role {
    pub const ALL: &'static [Role] = &[Role::Observer, Role::Operator, Role::Owner];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Observer => "observer",
            Role::Operator => "operator",
            Role::Owner => "owner",
        }
    }

    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.iter().copied().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is on the other end of a connection, as established by the upgrade's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A connection opened with a pairing token: it may only call `hello` and `pair`.
    Pairing,
    /// A paired device.
    Device { device_id: String, roles: Vec<Role> },
    /// The host's owner at its admin socket (the Unix user the host runs as): the owner role,
    /// without a device.
    Owner,
}

impl Principal {
    /// The strongest role held, if any.
    pub fn top_role(&self) -> Option<Role> {
        match self {
            Principal::Pairing => None,
            Principal::Device { roles, .. } => roles.iter().copied().max(),
            Principal::Owner => Some(Role::Owner),
        }
    }

    /// The strongest role's name, `none` without one: a metric's label (a closed set).
    pub fn role_label(&self) -> &'static str {
        self.top_role().map_or("none", Role::as_str)
    }
}

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Any authenticated connection, pairing or device (only `hello`).
    Any,
    /// Only a pairing connection (only `pair`).
    Pairing,
    /// A device holding at least this role.
    Role(Role),
}

impl Access {
    /// The wire name used in the method table: `any`, `pairing`, or a role name.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Any => "any",
            Access::Pairing => "pairing",
            Access::Role(role) => role.as_str(),
        }
    }

    /// Decides whether `principal` may call a method with this access rule.
    ///
    /// A pairing connection calling anything but `hello`/`pair` is UNAUTHORIZED (its credential
    /// is of the wrong kind); a device lacking the role, or calling `pair`, is FORBIDDEN.
    pub fn check(self, method: &str, principal: &Principal) -> Result<(), AppError> {
        match (self, principal) {
            (Access::Any, _) | (Access::Pairing, Principal::Pairing) => Ok(()),
            (Access::Role(_), Principal::Pairing) => Err(AppError::new(
                ErrorCode::Unauthorized,
                format!("a pairing connection may only call hello and pair, not {method}"),
            )
            .with_details(serde_json::json!({"method": method, "principal": "pairing"}))),
            (Access::Pairing, Principal::Device { .. } | Principal::Owner) => Err(AppError::new(
                ErrorCode::Forbidden,
                "this device is already paired; pair is only for pairing-token connections",
            )
            .with_details(serde_json::json!({"method": method, "requires": "pairing"}))),
            (Access::Role(_), Principal::Owner) => Ok(()),
            (Access::Role(required), principal @ Principal::Device { roles, .. }) => {
                if principal.top_role().is_some_and(|top| top >= required) {
                    Ok(())
                } else {
                    Err(AppError::new(
                        ErrorCode::Forbidden,
                        format!("{method} needs the {required} role"),
                    )
                    .with_details(serde_json::json!({
                        "method": method,
                        "requiredRole": required,
                        "roles": roles,
                    })))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(roles: &[Role]) -> Principal {
        Principal::Device {
            device_id: "d1".into(),
            roles: roles.to_vec(),
        }
    }

    #[test]
    fn roles_are_ordered_by_power() {
        assert!(Role::Owner > Role::Operator && Role::Operator > Role::Observer);
    }

    #[test]
    fn access_matrix() {
        let op = Access::Role(Role::Operator);
        assert!(op.check("turn/start", &device(&[Role::Owner])).is_ok());
        let owner_only = Access::Role(Role::Owner);
        assert!(owner_only.check("device/revoke", &Principal::Owner).is_ok());
        assert!(Access::Pairing.check("pair", &Principal::Owner).is_err());
        assert!(op.check("turn/start", &device(&[Role::Operator])).is_ok());
        let err = op
            .check("turn/start", &device(&[Role::Observer]))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Forbidden);
        let err = op.check("turn/start", &device(&[])).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Forbidden);
        let err = op.check("turn/start", &Principal::Pairing).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unauthorized);
        assert!(Access::Pairing.check("pair", &Principal::Pairing).is_ok());
        let err = Access::Pairing
            .check("pair", &device(&[Role::Owner]))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Forbidden);
        assert!(Access::Any.check("hello", &Principal::Pairing).is_ok());
    }
}
