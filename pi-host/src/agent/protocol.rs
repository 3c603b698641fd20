//! pi's RPC mode on the wire: LF-framed JSON lines, read with a bound on the line length, and
//! classified into [`AgentOutput`] values; commands written as JSON lines.

use super::failure::RunSignal;
use super::{AgentEvent, AgentOutput, RunEnd, StopReason, UiAnswer, UiMethod};
use racp_proto::methods::model::ModelRef;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::borrow::Cow;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// How much of a line that is not valid agent output is kept in the `invalid_output` event.
const INVALID_LINE_PREFIX: usize = 1024;

/// The kind of the event that reports a line that is not agent output.
pub(super) const INVALID_OUTPUT: &str = "invalid_output";

/// One record read from the agent's stdout.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Text(Vec<u8>),
    /// A line longer than the bound; its bytes were dropped as they came, except its first
    /// [`HEAD_BYTES`] (enough to see its `type`).
    TooLong { bytes: usize, head: Vec<u8> },
}

/// How much of an over-long line is kept.
pub(super) const HEAD_BYTES: usize = 64;

fn head_of(first: &[u8], then: &[u8]) -> Vec<u8> {
    first.iter().chain(then).take(HEAD_BYTES).copied().collect()
}

/// Reads LF-terminated lines of at most `max` bytes. Only `\n` ends a record (pi's framing: JSON
/// strings may hold U+2028/U+2029). Cancel-safe: a partial line is kept in `self`, so the future
/// of [`LineReader::next_line`] may be dropped in a `select!` without losing data.
pub(super) struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes seen of an over-long line that is being skipped, and its head.
    discarding: Option<(usize, Vec<u8>)>,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(super) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            discarding: None,
            max,
        }
    }

    /// The next record, or `None` at end of stream.
    pub(super) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if let Some((bytes, head)) = self.discarding.take() {
                    return Ok(Some(Line::TooLong { bytes, head }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.finish_text()));
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    let line = if let Some((seen, head)) = self.discarding.take() {
                        Line::TooLong {
                            bytes: seen + end,
                            head,
                        }
                    } else if self.buf.len() + end > self.max {
                        let bytes = self.buf.len() + end;
                        let head = head_of(&self.buf, &available[..end]);
                        self.buf = Vec::new();
                        Line::TooLong { bytes, head }
                    } else {
                        self.buf.extend_from_slice(&available[..end]);
                        self.finish_text()
                    };
                    self.inner.consume(end + 1);
                    return Ok(Some(line));
                }
                None => {
                    let n = available.len();
                    if let Some((seen, _)) = self.discarding.as_mut() {
                        *seen += n;
                    } else if self.buf.len() + n > self.max {
                        let head = head_of(&self.buf, available);
                        self.discarding = Some((self.buf.len() + n, head));
                        self.buf = Vec::new();
                    } else {
                        self.buf.extend_from_slice(available);
                    }
                    self.inner.consume(n);
                }
            }
        }
    }

    fn finish_text(&mut self) -> Line {
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Line::Text(line)
    }
}

/// A command response, as handed to the caller that waits for it.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub success: bool,
    pub error: Option<String>,
    pub payload: Value,
    /// The line as pi wrote it, relayed when nobody waits for the reply.
    pub raw: Box<RawValue>,
}

/// What one stdout line means.
#[derive(Debug)]
pub(super) enum Parsed {
    /// A `response` carrying an `id` (maybe one a caller waits for).
    Reply {
        id: String,
        reply: Reply,
    },
    Output(AgentOutput),
}

/// An `invalid_output` event describing a line that is not agent output. A line whose head
/// names `agent_end` (pi repeats every message of the run there, so it can be too long to
/// read) still ends the run.
pub(super) fn invalid_output(error: &str, line: Option<&[u8]>, bytes: usize) -> AgentOutput {
    let mut payload = Map::new();
    payload.insert("type".into(), json!(INVALID_OUTPUT));
    payload.insert("error".into(), json!(error));
    payload.insert("bytes".into(), json!(bytes));
    let mut ends_run = false;
    if let Some(line) = line {
        let prefix = &line[..line.len().min(INVALID_LINE_PREFIX)];
        let text = String::from_utf8_lossy(prefix);
        ends_run = text.contains(r#""type":"agent_end""#);
        payload.insert("line".into(), json!(text));
    }
    AgentOutput::Event(AgentEvent {
        kind: INVALID_OUTPUT.into(),
        // A map of strings and a number always encodes; the fallback is never used.
        payload: serde_json::value::to_raw_value(&payload).unwrap_or_else(|_| raw_null()),
        run_end: ends_run.then(RunEnd::default),
        signal: None,
    })
}

fn raw_null() -> Box<RawValue> {
    RawValue::from_string("null".into()).unwrap_or_else(|_| unreachable_raw())
}

#[allow(clippy::unreachable)]
fn unreachable_raw() -> Box<RawValue> {
    unreachable!("`null` is JSON")
}

/// The only field every pi line is read for. Borrowed, so an event costs no copy of its type
/// unless it holds escapes.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
}

