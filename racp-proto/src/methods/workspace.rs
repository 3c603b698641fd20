//! The workspace of a session as the desktop sees it: `workspace.changed` events (what changed
//! on disk), what a turn changed (`turn.finished`'s `files`), and `workspace/status` and
//! `workspace/diff` from the workspace's own git (docs/protocol.md §7.34, §7.35, §8.9).

use crate::AppError;
use crate::limits::{MAX_DIFF_BYTES, MAX_ID_CHARS, MAX_PATH_CHARS};
use crate::validate::{Validate, invalid, length};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Created,
    Modified,
    Removed,
    /// Moved here from `from` (or from outside the watched tree when `from` is absent).
    Renamed,
}

/// One path that changed, relative to the workspace (`/`-separated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathChange {
    pub path: String,
    pub kind: ChangeKind,
    /// For `renamed`: where it was, when that was inside the watched tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// True for a directory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir: bool,
}

/// `workspace.changed`: paths of the session's workspace changed on disk (by the agent, a
/// shell, an editor: whoever wrote), gathered over a short window. `rescan: true` says the
/// list is not the whole story (the kernel's queue overflowed, or a bound was reached): read
/// the tree again (`fs/list`, `workspace/status`) rather than trust what you hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceChangedData {
    /// In the order first seen; at most 256, each path once (its last kind).
    pub changes: Vec<PathChange>,
    /// Something changed that `changes` does not name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rescan: bool,
    /// Why `rescan`: `overflow` (the kernel dropped events), `too_many_changes` (more paths
    /// in the window than one event names), `too_many_directories` (the tree has more
    /// directories than the host watches: changes in the rest are not seen), `watch_failed`,
    /// `host_restarted` (the host started again: what changed while none watched is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Under `rescan`: the directory to read again (`""`: the whole workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescan_path: Option<String>,
}

/// A file a turn's tools wrote, edited or deleted (in `turn.finished`'s `files`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileChange {
    /// Relative to the workspace (`/`-separated); absolute when outside it.
    pub path: String,
    pub kind: ChangeKind,
    /// Lines added, when known: exact from the agent's edit tool's diff and for a file a
    /// write created; for a write over an existing file the lines it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<u64>,
    /// Lines removed, when known (exact from the edit tool's diff; 0 for a created file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<u64>,
    /// Which tools changed it: `write`, `edit`, or `disk` when only the workspace's watcher
    /// saw it (a shell command, a tool the host does not read).
    pub by: Vec<String>,
}

/// `workspace/status`'s result: the workspace's git state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatusResult {
    /// The branch checked out; absent when HEAD is detached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit checked out; absent before the first commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// The branch's upstream, with how far the branch is ahead of and behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind: Option<u64>,
    /// Changed, untracked and conflicted files (ignored ones left out), at most 2 000 (`MAX_STATUS_FILES`).
    pub files: Vec<StatusFile>,
    /// True when `files` was cut at its bound.
    #[serde(default)]
    pub truncated: bool,
}

/// One file of `workspace/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusFile {
    /// Relative to the repository's top directory.
    pub path: String,
    /// git's two-letter status (`porcelain=v2`): the index, then the working tree; `.` for
    /// unchanged, `M`, `A`, `D`, `R`, `C`, `U`; `??` untracked.
    pub status: String,
    /// For a rename or copy: where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// `workspace/diff`'s params: the working tree against HEAD, or one path of it, or the files
/// one turn changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceDiffParams {
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub session_id: String,
    /// Only the files this turn changed (its `turn.finished` `files`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_ID_CHARS))]
    pub turn_id: Option<String>,
    /// Only this path (relative to the workspace, or absolute inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_PATH_CHARS))]
    pub path: Option<String>,
    /// Most bytes of diff to return: 1 to 524 288 (262 144 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DIFF_BYTES))]
    pub max_bytes: Option<u64>,
}

impl Validate for WorkspaceDiffParams {
    fn validate(&self) -> Result<(), AppError> {
        length("sessionId", &self.session_id, 1, MAX_ID_CHARS)?;
        if let Some(turn_id) = &self.turn_id {
            length("turnId", turn_id, 1, MAX_ID_CHARS)?;
        }
        if let Some(path) = &self.path {
            length("path", path, 1, MAX_PATH_CHARS)?;
        }
        if self.turn_id.is_some() && self.path.is_some() {
            return Err(invalid("path", "give turnId or path, not both"));
        }
        match self.max_bytes {
            Some(0) => Err(invalid("maxBytes", "must be at least 1")),
            Some(n) if n > MAX_DIFF_BYTES => Err(invalid(
                "maxBytes",
                format!("must be at most {MAX_DIFF_BYTES}: ask for one path at a time"),
            )),
            _ => Ok(()),
        }
    }
}

/// `workspace/diff`'s result: a unified diff (`git diff HEAD`), cut at `maxBytes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceDiffResult {
    /// The diff text (UTF-8; a binary file as git's `Binary files ... differ`).
    pub diff: String,
    /// True when the diff was cut at `maxBytes` (on a line end).
    #[serde(default)]
    pub truncated: bool,
    /// The paths the diff covers when it was asked for a turn (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::Validate;

    fn diff(max_bytes: Option<u64>) -> WorkspaceDiffParams {
        WorkspaceDiffParams {
            session_id: "ses_1".into(),
            turn_id: None,
            path: None,
            max_bytes,
        }
    }

    #[test]
    fn max_bytes_takes_its_bound_and_refuses_one_more() {
        assert!(diff(Some(MAX_DIFF_BYTES)).validate().is_ok());
        assert!(diff(Some(1)).validate().is_ok());
        assert!(diff(Some(MAX_DIFF_BYTES + 1)).validate().is_err());
        assert!(diff(Some(0)).validate().is_err());
        let both = WorkspaceDiffParams {
            turn_id: Some("turn_1".into()),
            path: Some("a".into()),
            ..diff(None)
        };
        assert!(both.validate().is_err(), "turnId or path, not both");
    }
}
