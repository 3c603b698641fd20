//! Answering approvals with typed lines, shared by `attach` and `prompt --wait`: which approvals
//! wait (from a snapshot and from events), how a line reads as an answer (`y`/`n`, an option or
//! its number, text), and sending it. Lines answer the oldest approval not yet answered.

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::Out;
use racp_proto::ErrorCode;
use racp_proto::calls;
use racp_proto::client::RacpClient;
use racp_proto::events::{ApprovalRequestedData, ApprovalSettledData, Event, EventType};
use racp_proto::methods::turn::{
    Answer, ApprovalInfo, ApprovalKind, ApprovalRespondParams, Decision, Verdict,
};
use std::collections::VecDeque;
use tokio::sync::mpsc;

/// An approval known to be pending.
pub(crate) struct WaitingApproval {
    pub id: String,
    pub kind: ApprovalKind,
    pub options: Vec<String>,
    /// We sent an answer and wait for `approval.settled`.
    answered: bool,
}

impl WaitingApproval {
    /// One from a snapshot's `pendingApprovals`.
    fn listed(approval: &ApprovalInfo, answered: bool) -> WaitingApproval {
        WaitingApproval {
            id: approval.approval_id.clone(),
            kind: approval.kind,
            options: approval.options.clone().unwrap_or_default(),
            answered,
        }
    }

    /// One from an `approval.requested` event.
    fn requested(data: ApprovalRequestedData) -> WaitingApproval {
        WaitingApproval {
            id: data.approval_id,
            kind: data.kind,
            options: data.options.unwrap_or_default(),
            answered: false,
        }
    }

    /// Reads a typed answer.
    pub fn decision(&self, line: &str) -> Result<Decision, String> {
        match self.kind {
            ApprovalKind::Confirm => match line.to_ascii_lowercase().as_str() {
                "y" | "yes" | "allow" => Ok(Decision::Verdict(Verdict::Allow)),
                "n" | "no" | "deny" => Ok(Decision::Verdict(Verdict::Deny)),
                _ => Err(format!("approval {}: answer y or n", self.id)),
            },
            ApprovalKind::Select => {
                if self.options.iter().any(|o| o == line) {
                    return Ok(Decision::Answer(Answer {
                        value: line.into(),
                        note: None,
                    }));
                }
                match line.parse::<usize>() {
                    Ok(n) if n >= 1 && n <= self.options.len() => Ok(Decision::Answer(Answer {
                        value: self.options[n - 1].clone(),
                        note: None,
                    })),
                    _ => Err(format!(
                        "approval {}: answer with a number from 1 to {} or one of: {}",
                        self.id,
                        self.options.len(),
                        self.options.join(", ")
                    )),
                }
            }
            ApprovalKind::Input | ApprovalKind::Editor => Ok(Decision::Answer(Answer {
                value: line.into(),
                note: None,
            })),
            ApprovalKind::Permission => permission_decision(&self.id, line),
        }
    }

    /// What to type, for the note a terminal shows.
    pub fn how_to_answer(&self) -> String {
        match self.kind {
            ApprovalKind::Confirm => format!("approval {}: type y or n and Enter", self.id),
            ApprovalKind::Select => format!(
                "approval {}: type a number from 1 to {} (or the option) and Enter",
                self.id,
                self.options.len()
            ),
            ApprovalKind::Input | ApprovalKind::Editor => {
                format!("approval {}: type the answer and Enter", self.id)
            }
            ApprovalKind::Permission => format!(
                "approval {}: type allow (once), always (for the session) or deny (deny: NOTE \
                 tells the model why) and Enter",
                self.id
            ),
        }
    }
}

/// A typed answer to a `permission` approval: allow (y), always (a), deny (n), or
/// `deny: NOTE`.
fn permission_decision(id: &str, line: &str) -> Result<Decision, String> {
    let (word, note) = match line.split_once(':') {
        Some((word, note)) => (word.trim(), Some(note.trim().to_string())),
        None => (line.trim(), None),
    };
    match (word.to_ascii_lowercase().as_str(), note) {
        ("y" | "yes" | "allow", None) => Ok(Decision::Verdict(Verdict::Allow)),
        ("a" | "always", None) => Ok(Decision::Answer(Answer {
            value: "always".into(),
            note: None,
        })),
        ("n" | "no" | "deny", None) => Ok(Decision::Verdict(Verdict::Deny)),
        ("n" | "no" | "deny", Some(note)) => Ok(Decision::Answer(Answer {
            value: "deny".into(),
            note: Some(note),
        })),
        _ => Err(format!(
            "approval {id}: answer allow, always, deny, or deny: NOTE"
        )),
    }
}

/// The pending approvals and the lines typed for them.
pub(crate) struct Approvals {
    /// Oldest first: typed lines answer the first one not yet answered.
    pending: Vec<WaitingApproval>,
    typed: VecDeque<String>,
    /// Stdin is a terminal: a line typed while nothing waits is dropped (piped input is kept
    /// until an approval needs it).
    interactive: bool,
}

impl Approvals {
    pub fn new(listed: &[ApprovalInfo], interactive: bool) -> Approvals {
        Approvals {
            pending: listed
                .iter()
                .map(|a| WaitingApproval::listed(a, false))
                .collect(),
            typed: VecDeque::new(),
            interactive,
        }
    }

