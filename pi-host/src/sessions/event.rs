//! The events the host appends to a session's log. Each variant decides its wire type, its
//! `data` and its effect on the session's snapshot together, so adding an event is one change
//! here (docs/protocol.md §8).

use racp_proto::AppError;
use racp_proto::events::{
    AgentStopReason, AgentStoppedData, ApprovalRequestedData, ApprovalSettledData, EventType,
    SessionClosedData, SessionConfiguredData, TurnFinishedData, TurnOutcome, TurnStartedData,
};
use racp_proto::methods::session::SessionSettings;
use racp_proto::methods::turn::{ApprovalInfo, TurnInfo, TurnState};
use racp_proto::pi::Kind;
use serde_json::value::{RawValue, to_raw_value};
use std::borrow::Cow;

/// An event before it has a seq.
#[derive(Debug)]
pub enum HostEvent {
    TurnStarted {
        turn: TurnInfo,
        device_id: Option<String>,
    },
    TurnFinished {
        turn_id: String,
        outcome: TurnOutcome,
        error: Option<AppError>,
    },
    ApprovalRequested(ApprovalInfo),
    /// The approval as it was settled (`state`, `settled_by`, `value`).
    ApprovalSettled(ApprovalInfo),
    SessionClosed {
        device_id: Option<String>,
    },
    /// The host stopped the session's idle agent.
    AgentStopped {
        reason: AgentStopReason,
        idle_ms: u64,
    },
    /// A client changed what the session runs with; `settings` is the whole new set.
    Configured {
        settings: SessionSettings,
        device_id: Option<String>,
    },
    /// Agent output relayed as `agent.<kind>`, its payload exactly as the agent wrote it.
    Agent {
        kind: Kind,
        turn_id: Option<String>,
        payload: Box<RawValue>,
    },
}

/// An event's wire `type`, written without building a string: `agent.` and the agent's kind
/// are written one after the other, once per event on the hot path.
#[derive(Debug, Clone, Copy)]
pub struct EventTypeName<'a> {
    prefix: &'static str,
    name: &'a str,
}

impl std::fmt::Display for EventTypeName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.prefix)?;
        f.write_str(self.name)
    }
}

impl serde::Serialize for EventTypeName<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// How an event changes the session's snapshot, applied when it is published.
#[derive(Debug, Clone)]
pub enum Effect {
    TurnStarted(TurnInfo),
    TurnFinished {
        turn_id: String,
        state: TurnState,
        error: Option<AppError>,
        at: u64,
    },
    ApprovalRequested(ApprovalInfo),
    ApprovalSettled(String),
    Closed,
    Configured(SessionSettings),
    /// An agent event that changes what is streaming (docs/protocol.md §8.1), applied to the
    /// snapshot's message and tool outputs when published.
    Stream {
        kind: Kind,
        payload: Box<RawValue>,
    },
}

/// The snapshot state of a turn that ended with `outcome`.
pub fn turn_state(outcome: TurnOutcome) -> TurnState {
    match outcome {
        TurnOutcome::Completed => TurnState::Completed,
        TurnOutcome::Aborted => TurnState::Aborted,
        TurnOutcome::Failed => TurnState::Failed,
    }
}

