//! The agent bridge: one agent process per session, speaking pi's RPC mode (`pi --mode rpc`):
//! JSON commands on its stdin, JSON events and responses on its stdout, one per LF-terminated
//! line.
//!
//! [`Agent::spawn`] starts the configured command line (split like a shell would, but run without
//! one) in the session's workspace, as the leader of its own process group, and returns a handle
//! plus a bounded receiver of everything the agent says ([`AgentOutput`]), redacted with
//! [`AgentOptions::redactor`] before anything reads it (`crate::redact`). That receiver must be
//! drained by a task of its own: when it is full the bridge stops reading the agent's stdout, which
//! pushes back on the agent, and responses behind the backlog are not seen either, so a command
//! method waiting for its response would run into its timeout.
//!
//! Commands that pi answers (`prompt`, `steer`, `abort`, `get_state`) carry an `id`; the method
//! waits for the response with that id and returns `Err(AgentError::Rejected)` when pi says
//! `success: false` (for `prompt`, that includes pi's "Agent is already processing" refusal).
//! Responses that a method waited for are handed to it and are not repeated on the receiver;
//! every other response (no id, or one that came after its caller gave up) arrives as
//! [`AgentOutput::Response`].
//!
//! The process group makes the end clean: [`Agent::shutdown`] closes stdin, signals the whole
//! group with SIGTERM and, after a grace period, SIGKILL. Whenever the agent exits (asked to or
//! not), whatever is left of its group is killed, the rest of its stdout is drained, and the last
//! output is [`AgentOutput::Exited`] with the exit status and the tail of its stderr. Dropping
//! the last [`Agent`] handle kills the group too.

pub mod check;
pub mod extensions;
pub mod failure;
mod protocol;
pub mod sandbox;
#[cfg(test)]
mod tests;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use protocol::{Line, LineReader, Parsed, Reader, Reply};
use racp_proto::methods::model::ModelRef;
use racp_proto::methods::session::SessionSettings;
use racp_proto::methods::turn::ImageAttachment;
use racp_proto::pi::{self, Command as PiCommand, Kind};
pub use racp_proto::pi::{RunEnd, StopReason, UiAnswer, UiMethod};
use racp_proto::{AppError, ErrorCode, ErrorSource};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The longest stdout line accepted from an agent; longer ones are dropped as they stream in.
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// The read buffer on the agent's stdout: pi's stream updates are kilobytes each (the whole
/// message so far), and the default 8 KiB made the pipe reads a tenth of the host's time.
const STDOUT_BUFFER: usize = 256 << 10;
/// The agent's stdout pipe, as wide as an unprivileged process may make it (Linux's
/// `/proc/sys/fs/pipe-max-size` default).
const AGENT_PIPE_BYTES: i32 = 1 << 20;
/// Outputs buffered between the agent's stdout and the receiver.
pub const OUTPUT_CAPACITY: usize = 1024;
/// How much of the agent's stderr is kept for [`AgentOutput::Exited`].
pub const STDERR_TAIL_BYTES: usize = 8 << 10;
/// How long a command waits to be written and answered.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Agent::shutdown`] waits after SIGTERM before SIGKILL.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// After the agent exited, how long its pipes may stay open (held by a process that left its
/// process group) before the bridge stops reading them.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);

const SUGGEST_INSTALL: &str = "Install the pi coding agent (`npm install -g \
    @mariozechner/pi-coding-agent`), or set --agent / PI_HOST_AGENT to the agent's command line \
    (a program on PATH or an absolute path).";

/// What to run for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// The command line, e.g. `pi --mode rpc`: split into words like a POSIX shell would (quotes,
    /// backslashes), then run directly, never through a shell.
    pub command: String,
    /// The working directory of the agent; it must exist.
    pub workspace: PathBuf,
    /// Variables added to the host's environment.
    pub env: Vec<(String, String)>,
    /// How it is launched through `pi-host sandbox-exec` (`sandbox/exec.rs`): in the kernel
    /// sandbox, with the desktop's settings handed on a descriptor; `None`: run directly.
    pub launch: Option<sandbox::Launch>,
}

/// Bounds and timeouts of one agent; [`Default`] gives the constants of this module.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub max_line_bytes: usize,
    pub output_capacity: usize,
    pub stderr_tail_bytes: usize,
    pub response_timeout: Duration,
    pub shutdown_grace: Duration,
    /// Applied to every line the agent writes before it is read, and to its stderr tail.
    pub redactor: crate::redact::Redactor,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            max_line_bytes: MAX_LINE_BYTES,
            output_capacity: OUTPUT_CAPACITY,
            stderr_tail_bytes: STDERR_TAIL_BYTES,
            response_timeout: RESPONSE_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
            redactor: crate::redact::Redactor::default(),
        }
    }
}

