//! The kernel sandbox every agent starts in (docs/reliability.md §4.19): a Landlock ruleset
//! restricts the agent's process in the child, before it runs the agent, so the agent and
//! everything it starts (a tool's shell, its children, theirs) inherit it. What lies outside
//! the ruleset fails with EACCES, the ordinary error a tool reports to the model.
//!
//! `rules.rs` says which paths are granted; `exec.rs` is the launcher that applies them in the
//! agent's process before it runs the agent; this file probes the kernel once and turns a plan
//! into a ruleset.

mod exec;
mod git;
mod host;
mod rules;

pub use exec::{ExecArgs, LAUNCHER_ENV, Launch, run};
pub use host::{AgentPlace, CACHES_IN_HOME, HIDDEN_IN_HOME, HostSandbox};
pub use rules::{Plan, Reach};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::Deserialize;
use std::path::Path;

/// The rights asked of the kernel; an older kernel enforces what its ABI knows (reported in
/// `host/info`): from ABI 6 the agent cannot signal processes outside its sandbox (the host
/// among them) nor reach abstract UNIX sockets made outside it; from ABI 9 it cannot connect to
/// a pathname UNIX socket it may not read (the host's admin socket among them).
const TARGET: ABI = ABI::V9;

/// How the host sandboxes its agents (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Writes only in the workspace, temp, the agent's own state and the listed caches; reads
    /// everything but the hidden paths.
    #[default]
    WorkspaceWrite,
    /// Writes only in temp and the agent's own state.
    ReadOnly,
    /// No sandbox: the agent has the user's whole account (`full` says the same).
    #[serde(alias = "full")]
    #[value(alias = "full")]
    Off,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::WorkspaceWrite => "workspace-write",
            Mode::ReadOnly => "read-only",
            Mode::Off => "off",
        }
    }
}

/// What the kernel offers, probed once when the host starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Landlock, at this ABI version.
    Landlock { abi: u32 },
    /// No sandbox can be applied, and why.
    Unavailable { reason: String },
}

/// Asks the kernel on a thread of its own, which restricts itself and ends: Landlock applies
/// to the thread that asks, so the host's other threads stay as they are.
pub fn probe() -> Support {
    #[cfg(debug_assertions)]
    if std::env::var_os("PI_HOST_TEST_NO_LANDLOCK").is_some() {
        return Support::Unavailable {
            reason: "Landlock switched off for a test (PI_HOST_TEST_NO_LANDLOCK)".into(),
        };
    }
    let probed = std::thread::spawn(|| -> Result<LandlockStatus, String> {
        let ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI::V1))
            .and_then(|r| r.create())
            .map_err(|e| e.to_string())?;
        Ok(ruleset.restrict_self().map_err(|e| e.to_string())?.landlock)
    })
    .join();
    let reason = match probed {
        Ok(Ok(LandlockStatus::Available { effective_abi, .. })) => {
            return Support::Landlock {
                abi: effective_abi as u32,
            };
        }
        Ok(Ok(LandlockStatus::NotEnabled)) => {
            "the kernel has Landlock but it is not enabled (add `landlock` to the `lsm=` boot \
             parameter)"
                .to_string()
        }
        Ok(Ok(LandlockStatus::NotImplemented)) => {
            "the kernel has no Landlock (it needs Linux 5.13 or newer built with \
             CONFIG_SECURITY_LANDLOCK)"
                .to_string()
        }
        Ok(Err(error)) => format!("Landlock refused the probe: {error}"),
        Err(_) => "the Landlock probe failed".to_string(),
    };
    Support::Unavailable { reason }
}

/// A ruleset ready to restrict the launcher's process.
struct Prepared(RulesetCreated);

/// Why a plan could not become a ruleset.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the agent's sandbox: {0}")]
struct PrepareError(String);

impl Prepared {
    /// The ruleset for `plan`. A granted path that cannot be opened (gone since the plan was
    /// made) is left out: that refuses more, never less.
    pub fn new(plan: &Plan) -> Result<Prepared, PrepareError> {
        let fail = |e: &dyn std::fmt::Display| PrepareError(e.to_string());
        let read = AccessFs::from_read(TARGET) | AccessFs::ResolveUnix;
        let write = AccessFs::from_all(TARGET);
        // Best effort: an older kernel enforces the rights its ABI knows. One that enforces
        // none fails `restrict`, so the agent does not start unconfined.
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(write)
            .map_err(|e| fail(&e))?
            .scope(Scope::from_all(TARGET))
            .map_err(|e| fail(&e))?
            .create()
            .map_err(|e| fail(&e))?;
        for (paths, access) in [(&plan.read, read), (&plan.write, write)] {
            for path in paths {
                let Some(fd) = open(path) else { continue };
                ruleset = ruleset
                    .add_rule(PathBeneath::new(fd, access))
                    .map_err(|e| fail(&e))?;
            }
        }
        Ok(Prepared(ruleset))
    }

    /// Restricts the calling process (the launcher, then the agent it execs): no new
    /// privileges (setuid programs lose their power), then the ruleset.
    pub fn restrict(self) -> std::io::Result<()> {
        let status = self.0.restrict_self().map_err(std::io::Error::other)?;
        match status.ruleset {
            RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
            RulesetStatus::NotEnforced => Err(std::io::Error::other(
                "Landlock did not enforce the ruleset",
            )),
        }
    }
}

fn open(path: &Path) -> Option<PathFd> {
    match PathFd::new(path) {
        Ok(fd) => Some(fd),
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "a sandbox grant left out");
            None
        }
    }
}
