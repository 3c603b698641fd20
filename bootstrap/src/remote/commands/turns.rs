//! `pi-remote prompt` (start a turn, and with `--wait` follow it), `steer` and `abort` (the
//! running turn), `approve` and `deny`.

use super::approvals::{Approvals, stdin_lines};
use super::{call_resending, client_stopped};
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use crate::remote::view::View;
use racp_proto::calls;
use racp_proto::client::{RacpClient, Subscription, SubscriptionItem};
use racp_proto::events::{Event, EventType, TurnFinishedData, TurnOutcome};
use racp_proto::methods::session::{
    SessionClearQueueParams, SessionCompactParams, SessionGetResult, SessionRef,
    SessionSubscribeParams,
};
use racp_proto::methods::turn::{
    Answer, ApprovalKind, ApprovalRespondParams, Decision, ImageAttachment, TurnFollowUpParams,
    TurnRef, TurnStartParams, TurnState, TurnSteerParams, Verdict,
};
use racp_proto::validate::printable;
use serde_json::json;
use std::io::IsTerminal;
use tokio::sync::mpsc;

/// An image file as a prompt carries it; its type from its name (the host checks the rest).
fn image_from_file(path: &std::path::Path) -> Result<ImageAttachment, Failure> {
    use base64::Engine;
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let mime_type = match extension.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        _ => {
            return Err(Failure::Usage(format!(
                "{}: an image must be a .png, .jpg, .gif or .webp file",
                path.display()
            )));
        }
    };
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::Local(format!("cannot read {}: {e}", path.display())))?;
    Ok(ImageAttachment {
        mime_type: mime_type.to_string(),
        data: base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

/// Starts a turn; with `wait`, follows it to its end (an outcome other than `completed` is
/// [`Failure::Turn`]).
pub async fn prompt(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    text: String,
    image_files: &[std::path::PathBuf],
    wait: bool,
) -> Result<(), Failure> {
    let images = image_files
        .iter()
        .map(|path| image_from_file(path))
        .collect::<Result<Vec<_>, _>>()?;
    let params = TurnStartParams {
        session_id: session_id.clone(),
        idempotency_key: idempotency_key()?,
        text,
        images,
    };
    if !wait {
        let started = call_resending::<calls::TurnStart>(client, params).await?;
        if out.json {
            out.json_value(&json!({"sessionId": session_id, "turnId": started.turn_id}));
        } else {
            out.line(&started.turn_id);
        }
        return Ok(());
    }
    // Subscribe first, from the snapshot's cursor, so no event of the turn is missed.
    let got = client
        .call::<calls::SessionGet>(SessionRef {
            session_id: session_id.clone(),
        })
        .await?;
    let sub = client
        .subscribe(SessionSubscribeParams {
            session_id,
            cursor: Some(got.cursor),
        })
        .await?;
    let turn_id = call_resending::<calls::TurnStart>(client, params)
        .await?
        .turn_id;
    follow_turn(out, client, sub, &turn_id).await
}

/// Prints the turn's events until it ends. At a terminal, typed lines answer the turn's
/// approvals (as in `attach`); otherwise a note says how to answer them from elsewhere.
async fn follow_turn(
    out: &Out,
    client: &RacpClient,
    mut sub: Subscription,
    turn_id: &str,
) -> Result<(), Failure> {
    let interactive = std::io::stdin().is_terminal();
    let mut lines = stdin_lines_if(interactive);
    let mut stdin_open = interactive;
    let mut turn = FollowedTurn {
        out,
        turn_id,
        interactive,
        view: View::default(),
        approvals: Approvals::new(&[], interactive),
    };
    let outcome = loop {
        turn.approvals.answer_typed(out, client).await?;
        let item = tokio::select! {
            item = sub.items.recv() => item,
            line = lines.recv(), if stdin_open => {
                match line {
                    Some(Some(line)) => turn.approvals.on_line(out, &line),
                    _ => stdin_open = false,
                }
                continue;
            }
        };
        let Some(item) = item else {
            return Err(client_stopped().into());
        };
        let ended = match item {
            SubscriptionItem::Event(event) => turn.on_event(&event),
            SubscriptionItem::Resynced(snapshot) => turn.on_resync(&snapshot),
            SubscriptionItem::Ended => Some("aborted (the session was closed)"),
            SubscriptionItem::Failed(error) => return Err(error.into()),
        };
        if let Some(outcome) = ended {
            break outcome;
        }
    };
    out.text(&turn.view.break_line());
    if outcome == "completed" {
        Ok(())
    } else {
        Err(Failure::Turn(outcome.to_string()))
    }
}

/// A turn followed by `prompt --wait`: what is shown and what waits for an answer.
struct FollowedTurn<'a> {
    out: &'a Out,
    turn_id: &'a str,
    /// Stdin is a terminal, where the approvals are answered.
    interactive: bool,
    view: View,
    approvals: Approvals,
}

impl FollowedTurn<'_> {
    /// Shows an event of the turn; the turn's outcome once it has finished.
    fn on_event(&mut self, event: &Event) -> Option<&'static str> {
        if event.turn_id.as_deref() != Some(self.turn_id) {
            return None;
        }
        let out = self.out;
        out.event(&mut self.view, event);
        if let Some(requested) = self.approvals.on_event(event) {
            if self.interactive {
                out.text(&self.view.break_line());
                out.note(&requested.how_to_answer());
            } else if !out.json {
                out.note(&answer_elsewhere(requested.id.as_str(), requested.kind));
            }
        }
        if event.kind != EventType::TurnFinished.as_str() {
            return None;
        }
        Some(
            event
                .data
                .parse::<TurnFinishedData>()
                .map(|d| outcome_name(d.outcome))
                .unwrap_or("failed"),
        )
    }

    /// Events were missed: the turn's outcome when the snapshot has it ended, else its pending
    /// approvals replace the ones known.
    fn on_resync(&mut self, snapshot: &SessionGetResult) -> Option<&'static str> {
        self.out
            .note("pi-remote: reconnecting… (resumed from a snapshot; some output may be missing)");
        let turn_id = self.turn_id;
        let ended = snapshot
            .snapshot
            .turns
            .iter()
            .find(|t| t.turn_id == turn_id && t.state != TurnState::Running);
        if let Some(turn) = ended {
            return Some(match turn.state {
                TurnState::Completed => "completed",
                TurnState::Aborted => "aborted",
                TurnState::Failed | TurnState::Running => "failed",
            });
        }
        let pending: Vec<_> = snapshot
            .snapshot
            .pending_approvals
            .iter()
            .filter(|a| a.turn_id == turn_id)
            .collect();
        self.approvals.replace(&pending);
        None
    }
}

