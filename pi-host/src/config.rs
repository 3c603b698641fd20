//! Host settings: embedded defaults, overridden by environment and flags.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The documented default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The documented default agent command.
pub const DEFAULT_AGENT: &str = "pi --mode rpc";
/// pi's flag for continuing the newest session in its session directory.
pub const DEFAULT_AGENT_RESUME_ARGS: &str = "--continue";

/// Everything `pi-host serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub agent: String,
    /// Arguments added to the agent command when a session's agent is started again (after a
    /// crash or a host restart), so it resumes its own session file.
    pub agent_resume_args: String,
    /// An agent with no turn and no subscriber for this long is stopped (docs/architecture.md,
    /// "Agent lifecycle").
    pub agent_idle: Duration,
    /// Most agents running at once; the least recently used idle one makes room.
    pub max_agents: usize,
    /// Start agents with pi-host's pi extension that loads at pi's start what pi otherwise
    /// loads at the first prompt (docs/architecture.md, "Agent lifecycle").
    pub agent_preload: bool,
    /// Extra names accepted in the Host header besides loopback literals and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Origins accepted when a browser sends one; any other Origin is refused.
    pub allowed_origins: Vec<String>,
    pub limits: HostLimits,
    pub heartbeat: Duration,
    /// Directories sessions and `fs/*` may use (default: the user's home).
    pub roots: Vec<PathBuf>,
    /// The `--config` file the host was started with.
    pub config_file: Option<PathBuf>,
    /// The host's own files outside the data directory (its config file, state file): like the
    /// data directory, refused to clients whatever the roots.
    pub host_files: Vec<PathBuf>,
    /// PEM certificate chain and private key served as `wss://`: `--tls-cert`/`--tls-key`, or
    /// the host's own identity in the data directory (racp-server/src/identity.rs), set at startup.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Serve plain `ws://` (loopback only): no TLS, so nothing proves to a client that it
    /// reached this host (docs/protocol.md §2.4).
    pub plain: bool,
    /// SHA-256 of the served certificate, which devices pin; set at startup when serving TLS.
    pub cert_sha256: Option<racp_proto::fingerprint::CertSha256>,
    /// Serve plain `ws://` on a non-loopback address anyway.
    pub insecure_bind: bool,
    /// Whether `fs/list` and `fs/stat` are offered (the `fs` capability).
    pub fs_enabled: bool,
    /// Longest an approval waits for an answer (the agent's own timeout applies when shorter).
    pub approval_timeout: Duration,
    /// A new session's permission mode when `session/create` names none (docs/protocol.md,
    /// "Permissions").
    pub permission_mode: racp_proto::permission::PermissionMode,
    /// Paths the agent's tools may never touch, added to the built-in denylist
    /// (`policy/denylist.rs`): `/abs/path` or `~/path` (that file or directory), `*.ext`, or a
    /// file name.
    pub deny_paths: Vec<String>,
    pub retention: crate::sessions::log::Retention,
    /// What each session keeps of its history past the replay window (docs/protocol.md §7.24).
    pub history: crate::store::HistoryPolicy,
    /// NATS servers of a gateway this host dials out to (docs/architecture.md, "Gateway");
    /// empty: no gateway.
    pub gateway: Vec<String>,
    /// The CA (PEM) that signs the gateway's NATS servers' certificates, if not the system's.
    pub gateway_ca: Option<PathBuf>,
    /// Public nkeys of the gateways whose routed calls this host runs (`pi-gateway key`).
    pub gateway_trust: Vec<String>,
    /// Most directories the watcher of one workspace watches (docs/protocol.md §8.9): past
    /// it, one `workspace.changed` with `rescan` says the rest is not watched.
    pub max_watched_dirs: usize,
    /// The kernel sandbox agents run in (docs/reliability.md §4.19).
    pub sandbox: SandboxConfig,
}

/// The owner's settings of the agents' sandbox: its mode and what each list adds.
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    pub mode: crate::agent::sandbox::Mode,
    /// Hidden besides the host's own files and the credential stores.
    pub hidden: Vec<PathBuf>,
    /// Writable besides the workspace, temp, the agent's state and the caches.
    pub writable: Vec<PathBuf>,
    /// Readable even where hidden (a `~/.npmrc` the user wants npm to read, say).
    pub readable: Vec<PathBuf>,
    /// Sessions whose workspace lies in one of these run without a sandbox: the owner's
    /// choice per project, never a device's.
    pub off_in: Vec<PathBuf>,
}

