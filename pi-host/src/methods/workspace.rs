//! `workspace/status` and `workspace/diff` (docs/protocol.md §7.34, §7.35): the session's
//! workspace through its own git (`crate::workspace::git`).

use crate::state::HostState;
use crate::workspace::git::{self, DEADLINE};
use racp_proto::limits::{DEFAULT_DIFF_BYTES, MAX_STATUS_FILES};
use racp_proto::methods::session::SessionRef;
use racp_proto::methods::workspace::{
    StatusFile, WorkspaceDiffParams, WorkspaceDiffResult, WorkspaceStatusResult,
};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::time::Instant;

/// Most bytes of `git status` output read: 2 000 files of long paths.
const STATUS_BYTES: usize = 4 << 20;

/// Options every diff is made with: no external program, no colour, paths as they are.
const DIFF_OPTIONS: [&str; 4] = [
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--no-renames",
];

/// `workspace/status`.
pub async fn status(
    state: Arc<HostState>,
    params: SessionRef,
) -> Result<WorkspaceStatusResult, AppError> {
    let workspace = workspace_of(&state, &params.session_id)?;
    let deadline = Instant::now() + DEADLINE;
    git::top_level(&workspace, deadline).await?;
    let args = [
        "status",
        "--porcelain=v2",
        "--branch",
        "-z",
        "--untracked-files=all",
    ];
    let output = git::run(&workspace, &args, STATUS_BYTES, deadline).await?;
    if output.code != Some(0) && !output.cut {
        return Err(git_failed("status", &output.stderr));
    }
    let mut result = parse_status(&output.stdout);
    result.truncated |= output.cut;
    Ok(result)
}

/// `git status --porcelain=v2 --branch -z` as a result (docs: git-status(1), "Porcelain
/// Format Version 2").
fn parse_status(out: &[u8]) -> WorkspaceStatusResult {
    let mut result = WorkspaceStatusResult {
        branch: None,
        head: None,
        upstream: None,
        ahead: None,
        behind: None,
        files: Vec::new(),
        truncated: false,
    };
    let mut records = out.split(|b| *b == 0).map(String::from_utf8_lossy);
    while let Some(record) = records.next() {
        let fields: Vec<&str> = record.splitn(2, ' ').collect();
        let rest = fields.get(1).copied().unwrap_or("");
        match fields[0] {
            "#" => header(&mut result, rest),
            "1" | "2" | "u" => {
                // Ordinary (8 fields before the path), renamed (9), unmerged (10).
                let before = match fields[0] {
                    "1" => 7,
                    "2" => 8,
                    _ => 9,
                };
                let parts: Vec<&str> = rest.splitn(before + 1, ' ').collect();
                let from = (fields[0] == "2").then(|| records.next()).flatten();
                let (Some(xy), Some(path)) = (parts.first(), parts.get(before)) else {
                    continue;
                };
                push(&mut result, path, xy, from.map(|f| f.into_owned()));
            }
            "?" => push(&mut result, rest, "??", None),
            _ => {}
        }
    }
    result
}

fn header(result: &mut WorkspaceStatusResult, line: &str) {
    let (key, value) = line.split_once(' ').unwrap_or((line, ""));
    match key {
        "branch.oid" if value != "(initial)" => result.head = Some(value.to_string()),
        "branch.head" if value != "(detached)" => result.branch = Some(value.to_string()),
        "branch.upstream" => result.upstream = Some(value.to_string()),
        "branch.ab" => {
            let mut counts = value
                .split(' ')
                .map(|n| n.trim_start_matches(['+', '-']).parse().ok());
            result.ahead = counts.next().flatten();
            result.behind = counts.next().flatten();
        }
        _ => {}
    }
}

fn push(result: &mut WorkspaceStatusResult, path: &str, status: &str, from: Option<String>) {
    if result.files.len() >= MAX_STATUS_FILES {
        result.truncated = true;
        return;
    }
    result.files.push(StatusFile {
        path: path.to_string(),
        status: status.to_string(),
        from,
    });
}

