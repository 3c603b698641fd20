//! A session's snapshot state, and the one function that changes it: [`View::apply`], called
//! with each event as it is published and, after a restart, with each stored event of the
//! retained log (then [`View::reconcile`] lets the store correct what the log cannot know).

use super::HostEvent;
use crate::store::SessionRow;
use racp_proto::ErrorCode;
use racp_proto::events::{HostEventData, TurnFinishedData, TurnStartedData};
use racp_proto::methods::session::{Queue, QueuedFollowUp, SessionSettings};
use racp_proto::methods::turn::{ApprovalInfo, TurnInfo, TurnState};
use racp_proto::permission::PermissionGrant;
use racp_proto::pi::Kind;
use racp_proto::pi::stream::StreamState;

/// How many finished turns a snapshot shows.
const SNAPSHOT_TURNS: usize = 50;
/// Most stream events held unapplied before they are applied anyway.
const MAX_UNAPPLIED: usize = 4096;

/// What a snapshot shows of a session, as of the last published event.
#[derive(Debug, Default, PartialEq)]
pub(super) struct View {
    pub turns: Vec<TurnInfo>,
    pub active_turn: Option<String>,
    pub pending_approvals: Vec<ApprovalInfo>,
    /// The permission grants given with "always" (`permission.decided` adds one,
    /// `session.configured` with `grantsCleared` withdraws them; the store wins at a restart).
    pub grants: Vec<PermissionGrant>,
    /// True once `session.closed` is published.
    pub closed: bool,
    /// What a client set it to run with (stored in its row; `session.configured` changes it).
    pub settings: SessionSettings,
    /// Its title (stored in its row; `session.renamed` changes it).
    pub title: Option<String>,
    /// The steering messages as the agent's last `queue_update` said (emptied when the agent
    /// process goes, since pi holds them in memory) and the follow-ups the host holds
    /// (`turn.queued` until `turn.started` or `turn.withdrawn`).
    pub queue: Queue,
    /// The message and tool outputs streaming, up to the events in `unapplied`.
    stream: StreamState,
    /// Stream events not applied yet, in order. Applying each as it is published would read
    /// every delta again right after the compactor wrote it, on the host's hottest path, and
    /// most are never needed: once a message ends, nothing it streamed is in progress. So they
    /// wait until a snapshot reads the stream ([`View::stream`]), and a message that starts and
    /// ends among them is dropped whole.
    unapplied: Vec<(Kind, Box<str>)>,
}

impl View {
    /// A new session's view: nothing happened yet.
    pub fn of_new(row: &SessionRow) -> View {
        View {
            closed: row.closed,
            settings: row.settings.clone(),
            title: row.title.clone(),
            ..View::default()
        }
    }

    /// What `event`, recorded at `at`, does to the snapshot: one arm per row of the host event
    /// table, matched exhaustively so a new event asks its effect.
    pub fn apply(&mut self, session_id: &str, event: HostEvent, at: u64) {
        let (body, turn_id) = match event {
            HostEvent::Host { body, turn_id } => (body, turn_id),
            HostEvent::Agent { kind, payload, .. } => return self.apply_agent(kind, payload),
        };
        match body {
            HostEventData::TurnStarted(data) => {
                if let Some(turn_id) = turn_id {
                    self.start_turn(turn_id, data, at);
                }
            }
            HostEventData::TurnFinished(data) => self.finish_turn(turn_id, data, at),
            HostEventData::ApprovalRequested(data) => self
                .pending_approvals
                .push(data.into_pending(session_id.to_string())),
            HostEventData::ApprovalSettled(data) => self
                .pending_approvals
                .retain(|a| a.approval_id != data.approval_id),
            HostEventData::TurnQueued(data) => {
                let Some(turn_id) = turn_id else { return };
                self.queue.follow_ups.push(QueuedFollowUp {
                    turn_id,
                    text: data.text,
                    images: data.images,
                    device_id: data.device_id,
                    device_name: data.device_name,
                });
            }
            HostEventData::TurnWithdrawn(_) => {
                let Some(turn_id) = turn_id else { return };
                self.queue.follow_ups.retain(|f| f.turn_id != turn_id);
            }
            HostEventData::SessionClosed(_) => {
                self.closed = true;
                self.queue = Queue::default();
            }
            HostEventData::SessionConfigured(data) => {
                self.settings = data.settings;
                if data.grants_cleared {
                    self.grants.clear();
                }
            }
            HostEventData::PermissionDecided(data) => {
                if let Some(grant) = data.grant
                    && !self.grants.contains(&grant)
                {
                    self.grants.push(*grant);
                }
            }
            HostEventData::SessionRenamed(data) => self.title = Some(data.title),
            HostEventData::AgentStopped(_) => self.queue.steering.clear(),
            // A shell command's message is in the history, not in the snapshot's state.
            HostEventData::SessionBash(_) => {}
            // Where the session came from; the conversation it starts with follows as history
            // entries, which change no snapshot state.
            HostEventData::SessionForked(_) => {}
            // What changed on disk is the desktop's to show; a snapshot holds no file tree
            // (a client reads it with `fs/list` and follows these events from the cursor).
            HostEventData::WorkspaceChanged(_) => {}
        }
    }