pub use racp_server::limits::HostLimits;

impl ServeConfig {
    /// Paths no client may reach through `fs/*` or a session's workspace: the data directory,
    /// the TLS files and the host's other files.
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.data_dir.clone()];
        if let Some((cert, key)) = &self.tls {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths.extend(self.host_files.iter().cloned());
        paths
    }

    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Self {
        ServeConfig {
            listen,
            data_dir,
            agent: DEFAULT_AGENT.to_string(),
            agent_resume_args: DEFAULT_AGENT_RESUME_ARGS.to_string(),
            agent_idle: Duration::from_secs(300),
            max_agents: 16,
            agent_preload: true,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            limits: HostLimits::default(),
            heartbeat: Duration::from_secs(15),
            roots: home_dir().into_iter().collect(),
            config_file: None,
            host_files: Vec::new(),
            tls: None,
            plain: false,
            cert_sha256: None,
            insecure_bind: false,
            fs_enabled: true,
            gateway: Vec::new(),
            gateway_ca: None,
            gateway_trust: Vec::new(),
            approval_timeout: Duration::from_secs(10 * 60),
            permission_mode: racp_proto::permission::PermissionMode::Ask,
            deny_paths: Vec::new(),
            retention: crate::sessions::log::Retention::default(),
            history: crate::store::HistoryPolicy::default(),
            sandbox: SandboxConfig::default(),
            max_watched_dirs: 4096,
        }
    }
}

/// The data directory when neither `--data-dir` nor `PI_HOST_DATA_DIR` names one: `R/data` for
/// a binary run from an install root `R` (deploy/install.sh's layout, which `pi-remote connect`
/// uses; through a link such as `~/.local/bin/pi-host` too), else `$XDG_DATA_HOME/pi-host`, or
/// `~/.local/share/pi-host` (deploy/README.md, "The host's own CLI").
pub fn default_data_dir() -> PathBuf {
    let installed = std::env::current_exe()
        .ok()
        .and_then(|exe| install_root_of(&exe));
    match installed {
        Some(root) => root.join("data"),
        None => standalone_data_dir(),
    }
}

/// The install root a binary at `exe` belongs to: `R` for `R/versions/V/bin/pi-host` when `R`
/// has the `current` link install.sh switches (`exe` as the kernel names it, links resolved).
pub fn install_root_of(exe: &std::path::Path) -> Option<PathBuf> {
    let versions = exe.parent()?.parent()?.parent()?;
    if versions.file_name()? != "versions" {
        return None;
    }
    let root = versions.parent()?;
    is_install_root(root).then(|| root.to_path_buf())
}

/// The install root whose data directory `data_dir` is (`R/data` with `R/current`), if any.
pub fn install_root_with_data(data_dir: &std::path::Path) -> Option<PathBuf> {
    if data_dir.file_name()? != "data" {
        return None;
    }
    let root = data_dir.parent()?;
    is_install_root(root).then(|| root.to_path_buf())
}

/// Whether `root` has the `current` link install.sh switches between installed versions.
fn is_install_root(root: &std::path::Path) -> bool {
    root.join("current")
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
}

/// Data directories where another host may run, for the advice when none answers in the one
/// asked about: the install root of this binary, and the root `pi-remote connect` uses unless
/// told otherwise (`~/.pi-host`).
pub fn other_data_dirs() -> Vec<PathBuf> {
    let own = std::env::current_exe()
        .ok()
        .and_then(|exe| install_root_of(&exe));
    let connects = home_dir().map(|home| home.join(".pi-host"));
    let mut dirs: Vec<PathBuf> = own
        .into_iter()
        .chain(connects)
        .map(|r| r.join("data"))
        .collect();
    dirs.dedup();
    dirs
}