/// `workspace/diff`.
pub async fn diff(
    state: Arc<HostState>,
    params: WorkspaceDiffParams,
) -> Result<WorkspaceDiffResult, AppError> {
    let workspace = workspace_of(&state, &params.session_id)?;
    let max = params.max_bytes.unwrap_or(DEFAULT_DIFF_BYTES) as usize;
    let deadline = Instant::now() + DEADLINE;
    git::top_level(&workspace, deadline).await?;
    let (paths, of_turn) = match (&params.turn_id, &params.path) {
        (Some(turn_id), _) => (turn_paths(&state, &params.session_id, turn_id)?, true),
        (None, Some(path)) => (vec![inside(&workspace, path)?], false),
        (None, None) => (Vec::new(), false),
    };
    let mut out = Diff::new(max);
    if !(of_turn && paths.is_empty()) {
        tracked(&workspace, &paths, &mut out, deadline).await?;
        untracked(&workspace, &paths, &mut out, deadline).await?;
    }
    Ok(WorkspaceDiffResult {
        diff: out.text,
        truncated: out.truncated,
        paths: if of_turn { paths } else { Vec::new() },
    })
}

/// The diff text being built, within its bound.
struct Diff {
    text: String,
    max: usize,
    truncated: bool,
}

impl Diff {
    fn new(max: usize) -> Diff {
        Diff {
            text: String::new(),
            max,
            truncated: false,
        }
    }

    fn room(&self) -> usize {
        self.max.saturating_sub(self.text.len())
    }

    /// Adds git's output, cut on a line end when it does not fit.
    fn add(&mut self, output: &git::Output) {
        let text = output.text();
        if text.len() <= self.room() && !output.cut {
            self.text.push_str(&text);
            return;
        }
        self.truncated = true;
        let room = self.room();
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = text[..end].rfind('\n').map_or(0, |at| at + 1);
        self.text.push_str(&text[..cut]);
    }
}

/// The tracked files' changes against HEAD (against the empty tree before the first commit).
async fn tracked(
    workspace: &Path,
    paths: &[String],
    out: &mut Diff,
    deadline: Instant,
) -> Result<(), AppError> {
    let head = git::run(
        workspace,
        &["rev-parse", "--verify", "-q", "HEAD"],
        1024,
        deadline,
    )
    .await?;
    let base = if head.code == Some(0) {
        "HEAD".to_string()
    } else {
        let empty = git::run(
            workspace,
            &["hash-object", "-t", "tree", "/dev/null"],
            1024,
            deadline,
        )
        .await?;
        empty.text().trim().to_string()
    };
    let mut args: Vec<&str> = vec!["diff"];
    args.extend(DIFF_OPTIONS);
    args.extend([base.as_str(), "--"]);
    args.extend(paths.iter().map(String::as_str));
    let output = git::run(workspace, &args, out.room(), deadline).await?;
    if output.code.is_some_and(|c| c != 0) {
        return Err(git_failed("diff", &output.stderr));
    }
    out.add(&output);
    Ok(())
}

/// New files git does not track yet (and does not ignore), each as a diff from nothing.
async fn untracked(
    workspace: &Path,
    paths: &[String],
    out: &mut Diff,
    deadline: Instant,
) -> Result<(), AppError> {
    let mut args = vec!["ls-files", "--others", "--exclude-standard", "-z", "--"];
    args.extend(paths.iter().map(String::as_str));
    let listed = git::run(workspace, &args, 1 << 20, deadline).await?;
    for path in listed.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        if out.truncated {
            break;
        }
        let path = String::from_utf8_lossy(path);
        let mut args = vec!["diff", "--no-index"];
        args.extend(DIFF_OPTIONS);
        args.extend(["--", "/dev/null", &path]);
        let output = git::run(workspace, &args, out.room(), deadline).await?;
        out.add(&output);
    }
    Ok(())
}

/// The session's workspace, which must still be a directory.
fn workspace_of(state: &HostState, session_id: &str) -> Result<PathBuf, AppError> {
    let session = state.sessions.find(session_id)?;
    let workspace = PathBuf::from(&session.workspace);
    if !workspace.is_dir() {
        return Err(AppError::new(
            ErrorCode::RemotePathNotFound,
            format!("the session's workspace {} is gone", session.workspace),
        )
        .with_details(json!({"path": session.workspace})));
    }
    Ok(workspace)
}

