//! Session events and the pushes that carry them.

use crate::cursor::Cursor;
use crate::error::AppError;
use crate::methods::turn::{ApprovalKind, ApprovalState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One entry of a session's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Strictly increasing within a session's epoch, starting at 1, with no gaps.
    pub seq: u64,
    /// The position just after this event: resuming from it delivers the next event.
    pub cursor: Cursor,
    /// `turn.started`, `turn.finished`, `approval.requested`, `approval.settled`,
    /// `session.closed`, or `agent.<pi event type>` (see [`EventType`]).
    #[serde(rename = "type")]
    pub kind: String,
    /// When the host recorded it (ms since the Unix epoch).
    pub at: u64,
    /// The turn it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Type-specific payload; for `agent.*` events, the agent's own payload.
    pub data: Value,
    /// Present only when the event as stored does not fit the connection's frame bound: the
    /// host cut large values out of it (see [`Elided`]). Absent on every event that is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elided: Option<Elided>,
}

/// What the host cut from an event that did not fit the connection's frame bound. The event
/// keeps its `seq`, `cursor`, `type`, `at` and `turnId`; the largest strings of `data` are cut
/// to a prefix (or `data` becomes `null` when that is not enough).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Elided {
    /// Size in bytes of the whole event as the host stores it.
    pub bytes: u64,
    /// The frame bound the event had to fit (the connection's `limits.maxFrameBytes`).
    pub limit: u64,
    /// Subscribing from this cursor on a connection whose frame bound holds `bytes` (plus
    /// about 1 KiB for the push around it) delivers the event whole, while the host retains it.
    pub from: crate::cursor::Cursor,
    /// The values that were cut, at most 64.
    pub cut: Vec<ElidedValue>,
}

/// One value the host cut from an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElidedValue {
    /// Where the value is in the event, e.g. `data.assistantMessageEvent.delta` (array items
    /// by index: `data.message.content.0.text`).
    pub path: String,
    /// Size in bytes of the value as JSON before it was cut.
    pub bytes: u64,
    /// For a string: how many of its characters were kept (a prefix). Absent when the value
    /// was replaced by `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
}

/// The event types the host itself emits, with their `data` types. Agent events are
/// `agent.<type>` with the agent's payload unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    TurnStarted,
    TurnFinished,
    ApprovalRequested,
    ApprovalSettled,
    SessionClosed,
    AgentStopped,
}

impl EventType {
    pub const ALL: &'static [EventType] = &[
        EventType::TurnStarted,
        EventType::TurnFinished,
        EventType::ApprovalRequested,
        EventType::ApprovalSettled,
        EventType::SessionClosed,
        EventType::AgentStopped,
    ];

    /// Prefix of the events that relay the agent's own output.
    pub const AGENT_PREFIX: &'static str = "agent.";

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::TurnStarted => "turn.started",
            EventType::TurnFinished => "turn.finished",
            EventType::ApprovalRequested => "approval.requested",
            EventType::ApprovalSettled => "approval.settled",
            EventType::SessionClosed => "session.closed",
            EventType::AgentStopped => "session.agent_stopped",
        }
    }

    /// The JSON Schema of this event type's `data`.
    pub fn data_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        match self {
            EventType::TurnStarted => generator.subschema_for::<TurnStartedData>(),
            EventType::TurnFinished => generator.subschema_for::<TurnFinishedData>(),
            EventType::ApprovalRequested => generator.subschema_for::<ApprovalRequestedData>(),
            EventType::ApprovalSettled => generator.subschema_for::<ApprovalSettledData>(),
            EventType::SessionClosed => generator.subschema_for::<SessionClosedData>(),
            EventType::AgentStopped => generator.subschema_for::<AgentStoppedData>(),
        }
    }
}

/// `turn.started`: a turn began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartedData {
    /// The prompt.
    pub text: String,
    /// The device that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TurnOutcome {
    Completed,
    Aborted,
    Failed,
}

/// `turn.finished`: a turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnFinishedData {
    pub outcome: TurnOutcome,
    /// Why it failed or was aborted (e.g. AGENT_SIDECAR_CRASHED, TURN_ABORTED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AppError>,
}

