//! The human view of a session's events: text deltas inline, tool calls and results as lines,
//! approvals with their id and question. Event types it does not know are skipped.

use racp_proto::events::{ApprovalRequestedData, ApprovalSettledData, Event, TurnFinishedData};
use racp_proto::methods::turn::{ApprovalInfo, ApprovalKind};
use serde_json::Value;

/// Longest tool result text shown, in characters.
const MAX_RESULT_CHARS: usize = 400;

/// Renders events as text; remembers whether the last output ended mid-line.
#[derive(Debug, Default)]
pub struct View {
    mid_line: bool,
}

impl View {
    /// The text to print for `event` (possibly empty).
    pub fn render(&mut self, event: &Event) -> String {
        // The human view shows text and abbreviated JSON, so a number rounded by `Value` (an
        // integer beyond 64 bits) is acceptable here; `--json` prints `data` exactly.
        let data = &serde_json::from_str::<Value>(event.data.get()).unwrap_or(Value::Null);
        let turn = event.turn_id.as_deref().unwrap_or("?");
        match event.kind.as_str() {
            "agent.message_update" => {
                let update = &data["assistantMessageEvent"];
                match update["type"].as_str() {
                    Some("text_delta") => self.inline(update["delta"].as_str().unwrap_or("")),
                    _ => String::new(),
                }
            }
            "agent.tool_execution_start" => {
                let name = data["toolName"].as_str().unwrap_or("tool");
                let args = compact(&data["args"], 200);
                self.line(&format!("[tool] {name} {args}"))
            }
            "agent.tool_execution_end" => {
                let name = data["toolName"].as_str().unwrap_or("tool");
                let text = result_text(&data["result"]);
                let label = if data["isError"].as_bool() == Some(true) {
                    "error"
                } else {
                    "result"
                };
                self.line(&format!("[tool {label}] {name}: {text}"))
            }
            "turn.started" => {
                let text = data["text"].as_str().unwrap_or("");
                self.line(&format!("== turn {turn}: {}", truncate(text, 200)))
            }
            "turn.finished" => match serde_json::from_value::<TurnFinishedData>(data.clone()) {
                Ok(finished) => {
                    let outcome = serde_json::to_value(finished.outcome)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    let why = finished
                        .error
                        .map(|e| format!(" ({}: {})", e.code(), e.message()))
                        .unwrap_or_default();
                    self.line(&format!("== turn {turn} {outcome}{why}"))
                }
                Err(_) => self.line(&format!("== turn {turn} finished")),
            },
            "approval.requested" => {
                match serde_json::from_value::<ApprovalRequestedData>(data.clone()) {
                    Ok(approval) => self.line(&describe_approval(
                        &approval.approval_id,
                        approval.kind,
                        &approval.title,
                        approval.message.as_deref(),
                        approval.options.as_deref(),
                    )),
                    Err(_) => String::new(),
                }
            }
            "approval.settled" => match serde_json::from_value::<ApprovalSettledData>(data.clone())
            {
                Ok(settled) => {
                    let outcome = serde_json::to_value(settled.outcome)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    let by = settled
                        .device_id
                        .map(|d| format!(" by {d}"))
                        .unwrap_or_default();
                    let value = settled
                        .value
                        .map(|v| format!(": {}", truncate(&v, 200)))
                        .unwrap_or_default();
                    self.line(&format!(
                        "[approval {}] {outcome}{by}{value}",
                        settled.approval_id
                    ))
                }
                Err(_) => String::new(),
            },
            "session.closed" => self.line("== session closed"),
            _ => String::new(),
        }
    }

    /// A note on its own line (e.g. a pending approval from a snapshot).
    pub fn note(&mut self, text: &str) -> String {
        self.line(text)
    }

    /// Text to print before something else writes a line (ends a line of deltas).
    pub fn break_line(&mut self) -> String {
        if std::mem::take(&mut self.mid_line) {
            "\n".into()
        } else {
            String::new()
        }
    }