    /// Nothing pending and no typed line left.
    pub fn is_idle(&self) -> bool {
        self.typed.is_empty() && self.pending.is_empty()
    }

    /// The oldest approval not yet answered.
    pub fn next_unanswered(&self) -> Option<&WaitingApproval> {
        self.pending.iter().find(|p| !p.answered)
    }

    /// Follows `approval.requested` and `approval.settled`; returns an approval just requested.
    pub fn on_event(&mut self, event: &Event) -> Option<&WaitingApproval> {
        if event.kind == EventType::ApprovalRequested.as_str() {
            let data = event.data.parse::<ApprovalRequestedData>().ok()?;
            self.pending.push(WaitingApproval::requested(data));
            return self.pending.last();
        }
        if event.kind == EventType::ApprovalSettled.as_str()
            && let Ok(settled) = event.data.parse::<ApprovalSettledData>()
        {
            self.pending.retain(|p| p.id != settled.approval_id);
        }
        None
    }

    /// Events were missed: a snapshot's pending approvals replace the ones known (those
    /// answered stay answered).
    pub fn replace(&mut self, pending: &[&ApprovalInfo]) {
        let answered: Vec<String> = self
            .pending
            .iter()
            .filter(|p| p.answered)
            .map(|p| p.id.clone())
            .collect();
        self.pending = pending
            .iter()
            .map(|a| WaitingApproval::listed(a, answered.contains(&a.approval_id)))
            .collect();
    }

    /// A typed line.
    pub fn on_line(&mut self, out: &Out, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        if self.interactive && self.next_unanswered().is_none() {
            out.note("pi-remote: no approval is waiting for an answer");
        } else {
            self.typed.push_back(line.to_string());
        }
    }

    /// Answers waiting approvals, oldest first, with what was typed.
    pub async fn answer_typed(&mut self, out: &Out, client: &RacpClient) -> Result<(), Failure> {
        while let Some(index) = self.pending.iter().position(|p| !p.answered) {
            let Some(line) = self.typed.pop_front() else {
                break;
            };
            let decision = match self.pending[index].decision(&line) {
                Ok(decision) => decision,
                Err(message) => {
                    out.note(&message);
                    continue;
                }
            };
            let id = self.pending[index].id.clone();
            let answer = call_resending::<calls::ApprovalRespond>(
                client,
                ApprovalRespondParams {
                    approval_id: id.clone(),
                    decision,
                },
            )
            .await;
            let error = match answer {
                Ok(_) => {
                    self.pending[index].answered = true;
                    continue;
                }
                Err(error) => error,
            };
            out.note(&format!(
                "pi-remote: approval {id}: {}: {}",
                error.code(),
                error.message()
            ));
            if error.code() == ErrorCode::RemoteAuthFailed {
                return Err(error.into());
            }
            // Settled elsewhere, expired, or not ours to answer: stop waiting on it.
            self.pending.retain(|p| p.id != id);
        }
        Ok(())
    }
}

/// Reads stdin lines on a thread; `None` marks end of input.
pub(crate) fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    let text = line.trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(Some(text)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select() -> WaitingApproval {
        WaitingApproval {
            id: "apr_1".into(),
            kind: ApprovalKind::Select,
            options: vec!["Allow once".into(), "Block".into()],
            answered: false,
        }
    }

    fn answer(decision: Result<Decision, String>) -> String {
        match decision {
            Ok(Decision::Answer(Answer { value, .. })) => value,
            other => panic!("not an answer: {other:?}"),
        }
    }

    #[test]
    fn a_select_is_answered_by_number_or_by_option() {
        assert_eq!(answer(select().decision("2")), "Block");
        assert_eq!(answer(select().decision("Allow once")), "Allow once");
        for bad in ["0", "3", "block"] {
            let refused = select().decision(bad).unwrap_err();
            assert!(refused.contains("1 to 2"), "{refused}");
        }
    }

    #[test]
    fn a_permission_takes_allow_always_deny_and_a_note_with_deny_only() {
        let permission = WaitingApproval {
            id: "apr_1".into(),
            kind: ApprovalKind::Permission,
            options: vec!["allow".into(), "always".into(), "deny".into()],
            answered: false,
        };
        let decide = |line: &str| permission.decision(line);
        assert_eq!(decide("allow"), Ok(Decision::Verdict(Verdict::Allow)));
        assert_eq!(decide("y"), Ok(Decision::Verdict(Verdict::Allow)));
        assert_eq!(decide("Deny"), Ok(Decision::Verdict(Verdict::Deny)));
        assert_eq!(answer(decide("always")), "always");
        assert_eq!(
            decide("deny: use the other file"),
            Ok(Decision::Answer(Answer {
                value: "deny".into(),
                note: Some("use the other file".into()),
            }))
        );
        for bad in ["allow: please", "maybe", "2", ""] {
            let refused = decide(bad).unwrap_err();
            assert!(refused.contains("allow, always, deny"), "{refused}");
        }
    }

    #[test]
    fn a_confirm_takes_y_or_n() {
        let confirm = WaitingApproval {
            kind: ApprovalKind::Confirm,
            ..select()
        };
        assert!(matches!(
            confirm.decision("Y"),
            Ok(Decision::Verdict(Verdict::Allow))
        ));
        assert!(matches!(
            confirm.decision("no"),
            Ok(Decision::Verdict(Verdict::Deny))
        ));
        assert!(confirm.decision("maybe").is_err());
    }
}
