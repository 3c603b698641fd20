//! Session events and the pushes that carry them.

use crate::cursor::Cursor;
use crate::error::AppError;
use crate::methods::turn::{ApprovalInfo, ApprovalKind, ApprovalState, TurnState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// One entry of a session's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Strictly increasing within a session's epoch, starting at 1, with no gaps.
    pub seq: u64,
    /// The position just after this event: resuming from it delivers the next event.
    pub cursor: Cursor,
    /// A type of the host event table (`turn.started`, `approval.requested`, ...; each
    /// type's `data` is in `x-racp-events` and `RacpEventData`), or `agent.<pi event type>`
    /// (see [`EventType`]).
    #[serde(rename = "type")]
    pub kind: String,
    /// When the host recorded it (ms since the Unix epoch).
    pub at: u64,
    /// The turn it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Type-specific payload; for `agent.*` events, the agent's own payload. Kept as the JSON
    /// text the host sent, so its numbers arrive exactly as written (docs/protocol.md §1).
    #[schemars(with = "Value")]
    pub data: EventData,
    /// Present only when the event as stored does not fit the connection's frame bound: the
    /// host cut large values out of it (see [`Elided`]). Absent on every event that is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elided: Option<Elided>,
}

/// An event's `data` as the JSON text the host sent, byte for byte.
///
/// Kept raw rather than as a [`serde_json::Value`] because a `Value` cannot hold every JSON
/// number: an integer beyond 64 bits becomes the nearest double, and re-encoding a double can
/// change its text (`1E5` becomes `100000.0`). Agents put such numbers in their payloads and the
/// host relays them unchanged (docs/protocol.md §1, "Numbers"), so the client does too. Read it
/// with [`EventData::parse`] into a type of your own, as text with [`EventData::get`], or as a
/// `Value` with [`EventData::to_value`], which refuses a payload it would change.
///
/// Equality is equality of the text.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventData(Box<RawValue>);

/// Why [`EventData::to_value`] refused.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An integer a `Value` cannot hold exactly; it would become the nearest double.
    #[error(
        "the data holds the integer {0}, beyond 64 bits, which a serde_json::Value would round; \
         read it with EventData::get or EventData::parse instead"
    )]
    WideInteger(String),
    #[error("the data is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl EventData {
    /// The JSON text as received.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The raw JSON value, to embed in another frame unchanged.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    pub fn into_raw(self) -> Box<RawValue> {
        self.0
    }

    /// Checks that `text` is one JSON value and keeps it as is.
    pub fn from_json(text: impl Into<String>) -> Result<EventData, serde_json::Error> {
        RawValue::from_string(text.into()).map(EventData)
    }

    /// Encodes `value` (for building events, e.g. in tests or a host).
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<EventData, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(EventData)
    }

    /// Decodes the data into `T` (numbers parsed correctly rounded; an integer field refuses a
    /// value out of its range rather than rounding it).
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The data as a `Value`, or [`DataError::WideInteger`] when it holds an integer beyond 64
    /// bits, which a `Value` would silently round. Other numbers keep their value (not
    /// necessarily their spelling: `1E5` becomes `100000.0` when encoded again).
    pub fn to_value(&self) -> Result<Value, DataError> {
        if let Some(wide) = wide_integer(self.0.get()) {
            let shown: String = wide.chars().take(64).collect();
            let ellipsis = if wide.len() > 64 { "…" } else { "" };
            return Err(DataError::WideInteger(format!("{shown}{ellipsis}")));
        }
        Ok(serde_json::from_str(self.0.get())?)
    }
}

/// The first integer in the JSON `text` that fits neither `u64` nor `i64`. Outside strings a
/// `-` or a digit can only start a number, so a scan that skips strings finds every number.
fn wide_integer(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                let number = &text[start..i];
                let integer = !number.contains(['.', 'e', 'E']);
                if integer && number.parse::<u64>().is_err() && number.parse::<i64>().is_err() {
                    return Some(number);
                }
            }
            _ => i += 1,
        }
    }
    None
}

