//! How a run ends and what may still change that: `agent_end`'s last assistant message, and
//! the retry and compaction events that say whether a failed run is final.

use super::Kind;
use super::line::Line;
use serde::Deserialize;
use serde_json::value::RawValue;

/// How an agent run ended: pi's `agent_end`, read from its last assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunEnd {
    pub stop_reason: StopReason,
    /// pi's `errorMessage` when the run failed.
    pub error_message: Option<String>,
    /// The message's `provider` and `model` (which model failed).
    pub provider: Option<String>,
    pub model: Option<String>,
    /// The model finished with no visible text and no tool call.
    pub empty: bool,
}

/// pi's `stopReason` of the last assistant message of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StopReason {
    /// The model finished (`stop`, `length`, `toolUse`).
    Finished,
    Aborted,
    Error,
    /// No assistant message, an unknown reason, or an `agent_end` too long to read (its head
    /// still named it).
    #[default]
    Unknown,
}

/// A pi event that decides whether a failed run is final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunSignal {
    /// `auto_retry_start`: pi retries the failed request; the turn goes on.
    RetryStart { attempt: u32 },
    /// `auto_retry_end`: `success: false` means pi gave up after `attempt` retries.
    RetryEnd { success: bool, attempt: u32 },
    /// `compaction_start` (`reason: "overflow"` when pi recovers from a context overflow).
    CompactionStart { overflow: bool },
    /// `compaction_end`: `willRetry` says whether pi resends the failed request.
    CompactionEnd { will_retry: bool },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageHead {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    error_message: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    /// Kept raw: only the last assistant message's blocks are read.
    #[serde(default)]
    content: Option<Box<RawValue>>,
}

/// One content block of an assistant message, read for whether it is visible output.
#[derive(Deserialize)]
struct BlockHead {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

/// A message with no visible text and no tool call (thinking alone is not an answer).
fn is_empty_answer(content: Option<&RawValue>) -> bool {
    let Some(content) = content else {
        return true;
    };
    match serde_json::from_str::<Vec<BlockHead>>(content.get()) {
        Ok(blocks) => !blocks.iter().any(|b| match b.kind.as_deref() {
            Some("text") => b.text.as_deref().is_some_and(|t| !t.trim().is_empty()),
            Some("thinking") => false,
            _ => true,
        }),
        // A string (or anything else): visible unless blank.
        Err(_) => serde_json::from_str::<String>(content.get()).is_ok_and(|t| t.trim().is_empty()),
    }
}

impl RunEnd {
    /// How the run of an `agent_end` line ended; `None` for any other line.
    pub fn of(line: &Line<'_>) -> Option<RunEnd> {
        if line.kind != Kind::AgentEnd {
            return None;
        }
        let last = line
            .field::<Vec<MessageHead>>("messages")
            .and_then(|messages| {
                messages
                    .into_iter()
                    .rev()
                    .find(|m| m.role.as_deref() == Some("assistant"))
            });
        let Some(last) = last else {
            return Some(RunEnd::default());
        };
        let stop_reason = match last.stop_reason.as_deref() {
            Some("stop" | "length" | "toolUse") => StopReason::Finished,
            Some("aborted") => StopReason::Aborted,
            Some("error") => StopReason::Error,
            _ => StopReason::Unknown,
        };
        let empty =
            last.stop_reason.as_deref() == Some("stop") && is_empty_answer(last.content.as_deref());
        Some(RunEnd {
            stop_reason,
            error_message: last.error_message,
            provider: last.provider,
            model: last.model,
            empty,
        })
    }
}

impl RunSignal {
    /// The signal a retry or compaction line carries; `None` for any other line.
    pub fn of(line: &Line<'_>) -> Option<RunSignal> {
        Some(match line.kind {
            Kind::AutoRetryStart => RunSignal::RetryStart {
                attempt: line.field("attempt").unwrap_or(1),
            },
            Kind::AutoRetryEnd => RunSignal::RetryEnd {
                success: line.field("success").unwrap_or(false),
                attempt: line.field("attempt").unwrap_or(0),
            },
            Kind::CompactionStart | Kind::AutoCompactionStart => RunSignal::CompactionStart {
                overflow: line.field::<&str>("reason") == Some("overflow"),
            },
            Kind::CompactionEnd | Kind::AutoCompactionEnd => RunSignal::CompactionEnd {
                will_retry: line.field("willRetry").unwrap_or(false),
            },
            _ => return None,
        })
    }
}
