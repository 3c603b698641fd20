//! Compact streams: pi writes every `message_update` with the whole message so far (twice:
//! `message` and the step's `partial`) and every `tool_execution_update` with the whole output
//! so far, so relaying them as they come costs bytes quadratic in a reply's length. This
//! module rewrites those two events to carry only what is new; `message_end` and
//! `tool_execution_end` still carry pi's complete copy. The shapes and the rule that rebuilds
//! pi's state from them are in docs/protocol.md §8.1 ("Compact streams"); the rebuild itself is
//! [`super::stream`], which the host and the clients share.
//!
//! Everything else the agent writes is relayed untouched, and so is any update whose shape is
//! not the one described there.

use super::Kind;
use super::line::{Line, Nested, RawFields, text};
use super::stream::single_text;
use serde::Deserialize;
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// A compact line being built: the fields kept as pi wrote them and those rewritten.
type Out<'a> = BTreeMap<Cow<'a, str>, Cow<'a, RawValue>>;

fn kept<'a>(fields: &RawFields<'a>) -> Out<'a> {
    fields
        .iter()
        .map(|(k, v)| (k.clone(), Cow::Borrowed(*v)))
        .collect()
}

/// Most candidate line starts tried when a tool's output window has slid; beyond it the whole
/// (bounded) window is sent again.
const MAX_SLIDE_CANDIDATES: usize = 4096;

/// What the compactor remembers of one agent's streams.
#[derive(Debug, Default)]
pub struct Compactor {
    /// The text of each content block of the message being streamed, from its deltas.
    streamed: Vec<String>,
    /// The message's fields other than `content` as last sent (JSON text by name).
    fields: BTreeMap<String, String>,
    /// The output text each running tool has been sent so far, by tool call id.
    tool_outputs: HashMap<String, String>,
}

impl Compactor {
    /// The compact payload for a line of agent output, or `None` to relay it as it came.
    pub fn compact(&mut self, line: &Line<'_>) -> Option<Box<RawValue>> {
        match line.kind {
            Kind::MessageStart | Kind::MessageEnd => {
                self.streamed.clear();
                self.fields.clear();
                if line.kind == Kind::MessageStart
                    && let Some(message) = line.message.object()
                {
                    self.changed_fields(message);
                    return images_named(line, message);
                }
                None
            }
            Kind::MessageUpdate => self.message_update(line),
            Kind::TurnEnd | Kind::AgentEnd => name_messages(line),
            Kind::ToolExecutionUpdate => self.tool_update(line),
            Kind::ToolExecutionEnd => {
                if let Some(id) = line.fields.get("toolCallId").and_then(|id| text(id)) {
                    self.tool_outputs.remove(id.as_ref());
                }
                None
            }
            _ => None,
        }
    }

    fn message_update(&mut self, line: &Line<'_>) -> Option<Box<RawValue>> {
        let step = line.step.object()?;
        // A line without pi's accumulated copies has nothing to cut: relay it as it came.
        if line.message.is_absent() && !step.contains_key("partial") {
            return None;
        }
        let step = self.compact_step(step)?;
        let mut out = kept(&line.fields);
        match &line.message {
            Nested::Absent => {}
            Nested::Object(message) => {
                let mut sent = self.changed_fields(message);
                for identity in ["role", "timestamp"] {
                    if let Some(value) = message.get(identity) {
                        sent.insert(identity.into(), value);
                    }
                }
                out.insert("message".into(), Cow::Owned(to_raw_value(&sent).ok()?));
            }
            Nested::Text(_) | Nested::NotObject => return None,
        }
        out.insert("assistantMessageEvent".into(), Cow::Owned(step));
        to_raw_value(&out).ok()
    }

