//! What the host knows about its agent (docs/architecture.md, "The agent check"): where the
//! configured agent is (`locate`), its version and its Node's (`version`), and whether that is
//! an agent the host can run: `ready`, `missing` or `incompatible`.
//!
//! The check runs when `serve` starts and again, cheaply, before every agent start and every
//! `host/info` or `pi-host status`: the agent is looked up again (file system lookups only),
//! and the versions are asked again only when what was found changed (another path, or a file
//! with another size, time or inode). So an agent installed, upgraded or removed while the host
//! runs is seen by the next turn without a restart. A version check runs beside an agent's
//! start, never in front of it ([`AgentCheck::spawn`]). Agents are started by the absolute path
//! found here, never by a `PATH` lookup of their own.

mod locate;
pub mod version;

pub use locate::search_dirs;
use locate::{Env, Found, Located, Runtime};
use racp_proto::methods::host::{AgentRuntime, AgentState, AgentStatus};
use racp_proto::{AppError, ErrorCode, ErrorSource};
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
use version::Version;

use super::{Agent, AgentError, AgentOutput, AgentSpec, lock};

/// The oldest pi whose RPC and error wording pi-host reads (it is tested with 0.73).
pub const MIN_AGENT_VERSION: Version = Version(0, 73, 0);
/// The oldest Node pi runs on (its `engines.node`).
pub const MIN_NODE_VERSION: Version = Version(20, 6, 0);
/// How long `--version` may take (pi loads its code first: about 1.5 s on a loaded machine).
/// Node's and pi's together stay within a client's call timeout (30 s): the first `host/info`
/// waits for them.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The command that installs (or upgrades) pi.
pub const INSTALL_COMMAND: &str = "npm install -g @mariozechner/pi-coding-agent";

/// The host's agent and what was last found out about it.
pub struct AgentCheck {
    /// The configured command line (`--agent`, `agent` in the config file).
    command: String,
    data_dir: PathBuf,
    /// The config file the host was started with, named in the fix.
    config_file: Option<PathBuf>,
    last: Mutex<Option<Checked>>,
    /// One check at a time; the others wait for it and take its result.
    running: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone)]
struct Checked {
    status: AgentStatus,
    /// What the result was computed from; a lookup that finds the same reuses it.
    stamp: Stamp,
    located: Option<Located>,
}

/// A lookup's result with the files' identities (size, modification time, inode).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Found, Vec<Option<(u64, i64, i64, u64)>>);

impl Stamp {
    fn of(found: Found) -> Stamp {
        let files = match &found {
            Found::Missing { .. } => Vec::new(),
            Found::Agent(located) => {
                let mut paths = vec![located.path.clone()];
                paths.extend(located.launcher.iter().map(PathBuf::from));
                if let Runtime::Node { node, .. } = &located.runtime {
                    paths.push(node.clone());
                }
                paths
                    .iter()
                    .map(|path| {
                        std::fs::metadata(path)
                            .ok()
                            .map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
                    })
                    .collect()
            }
        };
        Stamp(found, files)
    }
}

impl AgentCheck {
    pub fn new(command: &str, data_dir: &Path, config_file: Option<&Path>) -> AgentCheck {
        AgentCheck {
            command: command.to_string(),
            data_dir: data_dir.to_path_buf(),
            config_file: config_file.map(Path::to_path_buf),
            last: Mutex::new(None),
            running: tokio::sync::Mutex::new(()),
        }
    }

    /// The agent's status now (see the module docs for what is redone).
    pub async fn status(&self) -> AgentStatus {
        self.refresh().await.status
    }

    /// Starts an agent for `spec` (whose command begins with the configured one) by the path
    /// the check found; a host without a usable agent gets AGENT_UNAVAILABLE with the fix.
    ///
    /// A check runs beside a start, never in front of it: when the files found are the ones
    /// last checked, that result stands; when the versions must be asked (the first check is
    /// still running, or a file changed), the agent starts at once by what was found and is
    /// stopped again if the check then finds it cannot run (docs/architecture.md, "The agent
    /// check"). pi loads for seconds either way, so the question costs the start nothing.
    pub async fn spawn(
        &self,
        spec: &AgentSpec,
        options: crate::agent::AgentOptions,
    ) -> Result<(Agent, mpsc::Receiver<AgentOutput>), AppError> {
        let stamp = match self.look() {
            Ok(stamp) => stamp,
            Err(checked) => return Err(self.unavailable(&self.record(*checked).status)),
        };
        let known = lock(&self.last)
            .as_ref()
            .filter(|last| last.stamp == stamp)
            .cloned();
        let beside = match (&known, &stamp.0) {
            (None, Found::Agent(located)) if located.runtime != Runtime::NodeMissing => {
                launch_spec(located, spec)
            }
            _ => None,
        };
        let Some(early) = beside else {
            let checked = match known {
                Some(checked) => checked,
                None => self.refresh().await,
            };
            let spec = self.resolved(&checked, spec)?;
            return self.start(&spec, options).await;
        };
        let started = Agent::spawn_with(&early, options).await;
        let checked = self.refresh().await;
        if checked.status.state != AgentState::Ready {
            if let Ok((agent, _)) = &started {
                tracing::warn!(
                    pid = agent.pid(),
                    "stopping an agent the check found unusable"
                );
                agent.shutdown().await;
            }
            return Err(self.unavailable(&checked.status));
        }
        started.map_err(|err| err.to_app_error())
    }

