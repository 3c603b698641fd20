//! `session/export` (docs/protocol.md §7.30): pi writes the page into a private directory of
//! the host's data directory; it is read back within `maxBytes`, deleted, and redacted as
//! everything else the host hands out (§8.8), inside pi's embedded session data too.

use crate::agent::{Agent, AgentError};
use crate::auth::Caller;
use crate::models::ModelHost;
use crate::redact::Redactor;
use crate::sessions::Session;
use crate::state::HostState;
use racp_proto::limits::DEFAULT_EXPORT_BYTES;
use racp_proto::methods::session::{SessionExportParams, SessionExportResult};
use racp_proto::pi::{self, Command};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `session/export`: pi writes the page into a private directory of the host's data
/// directory; it is read back within `maxBytes`, deleted, and redacted.
pub async fn export(
    host: Arc<HostState>,
    caller: Caller,
    params: SessionExportParams,
) -> Result<SessionExportResult, AppError> {
    let max = u64::from(params.max_bytes.unwrap_or(DEFAULT_EXPORT_BYTES));
    // The page read back and its result written: `maxBytes` twice, held until the result is
    // written (docs/reliability.md §4.18).
    let _held = host.budget.charge(max as usize * 2)?;
    let session = host.sessions.find(&params.session_id)?;
    let agent = super::reading_agent(&host, &caller, &session, "session/export").await?;
    let dir = crate::driver::export_dir(&*host, &session.id);
    racp_server::private_file::create_private_dir(&dir).map_err(crate::internal)?;
    let name = host.secrets.new_id("export_").map_err(crate::internal)?;
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
