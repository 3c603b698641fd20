//! `session/*`: sessions, snapshots and subscriptions.

pub use super::model::SessionSettings;
use super::model::{ModelRef, QueueMode, ThinkingLevel};
use super::turn::{ApprovalInfo, TurnInfo};
use crate::AppError;
use crate::cursor::Cursor;
use crate::events::Event;
use crate::limits::{
    MAX_EXPORT_BYTES, MAX_HISTORY_LIMIT, MAX_HISTORY_PAGE_BYTES, MAX_ID_CHARS, MAX_NAME_CHARS,
    MAX_PATH_CHARS, MAX_SHELL_COMMAND_CHARS, MAX_TEXT_CHARS, MIN_EXPORT_BYTES,
    MIN_HISTORY_PAGE_BYTES,
};
use crate::permission::{PermissionGrant, PermissionMode};
use crate::validate::{NAME_PATTERN, Validate, length, name, range};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    /// No turn is running.
    Idle,
    /// A turn is running.
    Running,
    /// Closed: its log can still be read, but no turn can start.
    Closed,
}

/// A session as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub session_id: String,
    /// Canonical workspace directory the agent runs in.
    pub workspace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub state: SessionState,
    /// When it was created (ms since the Unix epoch).
    pub created_at: u64,
    /// The head of its event log: subscribing from here receives only new events.
    pub cursor: Cursor,
    /// The running turn, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_turn_id: Option<String>,
    /// The model, thinking level and auto-compaction set for it (`session/create`,
    /// `session/configure`); an absent one is the agent's own default.
    #[serde(flatten)]
    pub settings: SessionSettings,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionCreateParams {
    /// Absolute path of the workspace directory, or `~` / `~/...` for the host user's home
    /// (resolved on the host); it must lie inside the host's permitted roots.
    #[schemars(length(min = 1, max = MAX_PATH_CHARS))]
    pub workspace: String,
    /// A title shown in session lists; no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = NAME_PATTERN))]
    pub title: Option<String>,
    /// The model to run on; absent: the agent's default. One the agent does not know is
    /// MODEL_NOT_CONFIGURED, one whose provider has no credential PROVIDER_SECRET_MISSING.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_level: Option<ThinkingLevel>,
    /// What the agent may do without asking (docs/protocol.md, "Permissions"); absent: the
    /// host's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<PermissionMode>,
}

impl Validate for SessionCreateParams {
    fn validate(&self) -> Result<(), AppError> {
        length("workspace", &self.workspace, 1, MAX_PATH_CHARS)?;
        if let Some(title) = &self.title {
            name("title", title, 1, MAX_NAME_CHARS)?;
        }
        if let Some(model) = &self.model {
            model.check("model")?;
        }
        Ok(())
    }
}

/// Changes what a session runs with. Each field given replaces the session's (none given
/// changes nothing and returns the session); the running
/// agent takes it at once (a running turn from its next model request), and every later
/// agent of the session starts with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionConfigureParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_level: Option<ThinkingLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compaction: Option<bool>,
    /// pi's `set_steering_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering_mode: Option<QueueMode>,
    /// pi's `set_follow_up_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up_mode: Option<QueueMode>,
    /// The permission mode (docs/protocol.md, "Permissions"), from the agent's next tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<PermissionMode>,
    /// Withdraws every grant given with "always" in this session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear_grants: bool,
}

impl SessionConfigureParams {
    pub fn settings(&self) -> SessionSettings {
        SessionSettings {
            model: self.model.clone(),
            thinking_level: self.thinking_level,
            auto_compaction: self.auto_compaction,
            steering_mode: self.steering_mode,
            follow_up_mode: self.follow_up_mode,
            permission_mode: self.permission_mode,
        }
    }
}

impl Validate for SessionConfigureParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(model) = &self.model {
            model.check("model")?;
        }
        Ok(())
    }
}

/// Gives a session another title (pi's session name too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRenameParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// No control characters.
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = NAME_PATTERN))]
    pub title: String,
}

impl Validate for SessionRenameParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        name("title", &self.title, 1, MAX_NAME_CHARS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionCreateResult {
    pub session: SessionInfo,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionListResult {
    pub sessions: Vec<SessionInfo>,
}

/// Names one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRef {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
}

impl Validate for SessionRef {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)
    }
}

