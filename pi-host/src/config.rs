//! Host settings: embedded defaults, overridden by environment and flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The documented default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The documented default agent command.
pub const DEFAULT_AGENT: &str = "pi --mode rpc";

/// Everything `pi-host serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub agent: String,
    /// Extra names accepted in the Host header besides loopback literals and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Origins accepted when a browser sends one; any other Origin is refused.
    pub allowed_origins: Vec<String>,
    pub limits: HostLimits,
    pub heartbeat: Duration,
    /// Directories sessions and `fs/*` may use (default: the user's home).
    pub roots: Vec<PathBuf>,
    /// Longest an approval waits for an answer (the agent's own timeout applies when shorter).
    pub approval_timeout: Duration,
    pub retention: crate::sessions::log::Retention,
}

/// Bounds the host enforces (invariant 6).
#[derive(Debug, Clone)]
pub struct HostLimits {
    pub max_frame_bytes: u32,
    pub max_in_flight: u32,
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
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_frame_bytes: racp_proto::limits::DEFAULT_MAX_FRAME_BYTES,
            max_in_flight: 64,
            max_subscriptions: 64,
            requests_per_second: 100,
            request_burst: 200,
            max_connections: 20_000,
            max_pairing_attempts: 5,
            max_lag_events: 20_000,
            send_stall: Duration::from_secs(10),
            max_events_per_frame: 1024,
        }
    }
}

impl ServeConfig {
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Self {
        ServeConfig {
            listen,
            data_dir,
            agent: DEFAULT_AGENT.to_string(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            limits: HostLimits::default(),
            heartbeat: Duration::from_secs(15),
            roots: home_dir().into_iter().collect(),
            approval_timeout: Duration::from_secs(10 * 60),
            retention: crate::sessions::log::Retention::default(),
        }
    }
}

/// `$XDG_DATA_HOME/pi-host`, or `~/.local/share/pi-host`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("pi-host");
    }
    let home = home_dir().unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/pi-host")
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}