/// Everything the agent says, in the order it said it.
#[derive(Debug, Clone)]
pub enum AgentOutput {
    /// Any pi event (agent_start, turn_start, message_update, tool_execution_*, turn_end,
    /// agent_end, queue_update, compaction_*, auto_retry_*, extension_error, ...), or a line
    /// that is not agent output (`invalid_output`).
    Event(AgentEvent),
    /// An extension's dialog: needs an answer through [`Agent::answer_ui`] with its `id`.
    UiRequest(pi::Dialog),
    /// A fire-and-forget `extension_ui_request` (notify, setStatus, setWidget, setTitle,
    /// set_editor_text, ...): no answer; `payload` is the line as pi wrote it.
    UiNotice {
        method: String,
        payload: Box<RawValue>,
    },
    /// A `response` that no command method is waiting for; `payload` is the line as pi wrote
    /// it.
    Response {
        response: pi::Response,
        payload: Box<RawValue>,
    },
    /// The process ended and its stdout is drained: always the last output. `status` is the exit
    /// code (None when a signal ended it: see `signal`); `stderr_tail` the last
    /// [`STDERR_TAIL_BYTES`] of its stderr.
    Exited {
        status: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
}

/// A pi event, relayed to clients as `agent.<kind>` with its payload exactly as pi wrote it
/// but for the strings the redaction changed (the host reads only what it needs from it, and
/// never re-encodes the rest).
#[derive(Debug, Clone)]
pub struct AgentEvent {
    /// pi's `type`, or [`Kind::InvalidOutput`] for a line that is not agent output: then the
    /// payload is `{"type": "invalid_output", "error", "bytes", "line"?}` (`line`: its first
    /// KiB, or the first 64 bytes of an over-long line).
    pub kind: Kind,
    pub payload: Box<RawValue>,
    /// Set when this output ends the agent's run.
    pub run_end: Option<RunEnd>,
    /// Set for the events that decide whether a failed run is final (pi's automatic retry and
    /// overflow compaction).
    pub signal: Option<pi::RunSignal>,
}

impl AgentOutput {
    /// The text of a `notify` notice (an extension's message to the client).
    pub fn notice_message(&self) -> Option<String> {
        match self {
            AgentOutput::UiNotice { payload, .. } => pi::UiRequest::notify_message(payload),
            _ => None,
        }
    }

    /// pi's `type` for events, `extension_ui_request`, `response`, or `exited`.
    pub fn kind(&self) -> &str {
        match self {
            AgentOutput::Event(event) => event.kind.as_str(),
            AgentOutput::UiRequest(_) | AgentOutput::UiNotice { .. } => {
                Kind::ExtensionUiRequest.as_str()
            }
            AgentOutput::Response { .. } => Kind::Response.as_str(),
            AgentOutput::Exited { .. } => "exited",
        }
    }
}

/// How the agent process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent program cannot be started (not found, not executable, unparsable command line).
    #[error("the agent `{command}` is unavailable: {reason}")]
    Unavailable {
        command: String,
        reason: String,
        suggestion: String,
    },
    /// The workspace is missing or not a directory.
    #[error("cannot run the agent in {}: {reason}", path.display())]
    Workspace { path: PathBuf, reason: String },
    #[error("talking to the agent failed: {0}")]
    Io(#[from] std::io::Error),
    /// The agent has exited (or closed its stdin/stdout), so it cannot take the command.
    #[error("the agent has exited")]
    Exited,
    #[error("the agent did not answer `{command}` within {} ms", after.as_millis())]
    Timeout { command: String, after: Duration },
    /// The agent answered the command with `success: false`.
    #[error("the agent refused `{command}`: {message}")]
    Rejected { command: String, message: String },
    /// The agent's answer was longer than the host reads in a line: nothing of it was read.
    #[error(
        "the agent's answer to `{command}` was {bytes} bytes, over the {bound} bytes the host reads in a line"
    )]
    TooLong {
        command: String,
        bytes: usize,
        bound: usize,
    },
}

impl AgentError {
    /// The agent does not know the command (an older pi, or another agent).
    pub fn is_unknown_command(&self) -> bool {
        matches!(self, AgentError::Rejected { message, .. } if pi::Response::is_unknown_command(message))
    }

    /// pi refused a prompt because a run is going on.
    pub fn is_busy(&self) -> bool {
        matches!(self, AgentError::Rejected { command, message }
            if pi::Response::is_busy(command, message))
    }

