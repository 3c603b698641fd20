//! Rebuilding what the agent streams from compact events (docs/protocol.md §8.1, "Compact
//! streams"): the assistant message in progress from `agent.message_update` deltas, and each
//! running tool's output from `agent.tool_execution_update` appends.
//!
//! pi writes every update with everything streamed so far; the host relays only what is new,
//! so a reply costs bytes linear in its length. [`StreamState`] applies those events in order
//! and holds the same message and tool outputs pi held at that point. The host keeps one per
//! session for `session/get`'s snapshot; clients keep one per subscription.

use super::Kind;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The fields of a compact `message_update` the rebuild reads, borrowed from its text.
#[derive(serde::Deserialize)]
struct UpdateRef<'a> {
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, rename = "assistantMessageEvent")]
    step: StepRef<'a>,
}

#[derive(serde::Deserialize)]
struct StepRef<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(rename = "contentIndex", default)]
    content_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    block: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial: Option<&'a RawValue>,
}

/// The field of a content block that its deltas extend.
fn streamed_field(block_type: &str) -> Option<&'static str> {
    match block_type {
        "text" => Some("text"),
        "thinking" => Some("thinking"),
        "toolCall" => Some("partialArgs"),
        _ => None,
    }
}

/// What the agent is streaming in one session, rebuilt from its events.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StreamState {
    /// The assistant message being streamed, as pi holds it (between `message_start` and
    /// `message_end`).
    message: Option<Value>,
    /// The output of each running tool so far, by tool call id, as pi's `partialResult`.
    tool_outputs: BTreeMap<String, Value>,
    finished: Option<Value>,
}

impl StreamState {
    /// The state a snapshot describes (`session/get`), to continue from its cursor.
    pub fn from_snapshot(snapshot: &crate::methods::session::Snapshot) -> StreamState {
        StreamState::resumed(
            snapshot.streaming_message.clone(),
            snapshot.tool_outputs.clone(),
        )
    }

    /// The state with this message and these tool outputs in progress (a snapshot's or
    /// `session/stream`'s), to continue from their cursor.
    pub fn resumed(message: Option<Value>, tool_outputs: BTreeMap<String, Value>) -> StreamState {
        StreamState {
            message,
            tool_outputs,
            finished: None,
        }
    }

    /// The running tools' outputs so far, by tool call id.
    pub fn tool_outputs(&self) -> &BTreeMap<String, Value> {
        &self.tool_outputs
    }

    /// The last message `message_end` finished, as rebuilt just before it (pi's own copy is
    /// in that event: the two are equal).
    pub fn finished_message(&self) -> Option<&Value> {
        self.finished.as_ref()
    }

    /// Forgets what was streaming: a turn that ended ends its streams.
    pub fn clear(&mut self) {
        self.message = None;
        self.tool_outputs.clear();
    }

    /// The assistant message in progress, if one is streaming.
    pub fn message(&self) -> Option<&Value> {
        self.message.as_ref()
    }

    /// The output so far of a running tool (pi's `partialResult` shape).
    pub fn tool_output(&self, tool_call_id: &str) -> Option<&Value> {
        self.tool_outputs.get(tool_call_id)
    }

    /// Applies one event, given its wire type (`agent.message_update`, ...) and `data`. Events
    /// that stream nothing are ignored; so is anything malformed (the state is a view, never a
    /// reason to refuse an event).
    pub fn apply(&mut self, event_type: &str, data: &Value) {
        if let Some(kind) = Kind::of_event_type(event_type) {
            self.apply_agent(&kind, data);
        }
    }

    /// [`StreamState::apply`] for an event as received, reading its data only when the event
    /// streams. (An integer beyond 64 bits inside a streamed block is held as the nearest
    /// double here; the event itself keeps it exactly.)
    pub fn apply_event(&mut self, event: &crate::events::Event) {
        if event.kind == crate::events::EventType::TurnFinished.as_str() {
            // Rule 8: a turn that ended ends its streams, even one its agent died in.
            self.clear();
        } else if let Some(kind) = Kind::of_event_type(&event.kind) {
            self.apply_agent_text(&kind, event.data.get());
        }
    }

