//! The human view of a session's events: text deltas inline, tool calls and results as lines,
//! approvals with their id and question. Event types it does not know are skipped.

use racp_proto::events::{
    ApprovalRequestedData, ApprovalSettledData, Event, EventType, TurnFinishedData, TurnStartedData,
};
use racp_proto::methods::turn::{ApprovalInfo, ApprovalKind};
use racp_proto::pi::{self, Kind, event::ToolRun};
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
        if let Some(kind) = Kind::of_event_type(&event.kind) {
            return self.render_agent(&kind, event.data.get());
        }
        let Some(kind) = EventType::from_name(&event.kind) else {
            return String::new();
        };
        let turn = event.turn_id.as_deref().unwrap_or("?");
        match kind {
            EventType::TurnStarted => {
                let text = event.data.parse::<TurnStartedData>().map(|d| d.text);
                let text = text.unwrap_or_default();
                self.line(&format!("== turn {turn}: {}", truncate(&text, 200)))
            }
            EventType::TurnFinished => match event.data.parse::<TurnFinishedData>() {
                Ok(finished) => {
                    let outcome = wire_name(&finished.outcome);
                    let why = finished
                        .error
                        .map(|e| format!(" ({}: {})", e.code(), e.message()))
                        .unwrap_or_default();
                    self.line(&format!("== turn {turn} {outcome}{why}"))
                }
                Err(_) => self.line(&format!("== turn {turn} finished")),
            },
            EventType::ApprovalRequested => match event.data.parse::<ApprovalRequestedData>() {
                Ok(approval) => self.line(&describe_approval(
                    &approval.approval_id,
                    approval.kind,
                    &approval.title,
                    approval.message.as_deref(),
                    approval.options.as_deref(),
                )),
                Err(_) => String::new(),
            },
            EventType::ApprovalSettled => match event.data.parse::<ApprovalSettledData>() {
                Ok(settled) => self.line(&describe_settled(settled)),
                Err(_) => String::new(),
            },
            EventType::SessionClosed => self.line("== session closed"),
            EventType::AgentStopped | EventType::SessionConfigured => String::new(),
        }
    }

    /// An agent event: reply text inline, a tool's start and end as lines.
    fn render_agent(&mut self, kind: &Kind, data: &str) -> String {
        match kind {
            Kind::MessageUpdate => match pi::event::text_delta(data) {
                Some(delta) => self.inline(&delta),
                None => String::new(),
            },
            Kind::ToolExecutionStart => {
                let run = ToolRun::read(data);
                let name = run.tool_name.as_deref().unwrap_or("tool");
                let args = compact(&run.args, 200);
                self.line(&format!("[tool] {name} {args}"))
            }
            Kind::ToolExecutionEnd => {
                let run = ToolRun::read(data);
                let name = run.tool_name.as_deref().unwrap_or("tool");
                let text = run.result_texts().join(" ").replace('\n', " ");
                let text = truncate(&text, MAX_RESULT_CHARS);
                let label = if run.is_error { "error" } else { "result" };
                self.line(&format!("[tool {label}] {name}: {text}"))
            }
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

/// A settled approval: its outcome, who settled it and the answer.
fn describe_settled(settled: ApprovalSettledData) -> String {
    let outcome = wire_name(&settled.outcome);
    let by = settled
        .device_id
        .map(|d| format!(" by {d}"))
        .unwrap_or_default();
    let value = settled
        .value
        .map(|v| format!(": {}", truncate(&v, 200)))
        .unwrap_or_default();
    format!("[approval {}] {outcome}{by}{value}", settled.approval_id)
}

/// An enum's name on the wire (`completed`, `allowed`...).
fn wire_name(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
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