/// Stdin's lines when they are to be read, else a channel that never yields.
fn stdin_lines_if(read: bool) -> mpsc::UnboundedReceiver<Option<String>> {
    if read {
        stdin_lines()
    } else {
        mpsc::unbounded_channel().1
    }
}

/// How to answer an approval with another command (stdin is not a terminal).
fn answer_elsewhere(id: &str, kind: ApprovalKind) -> String {
    let approve = match kind {
        ApprovalKind::Confirm => format!("pi-remote approve {id}"),
        ApprovalKind::Select => format!("pi-remote approve {id} --value OPTION"),
        ApprovalKind::Input | ApprovalKind::Editor => {
            format!("pi-remote approve {id} --value TEXT")
        }
        ApprovalKind::Permission => {
            format!("pi-remote approve {id} [--value always]")
        }
    };
    let deny = match kind {
        ApprovalKind::Permission => format!("pi-remote deny {id} [--note WHY]"),
        _ => format!("pi-remote deny {id}"),
    };
    format!("answer with: {approve}   or   {deny}")
}

fn outcome_name(outcome: TurnOutcome) -> &'static str {
    match outcome {
        TurnOutcome::Completed => "completed",
        TurnOutcome::Aborted => "aborted",
        TurnOutcome::Failed => "failed",
    }
}