    /// A relayed agent event: pi's steering queue, or what is streaming.
    fn apply_agent(&mut self, kind: Kind, payload: Box<serde_json::value::RawValue>) {
        if kind == Kind::QueueUpdate {
            self.queue.steering =
                racp_proto::pi::event::steering_queue(payload.get()).unwrap_or_default();
            return;
        }
        // Only some agent events change what is streaming (docs/protocol.md §8.1).
        if kind.streams() {
            self.defer(kind, payload.into());
        }
    }

    fn start_turn(&mut self, turn_id: String, data: TurnStartedData, at: u64) {
        self.queue.follow_ups.retain(|f| f.turn_id != turn_id);
        self.active_turn = Some(turn_id.clone());
        self.turns.push(TurnInfo {
            turn_id,
            state: TurnState::Running,
            text: data.text,
            started_at: at,
            finished_at: None,
            error: None,
            files: Vec::new(),
        });
        if self.turns.len() > SNAPSHOT_TURNS {
            let excess = self.turns.len() - SNAPSHOT_TURNS;
            self.turns.drain(..excess);
        }
    }

    fn finish_turn(&mut self, turn_id: Option<String>, data: TurnFinishedData, at: u64) {
        // A turn that ended ends its streams, even one its agent died in.
        self.unapplied.clear();
        self.stream.clear();
        let agent_died = data.error.as_ref().is_some_and(|e| {
            matches!(
                e.code(),
                ErrorCode::AgentSidecarCrashed | ErrorCode::AgentSidecarOom
            )
        });
        if agent_died {
            self.queue.steering.clear();
        }
        let Some(turn_id) = turn_id else { return };
        if self.active_turn.as_deref() == Some(turn_id.as_str()) {
            self.active_turn = None;
        }
        if let Some(turn) = self.turns.iter_mut().find(|t| t.turn_id == turn_id) {
            turn.state = data.outcome.turn_state();
            turn.error = data.error;
            turn.finished_at = Some(at);
            turn.files = data.files;
        }
    }

    /// The message and tool outputs streaming as of the last event applied.
    pub fn stream(&mut self) -> &StreamState {
        for (kind, data) in self.unapplied.drain(..) {
            self.stream.apply_agent_text(&kind, &data);
        }
        &self.stream
    }

    fn defer(&mut self, kind: Kind, data: Box<str>) {
        let whole_message = kind == Kind::MessageEnd
            && self
                .unapplied
                .first()
                .is_some_and(|(first, _)| *first == Kind::MessageStart)
            && self
                .unapplied
                .iter()
                .all(|(k, _)| matches!(k, Kind::MessageStart | Kind::MessageUpdate));
        if whole_message {
            // Applied, these would leave no message streaming and the tools as they are.
            self.unapplied.clear();
            self.stream.apply_agent(&kind, &serde_json::Value::Null);
            return;
        }
        self.unapplied.push((kind, data));
        if self.unapplied.len() >= MAX_UNAPPLIED {
            self.stream();
        }
    }

