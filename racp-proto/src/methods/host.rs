//! `host/*`, `device/*` and `pairing/create`: the host and who may use it.

use super::handshake::{HostIdentity, Limits};
use crate::AppError;
use crate::limits::{MAX_ID_CHARS, MAX_PAIRING_TTL_SECONDS, MIN_PAIRING_TTL_SECONDS};
use crate::role::Role;
use crate::validate::{Validate, invalid, length, range};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Facts about the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostInfoResult {
    pub host: HostIdentity,
    /// The machine's host name.
    pub hostname: String,
    /// Operating system, e.g. `linux`.
    pub os: String,
    /// CPU architecture, e.g. `x86_64`.
    pub arch: String,
    /// When this host process started (ms since the Unix epoch).
    pub started_at: u64,
    pub capabilities: Vec<String>,
    pub limits: Limits,
    /// The sessions' agent processes.
    pub agents: AgentsInfo,
    /// The agent program the host runs for its sessions, as last checked.
    pub agent: AgentStatus,
    /// The kernel sandbox the agents run in, or why they run without one (docs/reliability.md
    /// §4.19). Absent from a host older than the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxInfo>,
}

/// The agents' sandbox as the host applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// `landlock` while the agents run in one; `none` otherwise.
    pub kind: String,
    /// The owner's mode: `workspace-write`, `read-only` or `off`.
    pub mode: String,
    /// The kernel's Landlock ABI version, with `kind: landlock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abi: Option<u32>,
    /// Why there is none although the mode asks for one (an old kernel, Landlock not
    /// enabled), or that the owner switched it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// Whether the host can run its agent (docs/protocol.md §7.1, "The agent").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub state: AgentState,
    /// What the agent's `--version` printed, e.g. `0.73.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The agent's absolute path, when it was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The Node.js runtime that runs it, when the agent is a Node program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<AgentRuntime>,
    /// Why the agent is missing or incompatible, and what to do about it; absent when ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    /// Found, and its version (and its runtime's) is one the host works with.
    Ready,
    /// Not found where the host looks for it.
    Missing,
    /// Found but unusable: its `--version` fails or is too old, or its runtime is missing or
    /// too old.
    Incompatible,
}

/// The runtime of a Node program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRuntime {
    /// `node`.
    pub name: String,
    /// Its absolute path.
    pub path: String,
    /// What `node --version` printed, without the `v`, e.g. `20.20.2`; absent when it could
    /// not be run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The agent processes a host runs (docs/architecture.md, "Agent lifecycle").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentsInfo {
    /// Agents running now.
    pub running: u32,
    /// Most agents that run at once.
    pub max: u32,
    /// Their resident memory together, in bytes.
    pub rss_bytes: u64,
    /// An agent with no turn and no subscriber for this long is stopped (ms).
    pub idle_stop_ms: u64,
}

/// Hosts reachable through a gateway, those the calling device may reach. A plain pi-host has
/// no gateway and answers METHOD_NOT_FOUND.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostListResult {
    pub hosts: Vec<HostEntry>,
}

/// One host behind a gateway (docs/protocol.md §15).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostEntry {
    pub host: HostIdentity,
    pub hostname: String,
    pub status: HostStatus,
    /// When the gateway last heard from the host (ms since the Unix epoch, by the NATS
    /// server's clock); absent for a host enrolled but never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<u64>,
    /// Sessions the host had at its last heartbeat.
    pub sessions: u32,
    /// Where a device connects to reach this host through the gateway, e.g. `/racp/hosts/host_…`.
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HostStatus {
    Online,
    Offline,
}

/// A paired device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    pub device_id: String,
    pub name: String,
    pub roles: Vec<Role>,
    /// When it was paired (ms since the Unix epoch).
    pub created_at: u64,
    /// When it last opened a connection (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<u64>,
    /// True for the device making this call.
    pub current: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceListResult {
    pub devices: Vec<DeviceInfo>,
}

/// Revokes a device: its credential stops working and its open connections close at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceRevokeParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub device_id: String,
}

impl Validate for DeviceRevokeParams {
    fn validate(&self) -> Result<(), AppError> {
        length("deviceId", &self.device_id, 1, MAX_ID_CHARS)
    }
}

/// Mints a single-use pairing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PairingCreateParams {
    /// Roles the paired device will hold.
    #[schemars(length(min = 1, max = 3), extend("uniqueItems" = true))]
    pub roles: Vec<Role>,
    /// Lifetime of the token; 600 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_PAIRING_TTL_SECONDS, max = MAX_PAIRING_TTL_SECONDS))]
    pub ttl_seconds: Option<u64>,
    /// Through a gateway: the hosts the paired device may reach, each one the caller reaches
    /// itself (when absent: the caller's own reach). A plain pi-host is one host and refuses
    /// the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub hosts: Option<Vec<String>>,
}

impl Validate for PairingCreateParams {
    fn validate(&self) -> Result<(), AppError> {
        if self.roles.is_empty() {
            return Err(invalid("roles", "must name at least one role"));
        }
        for (i, role) in self.roles.iter().enumerate() {
            if self.roles[..i].contains(role) {
                return Err(invalid(&format!("roles.{i}"), "must not repeat a role"));
            }
        }
        if let Some(ttl) = self.ttl_seconds {
            range(
                "ttlSeconds",
                ttl,
                MIN_PAIRING_TTL_SECONDS,
                MAX_PAIRING_TTL_SECONDS,
            )?;
        }
        if let Some(hosts) = &self.hosts {
            if hosts.is_empty() || hosts.len() > 256 {
                return Err(invalid("hosts", "must name 1 to 256 hosts"));
            }
            for (i, host) in hosts.iter().enumerate() {
                if !crate::gateway::valid_host_id(host) {
                    return Err(invalid(&format!("hosts.{i}"), "is not a host id"));
                }
            }
        }
        Ok(())
    }
}

/// A pairing token. It is secret: show it to the person pairing, never log it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairingCreateResult {
    pub token: String,
    /// When the token stops working (ms since the Unix epoch).
    pub expires_at: u64,
    /// A pairing link carrying the host address and the token (in the fragment, which is
    /// never sent to a server): `racps://HOST:PORT/pair?cert=sha256:<hex>#<token>`, or
    /// `racp://HOST:PORT/pair#<token>` for a host serving plain WebSocket.
    pub url: String,
    pub roles: Vec<Role>,
    /// The SHA-256 of the host's TLS certificate (64 lowercase hex digits), which the new
    /// device pins; absent when the host serves plain WebSocket (`--plain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_sha256: Option<String>,
}