/// Everything a client needs to draw a session without replaying its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub state: SessionState,
    /// Recent turns, oldest first (the running one last).
    pub turns: Vec<TurnInfo>,
    /// Approvals waiting for an answer.
    pub pending_approvals: Vec<ApprovalInfo>,
    /// The grants given with "always" in this session (docs/protocol.md, "Permissions"), oldest
    /// first. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<PermissionGrant>,
    /// What waits while a turn works: the agent's steering messages and the host's follow-ups
    /// (docs/protocol.md §7.25). Absent when both are empty.
    #[serde(default, skip_serializing_if = "Queue::is_empty")]
    pub queue: Queue,
    /// The assistant message being streamed, as far as the snapshot's cursor (pi's message
    /// shape; docs/protocol.md §8.1, "Compact streams"). Absent when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming_message: Option<serde_json::Value>,
    /// The output so far of each running tool, by tool call id (pi's `partialResult` shape).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tool_outputs: std::collections::BTreeMap<String, serde_json::Value>,
    /// The conversation's most recent entries up to the snapshot's cursor (bounded in bytes;
    /// an entry over 16 KiB cut as in docs/protocol.md §8.6), and where to page back from with
    /// `session/history` (docs/protocol.md §7.24, §8.4).
    #[serde(default)]
    pub history: HistoryPage,
}

/// What waits to run while a turn works: the steering messages the agent holds (pi's
/// `queue_update`) and the follow-ups the host holds (docs/protocol.md §7.25), each in the
/// order it will be delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    /// Steering messages (`turn/steer`): delivered before the agent's next model request.
    #[serde(default)]
    pub steering: Vec<String>,
    /// Follow-ups (`turn/follow_up`): each runs as a turn of its own when the turn before it
    /// completes; `session/clear_queue` withdraws them.
    #[serde(default)]
    pub follow_ups: Vec<QueuedFollowUp>,
}

/// A follow-up waiting for its turn: its `turnId` has no `turn.started` yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedFollowUp {
    pub turn_id: String,
    pub text: String,
    /// The images sent with it, named only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<super::turn::ImageInfo>,
    /// The device that queued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
}

/// Withdraws queued follow-ups before they run: the one named, or all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionClearQueueParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// The follow-up's turn to withdraw; absent, every queued follow-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub turn_id: Option<String>,
}

impl Validate for SessionClearQueueParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        match &self.turn_id {
            Some(turn_id) => length("turnId", turn_id, 1, MAX_ID_CHARS),
            None => Ok(()),
        }
    }
}

/// The follow-ups withdrawn now, in queue order (their text, to put back where it was typed);
/// empty when none waited (a resend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionClearQueueResult {
    pub withdrawn: Vec<QueuedFollowUp>,
}

impl Queue {
    pub fn is_empty(&self) -> bool {
        self.steering.is_empty() && self.follow_ups.is_empty()
    }
}

/// Compacts a session's conversation: the agent summarises it and keeps only the summary and
/// its most recent messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionCompactParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// What the summary should focus on (pi's `customInstructions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_TEXT_CHARS))]
    pub instructions: Option<String>,
}

impl Validate for SessionCompactParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(instructions) = &self.instructions {
            length("instructions", instructions, 1, MAX_TEXT_CHARS)?;
        }
        Ok(())
    }
}

/// pi's compaction result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionCompactResult {
    /// The summary that replaces the older messages.
    pub summary: String,
    /// The context's size before, in tokens (pi's estimate).
    pub tokens_before: u64,
    /// pi's id of the oldest message kept after the summary.
    pub first_kept_entry_id: String,
    /// pi's details (the files read and modified), as pi gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// Makes a new session from an earlier point of a session's conversation: everything before one
/// of its user messages (docs/protocol.md §7.31).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionForkParams {
    /// The session to fork.
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// The cursor of one of its history entries that is a user message (`agent.message_end`
    /// with `data.message.role` `user`): the new session holds what came before it.
    pub from: Cursor,
    /// The new session's title; no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = NAME_PATTERN))]
    pub title: Option<String>,
}

impl Validate for SessionForkParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(title) = &self.title {
            name("title", title, 1, MAX_NAME_CHARS)?;
        }
        Ok(())
    }
}

