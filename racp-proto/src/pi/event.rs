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

/// pi's `queue_update`: the steering messages and follow-ups it holds, each in the order it
/// will deliver them. `None` for a payload of another shape.
pub fn queue_update(data: &str) -> Option<crate::methods::session::Queue> {
    serde_json::from_str(data).ok()
}

/// The text pi took from a queue between two `queue_update`s: pi removes one message (the first
/// with that text) as it delivers it. `None` when nothing was removed.
pub fn taken_from(before: &[String], after: &[String]) -> Option<String> {
    if after.len() >= before.len() {
        return None;
    }
    let at = before
        .iter()
        .zip(after)
        .position(|(b, a)| b != a)
        .unwrap_or(after.len());
    before.get(at).cloned()
}

#[cfg(test)]
mod queue_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_queue_update_reads_as_the_queue_and_names_what_was_taken() {
        let queue =
            queue_update(r#"{"type":"queue_update","steering":["s"],"followUp":["a","b","a"]}"#)
                .unwrap();
        assert_eq!(queue.steering, ["s"]);
        assert_eq!(queue.follow_up, ["a", "b", "a"]);
        let before = queue.follow_up;
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            taken_from(&before, &owned(&["b", "a"])).as_deref(),
            Some("a")
        );
        assert_eq!(
            taken_from(&before, &owned(&["a", "a"])).as_deref(),
            Some("b")
        );
        assert_eq!(
            taken_from(&before, &owned(&["a", "b"])).as_deref(),
            Some("a")
        );
        assert_eq!(taken_from(&before, &before), None);
        assert_eq!(taken_from(&[], &owned(&["x"])), None);
    }
}