impl PartialEq for EventData {
    fn eq(&self, other: &EventData) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for EventData {}

impl std::fmt::Debug for EventData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl std::fmt::Display for EventData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl From<Box<RawValue>> for EventData {
    fn from(raw: Box<RawValue>) -> EventData {
        EventData(raw)
    }
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

/// The host event table: one row per event type the host itself emits, with its wire type and
/// its `data` type. From it come [`EventType`], the typed bodies [`HostEventData`] (encoding
/// and decoding), [`EventBody`], and, through [`EventType::ALL`] and
/// [`EventType::data_schema`], the schema's `x-racp-events` and the TypeScript `RacpEventData`.
/// Adding an event is one row here plus its producer; pi-host's snapshot then names it in one
/// exhaustive match (pi-host/src/sessions/view.rs), so a row nobody decided about does not
/// compile.
macro_rules! event_table {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal ($data:ty)
    )*) => {
        /// The event types the host itself emits (agent events are `agent.<type>`, see
        /// [`EventType::AGENT_PREFIX`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum EventType {
            $($(#[doc = $doc])* $variant,)*
        }

        impl EventType {
            /// Every host event type, in table order.
            pub const ALL: &'static [EventType] = &[$(EventType::$variant,)*];

            /// The wire `type`, e.g. `turn.started`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EventType::$variant => $name,)*
                }
            }

            pub fn from_name(name: &str) -> Option<EventType> {
                match name {
                    $($name => Some(EventType::$variant),)*
                    _ => None,
                }
            }

            /// The JSON Schema of this event type's `data`.
            pub fn data_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                match self {
                    $(EventType::$variant => generator.subschema_for::<$data>(),)*
                }
            }
        }

        /// The `data` types of the table, for code generic over an event's `data`.
        pub trait EventBody:
            ::serde::Serialize + ::serde::de::DeserializeOwned + Into<HostEventData>
        {
            const TYPE: EventType;
        }

        /// A host event's `data`, typed by its event type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum HostEventData {
            $($(#[doc = $doc])* $variant($data),)*
        }

        impl HostEventData {
            pub fn event_type(&self) -> EventType {
                match self {
                    $(HostEventData::$variant(_) => EventType::$variant,)*
                }
            }

            /// Reads `data`, the JSON text of an event of type `event_type`.
            pub fn decode(event_type: EventType, data: &str) -> Result<HostEventData, serde_json::Error> {
                match event_type {
                    $(EventType::$variant => serde_json::from_str::<$data>(data).map(HostEventData::$variant),)*
                }
            }

            /// The `data` as JSON text.
            pub fn encode(&self) -> Result<$crate::events::EventData, serde_json::Error> {
                $crate::events::EventData::encode(self)
            }
        }

        /// Serializes as the `data` itself (the type is the event's `type` field).
        impl ::serde::Serialize for HostEventData {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(HostEventData::$variant(data) => data.serialize(serializer),)*
                }
            }
        }

        $(
            impl From<$data> for HostEventData {
                fn from(data: $data) -> HostEventData {
                    HostEventData::$variant(data)
                }
            }

            impl EventBody for $data {
                const TYPE: EventType = EventType::$variant;
            }
        )*
    };
}

event_table! {
    TurnStarted = "turn.started" (TurnStartedData)
    TurnFinished = "turn.finished" (TurnFinishedData)
    TurnQueued = "turn.queued" (TurnQueuedData)
    TurnWithdrawn = "turn.withdrawn" (TurnWithdrawnData)
    ApprovalRequested = "approval.requested" (ApprovalRequestedData)
    ApprovalSettled = "approval.settled" (ApprovalSettledData)
    SessionClosed = "session.closed" (SessionClosedData)
    AgentStopped = "session.agent_stopped" (AgentStoppedData)
    SessionConfigured = "session.configured" (SessionConfiguredData)
    SessionRenamed = "session.renamed" (SessionRenamedData)
    SessionBash = "session.bash" (SessionBashData)
    SessionForked = "session.forked" (SessionForkedData)
    PermissionDecided = "permission.decided" (crate::permission::PermissionDecidedData)
    WorkspaceChanged = "workspace.changed" (crate::methods::workspace::WorkspaceChangedData)
}

impl EventType {
    /// Prefix of the events that relay the agent's own output: `agent.<the agent's type>`,
    /// with the agent's payload unchanged.
    pub const AGENT_PREFIX: &'static str = "agent.";

    /// Whether a session's history keeps events of this type (docs/protocol.md §7.24): those
    /// that hold a message of the conversation, as the agent events `Kind::is_history` names.
    pub fn is_history(self) -> bool {
        matches!(self, EventType::SessionBash)
    }

