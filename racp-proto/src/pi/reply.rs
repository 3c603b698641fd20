//! What pi says back: a command's `response`, an extension's dialog or notice
//! (`extension_ui_request`), the wording of its refusals, and the models its answers name.

use super::Kind;
use super::line::Line;
use crate::methods::model::ModelRef;
use crate::methods::session::{
    AgentCommand, ContextStats, ContextUsage, SessionBashResult, TokenTotals,
};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// A `response` line: `{"type": "response", "command", "success", "error"?, "data"?, "id"?}`.
#[derive(Debug, Clone)]
pub struct Response {
    /// The command's id as given (pi echoes it; a number is taken as its digits). pi refuses a
    /// command it does not know without one.
    pub id: Option<String>,
    pub command: String,
    pub success: bool,
    pub error: Option<String>,
    /// The response's `data` (`Null` when it has none).
    pub data: Value,
}

impl Response {
    /// The response a `response` line carries; `None` for any other line.
    pub fn of(line: &Line<'_>) -> Option<Response> {
        if line.kind != Kind::Response {
            return None;
        }
        // pi echoes the command's id as given; ours are strings, but accept numbers too.
        let id = match line.field::<Value>("id") {
            Some(Value::String(id)) => Some(id),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        Some(Response {
            id,
            command: line.field("command").unwrap_or_default(),
            success: line.field("success") == Some(true),
            error: line.field("error"),
            data: line.field("data").unwrap_or(Value::Null),
        })
    }

    /// pi refused a command it does not know (an older pi, or another agent).
    pub fn is_unknown_command(message: &str) -> bool {
        message.starts_with("Unknown command")
    }

    /// pi refused a prompt because a run is going on.
    pub fn is_busy(command: &str, message: &str) -> bool {
        command == "prompt" && message.starts_with("Agent is already processing")
    }

    /// pi refused a compaction because there is nothing to summarise: the conversation is too
    /// short, or it was just compacted (or an extension cancelled it).
    pub fn is_nothing_to_compact(command: &str, message: &str) -> bool {
        command == "compact"
            && (message.starts_with("Nothing to compact")
                || message.starts_with("Already compacted")
                || message.starts_with("Compaction cancelled"))
    }
    /// pi refused `export_html` because its session has no file yet (nothing was said).
    pub fn is_nothing_to_export(command: &str, message: &str) -> bool {
        command == "export_html" && message.starts_with("Nothing to export yet")
    }
}

/// `bash`'s data (pi's `BashResult`); its `fullOutputPath`, a file on the host, is not read.
///
/// `truncated` is true whenever pi cut the output, whether it says so or not: pi keeps a
/// rolling buffer of the output's last 100 KB and drops whole chunks from its start without
/// saying so, so a long output with no newline can end as one chunk under pi's own 50 KB
/// bound with `truncated: false`. pi names a full output file only for an output past that
/// bound, so that file means the output was cut (docs/protocol.md §7.27).
pub fn bash_result(data: &Value) -> SessionBashResult {
    let saved_whole = data
        .get("fullOutputPath")
        .and_then(Value::as_str)
        .is_some_and(|path| !path.is_empty());
    SessionBashResult {
        output: data
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        exit_code: data.get("exitCode").and_then(Value::as_i64),
        cancelled: data.get("cancelled").and_then(Value::as_bool) == Some(true),
        truncated: data.get("truncated").and_then(Value::as_bool) == Some(true) || saved_whole,
    }
}

/// `get_session_stats`'s `contextUsage` (absent when pi's model has no context window).
pub fn context_usage(stats: &Value) -> Option<ContextUsage> {
    let usage = stats.get("contextUsage")?;
    Some(ContextUsage {
        tokens: usage
            .get("tokens")
            .and_then(Value::as_f64)
            .map(|t| t.max(0.0).round() as u64),
        context_window: usage.get("contextWindow")?.as_u64()?,
        percent: usage.get("percent").and_then(Value::as_f64),
    })
}

/// `get_session_stats`'s counts of the messages in pi's context (`userMessages`,
/// `assistantMessages`, `toolCalls`, `toolResults`, `totalMessages`, `tokens`, `cost`); `None`
/// when the answer has none of them.
pub fn context_stats(stats: &Value) -> Option<ContextStats> {
    let count = |value: &Value, key: &str| -> Option<u64> {
        let n = value.get(key)?.as_f64()?;
        Some(if n.is_finite() && n > 0.0 {
            n.round() as u64
        } else {
            0
        })
    };
    let tokens = stats.get("tokens")?;
    let tokens = TokenTotals {
        input: count(tokens, "input")?,
        output: count(tokens, "output")?,
        cache_read: count(tokens, "cacheRead")?,
        cache_write: count(tokens, "cacheWrite")?,
        total: count(tokens, "total")?,
    };
    Some(ContextStats {
        user_messages: count(stats, "userMessages")?,
        assistant_messages: count(stats, "assistantMessages")?,
        tool_calls: count(stats, "toolCalls")?,
        tool_results: count(stats, "toolResults")?,
        total_messages: count(stats, "totalMessages")?,
        tokens,
        cost: stats
            .get("cost")
            .and_then(Value::as_f64)
            .filter(|c| c.is_finite())?,
    })
}

/// `get_commands`'s `data.commands`: each with `name`, `description`, `source` and where it
/// was loaded from (`sourceInfo.scope` in pi 0.73, `location` in its docs).
pub fn commands(data: &Value) -> Vec<AgentCommand> {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    data.get("commands")
        .and_then(Value::as_array)
        .map(|commands| {
            commands
                .iter()
                .filter_map(|c| {
                    Some(AgentCommand {
                        name: text(c, "name")?,
                        description: text(c, "description").filter(|d| !d.is_empty()),
                        source: text(c, "source").unwrap_or_default(),
                        location: text(c, "location")
                            .or_else(|| c.get("sourceInfo").and_then(|s| text(s, "scope"))),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The dialog methods of pi's extension UI protocol: each needs an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UiMethod {
    Confirm,
    Select,
    Input,
    Editor,
}

impl UiMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            UiMethod::Confirm => "confirm",
            UiMethod::Select => "select",
            UiMethod::Input => "input",
            UiMethod::Editor => "editor",
        }
    }

    pub fn from_wire(method: &str) -> Option<UiMethod> {
        [
            UiMethod::Confirm,
            UiMethod::Select,
            UiMethod::Input,
            UiMethod::Editor,
        ]
        .into_iter()
        .find(|m| m.as_str() == method)
    }
}

/// An extension's dialog (confirm/select/input/editor), answered with the same `id`.
/// `message` is confirm's; select has `options`. `timeout_ms` when the extension gave one: pi
/// then resolves the dialog by itself (false/undefined) when it passes.
#[derive(Debug, Clone, PartialEq)]
pub struct Dialog {
    pub id: String,
    pub method: UiMethod,
    pub title: String,
    pub message: Option<String>,
    pub options: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
    /// An `editor` dialog's prefilled text (pi-host's policy request carries its call here).
    pub prefill: Option<String>,
}

/// An `extension_ui_request`: a dialog waiting for its answer, or a fire-and-forget notice.
#[derive(Debug, Clone, PartialEq)]
pub enum UiRequest {
    Dialog(Dialog),
    /// notify, setStatus, setWidget, setTitle, set_editor_text, ...: no answer.
    Notice {
        method: String,
    },
    /// A dialog without an id: nobody can answer it.
    Unanswerable,
}

impl UiRequest {
    /// The request an `extension_ui_request` line carries; `None` for any other line.
    pub fn of(line: &Line<'_>) -> Option<UiRequest> {
        if line.kind != Kind::ExtensionUiRequest {
            return None;
        }
        let method_name: String = line.field("method").unwrap_or_default();
        let Some(method) = UiMethod::from_wire(&method_name) else {
            return Some(UiRequest::Notice {
                method: method_name,
            });
        };
        let Some(id) = line.field::<String>("id").filter(|id| !id.is_empty()) else {
            return Some(UiRequest::Unanswerable);
        };
        let timeout_ms = line.field::<Value>("timeout").and_then(|t| {
            t.as_u64().or_else(|| {
                t.as_f64()
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                    .map(|ms| ms.ceil() as u64)
            })
        });
        Some(UiRequest::Dialog(Dialog {
            id,
            method,
            title: line.field("title").unwrap_or_default(),
            // pi reads `message` as confirm's text; the line's top-level `message` is it.
            message: line.message_text(),
            options: line.fields.get("options").and_then(|o| dialog_options(o)),
            timeout_ms,
            prefill: line.field("prefill"),
        }))
    }

    /// The text of a `notify` notice (an extension's message to the client), given the line.
    pub fn notify_message(payload: &RawValue) -> Option<String> {
        #[derive(Deserialize)]
        struct Notice {
            method: Option<String>,
            message: Option<String>,
        }
        let notice = serde_json::from_str::<Notice>(payload.get()).ok()?;
        (notice.method.as_deref() == Some("notify")).then_some(notice.message?)
    }
}

/// A dialog's choices as text: strings decoded, anything else as the JSON the agent wrote
/// (read from the line, so numbers keep their spelling: docs/protocol.md §1, "Numbers").
fn dialog_options(options: &RawValue) -> Option<Vec<String>> {
    let items = serde_json::from_str::<Vec<&RawValue>>(options.get()).ok()?;
    Some(
        items
            .into_iter()
            .map(|item| {
                serde_json::from_str::<String>(item.get()).unwrap_or_else(|_| item.get().into())
            })
            .collect(),
    )
}

/// A model as pi's responses name it (`get_state`'s `model`, `get_available_models`'s items):
/// a full Model object of which the host reads `provider` and `id`.
pub fn model_ref(model: &Value) -> Option<ModelRef> {
    Some(ModelRef {
        provider: model.get("provider")?.as_str()?.to_string(),
        id: model.get("id")?.as_str()?.to_string(),
    })
}

/// The model of `get_state`'s data.
pub fn current_model(state: &Value) -> Option<ModelRef> {
    state.get("model").and_then(model_ref)
}

/// `get_available_models`'s `data.models`.
pub fn available_models(data: &Value) -> Vec<ModelRef> {
    data.get("models")
        .and_then(Value::as_array)
        .map(|models| models.iter().filter_map(model_ref).collect())
        .unwrap_or_default()
}

/// A user message pi can fork its session at (`get_fork_messages`'s items).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkMessage {
    pub entry_id: String,
    pub text: String,
}

/// `get_fork_messages`'s `data.messages`, in pi's order (the session file's).
pub fn fork_messages(data: &Value) -> Vec<ForkMessage> {
    data.get("messages")
        .cloned()
        .and_then(|messages| serde_json::from_value(messages).ok())
        .unwrap_or_default()
}

/// The session file of `get_state`'s data: absent when pi saves no session (`--no-session`)
/// or an agent that is not pi.
pub fn session_file(state: &Value) -> Option<String> {
    state
        .get("sessionFile")
        .and_then(Value::as_str)
        .filter(|file| !file.is_empty())
        .map(str::to_string)
}

/// What `fork` and `clone` answer: whether an extension cancelled them, and for `fork` the
/// forked message's text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Branched {
    #[serde(default)]
    pub cancelled: bool,
    #[serde(default)]
    pub text: Option<String>,
}

impl Branched {
    pub fn of(data: &Value) -> Branched {
        serde_json::from_value(data.clone()).unwrap_or_default()
    }
}

/// The text of a user message as pi's fork list shows it: a string content, or its text parts
/// joined (images left out).
pub fn user_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn command_replies_are_read_as_pi_writes_them() {
        let bash = bash_result(&json!({"output": "hi\n", "exitCode": 0, "cancelled": false,
            "truncated": true, "fullOutputPath": "/tmp/pi-bash-1.log"}));
        assert_eq!(
            (bash.output.as_str(), bash.exit_code, bash.truncated),
            ("hi\n", Some(0), true)
        );
        assert_eq!(
            bash_result(&json!({"output": "", "cancelled": true})).exit_code,
            None
        );
        // pi's rolling buffer dropped the start without a word: its full output file says so.
        let cut = bash_result(&json!({"output": "bbb", "exitCode": 0, "truncated": false,
            "fullOutputPath": "/tmp/pi-bash-2.log"}));
        assert!(cut.truncated);
        assert!(!bash_result(&json!({"output": "b", "truncated": false})).truncated);
        let counted = context_stats(&json!({"userMessages": 6, "assistantMessages": 6,
            "toolCalls": 1, "toolResults": 1, "totalMessages": 14, "cost": 0.5,
            "tokens": {"input": 60, "output": 20, "cacheRead": 10, "cacheWrite": 0, "total": 90}}))
        .unwrap();
        assert_eq!(
            (
                counted.user_messages,
                counted.total_messages,
                counted.tokens.total
            ),
            (6, 14, 90)
        );
        assert!(context_stats(&json!({"userMessages": 6})).is_none());
        let usage = context_usage(
            &json!({"contextUsage": {"tokens": null, "contextWindow": 1000, "percent": null}}),
        );
        assert_eq!(
            usage.map(|u| (u.tokens, u.context_window)),
            Some((None, 1000))
        );
        let listed = commands(&json!({"commands": [
            {"name": "review", "description": "Review", "source": "prompt", "sourceInfo": {"scope": "project"}},
            {"name": "skill:x", "source": "skill", "location": "user"},
            {"description": "nameless"}]}));
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].location.as_deref(), Some("project"));
        assert_eq!(listed[1].location.as_deref(), Some("user"));
        assert!(Response::is_nothing_to_export(
            "export_html",
            "Nothing to export yet - start a conversation first"
        ));
    }

    #[test]
    fn fork_and_clone_answers_are_read_as_pi_writes_them() {
        let listed = json!({"messages": [
            {"entryId": "a1", "text": "First"},
            {"entryId": "b2", "text": "Second"},
        ]});
        let messages = fork_messages(&listed);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1].entry_id, "b2");
        assert_eq!(messages[1].text, "Second");
        assert!(fork_messages(&json!({"messages": "no"})).is_empty());

        let state = json!({"sessionFile": "/d/2026_x.jsonl", "sessionId": "x"});
        assert_eq!(session_file(&state).as_deref(), Some("/d/2026_x.jsonl"));
        assert_eq!(session_file(&json!({"sessionId": "x"})), None);

        let forked = Branched::of(&json!({"text": "Second", "cancelled": false}));
        assert_eq!(forked.text.as_deref(), Some("Second"));
        assert!(!forked.cancelled);
        assert!(Branched::of(&json!({"cancelled": true})).cancelled);
    }

    #[test]
    fn a_user_messages_text_is_its_text_parts_joined() {
        let parts = json!({"role": "user", "content": [
            {"type": "text", "text": "see "},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "text", "text": "this"},
        ]});
        assert_eq!(user_text(&parts), "see this");
        assert_eq!(user_text(&json!({"content": "plain"})), "plain");
        assert_eq!(user_text(&json!({"role": "user"})), "");
    }
}
