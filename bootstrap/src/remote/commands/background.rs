//! `pi-remote connect --background` and `pi-remote disconnect`: a profile's forward held by a
//! detached `pi-remote connect` of its own.
//!
//! The foreground command re-executes pi-remote with the same arguments but `--background`
//! (nothing secret is in them: `connect` takes no token), `--json` added and
//! `PI_REMOTE_PROFILE` set to the profile, with [`CHILD_ENV`] set, stdin `/dev/null`, stdout a
//! pipe back to the foreground and stderr the profile's log (`run/<profile>.log`, 0600). The
//! child leaves the terminal's session (`setsid`), takes the profile's lock (`flock` on
//! `run/<profile>.lock`, which then holds its pid; a second one finds it taken and says so) and
//! runs `connect` as the foreground one would. Its JSON events go up the pipe until `ready` (or
//! `error`); then its stdout moves to the log and the foreground, seeing the pipe close, prints
//! the connected line (or the failure) and returns the terminal. Reconnections and later
//! failures are in the log.
//!
//! A foreground `connect` (without `--once`) takes the same lock, so a profile has one forward
//! either way. `disconnect` sends SIGTERM to the lock's holder and waits (bounded) for the lock
//! to be free.

use crate::provision::stage::{Progress, Reporter};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::profile;
use crate::remote::remotes;
use racp_proto::AppError;
use racp_proto::validate::printable;
use serde_json::Value;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in the background child's environment.
pub const CHILD_ENV: &str = "PI_REMOTE_BACKGROUND_CHILD";

/// How long `disconnect` waits for a stopped forward to let go of its lock.
pub const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Whether this process is a background child.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some_and(|v| v == "1")
}

/// The pid a running background `connect` of the profile holds its lock with, if one runs.
pub fn running(dir: &Path, name: &str) -> Option<u32> {
    let path = remotes::lock_file(dir, name);
    let file = File::open(&path).ok()?;
    match file.try_lock_shared() {
        Ok(()) => None,
        // Held: the holder wrote its pid right after taking it.
        Err(std::fs::TryLockError::WouldBlock) => Some(read_pid(&path).unwrap_or(0)),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The child's lock: held until the process ends (the kernel lets go of it then).
pub struct Held(#[allow(dead_code)] File);

/// Takes the profile's lock for this process and writes its pid into it; `Err(pid)` when
/// another process holds it.
pub fn take_lock(dir: &Path, name: &str) -> Result<Result<Held, u32>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = remotes::lock_file(dir, name);
    remotes::private_dir(&remotes::run_dir(dir))?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(Err(read_pid(&path).unwrap_or(0))),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("cannot lock {}: {e}", path.display()));
        }
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .and_then(|()| file.flush());
    written.map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Ok(Held(file)))
}

/// The background child's reporter: JSON lines up the pipe until the connect is ready or has
/// failed, then (stdout moved to the log) into the log.
pub struct ChildReporter {
    log: PathBuf,
    profile: String,
}

impl ChildReporter {
    pub fn new(log: PathBuf, profile: &str) -> ChildReporter {
        ChildReporter {
            log,
            profile: profile.to_string(),
        }
    }
}

impl Reporter for ChildReporter {
    fn report(&self, progress: Progress) {
        let last = matches!(progress, Progress::Ready(_) | Progress::Failed(_));
        if let Progress::Reconnected { .. } = progress {
            // The host answered again: `remotes` shows it as seen.
            remotes::touch_seen(&self.profile);
        }
        let line = progress.to_json();
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        if last {
            // The foreground sees the pipe close and returns the terminal.
            match std::fs::OpenOptions::new().append(true).open(&self.log) {
                Ok(log) => {
                    if let Err(error) = nix::unistd::dup2_stdout(&log) {
                        eprintln!("pi-remote: cannot move the output to the log: {error}");
                    }
                }
                Err(error) => eprintln!("pi-remote: cannot open {}: {error}", self.log.display()),
            }
        }
    }
}

/// In the child, before connecting: leave the terminal's session and take the lock. `None`
/// when another background connect holds it (said on stdout for the foreground).
pub fn child_start(dir: &Path, name: &str) -> Result<Option<Held>, Failure> {
    // Fails only for a process group leader, which the child is not (spawned in ours).
    if let Err(error) = nix::unistd::setsid() {
        eprintln!("pi-remote: setsid: {error}");
    }
    match take_lock(dir, name).map_err(Failure::Local)? {
        Ok(held) => {
            eprintln!(
                "--- {} pi-remote {} background connect of {name:?} (pid {})",
                remotes::now_secs(),
                env!("CARGO_PKG_VERSION"),
                std::process::id()
            );
            Ok(Some(held))
        }
        Err(pid) => {
            println!("{}", serde_json::json!({"type": "running", "pid": pid}));
            Ok(None)
        }
    }
}

/// The child's arguments: ours without `--background`, with `--json`.
fn child_args() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--background")
        .collect();
    args.push("--json".into());
    args
}

