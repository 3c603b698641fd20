//! `pi-remote attach`: follow a session live and answer its approvals from stdin (the behaviour
//! is described in [`crate::remote`]).

use super::approvals::{Approvals, stdin_lines};
use super::{call_resending, client_stopped};
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use crate::remote::view::{self, View};
use racp_proto::calls;
use racp_proto::client::{ClientState, RacpClient, Subscription, SubscriptionItem};
use racp_proto::events::{Event, EventType};
use racp_proto::methods::session::{SessionGetResult, SessionRef, SessionSubscribeParams};
use serde_json::json;
use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::time::Duration;

/// Follows the session until it closes, or until stdin has ended, every typed line is used and
/// no approval it knows is pending.
pub async fn attach(out: &Out, client: RacpClient, session_id: String) -> Result<(), Failure> {
    let (mut attached, mut sub) = Attached::start(out, client, session_id).await?;
    let mut lines = stdin_lines();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        attached
            .approvals
            .answer_typed(attached.out, &attached.client)
            .await?;
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
    approvals: Approvals,
    stdin_open: bool,
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
        let approvals = Approvals::new(
            &got.snapshot.pending_approvals,
            std::io::stdin().is_terminal(),
        );
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
            stdin_open: true,
            was_connected: true,
        };
        Ok((attached, sub))
    }

    fn is_finished(&self) -> bool {
        !self.stdin_open && self.approvals.is_idle()
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
        self.approvals.on_event(event);
        if event.kind == EventType::SessionClosed.as_str() {
            return ControlFlow::Break(());
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
        self.approvals.replace(&pending.iter().collect::<Vec<_>>());
        if !out.json {
            for approval in pending {
                out.text(&self.view.note(&view::describe_pending(approval)));
            }
        }
    }

    /// A line of stdin (`Some(None)` or `None`: stdin ended).
    fn on_line(&mut self, line: Option<Option<String>>) {
        match line {
            Some(Some(line)) => self.approvals.on_line(self.out, &line),
            _ => self.stdin_open = false,
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