    /// [`StreamState::apply_agent`] for an agent event's data as JSON text. A delta, the event
    /// that comes most, is read into borrowed fields without building a `Value`.
    pub fn apply_agent_text(&mut self, kind: &Kind, data: &str) {
        match kind {
            // The rule reads an update's `contentIndex`, `partial` and `message` only: without
            // them it changes nothing, and is not parsed.
            Kind::MessageUpdate
                if !["\"contentIndex\"", "\"partial\"", "\"message\""]
                    .iter()
                    .any(|field| data.contains(field)) => {}
            Kind::MessageUpdate => {
                if let Ok(update) = serde_json::from_str::<UpdateRef<'_>>(data) {
                    self.apply_message_update(update);
                }
            }
            // The state reads nothing of `message_end`: do not parse a whole reply.
            Kind::MessageEnd => self.apply_agent(kind, &Value::Null),
            _ if kind.streams() => {
                if let Ok(data) = serde_json::from_str::<Value>(data) {
                    self.apply_agent(kind, &data);
                }
            }
            _ => {}
        }
    }

    /// [`StreamState::apply`] for an agent event given by its kind.
    pub fn apply_agent(&mut self, kind: &Kind, data: &Value) {
        match kind {
            Kind::MessageStart => {
                let message = &data["message"];
                if message["role"] == "assistant" {
                    self.message = Some(message.clone());
                }
            }
            Kind::MessageUpdate => self.apply_agent_text(kind, &data.to_string()),
            Kind::MessageEnd => {
                if let Some(message) = self.message.take() {
                    self.finished = Some(message);
                }
            }
            Kind::ToolExecutionUpdate => self.apply_tool_update(data),
            Kind::ToolExecutionEnd => {
                if let Some(id) = data["toolCallId"].as_str() {
                    self.tool_outputs.remove(id);
                }
            }
            _ => {}
        }
    }

    fn apply_message_update(&mut self, update: UpdateRef<'_>) {
        let step = update.step;
        let parse =
            |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok());
        if step.kind == "start" {
            if let Some(partial) = parse(step.partial) {
                self.message = Some(partial);
            }
            return;
        }
        let Some(message) = self.message.as_mut() else {
            return;
        };
        // The update's `message` holds the message's fields that changed, never its content.
        if let (Some(target), Some(Value::Object(fields))) =
            (message.as_object_mut(), parse(update.message))
        {
            for (name, value) in fields {
                if name != "content" {
                    target.insert(name, value);
                }
            }
        }
        // pi's own full partial (an update the host did not compact) is authoritative.
        if let Some(partial) = parse(step.partial) {
            *message = partial;
            return;
        }
        let (Some(index), Some(content)) = (
            step.content_index.and_then(|i| usize::try_from(i).ok()),
            message.get_mut("content").and_then(Value::as_array_mut),
        ) else {
            return;
        };
        let kind = step.kind.as_ref();
        if kind.ends_with("_start") {
            if let Some(mut block) = parse(step.block) {
                if content.len() <= index {
                    content.resize(index + 1, Value::Null);
                }
                // The deltas carry the streamed field from its start.
                if let (Some(field), Some(object)) = (
                    block["type"].as_str().and_then(streamed_field),
                    block.as_object_mut(),
                ) {
                    object.insert(field.into(), Value::String(String::new()));
                }
                content[index] = block;
            }
        } else if kind.ends_with("_delta") {
            if let (Some(block), Some(delta)) = (content.get_mut(index), step.delta.as_deref()) {
                extend_streamed(block, delta);
            }
        } else if kind.ends_with("_end")
            && let Some(block) = content.get_mut(index)
        {
            end_block(block, parse(step.block).as_ref());
        }
    }

    fn apply_tool_update(&mut self, data: &Value) {
        let Some(id) = data["toolCallId"].as_str() else {
            return;
        };
        if let Some(whole) = data.get("partialResult") {
            self.tool_outputs.insert(id.to_owned(), whole.clone());
            return;
        }
        let update = &data["outputUpdate"];
        let Some(append) = update["append"].as_str() else {
            return;
        };
        let drop_lines = update["dropLines"].as_u64().unwrap_or(0);
        let previous = self
            .tool_outputs
            .get(id)
            .and_then(single_text)
            .unwrap_or_default();
        let kept = skip_lines(previous, drop_lines);
        let mut text = String::with_capacity(kept.len() + append.len());
        text.push_str(kept);
        text.push_str(append);
        let mut output = Map::new();
        output.insert(
            "content".into(),
            serde_json::json!([{"type": "text", "text": text}]),
        );
        if let Some(details) = data.get("details") {
            output.insert("details".into(), details.clone());
        }
        self.tool_outputs
            .insert(id.to_owned(), Value::Object(output));
    }
}

/// Adds a delta to the block's streamed field.
fn extend_streamed(block: &mut Value, delta: &str) {
    let Some(field) = block["type"].as_str().and_then(streamed_field) else {
        return;
    };
    let Some(object) = block.as_object_mut() else {
        return;
    };
    match object.get_mut(field) {
        Some(Value::String(text)) => text.push_str(delta),
        _ => {
            object.insert(field.into(), Value::String(delta.to_owned()));
        }
    }
}

/// A block ends: the fields the host sent override; a tool call's arguments are its streamed
/// argument text, parsed, unless the host sent pi's own (when they differ from that text).
fn end_block(block: &mut Value, end: Option<&Value>) {
    let Some(object) = block.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(fields)) = end {
        for (name, value) in fields {
            object.insert(name.clone(), value.clone());
        }
    }
    if object.get("type").and_then(Value::as_str) == Some("toolCall") {
        let streamed = object.remove("partialArgs");
        if !matches!(end, Some(Value::Object(fields)) if fields.contains_key("arguments"))
            && let Some(Value::String(text)) = streamed
            && let Ok(arguments) = serde_json::from_str::<Value>(&text)
        {
            object.insert("arguments".into(), arguments);
        }
    }
}