/// What `agent_end` is read for: the last assistant message's stop reason and error.
#[derive(Deserialize)]
struct AgentEnd {
    #[serde(default)]
    messages: Vec<MessageHead>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageHead {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    error_message: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    /// Kept raw: only the last assistant message's blocks are read.
    #[serde(default)]
    content: Option<Box<RawValue>>,
}

/// One content block of an assistant message, read for whether it is visible output.
#[derive(Deserialize)]
struct BlockHead {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

/// A message with no visible text and no tool call (thinking alone is not an answer).
fn is_empty_answer(content: Option<&RawValue>) -> bool {
    let Some(content) = content else {
        return true;
    };
    match serde_json::from_str::<Vec<BlockHead>>(content.get()) {
        Ok(blocks) => !blocks.iter().any(|b| match b.kind.as_deref() {
            Some("text") => b.text.as_deref().is_some_and(|t| !t.trim().is_empty()),
            Some("thinking") => false,
            _ => true,
        }),
        // A string (or anything else): visible unless blank.
        Err(_) => serde_json::from_str::<String>(content.get()).is_ok_and(|t| t.trim().is_empty()),
    }
}

fn run_end(raw: &RawValue) -> RunEnd {
    let last = serde_json::from_str::<AgentEnd>(raw.get())
        .ok()
        .and_then(|end| {
            end.messages
                .into_iter()
                .rev()
                .find(|m| m.role.as_deref() == Some("assistant"))
        });
    let Some(last) = last else {
        return RunEnd::default();
    };
    let stop_reason = match last.stop_reason.as_deref() {
        Some("stop" | "length" | "toolUse") => StopReason::Finished,
        Some("aborted") => StopReason::Aborted,
        Some("error") => StopReason::Error,
        _ => StopReason::Unknown,
    };
    let empty =
        last.stop_reason.as_deref() == Some("stop") && is_empty_answer(last.content.as_deref());
    RunEnd {
        stop_reason,
        error_message: last.error_message,
        provider: last.provider,
        model: last.model,
        empty,
    }
}

/// The fields of pi's `auto_retry_*` and `compaction_*` events that decide whether a failed run
/// is final.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignalHead {
    #[serde(default)]
    attempt: Option<u32>,
    #[serde(default)]
    success: Option<bool>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    will_retry: Option<bool>,
}

fn signal(kind: &str, raw: &RawValue) -> Option<RunSignal> {
    const SIGNALS: &[&str] = &[
        "auto_retry_start",
        "auto_retry_end",
        "compaction_start",
        "auto_compaction_start",
        "compaction_end",
        "auto_compaction_end",
    ];
    if !SIGNALS.contains(&kind) {
        return None;
    }
    let head = serde_json::from_str::<SignalHead>(raw.get()).ok()?;
    Some(match kind {
        "auto_retry_start" => RunSignal::RetryStart {
            attempt: head.attempt.unwrap_or(1),
        },
        "auto_retry_end" => RunSignal::RetryEnd {
            success: head.success.unwrap_or(false),
            attempt: head.attempt.unwrap_or(0),
        },
        "compaction_start" | "auto_compaction_start" => RunSignal::CompactionStart {
            overflow: head.reason.as_deref() == Some("overflow"),
        },
        "compaction_end" | "auto_compaction_end" => RunSignal::CompactionEnd {
            will_retry: head.will_retry.unwrap_or(false),
        },
        _ => return None,
    })
}

/// Classifies one complete stdout line; `None` for a blank line. Events are kept as the raw
/// line: only their `type` is read (and `agent_end`'s last message).
pub(super) fn parse_line(line: &[u8]) -> Option<Parsed> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(
        classify(line)
            .unwrap_or_else(|error| Parsed::Output(invalid_output(&error, Some(line), line.len()))),
    )
}