    /// Whether the history keeps an event of the wire type `kind`, host or agent event.
    pub fn kept_in_history(kind: &str) -> bool {
        match crate::pi::Kind::of_event_type(kind) {
            Some(kind) => kind.is_history(),
            None => EventType::from_name(kind).is_some_and(EventType::is_history),
        }
    }
}

impl Event {
    /// The typed `data` of a host event; `None` for an agent event or a type this version
    /// does not know.
    pub fn host_data(&self) -> Option<Result<HostEventData, serde_json::Error>> {
        let event_type = EventType::from_name(&self.kind)?;
        Some(HostEventData::decode(event_type, self.data.get()))
    }
}

/// `turn.started`: a turn began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartedData {
    /// The prompt.
    pub text: String,
    /// The images sent with it, named only: their bytes are in the prompt's own message
    /// (`agent.message_end`, role `user`), so the log holds them once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::methods::turn::ImageInfo>,
    /// The device that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TurnOutcome {
    Completed,
    Aborted,
    Failed,
}

impl TurnOutcome {
    /// The state a snapshot shows for a turn that ended so.
    pub fn turn_state(self) -> TurnState {
        match self {
            TurnOutcome::Completed => TurnState::Completed,
            TurnOutcome::Aborted => TurnState::Aborted,
            TurnOutcome::Failed => TurnState::Failed,
        }
    }
}

/// `turn.finished`: a turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnFinishedData {
    pub outcome: TurnOutcome,
    /// Why it failed or was aborted (e.g. AGENT_SIDECAR_CRASHED, TURN_ABORTED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AppError>,
    /// The files the turn's tools wrote, edited or deleted, with line counts where known
    /// (docs/protocol.md §8.9), at most 256; absent when it changed none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::methods::workspace::FileChange>,
}

/// `turn.queued`: a follow-up waits for the running turn to complete (docs/protocol.md
/// §7.25); its `turn.started` or `turn.withdrawn` comes later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnQueuedData {
    /// The prompt.
    pub text: String,
    /// The images sent with it, named only: their bytes reach the log with the prompt's own
    /// message once its turn runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::methods::turn::ImageInfo>,
    /// The device that queued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// Why a queued follow-up left the queue without a turn of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WithdrawReason {
    /// `session/clear_queue`, or `turn/abort` of the queued turn.
    Cleared,
    /// The turn before it was aborted or failed: nothing runs unattended after that.
    TurnEnded,
    /// The session's agent was stopped (`session/close`, a host draining).
    AgentStopped,
    /// The host restarted: its queue was in memory.
    HostRestarted,
    /// Delivered with an earlier follow-up as one turn (`followUpMode: "all"`).
    Joined,
}

/// `turn.withdrawn`: a queued follow-up will not run as a turn of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnWithdrawnData {
    /// Its prompt, to put back where it was typed.
    pub text: String,
    pub reason: WithdrawReason,
    /// The turn it was delivered with (`reason: "joined"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_turn_id: Option<String>,
    /// The device that withdrew it (`reason: "cleared"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
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
    /// What a `permission` approval asks about.
    // Boxed: every host event's body is as large as the largest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<Box<crate::permission::PermissionQuestion>>,
}

impl ApprovalRequestedData {
    /// The approval as a snapshot shows it while it waits for an answer.
    pub fn into_pending(self, session_id: String) -> ApprovalInfo {
        ApprovalInfo {
            approval_id: self.approval_id,
            session_id,
            turn_id: self.turn_id,
            kind: self.kind,
            title: self.title,
            message: self.message,
            options: self.options,
            deadline: self.deadline,
            state: ApprovalState::Pending,
            settled_by: None,
            settled_by_name: None,
            value: None,
            permission: self.permission.map(|p| *p),
        }
    }
}

impl From<&ApprovalInfo> for ApprovalRequestedData {
    fn from(info: &ApprovalInfo) -> ApprovalRequestedData {
        ApprovalRequestedData {
            approval_id: info.approval_id.clone(),
            turn_id: info.turn_id.clone(),
            kind: info.kind,
            title: info.title.clone(),
            message: info.message.clone(),
            options: info.options.clone(),
            deadline: info.deadline,
            permission: info.permission.clone().map(Box::new),
        }
    }
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
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// The approval as it was settled (`state`, `settled_by`, `value`).
impl From<&ApprovalInfo> for ApprovalSettledData {
    fn from(info: &ApprovalInfo) -> ApprovalSettledData {
        ApprovalSettledData {
            approval_id: info.approval_id.clone(),
            outcome: info.state,
            device_id: info.settled_by.clone(),
            device_name: info.settled_by_name.clone(),
            value: info.value.clone(),
        }
    }
}

/// `session.closed`: the session was closed; no more events follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionClosedData {
    /// The device that closed it; absent when the host did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
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

/// `session.configured`: the session's model, thinking level or auto-compaction changed
/// (`session/configure`); `settings` is what it runs with from now on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionConfiguredData {
    pub settings: crate::methods::model::SessionSettings,
    /// The device that changed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The session's permission grants were withdrawn (`clearGrants`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grants_cleared: bool,
}

