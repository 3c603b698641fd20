//! What a host's agent may reach (docs/reliability.md §4.19): the host's own files and the
//! user's credential stores hidden; writes in the workspace, temp, the agent's own state and the
//! caches builds use. Each list is data the owner extends (`--sandbox-hide`, `--sandbox-write`,
//! `--sandbox-read`); a device changes none of it.

use super::{Launch, Mode, Reach, Support};
use crate::config::ServeConfig;
use std::path::PathBuf;

/// Under the home directory, hidden whatever is granted: keys, tokens and credential stores.
pub const HIDDEN_IN_HOME: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".docker",
    ".kube",
    ".config/gcloud",
    ".azure",
    ".password-store",
    ".local/share/keyrings",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".config/gh",
    ".vault-token",
    ".terraform.d",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
];

/// Under the home directory, writable where they exist: the caches package managers and builds
/// fill, so `npm install`, `cargo build` or `pip install` in the workspace work.
pub const CACHES_IN_HOME: &[&str] = &[
    ".cache",
    ".npm",
    ".cargo/registry",
    ".cargo/git",
    // Cargo's locks and its cache tracker, beside the registry (granted where they exist).
    ".cargo/.package-cache",
    ".cargo/.package-cache-mutate",
    ".cargo/.global-cache",
    ".rustup/downloads",
    ".rustup/tmp",
    "go/pkg/mod",
    ".gradle/caches",
    ".m2/repository",
    ".local/share/pnpm",
    ".yarn/berry/cache",
    ".bun/install/cache",
];

/// The folder of the data directory the SSH bootstrapper installs agents into (pi and its
/// Node, `bootstrap/src/provision/agent.rs`): the agent runs from it, so it stays readable.
const INSTALLED_AGENTS: &str = "agent";

/// Writable for every agent: temp directories and the devices (`/dev/null`, a pty).
const TEMP: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/dev"];

/// What one agent's sandbox depends on besides the host's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentPlace {
    pub workspace: PathBuf,
    /// Its own state's directories (session files, export, temp): writable even inside the
    /// hidden data directory.
    pub own: Vec<PathBuf>,
    /// Its session is in plan mode: nothing is written but temp and its own state.
    pub read_only: bool,
    /// Directories a person let the session write in (the permission policy's grants).
    pub granted: Vec<PathBuf>,
    /// The owner runs this session's workspace without a sandbox (`--sandbox-off-in`).
    pub unconfined: bool,
}

impl AgentPlace {
    /// The same ruleset would be made for both (the agent's own folders aside).
    pub fn same_sandbox(&self, other: &AgentPlace) -> bool {
        (self.read_only, &self.granted, self.unconfined)
            == (other.read_only, &other.granted, other.unconfined)
    }
}

/// The sandbox a host runs its agents in: its mode, and what the kernel offers.
#[derive(Debug, Clone)]
pub struct HostSandbox {
    pub mode: Mode,
    pub support: Support,
}

impl HostSandbox {
    /// Probes the kernel; says once in the log what the agents will run in.
    pub fn start(mode: Mode) -> HostSandbox {
        let support = if mode == Mode::Off {
            Support::Unavailable {
                reason: "switched off by the host's owner (--sandbox off)".into(),
            }
        } else {
            super::probe()
        };
        match &support {
            Support::Landlock { abi } => {
                tracing::info!(
                    mode = mode.as_str(),
                    abi,
                    "agents run in a Landlock sandbox"
                )
            }
            Support::Unavailable { reason } if mode == Mode::Off => {
                tracing::warn!(%reason, "agents run without a sandbox")
            }
            Support::Unavailable { reason } => {
                tracing::warn!(%reason, "agents run WITHOUT a sandbox: the kernel cannot apply one")
            }
        }
        HostSandbox { mode, support }
    }

    /// What `host/info` and `pi-host status` say of it.
    pub fn info(&self) -> racp_proto::methods::host::SandboxInfo {
        let mode = self.mode.as_str().to_string();
        match &self.support {
            Support::Landlock { abi } if self.mode != Mode::Off => {
                racp_proto::methods::host::SandboxInfo {
                    kind: "landlock".into(),
                    mode,
                    abi: Some(*abi),
                    unavailable: None,
                }
            }
            Support::Landlock { .. } => racp_proto::methods::host::SandboxInfo {
                kind: "none".into(),
                mode,
                abi: None,
                unavailable: Some("switched off by the host's owner (--sandbox off)".into()),
            },
            Support::Unavailable { reason } => racp_proto::methods::host::SandboxInfo {
                kind: "none".into(),
                mode,
                abi: None,
                unavailable: Some(reason.clone()),
            },
        }
    }

    /// The sandbox is applied to agents.
    pub fn enforced(&self) -> bool {
        self.mode != Mode::Off && matches!(self.support, Support::Landlock { .. })
    }

    /// How an agent at `place` is launched.
    pub fn launch(&self, config: &ServeConfig, place: &AgentPlace) -> Launch {
        let mode = match self.mode {
            Mode::WorkspaceWrite if place.read_only => Mode::ReadOnly,
            mode => mode,
        };
        let reach = (self.enforced() && !place.unconfined).then(|| reach(config, mode, place));
        Launch {
            reach,
            settings_dir: Some(config.data_dir.clone()),
        }
    }
}

fn reach(config: &ServeConfig, mode: Mode, place: &AgentPlace) -> Reach {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let in_home = |names: &[&str]| -> Vec<PathBuf> {
        home.iter()
            .flat_map(|h| names.iter().map(move |n| h.join(n)))
            .collect()
    };
    let mut hidden = config.protected_paths();
    hidden.extend(in_home(HIDDEN_IN_HOME));
    hidden.extend(config.sandbox.hidden.iter().cloned());
    let mut writable: Vec<PathBuf> = TEMP.iter().map(PathBuf::from).collect();
    writable.extend(std::env::var_os("TMPDIR").map(PathBuf::from));
    // pi's own configuration and state (settings, its model list, its login).
    writable.push(match std::env::var_os("PI_CODING_AGENT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => home.clone().unwrap_or_default().join(".pi"),
    });
    if mode == Mode::WorkspaceWrite {
        writable.push(place.workspace.clone());
        writable.extend(in_home(CACHES_IN_HOME));
        writable.extend(config.sandbox.writable.iter().cloned());
        writable.extend(place.granted.iter().cloned());
    }
    let mut readable = vec![
        crate::agent::extensions::dir(&config.data_dir),
        config.data_dir.join(INSTALLED_AGENTS),
    ];
    readable.extend(config.sandbox.readable.iter().cloned());
    Reach {
        hidden,
        writable,
        readable,
        own: place.own.clone(),
    }
}
