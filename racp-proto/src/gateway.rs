//! What a host and a gateway agree on over NATS (docs/protocol.md §15): subject and
//! stream names, message headers, the call envelope and the host's heartbeat record.
//!
//! Everything a host sends or answers lives under its own id, so a NATS credential that allows
//! only `…​.<host id>…` subjects confines a host to itself (docs/architecture.md, "Gateway").

use crate::AppError;
use crate::role::Role;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The JetStream key-value bucket holding one heartbeat record per host, keyed by host id.
pub const HOSTS_BUCKET: &str = "racp_hosts";
/// Header carrying an event's seq on an events subject (the RACP cursor's seq).
pub const SEQ_HEADER: &str = "Racp-Seq";
/// Header carrying the session's epoch (16 hex digits, the RACP cursor's epoch).
pub const EPOCH_HEADER: &str = "Racp-Epoch";
/// Header (value `1`) on a session's last event, `session.closed`: a gateway ends its
/// subscriptions there without reading events.
pub const CLOSED_HEADER: &str = "Racp-Closed";
/// Header naming the gateway key (a public user nkey) that signed a routed call.
pub const CALL_KEY_HEADER: &str = "Racp-Gateway-Key";
/// Header carrying a routed call's signature (ed25519, base64url without padding).
pub const CALL_SIGNATURE_HEADER: &str = "Racp-Signature";
/// Header carrying when the gateway signed a routed call (ms since the Unix epoch).
pub const CALL_AT_HEADER: &str = "Racp-Call-At";
/// Header carrying a routed call's unique id (the nonce a host remembers against replays).
pub const CALL_ID_HEADER: &str = "Racp-Call-Id";
/// Header carrying a routed call's trace id (`crate::trace`), for the host's log; not signed,
/// since nothing is decided by it, and checked by the host like a client's.
pub const TRACE_HEADER: &str = "Racp-Trace-Id";
/// A routed call signed further than this from the host's clock (either way) is refused.
pub const CALL_MAX_SKEW_MS: u64 = 30_000;

/// The bytes a gateway signs for one routed call: the host, the subject, the time, the call's
/// id and the payload (the device, its roles and grant, the method and params), so no part can
/// be moved to another host, replayed later or altered.
pub fn call_signed_bytes(
    host_id: &str,
    subject: &str,
    at_ms: u64,
    call_id: &str,
    payload: &[u8],
) -> Vec<u8> {
    let mut bytes = format!("racp-call/1\n{host_id}\n{subject}\n{at_ms}\n{call_id}\n").into_bytes();
    bytes.extend_from_slice(payload);
    bytes
}

/// A host writes its heartbeat record this often.
pub const HEARTBEAT_MS: u64 = 2_000;
/// A host whose record is older than this is offline.
pub const OFFLINE_AFTER_MS: u64 = 3 * HEARTBEAT_MS;

/// The subject a gateway sends a host's RACP calls to (request/reply).
pub fn call_subject(host_id: &str) -> String {
    format!("racp.call.{host_id}")
}

/// The subject of one session's committed events.
pub fn events_subject(host_id: &str, session_id: &str) -> String {
    format!("racp.ev.{host_id}.{session_id}")
}

/// Every events subject of one host (its stream's subjects).
pub fn host_events_subjects(host_id: &str) -> String {
    format!("racp.ev.{host_id}.>")
}

/// The JetStream stream holding one host's events.
pub fn events_stream(host_id: &str) -> String {
    format!("RACP_EV_{host_id}")
}

/// The subject a host publishes its heartbeat record to (the key-value bucket's key).
pub fn heartbeat_subject(host_id: &str) -> String {
    format!("$KV.{HOSTS_BUCKET}.{host_id}")
}

/// The inbox prefix a host's replies come to: its own, so its credential need not read anyone
/// else's inbox.
pub fn host_inbox_prefix(host_id: &str) -> String {
    format!("_INBOX_{host_id}")
}

/// Whether `id` can be a host id in subjects: one NATS token of safe characters.
pub fn valid_host_id(id: &str) -> bool {
    id.len() <= 64 && is_subject_token(id)
}

/// Whether a session id can name a subject of its own: one NATS subject token, never `*`, `>`
/// or a `.` that would widen a subscription to other sessions' events. Hosts make ids of this
/// alphabet only, so any other id names no session.
pub fn valid_session_id(id: &str) -> bool {
    id.len() as u64 <= crate::limits::MAX_ID_CHARS && is_subject_token(id)
}

/// One NATS subject token (and one key-value key) of the alphabet hosts and gateways make ids
/// of: letters, digits, `_` and `-`.
pub fn is_subject_token(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One RACP call a gateway routes to a host: who is calling, and the call as the device sent it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutedCall {
    /// The gateway's device making the call; the host records it as the actor.
    pub device_id: String,
    /// The device's name, as it was paired with the gateway, for the events the call
    /// records; a gateway older than the field sends none, and a host older ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    pub roles: Vec<Role>,
    /// The hosts the device's grant reaches; `None`: every host. A host refuses a call whose
    /// grant does not name it.
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    pub method: String,
    pub params: Box<RawValue>,
}

/// A host's answer to a [`RoutedCall`]: exactly one of the two.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutedReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AppError>,
}

/// What a host writes to [`HOSTS_BUCKET`] every [`HEARTBEAT_MS`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostRecord {
    pub host_id: String,
    pub version: String,
    pub hostname: String,
    pub started_at: u64,
    pub sessions: u32,
    /// When the record was written (ms since the Unix epoch, the host's clock).
    pub at: u64,
    /// False in the last record of a host that is stopping.
    pub online: bool,
    /// The capabilities the host has on, as its own `hello` names them, so a gateway's `hello`
    /// for the host names the same (a record of an older host has none: the gateway's list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_single_subject_tokens() {
        assert!(valid_host_id("host_AbC-9_x"));
        for bad in ["", "a.b", "a*", "a>", "a b", "héllo", &"x".repeat(65)] {
            assert!(!valid_host_id(bad), "{bad:?}");
        }
        assert_eq!(events_subject("h1", "ses_2"), "racp.ev.h1.ses_2");
        assert!(host_events_subjects("h1").starts_with("racp.ev.h1."));
    }
}