    /// The RACP error for this failure.
    pub fn to_app_error(&self) -> AppError {
        let message = self.to_string();
        let error = match self {
            AgentError::Unavailable {
                command,
                reason,
                suggestion,
            } => AppError::new(ErrorCode::AgentUnavailable, message).with_details(
                json!({"command": command, "reason": reason, "suggestion": suggestion}),
            ),
            AgentError::Workspace { path, reason } => {
                AppError::new(ErrorCode::RemotePathNotFound, message)
                    .with_details(json!({"path": path, "reason": reason}))
            }
            AgentError::Io(_) | AgentError::Exited => {
                AppError::new(ErrorCode::AgentSidecarCrashed, message)
            }
            AgentError::TooLong {
                command,
                bytes,
                bound,
            } => AppError::new(ErrorCode::PayloadTooLarge, message).with_details(json!({
                "command": command, "size": bytes, "limit": bound, "reason": "agent_reply_too_long",
            })),
            AgentError::Timeout { command, after } => AppError::new(ErrorCode::Timeout, message)
                .with_details(json!({"command": command, "afterMs": after.as_millis() as u64})),
            AgentError::Rejected { command, .. } if self.is_unknown_command() => {
                let capability = pi::command::capability_of(command);
                let feature =
                    capability.map_or(String::new(), |c| format!(" (the `{c}` capability)"));
                AppError::new(
                    ErrorCode::CapabilityUnavailable,
                    format!(
                        "the host's agent does not support `{command}`{feature}: upgrade pi on \
                         the host (pi-remote connect installs the version pi-host is tested with)"
                    ),
                )
                .with_details(
                    json!({"command": command, "capability": capability.map(|c| c.as_str())}),
                )
            }
            AgentError::Rejected { command, .. } if self.is_busy() => {
                AppError::new(ErrorCode::AgentBusy, message)
                    .with_details(json!({"command": command}))
            }
            AgentError::Rejected {
                command,
                message: reason,
            } => AppError::new(ErrorCode::AgentUnavailable, message)
                .with_details(json!({"command": command, "reason": reason})),
        };
        let trace_id = failure::trace_id();
        tracing::warn!(%trace_id, code = %error.code(), error = %self, "agent failure");
        error
            .with_source(ErrorSource::Agent)
            .with_trace_id(trace_id)
    }
}

/// Commands waiting for their response: by id, with the command's type (a refusal without an id
/// is matched by type: see `StdoutPump::claim_refusal`).
type ReplyWaiters = std::sync::Mutex<Option<HashMap<String, (String, oneshot::Sender<Reply>)>>>;

/// A handle on one running agent; clones share it.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    pid: u32,
    pgid: Pid,
    /// None once it broke or was closed.
    stdin: Mutex<Option<ChildStdin>>,
    /// Commands waiting for their response, by id; None once stdout closed.
    pending: Arc<ReplyWaiters>,
    next_id: AtomicU64,
    exit: watch::Receiver<Option<ExitInfo>>,
    options: AgentOptions,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.exit.borrow().is_none() {
            tracing::debug!(
                pid = self.pid,
                "last agent handle dropped; killing its process group"
            );
            signal_group(self.pgid, Signal::SIGKILL);
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Signals a whole process group; a group that is already gone is fine.
fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => {
            tracing::warn!(error = %err, ?signal, "cannot signal the agent's process group")
        }
    }
}

fn spawn_error(command: &str, program: &str, err: &std::io::Error) -> AgentError {
    let (reason, suggestion) = match err.kind() {
        std::io::ErrorKind::NotFound => (
            format!("`{program}` was not found"),
            SUGGEST_INSTALL.to_string(),
        ),
        std::io::ErrorKind::PermissionDenied => (
            format!("`{program}` is not executable (permission denied)"),
            "Make it executable (`chmod +x`), or set --agent / PI_HOST_AGENT to another command."
                .to_string(),
        ),
        _ if err.raw_os_error() == Some(Errno::ENOEXEC as i32) => (
            format!("`{program}` is not an executable program"),
            "Point --agent / PI_HOST_AGENT at the agent's executable or launcher script."
                .to_string(),
        ),
        _ => (
            format!("`{program}` could not be started: {err}"),
            "Check the agent command (--agent / PI_HOST_AGENT) and the host's process limits."
                .to_string(),
        ),
    };
    AgentError::Unavailable {
        command: command.to_string(),
        reason,
        suggestion,
    }
}

fn write_error(err: std::io::Error) -> AgentError {
    match err.kind() {
        std::io::ErrorKind::BrokenPipe => AgentError::Exited,
        _ => AgentError::Io(err),
    }
}

async fn wait_for_exit(exit: &mut watch::Receiver<Option<ExitInfo>>) -> ExitInfo {
    const UNKNOWN: ExitInfo = ExitInfo {
        code: None,
        signal: None,
    };
    match exit.wait_for(Option::is_some).await {
        Ok(info) => info.unwrap_or(UNKNOWN),
        Err(_) => UNKNOWN,
    }
}

