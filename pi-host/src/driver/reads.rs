//! What a client reads of a session through its agent or its history: `session/stats`,
//! `session/commands` and `session/export` (docs/protocol.md §7.28-§7.30). An observer's read
//! uses the session's agent only when one already runs: it starts none, so it never stops
//! another session's agent to make room (§6.1). The export is redacted as everything else the
//! host hands out (§8.8), inside pi's embedded session data too.

use super::{DriverHost, Drivers, closed};
use crate::agent::{Agent, AgentError};
use crate::auth::Caller;
use crate::redact::Redactor;
use crate::sessions::Session;
use racp_proto::limits::DEFAULT_EXPORT_BYTES;
use racp_proto::methods::session::{
    SessionCommandsResult, SessionExportParams, SessionExportResult, SessionRef, SessionStatsResult,
};
use racp_proto::pi::{self, Command};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl Drivers {
    /// `session/stats`: the whole session's totals from the stored history (so an observer
    /// never starts an agent, and a stopped agent or a closed session still has them), and
    /// what the context holds, as the agent counts it, when one already runs.
    pub async fn stats(
        &self,
        host: &Arc<impl DriverHost>,
        params: SessionRef,
    ) -> Result<SessionStatsResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let (store, id, head) = (host.clone(), session.id.clone(), session.head_cursor());
        let mut stats = tokio::task::spawn_blocking(move || {
            crate::sessions::history::stats(store.store(), &id, head)
        })
        .await
        .map_err(crate::internal)??;
        if let Some(agent) = self.running_agent(&session).await {
            match agent.call(&Command::GetSessionStats).await {
                Ok(data) => {
                    stats.context_usage = pi::reply::context_usage(&data);
                    stats.context = pi::reply::context_stats(&data);
                }
                Err(err) => tracing::debug!(error = %err, "no context usage from the agent"),
            }
        }
        Ok(stats)
    }

    /// `session/commands`: pi's `get_commands` from the session's agent (for an operator
    /// started if needed, as a turn would: the list depends on the workspace and the agent's
    /// settings).
    pub async fn commands(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionRef,
    ) -> Result<SessionCommandsResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let agent = self
            .reading_agent(host, caller, &session, "session/commands")
            .await?;
        let data = agent.call(&Command::GetCommands).await?;
        Ok(SessionCommandsResult {
            commands: pi::reply::commands(&data),
        })
    }

    /// `session/export`: pi writes the page into a private directory of the host's data
    /// directory; it is read back within `maxBytes`, deleted, and redacted.
    pub async fn export(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionExportParams,
    ) -> Result<SessionExportResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let max = u64::from(params.max_bytes.unwrap_or(DEFAULT_EXPORT_BYTES));
        let agent = self
            .reading_agent(host, caller, &session, "session/export")
            .await?;
        let dir = host.config().data_dir.join("exports");
        racp_server::private_file::create_private_dir(&dir).map_err(crate::internal)?;
        let name = host.secrets().new_id("export_").map_err(crate::internal)?;
        let file = Removed(dir.join(format!("{name}.html")));
        write_export(&agent, &session, &file.0).await?;
        let path = file.0.clone();
        let redactor = host.agent_options().redactor;
        let html = tokio::task::spawn_blocking(move || {
            let html = read_bounded(&path, max)?;
            redacted(&redactor, html, max)
        })
        .await
        .map_err(crate::internal)??;
        drop(file);
        Ok(SessionExportResult {
            bytes: html.len() as u64,
            html,
        })
    }

    /// The agent a read of the session's agent uses. A caller who may start turns gets the
    /// running one or one started now ([`Drivers::agent_for`]); an observer only one that runs.
    async fn reading_agent(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        session: &Arc<Session>,
        method: &str,
    ) -> Result<Agent, AppError> {
        if caller.may_start_agents() {
            return self.agent_for(host, session).await;
        }
        if session.is_closing() {
            return Err(closed(session));
        }
        self.running_agent(session)
            .await
            .ok_or_else(|| not_running(session, method))
    }

    /// The session's agent if one runs now; never starts one.
    async fn running_agent(&self, session: &Arc<Session>) -> Option<Agent> {
        let driver = self.drivers.get(&session.id).map(|d| d.clone())?;
        driver.state.lock().await.agent.clone()
    }
}

/// Asks the agent to write its HTML export to `path`; an empty session is CONFLICT.
async fn write_export(agent: &Agent, session: &Session, path: &Path) -> Result<(), AppError> {
    let output_path = path
        .to_str()
        .ok_or_else(|| crate::internal("the data directory's path is not UTF-8"))?;
    match agent.call(&Command::ExportHtml { output_path }).await {
        Ok(_) => Ok(()),
        Err(AgentError::Rejected { command, message })
            if pi::Response::is_nothing_to_export(&command, &message) =>
        {
            Err(AppError::new(
                ErrorCode::Conflict,
                "nothing to export yet: the session has no conversation",
            )
            .with_details(json!({"sessionId": session.id})))
        }
        Err(err) => Err(err.into()),
    }
}

/// CONFLICT `agent_not_running`: an observer's read that would need the agent started.
fn not_running(session: &Session, method: &str) -> AppError {
    AppError::new(
        ErrorCode::Conflict,
        format!(
            "{method} needs the session's agent, which is not running, and an observer starts \
             none: call it again while the session is in use, or from a device with the \
             operator role"
        ),
    )
    .with_retriable(false)
    .with_details(json!({"sessionId": session.id, "reason": "agent_not_running"}))
}

/// The file's text, or PAYLOAD_TOO_LARGE when it holds more than `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Result<String, AppError> {
    let file = std::fs::File::open(path).map_err(crate::internal)?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(crate::internal)?;
    if bytes.len() as u64 > max {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        return Err(too_large(size, max));
    }
    String::from_utf8(bytes).map_err(crate::internal)
}

/// The page as the host hands it out: redacted (docs/protocol.md §8.8), still within `max`.
fn redacted(redactor: &Redactor, html: String, max: u64) -> Result<String, AppError> {
    let changed = match redactor.html_export(&html) {
        Some(Cow::Owned(page)) => Some(page),
        Some(Cow::Borrowed(_)) => None,
        None => return Err(undecodable()),
    };
    let page = changed.unwrap_or(html);
    if page.len() as u64 > max {
        return Err(too_large(page.len() as u64, max));
    }
    Ok(page)
}

fn undecodable() -> AppError {
    AppError::new(
        ErrorCode::Internal,
        "the agent's export holds session data the host cannot decode, so it cannot be \
         checked for secrets and is not handed out; check the agent's version (pi-host status)",
    )
    .with_retriable(false)
}

fn too_large(size: u64, max: u64) -> AppError {
    AppError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the export is {size} bytes, more than the {max} asked for: call again with a \
             larger maxBytes (up to 16 MiB) on a connection whose frame bound holds it"
        ),
    )
    .with_details(json!({"size": size, "limit": max, "reason": "export_too_large"}))
}

/// A file deleted when dropped, whatever happened in between.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.0)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(error = %err, "cannot delete an export");
        }
    }
}