    /// The message's fields other than `content` that differ from those last sent (usage,
    /// stop reason, response id...), remembered as sent.
    fn changed_fields<'a>(&mut self, message: &RawFields<'a>) -> RawFields<'a> {
        let mut changed = RawFields::new();
        for (name, value) in message {
            if name == "content"
                || self.fields.get(name.as_ref()).map(String::as_str) == Some(value.get())
            {
                continue;
            }
            self.fields.insert(name.to_string(), value.get().to_owned());
            changed.insert(name.clone(), *value);
        }
        changed
    }

    /// The step without pi's accumulated copies; `None` when it is not a shape this knows.
    fn compact_step(&mut self, step: &RawFields<'_>) -> Option<Box<RawValue>> {
        let kind = text(step.get("type")?)?;
        if kind == "start" {
            self.start_message(step);
            return to_raw_value(step).ok();
        }
        let mut out = kept(step);
        out.remove("partial");
        let partial = step.get("partial").copied();
        let index: Option<usize> = step
            .get("contentIndex")
            .and_then(|i| serde_json::from_str(i.get()).ok());
        let mut block: Option<Map<String, Value>> = None;
        if kind.ends_with("_delta") {
            if let (Some(index), Some(delta)) = (index, step.get("delta")) {
                let delta = text(delta)?;
                self.streamed_mut(index).push_str(&delta);
            }
        } else if kind.ends_with("_start") || kind.ends_with("_end") {
            if let (Some(index), Some(partial)) = (index, partial) {
                block = Some(content_block(partial, index)?);
            }
            if kind.ends_with("_start") {
                if let Some(index) = index {
                    self.streamed_mut(index).clear();
                }
                // pi fills `partial` when it writes the line, by then often a few deltas on:
                // the deltas alone carry the streamed text.
                if let Some(block) = block.as_mut() {
                    for field in ["text", "thinking", "partialArgs", "arguments"] {
                        block.remove(field);
                    }
                }
            } else if let (Some(index), Some(block)) = (index, block.as_mut()) {
                self.end_block(step, &mut out, index, block);
            }
        } else if kind == "done" {
            out.remove("message");
        } else if kind == "error" {
            out.remove("error");
        }
        if let Some(block) = block {
            out.insert("block".into(), Cow::Owned(to_raw_value(&block).ok()?));
        }
        to_raw_value(&out).ok()
    }

    /// A `start` step: its skeleton (model, provider, empty content) starts a new message.
    fn start_message(&mut self, step: &RawFields<'_>) {
        self.streamed.clear();
        if let Some(partial) = step
            .get("partial")
            .and_then(|p| serde_json::from_str::<RawFields<'_>>(p.get()).ok())
        {
            self.fields.clear();
            self.changed_fields(&partial);
        }
    }

    /// A `*_end` step: the ending block and pi's copies of it lose what the deltas gave.
    fn end_block(
        &mut self,
        step: &RawFields<'_>,
        out: &mut Out<'_>,
        index: usize,
        block: &mut Map<String, Value>,
    ) {
        let streamed = self.streamed_mut(index).as_str();
        drop_streamed(block, streamed);
        if step
            .get("content")
            .and_then(|c| text(c))
            .is_some_and(|content| content == streamed)
        {
            out.remove("content");
        }
        // `toolCall` is the block as it ends: `block` carries it.
        out.remove("toolCall");
    }

    fn streamed_mut(&mut self, index: usize) -> &mut String {
        if self.streamed.len() <= index {
            self.streamed.resize_with(index + 1, String::new);
        }
        &mut self.streamed[index]
    }

    fn tool_update(&mut self, line: &Line<'_>) -> Option<Box<RawValue>> {
        let id: String = line.field("toolCallId")?;
        let result: Value = line.field("partialResult")?;
        let mut out = kept(&line.fields);
        out.remove("partialResult");
        // The tool's arguments are in its `tool_execution_start`; each update repeated them.
        out.remove("args");
        let text = single_text(&result);
        let previous = self.tool_outputs.get(&id).map_or("", String::as_str);
        match text.and_then(|text| slide(previous, text).map(|step| (text, step))) {
            Some((text, (drop_lines, kept))) => {
                let mut update = Map::new();
                if drop_lines > 0 {
                    update.insert("dropLines".into(), drop_lines.into());
                }
                update.insert("append".into(), text[kept..].into());
                out.insert(
                    "outputUpdate".into(),
                    Cow::Owned(to_raw_value(&update).ok()?),
                );
                if let Some(details) = result.get("details") {
                    out.insert("details".into(), Cow::Owned(to_raw_value(details).ok()?));
                }
            }
            None => {
                out.insert(
                    "partialResult".into(),
                    Cow::Owned(to_raw_value(&result).ok()?),
                );
            }
        }
        self.tool_outputs
            .insert(id, text.unwrap_or_default().to_owned());
        to_raw_value(&out).ok()
    }
}

/// `turn_end` and `agent_end` with each message they repeat named by its identity instead
/// (`role`, `timestamp`, a tool result's `toolCallId`) and how it ended (`stopReason`,
/// `errorMessage`): every message is whole in its own `message_end`.
fn name_messages(line: &Line<'_>) -> Option<Box<RawValue>> {
    let mut out = kept(&line.fields);
    match &line.message {
        Nested::Absent => {}
        Nested::Object(message) => {
            out.insert(
                "message".into(),
                Cow::Owned(to_raw_value(&identity(message)).ok()?),
            );
        }
        Nested::Text(_) | Nested::NotObject => return None,
    }
    for field in ["messages", "toolResults"] {
        let Some(value) = line.fields.get(field) else {
            continue;
        };
        let messages = serde_json::from_str::<Vec<RawFields<'_>>>(value.get()).ok()?;
        let named: Vec<RawFields<'_>> = messages.iter().map(identity).collect();
        out.insert(field.into(), Cow::Owned(to_raw_value(&named).ok()?));
    }
    to_raw_value(&out).ok()
}

