//! The workspace's git, as the user's repository expects it (docs/protocol.md §7.34, §7.35):
//! the remote's own `git` binary, so the repository's config, attributes and object format are
//! read by the program that wrote them (a library would read some of them differently), run
//! with hooks off (`core.hooksPath=/dev/null`), no external diff or textconv program, no
//! optional locks (`GIT_OPTIONAL_LOCKS=0`: a status never takes the index lock an editor or
//! the agent may need), no prompt, under a deadline, its output read to a bound.

use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

/// Longest one `workspace/status` or `workspace/diff` may run git for, all commands together.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// Most bytes of stderr kept for a failure's message.
const STDERR_BYTES: usize = 4 << 10;

/// What one git command printed (stdout up to its bound) and how it exited.
pub struct Output {
    pub stdout: Vec<u8>,
    /// stdout went past the bound: the command was stopped there.
    pub cut: bool,
    pub code: Option<i32>,
    pub stderr: String,
}

impl Output {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `git ARGS` in `workspace`, reading at most `max` bytes of its output, until `deadline`.
pub async fn run(
    workspace: &Path,
    args: &[&str],
    max: usize,
    deadline: Instant,
) -> Result<Output, AppError> {
    let mut command = command(workspace, args);
    let mut child = command.spawn().map_err(unavailable)?;
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(crate::internal("git's pipes were not opened"));
    };
    let work = async {
        let mut out = Vec::new();
        let mut limited = (&mut stdout).take(max as u64 + 1);
        let mut err = Vec::new();
        let mut errors = (&mut stderr).take(STDERR_BYTES as u64);
        let (read_out, _) =
            tokio::join!(limited.read_to_end(&mut out), errors.read_to_end(&mut err));
        read_out.map_err(crate::internal)?;
        let cut = out.len() > max;
        let code = if cut {
            // Enough read: git is stopped rather than waited for.
            let _ = child.start_kill();
            None
        } else {
            child.wait().await.map_err(crate::internal)?.code()
        };
        out.truncate(max);
        Ok::<_, AppError>(Output {
            stdout: out,
            cut,
            code,
            stderr: String::from_utf8_lossy(&err).trim().to_string(),
        })
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(output) => output,
        Err(_) => Err(AppError::new(
            ErrorCode::Timeout,
            format!(
                "git did not answer within {} s in this workspace; try one path (workspace/diff with path)",
                DEADLINE.as_secs()
            ),
        )),
    }
}

/// `git ARGS` in `workspace` as every call runs it: no hook, fsmonitor, pager, optional lock
/// or prompt; a `GIT_DIR` of the host's own environment ignored; stopped when dropped.
fn command(workspace: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("git");
    command
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .args(["--no-pager", "--no-optional-locks"])
        .args(args)
        .current_dir(workspace)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove(racp_server::notify::ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The workspace's repository top directory, or WORKSPACE_NOT_A_REPOSITORY.
pub async fn top_level(workspace: &Path, deadline: Instant) -> Result<String, AppError> {
    let output = run(
        workspace,
        &["rev-parse", "--show-toplevel"],
        64 << 10,
        deadline,
    )
    .await?;
    if output.code != Some(0) {
        let first = output.stderr.lines().next().unwrap_or("").to_string();
        return Err(AppError::new(
            ErrorCode::WorkspaceNotARepository,
            format!(
                "the workspace {} is not in a git repository git can read here: {first}",
                workspace.display()
            ),
        )
        .with_details(json!({"workspace": workspace.display().to_string(), "git": first})));
    }
    Ok(output.text().trim_end_matches('\n').to_string())
}

fn unavailable(err: std::io::Error) -> AppError {
    AppError::new(
        ErrorCode::GitUnavailable,
        format!("the host cannot run git ({err}): install git on the remote, on the host's PATH"),
    )
    .with_details(json!({"error": err.to_string()}))
}
