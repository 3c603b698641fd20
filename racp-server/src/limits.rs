//! The bounds a server enforces on its connections (docs/protocol.md §5.2, §6): a host's, and a
//! gateway's, which takes the same defaults.

use std::time::Duration;

/// The default of `max_held_bytes`: four pages of the default frame bound's hard cap, or two
/// of the largest history pages being built (docs/benchmarks.md, "Memory under large requests").
pub const DEFAULT_MAX_HELD_BYTES: usize = 64 << 20;

/// Bounds a server enforces (docs/protocol.md §5.2, §6).
#[derive(Debug, Clone)]
pub struct HostLimits {
    pub max_frame_bytes: u32,
    pub max_in_flight: u32,
    pub max_in_flight_host: u32,
    pub max_subscriptions: u32,
    pub requests_per_second: u32,
    pub request_burst: u32,
    pub max_connections: usize,
    /// Wrong secrets a pairing token tolerates before it is burned.
    pub max_pairing_attempts: u32,
    /// A live subscriber this many events behind the head is CLIENT_TOO_SLOW.
    pub max_lag_events: u64,
    /// A socket write blocked this long means the client stopped reading: CLIENT_TOO_SLOW.
    pub send_stall: Duration,
    /// Most events in one `session/events` frame.
    pub max_events_per_frame: usize,
    /// Bytes held for clients at once, over all connections: requests being read, replies
    /// being built or waiting for their socket (budget.rs); past it, HOST_OVERLOADED.
    pub max_held_bytes: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_frame_bytes: racp_proto::limits::DEFAULT_MAX_FRAME_BYTES,
            max_in_flight: 64,
            max_in_flight_host: 4096,
            max_subscriptions: 64,
            requests_per_second: 100,
            request_burst: 200,
            max_connections: 20_000,
            max_pairing_attempts: 5,
            max_lag_events: 20_000,
            send_stall: Duration::from_secs(10),
            max_events_per_frame: 1024,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
        }
    }
}
