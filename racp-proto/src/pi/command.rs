//! The commands pi takes on its stdin, one JSON line each.

use crate::Capability;
use crate::methods::model::ModelRef;
use serde::Serialize;

/// A command the host sends pi. A new one is a variant here (its fields as pi names them).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command<'a> {
    /// Starts a run with this user message and its images; pi answers once it took it.
    Prompt {
        message: &'a str,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        images: &'a [Image<'a>],
    },
    /// Queues a steering message for the current run.
    Steer {
        message: &'a str,
    },
    /// Queues a follow-up for after the current run: pi takes it when the run would stop, in
    /// the same run (docs/protocol.md §7.25). While no run goes on, pi only queues it.
    FollowUp {
        message: &'a str,
    },
    /// Aborts the current run; pi answers once the agent is idle.
    Abort,
    /// pi's session state (`RpcSessionState`: model, isStreaming, messageCount, ...).
    GetState,
    /// The models whose provider has a credential.
    GetAvailableModels,
    SetModel {
        provider: &'a str,
        #[serde(rename = "modelId")]
        model_id: &'a str,
    },
    SetThinkingLevel {
        level: &'a str,
    },
    SetAutoCompaction {
        enabled: bool,
    },
    /// How pi delivers queued steering messages: `all` or `one-at-a-time`.
    SetSteeringMode {
        mode: &'a str,
    },
    /// How pi delivers queued follow-ups: `all` or `one-at-a-time`.
    SetFollowUpMode {
        mode: &'a str,
    },
    /// Summarises the conversation so far (aborting a run first); pi answers with the
    /// compaction's result once the summary's model request is done.
    Compact {
        #[serde(rename = "customInstructions", skip_serializing_if = "Option::is_none")]
        custom_instructions: Option<&'a str>,
    },
    /// The name pi shows for its session.
    SetSessionName {
        name: &'a str,
    },
    /// Runs a shell command in the workspace; pi answers when it ends, with its `BashResult`,
    /// and keeps it as a `bashExecution` message for the model's next request (no event).
    Bash {
        command: &'a str,
    },
    /// Aborts the running shell command (its `bash` then answers `cancelled: true`).
    AbortBash,
    /// Token, cost and message totals of pi's session, and its context-window usage.
    GetSessionStats,
    /// Writes the session as one HTML file at `outputPath`.
    ExportHtml {
        #[serde(rename = "outputPath")]
        output_path: &'a str,
    },
    /// The extension commands, prompt templates and skills a `prompt` may start with `/name`.
    GetCommands,
    /// The user messages pi can fork its session at, in order (`[{entryId, text}]`).
    GetForkMessages,
    /// Branches pi's session before the user message `entry_id`: pi writes the branch as a
    /// new session file in its session directory, switches to it, and answers that message's
    /// text.
    Fork {
        #[serde(rename = "entryId")]
        entry_id: &'a str,
    },
    /// Copies pi's whole session into a new session file and switches to it.
    Clone,
    /// The answer to an extension's dialog (pi never acknowledges it).
    ExtensionUiResponse {
        id: &'a str,
        #[serde(flatten)]
        answer: &'a UiAnswer,
    },
}

/// An image with a prompt, as pi reads it (`ImageContent`).
#[derive(Debug, Clone, Serialize)]
pub struct Image<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    data: &'a str,
    #[serde(rename = "mimeType")]
    mime_type: &'a str,
}

impl<'a> Image<'a> {
    pub fn of(image: &'a crate::methods::turn::ImageAttachment) -> Image<'a> {
        Image {
            kind: "image",
            data: &image.data,
            mime_type: &image.mime_type,
        }
    }
}

impl<'a> Command<'a> {
    pub fn set_model(model: &'a ModelRef) -> Command<'a> {
        Command::SetModel {
            provider: &model.provider,
            model_id: &model.id,
        }
    }

    /// The command's `type`, as pi names it (and refuses it: `Unknown command: X`).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Prompt { .. } => "prompt",
            Command::Steer { .. } => "steer",
            Command::FollowUp { .. } => "follow_up",
            Command::Abort => "abort",
            Command::GetState => "get_state",
            Command::GetAvailableModels => "get_available_models",
            Command::SetModel { .. } => "set_model",
            Command::SetThinkingLevel { .. } => "set_thinking_level",
            Command::SetAutoCompaction { .. } => "set_auto_compaction",
            Command::SetSteeringMode { .. } => "set_steering_mode",
            Command::SetFollowUpMode { .. } => "set_follow_up_mode",
            Command::Compact { .. } => "compact",
            Command::SetSessionName { .. } => "set_session_name",
            Command::Bash { .. } => "bash",
            Command::AbortBash => "abort_bash",
            Command::GetSessionStats => "get_session_stats",
            Command::ExportHtml { .. } => "export_html",
            Command::GetCommands => "get_commands",
            Command::GetForkMessages => "get_fork_messages",
            Command::Fork { .. } => "fork",
            Command::Clone => "clone",
            Command::ExtensionUiResponse { .. } => "extension_ui_response",
        }
    }

    /// The command as one line, `\n` included, with `id` when pi is to answer it.
    pub fn to_line(&self, id: Option<&str>) -> serde_json::Result<Vec<u8>> {
        #[derive(Serialize)]
        struct WithId<'c, 'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'c str>,
            #[serde(flatten)]
            command: &'c Command<'a>,
        }
        let mut line = serde_json::to_vec(&WithId { id, command: self })?;
        line.push(b'\n');
        Ok(line)
    }
}

