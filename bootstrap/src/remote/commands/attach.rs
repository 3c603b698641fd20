//! `pi-remote attach`: follow a session live and answer its approvals from stdin (the behaviour
//! is described in [`crate::remote`]).
//!
//! The conversation so far comes first, from the snapshot's history (its most recent entries,
//! with how to see the rest); the subscription starts at the snapshot's cursor, where that
//! history ends, so no message is shown twice. After a resync, the snapshot's entries past the
//! last event shown are the messages missed meanwhile.

use super::approvals::{Approvals, stdin_lines};
use super::history::{DROPPED_NOTE, print_entries};
use super::{call_resending, client_stopped};
use crate::remote::Failure;
use crate::remote::out::{Out, enum_name};
use crate::remote::view::{self, View};
use racp_proto::client::{ClientState, RacpClient, Subscription, SubscriptionItem};
use racp_proto::events::{Event, EventType};
use racp_proto::methods::session::{
    HistoryPage, SessionGetResult, SessionRef, SessionSubscribeParams,
};
use racp_proto::validate::printable;
use racp_proto::{Cursor, calls};
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
    /// The position of the last event shown, live or from a history: a resync's history shows
    /// only what comes after it.
    last_seen: Cursor,
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
            last_seen: got.cursor,
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
        self.last_seen = event.cursor;
        self.out.event(&mut self.view, event);
        self.approvals.on_event(event);
        if event.kind == EventType::SessionClosed.as_str() {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Events were missed: the snapshot's history shows the messages among them, and its
    /// pending approvals replace the ones known (those answered stay answered).
    fn on_resync(&mut self, snapshot: &SessionGetResult) {
        let out = self.out;
        out.note("pi-remote: reconnecting… (resumed from a snapshot; some output may be missing)");
        let missed = missed_history(&snapshot.snapshot.history, self.last_seen);
        self.last_seen = snapshot.cursor;
        let pending = &snapshot.snapshot.pending_approvals;
        if out.json {
            out.json_value(&json!({
                "type": "client.resynced",
                "cursor": snapshot.cursor,
                "pendingApprovals": pending,
                "history": missed,
            }));
        }
        self.approvals.replace(&pending.iter().collect::<Vec<_>>());
        if !out.json {
            out.text(&self.view.break_line());
            if missed.earlier.is_some() {
                let session = &snapshot.session.session_id;
                out.line(&format!(
                    "(more messages were missed: `pi-remote history {}` shows them)",
                    printable(session, false)
                ));
            }
            print_entries(out, &mut self.view, &missed.entries);
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

/// The entries of a resync's history after `last_seen`: the messages missed. `earlier` stays
/// only when missed ones may precede the page (its oldest entry is missed too).
fn missed_history(page: &HistoryPage, last_seen: Cursor) -> HistoryPage {
    // Sequence numbers order events within an epoch; a new epoch's are all new.
    let is_missed = |e: &Event| e.cursor.epoch != last_seen.epoch || e.cursor.seq > last_seen.seq;
    let entries: Vec<Event> = page
        .entries
        .iter()
        .filter(|e| is_missed(e))
        .cloned()
        .collect();
    let all_missed = entries.len() == page.entries.len();
    HistoryPage {
        earlier: page.earlier.filter(|_| all_missed),
        truncated: page.truncated && all_missed,
        entries,
    }
}

/// The first lines: `client.attached` with `--json` (with the snapshot's `history` and
/// `queue`), else the session, the conversation's most recent messages, the pending approvals
/// and the follow-ups waiting.
fn print_attached(out: &Out, view: &mut View, got: &SessionGetResult) {
    if out.json {
        out.json_value(&json!({
            "type": "client.attached",
            "session": got.session,
            "cursor": got.cursor,
            "pendingApprovals": got.snapshot.pending_approvals,
            "queue": got.snapshot.queue,
            "history": got.snapshot.history,
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
    let history = &got.snapshot.history;
    if history.earlier.is_some() {
        out.line(&format!(
            "(earlier messages: `pi-remote history {}`)",
            printable(&got.session.session_id, false)
        ));
    } else if history.truncated {
        out.line(DROPPED_NOTE);
    }
    print_entries(out, view, &history.entries);
    for approval in &got.snapshot.pending_approvals {
        out.text(&view.note(&view::describe_pending(approval)));
    }
    for follow_up in &got.snapshot.queue.follow_ups {
        let text = printable(&follow_up.text, false);
        out.line(&format!("== queued {}: {text}", follow_up.turn_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use racp_proto::Epoch;

    fn entry(epoch: Epoch, seq: u64) -> Event {
        Event {
            seq,
            cursor: Cursor::new(epoch, seq),
            kind: "agent.message_end".into(),
            at: 0,
            turn_id: None,
            data: racp_proto::events::EventData::encode(&json!({"type": "message_end"})).unwrap(),
            elided: None,
        }
    }

    #[test]
    fn a_resync_shows_only_the_entries_after_the_last_event_shown() {
        let epoch = Epoch(0x0f3a_9c2e_11d0_4b7a);
        let page = HistoryPage {
            entries: vec![entry(epoch, 3), entry(epoch, 7), entry(epoch, 9)],
            earlier: Some(Cursor::new(epoch, 2)),
            truncated: false,
        };
        let missed = missed_history(&page, Cursor::new(epoch, 7));
        let seqs: Vec<u64> = missed.entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [9]);
        // The page reaches back to what was shown: nothing missed precedes it.
        assert_eq!(missed.earlier, None);

        // Everything on the page was missed: older entries may have been missed too.
        let missed = missed_history(&page, Cursor::new(epoch, 1));
        assert_eq!(missed.entries.len(), 3);
        assert_eq!(missed.earlier, page.earlier);

        // A new epoch: every entry is new.
        let other = Epoch(1);
        assert_eq!(
            missed_history(&page, Cursor::new(other, 100)).entries.len(),
            3
        );
    }
}