/// A fresh idempotency key for `turn/start`.
fn idempotency_key() -> Result<String, Failure> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Failure::local(format!("cannot draw a random key: {e}")))?;
    Ok(format!(
        "pi-remote-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// The turn `abort` and `steer` act on: the one given, else the session's running turn (`None`
/// when nothing runs).
async fn running_turn(
    client: &RacpClient,
    session_id: &str,
    turn: Option<String>,
) -> Result<Option<String>, Failure> {
    if turn.is_some() {
        return Ok(turn);
    }
    let got = call_resending::<calls::SessionGet>(
        client,
        SessionRef {
            session_id: session_id.to_string(),
        },
    )
    .await?;
    Ok(got.session.active_turn_id)
}

/// `abort`: ends the running turn as aborted. Nothing running is not an error (the host treats
/// aborting a finished turn the same way).
pub async fn abort(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    turn: Option<String>,
) -> Result<(), Failure> {
    let Some(turn_id) = running_turn(client, &session_id, turn).await? else {
        if out.json {
            out.json_value(&json!({"sessionId": session_id, "turnId": null}));
        } else {
            out.line(&format!("no turn is running in {session_id}"));
        }
        return Ok(());
    };
    let params = TurnRef {
        session_id: session_id.clone(),
        turn_id: turn_id.clone(),
    };
    call_resending::<calls::TurnAbort>(client, params).await?;
    if out.json {
        out.json_value(&json!({"sessionId": session_id, "turnId": turn_id, "aborted": true}));
    } else {
        out.line(&format!("aborted {turn_id}"));
    }
    Ok(())
}

/// `steer`: hands the running turn more guidance, which the agent reads at its next step.
/// Sent once: `turn/steer` is not safe to resend (a resent text would be read twice).
pub async fn steer(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    text: String,
    turn: Option<String>,
) -> Result<(), Failure> {
    let Some(turn_id) = running_turn(client, &session_id, turn).await? else {
        return Err(Failure::local(format!(
            "no turn is running in {session_id}, so there is nothing to steer; start one with: pi-remote prompt {session_id} TEXT"
        )));
    };
    let params = TurnSteerParams {
        session_id: session_id.clone(),
        turn_id: turn_id.clone(),
        text,
    };
    client.call::<calls::TurnSteer>(params).await?;
    if out.json {
        out.json_value(&json!({"sessionId": session_id, "turnId": turn_id, "steered": true}));
    } else {
        out.line(&format!("steered {turn_id}"));
    }
    Ok(())
}

/// `follow-up`: a prompt for after the running turn, as a turn of its own (at once when none
/// runs); resent with the same key after a lost connection, so it is queued once.
pub async fn follow_up(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    text: String,
    image_files: &[std::path::PathBuf],
) -> Result<(), Failure> {
    let images = image_files
        .iter()
        .map(|path| image_from_file(path))
        .collect::<Result<Vec<_>, _>>()?;
    let params = TurnFollowUpParams {
        session_id: session_id.clone(),
        idempotency_key: idempotency_key()?,
        text,
        images,
    };
    let result = call_resending::<calls::TurnFollowUp>(client, params).await?;
    if out.json {
        out.json_value(
            &json!({"sessionId": session_id, "turnId": result.turn_id, "queued": result.queued}),
        );
    } else if result.queued {
        out.line(&format!("{} queued", result.turn_id));
    } else {
        out.line(&result.turn_id);
    }
    Ok(())
}

/// `clear-queue`: withdraws the session's queued follow-ups (one with `--turn`) before they
/// run; prints each one's turn and text, so nothing typed is lost.
pub async fn clear_queue(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    turn_id: Option<String>,
) -> Result<(), Failure> {
    let params = SessionClearQueueParams {
        session_id: session_id.clone(),
        turn_id,
    };
    let result = call_resending::<calls::SessionClearQueue>(client, params).await?;
    if out.json {
        out.json_value(&json!({"sessionId": session_id, "withdrawn": result.withdrawn}));
        return Ok(());
    }
    if result.withdrawn.is_empty() {
        out.line("nothing queued");
    }
    for follow_up in result.withdrawn {
        out.line(&format!(
            "withdrew {}: {}",
            follow_up.turn_id, follow_up.text
        ));
    }
    Ok(())
}

/// `compact`: the agent summarises the session's conversation; prints the summary.
pub async fn compact(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    instructions: Option<String>,
) -> Result<(), Failure> {
    let params = SessionCompactParams {
        session_id,
        instructions,
    };
    let result = client.call::<calls::SessionCompact>(params).await?;
    if out.json {
        out.json_value(&result);
    } else {
        out.line(&format!(
            "compacted ({} tokens before)\n{}",
            result.tokens_before,
            printable(&result.summary, true)
        ));
    }
    Ok(())
}

/// `approve`: allow, or answer with `value` (select, input, editor).
pub async fn approve(
    out: &Out,
    client: &RacpClient,
    approval_id: String,
    value: Option<String>,
) -> Result<(), Failure> {
    let decision = match value {
        Some(value) => Decision::Answer(Answer { value, note: None }),
        None => Decision::Verdict(Verdict::Allow),
    };
    respond(out, client, approval_id, decision).await
}

/// `deny`.
pub async fn deny(
    out: &Out,
    client: &RacpClient,
    approval_id: String,
    note: Option<String>,
) -> Result<(), Failure> {
    let decision = match note {
        // A permission approval's refusal with a note for the model.
        Some(note) => Decision::Answer(Answer {
            value: "deny".into(),
            note: Some(note),
        }),
        None => Decision::Verdict(Verdict::Deny),
    };
    respond(out, client, approval_id, decision).await
}

async fn respond(
    out: &Out,
    client: &RacpClient,
    approval_id: String,
    decision: Decision,
) -> Result<(), Failure> {
    let result = call_resending::<calls::ApprovalRespond>(
        client,
        ApprovalRespondParams {
            approval_id,
            decision,
        },
    )
    .await?;
    if out.json {
        out.json_value(&result.approval);
    } else {
        out.line(&format!(
            "approval {} {}",
            result.approval.approval_id,
            enum_name(&result.approval.state)
        ));
    }
    Ok(())
}