/// `session.renamed`: the session's title changed (`session/rename`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionRenamedData {
    pub title: String,
    /// The device that renamed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// `session.forked`: the first event of a session made by `session/fork` or `session/clone`;
/// the conversation it starts with follows, as this session's own history entries
/// (docs/protocol.md §7.31, §7.32).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionForkedData {
    /// The session it was made from.
    pub from_session_id: String,
    /// The history entry of that session it was forked at (a user message, which it does not
    /// hold); absent for a clone, which holds the whole conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Cursor>,
    /// The device that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// `session.bash`: a shell command ran in the session (`session/bash`). `data` is pi's
/// `bashExecution` message, the shape pi keeps it in its session and shows it in the
/// conversation, with the device that ran it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionBashData {
    /// Always `bashExecution`.
    pub role: BashRole,
    pub command: String,
    /// Stdout and stderr together; only the end when `truncated` (at most 64 KiB).
    pub output: String,
    /// Absent when it did not exit by itself (cancelled, killed by a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    pub cancelled: bool,
    pub truncated: bool,
    /// When it ended (ms since the Unix epoch).
    pub timestamp: u64,
    /// The device that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// The role of a shell command's message, as pi names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BashRole {
    #[serde(rename = "bashExecution")]
    BashExecution,
}

