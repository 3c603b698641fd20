//! Approvals (docs/protocol.md §7.18): the agent's confirm/select/input/editor dialogs, with an absolute
//! deadline. The first answer wins across devices; a late one gets APPROVAL_EXPIRED; one for a
//! settled approval or an ended turn gets APPROVAL_STALE. At the deadline the host settles the
//! approval as expired, tells the agent, and emits `approval.settled`.

use super::DriverHost;
use super::permissions::outcome::{self as permissions, Outcome};
use crate::agent::{Agent, UiAnswer, UiMethod};
use crate::auth::Caller;
use crate::sessions::{HostEvent, Session};
use dashmap::DashMap;
use racp_proto::events::{ApprovalRequestedData, ApprovalSettledData};
use racp_proto::methods::turn::{
    ApprovalInfo, ApprovalKind, ApprovalRespondParams, ApprovalRespondResult, ApprovalState,
    Decision, Verdict,
};
use racp_proto::{AppError, ErrorCode};
use racp_server::clock::now_ms;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A dialog the agent opened.
pub type Request = racp_proto::pi::Dialog;

struct Entry {
    info: Mutex<ApprovalInfo>,
    agent: Agent,
    agent_request_id: String,
    session: Arc<Session>,
    /// A `permission` approval's call, as the policy saw it (permissions.rs).
    permission: Option<permissions::Pending>,
}

impl Entry {
    fn lock(&self) -> std::sync::MutexGuard<'_, ApprovalInfo> {
        self.info.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
pub struct Approvals {
    map: DashMap<String, Arc<Entry>>,
}

fn kind_of(method: UiMethod) -> ApprovalKind {
    match method {
        UiMethod::Confirm => ApprovalKind::Confirm,
        UiMethod::Select => ApprovalKind::Select,
        UiMethod::Input => ApprovalKind::Input,
        UiMethod::Editor => ApprovalKind::Editor,
    }
}

/// An approval about to open: what it asks, whom the answer goes to, and its deadline.
struct Opening<'a, H> {
    host: &'a Arc<H>,
    session: &'a Arc<Session>,
    agent: &'a Agent,
    agent_request_id: String,
    timeout: Duration,
    permission: Option<permissions::Pending>,
}

impl Approvals {
    /// Registers a dialog as a pending approval, arms its deadline, and returns the
    /// `approval.requested` event to append.
    pub fn open(
        &self,
        host: &Arc<impl DriverHost>,
        session: &Arc<Session>,
        agent: &Agent,
        turn_id: &str,
        request: Request,
    ) -> HostEvent {
        let timeout = request
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(host.config().approval_timeout)
            .min(host.config().approval_timeout);
        let info = ApprovalInfo {
            approval_id: new_id(&**host, &request.id),
            session_id: session.id.clone(),
            turn_id: turn_id.to_string(),
            kind: kind_of(request.method),
            title: request.title,
            message: request.message,
            options: request.options,
            deadline: deadline_in(timeout),
            state: ApprovalState::Pending,
            settled_by: None,
            settled_by_name: None,
            value: None,
            permission: None,
        };
        let opening = Opening {
            host,
            session,
            agent,
            agent_request_id: request.id,
            timeout,
            permission: None,
        };
        self.register(opening, info)
    }

    /// Opens a `permission` approval for a tool call the policy asks about (permissions.rs),
    /// with the host's deadline.
    pub(super) fn open_permission(
        &self,
        host: &Arc<impl DriverHost>,
        session: &Arc<Session>,
        agent: &Agent,
        (turn_id, agent_request_id): (&str, String),
        question: racp_proto::permission::PermissionQuestion,
        pending: permissions::Pending,
    ) -> HostEvent {
        let timeout = host.config().approval_timeout;
        let (title, message) = permissions::words(&question);
        let info = ApprovalInfo {
            approval_id: new_id(&**host, &agent_request_id),
            session_id: session.id.clone(),
            turn_id: turn_id.to_string(),
            kind: ApprovalKind::Permission,
            title,
            message,
            options: Some(question.choices.iter().map(|c| c.as_str().into()).collect()),
            deadline: deadline_in(timeout),
            state: ApprovalState::Pending,
            settled_by: None,
            settled_by_name: None,
            value: None,
            permission: Some(question),
        };
        let opening = Opening {
            host,
            session,
            agent,
            agent_request_id,
            timeout,
            permission: Some(pending),
        };
        self.register(opening, info)
    }