impl Agent {
    /// Starts the agent; see the module docs. Nothing is written to it yet.
    pub async fn spawn(
        spec: &AgentSpec,
    ) -> Result<(Agent, mpsc::Receiver<AgentOutput>), AgentError> {
        Agent::spawn_with(spec, AgentOptions::default()).await
    }

    /// [`Agent::spawn`] with other bounds and timeouts.
    pub async fn spawn_with(
        spec: &AgentSpec,
        options: AgentOptions,
    ) -> Result<(Agent, mpsc::Receiver<AgentOutput>), AgentError> {
        let words = command_words(spec)?;
        let (program, args) = words
            .split_first()
            .ok_or_else(|| unavailable(spec, "the command line is empty".to_string()))?;
        check_workspace(spec).await?;
        let (child, (pid, pgid, stdin, stdout, stderr)) = start_child(spec, program, args)?;
        tracing::info!(pid, program = %program, workspace = %spec.workspace.display(), "agent started");
        tracing::debug!(pid, command = %spec.command, "agent command line");

        let (exit_tx, exit_rx) = watch::channel(None);
        let (out_tx, out_rx) = mpsc::channel(options.output_capacity.max(1));
        let pending: Arc<ReplyWaiters> = Arc::new(std::sync::Mutex::new(Some(HashMap::new())));
        let tail = Arc::new(std::sync::Mutex::new(Tail::new(options.stderr_tail_bytes)));

        tokio::spawn(supervise(child, pid, pgid, exit_tx));
        let stderr_task = tokio::spawn(read_stderr(stderr, tail.clone()));
        let pump = StdoutPump {
            reader: LineReader::new(
                BufReader::with_capacity(STDOUT_BUFFER, stdout),
                options.max_line_bytes,
            ),
            lines: Reader::new(options.redactor.clone()),
            out: out_tx,
            pending: pending.clone(),
            exit: exit_rx.clone(),
            stderr_task,
            tail,
            pid,
            pgid,
            grace: options.shutdown_grace,
            redactor: options.redactor.clone(),
        };
        tokio::spawn(pump.run());

        let inner = Inner {
            pid,
            pgid,
            stdin: Mutex::new(Some(stdin)),
            pending,
            next_id: AtomicU64::new(1),
            exit: exit_rx,
            options,
        };
        Ok((
            Agent {
                inner: Arc::new(inner),
            },
            out_rx,
        ))
    }