/// `approval.requested`: the agent asked a question; answer with `approval/respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestedData {
    pub approval_id: String,
    pub turn_id: String,
    pub kind: ApprovalKind,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// Absolute deadline (ms since the Unix epoch).
    pub deadline: u64,
}

/// `approval.settled`: an approval got its answer, expired, or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalSettledData {
    pub approval_id: String,
    /// `allowed`, `denied`, `answered`, `expired` or `cancelled`.
    pub outcome: ApprovalState,
    /// The device whose answer settled it; absent when it expired or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `session.closed`: the session was closed; no more events follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionClosedData {
    /// The device that closed it; absent when the host did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

/// `session.agent_stopped`: the host stopped the session's idle agent; the next turn (or
/// subscription) starts it again, resuming its own session (docs/protocol.md §8.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStoppedData {
    pub reason: AgentStopReason,
    /// How long the agent had been idle (ms).
    pub idle_ms: u64,
}

/// Why an idle agent was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentStopReason {
    /// No turn and no subscriber for the host's idle time.
    Idle,
    /// The host runs its most agents at once and another session needed one.
    Capacity,
}

/// The pushes a host sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMethod {
    SessionEvents,
    Heartbeat,
    SubscriptionEnded,
}

impl PushMethod {
    pub const ALL: &'static [PushMethod] = &[
        PushMethod::SessionEvents,
        PushMethod::Heartbeat,
        PushMethod::SubscriptionEnded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PushMethod::SessionEvents => "session/events",
            PushMethod::Heartbeat => "heartbeat",
            PushMethod::SubscriptionEnded => "subscription/ended",
        }
    }

    pub fn from_name(name: &str) -> Option<PushMethod> {
        PushMethod::ALL.iter().copied().find(|m| m.as_str() == name)
    }

    pub fn summary(self) -> &'static str {
        match self {
            PushMethod::SessionEvents => {
                "Events of one subscription, in order; several when the subscriber is behind."
            }
            PushMethod::Heartbeat => {
                "Sent every `heartbeatMs`: liveness, and the head cursor of every subscription."
            }
            PushMethod::SubscriptionEnded => {
                "A subscription ended by the host (session closed, or an error such as CURSOR_EXPIRED)."
            }
        }
    }

    /// Reads push params as this push's params type (client side), to check their shape.
    pub fn check_params(self, params: &str) -> Result<(), serde_json::Error> {
        match self {
            PushMethod::SessionEvents => {
                serde_json::from_str::<SessionEventsParams>(params).map(drop)
            }
            PushMethod::Heartbeat => serde_json::from_str::<HeartbeatParams>(params).map(drop),
            PushMethod::SubscriptionEnded => {
                serde_json::from_str::<SubscriptionEndedParams>(params).map(drop)
            }
        }
    }

    pub fn params_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        match self {
            PushMethod::SessionEvents => generator.subschema_for::<SessionEventsParams>(),
            PushMethod::Heartbeat => generator.subschema_for::<HeartbeatParams>(),
            PushMethod::SubscriptionEnded => generator.subschema_for::<SubscriptionEndedParams>(),
        }
    }
}

/// `session/events`: one or more events for one subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionEventsParams {
    pub subscription_id: String,
    pub session_id: String,
    /// In `seq` order, continuing exactly after the previous push of this subscription.
    pub events: Vec<Event>,
}

/// A subscription's head position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionHead {
    pub subscription_id: String,
    pub session_id: String,
    /// The cursor of the last event delivered on this subscription (or where it started). An
    /// idle client stores it so its cursor never goes stale.
    pub cursor: Cursor,
}

/// `heartbeat`: liveness, with each subscription's cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatParams {
    /// Host time (ms since the Unix epoch).
    pub at: u64,
    pub subscriptions: Vec<SubscriptionHead>,
}

/// `subscription/ended`: the host ended a subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionEndedParams {
    pub subscription_id: String,
    pub session_id: String,
    /// The last cursor delivered on it.
    pub cursor: Cursor,
    /// Why, when it was not a normal end (session closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AppError>,
}
