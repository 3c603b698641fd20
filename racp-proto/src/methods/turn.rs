//! `turn/*` and `approval/respond`: driving the agent.

use crate::error::AppError;
use crate::limits::{MAX_ANSWER_CHARS, MAX_ID_CHARS, MAX_TEXT_CHARS};
use crate::validate::{Validate, length};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Starts a turn. Keys are scoped to the session: in one session the same `idempotencyKey` with
/// the same `text` returns the same turn, so a client may resend it after HOST_DISCONNECTED;
/// other `text` gives IDEMPOTENCY_CONFLICT (docs/protocol.md §6.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnStartParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub idempotency_key: String,
    /// The prompt.
    #[schemars(length(min = 1, max = MAX_TEXT_CHARS))]
    pub text: String,
}

impl Validate for TurnStartParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("idempotencyKey", &self.idempotency_key, 1, MAX_ID_CHARS)?;
        length("text", &self.text, 1, MAX_TEXT_CHARS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartResult {
    pub turn_id: String,
}

/// Queues a follow-up: a prompt run after the work going on now ends, as a turn of its own;
/// while no turn runs, it starts one at once. Idempotent by key, as `turn/start`, and in the
/// same key space (docs/protocol.md §7.25).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnFollowUpParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub idempotency_key: String,
    /// The prompt.
    #[schemars(length(min = 1, max = MAX_TEXT_CHARS))]
    pub text: String,
}

impl Validate for TurnFollowUpParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("idempotencyKey", &self.idempotency_key, 1, MAX_ID_CHARS)?;
        length("text", &self.text, 1, MAX_TEXT_CHARS)
    }
}

/// The follow-up's turn: started now (`queued: false`), or waiting in the agent's queue, its
/// `turn.started` to come when the agent takes it (`queued: true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnFollowUpResult {
    pub turn_id: String,
    pub queued: bool,
}

/// Adds guidance to the running turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnSteerParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub turn_id: String,
    #[schemars(length(min = 1, max = MAX_TEXT_CHARS))]
    pub text: String,
}

impl Validate for TurnSteerParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("turnId", &self.turn_id, 1, MAX_ID_CHARS)?;
        length("text", &self.text, 1, MAX_TEXT_CHARS)
    }
}

/// Names one turn of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnRef {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub turn_id: String,
}

impl Validate for TurnRef {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("turnId", &self.turn_id, 1, MAX_ID_CHARS)
    }
}

/// Where a turn is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TurnState {
    Running,
    Completed,
    Aborted,
    Failed,
}

/// A turn as shown in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnInfo {
    pub turn_id: String,
    pub state: TurnState,
    /// The prompt that started it.
    pub text: String,
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Why it failed or was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AppError>,
}

/// The kind of question an approval asks (the agent's confirm, select, input or editor request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalKind {
    /// Yes or no: answer `allow` or `deny`.
    Confirm,
    /// Pick one of `options`: answer `{"value": option}`.
    Select,
    /// Free text on one line: answer `{"value": text}`.
    Input,
    /// Free text, multi-line: answer `{"value": text}`.
    Editor,
}

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalState {
    Pending,
    Allowed,
    Denied,
    Answered,
    /// The deadline passed with no answer; the agent was told "no".
    Expired,
    /// The turn ended before anyone answered.
    Cancelled,
}

/// A question the agent asked a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalInfo {
    pub approval_id: String,
    pub session_id: String,
    pub turn_id: String,
    pub kind: ApprovalKind,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The choices of a `select`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// Absolute deadline (ms since the Unix epoch); at it the host settles the approval as expired.
    pub deadline: u64,
    pub state: ApprovalState,
    /// The device whose answer settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<String>,
    /// The answer of a select, input or editor approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A yes-or-no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

/// A text answer to a select, input or editor approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    #[schemars(length(max = MAX_ANSWER_CHARS))]
    pub value: String,
}

/// `"allow"`, `"deny"`, or `{"value": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Decision {
    Verdict(Verdict),
    Answer(Answer),
}

// Hand-written rather than `untagged`: serde's untagged path would also read `Answer` from a
// JSON array, which the schema forbids, and its error says nothing useful.
impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(deserializer)?;
        match value {
            serde_json::Value::String(_) => Verdict::deserialize(value)
                .map(Decision::Verdict)
                .map_err(D::Error::custom),
            serde_json::Value::Object(_) => Answer::deserialize(value)
                .map(Decision::Answer)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                r#"expected "allow", "deny" or {"value": "..."}"#,
            )),
        }
    }
}

/// Answers an approval. The first answer wins across devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalRespondParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub approval_id: String,
    pub decision: Decision,
}

impl Validate for ApprovalRespondParams {
    fn validate(&self) -> Result<(), AppError> {
        length("approvalId", &self.approval_id, 1, MAX_ID_CHARS)?;
        if let Decision::Answer(answer) = &self.decision {
            length("decision.value", &answer.value, 0, MAX_ANSWER_CHARS)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRespondResult {
    pub approval: ApprovalInfo,
}