/// A `message_start` whose message carries images (a prompt's) with each image named by its
/// `mimeType` instead: `message_end` carries the message whole, so the bytes are logged once.
/// `None` for any other (relayed as it came).
fn images_named(line: &Line<'_>, message: &RawFields<'_>) -> Option<Box<RawValue>> {
    let content = message.get("content")?;
    // Most messages have no image: a look at the text spares the parse.
    if !content.get().contains("\"image\"") {
        return None;
    }
    let parts: Vec<Map<String, Value>> = serde_json::from_str(content.get()).ok()?;
    let named: Vec<Map<String, Value>> = parts
        .into_iter()
        .map(|mut part| {
            if part.get("type").and_then(Value::as_str) == Some("image") {
                part.remove("data");
            }
            part
        })
        .collect();
    let mut message: Out<'_> = kept(message);
    message.insert("content".into(), Cow::Owned(to_raw_value(&named).ok()?));
    let mut out = kept(&line.fields);
    out.insert("message".into(), Cow::Owned(to_raw_value(&message).ok()?));
    to_raw_value(&out).ok()
}

/// A message named by its identity and how it ended, the rest left out.
fn identity<'a>(message: &RawFields<'a>) -> RawFields<'a> {
    const IDENTITY: [&str; 5] = [
        "role",
        "timestamp",
        "toolCallId",
        "stopReason",
        "errorMessage",
    ];
    message
        .iter()
        .filter(|(name, _)| IDENTITY.contains(&name.as_ref()))
        .map(|(name, value)| (name.clone(), *value))
        .collect()
}

/// Content block `index` of pi's partial message.
fn content_block(partial: &RawValue, index: usize) -> Option<Map<String, Value>> {
    #[derive(Deserialize)]
    struct Partial<'a> {
        #[serde(borrow)]
        content: Vec<&'a RawValue>,
    }
    let partial: Partial<'_> = serde_json::from_str(partial.get()).ok()?;
    serde_json::from_str(partial.content.get(index)?.get()).ok()
}

/// Removes from an ending block what its deltas already gave: its text or thinking when equal
/// to them, a tool call's argument text, and its arguments when they are that text parsed.
fn drop_streamed(block: &mut Map<String, Value>, streamed: &str) {
    let kind = block.get("type").and_then(Value::as_str).map(str::to_owned);
    match kind.as_deref() {
        Some(field @ ("text" | "thinking"))
            if block.get(field).and_then(Value::as_str) == Some(streamed) =>
        {
            block.remove(field);
        }
        Some("toolCall") => {
            block.remove("partialArgs");
            let parsed = serde_json::from_str::<Value>(streamed).ok();
            if parsed.is_some() && block.get("arguments") == parsed.as_ref() {
                block.remove("arguments");
            }
        }
        _ => {}
    }
}

