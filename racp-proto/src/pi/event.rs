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
