//! `pi-host sandbox-exec`: the launcher every agent starts through. It runs as the agent's own
//! process, between the host's spawn and the agent's program: it hands the agent the settings a
//! desktop set (read from the data directory before the sandbox hides it, on a descriptor named
//! by `PI_HOST_SETTINGS_FD`), restricts itself with the agent's ruleset, and execs the agent,
//! which keeps the pid, the process group, the pipes and the ruleset. A launcher rather than
//! work between fork and exec: the host is multi-threaded, and the launcher starts fresh.

use super::{Prepared, Reach};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// How an agent is launched ([`crate::agent::AgentSpec::launch`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    /// The sandbox's reach; `None`: no sandbox.
    pub reach: Option<Reach>,
    /// The data directory whose `credentials.json` and `providers.json` are handed to the
    /// agent; `None`: nothing handed.
    pub settings_dir: Option<PathBuf>,
}

/// The launcher's command line (`pi-host sandbox-exec …`), hidden from `--help`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The data directory whose settings files are handed to the agent.
    #[arg(long)]
    settings_dir: Option<PathBuf>,
    /// Apply the sandbox with the lists below.
    #[arg(long)]
    sandbox: bool,
    #[arg(long = "hide")]
    hide: Vec<PathBuf>,
    #[arg(long = "write")]
    write: Vec<PathBuf>,
    #[arg(long = "read")]
    read: Vec<PathBuf>,
    #[arg(long = "own")]
    own: Vec<PathBuf>,
    /// The agent's program and arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Set on the launcher: jemalloc then starts no background thread in it, so it is
/// single-threaded, as a new user namespace needs (`git.rs`). Removed again for the agent.
pub const LAUNCHER_ENV: (&str, &str) = ("MALLOC_CONF", "background_thread:false");

impl Launch {
    /// The launcher's program and arguments for `program args`: this binary's own file (the
    /// running one, even if replaced on disk since).
    pub fn wrap(&self, program: &str, args: &[String]) -> (String, Vec<String>) {
        let mut words = vec!["sandbox-exec".to_string()];
        let list = |words: &mut Vec<String>, flag: &str, paths: &[PathBuf]| {
            for path in paths {
                words.push(format!("--{flag}={}", path.display()));
            }
        };
        if let Some(dir) = &self.settings_dir {
            list(&mut words, "settings-dir", std::slice::from_ref(dir));
        }
        if let Some(reach) = &self.reach {
            words.push("--sandbox".into());
            list(&mut words, "hide", &reach.hidden);
            list(&mut words, "write", &reach.writable);
            list(&mut words, "read", &reach.readable);
            list(&mut words, "own", &reach.own);
        }
        words.push("--".into());
        words.push(program.to_string());
        words.extend(args.iter().cloned());
        ("/proc/self/exe".into(), words)
    }
}

/// Runs the launcher; returns only when the agent could not be started (exit 126, the reason
/// on stderr, which the host keeps as the agent's last words).
pub fn run(args: ExecArgs) -> ExitCode {
    let error = match launch(args) {
        Ok(never) => match never {},
        Err(error) => error,
    };
    eprintln!("pi-host sandbox-exec: {error}");
    ExitCode::from(126)
}

enum Never {}

fn launch(args: ExecArgs) -> Result<Never, String> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no agent command to run")?;
    let mut command = std::process::Command::new(program);
    command.args(rest).env_remove(LAUNCHER_ENV.0);
    // Kept open until the exec, which the agent inherits it across.
    let _handed = match &args.settings_dir {
        Some(dir) => {
            let fd = hand_settings(dir)?;
            command.env(
                "PI_HOST_SETTINGS_FD",
                std::os::fd::AsRawFd::as_raw_fd(&fd).to_string(),
            );
            Some(fd)
        }
        None => None,
    };
    if args.sandbox {
        // Before the ruleset, which refuses a sandboxed process any change of mounts.
        if let Ok(workspace) = std::env::current_dir()
            && let Err(reason) = super::git::guard(&workspace)
        {
            eprintln!("pi-host sandbox-exec: .git/hooks and .git/config stay writable: {reason}");
        }
        let reach = Reach {
            hidden: args.hide,
            writable: args.write,
            readable: args.read,
            own: args.own,
        };
        let prepared = Prepared::new(&reach.plan()).map_err(|e| e.to_string())?;
        prepared
            .restrict()
            .map_err(|e| format!("cannot apply the sandbox: {e}"))?;
    }
    Err(format!("cannot run `{program}`: {}", command.exec()))
}

/// The settings extension's input, `{"credentials": …, "providers": …}` (each file as the host
/// wrote it, or null), in an unnamed file of the data directory the agent inherits: the keys
/// never touch a path the agent could read, nor its environment or command line.
fn hand_settings(dir: &std::path::Path) -> Result<std::os::fd::OwnedFd, String> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use std::io::{Seek, Write};
    let read = |name: &str| -> Result<serde_json::Value, String> {
        match std::fs::read(dir.join(name)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{name}: {e}")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Value::Null),
            Err(e) => Err(format!("cannot read {name}: {e}")),
        }
    };
    let settings = serde_json::json!({
        "credentials": read(crate::models::CREDENTIALS_FILE)?,
        "providers": read(crate::models::PROVIDERS_FILE)?,
    });
    let mut file =
        tempfile::tempfile_in(dir).map_err(|e| format!("cannot hand the settings: {e}"))?;
    file.write_all(settings.to_string().as_bytes())
        .and_then(|()| file.rewind())
        .map_err(|e| format!("cannot hand the settings: {e}"))?;
    // Not close-on-exec: the agent inherits it.
    fcntl(&file, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| e.to_string())?;
    Ok(file.into())
}
