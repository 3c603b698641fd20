//! What a `permission` approval decides (docs/protocol.md, "Permissions"), apart from how it
//! is asked: the outcome of a person's answer, of the deadline and of a cancel; the answer
//! pi-host's extension reads and the `permission.decided` event. `approvals.rs` settles with
//! these; the policy's side (`mod.rs`) opens the approvals.

use crate::agent::UiAnswer;
use crate::sessions::HostEvent;
use racp_proto::methods::turn::{ApprovalInfo, ApprovalState, Decision, Verdict};
use racp_proto::permission::{
    DecidedBy, PermissionChoice, PermissionDecidedData, PermissionGrant, PermissionMode,
    PermissionQuestion, ToolSummary,
};
use racp_proto::{AppError, ErrorCode};

/// What an open `permission` approval needs to settle: the call as the policy saw it.
#[derive(Debug, Clone)]
pub(in crate::driver) struct Pending {
    pub mode: PermissionMode,
    pub summary: ToolSummary,
}

/// A decision as the agent and the log get it.
#[derive(Debug, Clone)]
pub(in crate::driver) struct Outcome {
    pub allowed: bool,
    pub by: DecidedBy,
    pub code: Option<ErrorCode>,
    pub reason: String,
    pub grant: Option<PermissionGrant>,
}

impl Outcome {
    pub(super) fn allowed(by: DecidedBy, reason: &str) -> Outcome {
        Outcome {
            allowed: true,
            by,
            code: None,
            reason: reason.to_string(),
            grant: None,
        }
    }

    pub(super) fn denied(by: DecidedBy, code: ErrorCode, reason: String) -> Outcome {
        Outcome {
            allowed: false,
            by,
            code: Some(code),
            reason,
            grant: None,
        }
    }

    /// The answer pi-host's extension reads: a refusal's message names its code first, and is
    /// what the model receives as the tool's result.
    pub fn answer(&self) -> UiAnswer {
        let message = match self.code {
            Some(code) => format!("{code}: {}", self.reason),
            None => self.reason.clone(),
        };
        let json = serde_json::json!({"allow": self.allowed, "message": message});
        UiAnswer::Value(json.to_string())
    }

    pub fn event(
        &self,
        turn_id: Option<&str>,
        question: (&str, &str),
        pending: &Pending,
        approval: Option<&ApprovalInfo>,
    ) -> HostEvent {
        let data = PermissionDecidedData {
            tool: question.0.to_string(),
            tool_call_id: question.1.to_string(),
            allowed: self.allowed,
            by: self.by,
            code: self.code,
            reason: self.reason.clone(),
            summary: Box::new(pending.summary.clone()),
            mode: pending.mode,
            approval_id: approval.map(|a| a.approval_id.clone()),
            device_id: approval.and_then(|a| a.settled_by.clone()),
            device_name: approval.and_then(|a| a.settled_by_name.clone()),
            grant: self.grant.clone().map(Box::new),
        };
        match turn_id {
            Some(turn_id) => HostEvent::of_turn(turn_id, data),
            None => HostEvent::of_session(data),
        }
    }
}

/// The state, stored value and outcome of a person's answer to a `permission` approval.
pub(in crate::driver) fn decide(
    info: &ApprovalInfo,
    decision: &Decision,
) -> Result<(ApprovalState, Option<String>, Outcome), AppError> {
    let invalid = |reason: &str| racp_proto::validate::invalid("decision", reason);
    let question = info
        .permission
        .as_ref()
        .ok_or_else(|| crate::internal("a permission approval without its question"))?;
    let (choice, note) = match decision {
        Decision::Verdict(Verdict::Allow) => (PermissionChoice::Allow, None),
        Decision::Verdict(Verdict::Deny) => (PermissionChoice::Deny, None),
        Decision::Answer(answer) => (
            PermissionChoice::from_name(&answer.value).ok_or_else(|| {
                invalid("a permission approval takes \"allow\", \"always\" or \"deny\"")
            })?,
            answer.note.as_deref(),
        ),
    };
    if !question.choices.contains(&choice) {
        return Err(invalid(
            "this permission approval does not offer that choice",
        ));
    }
    if note.is_some() && choice != PermissionChoice::Deny {
        return Err(invalid("a note goes with \"deny\" only"));
    }
    let outcome = match choice {
        PermissionChoice::Allow => Outcome::allowed(DecidedBy::Person, "allowed once"),
        PermissionChoice::Always => Outcome {
            grant: question.grant.clone(),
            ..Outcome::allowed(DecidedBy::Person, "allowed for the session")
        },
        PermissionChoice::Deny => {
            let mut reason = format!("a person denied {}", question.tool);
            if let Some(note) = note.filter(|n| !n.trim().is_empty()) {
                reason.push_str(&format!("; their note: {note}"));
            }
            Outcome::denied(DecidedBy::Person, question.code, reason)
        }
    };
    let state = if outcome.allowed {
        ApprovalState::Allowed
    } else {
        ApprovalState::Denied
    };
    Ok((state, Some(choice.as_str().to_string()), outcome))
}

/// The outcome of a `permission` approval nobody answered in time: a refusal.
pub(in crate::driver) fn expired(question: &PermissionQuestion) -> Outcome {
    Outcome::denied(
        DecidedBy::Deadline,
        question.code,
        format!(
            "nobody answered whether {} may run before the deadline",
            question.tool
        ),
    )
}

/// The outcome of a `permission` approval cancelled with its turn.
pub(in crate::driver) fn cancelled(question: &PermissionQuestion) -> Outcome {
    Outcome::denied(
        DecidedBy::Cancelled,
        ErrorCode::ToolDenied,
        format!(
            "the turn ended before anyone answered whether {} may run",
            question.tool
        ),
    )
}

/// The approval's title and message as a text-only client shows them.
pub(in crate::driver) fn words(question: &PermissionQuestion) -> (String, Option<String>) {
    let what = question
        .summary
        .command
        .clone()
        .or_else(|| question.summary.path.clone());
    let title = match question.code {
        ErrorCode::PathOutsideWorkspace => {
            format!("Allow {} outside the workspace?", question.tool)
        }
        _ => format!("Allow {}?", question.tool),
    };
    (title, what)
}