/// The forked session, and the text of the message it was forked at (to edit and send again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionForkResult {
    pub session: SessionInfo,
    /// The user message's text (pi's `fork` answer; images left out).
    pub text: String,
}

/// Makes a new session holding a session's whole conversation (docs/protocol.md §7.32).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionCloneParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// The new session's title; no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = NAME_PATTERN))]
    pub title: Option<String>,
}

impl Validate for SessionCloneParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(title) = &self.title {
            name("title", title, 1, MAX_NAME_CHARS)?;
        }
        Ok(())
    }
}

/// Entries of a session's history, oldest first: each is the event that carried a message
/// whole or a compaction's summary (`agent.message_end`, `agent.compaction_end`), exactly as
/// it was delivered live, with its seq and cursor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPage {
    pub entries: Vec<Event>,
    /// Present when older entries exist: pass it as `upTo` to `session/history` for the page
    /// before this one. Absent: the page reaches the start of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier: Option<Cursor>,
    /// True when the host's history policy dropped entries older than any it still holds
    /// (docs/protocol.md §7.24, "Bounds").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Asks for a page of a session's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionHistoryParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// The page ends with the last entry at or before this cursor (a snapshot's `cursor`, a
    /// page's `earlier`, any event's cursor). Absent: the log's head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to: Option<Cursor>,
    /// Most entries in the page; 100 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_HISTORY_LIMIT))]
    pub limit: Option<u32>,
    /// Most bytes of entries in the page (256 KiB when absent); one entry larger than this
    /// comes alone, cut to fit (docs/protocol.md §8.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_HISTORY_PAGE_BYTES, max = MAX_HISTORY_PAGE_BYTES))]
    pub max_bytes: Option<u32>,
}

impl Validate for SessionHistoryParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(limit) = self.limit {
            range("limit", limit.into(), 1, MAX_HISTORY_LIMIT.into())?;
        }
        if let Some(max_bytes) = self.max_bytes {
            range(
                "maxBytes",
                max_bytes.into(),
                MIN_HISTORY_PAGE_BYTES.into(),
                MAX_HISTORY_PAGE_BYTES.into(),
            )?;
        }
        Ok(())
    }
}

/// A page of history and the position it was read up to: subscribing from `cursor` delivers
/// every later entry as a live event, none of them twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionHistoryResult {
    pub cursor: Cursor,
    /// The page's fields, as in [`HistoryPage`] (written out: serde cannot flatten the raw
    /// `data` of an event).
    pub entries: Vec<Event>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier: Option<Cursor>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl SessionHistoryResult {
    pub fn new(cursor: Cursor, page: HistoryPage) -> SessionHistoryResult {
        SessionHistoryResult {
            cursor,
            entries: page.entries,
            earlier: page.earlier,
            truncated: page.truncated,
        }
    }

    /// The page without the cursor it was read up to.
    pub fn into_page(self) -> HistoryPage {
        HistoryPage {
            entries: self.entries,
            earlier: self.earlier,
            truncated: self.truncated,
        }
    }
}

/// A session, its snapshot, and the cursor the snapshot was taken at: subscribing from that
/// cursor continues exactly where the snapshot ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionGetResult {
    pub session: SessionInfo,
    pub snapshot: Snapshot,
    pub cursor: Cursor,
}

/// Asks for the streams in progress at a cursor of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionStreamParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// A cursor of this session inside its retained window (CURSOR_EXPIRED otherwise).
    pub cursor: Cursor,
}

impl Validate for SessionStreamParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)
    }
}

/// What was streaming as of `cursor`: the same fields as a snapshot's, so a client seeds its
/// stream state with them and applies the events after `cursor` (docs/protocol.md §8.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionStreamResult {
    pub cursor: Cursor,
    /// The assistant message being streamed at `cursor` (pi's message shape). Absent: none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming_message: Option<serde_json::Value>,
    /// The output so far of each tool running at `cursor`, by tool call id.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tool_outputs: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Starts a subscription to a session's events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionSubscribeParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// Replay every event after this cursor, then go live. Absent: only events from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Cursor>,
}

impl Validate for SessionSubscribeParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSubscribeResult {
    pub subscription_id: String,
    /// Where the subscription starts: events after this cursor will arrive.
    pub cursor: Cursor,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionUnsubscribeParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub subscription_id: String,
}

