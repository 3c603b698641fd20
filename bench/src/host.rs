//! Servers under test: a `pi-host serve` process with its own data directory, and the Socket.IO
//! peer (`node bench/node/server.mjs`).

use crate::racp::{self, Control};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the binaries and scripts are.
#[derive(Debug, Clone)]
pub struct Tools {
    pub pi_host: PathBuf,
    pub agent: PathBuf,
    pub node_dir: PathBuf,
    /// Log files of the servers go here.
    pub log_dir: PathBuf,
}

pub struct PiHost {
    child: Child,
    pub pid: u32,
    pub url: String,
    data_dir: tempfile::TempDir,
    root: tempfile::TempDir,
    bin: PathBuf,
}

impl PiHost {
    /// Starts `pi-host serve` on an OS-chosen loopback port, its data directory a fresh directory
    /// under `data_parent` (which decides the file system, so whether fsync reaches a disk).
    pub async fn start(tools: &Tools, data_parent: &Path, extra: &[&str]) -> Result<PiHost> {
        let data_dir = new_data_dir(data_parent)?;
        PiHost::start_in(tools, data_dir, data_parent, extra).await
    }

    /// Starts `pi-host serve` on a data directory made beforehand (`new_data_dir`).
    pub async fn start_in(
        tools: &Tools,
        data_dir: tempfile::TempDir,
        data_parent: &Path,
        extra: &[&str],
    ) -> Result<PiHost> {
        let root = tempfile::Builder::new()
            .prefix("pi-host-root-")
            .tempdir_in(data_parent)?;
        std::fs::create_dir_all(root.path().join("w"))?;
        std::fs::create_dir_all(&tools.log_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(tools.log_dir.join("pi-host.log"))?;
        let mut command = Command::new(&tools.pi_host);
        command
            // Plain ws://, as the Socket.IO peer speaks: the comparison is of the protocols, not
            // of TLS (docs/benchmarks.md). Never a setup to copy for real use.
            .args(["serve", "--plain", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .arg("--root")
            .arg(root.path())
            .arg("--agent")
            .arg(&tools.agent)
            // Every subscriber of a run shares one device: lift the per-device call rate so a
            // thousand subscribes in a second are not refused.
            .args([
                "--requests-per-second",
                "1000000",
                "--request-burst",
                "1000000",
            ])
            .args(extra)
            .env("PI_HOST_LOG", "warn")
            .stderr(Stdio::from(log));
        let log_hint = tools.log_dir.join("pi-host.log").display().to_string();
        let (child, pid, url) =
            spawn_listening(&mut command, "pi-host", &log_hint, START_TIMEOUT).await?;
        Ok(PiHost {
            child,
            pid,
            url,
            data_dir,
            root,
            bin: tools.pi_host.clone(),
        })
    }

    /// A workspace directory inside the host's root.
    pub fn workspace(&self) -> String {
        self.root.path().join("w").display().to_string()
    }

    /// Pairs a device (pairing token from the CLI, then `pair` over RACP-WS); returns its token.
    pub async fn pair_device(&self) -> Result<String> {
        let output = Command::new(&self.bin)
            .args(["pair", "--json", "--data-dir"])
            .arg(self.data_dir.path())
            .env("PI_HOST_LOG", "warn")
            .output()
            .await
            .context("run pi-host pair")?;
        if !output.status.success() {
            bail!(
                "pi-host pair failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let paired: Value = serde_json::from_slice(&output.stdout).context("pair --json output")?;
        let pairing = paired["token"]
            .as_str()
            .context("no token in pair --json")?;
        let mut control = Control::connect(&self.url, pairing).await?;
        let result = control
            .call("pair", json!({"deviceName": "pi-bench"}))
            .await?;
        result["deviceToken"]
            .as_str()
            .map(str::to_string)
            .context("no deviceToken in the pair result")
    }

    /// The bytes of a session's events in the host's store (their chunks' bodies).
    pub fn stored_event_bytes(&self, session_id: &str) -> Result<u64> {
        let db = rusqlite::Connection::open(self.data_dir.path().join("pi-host.db"))?;
        let bytes: i64 = db.query_row(
            "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM event_chunks WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// The pids of the host's child processes (its agents).
    pub fn agent_pids(&self) -> Vec<u32> {
        children(self.pid)
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A fresh, empty pi-host data directory under `data_parent`.
pub fn new_data_dir(data_parent: &Path) -> Result<tempfile::TempDir> {
    std::fs::create_dir_all(data_parent)
        .with_context(|| format!("create {}", data_parent.display()))?;
    Ok(tempfile::Builder::new()
        .prefix("pi-host-data-")
        .tempdir_in(data_parent)?)
}

/// Direct children of `pid`, from /proc/PID/task/*/children.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// A process spoken to with JSON lines on stdin/stdout: the Socket.IO server and every load
/// worker.
pub struct JsonProcess {
    child: Child,
    pub pid: u32,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    name: String,
}

impl JsonProcess {
    pub fn spawn(mut command: Command, name: &str, log: &Path) -> Result<JsonProcess> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        let pid = child
            .id()
            .with_context(|| format!("{name} exited at once"))?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(JsonProcess {
            child,
            pid,
            stdin,
            lines: BufReader::new(stdout).lines(),
            name: name.to_string(),
        })
    }

    pub async fn send(&mut self, command: &Value) -> Result<()> {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .with_context(|| format!("write to {}", self.name))?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// The next JSON line; an `{"error": ...}` line becomes an `Err`.
    pub async fn recv(&mut self, timeout: Duration) -> Result<Value> {
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .with_context(|| format!("{} said nothing in {timeout:?}", self.name))?
            .with_context(|| format!("read from {}", self.name))?
            .with_context(|| format!("{} exited", self.name))?;
        let value: Value = serde_json::from_str(&line)
            .with_context(|| format!("{} wrote a line that is not JSON: {line}", self.name))?;
        if let Some(error) = value.get("error") {
            bail!("{}: {error}", self.name);
        }
        Ok(value)
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }
}

/// The Socket.IO peer server.
pub struct SocketIo {
    pub process: JsonProcess,
    pub url: String,
}

impl SocketIo {
    pub async fn start(tools: &Tools, token: &str) -> Result<SocketIo> {
        std::fs::create_dir_all(&tools.log_dir)?;
        let mut command = Command::new("node");
        // --expose-gc: the memory scenario collects garbage before reading RSS, in Node's favour.
        command
            .arg("--expose-gc")
            .arg(tools.node_dir.join("server.mjs"))
            .args(["--token", token]);
        let mut process = JsonProcess::spawn(
            command,
            "socket.io server",
            &tools.log_dir.join("socketio.log"),
        )?;
        let hello = process.recv(START_TIMEOUT).await?;
        let port = hello["port"].as_u64().context("no port from server.mjs")?;
        Ok(SocketIo {
            url: format!("http://127.0.0.1:{port}"),
            process,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid
    }

    /// Runs a command that answers with one line.
    pub async fn ask(&mut self, command: Value, timeout: Duration) -> Result<Value> {
        self.process.send(&command).await?;
        self.process.recv(timeout).await
    }

    pub async fn stop(self) {
        self.process.stop().await;
    }
}

/// Polls `session/get` until the session is idle (its turn ended); returns the head cursor.
pub async fn wait_idle(
    control: &mut Control,
    session_id: &str,
    timeout: Duration,
) -> Result<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let got = control
            .call("session/get", json!({"sessionId": session_id}))
            .await?;
        if got["session"]["state"] == "idle" {
            return Ok(got["cursor"].clone());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the session's turn did not end in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a turn whose prompt is `text` (stand-in agent directives).
pub async fn start_turn(control: &mut Control, session_id: &str, text: &str) -> Result<()> {
    static KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = format!(
        "bench-{}-{}",
        std::process::id(),
        KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    control
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await?;
    Ok(())
}

/// Creates a session in the host's workspace; returns its id and its cursor.
pub async fn create_session(control: &mut Control, host: &PiHost) -> Result<(String, Value)> {
    let created = control
        .call("session/create", json!({"workspace": host.workspace()}))
        .await?;
    let session_id = created["session"]["sessionId"]
        .as_str()
        .context("no sessionId")?
        .to_string();
    Ok((session_id, created["session"]["cursor"].clone()))
}

/// A session with one warm-up turn done, so the agent process is already running.
pub async fn session_with_agent(host: &PiHost, token: &str) -> Result<(Control, String)> {
    let mut control = Control::connect(&host.url, token).await?;
    let (session_id, _) = create_session(&mut control, host).await?;
    start_turn(&mut control, &session_id, "stream:10").await?;
    wait_idle(&mut control, &session_id, Duration::from_secs(30)).await?;
    Ok((control, session_id))
}

pub use racp::cursor_seq;

/// Starts a server that prints `NAME listening on URL` once it listens (its stderr already
/// pointed at a log), waits for that line, and keeps draining its stdout; returns the child,
/// its pid and the URL. Shared by pi-host and pi-gateway.
pub async fn spawn_listening(
    command: &mut Command,
    name: &str,
    log_hint: &str,
    patience: Duration,
) -> Result<(tokio::process::Child, u32, String)> {
    let mut child = command
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    let pid = child
        .id()
        .with_context(|| format!("{name} exited at once"))?;
    let stdout = child
        .stdout
        .take()
        .with_context(|| format!("{name} stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let prefix = format!("{name} listening on ");
    let url = tokio::time::timeout(patience, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix(&prefix) {
                return Ok(url.trim().to_string());
            }
        }
        bail!("{name} exited before listening (see {log_hint})")
    })
    .await
    .with_context(|| format!("{name} did not start in time"))??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, pid, url))
}
