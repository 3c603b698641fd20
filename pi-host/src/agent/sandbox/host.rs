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

/// Where the agent's environment puts home, temp and pi's own configuration.
struct Env {
    /// The system's temp directories and the devices ([`TEMP`]).
    temps: Vec<PathBuf>,
    home: Option<PathBuf>,
    tmpdir: Option<PathBuf>,
    pi_dir: Option<PathBuf>,
}

impl Env {
    fn of_host() -> Env {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Env {
            temps: temps(),
            home: var("HOME"),
            tmpdir: var("TMPDIR"),
            pi_dir: var("PI_CODING_AGENT_DIR"),
        }
    }
}

/// The system's temp directories, which every agent may write. A test's projects and home may
/// lie under /tmp (a clone of the repository there, say): debug builds take the temp directory
/// from `PI_HOST_TEST_TEMP` instead, so what the tests see refused is refused.
fn temps() -> Vec<PathBuf> {
    #[cfg(debug_assertions)]
    if let Some(temp) = std::env::var_os("PI_HOST_TEST_TEMP") {
        return vec![PathBuf::from(temp), PathBuf::from("/dev")];
    }
    TEMP.iter().map(PathBuf::from).collect()
}

fn reach(config: &ServeConfig, mode: Mode, place: &AgentPlace) -> Reach {
    reach_in(config, mode, place, &Env::of_host())
}

fn reach_in(config: &ServeConfig, mode: Mode, place: &AgentPlace, env: &Env) -> Reach {
    let home = env.home.clone();
    let in_home = |names: &[&str]| -> Vec<PathBuf> {
        home.iter()
            .flat_map(|h| names.iter().map(move |n| h.join(n)))
            .collect()
    };
    let mut hidden = config.protected_paths();
    hidden.extend(in_home(HIDDEN_IN_HOME));
    hidden.extend(config.sandbox.hidden.iter().cloned());
    let mut writable = env.temps.clone();
    writable.extend(env.tmpdir.clone());
    // pi's own configuration and state (settings, its model list, its login).
    writable.push(match &env.pi_dir {
        Some(dir) => dir.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::sandbox::Plan;
    use std::path::Path;

    /// The stores the sandbox must hide, as the threat model names them.
    const MUST_HIDE: &[&str] = &[
        ".ssh",
        ".aws",
        ".gnupg",
        ".netrc",
        ".git-credentials",
        ".docker",
        ".kube",
        ".config/gcloud",
    ];

    fn home_with_everything() -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        for dir in MUST_HIDE
            .iter()
            .chain(CACHES_IN_HOME)
            .chain(&["projects/w", ".config/git"])
        {
            std::fs::create_dir_all(home.path().join(dir)).unwrap();
        }
        home
    }

    fn plan_for(home: &Path, mode: Mode) -> (Plan, ServeConfig) {
        let data = home.join(".local/share/pi-host");
        for dir in ["pi-extensions", "agent", "agent-sessions/s1"] {
            std::fs::create_dir_all(data.join(dir)).unwrap();
        }
        let config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), data.clone());
        let place = AgentPlace {
            workspace: home.join("projects/w"),
            own: vec![data.join("agent-sessions/s1")],
            ..AgentPlace::default()
        };
        // No system temp: the test's home lies under /tmp, which every agent may write.
        let env = Env {
            temps: Vec::new(),
            home: Some(home.to_path_buf()),
            tmpdir: None,
            pi_dir: None,
        };
        (reach_in(&config, mode, &place, &env).plan(), config)
    }

    fn covers(grants: &[PathBuf], path: &Path) -> bool {
        grants.iter().any(|g| path.starts_with(g))
    }

    #[test]
    fn every_credential_store_and_the_data_directory_stay_hidden_and_the_rest_is_readable() {
        let home = home_with_everything();
        let home = home.path().canonicalize().unwrap();
        let (plan, config) = plan_for(&home, Mode::WorkspaceWrite);
        for name in MUST_HIDE {
            assert!(HIDDEN_IN_HOME.contains(name), "{name} is not on the list");
            let path = home.join(name);
            assert!(!covers(&plan.read, &path), "{name} readable: {plan:?}");
            assert!(!covers(&plan.write, &path), "{name} writable");
        }
        let data = &config.data_dir;
        assert!(!covers(&plan.read, &data.join("pi-host.db")), "{plan:?}");
        assert!(!covers(&plan.read, &data.join("agent-sessions/s2")));
        assert!(covers(&plan.read, &data.join("pi-extensions/x.ts")));
        assert!(covers(&plan.read, &data.join("agent/versions/1/bin/pi")));
        assert!(covers(&plan.write, &data.join("agent-sessions/s1/f.jsonl")));
        assert!(covers(&plan.read, &home.join(".config/git/config")));
        assert!(covers(&plan.read, Path::new("/usr/bin/env")));
    }

    #[test]
    fn writes_reach_the_workspace_and_caches_in_workspace_write_and_neither_read_only() {
        let home = home_with_everything();
        let home = home.path().canonicalize().unwrap();
        let (plan, _) = plan_for(&home, Mode::WorkspaceWrite);
        assert!(covers(&plan.write, &home.join("projects/w/src/main.rs")));
        for cache in CACHES_IN_HOME {
            assert!(covers(&plan.write, &home.join(cache).join("x")), "{cache}");
        }
        assert!(!covers(&plan.write, &home.join(".bashrc")));
        assert!(!covers(&plan.write, &home.join("projects/other")));
        let (plan, _) = plan_for(&home, Mode::ReadOnly);
        assert!(!covers(&plan.write, &home.join("projects/w/src/main.rs")));
        assert!(!covers(&plan.write, &home.join(".npm/x")));
        assert!(covers(&plan.read, &home.join("projects/w/src/main.rs")));
    }
}
