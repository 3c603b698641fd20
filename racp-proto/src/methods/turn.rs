//! `turn/*` and `approval/respond`: driving the agent.

use crate::ErrorCode;
use crate::error::AppError;
use crate::limits::{
    IMAGE_MIME_TYPES, MAX_ANSWER_CHARS, MAX_ID_CHARS, MAX_IMAGE_BYTES, MAX_IMAGES, MAX_TEXT_CHARS,
};
use crate::validate::{Validate, invalid, length};
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
    /// Images sent with the prompt (the `attachments` capability): at most 8, each at most
    /// 5 MiB decoded (docs/protocol.md §7.15).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_IMAGES))]
    pub images: Vec<ImageAttachment>,
}

impl Validate for TurnStartParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        length("idempotencyKey", &self.idempotency_key, 1, MAX_ID_CHARS)?;
        length("text", &self.text, 1, MAX_TEXT_CHARS)?;
        if self.images.len() > MAX_IMAGES {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "a prompt carries at most {MAX_IMAGES} images, this one {}: send the rest \
                     with the next prompt",
                    self.images.len()
                ),
            )
            .with_details(serde_json::json!({"path": "params.images", "limit": MAX_IMAGES, "count": self.images.len()})));
        }
        for (i, image) in self.images.iter().enumerate() {
            image.validate(&format!("images.{i}"))?;
        }
        Ok(())
    }
}

/// An image sent with a prompt, as pi takes it (`ImageContent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageAttachment {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub mime_type: String,
    /// The image's bytes in base64 (standard alphabet, padded).
    pub data: String,
}

impl ImageAttachment {
    /// The image's size decoded.
    pub fn bytes(&self) -> u64 {
        let padding = self.data.bytes().rev().take_while(|b| *b == b'=').count();
        (self.data.len() / 4 * 3).saturating_sub(padding) as u64
    }

    /// What the log and the snapshot keep of it: the bytes go to the agent, and come back once
    /// in the prompt's own message (docs/protocol.md §7.15).
    pub fn info(&self) -> ImageInfo {
        ImageInfo {
            mime_type: self.mime_type.clone(),
            bytes: self.bytes(),
        }
    }

    fn validate(&self, path: &str) -> Result<(), AppError> {
        if !IMAGE_MIME_TYPES.contains(&self.mime_type.as_str()) {
            return Err(invalid(
                &format!("{path}.mimeType"),
                format!("must be one of {}", IMAGE_MIME_TYPES.join(", ")),
            ));
        }
        if !is_base64(&self.data) {
            return Err(invalid(
                &format!("{path}.data"),
                "must be the image's bytes in base64 (standard alphabet, padded)",
            ));
        }
        let bytes = self.bytes();
        if bytes > MAX_IMAGE_BYTES {
            return Err(AppError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "{path} is {bytes} bytes; an image may be at most {MAX_IMAGE_BYTES} bytes: \
                     scale it down or send it as a smaller format"
                ),
            )
            .with_details(serde_json::json!({"path": format!("params.{path}"), "size": bytes, "limit": MAX_IMAGE_BYTES})));
        }
        Ok(())
    }
}

/// Checked by hand rather than decoded: the bytes go on to the agent as they came, and decoding
/// megabytes only to throw them away would cost the call a copy.
fn is_base64(data: &str) -> bool {
    let body = data.trim_end_matches('=');
    !data.is_empty()
        && data.len().is_multiple_of(4)
        && data.len() - body.len() <= 2
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// An image a prompt carried, as the log and the snapshot name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub mime_type: String,
    /// Its size, decoded.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartResult {
    pub turn_id: String,
}

/// Queues a follow-up: a prompt run once the running turn completes, as a turn of its own;
/// while no turn runs, it starts one at once. The same params as `turn/start` (images too),
/// idempotent by key in the same key space (docs/protocol.md §7.25).
pub type TurnFollowUpParams = TurnStartParams;

/// The follow-up's turn: started now (`queued: false`), or waiting in the host's queue, its
/// `turn.started` to come when the turn before it completes (`queued: true`).
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
    /// The files it changed, as its `turn.finished` names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::methods::workspace::FileChange>,
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
    /// The permission policy asks before a tool call (docs/protocol.md, "Permissions"): the
    /// approval's `permission` says what; answer `"allow"` (once), `{"value": "always"}` (for
    /// the session, as its `grant` says), `"deny"` or `{"value": "deny", "note": "..."}`.
    Permission,
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
    /// That device's name, as it was paired (absent in approvals of older hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by_name: Option<String>,
    /// The answer of a select, input or editor approval; a permission's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What a `permission` approval asks about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<crate::permission::PermissionQuestion>,
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
    /// With a permission's `deny`: a note the model receives with the refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ANSWER_CHARS))]
    pub note: Option<String>,
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
            if let Some(note) = &answer.note {
                length("decision.note", note, 0, MAX_ANSWER_CHARS)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRespondResult {
    pub approval: ApprovalInfo,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn with_images(images: Vec<ImageAttachment>) -> TurnStartParams {
        TurnStartParams {
            session_id: "ses_1".into(),
            idempotency_key: "k".into(),
            text: "see".into(),
            images,
        }
    }

    fn png(data: String) -> ImageAttachment {
        ImageAttachment {
            mime_type: "image/png".into(),
            data,
        }
    }

    #[test]
    fn images_are_bounded_in_count_size_type_and_encoding() {
        let small = png("iVBORw0KGgo=".into());
        assert_eq!(small.bytes(), 8);
        assert!(
            with_images(vec![small.clone(); MAX_IMAGES])
                .validate()
                .is_ok()
        );
        let refused = |params: TurnStartParams| params.validate().unwrap_err();
        let many = refused(with_images(vec![small.clone(); MAX_IMAGES + 1]));
        assert_eq!(many.code(), ErrorCode::LimitExceeded);
        // Exactly at the bound, decoded: 5 MiB is not a multiple of 3, so its last group holds
        // two bytes and one `=`.
        let at_bound = MAX_IMAGE_BYTES as usize;
        let mut data = "A".repeat(at_bound.div_ceil(3) * 4);
        data.replace_range(data.len() - 1.., "=");
        let largest = png(data);
        assert_eq!(largest.bytes(), MAX_IMAGE_BYTES);
        assert!(
            with_images(vec![largest]).validate().is_ok(),
            "an image of exactly the bound is taken"
        );
        // One byte over the bound, decoded: 4 characters per 3 bytes.
        let over = MAX_IMAGE_BYTES as usize + 1;
        let large = png("A".repeat(over.div_ceil(3) * 4));
        assert_eq!(large.bytes(), MAX_IMAGE_BYTES + 1);
        let large = refused(with_images(vec![large]));
        assert_eq!(large.code(), ErrorCode::PayloadTooLarge);
        assert!(large.message().contains("scale it down"), "{large:?}");
        for (image, path) in [
            (
                ImageAttachment {
                    mime_type: "image/tiff".into(),
                    data: "iVBORw0KGgo=".into(),
                },
                "params.images.0.mimeType",
            ),
            (png("iVBORw0KGgo".into()), "params.images.0.data"),
            (png("iVBO Rw0KGgo=".into()), "params.images.0.data"),
            (png(String::new()), "params.images.0.data"),
        ] {
            let error = refused(with_images(vec![image]));
            assert_eq!(error.code(), ErrorCode::InvalidParams);
            assert_eq!(error.details().unwrap()["path"], path);
        }
    }
}
