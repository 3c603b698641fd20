//! `pi-remote sessions`, `pi-remote new` and `pi-remote close`.

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use racp_proto::client::RacpClient;
use racp_proto::methods::session::{SessionCreateParams, SessionRef, SessionRenameParams};
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
    let created = client.call::<calls::SessionCreate>(params).await?;
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