    /// After a restart, once the retained log is applied: where the log and the store disagree,
    /// the store wins, but for `closed`. The store is written before an event is committed
    /// (settings, an approval's answer), so a host stopped in between left the log behind it;
    /// and the log's tail may no longer hold an approval's request. A session's row is marked
    /// closed only once its `session.closed` is committed: a committed close is never undone,
    /// and a closed row always has its event (so no event can follow `session.closed`).
    /// `still_pending` are the approvals the store holds pending (the host cancels each of them
    /// before it serves: driver::end_interrupted_turns).
    pub fn reconcile(
        &mut self,
        row: &SessionRow,
        still_pending: &[ApprovalInfo],
        grants: Vec<PermissionGrant>,
    ) {
        self.closed |= row.closed;
        // Grants are stored before their event is committed, and may outlive the log.
        self.grants = grants;
        // No agent runs after a restart: whatever pi held queued went with it. The host's
        // follow-ups are withdrawn with events (driver::end_interrupted_turns).
        self.queue.steering.clear();
        self.settings = row.settings.clone();
        // The title is stored before `session.renamed` is committed, and the event may have left
        // the retained log; one given at `session/create` has no event at all.
        self.title = row.title.clone();
        self.pending_approvals.retain(|shown| {
            still_pending
                .iter()
                .any(|stored| stored.approval_id == shown.approval_id)
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use racp_proto::events::{
        AgentStopReason, AgentStoppedData, ApprovalRequestedData, ApprovalSettledData, Event,
        SessionClosedData, SessionConfiguredData, TurnFinishedData, TurnOutcome, TurnQueuedData,
        TurnStartedData, TurnWithdrawnData, WithdrawReason,
    };
    use racp_proto::methods::turn::{ApprovalKind, ApprovalState};
    use racp_proto::{Cursor, Epoch};

    fn approval(approval_id: &str) -> ApprovalRequestedData {
        ApprovalRequestedData {
            approval_id: approval_id.into(),
            turn_id: "turn_1".into(),
            kind: ApprovalKind::Confirm,
            title: "run it?".into(),
            message: None,
            options: None,
            deadline: 99,
            permission: None,
        }
    }

    fn agent(kind: &str, payload: &str) -> HostEvent {
        HostEvent::Agent {
            kind: racp_proto::pi::Kind::from_wire(kind),
            turn_id: Some("turn_2".into()),
            payload: serde_json::value::RawValue::from_string(payload.into()).unwrap(),
        }
    }

    /// A session's life in events: every host event type, and a reply streaming when it ends.
    fn life() -> Vec<HostEvent> {
        let started = |text: &str| TurnStartedData {
            text: text.into(),
            images: Vec::new(),
            device_id: None,
            device_name: None,
        };
        vec![
            HostEvent::of_turn("turn_1", started("first")),
            HostEvent::of_turn("turn_1", approval("apr_1")),
            HostEvent::of_turn(
                "turn_1",
                ApprovalSettledData {
                    approval_id: "apr_1".into(),
                    outcome: ApprovalState::Allowed,
                    device_id: Some("dev_1".into()),
                    device_name: Some("laptop".into()),
                    value: None,
                },
            ),
            HostEvent::of_turn("turn_1", approval("apr_2")),
            HostEvent::of_session(SessionConfiguredData {
                settings: SessionSettings {
                    auto_compaction: Some(false),
                    ..SessionSettings::default()
                },
                device_id: None,
                device_name: None,
                grants_cleared: false,
            }),
            HostEvent::of_turn(
                "turn_1",
                TurnFinishedData {
                    outcome: TurnOutcome::Failed,
                    error: None,
                    files: Vec::new(),
                },
            ),
            HostEvent::of_turn("turn_2", started("second")),
            agent(
                "queue_update",
                r#"{"type":"queue_update","steering":["s"],"followUp":["then"]}"#,
            ),
            agent(
                "message_start",
                r#"{"type":"message_start","message":{"role":"assistant","content":[],"timestamp":1}}"#,
            ),
            agent(
                "message_update",
                r#"{"type":"message_update","message":{"role":"assistant","timestamp":1},"assistantMessageEvent":{"type":"text_start","contentIndex":0,"block":{"type":"text"}}}"#,
            ),
            agent(
                "message_update",
                r#"{"type":"message_update","message":{"role":"assistant","timestamp":1},"assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"hi"}}"#,
            ),
            HostEvent::of_session(AgentStoppedData {
                reason: AgentStopReason::Idle,
                idle_ms: 5,
            }),
            HostEvent::of_session(SessionClosedData {
                device_id: None,
                device_name: None,
            }),
        ]
    }

    #[test]
    fn a_restart_rebuilds_the_view_that_publishing_built() {
        let mut published = View::default();
        let mut restored = View::default();
        let epoch = Epoch(7);
        for (i, (live, stored)) in life().into_iter().zip(life()).enumerate() {
            let (seq, at) = (i as u64 + 1, 1000 + i as u64);
            published.apply("ses_1", live, at);
            let mut json = Vec::new();
            super::super::encode(&stored, seq, Cursor::new(epoch, seq), at, &mut json).unwrap();
            let event: Event = serde_json::from_slice(&json).unwrap();
            let stored = HostEvent::from_stored(event).expect("a known event");
            restored.apply("ses_1", stored, at);
        }
        assert_eq!(restored, published);

        let turns: Vec<_> = published
            .turns
            .iter()
            .map(|t| (t.state, t.started_at))
            .collect();
        assert_eq!(
            turns,
            [(TurnState::Failed, 1000), (TurnState::Running, 1006)]
        );
        assert_eq!(published.turns[0].finished_at, Some(1005));
        assert_eq!(published.active_turn.as_deref(), Some("turn_2"));
        let pending: Vec<_> = published
            .pending_approvals
            .iter()
            .map(|a| a.approval_id.as_str())
            .collect();
        assert_eq!(pending, ["apr_2"]);
        assert_eq!(published.pending_approvals[0].session_id, "ses_1");
        assert_eq!(published.settings.auto_compaction, Some(false));
        // The agent's queue went with the session's close.
        assert!(published.queue.is_empty());
        assert!(published.closed);
        assert_eq!(
            published.stream().message().unwrap()["content"][0]["text"],
            "hi"
        );
    }

    /// Deferring stream events changes nothing a snapshot reads: a whole message dropped, a
    /// message in progress and a tool's output applied when read, as if applied one by one.
    #[test]
    fn deferred_stream_events_give_the_stream_applied_one_by_one() {
        let start =
            r#"{"type":"message_start","message":{"role":"assistant","content":[],"timestamp":1}}"#;
        let text_start = r#"{"type":"message_update","message":{"role":"assistant","timestamp":1},"assistantMessageEvent":{"type":"text_start","contentIndex":0,"block":{"type":"text"}}}"#;
        let delta = |d: &str| {
            format!(
                r#"{{"type":"message_update","message":{{"role":"assistant","timestamp":1}},"assistantMessageEvent":{{"type":"text_delta","contentIndex":0,"delta":"{d}"}}}}"#
            )
        };
        let end = r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"ab"}],"timestamp":1}}"#;
        let tool = r#"{"type":"tool_execution_update","toolCallId":"call_1","toolName":"bash","partialResult":{"content":[{"type":"text","text":"out\n"}]}}"#;
        let events: Vec<(&str, String)> = vec![
            ("message_start", start.into()),
            ("message_update", text_start.into()),
            ("message_update", delta("a")),
            ("message_update", delta("b")),
            ("message_end", end.into()),
            ("tool_execution_update", tool.into()),
            ("message_start", start.into()),
            ("message_update", text_start.into()),
            ("message_update", delta("c")),
        ];
        let mut eager = StreamState::default();
        let mut view = View::default();
        for (i, (kind, payload)) in events.iter().enumerate() {
            eager.apply_agent_text(&Kind::from_wire(kind), payload);
            view.apply("ses_1", agent(kind, payload), i as u64);
            if i == 4 {
                assert!(view.unapplied.is_empty(), "a whole message is dropped");
                assert_eq!(view.stream().message(), None);
            }
        }
        let deferred = view.stream();
        assert_eq!(deferred.message(), eager.message());
        assert_eq!(deferred.tool_outputs(), eager.tool_outputs());
        assert_eq!(deferred.message().unwrap()["content"][0]["text"], "c");
        assert!(deferred.tool_outputs().contains_key("call_1"));
    }

    /// The steering messages are what pi said last and go with the agent process (at its stop,
    /// at a restart); the follow-ups are the host's, from `turn.queued` until `turn.started` or
    /// `turn.withdrawn`, whatever pi says.
    #[test]
    fn the_queue_holds_pis_steering_and_the_hosts_follow_ups() {
        let mut view = View::default();
        let update = r#"{"type":"queue_update","steering":["s"],"followUp":["pi's own"]}"#;
        view.apply("ses_1", agent("queue_update", update), 1);
        assert_eq!(view.queue.steering, ["s"]);
        assert!(
            view.queue.follow_ups.is_empty(),
            "pi's follow-ups are not the host's"
        );
        for (at, (turn_id, text)) in [("turn_2", "a"), ("turn_3", "b"), ("turn_4", "c")]
            .into_iter()
            .enumerate()
        {
            let queued = TurnQueuedData {
                text: text.into(),
                images: Vec::new(),
                device_id: Some("dev_1".into()),
                device_name: Some("laptop".into()),
            };
            view.apply("ses_1", HostEvent::of_turn(turn_id, queued), 2 + at as u64);
        }
        let ids = |view: &View| -> Vec<String> {
            view.queue
                .follow_ups
                .iter()
                .map(|f| f.turn_id.clone())
                .collect()
        };
        assert_eq!(ids(&view), ["turn_2", "turn_3", "turn_4"]);
        assert_eq!(view.queue.follow_ups[0].device_id.as_deref(), Some("dev_1"));
        assert_eq!(
            view.queue.follow_ups[0].device_name.as_deref(),
            Some("laptop")
        );
        view.apply(
            "ses_1",
            HostEvent::of_session(AgentStoppedData {
                reason: AgentStopReason::Idle,
                idle_ms: 5,
            }),
            5,
        );
        assert!(view.queue.steering.is_empty());
        let started = TurnStartedData {
            text: "a".into(),
            images: Vec::new(),
            device_id: None,
            device_name: None,
        };
        view.apply("ses_1", HostEvent::of_turn("turn_2", started), 6);
        let withdrawn = TurnWithdrawnData {
            text: "c".into(),
            reason: WithdrawReason::Cleared,
            joined_turn_id: None,
            device_id: None,
            device_name: None,
        };
        view.apply("ses_1", HostEvent::of_turn("turn_4", withdrawn), 7);
        assert_eq!(ids(&view), ["turn_3"]);
        view.apply("ses_1", agent("queue_update", update), 8);
        let row = SessionRow {
            session_id: "ses_1".into(),
            workspace: "/w".into(),
            title: None,
            epoch: 7,
            created_at: 1,
            closed: false,
            settings: SessionSettings::default(),
        };
        view.reconcile(&row, &[], Vec::new());
        assert!(view.queue.steering.is_empty());
        assert_eq!(
            ids(&view),
            ["turn_3"],
            "withdrawn by events, not by the restart"
        );
    }

    #[test]
    fn at_a_restart_the_store_wins() {
        let mut view = View::default();
        for (i, event) in life().into_iter().enumerate() {
            view.apply("ses_1", event, i as u64);
        }
        let row = SessionRow {
            session_id: "ses_1".into(),
            workspace: "/w".into(),
            title: None,
            epoch: 7,
            created_at: 1,
            closed: false,
            settings: SessionSettings::default(),
        };
        // The store holds apr_2 answered and apr_3 pending (its request pruned from the log).
        let still_pending = [approval("apr_3").into_pending("ses_1".into())];
        view.reconcile(&row, &still_pending, Vec::new());
        assert!(
            view.closed,
            "a committed session.closed is not undone by its row"
        );
        assert_eq!(view.settings, SessionSettings::default());
        assert!(view.pending_approvals.is_empty());
        assert_eq!(view.turns.len(), 2);
    }
}