/// `$XDG_DATA_HOME/pi-host`, or `~/.local/share/pi-host`: a host run from anywhere else.
fn standalone_data_dir() -> PathBuf {
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

/// Settings a user can give as `serve` flags or as keys of the `--config` TOML file (same names,
/// snake_case in the file). A flag wins over the environment, which wins over the file.
#[derive(Debug, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Address to listen on [default: 127.0.0.1:7878]; non-loopback addresses need TLS.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The agent command run for each session [default: "pi --mode rpc"]
    #[arg(long, env = "PI_HOST_AGENT")]
    pub agent: Option<String>,
    /// Arguments added when a session's agent restarts, to resume its session [default: "--continue"]
    #[arg(long)]
    pub agent_resume_args: Option<String>,
    /// Directories sessions and fs/* may use (repeatable) [default: $HOME]
    #[arg(long = "root")]
    #[serde(default)]
    pub roots: Vec<PathBuf>,
    /// Extra Host header names to accept besides loopback and `localhost` (repeatable).
    #[arg(long = "allow-host")]
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser Origins to accept; any other Origin is refused (repeatable).
    #[arg(long = "allow-origin")]
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Events each session keeps for replay [default: 200000]
    #[arg(long)]
    pub retain_events: Option<usize>,
    /// Bytes of events each session keeps for replay [default: 67108864]
    #[arg(long)]
    pub retain_bytes: Option<usize>,
    /// Age in seconds past which events leave the replay window [default: 86400]
    #[arg(long)]
    pub retain_seconds: Option<u64>,
    /// Bytes of history (messages and compaction summaries) each session keeps past the replay
    /// window [default: no bound, as pi keeps its session file]
    #[arg(long)]
    pub history_max_bytes: Option<u64>,
    /// Age in seconds past which history entries go [default: none]
    #[arg(long)]
    pub history_max_seconds: Option<u64>,
    /// What happens to a session's history over --history-max-bytes [default: drop-oldest]
    #[arg(long, value_enum)]
    pub history_at_bound: Option<crate::store::AtBound>,
    /// Heartbeat interval in milliseconds [default: 15000]
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Stop a session's agent after this many ms with no turn and no subscriber [default: 300000]
    #[arg(long)]
    pub agent_idle_ms: Option<u64>,
    /// Most agents running at once; the least recently used idle one is stopped to make room [default: 16]
    #[arg(long)]
    pub max_agents: Option<usize>,
    /// Dial out to a gateway's NATS servers (tls://host:port, comma-separated; nats:// for
    /// cleartext) and serve its devices too; enroll the host first (`pi-host gateway-key`)
    #[arg(long, value_delimiter = ',')]
    #[serde(default)]
    pub gateway: Vec<String>,
    /// The CA (PEM file) that signs the gateway's NATS servers' certificates [default: the
    /// system's roots]
    #[arg(long, env = "PI_HOST_GATEWAY_CA")]
    pub gateway_ca: Option<PathBuf>,
    /// Public nkeys of the gateways whose calls this host runs, comma-separated (`pi-gateway
    /// key` prints each); needed with --gateway
    #[arg(long, value_delimiter = ',', env = "PI_HOST_GATEWAY_TRUST")]
    #[serde(default)]
    pub gateway_trust: Vec<String>,
    /// A live subscriber this many events behind gets CLIENT_TOO_SLOW [default: 20000]
    #[arg(long)]
    pub max_lag_events: Option<u64>,
    /// A socket write blocked this long (ms) means the client stopped reading [default: 10000]
    #[arg(long)]
    pub send_stall_ms: Option<u64>,
    /// Sustained calls per second per device [default: 100]
    #[arg(long)]
    pub requests_per_second: Option<u32>,
    /// Calls a device may make in a burst above the sustained rate [default: 200]
    #[arg(long)]
    pub request_burst: Option<u32>,
    /// Bytes held for clients at once, over all connections (requests being read, replies
    /// being built or waiting for their socket); past it, HOST_OVERLOADED [default: 67108864]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 40))]
    pub max_held_bytes: Option<u64>,
    /// Longest an approval waits for an answer, in ms [default: 600000]
    #[arg(long)]
    pub approval_timeout_ms: Option<u64>,
    /// A new session's permission mode: ask, accept-edits, auto or plan [default: ask]
    #[arg(long)]
    pub permission_mode: Option<String>,
    /// A path the agent's tools may never touch, added to the built-in denylist (repeatable):
    /// /abs/path or ~/path (a file or a directory), *.ext, or a file name
    #[arg(long = "deny-path")]
    #[serde(default)]
    pub deny_paths: Vec<String>,
    /// PEM certificate chain for TLS (wss://); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS; needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow plain ws:// on a non-loopback address (tokens then cross the network unencrypted).
    #[arg(long)]
    #[serde(default)]
    pub insecure_bind: bool,
    /// Serve plain ws:// instead of TLS (loopback only). Clients must opt in to send tokens
    /// without TLS, and nothing protects them from a process that takes over the port; for
    /// benchmarks and browser clients that cannot pin a certificate.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    #[serde(default)]
    pub plain: bool,
    /// Most directories watched in one session's workspace (each an inotify watch of the
    /// user's); past it, changes in the rest are reported as one rescan [default: 4096]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_watched_dirs: Option<u64>,
    /// Turn off file browsing (fs/list, fs/stat): the `fs` capability disappears from hello.
    #[arg(long)]
    #[serde(default)]
    pub disable_fs: bool,
    /// The agents' kernel sandbox: workspace-write (writes in the workspace, temp, the agent's
    /// state and caches; the host's files and credential stores unreadable), read-only, or off
    /// [default: workspace-write]
    #[arg(long, value_enum)]
    pub sandbox: Option<crate::agent::sandbox::Mode>,
    /// A path agents may not read, besides the host's own files and the credential stores
    /// (repeatable).
    #[arg(long = "sandbox-hide")]
    #[serde(default)]
    pub sandbox_hide: Vec<PathBuf>,
    /// A path agents may write, besides the workspace, temp and the caches (repeatable).
    #[arg(long = "sandbox-write")]
    #[serde(default)]
    pub sandbox_write: Vec<PathBuf>,
    /// A path agents may read even where it is hidden, e.g. ~/.npmrc (repeatable).
    #[arg(long = "sandbox-read")]
    #[serde(default)]
    pub sandbox_read: Vec<PathBuf>,
    /// Sessions with a workspace inside this directory run without the sandbox, with the
    /// user's whole account (repeatable).
    #[arg(long = "sandbox-off-in")]
    #[serde(default)]
    pub sandbox_off_in: Vec<PathBuf>,
    /// Start agents without pi-host's preload extension (`--extension PATH`, added to the agent
    /// command), e.g. for an agent command that is not pi.
    #[arg(long)]
    #[serde(default)]
    pub disable_agent_preload: bool,
}

