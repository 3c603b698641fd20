//! pi's messages as typed values: what a conversation holds (`AgentMessage` in pi's types), read
//! from a `message_end`, a `bashExecution` or a compaction's summary. A client's transcript
//! (pi-remote's `history`) renders these and never names a field of pi's.

use super::Kind;
use serde::Deserialize;
use serde_json::Value;

/// One message of pi's conversation, by its `role`.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// What the user sent: its text parts, an image as [`Part::Image`].
    User { content: Vec<Part> },
    /// A model's reply: text, thinking and tool calls in order, and why it stopped.
    Assistant {
        content: Vec<Part>,
        stop: AssistantStop,
    },
    /// A tool's result as the model receives it.
    ToolResult {
        tool_name: Option<String>,
        content: Vec<Part>,
        is_error: bool,
    },
    /// A shell command the user ran (`session/bash`) and its output.
    BashExecution { command: String, output: String },
    /// The summary that replaced the conversation before a compaction.
    CompactionSummary { summary: String },
    /// The summary of a branch left behind.
    BranchSummary { summary: String },
    /// An extension's message; `display: false` asks clients not to show it.
    Custom {
        custom_type: Option<String>,
        content: Vec<Part>,
        display: bool,
    },
    /// A role this version does not know, kept with its content.
    Other { role: String, content: Vec<Part> },
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image,
    Thinking,
    ToolCall {
        name: Option<String>,
        arguments: Value,
    },
    /// A part of a type this version does not know.
    Other,
}

/// How an assistant message ended, as far as a reader shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssistantStop {
    /// The model finished, called a tool, or the reason is not known.
    Finished,
    Aborted,
    /// The request failed, with pi's `errorMessage` when it gave one.
    Failed(Option<String>),
}

/// An entry of a session's history: a message whole, or a compaction's summary.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Message(Message),
    Compacted { summary: String },
}

impl Entry {
    /// The entry an agent event holds (`message_end`, `compaction_end`, `auto_compaction_end`),
    /// or `None` for any other event or a payload of another shape.
    pub fn of_agent_event(kind: &Kind, data: &str) -> Option<Entry> {
        match kind {
            Kind::MessageEnd => {
                #[derive(Deserialize)]
                struct MessageEnd {
                    message: RawMessage,
                }
                let end: MessageEnd = serde_json::from_str(data).ok()?;
                Some(Entry::Message(end.message.into()))
            }
            Kind::CompactionEnd | Kind::AutoCompactionEnd => {
                #[derive(Deserialize)]
                struct CompactionEnd {
                    result: Summary,
                }
                #[derive(Deserialize)]
                struct Summary {
                    summary: String,
                }
                let end: CompactionEnd = serde_json::from_str(data).ok()?;
                Some(Entry::Compacted {
                    summary: end.result.summary,
                })
            }
            _ => None,
        }
    }

    /// A message given whole (a `session.bash` event's data is pi's `bashExecution` message).
    pub fn of_message(data: &str) -> Option<Entry> {
        let message: RawMessage = serde_json::from_str(data).ok()?;
        Some(Entry::Message(message.into()))
    }
}

/// The fields of every role in one shape, read once, then sorted by role.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawMessage {
    role: String,
    content: Content,
    tool_name: Option<String>,
    is_error: bool,
    command: Option<String>,
    output: Option<String>,
    summary: Option<String>,
    custom_type: Option<String>,
    display: Option<bool>,
    stop_reason: Option<String>,
    error_message: Option<String>,
}

/// A string, or a list of parts.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Value>),
    #[default]
    None,
}

impl Content {
    fn parts(self) -> Vec<Part> {
        match self {
            Content::Text(text) => vec![Part::Text(text)],
            Content::Parts(parts) => parts.iter().map(Part::read).collect(),
            Content::None => Vec::new(),
        }
    }
}

