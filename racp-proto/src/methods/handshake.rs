//! `hello` and `pair`: the only calls a pairing connection may make.

use crate::AppError;
use crate::limits::{MAX_ID_CHARS, MAX_NAME_CHARS, MIN_MAX_FRAME_BYTES};
use crate::role::Role;
use crate::validate::{NAME_PATTERN, Validate, length, name, range};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An inclusive range of protocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtocolRange {
    pub min: u32,
    pub max: u32,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientInfo {
    #[schemars(length(min = 1, max = MAX_NAME_CHARS))]
    pub name: String,
    #[schemars(length(min = 1, max = MAX_NAME_CHARS))]
    pub version: String,
}

/// First call on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HelloParams {
    /// Protocol versions the client speaks.
    pub protocol: ProtocolRange,
    pub client: ClientInfo,
    /// Largest frame the client wants to send or receive; the host answers with
    /// `min(this, its own bound)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_MAX_FRAME_BYTES))]
    pub max_frame_bytes: Option<u32>,
    /// Most events the client wants in one `session/events` push (a client that buffers N
    /// events asks for N/2 or fewer, so one push never fills its buffer); the host answers with
    /// `min(this, its own bound)` in `limits.maxEventsPerPush`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_events_per_push: Option<u32>,
}

impl HelloParams {
    /// Events per push on this connection: the client's wish, within the server's bound.
    pub fn events_per_push(&self, server_bound: usize) -> usize {
        self.max_events_per_push
            .map_or(server_bound, |wanted| (wanted as usize).min(server_bound))
            .max(1)
    }
}

impl Validate for HelloParams {
    fn validate(&self) -> Result<(), AppError> {
        length("client.name", &self.client.name, 1, MAX_NAME_CHARS)?;
        length("client.version", &self.client.version, 1, MAX_NAME_CHARS)?;
        if let Some(max) = self.max_events_per_push {
            range("maxEventsPerPush", u64::from(max), 1, u64::from(u32::MAX))?;
        }
        if let Some(max) = self.max_frame_bytes {
            range(
                "maxFrameBytes",
                u64::from(max),
                u64::from(MIN_MAX_FRAME_BYTES),
                u64::from(u32::MAX),
            )?;
        }
        Ok(())
    }
}

/// The host's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostIdentity {
    /// pi-host's version, e.g. `0.1.0`.
    pub version: String,
    /// Stable id of this host's data directory.
    pub id: String,
}

/// What kind of credential opened the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalKind {
    Device,
    Pairing,
}

/// Who the host thinks is calling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalInfo {
    pub kind: PrincipalKind,
    /// The device's id; `null` on a pairing connection.
    pub device_id: Option<String>,
    /// The device's roles; empty on a pairing connection.
    pub roles: Vec<Role>,
}

/// Bounds the host enforces on this connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Largest frame either side may send, in bytes (PAYLOAD_TOO_LARGE beyond it).
    pub max_frame_bytes: u32,
    /// Calls this connection may have in flight at once (HOST_OVERLOADED beyond it).
    pub max_in_flight: u32,
    /// Subscriptions this connection may hold (LIMIT_EXCEEDED beyond it).
    pub max_subscriptions: u32,
    /// Sustained calls per second per device (RATE_LIMITED beyond it).
    pub requests_per_second: u32,
    /// Calls a device may make in a burst above the sustained rate.
    pub request_burst: u32,
    /// Most events in one `session/events` push on this connection.
    pub max_events_per_push: u32,
}

/// The host's answer to `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelloResult {
    /// The protocol version chosen for this connection.
    pub protocol: u32,
    pub host: HostIdentity,
    pub principal: PrincipalInfo,
    /// Optional features this host has on, e.g. `sessions`, `approvals`, `fs`. A call that needs
    /// one that is absent gets CAPABILITY_UNAVAILABLE.
    pub capabilities: Vec<String>,
    pub limits: Limits,
    /// The host sends a `heartbeat` push at this interval; a client that hears nothing for two
    /// intervals should treat the link as dead.
    pub heartbeat_ms: u64,
}

/// Exchanges the connection's pairing token for a device credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PairParams {
    /// A name for the device, shown in `device/list`; no control characters.
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = NAME_PATTERN))]
    pub device_name: String,
}

impl Validate for PairParams {
    fn validate(&self) -> Result<(), AppError> {
        name("deviceName", &self.device_name, 1, MAX_NAME_CHARS)
    }
}

/// The new device credential. `deviceToken` is shown once; the host keeps only its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairResult {
    #[schemars(length(max = MAX_ID_CHARS))]
    pub device_id: String,
    /// Secret bearer token for `Authorization: Bearer` on later upgrades.
    pub device_token: String,
    pub roles: Vec<Role>,
}