    /// Starts the agent by a checked `spec`; a failure to spawn looks again at once.
    async fn start(
        &self,
        spec: &AgentSpec,
        options: crate::agent::AgentOptions,
    ) -> Result<(Agent, mpsc::Receiver<AgentOutput>), AppError> {
        match Agent::spawn_with(spec, options).await {
            Err(err @ AgentError::Unavailable { .. }) => {
                // It was there a moment ago: look again, so the answer says what is wrong now.
                *lock(&self.last) = None;
                let again = self.refresh().await;
                if again.status.state != AgentState::Ready {
                    return Err(self.unavailable(&again.status));
                }
                Err(err.to_app_error())
            }
            started => started.map_err(|err| err.to_app_error()),
        }
    }

    /// `spec` with the agent's launcher in place of the configured program, or the error
    /// saying why there is no agent to run.
    fn resolved(&self, checked: &Checked, spec: &AgentSpec) -> Result<AgentSpec, AppError> {
        let (Some(located), AgentState::Ready) = (&checked.located, checked.status.state) else {
            return Err(self.unavailable(&checked.status));
        };
        launch_spec(located, spec).ok_or_else(|| self.unavailable(&checked.status))
    }

    /// AGENT_UNAVAILABLE for a status that is not ready: the problem and the fix, both in the
    /// message (a person reads it), the fix in `details.suggestion` too.
    fn unavailable(&self, status: &AgentStatus) -> AppError {
        let problem = status
            .problem
            .clone()
            .unwrap_or_else(|| "the agent cannot be started".to_string());
        let fix = self.fix();
        AppError::new(ErrorCode::AgentUnavailable, format!("{problem}: {fix}"))
            .with_details(json!({
                "state": status.state,
                "command": self.command,
                "path": status.path,
                "suggestion": fix,
            }))
            .with_source(ErrorSource::Agent)
    }

    /// What to do on the host: install pi, or point the host at an agent.
    fn fix(&self) -> String {
        let point = match &self.config_file {
            Some(file) => format!(
                "set `agent = \"/path/to/pi --mode rpc\"` in {} and restart pi-host",
                file.display()
            ),
            None => "start pi-host with `--agent '/path/to/pi --mode rpc'`".to_string(),
        };
        format!(
            "install or upgrade pi on this host with `{INSTALL_COMMAND}` (it needs Node.js >= \
             {MIN_NODE_VERSION}; the next turn finds it), or {point}"
        )
    }

    async fn refresh(&self) -> Checked {
        let _one = self.running.lock().await;
        let stamp = match self.look() {
            Ok(stamp) => stamp,
            Err(checked) => return self.record(*checked),
        };
        if let Some(last) = lock(&self.last).as_ref()
            && last.stamp == stamp
        {
            return last.clone();
        }
        let checked = self.examine(stamp).await;
        self.record(checked)
    }

    /// Where the agent is now and its files' identities (file lookups only); the result of a
    /// command line that cannot be parsed.
    fn look(&self) -> Result<Stamp, Box<Checked>> {
        match shell_words::split(&self.command) {
            Ok(words) => Ok(Stamp::of(locate::locate(
                &words,
                &Env::current(&self.data_dir),
            ))),
            Err(err) => Err(Box::new(Checked {
                status: problem(
                    AgentState::Missing,
                    format!(
                        "the agent command `{}` cannot be parsed: {err}",
                        self.command
                    ),
                ),
                stamp: Stamp(
                    Found::Missing {
                        program: String::new(),
                        looked_in: Vec::new(),
                    },
                    Vec::new(),
                ),
                located: None,
            })),
        }
    }

    /// Stores a result, logging it when it differs from the last one.
    fn record(&self, checked: Checked) -> Checked {
        let mut last = lock(&self.last);
        if last.as_ref().map(|last| &last.status) != Some(&checked.status) {
            log(&checked.status);
        }
        *last = Some(checked.clone());
        checked
    }