impl HostEvent {
    /// The wire `type`.
    pub fn kind(&self) -> EventTypeName<'_> {
        let host = |t: EventType| EventTypeName {
            prefix: "",
            name: t.as_str(),
        };
        match self {
            HostEvent::TurnStarted { .. } => host(EventType::TurnStarted),
            HostEvent::TurnFinished { .. } => host(EventType::TurnFinished),
            HostEvent::ApprovalRequested(_) => host(EventType::ApprovalRequested),
            HostEvent::ApprovalSettled(_) => host(EventType::ApprovalSettled),
            HostEvent::SessionClosed { .. } => host(EventType::SessionClosed),
            HostEvent::AgentStopped { .. } => host(EventType::AgentStopped),
            HostEvent::Configured { .. } => host(EventType::SessionConfigured),
            HostEvent::Agent { kind, .. } => EventTypeName {
                prefix: EventType::AGENT_PREFIX,
                name: kind.as_str(),
            },
        }
    }

    pub fn turn_id(&self) -> Option<&str> {
        match self {
            HostEvent::TurnStarted { turn, .. } => Some(&turn.turn_id),
            HostEvent::TurnFinished { turn_id, .. } => Some(turn_id),
            HostEvent::ApprovalRequested(info) | HostEvent::ApprovalSettled(info) => {
                Some(&info.turn_id)
            }
            HostEvent::SessionClosed { .. }
            | HostEvent::AgentStopped { .. }
            | HostEvent::Configured { .. } => None,
            HostEvent::Agent { turn_id, .. } => turn_id.as_deref(),
        }
    }

    /// True for the event after which the session takes no more.
    pub fn closes_session(&self) -> bool {
        matches!(self, HostEvent::SessionClosed { .. })
    }

    /// The `data` as JSON: the agent's payload as it came, or the host type's encoding.
    pub fn data(&self) -> serde_json::Result<Cow<'_, RawValue>> {
        let encoded = match self {
            HostEvent::Agent { payload, .. } => return Ok(Cow::Borrowed(&**payload)),
            HostEvent::TurnStarted { turn, device_id } => to_raw_value(&TurnStartedData {
                text: turn.text.clone(),
                device_id: device_id.clone(),
            }),
            HostEvent::TurnFinished { outcome, error, .. } => to_raw_value(&TurnFinishedData {
                outcome: *outcome,
                error: error.clone(),
            }),
            HostEvent::ApprovalRequested(info) => to_raw_value(&ApprovalRequestedData {
                approval_id: info.approval_id.clone(),
                turn_id: info.turn_id.clone(),
                kind: info.kind,
                title: info.title.clone(),
                message: info.message.clone(),
                options: info.options.clone(),
                deadline: info.deadline,
            }),
            HostEvent::ApprovalSettled(info) => to_raw_value(&ApprovalSettledData {
                approval_id: info.approval_id.clone(),
                outcome: info.state,
                device_id: info.settled_by.clone(),
                value: info.value.clone(),
            }),
            HostEvent::SessionClosed { device_id } => to_raw_value(&SessionClosedData {
                device_id: device_id.clone(),
            }),
            HostEvent::AgentStopped { reason, idle_ms } => to_raw_value(&AgentStoppedData {
                reason: *reason,
                idle_ms: *idle_ms,
            }),
            HostEvent::Configured {
                settings,
                device_id,
            } => to_raw_value(&SessionConfiguredData {
                settings: settings.clone(),
                device_id: device_id.clone(),
            }),
        };
        encoded.map(Cow::Owned)
    }

    /// What the event does to the snapshot once published; `at` is the event's time.
    pub fn into_effect(self, at: u64) -> Option<Effect> {
        match self {
            HostEvent::TurnStarted { turn, .. } => Some(Effect::TurnStarted(turn)),
            HostEvent::TurnFinished {
                turn_id,
                outcome,
                error,
            } => Some(Effect::TurnFinished {
                turn_id,
                state: turn_state(outcome),
                error,
                at,
            }),
            HostEvent::ApprovalRequested(info) => Some(Effect::ApprovalRequested(info)),
            HostEvent::ApprovalSettled(info) => Some(Effect::ApprovalSettled(info.approval_id)),
            HostEvent::SessionClosed { .. } => Some(Effect::Closed),
            HostEvent::AgentStopped { .. } => None,
            HostEvent::Configured { settings, .. } => Some(Effect::Configured(settings)),
            HostEvent::Agent { kind, payload, .. } => {
                kind.streams().then_some(Effect::Stream { kind, payload })
            }
        }
    }
}
