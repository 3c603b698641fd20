//! The human view of a session's events: text deltas inline, tool calls and results as lines,
//! approvals with their id and question. Event types it does not know are skipped.
//!
//! The history's entries (a message whole, a compaction's summary, a shell command) have their own view,
//! [`View::entry`]: one message per line, continuation lines indented, `you: …`,
//! `assistant: …`, `→ tool {args}`, `← tool: result…`, `[compacted: …]`.

use racp_proto::events::{
    ApprovalRequestedData, ApprovalSettledData, Event, EventType, SessionForkedData,
    SessionRenamedData, TurnFinishedData, TurnQueuedData, TurnStartedData, TurnWithdrawnData,
};
use racp_proto::methods::turn::{ApprovalInfo, ApprovalKind};
use racp_proto::pi::{self, Kind, event::ToolRun};
use serde_json::Value;

/// Longest tool result text shown, in characters.
const MAX_RESULT_CHARS: usize = 400;

/// Most lines of a tool result shown in a history entry: the result is in the history whole,
/// and a transcript is read for the conversation, not the output.
const ENTRY_RESULT_LINES: usize = 5;

/// Longest tool call arguments shown in a history entry, in characters.
const ENTRY_ARGS_CHARS: usize = 200;

/// Longest compaction summary shown (its first line), in characters.
const ENTRY_SUMMARY_CHARS: usize = 200;

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
            EventType::TurnStarted
            | EventType::TurnFinished
            | EventType::TurnQueued
            | EventType::TurnWithdrawn => self.render_turn(kind, event, turn),
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
            EventType::SessionRenamed => match event.data.parse::<SessionRenamedData>() {
                Ok(renamed) => self.line(&format!("== session renamed: {}", renamed.title)),
                Err(_) => String::new(),
            },
            EventType::SessionForked => match event.data.parse::<SessionForkedData>() {
                Ok(forked) if forked.from.is_some() => {
                    self.line(&format!("== forked from {}", forked.from_session_id))
                }
                Ok(cloned) => self.line(&format!("== cloned from {}", cloned.from_session_id)),
                Err(_) => String::new(),
            },
            EventType::AgentStopped | EventType::SessionConfigured => String::new(),
            // A shell command's data is pi's `bashExecution` message: shown as in the history.
            EventType::SessionBash => self.entry(event),
        }
    }

    /// A turn's start, end, or wait in the queue, as one line.
    fn render_turn(&mut self, kind: EventType, event: &Event, turn: &str) -> String {
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
            EventType::TurnQueued => {
                let text = event.data.parse::<TurnQueuedData>().map(|d| d.text);
                let text = text.unwrap_or_default();
                self.line(&format!("== queued {turn}: {}", truncate(&text, 200)))
            }
            EventType::TurnWithdrawn => match event.data.parse::<TurnWithdrawnData>() {
                Ok(withdrawn) => {
                    let reason = wire_name(&withdrawn.reason);
                    self.line(&format!("== queued {turn} withdrawn ({reason})"))
                }
                Err(_) => self.line(&format!("== queued {turn} withdrawn")),
            },
            _ => String::new(),
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

    /// A history entry (`agent.message_end`: a message whole; `agent.compaction_end`: a
    /// summary) as lines; other events, and messages with nothing to show, give nothing.
    pub fn entry(&mut self, event: &Event) -> String {
        let lines = entry_lines(event);
        if lines.is_empty() {
            return String::new();
        }
        let mut out = self.break_line();
        for line in lines {
            // Continuation lines are indented: a line at the margin starts a message.
            out.push_str(&line.replace('\n', "\n  "));
            out.push('\n');
        }
        out
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

/// The lines of a history entry (each may hold newlines).
fn entry_lines(event: &Event) -> Vec<String> {
    // A `Value` may round an integer beyond 64 bits; only text is read from it here.
    let Ok(data) = event.data.parse::<Value>() else {
        return Vec::new();
    };
    let mut lines = match Kind::of_event_type(&event.kind) {
        Some(Kind::MessageEnd) => message_lines(&data["message"]),
        None if event.kind == EventType::SessionBash.as_str() => message_lines(&data),
        Some(Kind::CompactionEnd | Kind::AutoCompactionEnd) => {
            summary_line("compacted", &data["result"]["summary"])
                .into_iter()
                .collect()
        }
        _ => Vec::new(),
    };
    if event.elided.is_some()
        && let Some(last) = lines.last_mut()
    {
        last.push_str(" [cut by the host]");
    }
    lines
}

/// A message of pi's, by its role.
fn message_lines(message: &Value) -> Vec<String> {
    let content = &message["content"];
    match message["role"].as_str().unwrap_or_default() {
        "user" => vec![format!("you: {}", content_text(content).trim())],
        "assistant" => assistant_lines(message),
        "toolResult" => {
            let name = message["toolName"].as_str().unwrap_or("tool");
            let error = message["isError"].as_bool().unwrap_or(false);
            vec![tool_result_line(name, &content_text(content), error)]
        }
        "bashExecution" => {
            let command = message["command"].as_str().unwrap_or_default();
            let output = message["output"].as_str().unwrap_or_default();
            vec![tool_result_line(&format!("$ {command}"), output, false)]
        }
        "compactionSummary" => summary_line("compacted", &message["summary"])
            .into_iter()
            .collect(),
        "branchSummary" => summary_line("branch", &message["summary"])
            .into_iter()
            .collect(),
        // An extension's message that asks not to be shown.
        "custom" if message["display"] == Value::Bool(false) => Vec::new(),
        "custom" => {
            let kind = message["customType"].as_str().unwrap_or("custom");
            vec![format!("[{kind}] {}", content_text(content).trim())]
        }
        "" => Vec::new(),
        role => vec![format!("{role}: {}", content_text(content).trim())],
    }
}

/// An assistant message: its text, its tool calls (`→ name {args}`), and why it stopped when it
/// failed or was aborted. Thinking is left out, as in the live view.
fn assistant_lines(message: &Value) -> Vec<String> {
    fn flush(text: &mut String, lines: &mut Vec<String>) {
        if !text.trim().is_empty() {
            lines.push(format!("assistant: {}", text.trim()));
        }
        text.clear();
    }
    let mut lines = Vec::new();
    let mut text = String::new();
    for part in message["content"].as_array().into_iter().flatten() {
        match part["type"].as_str() {
            Some("text") => text.push_str(part["text"].as_str().unwrap_or_default()),
            Some("toolCall") => {
                flush(&mut text, &mut lines);
                let name = part["name"].as_str().unwrap_or("tool");
                let args = compact(&part["arguments"], ENTRY_ARGS_CHARS);
                lines.push(format!("→ {name} {args}").trim_end().to_string());
            }
            _ => {}
        }
    }
    flush(&mut text, &mut lines);
    match message["stopReason"].as_str() {
        Some("error") => {
            let why = message["errorMessage"]
                .as_str()
                .unwrap_or("no reason given");
            lines.push(format!("assistant: [failed: {}]", truncate(why, 400)));
        }
        Some("aborted") => lines.push("assistant: [aborted]".into()),
        _ => {}
    }
    lines
}

/// `← name: output`, its first lines only, marked where cut.
fn tool_result_line(name: &str, output: &str, error: bool) -> String {
    let label = if error { " (error)" } else { "" };
    let output = output.trim_end();
    if output.is_empty() {
        return format!("← {name}{label}: (no output)");
    }
    let excerpt = excerpt(output, ENTRY_RESULT_LINES, MAX_RESULT_CHARS);
    format!("← {name}{label}: {excerpt}")
}

/// `[label: the summary's first line]`, or nothing without a summary.
fn summary_line(label: &str, summary: &Value) -> Option<String> {
    let summary = summary.as_str()?.trim();
    let first = summary.lines().next().unwrap_or_default();
    let more = if summary.lines().nth(1).is_some() && !first.is_empty() {
        " …"
    } else {
        ""
    };
    Some(format!(
        "[{label}: {}{more}]",
        truncate(first, ENTRY_SUMMARY_CHARS)
    ))
}

/// The text of a message's content: a string, or its text parts (an image as `[image]`).
fn content_text(content: &Value) -> String {
    if let Some(text) = content.as_str() {
        return text.to_string();
    }
    let parts = content.as_array().into_iter().flatten();
    let texts: Vec<&str> = parts
        .filter_map(|part| match part["type"].as_str() {
            Some("text") => part["text"].as_str(),
            Some("image") => Some("[image]"),
            _ => None,
        })
        .collect();
    texts.join("\n")
}

/// The first `max_lines` lines of `text`, at most `max_chars` characters, ending in `…` when
/// anything was left out.
fn excerpt(text: &str, max_lines: usize, max_chars: usize) -> String {
    let mut lines = text.lines();
    let kept = lines
        .by_ref()
        .take(max_lines)
        .collect::<Vec<_>>()
        .join("\n");
    let more_lines = lines.next().is_some();
    let cut = truncate(&kept, max_chars);
    if more_lines && cut == kept {
        format!("{cut} …")
    } else {
        cut
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
    fn a_shell_command_shows_as_in_the_history() {
        let mut view = View::default();
        let ran = event(
            "session.bash",
            json!({"role": "bashExecution", "command": "git status", "output": "clean\n",
                   "exitCode": 0, "cancelled": false, "truncated": false, "timestamp": 1}),
        );
        assert_eq!(view.render(&ran), "← $ git status: clean\n");
        assert_eq!(view.entry(&ran), "← $ git status: clean\n");
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

    fn message(message: Value) -> Event {
        event(
            "agent.message_end",
            json!({"type": "message_end", "message": message}),
        )
    }

    #[test]
    fn history_entries_read_as_a_conversation() {
        let mut view = View::default();
        let entries = [
            message(json!({"role": "user", "content": "fix the tests\nplease"})),
            message(json!({"role": "user", "content": [
                {"type": "text", "text": "and this"}, {"type": "image", "mimeType": "image/png"}
            ]})),
            message(
                json!({"role": "assistant", "stopReason": "toolUse", "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "text", "text": "Running them."},
                    {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}}
                ]}),
            ),
            message(
                json!({"role": "toolResult", "toolName": "bash", "isError": false,
                "content": [{"type": "text", "text": "a\nb\nc\nd\ne\nf\ng\n"}]}),
            ),
            message(
                json!({"role": "assistant", "stopReason": "error", "content": [],
                "errorMessage": "503"}),
            ),
            event(
                "agent.compaction_end",
                json!({"type": "compaction_end", "result": {"summary": "Fixed.\nMore."}}),
            ),
            event("turn.finished", json!({"outcome": "completed"})),
        ];
        let out: String = entries.iter().map(|e| view.entry(e)).collect();
        assert_eq!(
            out,
            "you: fix the tests\n  please\n\
             you: and this\n  [image]\n\
             assistant: Running them.\n\
             → bash {\"command\":\"ls\"}\n\
             ← bash: a\n  b\n  c\n  d\n  e …\n\
             assistant: [failed: 503]\n\
             [compacted: Fixed. …]\n"
        );
    }

    #[test]
    fn a_long_tool_result_is_cut_to_its_first_characters() {
        let mut view = View::default();
        let long = "x".repeat(1000);
        let out = view.entry(&message(json!({"role": "toolResult", "toolName": "read",
            "isError": true, "content": [{"type": "text", "text": long}]})));
        assert_eq!(out, format!("← read (error): {}…\n", "x".repeat(400)));
    }
}