    async fn examine(&self, stamp: Stamp) -> Checked {
        let located = match &stamp.0 {
            Found::Missing { program, looked_in } => {
                let status = problem(AgentState::Missing, missing(program, looked_in));
                return Checked {
                    status,
                    stamp,
                    located: None,
                };
            }
            Found::Agent(located) => located.clone(),
        };
        let mut status = AgentStatus {
            state: AgentState::Ready,
            version: None,
            path: Some(located.path.display().to_string()),
            runtime: None,
            problem: None,
        };
        let mut problems = Vec::new();
        let mut path_first = None;
        match &located.runtime {
            Runtime::Native => {}
            Runtime::NodeMissing => problems.push(format!(
                "the agent {} is a Node.js program and no `node` was found beside it or on \
                 PATH (pi needs Node.js >= {MIN_NODE_VERSION})",
                located.path.display()
            )),
            Runtime::Node { node, beside } => {
                if *beside {
                    path_first = node.parent().map(Path::to_path_buf);
                }
                status.runtime = Some(self.examine_node(node, &mut problems).await);
            }
        }
        if problems.is_empty() {
            status.version = self
                .examine_agent(&located, path_first.as_deref(), &mut problems)
                .await;
        }
        if !problems.is_empty() {
            status.state = AgentState::Incompatible;
            status.problem = Some(problems.join("; "));
        }
        Checked {
            status,
            stamp,
            located: Some(located),
        }
    }
}

impl AgentCheck {
    /// The Node.js a Node program runs on, and what is wrong with it (too old, does not run).
    async fn examine_node(&self, node: &Path, problems: &mut Vec<String>) -> AgentRuntime {
        let asked = version::ask(
            &[node.display().to_string()],
            None,
            &self.data_dir,
            VERSION_TIMEOUT,
        )
        .await;
        let node_version = match asked {
            Ok(found) if found < MIN_NODE_VERSION => {
                problems.push(format!(
                    "the agent's Node.js {} is {found}; pi needs Node.js >= {MIN_NODE_VERSION}",
                    node.display()
                ));
                Some(found)
            }
            Ok(found) => Some(found),
            Err(why) => {
                problems.push(format!("the agent's Node.js does not run: {why}"));
                None
            }
        };
        AgentRuntime {
            name: "node".to_string(),
            path: node.display().to_string(),
            version: node_version.map(|v| v.to_string()),
        }
    }

    /// The agent's own version (from pi's `package.json`, else `--version`), and what is wrong
    /// with it (too old, does not run).
    async fn examine_agent(
        &self,
        located: &Located,
        path_first: Option<&Path>,
        problems: &mut Vec<String>,
    ) -> Option<String> {
        let asked = match version::of_pi_package(&located.path) {
            Some(found) => Ok(found),
            None => {
                let launcher = &located.launcher;
                version::ask(launcher, path_first, &self.data_dir, VERSION_TIMEOUT).await
            }
        };
        match asked {
            Ok(found) if found < MIN_AGENT_VERSION => {
                problems.push(format!(
                    "the agent {} is version {found}; pi-host needs pi {MIN_AGENT_VERSION} \
                     or newer",
                    located.path.display()
                ));
                Some(found.to_string())
            }
            Ok(found) => Some(found.to_string()),
            Err(why) => {
                problems.push(format!("the agent does not run: {why}"));
                None
            }
        }
    }
}

/// `spec` with the located agent's launcher in place of the configured program (and the
/// Node beside it first on `PATH`); `None` when the command does not begin with it.
fn launch_spec(located: &Located, spec: &AgentSpec) -> Option<AgentSpec> {
    let mut words = shell_words::split(&spec.command).ok()?;
    if words.len() < located.replaces {
        return None;
    }
    words.splice(..located.replaces, located.launcher.iter().cloned());
    let mut spec = AgentSpec {
        command: shell_words::join(&words),
        ..spec.clone()
    };
    if let Runtime::Node { node, beside: true } = &located.runtime
        && let Some(dir) = node.parent()
    {
        let path = version::path_with_first(dir);
        spec.env
            .push(("PATH".to_string(), path.to_string_lossy().into_owned()));
    }
    Some(spec)
}

fn problem(state: AgentState, problem: String) -> AgentStatus {
    AgentStatus {
        state,
        version: None,
        path: None,
        runtime: None,
        problem: Some(problem),
    }
}

fn missing(program: &str, looked_in: &[PathBuf]) -> String {
    let places: Vec<String> = looked_in.iter().map(|p| p.display().to_string()).collect();
    if program.contains('/') {
        format!("pi-host could not find the agent {program}")
    } else {
        format!(
            "pi-host could not find the agent `{program}` (looked in {})",
            places.join(", ")
        )
    }
}

/// One line per change: ready with version and path, or what is wrong.
fn log(status: &AgentStatus) {
    let path = status.path.as_deref().unwrap_or("");
    let version = status.version.as_deref().unwrap_or("");
    let runtime = status
        .runtime
        .as_ref()
        .map(|r| format!("{} {}", r.name, r.version.as_deref().unwrap_or("?")));
    match status.state {
        AgentState::Ready => tracing::info!(version, path, runtime, "agent ready"),
        AgentState::Missing => {
            tracing::warn!(problem = status.problem.as_deref(), "agent missing")
        }
        AgentState::Incompatible => tracing::warn!(
            version,
            path,
            runtime,
            problem = status.problem.as_deref(),
            "agent incompatible"
        ),
    }
}