impl Settings {
    /// `self` (flags and environment) over `file`.
    fn over(self, file: Settings) -> Settings {
        fn list<T>(flags: Vec<T>, file: Vec<T>) -> Vec<T> {
            if flags.is_empty() { file } else { flags }
        }
        Settings {
            listen: self.listen.or(file.listen),
            agent: self.agent.or(file.agent),
            agent_resume_args: self.agent_resume_args.or(file.agent_resume_args),
            roots: list(self.roots, file.roots),
            allowed_hosts: list(self.allowed_hosts, file.allowed_hosts),
            allowed_origins: list(self.allowed_origins, file.allowed_origins),
            retain_events: self.retain_events.or(file.retain_events),
            retain_bytes: self.retain_bytes.or(file.retain_bytes),
            retain_seconds: self.retain_seconds.or(file.retain_seconds),
            history_max_bytes: self.history_max_bytes.or(file.history_max_bytes),
            history_max_seconds: self.history_max_seconds.or(file.history_max_seconds),
            history_at_bound: self.history_at_bound.or(file.history_at_bound),
            heartbeat_ms: self.heartbeat_ms.or(file.heartbeat_ms),
            agent_idle_ms: self.agent_idle_ms.or(file.agent_idle_ms),
            max_agents: self.max_agents.or(file.max_agents),
            gateway: list(self.gateway, file.gateway),
            gateway_ca: self.gateway_ca.or(file.gateway_ca),
            gateway_trust: list(self.gateway_trust, file.gateway_trust),
            max_lag_events: self.max_lag_events.or(file.max_lag_events),
            send_stall_ms: self.send_stall_ms.or(file.send_stall_ms),
            requests_per_second: self.requests_per_second.or(file.requests_per_second),
            request_burst: self.request_burst.or(file.request_burst),
            max_held_bytes: self.max_held_bytes.or(file.max_held_bytes),
            approval_timeout_ms: self.approval_timeout_ms.or(file.approval_timeout_ms),
            permission_mode: self.permission_mode.or(file.permission_mode),
            // The file's and the flags' entries both hold: the denylist only grows.
            deny_paths: [file.deny_paths, self.deny_paths].concat(),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            insecure_bind: self.insecure_bind || file.insecure_bind,
            plain: self.plain || file.plain,
            disable_fs: self.disable_fs || file.disable_fs,
            max_watched_dirs: self.max_watched_dirs.or(file.max_watched_dirs),
            disable_agent_preload: self.disable_agent_preload || file.disable_agent_preload,
            sandbox: self.sandbox.or(file.sandbox),
            sandbox_hide: list(self.sandbox_hide, file.sandbox_hide),
            sandbox_write: list(self.sandbox_write, file.sandbox_write),
            sandbox_read: list(self.sandbox_read, file.sandbox_read),
            sandbox_off_in: list(self.sandbox_off_in, file.sandbox_off_in),
        }
    }
}

