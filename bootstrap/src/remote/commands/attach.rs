//! `pi-remote attach`: follow a session live and answer its approvals from stdin (the behaviour
//! is described in [`crate::remote`]).

use super::{call_resending, client_stopped};
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use crate::remote::view::{self, View};
use racp_proto::ErrorCode;
use racp_proto::calls;
use racp_proto::client::{ClientState, RacpClient, Subscription, SubscriptionItem};
use racp_proto::events::{ApprovalSettledData, Event};
use racp_proto::methods::session::{SessionGetResult, SessionRef, SessionSubscribeParams};
use racp_proto::methods::turn::{
    Answer, ApprovalInfo, ApprovalKind, ApprovalRespondParams, Decision, Verdict,
};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::time::Duration;
use tokio::sync::mpsc;

/// An approval `attach` knows to be pending.
struct WaitingApproval {
    id: String,
    kind: ApprovalKind,
    options: Vec<String>,
    /// We sent an answer and wait for `approval.settled`.
    answered: bool,
}

impl WaitingApproval {
    /// One from a snapshot's `pendingApprovals`.
    fn listed(approval: &ApprovalInfo, answered: bool) -> WaitingApproval {
        WaitingApproval {
            id: approval.approval_id.clone(),
            kind: approval.kind,
            options: approval.options.clone().unwrap_or_default(),
            answered,
        }
    }

    /// One from an `approval.requested` event's data.
    fn requested(data: &Value) -> Option<WaitingApproval> {
        let id = data["approvalId"].as_str()?;
        let kind = serde_json::from_value::<ApprovalKind>(data["kind"].clone()).ok()?;
        let options = data["options"]
            .as_array()
            .map(|o| {
                o.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Some(WaitingApproval {
            id: id.into(),
            kind,
            options,
            answered: false,
        })
    }

    /// Reads a typed answer.
    fn decision(&self, line: &str) -> Result<Decision, String> {
        match self.kind {
            ApprovalKind::Confirm => match line.to_ascii_lowercase().as_str() {
                "y" | "yes" | "allow" => Ok(Decision::Verdict(Verdict::Allow)),
                "n" | "no" | "deny" => Ok(Decision::Verdict(Verdict::Deny)),
                _ => Err(format!("approval {}: answer y or n", self.id)),
            },
            ApprovalKind::Select => {
                if self.options.iter().any(|o| o == line) {
                    return Ok(Decision::Answer(Answer { value: line.into() }));
                }
                match line.parse::<usize>() {
                    Ok(n) if n >= 1 && n <= self.options.len() => Ok(Decision::Answer(Answer {
                        value: self.options[n - 1].clone(),
                    })),
                    _ => Err(format!(
                        "approval {}: answer with one of: {} (or its number)",
                        self.id,
                        self.options.join(", ")
                    )),
                }
            }
            ApprovalKind::Input | ApprovalKind::Editor => {
                Ok(Decision::Answer(Answer { value: line.into() }))
            }
        }
    }
}

/// Follows the session until it closes, or until stdin has ended, every typed line is used and
/// no approval it knows is pending.
pub async fn attach(out: &Out, client: RacpClient, session_id: String) -> Result<(), Failure> {
    let (mut attached, mut sub) = Attached::start(out, client, session_id).await?;
    let mut lines = stdin_lines();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        attached.answer_typed().await?;
        if attached.is_finished() {
            break;
        }
        let flow = tokio::select! {
            item = sub.items.recv() => attached.on_item(item)?,
            line = lines.recv(), if attached.stdin_open => {
                attached.on_line(line);
                ControlFlow::Continue(())
            }
            _ = tick.tick() => {
                attached.on_tick()?;
                ControlFlow::Continue(())
            }
        };
        if flow.is_break() {
            break;
        }
    }
    out.text(&attached.view.break_line());
    Ok(())
}

/// An attached session: what is shown, what waits for an answer, what was typed.
struct Attached<'a> {
    out: &'a Out,
    client: RacpClient,
    view: View,
    /// Oldest first: typed lines answer the first one not yet answered.
    approvals: Vec<WaitingApproval>,
    typed: VecDeque<String>,
    stdin_open: bool,
    /// Stdin is a terminal (not piped input).
    interactive: bool,
    was_connected: bool,
}

impl<'a> Attached<'a> {
    /// Reads the snapshot, subscribes from its cursor and prints the header.
    async fn start(
        out: &'a Out,
        client: RacpClient,
        session_id: String,
    ) -> Result<(Attached<'a>, Subscription), Failure> {
        let got = call_resending::<calls::SessionGet>(
            &client,
            SessionRef {
                session_id: session_id.clone(),
            },
        )
        .await?;
        let approvals = got
            .snapshot
            .pending_approvals
            .iter()
            .map(|a| WaitingApproval::listed(a, false))
            .collect();
        let sub = client
            .subscribe(SessionSubscribeParams {
                session_id,
                cursor: Some(got.cursor),
            })
            .await?;
        let mut view = View::default();
        print_attached(out, &mut view, &got);
        let attached = Attached {
            out,
            client,
            view,
            approvals,
            typed: VecDeque::new(),
            stdin_open: true,
            interactive: std::io::stdin().is_terminal(),
            was_connected: true,
        };
        Ok((attached, sub))
    }

    fn is_finished(&self) -> bool {
        !self.stdin_open && self.typed.is_empty() && self.approvals.is_empty()
    }

