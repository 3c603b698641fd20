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
use racp_proto::methods::workspace::{ChangeKind, FileChange, WorkspaceChangedData};
use racp_proto::permission::{PermissionDecidedData, PermissionQuestion};
use racp_proto::pi::message::{AssistantStop, Entry, Message, Part};
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

/// A `workspace.changed` as one line: each path with a sign (`+` created, `~` modified, `-`
/// removed, `>` renamed), or the rescan it asks for.
pub fn describe_changes(changed: &WorkspaceChangedData) -> String {
    let mut text = String::from("== files:");
    for change in changed.changes.iter().take(20) {
        let sign = match change.kind {
            ChangeKind::Created => "+",
            ChangeKind::Modified => "~",
            ChangeKind::Removed => "-",
            ChangeKind::Renamed => ">",
        };
        text.push_str(&format!(" {sign}{}", change.path));
    }
    if changed.changes.len() > 20 {
        text.push_str(&format!(" (+{} more)", changed.changes.len() - 20));
    }
    if changed.rescan {
        let reason = changed.reason.as_deref().unwrap_or("unknown");
        text.push_str(&format!(" [rescan: {reason}]"));
    }
    text
}

/// One file a turn changed: its kind, path and line counts (`+3 -1`).
pub fn describe_file(file: &FileChange) -> String {
    let counts = match (file.added, file.removed) {
        (Some(added), Some(removed)) => format!(" +{added} -{removed}"),
        (Some(added), None) => format!(" +{added}"),
        _ => String::new(),
    };
    format!("{} {}{counts}", wire_name(&file.kind), file.path)
}

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
                    approval.permission.as_deref(),
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
            EventType::PermissionDecided => match event.data.parse::<PermissionDecidedData>() {
                Ok(decided) => self.line(&describe_decided(&decided)),
                Err(_) => String::new(),
            },
            EventType::AgentStopped | EventType::SessionConfigured => String::new(),
            EventType::WorkspaceChanged => match event.data.parse::<WorkspaceChangedData>() {
                Ok(changed) => self.line(&describe_changes(&changed)),
                Err(_) => String::new(),
            },
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
                    let mut text = format!("== turn {turn} {outcome}{why}");
                    for file in &finished.files {
                        text.push_str(&format!("\n   {}", describe_file(file)));
                    }
                    self.line(&text)
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
    let entry = match Kind::of_event_type(&event.kind) {
        Some(kind) => Entry::of_agent_event(&kind, event.data.get()),
        None if event.kind == EventType::SessionBash.as_str() => {
            Entry::of_message(event.data.get())
        }
        None => None,
    };
    let mut lines = match entry {
        Some(Entry::Message(message)) => message_lines(&message),
        Some(Entry::Compacted { summary }) => vec![summary_line("compacted", &summary)],
        None => Vec::new(),
    };
    if event.elided.is_some()
        && let Some(last) = lines.last_mut()
    {
        last.push_str(" [cut by the host]");
    }
    lines
}

/// A message of pi's, by its role.
fn message_lines(message: &Message) -> Vec<String> {
    match message {
        Message::User { content } => vec![format!("you: {}", content_text(content).trim())],
        Message::Assistant { content, stop } => assistant_lines(content, stop),
        Message::ToolResult {
            tool_name,
            content,
            is_error,
        } => {
            let name = tool_name.as_deref().unwrap_or("tool");
            vec![tool_result_line(name, &content_text(content), *is_error)]
        }
        Message::BashExecution { command, output } => {
            vec![tool_result_line(&format!("$ {command}"), output, false)]
        }
        Message::CompactionSummary { summary } => vec![summary_line("compacted", summary)],
        Message::BranchSummary { summary } => vec![summary_line("branch", summary)],
        // An extension's message that asks not to be shown.
        Message::Custom { display: false, .. } => Vec::new(),
        Message::Custom {
            custom_type,
            content,
            ..
        } => {
            let kind = custom_type.as_deref().unwrap_or("custom");
            vec![format!("[{kind}] {}", content_text(content).trim())]
        }
        Message::Other { role, .. } if role.is_empty() => Vec::new(),
        Message::Other { role, content } => {
            vec![format!("{role}: {}", content_text(content).trim())]
        }
    }
}

