//! The permission policy's side of the driver (docs/protocol.md, "Permissions"): pi-host's
//! extension asks before each tool call with a reserved dialog (`policy::REQUEST_TITLE`); the
//! driver answers it at once from `policy::judge`, or opens a `permission` approval and
//! answers when a person does (or the deadline passes). Each decision is a
//! `permission.decided` event; a grant given with "always" goes to the store. What each
//! decision is, however it came, is `outcome.rs`'s.

pub(super) mod outcome;

use super::{Driver, DriverHost};
use crate::agent::{Agent, UiAnswer, UiMethod};
use crate::policy::{self, Context, Judgement, ToolCall, denylist::Denylist};
use crate::sessions::HostEvent;
use outcome::{Outcome, Pending};
use racp_proto::ErrorCode;
use racp_proto::permission::{
    DecidedBy, PermissionChoice, PermissionGrant, PermissionMode, PermissionQuestion, ToolSummary,
};
use std::path::PathBuf;
use std::sync::Arc;

/// Whether a dialog is the policy's request rather than a question for a person.
pub(super) fn is_request(dialog: &super::approvals::Request) -> bool {
    dialog.method == UiMethod::Editor && dialog.title == policy::REQUEST_TITLE
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

async fn answer(agent: &Agent, id: &str, answer: UiAnswer) {
    if let Err(err) = agent.answer_ui(id, answer).await {
        tracing::debug!(error = %err, "the agent did not take a policy decision");
    }
}
