//! `pi-remote sessions`, `pi-remote new`, `pi-remote close`, `pi-remote fork` and
//! `pi-remote clone`.

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use racp_proto::client::RacpClient;
use racp_proto::methods::session::{
    SessionCloneParams, SessionCreateParams, SessionForkParams, SessionRef, SessionRenameParams,
};
use racp_proto::validate::printable;
use racp_proto::{AppError, Empty, ErrorCode, calls};

/// Lists sessions: one line each, `ID  STATE  TITLE  WORKSPACE[ turn=ID]`.
pub async fn list(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::SessionList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
    } else if list.sessions.is_empty() {
        out.line("no sessions");
    } else {
        for s in &list.sessions {
            let state = enum_name(&s.state);
            let title = printable(s.title.as_deref().unwrap_or("-"), false);
            let turn = s
                .active_turn_id
                .as_deref()
                .map(|t| format!(" turn={t}"))
                .unwrap_or_default();
            out.line(&format!(
                "{}\t{state}\t{title}\t{}{turn}",
                printable(&s.session_id, false),
                printable(&s.workspace, false)
            ));
        }
    }
    Ok(())
}

/// Creates a session and prints its id.
pub async fn create(
    out: &Out,
    client: &RacpClient,
    params: SessionCreateParams,
) -> Result<(), Failure> {
    let workspace = params.workspace.clone();
    let created = client
        .call::<calls::SessionCreate>(params)
        .await
        .map_err(|e| hint_remote_home(e, &workspace, std::env::var("HOME").ok().as_deref()))?;
    if out.json {
        out.json_value(&created.session);
    } else {
        out.line(&created.session.session_id);
    }
    Ok(())
}

/// A refused workspace, with what the person likely meant: a path under this machine's home
/// (`~/x` unquoted, which the shell here expanded) is not the remote's, and a relative one is
/// nobody's. The host resolves `~/...` to its own user's home (docs/protocol.md §7.9).
fn hint_remote_home(error: AppError, workspace: &str, local_home: Option<&str>) -> AppError {
    let code = error.code();
    let under_local_home = local_home
        .filter(|h| h.len() > 1)
        .and_then(|home| workspace.strip_prefix(home.trim_end_matches('/')))
        .filter(|rest| rest.is_empty() || rest.starts_with('/'));
    let hint = match (code, under_local_home) {
        (ErrorCode::RemotePathForbidden | ErrorCode::RemotePathNotFound, Some(rest)) => format!(
            " ({workspace} is under this machine's home, which the shell here put in place of \
             `~`; for the remote user's home, quote it: --workspace '~{rest}')"
        ),
        (ErrorCode::InvalidParams, _) if !workspace.starts_with('/') => {
            " (a path on the remote: absolute, or '~/...' for the remote user's home)".into()
        }
        _ => return error,
    };
    let mut hinted = AppError::new(code, format!("{}{hint}", error.message()));
    if let Some(details) = error.details() {
        hinted = hinted.with_details(details.clone());
    }
    hinted.with_source(error.origin())
}

/// Closes a session: its agent stops (a running turn ends aborted); its log stays readable.
/// Closing a closed session succeeds, so the call is resent after a dropped link.
pub async fn close(out: &Out, client: &RacpClient, session_id: String) -> Result<(), Failure> {
    call_resending::<calls::SessionClose>(
        client,
        SessionRef {
            session_id: session_id.clone(),
        },
    )
    .await?;
    if out.json {
        out.json_value(&serde_json::json!({"sessionId": session_id, "closed": true}));
    } else {
        out.line(&format!("closed {}", printable(&session_id, false)));
    }
    Ok(())
}

/// Gives a session another title; prints the session as `new` does.
pub async fn rename(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    title: String,
) -> Result<(), Failure> {
    let renamed =
        call_resending::<calls::SessionRename>(client, SessionRenameParams { session_id, title })
            .await?;
    if out.json {
        out.json_value(&renamed.session);
    } else {
        let title = renamed.session.title.as_deref().unwrap_or("");
        out.line(&format!(
            "{} {}",
            printable(&renamed.session.session_id, false),
            printable(title, false)
        ));
    }
    Ok(())
}

/// Forks a session before the user message at `from` (docs/protocol.md §7.31): prints the new
/// session's id, then the message's text. Not resent after a dropped link: a resend would make
/// a second branch.
pub async fn fork(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    from: racp_proto::Cursor,
    title: Option<String>,
) -> Result<(), Failure> {
    let params = SessionForkParams {
        session_id,
        from,
        title,
    };
    let forked = client.call::<calls::SessionFork>(params).await?;
    if out.json {
        out.json_value(&forked);
    } else {
        out.line(&forked.session.session_id);
        out.line(&printable(&forked.text, true));
    }
    Ok(())
}

/// Clones a session (docs/protocol.md §7.32) and prints the new session's id.
pub async fn clone(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    title: Option<String>,
) -> Result<(), Failure> {
    let params = SessionCloneParams { session_id, title };
    let cloned = client.call::<calls::SessionClone>(params).await?;
    if out.json {
        out.json_value(&cloned.session);
    } else {
        out.line(&cloned.session.session_id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_path_under_this_machine_s_home_hints_at_quoting_tilde() {
        let refused = AppError::new(ErrorCode::RemotePathForbidden, "outside the roots");
        let hinted = hint_remote_home(refused.clone(), "/home/me/src/x", Some("/home/me"));
        assert!(
            hinted
                .message()
                .ends_with("quote it: --workspace '~/src/x')"),
            "{}",
            hinted.message()
        );
        // Only under this home, on a path boundary; other refusals pass unchanged.
        let other = hint_remote_home(refused.clone(), "/home/meg/x", Some("/home/me"));
        assert_eq!(other.message(), "outside the roots");
        let busy = AppError::new(ErrorCode::AgentBusy, "busy");
        assert_eq!(
            hint_remote_home(busy, "/home/me/x", Some("/home/me")).message(),
            "busy"
        );
        let relative = AppError::new(
            ErrorCode::InvalidParams,
            "params.workspace: must be an absolute path",
        );
        assert!(
            hint_remote_home(relative, "src/x", Some("/home/me"))
                .message()
                .ends_with("absolute, or '~/...' for the remote user's home)")
        );
    }
}