    /// The agent's process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// How it ended, once it has.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        *self.inner.exit.borrow()
    }

    /// Starts an agent run with this user message; returns once pi accepted it. The run itself
    /// is reported through the events; a failure after acceptance never comes back here. While
    /// a run goes on pi refuses: see [`AgentError::is_busy`].
    pub async fn prompt(&self, text: &str, images: &[ImageAttachment]) -> Result<(), AgentError> {
        let images: Vec<pi::command::Image<'_>> =
            images.iter().map(pi::command::Image::of).collect();
        self.call(&PiCommand::Prompt {
            message: text,
            images: &images,
        })
        .await
        .map(drop)
    }

    /// Queues a steering message for the current run: pi delivers it after the current
    /// assistant turn finishes its tool calls, before the next model call.
    pub async fn steer(&self, text: &str) -> Result<(), AgentError> {
        self.call(&PiCommand::Steer { message: text })
            .await
            .map(drop)
    }

    /// Aborts the current run. pi answers once the agent is idle, that is after the run's
    /// `agent_end`.
    pub async fn abort(&self) -> Result<(), AgentError> {
        self.call(&PiCommand::Abort).await.map(drop)
    }

    /// Answers a dialog ([`AgentOutput::UiRequest`]). pi never acknowledges it, and ignores
    /// answers to ids it no longer waits for.
    pub async fn answer_ui(&self, request_id: &str, answer: UiAnswer) -> Result<(), AgentError> {
        tracing::debug!(
            pid = self.inner.pid,
            request_id,
            answer = answer.name(),
            "agent dialog answered"
        );
        let command = PiCommand::ExtensionUiResponse {
            id: request_id,
            answer: &answer,
        };
        self.send(&command, None, self.inner.options.response_timeout)
            .await
    }

    /// pi's session state (`RpcSessionState`: model, isStreaming, messageCount, ...). pi answers
    /// once it has loaded, so a warm start asks it early.
    pub async fn get_state(&self) -> Result<Value, AgentError> {
        self.call(&PiCommand::GetState).await
    }

    /// The model the agent's next prompt runs on; None when it has none (pi found no model
    /// with a credential, or the user's default is gone).
    pub async fn current_model(&self) -> Result<Option<ModelRef>, AgentError> {
        Ok(pi::reply::current_model(&self.get_state().await?))
    }

    /// The models whose provider has a credential.
    pub async fn available_models(&self) -> Result<Vec<ModelRef>, AgentError> {
        let data = self.call(&PiCommand::GetAvailableModels).await?;
        Ok(pi::reply::available_models(&data))
    }

    /// Applies a session's settings (model, thinking level, auto-compaction); fields that are
    /// None keep the agent's own.
    pub async fn configure(&self, settings: &SessionSettings) -> Result<(), AgentError> {
        if let Some(model) = &settings.model {
            self.call(&PiCommand::set_model(model)).await?;
        }
        if let Some(level) = settings.thinking_level {
            let level = level.as_str();
            self.call(&PiCommand::SetThinkingLevel { level }).await?;
        }
        if let Some(enabled) = settings.auto_compaction {
            self.call(&PiCommand::SetAutoCompaction { enabled }).await?;
        }
        if let Some(mode) = settings.steering_mode {
            let mode = mode.as_str();
            self.call(&PiCommand::SetSteeringMode { mode }).await?;
        }
        if let Some(mode) = settings.follow_up_mode {
            let mode = mode.as_str();
            self.call(&PiCommand::SetFollowUpMode { mode }).await?;
        }
        Ok(())
    }

    /// Sends a command, waits for its response and returns the response's `data` (Null when
    /// it has none).
    pub async fn call(&self, command: &PiCommand<'_>) -> Result<Value, AgentError> {
        let timeout = self.inner.options.response_timeout;
        Ok(self.request(command, timeout).await?.response.data)
    }

    /// [`Agent::call`] for a command pi answers only when its work ends (a shell command):
    /// waits `timeout` for the answer instead of the agent's response timeout.
    pub async fn call_within(
        &self,
        command: &PiCommand<'_>,
        timeout: Duration,
    ) -> Result<Value, AgentError> {
        Ok(self.request(command, timeout).await?.response.data)
    }

    async fn request(
        &self,
        command: &PiCommand<'_>,
        timeout: Duration,
    ) -> Result<Reply, AgentError> {
        let started = Instant::now();
        let name = command.name();
        let id = format!(
            "pi-host-{}",
            self.inner.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = oneshot::channel();
        match lock(&self.inner.pending).as_mut() {
            Some(pending) => {
                pending.insert(id.clone(), (name.to_string(), tx));
            }
            None => return Err(AgentError::Exited),
        }
        tracing::debug!(pid = self.inner.pid, %id, command = name, "agent command");
        if let Err(err) = self.send(command, Some(&id), timeout).await {
            self.forget(&id);
            return Err(err);
        }
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, rx).await {
            Ok(Ok(Reply {
                too_long: Some(bytes),
                ..
            })) => Err(AgentError::TooLong {
                command: name.to_string(),
                bytes,
                bound: self.inner.options.max_line_bytes,
            }),
            Ok(Ok(reply)) if reply.response.success => Ok(reply),
            Ok(Ok(reply)) => Err(AgentError::Rejected {
                command: name.to_string(),
                message: reply
                    .response
                    .error
                    .unwrap_or_else(|| "no reason given".to_string()),
            }),
            Ok(Err(_)) => Err(AgentError::Exited),
            Err(_) => {
                self.forget(&id);
                Err(AgentError::Timeout {
                    command: name.to_string(),
                    after: timeout,
                })
            }
        }
    }

    fn forget(&self, id: &str) {
        if let Some(pending) = lock(&self.inner.pending).as_mut() {
            pending.remove(id);
        }
    }

    /// Writes one JSON line to the agent's stdin.
    async fn send(
        &self,
        command: &PiCommand<'_>,
        id: Option<&str>,
        timeout: Duration,
    ) -> Result<(), AgentError> {
        if self.exit_status().is_some() {
            return Err(AgentError::Exited);
        }
        let command_type = command.name();
        let line = command
            .to_line(id)
            .map_err(|err| AgentError::Io(err.into()))?;
        let started_writing = AtomicBool::new(false);
        let write = async {
            let mut stdin = self.inner.stdin.lock().await;
            let Some(pipe) = stdin.as_mut() else {
                return Err(AgentError::Exited);
            };
            started_writing.store(true, Ordering::Relaxed);
            let written = async {
                pipe.write_all(&line).await?;
                pipe.flush().await
            }
            .await;
            if let Err(err) = written {
                *stdin = None;
                return Err(write_error(err));
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(result) => result,
            Err(_) => {
                if started_writing.load(Ordering::Relaxed) {
                    // Part of the line may be in the pipe: nothing written after it would parse.
                    tracing::warn!(pid = self.inner.pid, "agent stopped reading its stdin");
                    if let Ok(mut stdin) = self.inner.stdin.try_lock() {
                        *stdin = None;
                    }
                }
                Err(AgentError::Timeout {
                    command: command_type.to_string(),
                    after: timeout,
                })
            }
        }
    }

    /// Ends the agent and its whole process tree, and waits for it: closes its stdin, sends
    /// SIGTERM to its process group, and SIGKILL after the grace period. Once the agent itself is
    /// gone, every process left in its group is killed as well. Idempotent.
    pub async fn shutdown(&self) {
        if self.exit_status().is_some() {
            return;
        }
        let pid = self.inner.pid;
        let grace = self.inner.options.shutdown_grace;
        tracing::info!(pid, "stopping the agent");
        // End of input is pi's own way out of RPC mode; a writer stuck on a full pipe holds the
        // lock, and the signals below unblock it.
        if let Ok(mut stdin) = self.inner.stdin.try_lock() {
            *stdin = None;
        }
        signal_group(self.inner.pgid, Signal::SIGTERM);
        let mut exit = self.inner.exit.clone();
        if tokio::time::timeout(grace, wait_for_exit(&mut exit))
            .await
            .is_err()
        {
            tracing::warn!(
                pid,
                ?grace,
                "agent still running after SIGTERM; sending SIGKILL"
            );
            signal_group(self.inner.pgid, Signal::SIGKILL);
            if tokio::time::timeout(grace, wait_for_exit(&mut exit))
                .await
                .is_err()
            {
                tracing::error!(pid, "agent did not exit after SIGKILL");
            }
        }
    }
}