impl Validate for SessionUnsubscribeParams {
    fn validate(&self) -> Result<(), AppError> {
        length("subscriptionId", &self.subscription_id, 1, MAX_ID_CHARS)
    }
}

/// Runs a shell command in a session's workspace, as pi's `!command` does locally: its output
/// joins the conversation (the model sees it with the next prompt) and the session's history
/// (`session.bash`, docs/protocol.md §7.27).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionBashParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// The command line, run by the host user's shell in the workspace.
    #[schemars(length(min = 1, max = MAX_SHELL_COMMAND_CHARS))]
    pub command: String,
}

impl Validate for SessionBashParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("command", &self.command, 1, MAX_SHELL_COMMAND_CHARS)
    }
}

/// How a shell command ended (pi's `BashResult`, without the path of its full output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionBashResult {
    /// Its output (stdout and stderr together), the end of it when `truncated`.
    pub output: String,
    /// Absent when it did not exit by itself (cancelled, killed by a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Aborted (`session/bash_abort`, or the host's deadline).
    pub cancelled: bool,
    /// `output` is only the end of what the command wrote.
    pub truncated: bool,
}

/// A session's totals (docs/protocol.md §7.28): the whole session's, counted from its history,
/// so they need no agent (a compaction takes messages out of the model's context, not out of
/// these); `context` and `contextUsage` only when the session's agent runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatsResult {
    pub user_messages: u64,
    pub assistant_messages: u64,
    /// Tool calls the assistant messages made.
    pub tool_calls: u64,
    pub tool_results: u64,
    /// Shell commands run with `session/bash`.
    pub shell_commands: u64,
    /// Every message of the history (user, assistant, tool result, shell command, custom).
    pub total_messages: u64,
    pub tokens: TokenTotals,
    /// The cost pi computed for the assistant messages, in US dollars.
    pub cost: f64,
    /// True when the host's history bounds dropped older entries: the totals are of what is kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// How full the model's context is, from the running agent; absent when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_usage: Option<ContextUsage>,
    /// What the model's context holds now, as the running agent counts it (pi's
    /// `get_session_stats`); absent when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextStats>,
}

/// The messages in the model's context now and their usage, as pi's `get_session_stats`
/// counts them: after a compaction, its summary and the messages it kept, not the ones it
/// summarised (those stay in the session's totals).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextStats {
    pub user_messages: u64,
    pub assistant_messages: u64,
    pub tool_calls: u64,
    pub tool_results: u64,
    /// Every message in the context: the above, a compaction's summary, shell commands
    /// (`bashExecution`), extensions' messages.
    pub total_messages: u64,
    pub tokens: TokenTotals,
    /// The cost pi computed for the assistant messages in the context, in US dollars.
    pub cost: f64,
}

/// Tokens over a session's assistant messages, as the providers reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenTotals {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// The four added up.
    pub total: u64,
}

/// pi's estimate of the context window in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextUsage {
    /// Tokens in the context; absent right after a compaction, until the next reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    pub context_window: u64,
    /// `tokens` as a percentage of `contextWindow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
}

/// The commands a prompt may start with `/name` in a session's workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionCommandsResult {
    pub commands: Vec<AgentCommand>,
}

/// One slash command of the session's agent: run it with `turn/start` and the text
/// `/name arguments` (docs/protocol.md §7.29).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCommand {
    /// What follows the `/` (skills are `skill:<name>`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `extension`, `prompt` (a prompt template) or `skill`.
    pub source: String,
    /// Where it was loaded from: `user`, `project` or `temporary`; absent when pi does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// Asks for a session exported as one HTML page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionExportParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// Most bytes of HTML to return (768 KiB when absent); a larger export is
    /// PAYLOAD_TOO_LARGE. Ask for more only on a connection whose frame bound holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_EXPORT_BYTES, max = MAX_EXPORT_BYTES))]
    pub max_bytes: Option<u32>,
}

impl Validate for SessionExportParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(max_bytes) = self.max_bytes {
            range(
                "maxBytes",
                max_bytes.into(),
                MIN_EXPORT_BYTES.into(),
                MAX_EXPORT_BYTES.into(),
            )?;
        }
        Ok(())
    }
}

/// The session as pi's HTML export: one self-contained page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionExportResult {
    pub html: String,
    /// The page's size in bytes (UTF-8).
    pub bytes: u64,
}