/// How `next` continues `previous`: the lines to drop from the front of `previous` and where
/// the appended text starts in `next`. `None` when it does not (then the whole is sent).
fn slide(previous: &str, next: &str) -> Option<(u64, usize)> {
    if next.starts_with(previous) {
        return Some((0, previous.len()));
    }
    // pi keeps the last lines of a long output: the window moved down by whole lines.
    let mut dropped = 0;
    let mut start = 0;
    for _ in 0..MAX_SLIDE_CANDIDATES {
        start += previous[start..].find('\n')? + 1;
        dropped += 1;
        let kept = &previous[start..];
        if next.starts_with(kept) {
            return Some((dropped, kept.len()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::pi::stream::StreamState;
    use serde_json::json;

    fn compact_json(compactor: &mut Compactor, payload: &Value) -> Option<Box<RawValue>> {
        let text = payload.to_string();
        compactor.compact(&Line::read(&text).unwrap())
    }

    /// Feeds pi-shaped events through the compactor and a [`StreamState`]; returns the
    /// compacted payloads.
    fn relay(events: &[(&str, Value)], state: &mut StreamState) -> Vec<Value> {
        let mut compactor = Compactor::default();
        events
            .iter()
            .map(|(kind, payload)| {
                let compact = compact_json(&mut compactor, payload).map_or_else(
                    || payload.clone(),
                    |c| serde_json::from_str(c.get()).unwrap(),
                );
                state.apply(&format!("agent.{kind}"), &compact);
                compact
            })
            .collect()
    }

    fn pi_message(content: Value) -> Value {
        json!({"role": "assistant", "content": content, "api": "openai-completions",
               "provider": "stub", "model": "m", "usage": {"input": 1}, "stopReason": "stop",
               "timestamp": 1764500000000u64})
    }

    /// The lines pi writes for a reply with a text block and a tool call.
    fn pi_reply(text_deltas: &[&str], arg_deltas: &[&str]) -> (Vec<(&'static str, Value)>, Value) {
        let mut events = Vec::new();
        let mut content: Vec<Value> = Vec::new();
        let update = |content: &Vec<Value>, step: Value| {
            let mut step = step;
            step["partial"] = pi_message(json!(content));
            json!({"type": "message_update", "message": pi_message(json!(content)), "assistantMessageEvent": step})
        };
        events.push((
            "message_start",
            json!({"type": "message_start", "message": pi_message(json!([]))}),
        ));
        events.push(("message_update", update(&content, json!({"type": "start"}))));
        content.push(json!({"type": "text", "text": ""}));
        events.push((
            "message_update",
            update(&content, json!({"type": "text_start", "contentIndex": 0})),
        ));
        for delta in text_deltas {
            let text = format!("{}{delta}", content[0]["text"].as_str().unwrap());
            content[0]["text"] = json!(text);
            events.push((
                "message_update",
                update(
                    &content,
                    json!({"type": "text_delta", "contentIndex": 0, "delta": delta}),
                ),
            ));
        }
        let text = content[0]["text"].clone();
        events.push((
            "message_update",
            update(
                &content,
                json!({"type": "text_end", "contentIndex": 0, "content": text}),
            ),
        ));
        content.push(json!({"type": "toolCall", "id": "call_1", "name": "bash", "arguments": {}, "partialArgs": ""}));
        events.push((
            "message_update",
            update(
                &content,
                json!({"type": "toolcall_start", "contentIndex": 1}),
            ),
        ));
        for delta in arg_deltas {
            let args = format!("{}{delta}", content[1]["partialArgs"].as_str().unwrap());
            content[1]["partialArgs"] = json!(args);
            events.push((
                "message_update",
                update(
                    &content,
                    json!({"type": "toolcall_delta", "contentIndex": 1, "delta": delta}),
                ),
            ));
        }
        let args: Value =
            serde_json::from_str(content[1]["partialArgs"].as_str().unwrap()).unwrap();
        content[1].as_object_mut().unwrap().remove("partialArgs");
        content[1]["arguments"] = args;
        let tool_call = content[1].clone();
        events.push((
            "message_update",
            update(
                &content,
                json!({"type": "toolcall_end", "contentIndex": 1, "toolCall": tool_call}),
            ),
        ));
        let last = pi_message(json!(content));
        events.push(("message_update", json!({"type": "message_update", "message": last, "assistantMessageEvent": {"type": "done", "reason": "toolUse", "message": last}})));
        events.push((
            "message_end",
            json!({"type": "message_end", "message": last}),
        ));
        (events, last)
    }

    #[test]
    fn a_compacted_reply_rebuilds_to_pis_own_message() {
        let deltas: Vec<String> = (0..200).map(|i| format!("word{i} ")).collect();
        let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let (events, last) = pi_reply(&deltas, &["{\"command\":", " \"ls -la\"", "}"]);
        let mut state = StreamState::default();
        let mut mid_stream = None;
        let compact = {
            let mut compactor = Compactor::default();
            let mut out = Vec::new();
            for (i, (kind, payload)) in events.iter().enumerate() {
                let c = compact_json(&mut compactor, payload).map_or_else(
                    || payload.clone(),
                    |c| serde_json::from_str(c.get()).unwrap(),
                );
                state.apply(&format!("agent.{kind}"), &c);
                if i == 100 {
                    mid_stream = state.message().cloned();
                    assert_eq!(Some(&payload["message"]), mid_stream.as_ref(), "mid-stream");
                }
                if *kind == "message_end" {
                    let rebuilt = state.finished_message().expect("a finished message");
                    assert_eq!(rebuilt, &last, "the rebuilt message is pi's message_end");
                }
                out.push(c);
            }
            out
        };
        assert!(mid_stream.is_some());
        let text_len = last["content"][0]["text"].as_str().unwrap().len();
        let raw_bytes: usize = events.iter().map(|(_, p)| p.to_string().len()).sum();
        let compact_bytes: usize = compact.iter().map(|p| p.to_string().len()).sum();
        // Linear: at most 3x the text plus a fixed overhead per event (docs/protocol.md §8.1).
        assert!(
            compact_bytes <= 3 * text_len + 400 * events.len(),
            "{compact_bytes} bytes for {text_len} of text in {} events (raw {raw_bytes})",
            events.len()
        );
        assert!(
            raw_bytes > 10 * compact_bytes,
            "raw {raw_bytes} vs {compact_bytes}"
        );
    }

    #[test]
    fn tool_output_is_sent_as_appends_even_when_the_window_slides() {
        let mut state = StreamState::default();
        let update = |text: &str| {
            (
                "tool_execution_update",
                json!({"type": "tool_execution_update", "toolCallId": "t", "toolName": "bash",
                       "args": {"command": "yes"},
                       "partialResult": {"content": [{"type": "text", "text": text}], "details": {}}}),
            )
        };
        let lines: Vec<String> = (0..400).map(|i| format!("line {i}\n")).collect();
        let mut events = vec![(
            "tool_execution_update",
            json!({"type": "tool_execution_update", "toolCallId": "t", "toolName": "bash",
                   "partialResult": {"content": [], "details": null}}),
        )];
        let mut expected = Vec::new();
        for end in (10..=400usize).step_by(10) {
            // pi keeps the last 100 lines.
            let text: String = lines[end.saturating_sub(100)..end].concat();
            expected.push(text.clone());
            events.push(update(&text));
        }
        let compact = relay(&events, &mut state);
        assert_eq!(
            state.tool_output("t").unwrap()["content"][0]["text"],
            expected.last().unwrap().as_str()
        );
        for update in &compact[1..] {
            assert!(update.get("partialResult").is_none(), "{update}");
            assert!(update.get("args").is_none());
            assert!(update["outputUpdate"]["append"].as_str().unwrap().len() <= 100);
        }
        // A window that does not continue the last one at a line start is sent whole.
        let compact = relay(&[update("a\nb"), update("c\n")], &mut state);
        assert_eq!(compact[1]["partialResult"]["content"][0]["text"], "c\n");
        assert_eq!(state.tool_output("t").unwrap()["content"][0]["text"], "c\n");
    }

    #[test]
    fn other_events_and_unknown_shapes_are_relayed_as_they_came() {
        let mut compactor = Compactor::default();
        for payload in [
            json!({"type": "turn_start", "messages": [{"role": "user"}]}),
            json!({"type": "message_update", "assistantMessageEvent": 3}),
            json!({"type": "tool_execution_update"}),
        ] {
            assert!(
                compact_json(&mut compactor, &payload).is_none(),
                "{payload}"
            );
        }
        // A line without pi's copies (the benchmark's) is relayed as it came.
        let bench = json!({"type": "message_update", "assistantMessageEvent":
                           {"type": "text_delta", "delta": "xx", "tag": 3, "i": 7, "t": 12}});
        assert!(compact_json(&mut compactor, &bench).is_none());
        // Extra fields of a step are kept when it is compacted.
        let extra = json!({"type": "message_update", "message": {"role": "assistant"},
                           "assistantMessageEvent": {"type": "text_delta", "delta": "xx",
                           "tag": 3, "partial": {"content": []}}});
        let out = compact_json(&mut compactor, &extra).unwrap();
        let out: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(out["assistantMessageEvent"]["tag"], 3, "{out}");
        assert!(
            out["assistantMessageEvent"].get("partial").is_none(),
            "{out}"
        );
    }

    #[test]
    fn a_prompts_images_are_named_in_its_start_and_whole_in_its_end() {
        let mut compactor = Compactor::default();
        let message = json!({"role": "user", "timestamp": 5, "content": [
            {"type": "text", "text": "see"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]});
        let start = json!({"type": "message_start", "message": message});
        let out = compact_json(&mut compactor, &start).expect("compacted");
        let out: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(
            out,
            json!({"type": "message_start", "message": {"role": "user", "timestamp": 5, "content": [
                {"type": "text", "text": "see"}, {"type": "image", "mimeType": "image/png"}]}})
        );
        let end = json!({"type": "message_end", "message": message});
        assert!(
            compact_json(&mut compactor, &end).is_none(),
            "the end is whole"
        );
        let text_only =
            json!({"type": "message_start", "message": {"role": "user", "content": "hi"}});
        assert!(compact_json(&mut compactor, &text_only).is_none());
    }
}