    fn register<H: DriverHost>(&self, opening: Opening<'_, H>, info: ApprovalInfo) -> HostEvent {
        let entry = Arc::new(Entry {
            info: Mutex::new(info.clone()),
            agent: opening.agent.clone(),
            agent_request_id: opening.agent_request_id,
            session: opening.session.clone(),
            permission: opening.permission,
        });
        if let Err(err) = opening.host.store().save_approval(&info) {
            tracing::warn!(error = %err, "cannot store an approval");
        }
        self.map.insert(info.approval_id.clone(), entry.clone());
        let (host, timeout) = (opening.host.clone(), opening.timeout);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            #[cfg(debug_assertions)]
            crate::test_hooks::before_expiry().await;
            expire(&host, &entry).await;
        });
        HostEvent::of_turn(&info.turn_id, ApprovalRequestedData::from(&info))
    }

    /// Settles every pending approval of an ended turn as cancelled; returns the events.
    pub fn cancel_turn(&self, host: &impl DriverHost, turn_id: &str) -> Vec<HostEvent> {
        self.cancel_pending(host, turn_id)
            .iter()
            .flat_map(|(entry, info)| cancelled_events(entry, info))
            .collect()
    }

    /// Cancels the turn's pending dialogs for an abort (pi ends an aborted run only once its
    /// dialogs return: docs/protocol.md §7.17). Their settles are recorded before the agent hears the answer, as an
    /// answer's are (`respond`): the run's end the answer lets come is after them in the log.
    pub async fn cancel_for_abort(&self, host: &impl DriverHost, turn_id: &str) {
        let cancelled = self.cancel_pending(host, turn_id);
        let Some((first, _)) = cancelled.first() else {
            return;
        };
        let events = cancelled
            .iter()
            .flat_map(|(entry, info)| cancelled_events(entry, info))
            .collect();
        record(host, &first.session, events).await;
        for (entry, _) in &cancelled {
            if let Err(err) = entry
                .agent
                .answer_ui(&entry.agent_request_id, UiAnswer::Cancelled)
                .await
            {
                tracing::debug!(error = %err, "the agent did not take a cancelled dialog");
            }
        }
    }

    /// Marks the turn's pending approvals cancelled (stored); returns them as settled.
    fn cancel_pending(
        &self,
        host: &impl DriverHost,
        turn_id: &str,
    ) -> Vec<(Arc<Entry>, ApprovalInfo)> {
        let mut cancelled = Vec::new();
        for entry in self.map.iter() {
            let mut info = entry.lock();
            if info.turn_id == turn_id && info.state == ApprovalState::Pending {
                info.state = ApprovalState::Cancelled;
                save(host, &info);
                cancelled.push((entry.value().clone(), info.clone()));
            }
        }
        cancelled
    }

    /// After a restart: approvals left pending have no agent to answer; settle them cancelled.
    pub fn cancel_stored(host: &impl DriverHost, session_id: &str) -> Vec<HostEvent> {
        let pending = match host.store().pending_approvals(session_id) {
            Ok(pending) => pending,
            Err(err) => {
                tracing::warn!(%session_id, error = %err, "cannot read the approvals left pending");
                Vec::new()
            }
        };
        pending
            .into_iter()
            .map(|mut info| {
                info.state = ApprovalState::Cancelled;
                save(host, &info);
                settled_event(&info)
            })
            .collect()
    }

    pub async fn respond(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: ApprovalRespondParams,
    ) -> Result<ApprovalRespondResult, AppError> {
        let Some(entry) = self.map.get(&params.approval_id).map(|e| e.clone()) else {
            // Not live (the host restarted since): the store says what became of it.
            return Err(match host.store().approval(&params.approval_id) {
                Ok(Some(info)) if info.state == ApprovalState::Expired => expired_error(&info),
                Ok(Some(info)) => stale_error(&info),
                Ok(None) => AppError::new(ErrorCode::NotFound, "no such approval")
                    .with_details(json!({"approvalId": params.approval_id})),
                Err(err) => crate::internal(err),
            });
        };
        let past_deadline = {
            let info = entry.lock();
            info.state == ApprovalState::Pending && now_ms() >= info.deadline
        };
        if past_deadline {
            // The timer has not fired yet; the deadline still rules.
            expire(host, &entry).await;
        }
        let (answer, settled) = {
            let mut info = entry.lock();
            match info.state {
                ApprovalState::Pending => {}
                ApprovalState::Expired => return Err(expired_error(&info)),
                _ => return Err(stale_error(&info)),
            }
            let (state, value, answer, outcome) = if info.kind == ApprovalKind::Permission {
                let (state, value, outcome) = permissions::decide(&info, &params.decision)?;
                (state, value, outcome.answer(), Some(outcome))
            } else {
                let (state, value, answer) = decide(&info, &params.decision)?;
                (state, value, answer, None)
            };
            info.state = state;
            info.value = value;
            info.settled_by = caller.device_id().map(str::to_string);
            info.settled_by_name = caller.device_name().map(str::to_string);
            save(host, &info);
            (answer, (info.clone(), outcome))
        };
        let (settled, outcome) = settled;
        let mut events = vec![settled_event(&settled)];
        if let Some(outcome) = &outcome {
            events.extend(decided_event(host, &entry, &settled, outcome));
        }
        // Recorded before the agent hears it: what the answer lets the agent do (run the tool,
        // end the turn) comes after `approval.settled` in the log.
        record(host, &entry.session, events).await;
        if let Err(err) = entry.agent.answer_ui(&entry.agent_request_id, answer).await {
            tracing::warn!(error = %err, "the agent did not take an approval answer");
        }
        Ok(ApprovalRespondResult { approval: settled })
    }
}