/// An assistant message: its text, its tool calls (`→ name {args}`), and why it stopped when it
/// failed or was aborted. Thinking is left out, as in the live view.
fn assistant_lines(content: &[Part], stop: &AssistantStop) -> Vec<String> {
    fn flush(text: &mut String, lines: &mut Vec<String>) {
        if !text.trim().is_empty() {
            lines.push(format!("assistant: {}", text.trim()));
        }
        text.clear();
    }
    let mut lines = Vec::new();
    let mut text = String::new();
    for part in content {
        match part {
            Part::Text(part) => text.push_str(part),
            Part::ToolCall { name, arguments } => {
                flush(&mut text, &mut lines);
                let name = name.as_deref().unwrap_or("tool");
                let args = compact(arguments, ENTRY_ARGS_CHARS);
                lines.push(format!("→ {name} {args}").trim_end().to_string());
            }
            Part::Image | Part::Thinking | Part::Other => {}
        }
    }
    flush(&mut text, &mut lines);
    match stop {
        AssistantStop::Failed(why) => {
            let why = why.as_deref().unwrap_or("no reason given");
            lines.push(format!("assistant: [failed: {}]", truncate(why, 400)));
        }
        AssistantStop::Aborted => lines.push("assistant: [aborted]".into()),
        AssistantStop::Finished => {}
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

/// `[label: the summary's first line]`.
fn summary_line(label: &str, summary: &str) -> String {
    let summary = summary.trim();
    let first = summary.lines().next().unwrap_or_default();
    let more = if summary.lines().nth(1).is_some() && !first.is_empty() {
        " …"
    } else {
        ""
    };
    format!("[{label}: {}{more}]", truncate(first, ENTRY_SUMMARY_CHARS))
}

/// The text of a message's content: its text parts, an image as `[image]`.
fn content_text(content: &[Part]) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            Part::Image => Some("[image]"),
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
    permission: Option<&PermissionQuestion>,
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
    if let Some(grant) = permission.and_then(|p| p.grant.as_ref()) {
        let scope = wire_name(&grant.scope);
        out.push_str(&format!(
            " [always = {} {scope} {}]",
            grant.tool,
            truncate(&grant.value, 200)
        ));
    }
    out.push_str(match kind {
        ApprovalKind::Permission => {
            " (answer allow, always or deny; deny: NOTE tells the model why)"
        }
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
        approval.permission.as_ref(),
    )
}

pub fn kind_name(kind: ApprovalKind) -> &'static str {
    match kind {
        ApprovalKind::Confirm => "confirm",
        ApprovalKind::Select => "select",
        ApprovalKind::Input => "input",
        ApprovalKind::Editor => "editor",
        ApprovalKind::Permission => "permission",
    }
}

/// Who an event says acted: the device's name, or its id from a host older than
/// `deviceName`.
fn actor(device_id: Option<&str>, device_name: Option<&str>) -> Option<String> {
    device_name.or(device_id).map(|who| truncate(who, 200))
}

/// A tool call's permission decision, as one line (`person` with the device's name or id).
fn describe_decided(decided: &PermissionDecidedData) -> String {
    let what = decided
        .summary
        .command
        .as_deref()
        .or(decided.summary.path.as_deref())
        .map(|w| format!(" {}", truncate(w, 200)))
        .unwrap_or_default();
    let by = match actor(decided.device_id.as_deref(), decided.device_name.as_deref()) {
        Some(who) => format!("{} {who}", wire_name(&decided.by)),
        None => wire_name(&decided.by),
    };
    match decided.code {
        None => format!("[permission] {}{what}: allowed ({by})", decided.tool),
        Some(code) => format!(
            "[permission] {}{what}: {code} ({by}): {}",
            decided.tool,
            truncate(&decided.reason, 300)
        ),
    }
}

/// A settled approval: its outcome, who settled it (the device's name when the event has it)
/// and the answer.
fn describe_settled(settled: ApprovalSettledData) -> String {
    let outcome = wire_name(&settled.outcome);
    let by = actor(settled.device_id.as_deref(), settled.device_name.as_deref())
        .map(|who| format!(" by {who}"))
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

    #[test]
    fn who_settled_an_approval_is_its_name_else_its_id() {
        let mut view = View::default();
        let named = view.render(&event(
            "approval.settled",
            json!({"approvalId": "apr_1", "outcome": "allowed",
                   "deviceId": "dev_1", "deviceName": "phone"}),
        ));
        assert_eq!(named, "[approval apr_1] allowed by phone\n");
        // An event of a host older than `deviceName`.
        let older = view.render(&event(
            "approval.settled",
            json!({"approvalId": "apr_2", "outcome": "denied", "deviceId": "dev_1"}),
        ));
        assert_eq!(older, "[approval apr_2] denied by dev_1\n");
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