/// The feature a pi command serves, by the command's name, for an agent that refuses it as
/// unknown (an older pi): CAPABILITY_UNAVAILABLE names it.
pub fn capability_of(command: &str) -> Option<Capability> {
    Some(match command {
        "prompt" => Capability::Turns,
        "follow_up" | "set_steering_mode" | "set_follow_up_mode" => Capability::FollowUps,
        "compact" => Capability::Compaction,
        "bash" | "abort_bash" => Capability::Shell,
        "get_session_stats" => Capability::Stats,
        "get_commands" => Capability::Commands,
        "export_html" => Capability::Export,
        "get_fork_messages" | "fork" | "clone" => Capability::Branches,
        _ => return None,
    })
}

/// An answer to a dialog: `confirmed` for confirm, `value` for select/input/editor, or
/// `cancelled` for any (pi then resolves confirm to false and the others to undefined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UiAnswer {
    Confirmed(bool),
    Value(String),
    Cancelled,
}

/// One field: `confirmed`, `value` or `cancelled: true`.
impl Serialize for UiAnswer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            UiAnswer::Confirmed(confirmed) => map.serialize_entry(self.name(), confirmed)?,
            UiAnswer::Value(value) => map.serialize_entry(self.name(), value)?,
            UiAnswer::Cancelled => map.serialize_entry(self.name(), &true)?,
        }
        map.end()
    }
}

impl UiAnswer {
    /// What kind of answer it is, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            UiAnswer::Confirmed(_) => "confirmed",
            UiAnswer::Value(_) => "value",
            UiAnswer::Cancelled => "cancelled",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn line(command: &Command<'_>, id: Option<&str>) -> Value {
        let bytes = command.to_line(id).unwrap();
        assert_eq!(bytes.last(), Some(&b'\n'));
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn each_command_is_written_as_pi_reads_it() {
        let model = ModelRef {
            provider: "stub".into(),
            id: "m1".into(),
        };
        let cancelled = UiAnswer::Cancelled;
        let value = UiAnswer::Value("x".into());
        let confirmed = UiAnswer::Confirmed(false);
        let png = crate::methods::turn::ImageAttachment {
            mime_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        };
        let images = [Image::of(&png)];
        for (command, expected) in [
            (
                Command::Prompt {
                    message: "see",
                    images: &images,
                },
                json!({"id": "7", "type": "prompt", "message": "see",
                       "images": [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]}),
            ),
            (
                Command::Prompt {
                    message: "hi",
                    images: &[],
                },
                json!({"id": "7", "type": "prompt", "message": "hi"}),
            ),
            (Command::Abort, json!({"id": "7", "type": "abort"})),
            (
                Command::GetForkMessages,
                json!({"id": "7", "type": "get_fork_messages"}),
            ),
            (
                Command::Fork { entry_id: "ab12" },
                json!({"id": "7", "type": "fork", "entryId": "ab12"}),
            ),
            (Command::Clone, json!({"id": "7", "type": "clone"})),
            (Command::GetState, json!({"id": "7", "type": "get_state"})),
            (
                Command::set_model(&model),
                json!({"id": "7", "type": "set_model", "provider": "stub", "modelId": "m1"}),
            ),
            (
                Command::SetAutoCompaction { enabled: true },
                json!({"id": "7", "type": "set_auto_compaction", "enabled": true}),
            ),
            (
                Command::FollowUp { message: "then" },
                json!({"id": "7", "type": "follow_up", "message": "then"}),
            ),
            (
                Command::SetSteeringMode { mode: "all" },
                json!({"id": "7", "type": "set_steering_mode", "mode": "all"}),
            ),
            (
                Command::SetFollowUpMode {
                    mode: "one-at-a-time",
                },
                json!({"id": "7", "type": "set_follow_up_mode", "mode": "one-at-a-time"}),
            ),
            (
                Command::Compact {
                    custom_instructions: None,
                },
                json!({"id": "7", "type": "compact"}),
            ),
            (
                Command::Compact {
                    custom_instructions: Some("keep the paths"),
                },
                json!({"id": "7", "type": "compact", "customInstructions": "keep the paths"}),
            ),
            (
                Command::Bash { command: "ls" },
                json!({"id": "7", "type": "bash", "command": "ls"}),
            ),
            (Command::AbortBash, json!({"id": "7", "type": "abort_bash"})),
            (
                Command::GetSessionStats,
                json!({"id": "7", "type": "get_session_stats"}),
            ),
            (
                Command::ExportHtml {
                    output_path: "/d/x.html",
                },
                json!({"id": "7", "type": "export_html", "outputPath": "/d/x.html"}),
            ),
            (
                Command::GetCommands,
                json!({"id": "7", "type": "get_commands"}),
            ),
        ] {
            assert_eq!(line(&command, Some("7")), expected);
            assert_eq!(expected["type"], command.name());
        }
        for (answer, expected) in [
            (
                &cancelled,
                json!({"type": "extension_ui_response", "id": "d1", "cancelled": true}),
            ),
            (
                &value,
                json!({"type": "extension_ui_response", "id": "d1", "value": "x"}),
            ),
            (
                &confirmed,
                json!({"type": "extension_ui_response", "id": "d1", "confirmed": false}),
            ),
        ] {
            let command = Command::ExtensionUiResponse { id: "d1", answer };
            assert_eq!(line(&command, None), expected);
            assert_eq!(command.name(), "extension_ui_response");
        }
    }
}
