//! The `type` of every line pi writes in RPC mode, as one table.

use std::borrow::Cow;

macro_rules! kind_table {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, )*) => {
        /// The `type` of a line pi writes, relayed as `agent.<type>`. Types this table does not
        /// know (a newer pi's) are kept as [`Kind::Other`] and relayed all the same.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Kind {
            $( $(#[doc = $doc])* $variant, )*
            /// A type this table does not know, as pi wrote it.
            Other(Box<str>),
        }

        impl Kind {
            /// Every type the table knows, in table order.
            pub const KNOWN: &'static [Kind] = &[$(Kind::$variant),*];

            /// The type as pi writes it.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Kind::$variant => $name, )*
                    Kind::Other(name) => name,
                }
            }

            /// The kind of a `type` as read from a line.
            pub fn from_wire(name: &str) -> Kind {
                match name {
                    $( $name => Kind::$variant, )*
                    other => Kind::Other(other.into()),
                }
            }
        }
    };
}

kind_table! {
    /// The agent began a run (a prompt was taken).
    AgentStart = "agent_start",
    /// The run ended; `messages` repeats every message of the run.
    AgentEnd = "agent_end",
    TurnStart = "turn_start",
    /// A model turn ended; `message` and `toolResults` repeat what it said.
    TurnEnd = "turn_end",
    MessageStart = "message_start",
    /// A step of the assistant message being streamed (pi repeats the whole message so far).
    MessageUpdate = "message_update",
    MessageEnd = "message_end",
    ToolExecutionStart = "tool_execution_start",
    /// A running tool's output so far (pi repeats the whole output).
    ToolExecutionUpdate = "tool_execution_update",
    ToolExecutionEnd = "tool_execution_end",
    /// The steering and follow-up queues changed.
    QueueUpdate = "queue_update",
    CompactionStart = "compaction_start",
    CompactionEnd = "compaction_end",
    /// Older pi's name for an automatic `compaction_start`.
    AutoCompactionStart = "auto_compaction_start",
    /// Older pi's name for an automatic `compaction_end`.
    AutoCompactionEnd = "auto_compaction_end",
    AutoRetryStart = "auto_retry_start",
    AutoRetryEnd = "auto_retry_end",
    ExtensionError = "extension_error",
    /// A dialog (confirm, select, input, editor) or a notice of an extension.
    ExtensionUiRequest = "extension_ui_request",
    /// The answer to a command.
    Response = "response",
    /// Not pi's: the host's report of a line that is not agent output (docs/protocol.md §8.1).
    InvalidOutput = "invalid_output",
}

impl Kind {
    /// The updates that repeat everything streamed so far, which the host compacts
    /// (docs/protocol.md §8.1, "Compact streams").
    pub fn is_stream_update(&self) -> bool {
        matches!(self, Kind::MessageUpdate | Kind::ToolExecutionUpdate)
    }

    /// The events that change what is streaming: the rebuild reads no others.
    pub fn streams(&self) -> bool {
        matches!(
            self,
            Kind::MessageStart
                | Kind::MessageUpdate
                | Kind::MessageEnd
                | Kind::ToolExecutionUpdate
                | Kind::ToolExecutionEnd
        )
    }

    /// The events that hold the conversation: each message whole (user, assistant with its
    /// tool calls, tool result, an extension's), and a compaction's summary. The host keeps them
    /// past the log's retention as the session's history (docs/protocol.md §7.24).
    pub fn is_history(&self) -> bool {
        matches!(
            self,
            Kind::MessageEnd | Kind::CompactionEnd | Kind::AutoCompactionEnd
        )
    }

    /// The kind of a relayed event's wire type (`agent.message_update`), or `None` for a host
    /// event.
    pub fn of_event_type(event_type: &str) -> Option<Kind> {
        event_type
            .strip_prefix(crate::events::EventType::AGENT_PREFIX)
            .map(Kind::from_wire)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Cow<'_, str>> for Kind {
    fn from(name: Cow<'_, str>) -> Kind {
        Kind::from_wire(&name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_kind_reads_back_as_itself_and_others_are_kept() {
        for kind in Kind::KNOWN {
            assert_eq!(&Kind::from_wire(kind.as_str()), kind);
        }
        let newer = Kind::from_wire("session_renamed");
        assert_eq!(newer, Kind::Other("session_renamed".into()));
        assert_eq!(newer.as_str(), "session_renamed");
        assert_eq!(
            Kind::of_event_type("agent.message_end"),
            Some(Kind::MessageEnd)
        );
        assert_eq!(Kind::of_event_type("turn.finished"), None);
    }

    /// The history keeps each whole message and each compaction's summary (pi's two names for
    /// its end), and nothing else pi writes (docs/protocol.md §7.24).
    #[test]
    fn the_history_keeps_messages_and_compactions_and_nothing_else() {
        let kept = [
            Kind::MessageEnd,
            Kind::CompactionEnd,
            Kind::AutoCompactionEnd,
        ];
        for kind in Kind::KNOWN {
            assert_eq!(kind.is_history(), kept.contains(kind), "{kind}");
        }
        assert!(!Kind::from_wire("session_renamed").is_history());
        for kind in [
            "agent.message_end",
            "agent.compaction_end",
            "agent.auto_compaction_end",
        ] {
            assert!(crate::events::EventType::kept_in_history(kind), "{kind}");
        }
        assert!(!crate::events::EventType::kept_in_history(
            "agent.compaction_start"
        ));
    }
}