/// The text of a tool result whose content is exactly one text block: the only shape whose
/// updates the host sends as appends.
pub fn single_text(result: &Value) -> Option<&str> {
    match result.get("content")?.as_array()?.as_slice() {
        [block] if block["type"] == "text" => block["text"].as_str(),
        _ => None,
    }
}

/// `text` without its first `lines` lines (each up to and including its `\n`).
pub fn skip_lines(text: &str, lines: u64) -> &str {
    let mut rest = text;
    for _ in 0..lines {
        match rest.find('\n') {
            Some(end) => rest = &rest[end + 1..],
            None => return "",
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(step: Value) -> Value {
        json!({"type": "message_update", "message": {"role": "assistant", "timestamp": 1}, "assistantMessageEvent": step})
    }

    #[test]
    fn a_message_is_rebuilt_from_blocks_and_deltas() {
        let mut state = StreamState::default();
        let skeleton = json!({"role": "assistant", "content": [], "model": "m", "timestamp": 1});
        state.apply("agent.message_start", &json!({"message": skeleton}));
        let steps = [
            json!({"type": "start", "partial": skeleton}),
            json!({"type": "thinking_start", "contentIndex": 0, "block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "thinking_delta", "contentIndex": 0, "delta": "hmm"}),
            json!({"type": "thinking_end", "contentIndex": 0, "block": {"type": "thinking", "thinkingSignature": "sig"}}),
            json!({"type": "text_start", "contentIndex": 1, "block": {"type": "text", "text": ""}}),
            json!({"type": "text_delta", "contentIndex": 1, "delta": "Hel"}),
            json!({"type": "text_delta", "contentIndex": 1, "delta": "lo\n"}),
            json!({"type": "text_end", "contentIndex": 1, "block": {"type": "text"}}),
            json!({"type": "toolcall_start", "contentIndex": 2, "block": {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {}, "partialArgs": ""}}),
            json!({"type": "toolcall_delta", "contentIndex": 2, "delta": "{\"command\":"}),
            json!({"type": "toolcall_delta", "contentIndex": 2, "delta": "\"ls\"}"}),
        ];
        for step in steps {
            state.apply("agent.message_update", &update(step));
        }
        assert_eq!(
            state.message().unwrap()["content"][2]["partialArgs"],
            "{\"command\":\"ls\"}"
        );
        state.apply(
            "agent.message_update",
            &update(json!({"type": "toolcall_end", "contentIndex": 2, "block": {"type": "toolCall", "id": "c1", "name": "bash"}})),
        );
        state.apply("agent.message_end", &json!({}));
        let rebuilt = state
            .finished_message()
            .expect("message_end finishes the message");
        assert_eq!(
            rebuilt["content"],
            json!([
                {"type": "thinking", "thinking": "hmm", "thinkingSignature": "sig"},
                {"type": "text", "text": "Hello\n"},
                {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}},
            ])
        );
        assert!(state.message().is_none());
    }

    #[test]
    fn fields_sent_at_the_end_override_the_deltas() {
        let mut state = StreamState::default();
        state.apply(
            "agent.message_start",
            &json!({"message": {"role": "assistant", "content": []}}),
        );
        for step in [
            json!({"type": "toolcall_start", "contentIndex": 0, "block": {"type": "toolCall", "id": "c", "name": "n", "partialArgs": ""}}),
            json!({"type": "toolcall_delta", "contentIndex": 0, "delta": "{\"a\":"}),
            json!({"type": "toolcall_end", "contentIndex": 0, "block": {"type": "toolCall", "id": "c", "name": "n", "arguments": {"a": "repaired"}}}),
        ] {
            state.apply("agent.message_update", &update(step));
        }
        assert_eq!(
            state.message().unwrap()["content"][0],
            json!({"type": "toolCall", "id": "c", "name": "n", "arguments": {"a": "repaired"}})
        );
    }

    #[test]
    fn tool_output_appends_and_slides() {
        let mut state = StreamState::default();
        let id = json!("t1");
        state.apply(
            "agent.tool_execution_update",
            &json!({"toolCallId": id, "partialResult": {"content": [], "details": null}}),
        );
        assert_eq!(state.tool_output("t1").unwrap()["content"], json!([]));
        state.apply(
            "agent.tool_execution_update",
            &json!({"toolCallId": id, "outputUpdate": {"append": "a\nb\n"}}),
        );
        state.apply(
            "agent.tool_execution_update",
            &json!({"toolCallId": id, "outputUpdate": {"dropLines": 1, "append": "c\n"}, "details": {"truncation": {"truncated": true}}}),
        );
        assert_eq!(
            state.tool_output("t1").unwrap(),
            &json!({"content": [{"type": "text", "text": "b\nc\n"}], "details": {"truncation": {"truncated": true}}})
        );
        state.apply("agent.tool_execution_end", &json!({"toolCallId": id}));
        assert!(state.tool_output("t1").is_none());
    }

    #[test]
    fn skip_lines_counts_newlines() {
        assert_eq!(skip_lines("a\nb\nc", 0), "a\nb\nc");
        assert_eq!(skip_lines("a\nb\nc", 2), "c");
        assert_eq!(skip_lines("a\nb\nc", 3), "");
        assert_eq!(skip_lines("", 1), "");
    }
}
