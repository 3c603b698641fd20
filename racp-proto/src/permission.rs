//! The permission policy as data (docs/protocol.md, "Permissions"): a session's mode, the
//! question a `permission` approval asks, the grants a person gave, and the decision each tool
//! call got. The policy itself is decided by the host; this is what clients read of it.

use crate::ErrorCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a session's agent may do without asking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PermissionMode {
    /// Reads inside the workspace run; writes, edits, shell commands and unknown tools ask.
    #[default]
    Ask,
    /// As `ask`, but writes and edits inside the workspace run.
    AcceptEdits,
    /// Everything inside the workspace runs; paths outside it still ask, the denylist holds.
    Auto,
    /// Read-only: writes and edits are refused, shell commands ask, unknown tools are refused.
    Plan,
}

impl PermissionMode {
    pub const ALL: [PermissionMode; 4] = [
        PermissionMode::Ask,
        PermissionMode::AcceptEdits,
        PermissionMode::Auto,
        PermissionMode::Plan,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Ask => "ask",
            PermissionMode::AcceptEdits => "accept-edits",
            PermissionMode::Auto => "auto",
            PermissionMode::Plan => "plan",
        }
    }

    pub fn from_name(name: &str) -> Option<PermissionMode> {
        Self::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl std::fmt::Display for PermissionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the policy asked rather than decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PermissionRule {
    /// The session's mode asks for this tool.
    Mode,
    /// The call names a path outside the workspace (asks in every mode).
    OutsideWorkspace,
    /// A tool the policy does not know (an extension's).
    UnknownTool,
}

/// What a tool call would do, as a person reads it: the command, the path, the size of the
/// change. Each field is absent when the tool has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolSummary {
    /// A shell command, as the model wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The path the call names, resolved (`~`, `..`, symlinks, the tool's working directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The bytes a write would write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The replacements an edit would make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edits: Option<u64>,
}

/// What a session grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GrantScope {
    /// Shell commands whose leading words are `value` (and that chain no other command).
    CommandPrefix,
    /// The tool on paths inside the directory `value`.
    Directory,
    /// Every call of the tool (a tool that names no path or command).
    Tool,
}

/// A grant given with "always" (allow for this session): it lasts until the session ends or
/// `session/configure` clears it, across host restarts. It never lifts the denylist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionGrant {
    /// The tool it allows.
    pub tool: String,
    pub scope: GrantScope,
    /// The command's leading words, the directory, or the tool's name.
    pub value: String,
}

/// An answer a `permission` approval takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PermissionChoice {
    /// This call only: `"allow"` or `{"value": "allow"}`.
    Allow,
    /// This call and every later one the approval's `grant` covers: `{"value": "always"}`.
    Always,
    /// Refuse it: `"deny"`, or `{"value": "deny", "note": "..."}` with a note the model reads.
    Deny,
}

impl PermissionChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionChoice::Allow => "allow",
            PermissionChoice::Always => "always",
            PermissionChoice::Deny => "deny",
        }
    }

    pub fn from_name(name: &str) -> Option<PermissionChoice> {
        [Self::Allow, Self::Always, Self::Deny]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

/// The question of a `permission` approval, typed so that a client renders it without parsing
/// text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionQuestion {
    /// The tool the agent wants to run (`bash`, `write`, `edit`, `read`, or an extension's).
    pub tool: String,
    /// pi's id of the tool call.
    pub tool_call_id: String,
    pub summary: ToolSummary,
    /// The rule that asked.
    pub rule: PermissionRule,
    /// The code the model receives when the answer is no (or none comes before the deadline).
    pub code: ErrorCode,
    /// The answers it takes.
    pub choices: Vec<PermissionChoice>,
    /// What "always" would grant for the rest of the session; absent when it cannot be offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<PermissionGrant>,
}

/// Who or what decided a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DecidedBy {
    /// The session's mode allowed or refused it without asking.
    Mode,
    /// A session grant allowed it.
    Grant,
    /// A person answered its approval.
    Person,
    /// Its approval's deadline passed: refused.
    Deadline,
    /// The always-on denylist refused it.
    Denylist,
    /// Its approval was cancelled (the turn ended or was aborted): refused.
    Cancelled,
}

/// `permission.decided`: the policy's decision on one tool call, before it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionDecidedData {
    pub tool: String,
    pub tool_call_id: String,
    pub allowed: bool,
    pub by: DecidedBy,
    /// The refusal's code (absent when allowed), as the model receives it in the tool result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Why, in words (the model receives it with the code).
    pub reason: String,
    // Boxed, as `grant`: every host event's body is as large as the largest.
    pub summary: Box<ToolSummary>,
    /// The session's mode when it was decided.
    pub mode: PermissionMode,
    /// The approval a person answered, when one asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// The device whose answer decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Its name, as it was paired, when the event was recorded (at most 200 characters);
    /// absent when `deviceId` is, and in events recorded by hosts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The grant the answer "always" gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Box<PermissionGrant>>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn modes_round_trip_by_their_wire_names() {
        for mode in PermissionMode::ALL {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{mode}\""));
            assert_eq!(PermissionMode::from_name(mode.as_str()), Some(mode));
        }
        assert_eq!(PermissionMode::from_name("bypass"), None);
    }
}