type Pipes = (u32, Pid, ChildStdin, ChildStdout, ChildStderr);

/// The child's pid, its process group (the same number) and its pipes.
/// An agent command line that cannot start, and how to fix it.
fn unavailable(spec: &AgentSpec, reason: String) -> AgentError {
    AgentError::Unavailable {
        command: spec.command.clone(),
        reason,
        suggestion: "Set --agent / PI_HOST_AGENT to the agent's command line, e.g. \
            `pi --mode rpc`."
            .to_string(),
    }
}

/// The command line split as a shell would (it runs without one).
fn command_words(spec: &AgentSpec) -> Result<Vec<String>, AgentError> {
    shell_words::split(&spec.command)
        .map_err(|err| unavailable(spec, format!("the command line cannot be parsed: {err}")))
}

/// The workspace the agent runs in must be a directory.
async fn check_workspace(spec: &AgentSpec) -> Result<(), AgentError> {
    let reason = match tokio::fs::metadata(&spec.workspace).await {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_string(),
        Err(err) => err.to_string(),
    };
    Err(AgentError::Workspace {
        path: spec.workspace.clone(),
        reason,
    })
}

/// Starts the process, the leader of its own process group, with its three pipes.
fn start_child(
    spec: &AgentSpec,
    program: &str,
    args: &[String],
) -> Result<(Child, Pipes), AgentError> {
    // Through the launcher when there is a sandbox or settings to hand: it execs the agent
    // in the same process, so the pid, the group and the pipes are the agent's.
    let (run, words) = match &spec.launch {
        Some(launch) => launch.wrap(program, args),
        None => (program.into(), args.to_vec()),
    };
    let mut command = Command::new(&run);
    if spec.launch.is_some() {
        command.env(sandbox::LAUNCHER_ENV.0, sandbox::LAUNCHER_ENV.1);
    }
    command
        .args(&words)
        .current_dir(&spec.workspace)
        // systemd's socket is the host's, not the agent's (racp-server's notify.rs).
        .env_remove(racp_server::notify::ENV)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that the whole tree can be signalled at once.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|err| spawn_error(&spec.command, program, &err))?;
    match take_pipes(&mut child) {
        Ok(pipes) => Ok((child, pipes)),
        Err(err) => {
            if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
                signal_group(Pid::from_raw(pid), Signal::SIGKILL);
            }
            Err(err)
        }
    }
}

fn take_pipes(child: &mut Child) -> Result<Pipes, AgentError> {
    let missing = |what: &str| AgentError::Io(std::io::Error::other(format!("no {what}")));
    let pid = child.id().ok_or_else(|| missing("process id"))?;
    let pgid = i32::try_from(pid)
        .map(Pid::from_raw)
        .map_err(|_| missing("valid process id"))?;
    let stdin = child.stdin.take().ok_or_else(|| missing("stdin pipe"))?;
    let stdout = child.stdout.take().ok_or_else(|| missing("stdout pipe"))?;
    widen_pipe(&stdout);
    let stderr = child.stderr.take().ok_or_else(|| missing("stderr pipe"))?;
    Ok((pid, pgid, stdin, stdout, stderr))
}