    fn inline(&mut self, text: &str) -> String {
        if !text.is_empty() {
            self.mid_line = !text.ends_with('\n');
        }
        text.to_string()
    }

    fn line(&mut self, text: &str) -> String {
        let mut out = self.break_line();
        out.push_str(text);
        out.push('\n');
        out
    }
}

/// One line describing a pending approval and how to answer it.
pub fn describe_approval(
    id: &str,
    kind: ApprovalKind,
    title: &str,
    message: Option<&str>,
    options: Option<&[String]>,
) -> String {
    let mut out = format!(
        "[approval {id}] {}: {}",
        kind_name(kind),
        truncate(title, 200)
    );
    if let Some(message) = message.filter(|m| !m.is_empty()) {
        out.push_str(&format!(" - {}", truncate(message, 400)));
    }
    if let Some(options) = options.filter(|o| !o.is_empty()) {
        let numbered: Vec<String> = options
            .iter()
            .enumerate()
            .map(|(i, option)| format!("{}. {}", i + 1, truncate(option, 100)))
            .collect();
        out.push_str(&format!(" [options: {}]", numbered.join(", ")));
    }
    out.push_str(match kind {
        ApprovalKind::Confirm => " (answer y/n)",
        ApprovalKind::Select => " (answer with a number or an option)",
        ApprovalKind::Input | ApprovalKind::Editor => " (answer with a line of text)",
    });
    out
}

/// [`describe_approval`] for a snapshot's pending approval.
pub fn describe_pending(approval: &ApprovalInfo) -> String {
    describe_approval(
        &approval.approval_id,
        approval.kind,
        &approval.title,
        approval.message.as_deref(),
        approval.options.as_deref(),
    )
}

pub fn kind_name(kind: ApprovalKind) -> &'static str {
    match kind {
        ApprovalKind::Confirm => "confirm",
        ApprovalKind::Select => "select",
        ApprovalKind::Input => "input",
        ApprovalKind::Editor => "editor",
    }
}

fn result_text(result: &Value) -> String {
    let text: Vec<&str> = result["content"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["text"].as_str()).collect())
        .unwrap_or_default();
    truncate(&text.join(" ").replace('\n', " "), MAX_RESULT_CHARS)
}

fn compact(value: &Value, max: usize) -> String {
    match value {
        Value::Null => String::new(),
        other => truncate(&other.to_string(), max),
    }
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, data: Value) -> Event {
        serde_json::from_str(
            &json!({
                "seq": 1, "cursor": "0000000000000001-1", "type": kind, "at": 0,
                "turnId": "turn_1", "data": data
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn deltas_are_inline_and_lines_break_them() {
        let mut view = View::default();
        let delta = |d: &str| {
            event(
                "agent.message_update",
                json!({"assistantMessageEvent": {"type": "text_delta", "delta": d}}),
            )
        };
        let mut out = view.render(&delta("chunk0 "));
        out += &view.render(&delta("chunk1 "));
        out += &view.render(&event(
            "agent.tool_execution_start",
            json!({"toolName": "bash", "args": {"command": "ls"}}),
        ));
        out += &view.render(&event("turn.finished", json!({"outcome": "completed"})));
        assert_eq!(
            out,
            "chunk0 chunk1 \n[tool] bash {\"command\":\"ls\"}\n== turn turn_1 completed\n"
        );
    }

    #[test]
    fn approvals_show_their_id_and_question() {
        let mut view = View::default();
        let out = view.render(&event(
            "approval.requested",
            json!({"approvalId": "apr_1", "turnId": "turn_1", "kind": "select",
                   "title": "Pick", "options": ["a", "b"], "deadline": 1}),
        ));
        assert_eq!(
            out,
            "[approval apr_1] select: Pick [options: 1. a, 2. b] (answer with a number or an option)\n"
        );
    }
}