/// The foreground part of `connect --background`.
pub async fn launch(out: &Out, name: &str) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    if let Some(pid) = running(&dir, name) {
        return already_running(out, &dir, name, pid);
    }
    let log_path = remotes::log_file(&dir, name);
    let log = open_log(&dir, &log_path)?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::local(format!("cannot find pi-remote's own path: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .args(child_args())
        .env(CHILD_ENV, "1")
        .env("PI_REMOTE_PROFILE", name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| Failure::local(format!("cannot start the background connect: {e}")))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(Failure::local("the background connect has no output pipe"));
    };
    let pid = child.id().unwrap_or(0);
    let mut lines = BufReader::new(stdout).lines();
    let outcome = tokio::select! {
        outcome = follow(out, &mut lines) => outcome,
        _ = tokio::signal::ctrl_c() => {
            let _ = stop_pid(pid);
            return Err(Failure::local("interrupted: the background connect was stopped"));
        }
    };
    match outcome {
        Some(event) if event["type"] == "ready" => {
            ready(out, name, pid, &log_path, &event);
            Ok(())
        }
        Some(event) if event["type"] == "running" => {
            let pid = event["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
            let _ = child.wait().await;
            already_running(out, &dir, name, pid.unwrap_or(0))
        }
        Some(event) if event["type"] == "error" => {
            let _ = child.wait().await;
            match serde_json::from_value::<AppError>(event["error"].clone()) {
                Ok(error) => Err(Failure::App(error)),
                Err(_) => Err(Failure::local(format!(
                    "connect failed: {}",
                    event["error"]
                ))),
            }
        }
        _ => {
            let status = child.wait().await.ok().and_then(|s| s.code());
            Err(ended_early(status, &log_path))
        }
    }
}

/// The child ended without a ready or error event: its failure is the log's last line
/// (`{"error", "exitCode"}`, as `--json` prints it).
fn ended_early(status: Option<i32>, log_path: &Path) -> Failure {
    let last = tail(log_path, 1).unwrap_or_default();
    let error = serde_json::from_str::<Value>(&last)
        .ok()
        .map(|line| line["error"].clone());
    if let Some(error) = &error
        && let Ok(error) = serde_json::from_value::<AppError>(error.clone())
    {
        return Failure::App(error);
    }
    let message = error
        .and_then(|e| e["message"].as_str().map(str::to_string))
        .unwrap_or(last);
    Failure::local(format!(
        "the background connect ended before it was ready (exit {}): {}; its log: {}",
        status.map_or("?".into(), |c| c.to_string()),
        printable(&message, false),
        log_path.display()
    ))
}

/// Passes the child's events on (with `--json`) until the one that ends the wait.
async fn follow(
    out: &Out,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Option<Value> {
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        if out.json && kind != "running" && kind != "ready" {
            out.line(&line);
        }
        if matches!(kind.as_str(), "ready" | "error" | "running") {
            return Some(event);
        }
    }
    None
}

fn open_log(dir: &Path, path: &Path) -> Result<File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    remotes::private_dir(&remotes::run_dir(dir)).map_err(Failure::Local)?;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Failure::local(format!("cannot open {}: {e}", path.display())))
}

fn ready(out: &Out, name: &str, pid: u32, log: &Path, event: &Value) {
    if out.json {
        let mut event = event.clone();
        event["background"] = serde_json::json!({"pid": pid, "log": log});
        out.json_value(&event);
        return;
    }
    let agent = match (
        event["agent"]["state"].as_str(),
        event["agent"]["version"].as_str(),
    ) {
        (Some("ready"), Some(version)) => format!(" with agent {}", printable(version, false)),
        _ => String::new(),
    };
    eprintln!(
        "Connected to pi-host {}{agent} at {}, in the background (pid {pid}; `pi-remote disconnect {name}` stops it; log: {})",
        printable(event["hostVersion"].as_str().unwrap_or("?"), false),
        printable(event["url"].as_str().unwrap_or("?"), false),
        log.display()
    );
    if let Some(state) = event["agent"]["state"].as_str().filter(|s| *s != "ready") {
        eprintln!(
            "  ! the host's agent is {state}: {}",
            printable(event["agent"]["problem"].as_str().unwrap_or("?"), false)
        );
    }
}

fn already_running(out: &Out, dir: &Path, name: &str, pid: u32) -> Result<(), Failure> {
    let url = profile::load(dir, name).map(|p| p.url).unwrap_or_default();
    if out.json {
        out.json_value(&serde_json::json!({
            "type": "running", "profile": name, "pid": pid, "url": url,
        }));
    } else {
        out.note(&format!(
            "a connect of {name:?} already runs (pid {pid}, {url}); `pi-remote disconnect {name}` stops it"
        ));
    }
    Ok(())
}

fn stop_pid(pid: u32) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| format!("{pid} is not a pid"))?;
    if pid <= 0 {
        return Err("no pid in the lock file".into());
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| format!("cannot stop pid {pid}: {e}"))
}

/// Stops the profile's background connect, if one runs: SIGTERM, then waits for its lock.
/// Returns the stopped pid.
pub async fn stop(dir: &Path, name: &str) -> Result<Option<u32>, Failure> {
    let Some(pid) = running(dir, name) else {
        return Ok(None);
    };
    stop_pid(pid).map_err(Failure::Local)?;
    let deadline = tokio::time::Instant::now() + STOP_PATIENCE;
    while running(dir, name).is_some() {
        if tokio::time::Instant::now() >= deadline {
            return Err(Failure::local(format!(
                "the background connect of {name:?} (pid {pid}) did not stop within {} s",
                STOP_PATIENCE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Some(pid))
}

/// `pi-remote disconnect [PROFILE]`.
pub async fn disconnect(out: &Out, name: &str) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let url = profile::load(&dir, name).map(|p| p.url).ok();
    let stopped = stop(&dir, name).await?;
    if out.json {
        out.json_value(&serde_json::json!({"profile": name, "stopped": stopped, "url": url}));
        return Ok(());
    }
    match stopped {
        Some(pid) => out.line(&format!(
            "stopped the background connect of {name:?} (pid {pid}; the forward at {} is closed)",
            url.unwrap_or_default()
        )),
        None => out.line(&format!("no background connect of {name:?} runs")),
    }
    Ok(())
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> std::io::Result<String> {
    let mut text = String::new();
    File::open(path)?.read_to_string(&mut text)?;
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}
