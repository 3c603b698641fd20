//! `cat`: a file on the host written to stdout as it is, read a page at a time with `fs/read`
//! (docs/protocol.md §7.8); `diff` and `changes`: a session's workspace through the host's git
//! (§7.34, §7.35).

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::Out;
use base64::Engine;
use racp_proto::calls;
use racp_proto::client::RacpClient;
use racp_proto::limits::{MAX_DIFF_BYTES, MAX_READ_BYTES};
use racp_proto::methods::fs::{FsReadParams, ReadEncoding};
use racp_proto::methods::session::SessionRef;
use racp_proto::methods::workspace::WorkspaceDiffParams;
use std::io::Write;

/// Writes the file's bytes to stdout, text or binary alike; with `--json`, one page result per
/// line. A file that changes while it is read is refused rather than printed half old, half new.
pub async fn cat(out: &Out, client: &RacpClient, path: String) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    let (mut offset, mut first_hash) = (0u64, None::<String>);
    loop {
        let params = FsReadParams {
            path: path.clone(),
            offset: Some(offset),
            length: Some(MAX_READ_BYTES),
            encoding: Some(ReadEncoding::Base64),
        };
        let page = call_resending::<calls::FsRead>(client, params)
            .await
            .map_err(|e| super::hint_remote_home(e, "", &path))?;
        if first_hash.get_or_insert_with(|| page.sha256.clone()) != &page.sha256 {
            return Err(Failure::Local(format!(
                "{path} changed while it was read: run cat again"
            )));
        }
        if out.json {
            out.json_value(&page);
        } else {
            let data = page.data.as_deref().unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| {
                    Failure::Local(format!("the host sent a page that is not base64: {e}"))
                })?;
            stdout
                .write_all(&bytes)
                .map_err(|e| Failure::Local(format!("cannot write the file: {e}")))?;
        }
        offset += page.length;
        if page.eof || page.length == 0 {
            break;
        }
    }
    stdout
        .flush()
        .map_err(|e| Failure::Local(format!("cannot write the file: {e}")))
}

/// `diff SESSION [--turn TURN] [--path PATH]`: the workspace's unified diff against HEAD (all
/// of it, one turn's files, or one path), as the host's git wrote it (docs/protocol.md §7.35).
pub async fn diff(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    turn_id: Option<String>,
    path: Option<String>,
) -> Result<(), Failure> {
    let params = WorkspaceDiffParams {
        session_id,
        turn_id,
        path,
        max_bytes: Some(MAX_DIFF_BYTES),
    };
    let diff = call_resending::<calls::WorkspaceDiff>(client, params).await?;
    if out.json {
        out.json_value(&diff);
        return Ok(());
    }
    out.text(&diff.diff);
    if diff.truncated {
        out.note("(the diff was cut at its bound: ask for one file with --path)");
    }
    Ok(())
}

/// `changes SESSION`: the workspace's branch, how far it is from its upstream, and its changed
/// files, one a line with git's two status letters (docs/protocol.md §7.34).
pub async fn changes(out: &Out, client: &RacpClient, session_id: String) -> Result<(), Failure> {
    let params = SessionRef { session_id };
    let status = call_resending::<calls::WorkspaceStatus>(client, params).await?;
    if out.json {
        out.json_value(&status);
        return Ok(());
    }
    let branch = status.branch.as_deref().unwrap_or("(detached HEAD)");
    let mut head = format!("on {branch}");
    if let Some(upstream) = &status.upstream {
        let (ahead, behind) = (status.ahead.unwrap_or(0), status.behind.unwrap_or(0));
        head.push_str(&format!(", {ahead} ahead and {behind} behind {upstream}"));
    }
    out.line(&head);
    for file in &status.files {
        match &file.from {
            Some(from) => out.line(&format!("{} {} (from {from})", file.status, file.path)),
            None => out.line(&format!("{} {}", file.status, file.path)),
        }
    }
    if status.files.is_empty() {
        out.line("nothing changed");
    }
    if status.truncated {
        out.note("(more files changed than the host lists)");
    }
    Ok(())
}