    /// Answers waiting approvals, oldest first, with what was typed.
    async fn answer_typed(&mut self) -> Result<(), Failure> {
        while let Some(index) = self.approvals.iter().position(|p| !p.answered) {
            let Some(line) = self.typed.pop_front() else {
                break;
            };
            let decision = match self.approvals[index].decision(&line) {
                Ok(decision) => decision,
                Err(message) => {
                    self.out.note(&message);
                    continue;
                }
            };
            let id = self.approvals[index].id.clone();
            let answer = call_resending::<calls::ApprovalRespond>(
                &self.client,
                ApprovalRespondParams {
                    approval_id: id.clone(),
                    decision,
                },
            )
            .await;
            let error = match answer {
                Ok(_) => {
                    self.approvals[index].answered = true;
                    continue;
                }
                Err(error) => error,
            };
            self.out.note(&format!(
                "pi-remote: approval {id}: {}: {}",
                error.code(),
                error.message()
            ));
            if error.code() == ErrorCode::RemoteAuthFailed {
                return Err(error.into());
            }
            // Settled elsewhere, expired, or not ours to answer: stop waiting on it.
            self.approvals.retain(|p| p.id != id);
        }
        Ok(())
    }

    fn on_item(&mut self, item: Option<SubscriptionItem>) -> Result<ControlFlow<()>, Failure> {
        let Some(item) = item else {
            return Err(client_stopped().into());
        };
        match item {
            SubscriptionItem::Event(event) => Ok(self.on_event(&event)),
            SubscriptionItem::Resynced(snapshot) => {
                self.on_resync(&snapshot);
                Ok(ControlFlow::Continue(()))
            }
            SubscriptionItem::Ended => Ok(ControlFlow::Break(())),
            SubscriptionItem::Failed(error) => Err(error.into()),
        }
    }

    fn on_event(&mut self, event: &Event) -> ControlFlow<()> {
        self.out.event(&mut self.view, event);
        match event.kind.as_str() {
            "approval.requested" => {
                if let Ok(data) = event.data.to_value()
                    && let Some(approval) = WaitingApproval::requested(&data)
                {
                    self.approvals.push(approval);
                }
            }
            "approval.settled" => {
                if let Ok(settled) = event.data.parse::<ApprovalSettledData>() {
                    self.approvals.retain(|p| p.id != settled.approval_id);
                }
            }
            "session.closed" => return ControlFlow::Break(()),
            _ => {}
        }
        ControlFlow::Continue(())
    }

    /// Events were missed: the snapshot's pending approvals replace the ones known (those
    /// answered stay answered).
    fn on_resync(&mut self, snapshot: &SessionGetResult) {
        let out = self.out;
        out.note("pi-remote: reconnecting… (resumed from a snapshot; some output may be missing)");
        let pending = &snapshot.snapshot.pending_approvals;
        if out.json {
            out.json_value(&json!({
                "type": "client.resynced",
                "cursor": snapshot.cursor,
                "pendingApprovals": pending,
            }));
        }
        let answered: Vec<String> = self
            .approvals
            .iter()
            .filter(|p| p.answered)
            .map(|p| p.id.clone())
            .collect();
        self.approvals = pending
            .iter()
            .map(|a| WaitingApproval::listed(a, answered.contains(&a.approval_id)))
            .collect();
        if !out.json {
            for approval in pending {
                out.text(&self.view.note(&view::describe_pending(approval)));
            }
        }
    }

    /// A line of stdin (`Some(None)` or `None`: stdin ended).
    fn on_line(&mut self, line: Option<Option<String>>) {
        let Some(Some(line)) = line else {
            self.stdin_open = false;
            return;
        };
        let line = line.trim().to_string();
        // Piped input is kept until an approval needs it; at a terminal, a line typed while
        // nothing waits is dropped with a note.
        let waiting = self.approvals.iter().any(|p| !p.answered);
        if self.interactive && !line.is_empty() && !waiting {
            self.out
                .note("pi-remote: no approval is waiting for an answer");
        } else if !line.is_empty() {
            self.typed.push_back(line);
        }
    }

    /// Notes when the link drops and when it is back; a stopped client ends `attach`.
    fn on_tick(&mut self) -> Result<(), Failure> {
        match self.client.state() {
            ClientState::Connected => {
                if !self.was_connected {
                    self.out.note("pi-remote: reconnected");
                    self.was_connected = true;
                }
            }
            ClientState::Connecting => {
                if self.was_connected {
                    self.out.text(&self.view.break_line());
                    self.out.note("pi-remote: reconnecting…");
                    self.was_connected = false;
                }
            }
            ClientState::Stopped(error) => return Err(error.into()),
        }
        Ok(())
    }
}

/// The first lines: `client.attached` with `--json`, else the session and its pending approvals.
fn print_attached(out: &Out, view: &mut View, got: &SessionGetResult) {
    if out.json {
        out.json_value(&json!({
            "type": "client.attached",
            "session": got.session,
            "cursor": got.cursor,
            "pendingApprovals": got.snapshot.pending_approvals,
        }));
        return;
    }
    out.line(&format!(
        "attached to {} ({}, {}){}",
        got.session.session_id,
        got.session.workspace,
        enum_name(&got.session.state),
        got.session
            .title
            .as_deref()
            .map(|t| format!(": {t}"))
            .unwrap_or_default()
    ));
    for approval in &got.snapshot.pending_approvals {
        out.text(&view.note(&view::describe_pending(approval)));
    }
}

/// Reads stdin lines on a thread; `None` marks end of input.
fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    let text = line.trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(Some(text)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}