/// Why an idle agent was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentStopReason {
    /// No turn and no subscriber for the host's idle time.
    Idle,
    /// The host runs its most agents at once and another session needed one.
    Capacity,
    /// Its sandbox no longer matched its session (a grant, or a move into or out of plan
    /// mode): the next turn starts it again with the new ruleset, on the same conversation.
    Sandbox,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Numbers at the edges of what a double or a 64-bit integer holds.
    const EDGES: &str = r#"{"a":9007199254740993,"b":18446744073709551616,"c":1e308,"d":5e-324,"e":1234567890123456789012345678901234567890,"f":-0.0,"g":1E5,"h":0.1000,"i":-9223372036854775809}"#;

    #[test]
    fn an_event_keeps_its_data_text_through_decode_and_encode() {
        let text = format!(
            r#"{{"seq":1,"cursor":"00000000000000aa-1","type":"agent.x","at":5,"data":{EDGES}}}"#
        );
        let event: Event = serde_json::from_str(&text).unwrap();
        assert_eq!(event.data.get(), EDGES);
        assert_eq!(serde_json::to_string(&event).unwrap(), text);
    }

    #[test]
    fn to_value_refuses_integers_a_value_would_round() {
        let data = EventData::from_json(EDGES).unwrap();
        match data.to_value() {
            Err(DataError::WideInteger(n)) => assert_eq!(n, "18446744073709551616"),
            other => panic!("{other:?}"),
        }
        for wide in [
            "18446744073709551616",
            "[-9223372036854775809]",
            "{\"k\":1e2,\"n\":1234567890123456789012345}",
        ] {
            assert!(
                EventData::from_json(wide).unwrap().to_value().is_err(),
                "{wide}"
            );
        }
        for fits in [
            "18446744073709551615",
            "-9223372036854775808",
            "[1e300, 0.5, -0]",
            "\"123456789012345678901234567890\"",
            "{\"12345678901234567890123\":\"\\\"99999999999999999999999\"}",
        ] {
            let value = EventData::from_json(fits).unwrap().to_value();
            assert!(value.is_ok(), "{fits}: {value:?}");
        }
        // Doubles parse to the nearest value (serde_json's float_roundtrip).
        let value = EventData::from_json("[5e-324, 1e308, 1.7645287777777778e+161]")
            .unwrap()
            .to_value()
            .unwrap();
        let encoded = value.to_string();
        assert_eq!(serde_json::from_str::<Value>(&encoded).unwrap(), value);
    }

    #[test]
    fn the_table_names_each_type_once_and_decodes_what_it_encodes() {
        let mut seen = std::collections::HashSet::new();
        for event_type in EventType::ALL {
            assert!(seen.insert(event_type.as_str()), "{event_type:?} twice");
            assert_eq!(EventType::from_name(event_type.as_str()), Some(*event_type));
            assert!(!event_type.as_str().starts_with(EventType::AGENT_PREFIX));
        }
        assert_eq!(EventType::from_name("agent.message_update"), None);
        let body = HostEventData::from(TurnStartedData {
            text: "hi".into(),
            images: Vec::new(),
            device_id: None,
            device_name: None,
        });
        let data = body.encode().unwrap();
        assert_eq!(data.get(), r#"{"text":"hi"}"#);
        assert_eq!(
            HostEventData::decode(TurnStartedData::TYPE, data.get()).unwrap(),
            body
        );
        let event = Event {
            seq: 1,
            cursor: "00000000000000aa-1".parse().unwrap(),
            kind: body.event_type().as_str().into(),
            at: 5,
            turn_id: Some("turn_1".into()),
            data,
            elided: None,
        };
        assert_eq!(event.host_data().unwrap().unwrap(), body);
    }

    /// Events logged before `deviceName` was added carry only `deviceId`; they still decode,
    /// and one with a name keeps it.
    #[test]
    fn an_event_of_an_older_host_without_a_device_name_decodes() {
        let old = r#"{"approvalId":"apr_1","outcome":"allowed","deviceId":"dev_1"}"#;
        let settled = HostEventData::decode(ApprovalSettledData::TYPE, old).unwrap();
        let HostEventData::ApprovalSettled(settled) = settled else {
            panic!("{settled:?}");
        };
        assert_eq!(settled.device_id.as_deref(), Some("dev_1"));
        assert_eq!(settled.device_name, None);
        let old = r#"{"text":"hi","deviceId":"dev_1"}"#;
        let HostEventData::TurnStarted(started) =
            HostEventData::decode(TurnStartedData::TYPE, old).unwrap()
        else {
            panic!("not turn.started");
        };
        assert_eq!(started.device_name, None);
        let named = r#"{"text":"hi","deviceId":"dev_1","deviceName":"laptop"}"#;
        let HostEventData::TurnStarted(started) =
            HostEventData::decode(TurnStartedData::TYPE, named).unwrap()
        else {
            panic!("not turn.started");
        };
        assert_eq!(started.device_name.as_deref(), Some("laptop"));
    }

    /// A row added to the table is all an event type needs in racp-proto: its type, its typed
    /// body, its encoding and decoding, and its schema follow.
    mod a_new_row {
        use super::super::TurnStartedData;
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        /// `test.pinged`: an event only this test knows.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct PingedData {
            pub round_trip_ms: u64,
        }

        event_table! {
            TurnStarted = "turn.started" (TurnStartedData)
            /// The test's own event.
            Pinged = "test.pinged" (PingedData)
        }

        #[test]
        fn gets_its_type_body_encoding_and_schema() {
            assert_eq!(EventType::ALL, [EventType::TurnStarted, EventType::Pinged]);
            assert_eq!(EventType::from_name("test.pinged"), Some(EventType::Pinged));
            assert_eq!(PingedData::TYPE.as_str(), "test.pinged");
            let body = HostEventData::from(PingedData { round_trip_ms: 7 });
            assert_eq!(body.event_type(), EventType::Pinged);
            let data = body.encode().unwrap();
            assert_eq!(data.get(), r#"{"roundTripMs":7}"#);
            assert_eq!(
                HostEventData::decode(EventType::Pinged, data.get()).unwrap(),
                body
            );
            assert!(HostEventData::decode(EventType::Pinged, r#"{"text":"hi"}"#).is_err());
            let mut generator = schemars::SchemaGenerator::default();
            let schema = EventType::Pinged.data_schema(&mut generator).to_value();
            assert_eq!(schema["$ref"], "#/$defs/PingedData");
            let defs = generator.take_definitions(true);
            assert_eq!(defs["PingedData"]["required"][0], "roundTripMs");
        }
    }

    #[test]
    fn typed_reads_refuse_out_of_range_integers() {
        let data = EventData::from_json(r#"{"n":18446744073709551616}"#).unwrap();
        #[derive(Deserialize)]
        struct N {
            #[allow(dead_code)]
            n: u64,
        }
        assert!(data.parse::<N>().is_err());
    }
}