/// pi writes each stream update with the whole message so far: a 64 KiB pipe (Linux's default)
/// holds a few of them, so agent and host woke each other every few lines. A wider one is an
/// optimisation only: where the kernel refuses, the default stays.
fn widen_pipe(stdout: &ChildStdout) {
    use nix::fcntl::{FcntlArg, fcntl};
    if let Err(err) = fcntl(stdout, FcntlArg::F_SETPIPE_SZ(AGENT_PIPE_BYTES)) {
        tracing::debug!(error = %err, "the agent's stdout pipe keeps its size");
    }
}

/// Owns the child: reaps it, then kills what is left of its process group.
async fn supervise(mut child: Child, pid: u32, pgid: Pid, exit: watch::Sender<Option<ExitInfo>>) {
    let info = match child.wait().await {
        Ok(status) => ExitInfo {
            code: status.code(),
            signal: status.signal(),
        },
        Err(err) => {
            tracing::warn!(pid, error = %err, "cannot wait for the agent");
            ExitInfo {
                code: None,
                signal: None,
            }
        }
    };
    // The leader is gone: nothing left in its group has anyone to answer to. (Its group id cannot
    // be handed to a new process while members remain, and SIGKILL to an empty group is ESRCH.)
    signal_group(pgid, Signal::SIGKILL);
    match (info.code, info.signal) {
        (Some(0), _) => tracing::info!(pid, "agent exited"),
        (code, signal) => tracing::warn!(pid, ?code, ?signal, "agent exited abnormally"),
    }
    exit.send_replace(Some(info));
}

/// The last bytes of the agent's stderr.
struct Tail {
    bytes: Vec<u8>,
    cap: usize,
}

impl Tail {
    fn new(cap: usize) -> Self {
        Tail {
            bytes: Vec::new(),
            cap,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > self.cap.saturating_mul(2).max(4096) {
            let cut = self.bytes.len() - self.cap;
            self.bytes.drain(..cut);
        }
    }

    fn text(&self) -> String {
        let start = self.bytes.len().saturating_sub(self.cap);
        let mut tail = &self.bytes[start..];
        if start > 0 {
            // Do not start in the middle of a line (half a credential is not recognisable, so
            // it would escape the redaction), or, with no line end, of a word; with neither,
            // not in the middle of a UTF-8 sequence.
            let cut = tail
                .iter()
                .position(|&b| b == b'\n')
                .or_else(|| tail.iter().position(u8::is_ascii_whitespace))
                .map(|at| at + 1)
                .or_else(|| tail.iter().position(|&b| b & 0xC0 != 0x80))
                .unwrap_or(tail.len());
            tail = &tail[cut..];
        }
        String::from_utf8_lossy(tail).into_owned()
    }
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> &str {
    let cut = text
        .trim_end()
        .rmatch_indices('\n')
        .nth(n.saturating_sub(1))
        .map_or(0, |(at, _)| at + 1);
    text[cut..].trim_end()
}

async fn read_stderr(mut stderr: ChildStderr, tail: Arc<std::sync::Mutex<Tail>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => lock(&tail).push(&buf[..n]),
            Err(err) => {
                tracing::debug!(error = %err, "reading the agent's stderr failed");
                break;
            }
        }
    }
}

/// Reads the agent's stdout, hands responses to their callers and forwards the rest.
struct StdoutPump {
    reader: LineReader<BufReader<ChildStdout>>,
    lines: Reader,
    out: mpsc::Sender<AgentOutput>,
    pending: Arc<ReplyWaiters>,
    exit: watch::Receiver<Option<ExitInfo>>,
    stderr_task: JoinHandle<()>,
    tail: Arc<std::sync::Mutex<Tail>>,
    pid: u32,
    pgid: Pid,
    grace: Duration,
    redactor: crate::redact::Redactor,
}

