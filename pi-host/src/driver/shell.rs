//! `session/bash` and `session/bash_abort` (docs/protocol.md §7.27): a shell command run by the
//! session's agent (pi's `bash`), its output kept in the conversation as pi keeps it locally,
//! and made visible as `session.bash`, since pi emits no event for it.

use super::{Driver, DriverHost, Drivers};
use crate::agent::AgentError;
use crate::auth::Caller;
use crate::sessions::HostEvent;
use racp_proto::events::{BashRole, SessionBashData};
use racp_proto::limits::{MAX_SHELL_OUTPUT_BYTES, SHELL_DEADLINE_SECONDS};
use racp_proto::methods::session::{SessionBashParams, SessionBashResult, SessionRef};
use racp_proto::pi::{self, Command};
use racp_proto::{Ack, AppError, ErrorCode};
use racp_server::clock::now_ms;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a shell command may run before the host aborts it (it then answers
/// `cancelled: true`). pi answers `bash` only when the command ends.
pub const SHELL_DEADLINE: Duration = Duration::from_secs(SHELL_DEADLINE_SECONDS);
/// How long pi may take to answer once the command was aborted.
const AFTER_ABORT: Duration = Duration::from_secs(30);

impl Drivers {
    /// `session/bash`: one shell command at a time per session (pi aborts only its latest);
    /// allowed during a turn, as pi allows it (pi then adds it to the context after the run).
    pub async fn bash(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionBashParams,
    ) -> Result<SessionBashResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        let _running = ShellRunning::take(&driver)?;
        let agent = self.agent_for(host, &session).await?;
        let mut result = run(&agent, &params.command).await?;
        driver.state.lock().await.last_used = Some(Instant::now());
        if keep_end(&mut result.output, MAX_SHELL_OUTPUT_BYTES) {
            result.truncated = true;
        }
        // The output came through the agent's redaction; the command line is the client's, and
        // may name a key (`curl -H 'Authorization: …'`): stored and relayed redacted too.
        let command = host
            .agent_options()
            .redactor
            .text(&params.command)
            .into_owned();
        let event = HostEvent::of_session(SessionBashData {
            role: BashRole::BashExecution,
            command,
            output: result.output.clone(),
            exit_code: result.exit_code,
            cancelled: result.cancelled,
            truncated: result.truncated,
            timestamp: now_ms(),
            device_id: caller.device_id().map(str::to_string),
            device_name: caller.device_name().map(str::to_string),
        });
        host.sessions().commit(&session, vec![event]).await?;
        tracing::info!(session_id = %session.id, exit_code = ?result.exit_code, cancelled = result.cancelled, "shell command ran");
        Ok(result)
    }

    /// `session/bash_abort`: aborts the session's running shell command; none running is a
    /// success that changes nothing.
    pub async fn bash_abort(
        &self,
        host: &Arc<impl DriverHost>,
        params: SessionRef,
    ) -> Result<Ack, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&session);
        if !driver.shell_running.load(Ordering::Acquire) {
            return Ok(Ack {});
        }
        let agent = driver.state.lock().await.agent.clone();
        if let Some(agent) = agent {
            agent.call(&Command::AbortBash).await?;
        }
        Ok(Ack {})
    }
}

/// pi's answer to `bash`; past [`SHELL_DEADLINE`] the command is aborted and its answer
/// (`cancelled: true`, the output so far) awaited.
async fn run(agent: &crate::agent::Agent, command: &str) -> Result<SessionBashResult, AppError> {
    let bash = Command::Bash { command };
    let call = agent.call_within(&bash, SHELL_DEADLINE + AFTER_ABORT);
    tokio::pin!(call);
    tokio::select! {
        reply = &mut call => return answered(reply),
        () = tokio::time::sleep(SHELL_DEADLINE) => {}
    }
    tracing::warn!(
        pid = agent.pid(),
        "a shell command ran past its deadline: aborting it"
    );
    if let Err(err) = agent.call(&Command::AbortBash).await {
        tracing::warn!(error = %err, "cannot abort a shell command");
    }
    answered(call.await)
}

/// The command's result from pi's answer; an answer longer than the agent's line bound was
/// dropped unread, so its output is cut to nothing and says `truncated` (docs/protocol.md
/// §7.27).
fn answered(reply: Result<serde_json::Value, AgentError>) -> Result<SessionBashResult, AppError> {
    match reply {
        Ok(reply) => Ok(pi::reply::bash_result(&reply)),
        Err(err @ AgentError::TooLong { .. }) => {
            tracing::warn!(error = %err, "a shell command's answer was cut whole");
            Ok(SessionBashResult {
                output: String::new(),
                exit_code: None,
                cancelled: false,
                truncated: true,
            })
        }
        Err(err) => Err(err.into()),
    }
}

/// Keeps the last `bound` bytes of `text` (from a character boundary); true when it cut.
fn keep_end(text: &mut String, bound: usize) -> bool {
    if text.len() <= bound {
        return false;
    }
    let mut start = text.len() - bound;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text.drain(..start);
    true
}

/// The session's shell command in flight: held from the call to its event, so a second one
/// is refused (AGENT_BUSY) and the agent is not stopped as idle under it.
struct ShellRunning(Arc<Driver>);

impl ShellRunning {
    fn take(driver: &Arc<Driver>) -> Result<ShellRunning, AppError> {
        if driver.shell_running.swap(true, Ordering::AcqRel) {
            return Err(AppError::new(
                ErrorCode::AgentBusy,
                "a shell command is already running in this session: wait for it or abort it \
                 (session/bash_abort)",
            )
            .with_details(json!({"sessionId": driver.session.id})));
        }
        Ok(ShellRunning(driver.clone()))
    }
}

impl Drop for ShellRunning {
    fn drop(&mut self) {
        self.0.shell_running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::keep_end;

    #[test]
    fn the_end_of_a_long_output_is_kept_whole_characters() {
        let mut text = "aé".repeat(4);
        assert!(keep_end(&mut text, 4));
        assert_eq!(text, "aé");
        let mut short = "ok".to_string();
        assert!(!keep_end(&mut short, 4));
    }
}