/// The settled state, the stored value, and the agent's answer for a decision.
fn decide(
    info: &ApprovalInfo,
    decision: &Decision,
) -> Result<(ApprovalState, Option<String>, UiAnswer), AppError> {
    let invalid = |reason: &str| racp_proto::validate::invalid("decision", reason);
    match (info.kind, decision) {
        (ApprovalKind::Confirm, Decision::Verdict(Verdict::Allow)) => {
            Ok((ApprovalState::Allowed, None, UiAnswer::Confirmed(true)))
        }
        (ApprovalKind::Confirm, Decision::Verdict(Verdict::Deny)) => {
            Ok((ApprovalState::Denied, None, UiAnswer::Confirmed(false)))
        }
        (ApprovalKind::Confirm, Decision::Answer(_)) => {
            Err(invalid("a confirm approval takes \"allow\" or \"deny\""))
        }
        (_, Decision::Verdict(Verdict::Deny)) => {
            Ok((ApprovalState::Denied, None, UiAnswer::Cancelled))
        }
        (_, Decision::Verdict(Verdict::Allow)) => Err(invalid(
            "this approval takes {\"value\": ...} (or \"deny\" to decline)",
        )),
        (ApprovalKind::Select, Decision::Answer(answer)) => {
            let known = info
                .options
                .as_ref()
                .is_some_and(|o| o.contains(&answer.value));
            if !known {
                return Err(invalid("the value must be one of the approval's options"));
            }
            Ok((
                ApprovalState::Answered,
                Some(answer.value.clone()),
                UiAnswer::Value(answer.value.clone()),
            ))
        }
        (_, Decision::Answer(answer)) => Ok((
            ApprovalState::Answered,
            Some(answer.value.clone()),
            UiAnswer::Value(answer.value.clone()),
        )),
    }
}