impl StdoutPump {
    async fn run(mut self) {
        let mut drain_until: Option<Instant> = None;
        loop {
            let drained = async {
                match drain_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                line = self.reader.next_line() => match line {
                    Ok(Some(Line::Text(bytes))) => self.handle(&bytes).await,
                    Ok(Some(Line::TooLong { bytes, head })) => {
                        tracing::warn!(pid = self.pid, bytes, "agent wrote an over-long line; dropped");
                        if !self.claim_cut_reply(&head, bytes) {
                            let output = self.lines.invalid_of("line longer than the bound", &head, bytes);
                            self.forward(output).await;
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(pid = self.pid, error = %err, "reading the agent's stdout failed");
                        break;
                    }
                },
                _ = self.exit.changed(), if drain_until.is_none() => {
                    drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                }
                () = drained => {
                    tracing::warn!(pid = self.pid, "agent exited but its stdout stays open; stopped reading");
                    break;
                }
            }
        }
        // Nobody will answer the commands still waiting.
        lock(&self.pending).take();
        let info = self.wait_exit().await;
        if tokio::time::timeout(DRAIN_AFTER_EXIT, &mut self.stderr_task)
            .await
            .is_err()
        {
            self.stderr_task.abort();
        }
        let stderr_tail = lock(&self.tail).text();
        let stderr_tail = self.redactor.text(&stderr_tail).into_owned();
        if info.code != Some(0) && !stderr_tail.is_empty() {
            // What the agent said last, for the owner reading the log (redacted above).
            tracing::warn!(pid = self.pid, stderr = %last_lines(&stderr_tail, 5), "the agent's last words");
        }
        let _ = self
            .out
            .send(AgentOutput::Exited {
                status: info.code,
                signal: info.signal,
                stderr_tail,
            })
            .await;
    }

    /// Stdout is closed: an agent that cannot speak is of no use, so it gets the grace period to
    /// exit by itself and is killed after that.
    async fn wait_exit(&mut self) -> ExitInfo {
        if let Ok(info) = tokio::time::timeout(self.grace, wait_for_exit(&mut self.exit)).await {
            return info;
        }
        tracing::warn!(
            pid = self.pid,
            "agent closed its stdout but keeps running; killing it"
        );
        signal_group(self.pgid, Signal::SIGKILL);
        tokio::time::timeout(self.grace, wait_for_exit(&mut self.exit))
            .await
            .unwrap_or(ExitInfo {
                code: None,
                signal: None,
            })
    }

    /// pi refuses a command it does not know without echoing its id (`Unknown command: X`, from
    /// an older pi or another agent): the refusal goes to the oldest caller waiting for a
    /// command of that type, which then fails at once instead of running into its timeout.
    fn claim_refusal(&self, response: &pi::Response, raw: &RawValue) -> bool {
        let mut pending = lock(&self.pending);
        let Some(pending) = pending.as_mut() else {
            return false;
        };
        let oldest = pending
            .iter()
            .filter(|(_, (kind, _))| *kind == response.command)
            .filter_map(|(id, _)| {
                let n = id.strip_prefix("pi-host-")?.parse::<u64>().ok()?;
                Some((n, id.clone()))
            })
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        let Some((_, waiter)) = pending.remove(&id) else {
            return false;
        };
        let reply = Reply {
            response: response.clone(),
            raw: raw.to_owned(),
            too_long: None,
        };
        let _ = waiter.send(reply);
        true
    }

    /// A reply too long to read whose head names the id of a caller: the caller fails at once
    /// ([`AgentError::TooLong`]) instead of waiting out its timeout for an answer that was
    /// dropped.
    fn claim_cut_reply(&self, head: &[u8], bytes: usize) -> bool {
        let head = String::from_utf8_lossy(head);
        let Some(id) = pi::line::head_names_reply(&head) else {
            return false;
        };
        let waiter = lock(&self.pending)
            .as_mut()
            .and_then(|pending| pending.remove(id));
        let Some((command, waiter)) = waiter else {
            return false;
        };
        let response = pi::Response {
            id: Some(id.to_string()),
            command,
            success: false,
            error: None,
            data: Value::Null,
        };
        let reply = Reply {
            response,
            raw: protocol::raw_null(),
            too_long: Some(bytes),
        };
        waiter.send(reply).is_ok()
    }

    async fn handle(&mut self, line: &[u8]) {
        match self.lines.read(line) {
            None => {}
            Some(Parsed::Reply { id, reply }) => {
                let waiter = lock(&self.pending)
                    .as_mut()
                    .and_then(|pending| pending.remove(&id));
                let unclaimed = match waiter {
                    Some((_, waiter)) => waiter.send(reply).err(),
                    None => Some(reply),
                };
                if let Some(reply) = unclaimed {
                    self.forward(AgentOutput::Response {
                        response: reply.response,
                        payload: reply.raw,
                    })
                    .await;
                }
            }
            Some(Parsed::Output(AgentOutput::Response { response, payload }))
                if !response.success && self.claim_refusal(&response, &payload) => {}
            Some(Parsed::Output(output)) => {
                if let AgentOutput::Event(event) = &output
                    && event.kind == Kind::InvalidOutput
                {
                    tracing::warn!(
                        pid = self.pid,
                        payload = event.payload.get(),
                        "agent wrote a line that is not agent output"
                    );
                }
                tracing::trace!(pid = self.pid, kind = output.kind(), "agent output");
                self.forward(output).await;
            }
        }
    }

    async fn forward(&mut self, output: AgentOutput) {
        // A dropped receiver is not a reason to stop draining the agent.
        let _ = self.out.send(output).await;
    }
}
