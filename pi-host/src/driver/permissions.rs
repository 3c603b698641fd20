//! The permission policy's side of the driver (docs/protocol.md, "Permissions"): pi-host's
//! extension asks before each tool call with a reserved dialog (`policy::REQUEST_TITLE`); the
//! driver answers it at once from `policy::judge`, or opens a `permission` approval and
//! answers when a person does (or the deadline passes). Each decision is a
//! `permission.decided` event; a grant given with "always" goes to the store.

use super::{Driver, DriverHost};
use crate::agent::{Agent, UiAnswer, UiMethod};
use crate::policy::{self, Context, Judgement, ToolCall, denylist::Denylist};
use crate::sessions::HostEvent;
use racp_proto::methods::turn::{ApprovalInfo, ApprovalState, Decision, Verdict};
use racp_proto::permission::{
    DecidedBy, PermissionChoice, PermissionDecidedData, PermissionGrant, PermissionMode,
    PermissionQuestion, ToolSummary,
};
use racp_proto::{AppError, ErrorCode};
use std::path::PathBuf;
use std::sync::Arc;

/// Whether a dialog is the policy's request rather than a question for a person.
pub(super) fn is_request(dialog: &super::approvals::Request) -> bool {
    dialog.method == UiMethod::Editor && dialog.title == policy::REQUEST_TITLE
}

/// What an open `permission` approval needs to settle: the call as the policy saw it.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub mode: PermissionMode,
    pub summary: ToolSummary,
}

/// A decision as the agent and the log get it.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub allowed: bool,
    pub by: DecidedBy,
    pub code: Option<ErrorCode>,
    pub reason: String,
    pub grant: Option<PermissionGrant>,
}

impl Outcome {
    fn allowed(by: DecidedBy, reason: &str) -> Outcome {
        Outcome {
            allowed: true,
            by,
            code: None,
            reason: reason.to_string(),
            grant: None,
        }
    }

    fn denied(by: DecidedBy, code: ErrorCode, reason: String) -> Outcome {
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
pub(super) fn decide(
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
pub(super) fn expired(question: &PermissionQuestion) -> Outcome {
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
pub(super) fn cancelled(question: &PermissionQuestion) -> Outcome {
    Outcome::denied(
        DecidedBy::Cancelled,
        ErrorCode::ToolDenied,
        format!(
            "the turn ended before anyone answered whether {} may run",
            question.tool
        ),
    )
}

impl Driver {
    /// Answers the policy's request for one tool call; returns the events it makes (the
    /// decision, or the approval that asks).
    pub(super) async fn on_policy_request(
        self: &Arc<Self>,
        host: &Arc<impl DriverHost>,
        agent: &Agent,
        turn_id: Option<String>,
        dialog: super::approvals::Request,
    ) -> Vec<HostEvent> {
        let Some(call) = dialog
            .prefill
            .as_deref()
            .and_then(|text| serde_json::from_str::<ToolCall>(text).ok())
        else {
            let refusal = Outcome::denied(
                DecidedBy::Mode,
                ErrorCode::ToolDenied,
                "pi-host could not read the tool call".into(),
            );
            answer(agent, &dialog.id, refusal.answer()).await;
            return Vec::new();
        };
        let pending = |summary| Pending {
            mode: self.mode(&**host),
            summary,
        };
        let (judgement, summary) = self.judge(host, &call);
        let outcome = match (judgement, turn_id.as_deref()) {
            (Judgement::Allow { by }, _) => Outcome::allowed(by, "allowed"),
            (Judgement::Deny { by, code, reason }, _) => Outcome::denied(by, code, reason),
            (Judgement::Ask { .. }, None) => Outcome::denied(
                DecidedBy::Mode,
                ErrorCode::ToolDenied,
                "no turn is running to ask a person in".into(),
            ),
            (Judgement::Ask { rule, code, grant }, Some(turn_id)) => {
                let question = question(&call, summary.clone(), rule, code, grant);
                let approvals = &host.drivers().approvals;
                let opened = approvals.open_permission(
                    host,
                    &self.session,
                    agent,
                    (turn_id, dialog.id),
                    question,
                    pending(summary),
                );
                return vec![opened];
            }
        };
        answer(agent, &dialog.id, outcome.answer()).await;
        let tool = (call.tool.as_str(), call.tool_call_id.as_str());
        vec![outcome.event(turn_id.as_deref(), tool, &pending(summary), None)]
    }

    /// The session's mode: its own, else the host's default.
    fn mode(&self, host: &impl DriverHost) -> PermissionMode {
        self.session
            .settings()
            .permission_mode
            .unwrap_or(host.config().permission_mode)
    }

    fn judge(&self, host: &impl DriverHost, call: &ToolCall) -> (Judgement, ToolSummary) {
        let home = home_dir();
        let denylist = Denylist::for_host(host.config(), home.as_deref());
        let grants = host.store().grants(&self.session.id).unwrap_or_else(|err| {
            tracing::warn!(session_id = %self.session.id, error = %err, "cannot read the session's grants");
            Vec::new()
        });
        let workspace = std::fs::canonicalize(&self.session.workspace)
            .unwrap_or_else(|_| PathBuf::from(&self.session.workspace));
        let ctx = Context {
            mode: self.mode(host),
            workspace: &workspace,
            home: home.as_deref(),
            denylist: &denylist,
            grants: &grants,
        };
        policy::judge(&ctx, call)
    }
}

/// The home directory the agent's tools expand `~` to (the host's `HOME`, which the agent
/// inherits), as its real path.
fn home_dir() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    let home = PathBuf::from(home);
    Some(std::fs::canonicalize(&home).unwrap_or(home))
}

fn question(
    call: &ToolCall,
    summary: ToolSummary,
    rule: racp_proto::permission::PermissionRule,
    code: ErrorCode,
    grant: Option<PermissionGrant>,
) -> PermissionQuestion {
    let mut choices = vec![PermissionChoice::Allow];
    if grant.is_some() {
        choices.push(PermissionChoice::Always);
    }
    choices.push(PermissionChoice::Deny);
    PermissionQuestion {
        tool: call.tool.clone(),
        tool_call_id: call.tool_call_id.clone(),
        summary,
        rule,
        code,
        choices,
        grant,
    }
}

/// The approval's title and message as a text-only client shows them.
pub(super) fn words(question: &PermissionQuestion) -> (String, Option<String>) {
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

async fn answer(agent: &Agent, id: &str, answer: UiAnswer) {
    if let Err(err) = agent.answer_ui(id, answer).await {
        tracing::debug!(error = %err, "the agent did not take a policy decision");
    }
}
