//! What a client reads of a relayed agent event: the text a `message_update` adds, and a
//! tool's run as `tool_execution_start` and `tool_execution_end` describe it.

use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// The text a `message_update` adds to the reply (a `text_delta` step), if any; thinking and
/// tool-call argument deltas are not reply text.
pub fn text_delta(data: &str) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Update<'a> {
        #[serde(borrow, rename = "assistantMessageEvent")]
        step: Step<'a>,
    }
    #[derive(Deserialize)]
    struct Step<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
        #[serde(borrow, default)]
        delta: Option<Cow<'a, str>>,
    }
    let update = serde_json::from_str::<Update<'_>>(data).ok()?;
    (update.step.kind == "text_delta").then_some(update.step.delta?)
}

/// A tool's run: `tool_execution_start` gives its name and arguments, `tool_execution_end` its
/// result and whether it failed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRun {
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub args: Value,
    #[serde(default)]
    pub result: Value,
    #[serde(default)]
    pub is_error: bool,
}

impl ToolRun {
    pub fn read(data: &str) -> ToolRun {
        serde_json::from_str(data).unwrap_or_default()
    }

    /// The texts of a tool result's content blocks (pi's `{"content": [{"type": "text",
    /// "text"}]}`).
    pub fn result_texts(&self) -> Vec<&str> {
        self.result["content"]
            .as_array()
            .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect())
            .unwrap_or_default()
    }
}

/// What pi's file tools say about the file they change (docs/protocol.md §8.9): a
/// `tool_execution_start` of `write` or `edit` names the file, a `tool_execution_end` of `edit`
/// carries its diff (`details.diff`: lines `+N text` added, `-N text` removed, ` N text`
/// context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileTool {
    /// `write`: the file and how many lines it writes.
    Write {
        call_id: String,
        path: String,
        lines: u64,
    },
    /// `edit`: the file.
    Edit { call_id: String, path: String },
    /// The end of a tool call: whether it failed, and an edit's diff's added and removed lines.
    End {
        call_id: String,
        failed: bool,
        counts: Option<(u64, u64)>,
    },
}

impl FileTool {
    /// The file-tool fact in a `tool_execution_start` or `tool_execution_end` payload, if any.
    pub fn read(kind: &super::Kind, data: &str) -> Option<FileTool> {
        let call = serde_json::from_str::<Value>(data).ok()?;
        let call_id = call.get("toolCallId")?.as_str()?.to_string();
        match kind {
            super::Kind::ToolExecutionStart => {
                let args = call.get("args")?;
                let path = args
                    .get("path")
                    .or_else(|| args.get("file_path"))?
                    .as_str()?
                    .to_string();
                match call.get("toolName")?.as_str()? {
                    "write" => {
                        let content = args.get("content").and_then(Value::as_str).unwrap_or("");
                        Some(FileTool::Write {
                            call_id,
                            path,
                            lines: line_count(content),
                        })
                    }
                    "edit" => Some(FileTool::Edit { call_id, path }),
                    _ => None,
                }
            }
            super::Kind::ToolExecutionEnd => {
                let failed = call
                    .get("isError")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let counts = call
                    .pointer("/result/details/diff")
                    .and_then(Value::as_str)
                    .map(diff_counts);
                Some(FileTool::End {
                    call_id,
                    failed,
                    counts,
                })
            }
            _ => None,
        }
    }
}

/// Lines of a text as git counts them: a last line without its newline counts.
fn line_count(text: &str) -> u64 {
    let newlines = text.bytes().filter(|b| *b == b'\n').count() as u64;
    newlines + u64::from(!text.is_empty() && !text.ends_with('\n'))
}

/// Added and removed lines of the edit tool's diff.
fn diff_counts(diff: &str) -> (u64, u64) {
    diff.lines().fold((0, 0), |(added, removed), line| {
        match line.as_bytes().first() {
            Some(b'+') => (added + 1, removed),
            Some(b'-') => (added, removed + 1),
            _ => (added, removed),
        }
    })
}

/// The text of a `message_end`'s message when it is a user message (a string content, or its
/// text parts joined, as pi's fork list shows it); `None` for any other message.
pub fn user_message_text(message_end: &str) -> Option<String> {
    let data: Value = serde_json::from_str(message_end).ok()?;
    let message = data.get("message")?;
    (message.get("role").and_then(Value::as_str) == Some("user"))
        .then(|| super::reply::user_text(message))
}

/// pi's `queue_update`: the steering messages it holds, in the order it will deliver them.
/// (Its follow-ups are the host's to hold: pi's own stay empty.) `None` for a payload of
/// another shape.
pub fn steering_queue(data: &str) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct QueueUpdate {
        #[serde(default)]
        steering: Vec<String>,
    }
    serde_json::from_str::<QueueUpdate>(data)
        .ok()
        .map(|queue| queue.steering)
}

#[cfg(test)]
mod queue_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_user_messages_text_is_read_from_its_message_end() {
        let parts = r#"{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"fix "},{"type":"image","data":"x"},{"type":"text","text":"it"}]}}"#;
        assert_eq!(user_message_text(parts).as_deref(), Some("fix it"));
        let plain = r#"{"type":"message_end","message":{"role":"user","content":"go"}}"#;
        assert_eq!(user_message_text(plain).as_deref(), Some("go"));
        let reply = r#"{"type":"message_end","message":{"role":"assistant","content":"go"}}"#;
        assert_eq!(user_message_text(reply), None);
        assert_eq!(user_message_text("{}"), None);
    }

    #[test]
    fn file_tools_name_their_file_and_an_edit_its_counts() {
        use super::super::Kind;
        let write = r#"{"type":"tool_execution_start","toolCallId":"c1","toolName":"write","args":{"path":"a.txt","content":"x\ny\nz"}}"#;
        assert_eq!(
            FileTool::read(&Kind::ToolExecutionStart, write),
            Some(FileTool::Write {
                call_id: "c1".into(),
                path: "a.txt".into(),
                lines: 3
            })
        );
        let read = r#"{"type":"tool_execution_start","toolCallId":"c2","toolName":"read","args":{"path":"a.txt"}}"#;
        assert_eq!(FileTool::read(&Kind::ToolExecutionStart, read), None);
        let end = r#"{"type":"tool_execution_end","toolCallId":"c3","toolName":"edit","result":{"details":{"diff":"  1 a\n-2 b\n+2 B\n+3 C\n    ..."}},"isError":false}"#;
        assert_eq!(
            FileTool::read(&Kind::ToolExecutionEnd, end),
            Some(FileTool::End {
                call_id: "c3".into(),
                failed: false,
                counts: Some((2, 1))
            })
        );
        assert_eq!(line_count(""), 0);
        assert_eq!(line_count("a\n"), 1);
    }

    #[test]
    fn a_queue_update_reads_as_its_steering_messages() {
        let data = r#"{"type":"queue_update","steering":["s","t"],"followUp":["a"]}"#;
        assert_eq!(steering_queue(data).unwrap(), ["s", "t"]);
        assert_eq!(
            steering_queue(r#"{"type":"queue_update"}"#).unwrap(),
            [""; 0]
        );
        assert_eq!(steering_queue("[1]"), None);
    }
}