/// Builds the serve configuration from flags, the optional config file and the defaults.
pub fn load(
    file: Option<&std::path::Path>,
    flags: Settings,
    data_dir: PathBuf,
) -> Result<ServeConfig, String> {
    let s = flags.over(read_file(file)?);
    let listen = match s.listen {
        Some(listen) => listen,
        None => DEFAULT_LISTEN
            .parse()
            .map_err(|e| format!("bad default listen address: {e}"))?,
    };
    let mut config = ServeConfig::new(listen, data_dir);
    set_bounds(&mut config, &s);
    set_agent_policy(&mut config, &s)?;
    config.config_file = file.map(std::path::Path::to_path_buf);
    config
        .host_files
        .extend(file.map(std::path::Path::to_path_buf));
    if let Some(agent) = s.agent {
        config.agent = agent;
    }
    if let Some(args) = s.agent_resume_args {
        config.agent_resume_args = args;
    }
    if !s.roots.is_empty() {
        config.roots = s.roots;
    }
    config.allowed_hosts = s.allowed_hosts;
    config.allowed_origins = s.allowed_origins;
    config.gateway = s.gateway;
    config.gateway_ca = s.gateway_ca;
    config.gateway_trust = s.gateway_trust;
    check_gateway(&config)?;
    config.tls = match (s.tls_cert, s.tls_key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err("TLS needs both tls_cert and tls_key".into()),
    };
    if s.plain && config.tls.is_some() {
        return Err("plain and tls_cert/tls_key exclude each other".into());
    }
    config.plain = s.plain;
    config.insecure_bind = s.insecure_bind;
    config.fs_enabled = !s.disable_fs;
    config.agent_preload = !s.disable_agent_preload;
    Ok(config)
}

/// What the agents may do: the permission policy's default mode and extra denylist, and the
/// kernel sandbox's mode and lists.
fn set_agent_policy(config: &mut ServeConfig, s: &Settings) -> Result<(), String> {
    if let Some(mode) = &s.permission_mode {
        config.permission_mode = racp_proto::permission::PermissionMode::from_name(mode)
            .ok_or_else(|| {
                format!("--permission-mode {mode}: expected ask, accept-edits, auto or plan")
            })?;
    }
    config.deny_paths = s.deny_paths.clone();
    config.sandbox = SandboxConfig {
        mode: s.sandbox.unwrap_or_default(),
        hidden: s.sandbox_hide.clone(),
        writable: s.sandbox_write.clone(),
        readable: s.sandbox_read.clone(),
        off_in: s.sandbox_off_in.clone(),
    };
    Ok(())
}