fn save(host: &impl DriverHost, info: &ApprovalInfo) {
    if let Err(err) = host.store().save_approval(info) {
        tracing::warn!(error = %err, "cannot store an approval");
    }
}

fn expired_error(info: &ApprovalInfo) -> AppError {
    AppError::new(ErrorCode::ApprovalExpired, "the approval's deadline passed")
        .with_details(json!({"approvalId": info.approval_id, "deadline": info.deadline}))
}

fn stale_error(info: &ApprovalInfo) -> AppError {
    AppError::new(
        ErrorCode::ApprovalStale,
        "the approval was already settled or its turn has ended",
    )
    .with_details(
        json!({"approvalId": info.approval_id, "state": info.state, "settledBy": info.settled_by}),
    )
}

/// Settles a still-pending approval as expired: tells the agent and emits the event (a
/// `permission` approval's expiry is a refusal).
async fn expire(host: &impl DriverHost, entry: &Entry) {
    let settled = {
        let mut info = entry.lock();
        if info.state != ApprovalState::Pending {
            return;
        }
        info.state = ApprovalState::Expired;
        save(host, &info);
        info.clone()
    };
    let mut events = vec![settled_event(&settled)];
    let mut answer = UiAnswer::Cancelled;
    if let Some(question) = &settled.permission {
        let outcome = permissions::expired(question);
        answer = outcome.answer();
        events.extend(decided_event(host, entry, &settled, &outcome));
    }
    record(host, &entry.session, events).await;
    if let Err(err) = entry.agent.answer_ui(&entry.agent_request_id, answer).await {
        tracing::debug!(error = %err, "the agent did not take an expiry");
    }
}

/// `approval.settled` for the approval as it was settled (`state`, `settled_by`, `value`).
fn settled_event(info: &ApprovalInfo) -> HostEvent {
    HostEvent::of_turn(&info.turn_id, ApprovalSettledData::from(info))
}

async fn record(host: &impl DriverHost, session: &Arc<Session>, events: Vec<HostEvent>) {
    #[cfg(debug_assertions)]
    crate::test_hooks::before_settle_is_recorded().await;
    if let Err(err) = host.sessions().commit(session, events).await {
        tracing::warn!(error = %err, "approval event not recorded");
    }
}

/// `approval.settled` for a cancelled approval, and a permission's refusal with it.
fn cancelled_events(entry: &Entry, info: &ApprovalInfo) -> Vec<HostEvent> {
    let mut events = vec![settled_event(info)];
    if let (Some(question), Some(pending)) = (&info.permission, &entry.permission) {
        let outcome = permissions::cancelled(question);
        let tool = (question.tool.as_str(), question.tool_call_id.as_str());
        events.push(outcome.event(Some(&info.turn_id), tool, pending, Some(info)));
    }
    events
}

/// `permission.decided` for a settled `permission` approval; a grant it gave is stored first.
fn decided_event(
    host: &impl DriverHost,
    entry: &Entry,
    settled: &ApprovalInfo,
    outcome: &Outcome,
) -> Option<HostEvent> {
    let (question, pending) = (settled.permission.as_ref()?, entry.permission.as_ref()?);
    if let Some(grant) = &outcome.grant
        && let Err(err) = host.store().add_grant(&settled.session_id, grant, now_ms())
    {
        tracing::warn!(error = %err, "cannot store a permission grant");
    }
    let tool = (question.tool.as_str(), question.tool_call_id.as_str());
    Some(outcome.event(Some(&settled.turn_id), tool, pending, Some(settled)))
}

fn new_id(host: &impl DriverHost, fallback: &str) -> String {
    host.secrets()
        .new_id("apr_")
        .unwrap_or_else(|_| format!("apr_{fallback}"))
}

fn deadline_in(timeout: Duration) -> u64 {
    now_ms().saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
}
