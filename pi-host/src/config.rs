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
        }
    }
}

/// `$XDG_DATA_HOME/pi-host`, or `~/.local/share/pi-host`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("pi-host");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/pi-host")
}