/// `path` as git takes it: relative to the workspace, which it must not leave.
fn inside(workspace: &Path, path: &str) -> Result<String, AppError> {
    let given = Path::new(path);
    let relative = if given.is_absolute() {
        given.strip_prefix(workspace).map(Path::to_path_buf).ok()
    } else {
        Some(given.to_path_buf())
    };
    let leaves = |p: &Path| {
        p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    };
    match relative {
        Some(relative) if !leaves(&relative) => Ok(relative.to_string_lossy().into_owned()),
        _ => Err(AppError::new(
            ErrorCode::RemotePathForbidden,
            format!("{path} is outside the session's workspace; name a path inside it"),
        )
        .with_details(json!({"path": path, "workspace": workspace.display().to_string()}))),
    }
}

/// The paths inside the workspace a turn's `turn.finished` named.
fn turn_paths(state: &HostState, session_id: &str, turn_id: &str) -> Result<Vec<String>, AppError> {
    let (_, snapshot, _) = state.sessions.find(session_id)?.snapshot();
    let turn = snapshot
        .turns
        .into_iter()
        .find(|t| t.turn_id == turn_id)
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::TurnNotFound,
                "no such turn among the session's recent turns",
            )
            .with_details(json!({"turnId": turn_id}))
        })?;
    Ok(turn
        .files
        .into_iter()
        .map(|f| f.path)
        .filter(|p| !Path::new(p).is_absolute())
        .collect())
}

fn git_failed(what: &str, stderr: &str) -> AppError {
    let first = stderr.lines().next().unwrap_or("");
    crate::internal(format!("git {what} failed: {first}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_v2_reads_as_a_status() {
        let out = b"# branch.oid abc\0# branch.head main\0# branch.upstream origin/main\0# branch.ab +2 -1\0\
1 .M N... 100644 100644 100644 a a src/a.rs\0\
2 R. N... 100644 100644 100644 a a R100 new name.txt\0old.txt\0\
? notes.md\0";
        let status = parse_status(out);
        assert_eq!(status.branch.as_deref(), Some("main"));
        assert_eq!(status.head.as_deref(), Some("abc"));
        assert_eq!((status.ahead, status.behind), (Some(2), Some(1)));
        let files: Vec<_> = status
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.status.as_str(), f.from.as_deref()))
            .collect();
        assert_eq!(
            files,
            [
                ("src/a.rs", ".M", None),
                ("new name.txt", "R.", Some("old.txt")),
                ("notes.md", "??", None)
            ]
        );
    }

    #[test]
    fn a_status_lists_its_bound_of_files_and_says_truncated_past_it() {
        let untracked = |n: usize| -> Vec<u8> {
            (0..n)
                .flat_map(|i| format!("? f{i}\0").into_bytes())
                .collect()
        };
        let at = parse_status(&untracked(MAX_STATUS_FILES));
        assert_eq!((at.files.len(), at.truncated), (MAX_STATUS_FILES, false));
        let past = parse_status(&untracked(MAX_STATUS_FILES + 1));
        assert_eq!((past.files.len(), past.truncated), (MAX_STATUS_FILES, true));
    }

    #[test]
    fn a_diff_is_cut_on_a_line_end_within_its_bound() {
        let output = |text: &str| git::Output {
            stdout: text.as_bytes().to_vec(),
            cut: false,
            code: Some(0),
            stderr: String::new(),
        };
        let mut exact = Diff::new(6);
        exact.add(&output("ab\ncd\n"));
        assert_eq!((exact.text.as_str(), exact.truncated), ("ab\ncd\n", false));
        let mut over = Diff::new(5);
        over.add(&output("ab\ncd\n"));
        assert_eq!((over.text.as_str(), over.truncated), ("ab\n", true));
    }

    #[test]
    fn a_path_may_not_leave_the_workspace() {
        let root = Path::new("/w");
        assert_eq!(inside(root, "a/b").unwrap_or_default(), "a/b");
        assert_eq!(inside(root, "/w/a").unwrap_or_default(), "a");
        assert!(inside(root, "../x").is_err());
        assert!(inside(root, "/etc/passwd").is_err());
    }
}
