//! What a client reads of a session through its agent or its history: `session/stats`,
//! `session/commands` and `session/export` (docs/protocol.md §7.28-§7.30).

use super::{TurnHost, Turns};
use crate::agent::{Agent, AgentError};
use crate::sessions::Session;
use racp_proto::limits::DEFAULT_EXPORT_BYTES;
use racp_proto::methods::session::{
    SessionCommandsResult, SessionExportParams, SessionExportResult, SessionRef, SessionStatsResult,
};
use racp_proto::pi::{self, Command};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl Turns {
    /// `session/stats`: the whole session's totals from the stored history (so an observer
    /// never starts an agent, and a stopped agent or a closed session still has them), and
    /// what the context holds, as the agent counts it, when one already runs.
    pub async fn stats(
        &self,
        host: &Arc<impl TurnHost>,
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

    /// `session/commands`: pi's `get_commands` from the session's agent (started if needed,
    /// as a turn would: the list depends on the workspace and the agent's settings).
    pub async fn commands(
        &self,
        host: &Arc<impl TurnHost>,
        params: SessionRef,
    ) -> Result<SessionCommandsResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let agent = self.agent_for(host, &session).await?;
        let data = agent.call(&Command::GetCommands).await?;
        Ok(SessionCommandsResult {
            commands: pi::reply::commands(&data),
        })
    }

    /// `session/export`: pi writes the page into a private directory of the host's data
    /// directory; it is read back within `maxBytes` and deleted.
    pub async fn export(
        &self,
        host: &Arc<impl TurnHost>,
        params: SessionExportParams,
    ) -> Result<SessionExportResult, AppError> {
        let session = host.sessions().find(&params.session_id)?;
        let max = u64::from(params.max_bytes.unwrap_or(DEFAULT_EXPORT_BYTES));
        let agent = self.agent_for(host, &session).await?;
        let dir = host.config().data_dir.join("exports");
        crate::private_file::create_private_dir(&dir).map_err(crate::internal)?;
        let name = host.secrets().new_id("export_").map_err(crate::internal)?;
        let file = Removed(dir.join(format!("{name}.html")));
        write_export(&agent, &session, &file.0).await?;
        let path = file.0.clone();
        let html = tokio::task::spawn_blocking(move || read_bounded(&path, max))
            .await
            .map_err(crate::internal)??;
        drop(file);
        Ok(SessionExportResult {
            bytes: html.len() as u64,
            html,
        })
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

/// The file's text, or PAYLOAD_TOO_LARGE when it holds more than `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Result<String, AppError> {
    let file = std::fs::File::open(path).map_err(crate::internal)?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(crate::internal)?;
    if bytes.len() as u64 > max {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        return Err(AppError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the export is {size} bytes, more than the {max} asked for: call again with a \
                 larger maxBytes (up to 16 MiB) on a connection whose frame bound holds it"
            ),
        )
        .with_details(json!({"size": size, "limit": max, "reason": "export_too_large"})));
    }
    String::from_utf8(bytes).map_err(crate::internal)
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
