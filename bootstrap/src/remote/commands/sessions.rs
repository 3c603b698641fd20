//! `pi-remote sessions`, `pi-remote new`, `pi-remote close`, `pi-remote fork` and
//! `pi-remote clone`.

use super::{call_resending, hint_remote_home};
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use racp_proto::client::RacpClient;
use racp_proto::methods::session::{
    SessionCloneParams, SessionCreateParams, SessionForkParams, SessionRef, SessionRenameParams,
};
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};

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
        .map_err(|e| hint_remote_home(e, "--workspace ", &workspace))?;
    if out.json {
        out.json_value(&created.session);
    } else {
        out.line(&created.session.session_id);
    }
    Ok(())
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