impl Part {
    fn read(part: &Value) -> Part {
        let text = |key: &str| part.get(key).and_then(Value::as_str).map(str::to_string);
        match part.get("type").and_then(Value::as_str) {
            Some("text") => Part::Text(text("text").unwrap_or_default()),
            Some("image") => Part::Image,
            Some("thinking") => Part::Thinking,
            Some("toolCall") => Part::ToolCall {
                name: text("name"),
                arguments: part.get("arguments").cloned().unwrap_or(Value::Null),
            },
            _ => Part::Other,
        }
    }
}

impl From<RawMessage> for Message {
    fn from(raw: RawMessage) -> Message {
        let content = raw.content.parts();
        match raw.role.as_str() {
            "user" => Message::User { content },
            "assistant" => Message::Assistant {
                content,
                stop: match raw.stop_reason.as_deref() {
                    Some("error") => AssistantStop::Failed(raw.error_message),
                    Some("aborted") => AssistantStop::Aborted,
                    _ => AssistantStop::Finished,
                },
            },
            "toolResult" => Message::ToolResult {
                tool_name: raw.tool_name,
                content,
                is_error: raw.is_error,
            },
            "bashExecution" => Message::BashExecution {
                command: raw.command.unwrap_or_default(),
                output: raw.output.unwrap_or_default(),
            },
            "compactionSummary" => Message::CompactionSummary {
                summary: raw.summary.unwrap_or_default(),
            },
            "branchSummary" => Message::BranchSummary {
                summary: raw.summary.unwrap_or_default(),
            },
            "custom" => Message::Custom {
                custom_type: raw.custom_type,
                content,
                display: raw.display != Some(false),
            },
            _ => Message::Other {
                role: raw.role,
                content,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn message_end(message: Value) -> Option<Entry> {
        let data = json!({"type": "message_end", "message": message}).to_string();
        Entry::of_agent_event(&Kind::MessageEnd, &data)
    }

    #[test]
    fn each_role_reads_as_its_message() {
        let user = message_end(json!({"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image", "data": "x"}]}));
        assert_eq!(
            user,
            Some(Entry::Message(Message::User {
                content: vec![Part::Text("look".into()), Part::Image]
            }))
        );
        let failed = message_end(json!({"role": "assistant", "stopReason": "error",
            "errorMessage": "503", "content": [{"type": "toolCall", "name": "bash",
            "arguments": {"command": "ls"}}, {"type": "thinking", "thinking": "hm"}]}));
        assert_eq!(
            failed,
            Some(Entry::Message(Message::Assistant {
                content: vec![
                    Part::ToolCall {
                        name: Some("bash".into()),
                        arguments: json!({"command": "ls"})
                    },
                    Part::Thinking
                ],
                stop: AssistantStop::Failed(Some("503".into())),
            }))
        );
        let hidden = message_end(json!({"role": "custom", "customType": "note",
            "content": "x", "display": false}));
        assert!(matches!(
            hidden,
            Some(Entry::Message(Message::Custom { display: false, .. }))
        ));
        let bash = Entry::of_message(
            &json!({"role": "bashExecution", "command": "ls", "output": "a\n"}).to_string(),
        );
        assert_eq!(
            bash,
            Some(Entry::Message(Message::BashExecution {
                command: "ls".into(),
                output: "a\n".into()
            }))
        );
        let unknown = message_end(json!({"role": "system", "content": "be brief"}));
        assert_eq!(
            unknown,
            Some(Entry::Message(Message::Other {
                role: "system".into(),
                content: vec![Part::Text("be brief".into())]
            }))
        );
    }

    #[test]
    fn a_compaction_reads_as_its_summary_and_other_events_as_nothing() {
        let end = r#"{"type":"compaction_end","result":{"summary":"Fixed."}}"#;
        assert_eq!(
            Entry::of_agent_event(&Kind::AutoCompactionEnd, end),
            Some(Entry::Compacted {
                summary: "Fixed.".into()
            })
        );
        assert_eq!(
            Entry::of_agent_event(&Kind::CompactionEnd, r#"{"result":{}}"#),
            None
        );
        assert_eq!(Entry::of_agent_event(&Kind::TurnEnd, "{}"), None);
        assert_eq!(Entry::of_agent_event(&Kind::MessageEnd, "[1]"), None);
    }
}