/// A line's meaning, or why it is not agent output.
fn classify(line: &[u8]) -> Result<Parsed, String> {
    let not_json = |err: serde_json::Error| format!("not JSON: {err}");
    let raw: Box<RawValue> = serde_json::from_slice(line).map_err(not_json)?;
    let kind = raw
        .get()
        .starts_with('{')
        .then(|| serde_json::from_str::<Head>(raw.get()).ok())
        .flatten()
        .and_then(|head| head.kind)
        .map(Cow::into_owned)
        .ok_or("not a JSON object with a string `type`")?;
    Ok(match kind.as_str() {
        "response" | "extension_ui_request" => {
            // Rare and small: read whole.
            let value: Value = serde_json::from_str(raw.get()).map_err(not_json)?;
            if kind == "response" {
                parse_response(value, raw)
            } else {
                Parsed::Output(parse_ui_request(value, raw, line))
            }
        }
        _ => {
            let run_end = (kind == "agent_end").then(|| run_end(&raw));
            let signal = signal(&kind, &raw);
            Parsed::Output(AgentOutput::Event(AgentEvent {
                kind,
                payload: raw,
                run_end,
                signal,
            }))
        }
    })
}

fn string_field(value: &Value, name: &str) -> Option<String> {
    value.get(name).and_then(Value::as_str).map(str::to_owned)
}

fn parse_response(value: Value, raw: Box<RawValue>) -> Parsed {
    let success = value.get("success").and_then(Value::as_bool) == Some(true);
    let error = string_field(&value, "error");
    // pi echoes the command's id as given; ours are strings, but accept numbers too.
    let id = match value.get("id") {
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    match id {
        Some(id) => Parsed::Reply {
            id,
            reply: Reply {
                success,
                error,
                payload: value,
                raw,
            },
        },
        None => Parsed::Output(AgentOutput::Response {
            command: string_field(&value, "command").unwrap_or_default(),
            success,
            error,
            payload: raw,
        }),
    }
}

/// A dialog's choices as text: strings decoded, anything else as the JSON the agent wrote. Read
/// from the line rather than from the parsed `Value`, whose numbers would come back re-encoded
/// (an integer beyond 64 bits rounded: docs/protocol.md §1, "Numbers").
fn dialog_options(raw: &RawValue) -> Option<Vec<String>> {
    #[derive(Deserialize)]
    struct Options<'a> {
        #[serde(borrow, default)]
        options: Option<&'a RawValue>,
    }
    let options = serde_json::from_str::<Options>(raw.get()).ok()?.options?;
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

fn parse_ui_request(value: Value, raw: Box<RawValue>, line: &[u8]) -> AgentOutput {
    let method_name = string_field(&value, "method").unwrap_or_default();
    let Some(method) = UiMethod::from_wire(&method_name) else {
        return AgentOutput::UiNotice {
            method: method_name,
            payload: raw,
        };
    };
    let Some(id) = string_field(&value, "id").filter(|id| !id.is_empty()) else {
        return invalid_output("a dialog request without an id", Some(line), line.len());
    };
    let options = dialog_options(&raw);
    let timeout_ms = value.get("timeout").and_then(|t| {
        t.as_u64().or_else(|| {
            t.as_f64()
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(|ms| ms.ceil() as u64)
        })
    });
    AgentOutput::UiRequest {
        id,
        method,
        title: string_field(&value, "title").unwrap_or_default(),
        message: string_field(&value, "message"),
        options,
        timeout_ms,
    }
}

/// The `message` of a fire-and-forget `extension_ui_request` (a `notify`'s text).
pub(super) fn notice_message(payload: &RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Notice {
        message: Option<String>,
    }
    serde_json::from_str::<Notice>(payload.get()).ok()?.message
}

/// A model as pi's responses name it (`get_state`'s `model`, `get_available_models`'s items):
/// a full Model object of which the host reads `provider` and `id`.
pub(super) fn model_ref(model: &Value) -> Option<ModelRef> {
    Some(ModelRef {
        provider: model.get("provider")?.as_str()?.to_string(),
        id: model.get("id")?.as_str()?.to_string(),
    })
}

/// `get_available_models`'s `data.models`.
pub(super) fn available_models(data: &Value) -> Vec<ModelRef> {
    data.get("models")
        .and_then(Value::as_array)
        .map(|models| models.iter().filter_map(model_ref).collect())
        .unwrap_or_default()
}

/// `{"type": "extension_ui_response", "id", ...}` for a dialog answer.
pub(super) fn ui_response(request_id: &str, answer: &UiAnswer) -> Value {
    match answer {
        UiAnswer::Confirmed(confirmed) => {
            json!({"type": "extension_ui_response", "id": request_id, "confirmed": confirmed})
        }
        UiAnswer::Value(value) => {
            json!({"type": "extension_ui_response", "id": request_id, "value": value})
        }
        UiAnswer::Cancelled => {
            json!({"type": "extension_ui_response", "id": request_id, "cancelled": true})
        }
    }
}