/// The settings of the config file; none without one.
fn read_file(file: Option<&std::path::Path>) -> Result<Settings, String> {
    let Some(path) = file else {
        return Ok(Settings::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("bad config file {}: {e}", path.display()))
}

/// The retention, timers and per-connection limits `s` sets, each kept to its least sensible
/// value.
fn set_bounds(config: &mut ServeConfig, s: &Settings) {
    let ms = |v: u64| Duration::from_millis(v.max(10));
    if let Some(n) = s.retain_events {
        config.retention.max_events = n.max(1);
    }
    if let Some(n) = s.retain_bytes {
        config.retention.max_bytes = n.max(1);
    }
    if let Some(n) = s.retain_seconds {
        config.retention.max_age_ms = n.saturating_mul(1000).max(1000);
    }
    if let Some(n) = s.history_max_bytes {
        config.history.max_bytes = Some(n.max(1));
    }
    if let Some(n) = s.history_max_seconds {
        config.history.max_age = Some(Duration::from_secs(n.max(1)));
    }
    if let Some(at_bound) = s.history_at_bound {
        config.history.at_bound = at_bound;
    }
    if let Some(v) = s.heartbeat_ms {
        config.heartbeat = ms(v);
    }
    if let Some(v) = s.agent_idle_ms {
        config.agent_idle = ms(v);
    }
    if let Some(n) = s.max_agents {
        config.max_agents = n.max(1);
    }
    if let Some(v) = s.max_lag_events {
        config.limits.max_lag_events = v;
    }
    if let Some(v) = s.send_stall_ms {
        config.limits.send_stall = ms(v);
    }
    if let Some(v) = s.requests_per_second {
        config.limits.requests_per_second = v;
    }
    if let Some(v) = s.request_burst {
        config.limits.request_burst = v;
    }
    if let Some(v) = s.max_held_bytes {
        config.limits.max_held_bytes = v as usize;
    }
    if let Some(v) = s.approval_timeout_ms {
        config.approval_timeout = ms(v);
    }
    if let Some(n) = s.max_watched_dirs {
        config.max_watched_dirs = n as usize;
    }
}

/// A host with a gateway needs the gateway's TLS and the keys it trusts calls from.
fn check_gateway(config: &ServeConfig) -> Result<(), String> {
    if config.gateway.is_empty() {
        return Ok(());
    }
    racp_server::uplink::link::Servers::parse(&config.gateway)
        .map_err(|e| format!("--gateway: {e}"))?;
    if config.gateway_trust.is_empty() {
        return Err(
            "--gateway needs --gateway-trust: the public nkey of each gateway whose calls \
             this host runs (run `pi-gateway key` on each gateway replica)"
                .into(),
        );
    }
    for key in &config.gateway_trust {
        racp_server::uplink::signed::parse_trusted_key(key)
            .map_err(|e| format!("--gateway-trust: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let file: Settings =
            toml::from_str("agent = \"from-file\"\nheartbeat_ms = 500\nroots = [\"/srv\"]\n")
                .unwrap();
        let flags = Settings {
            heartbeat_ms: Some(700),
            ..Settings::default()
        };
        let merged = flags.over(file);
        assert_eq!(merged.agent.as_deref(), Some("from-file"));
        assert_eq!(merged.heartbeat_ms, Some(700));
        assert_eq!(merged.roots, vec![PathBuf::from("/srv")]);
        assert!(
            toml::from_str::<Settings>("colour = 1").is_err(),
            "unknown keys are refused"
        );
    }

    #[test]
    fn the_permission_mode_is_checked_and_the_denylist_only_grows() {
        use racp_proto::permission::PermissionMode;
        let data = PathBuf::from("/nonexistent");
        let default = load(None, Settings::default(), data.clone()).unwrap();
        assert_eq!(default.permission_mode, PermissionMode::Ask);
        let mode = |m: &str| Settings {
            permission_mode: Some(m.into()),
            ..Settings::default()
        };
        let auto = load(None, mode("auto"), data.clone()).unwrap();
        assert_eq!(auto.permission_mode, PermissionMode::Auto);
        let bad = load(None, mode("bypass"), data.clone()).unwrap_err();
        assert!(bad.contains("--permission-mode bypass"), "{bad}");
        let file: Settings = toml::from_str("deny_paths = [\"~/vault\"]\n").unwrap();
        let flags = Settings {
            deny_paths: vec!["*.kdbx".into()],
            ..Settings::default()
        };
        assert_eq!(flags.over(file).deny_paths, ["~/vault", "*.kdbx"]);
    }

    #[test]
    fn a_gateway_needs_the_keys_it_trusts_calls_from() {
        let data = PathBuf::from("/nonexistent");
        let with = |trust: Vec<String>| Settings {
            gateway: vec!["tls://127.0.0.1:4222".into()],
            gateway_trust: trust,
            ..Settings::default()
        };
        let missing = load(None, with(Vec::new()), data.clone()).unwrap_err();
        assert!(missing.contains("pi-gateway key"), "{missing}");
        let bad = load(None, with(vec!["Unot-a-key".into()]), data.clone()).unwrap_err();
        assert!(bad.contains("--gateway-trust"), "{bad}");
        let key = nkeys::KeyPair::new_user().public_key();
        let config = load(None, with(vec![key.clone()]), data.clone()).unwrap();
        assert_eq!(config.gateway_trust, vec![key]);
        let scheme = Settings {
            gateway: vec!["ws://127.0.0.1:4222".into()],
            ..with(Vec::new())
        };
        assert!(load(None, scheme, data).unwrap_err().contains("--gateway"));
    }
}
