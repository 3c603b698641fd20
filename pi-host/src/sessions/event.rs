//! The events the host appends to a session's log: a host event is its typed body from
//! racp-proto's event table (which fixes its wire type and `data`) and the turn it belongs to;
//! an agent event is the agent's payload relayed as it came. What an event does to the snapshot
//! is `view.rs` (docs/protocol.md §8).

use racp_proto::events::{Event, EventType, HostEventData};
use racp_proto::pi::Kind;
use serde_json::value::RawValue;

/// An event before it has a seq.
#[derive(Debug)]
pub enum HostEvent {
    /// An event of the host event table.
    Host {
        body: HostEventData,
        turn_id: Option<String>,
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

/// An event's `data` on the wire: the agent's payload as it came, or the host body encoded
/// straight into the frame.
#[derive(Debug, Clone, Copy)]
pub enum WireData<'a> {
    Raw(&'a RawValue),
    Host(&'a HostEventData),
}

impl serde::Serialize for WireData<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            WireData::Raw(raw) => raw.serialize(serializer),
            WireData::Host(body) => body.serialize(serializer),
        }
    }
}

impl HostEvent {
    /// A host event of the turn `turn_id`.
    pub fn of_turn(turn_id: impl Into<String>, body: impl Into<HostEventData>) -> HostEvent {
        HostEvent::Host {
            body: body.into(),
            turn_id: Some(turn_id.into()),
        }
    }

    /// Agent output relayed as `agent.<kind>`, its payload as the agent wrote it.
    pub fn relayed(kind: Kind, turn_id: Option<String>, payload: Box<RawValue>) -> HostEvent {
        HostEvent::Agent {
            kind,
            turn_id,
            payload,
        }
    }

    /// A host event of the session, outside any turn.
    pub fn of_session(body: impl Into<HostEventData>) -> HostEvent {
        HostEvent::Host {
            body: body.into(),
            turn_id: None,
        }
    }

    /// A stored event read back (after a restart); `None` for a type this host does not know
    /// or `data` that is not its type's.
    pub fn from_stored(event: Event) -> Option<HostEvent> {
        if let Some(kind) = Kind::of_event_type(&event.kind) {
            return Some(HostEvent::Agent {
                kind,
                turn_id: event.turn_id,
                payload: event.data.into_raw(),
            });
        }
        let body = event.host_data()?.ok()?;
        Some(HostEvent::Host {
            body,
            turn_id: event.turn_id,
        })
    }

    /// The wire `type`.
    pub fn kind(&self) -> EventTypeName<'_> {
        match self {
            HostEvent::Host { body, .. } => EventTypeName {
                prefix: "",
                name: body.event_type().as_str(),
            },
            HostEvent::Agent { kind, .. } => EventTypeName {
                prefix: EventType::AGENT_PREFIX,
                name: kind.as_str(),
            },
        }
    }

    pub fn turn_id(&self) -> Option<&str> {
        match self {
            HostEvent::Host { turn_id, .. } | HostEvent::Agent { turn_id, .. } => {
                turn_id.as_deref()
            }
        }
    }

    /// An `approval.settled`'s outcome (the host's metrics count them).
    pub fn settled_outcome(&self) -> Option<racp_proto::methods::turn::ApprovalState> {
        match self {
            HostEvent::Host {
                body: HostEventData::ApprovalSettled(settled),
                ..
            } => Some(settled.outcome),
            _ => None,
        }
    }

    /// True for the event after which the session takes no more.
    pub fn closes_session(&self) -> bool {
        matches!(
            self,
            HostEvent::Host {
                body: HostEventData::SessionClosed(_),
                ..
            }
        )
    }

    /// True for an event the session's history keeps (docs/protocol.md §7.24).
    pub fn in_history(&self) -> bool {
        match self {
            HostEvent::Agent { kind, .. } => kind.is_history(),
            HostEvent::Host { body, .. } => body.event_type().is_history(),
        }
    }

    /// The `data` as it goes on the wire.
    pub fn data(&self) -> WireData<'_> {
        match self {
            HostEvent::Host { body, .. } => WireData::Host(body),
            HostEvent::Agent { payload, .. } => WireData::Raw(payload),
        }
    }
}
