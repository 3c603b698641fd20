//! The permission policy (docs/protocol.md, "Permissions"): what the agent may do before each
//! tool call. Decided here, in the host; pi-host's pi extension (`agent/extensions/
//! permissions.ts`) only hands each call over and blocks it when told (the driver's
//! `permissions.rs` carries it).
//!
//! Rules, first match wins: the always-on denylist (WORKSPACE_PATH_DENIED, every mode, no
//! grant lifts it); plan mode's hard denials; a path outside the workspace asks (every mode);
//! then the mode's table, where a session grant turns an ask into an allow.

pub mod denylist;
pub mod paths;

use denylist::Denylist;
use paths::Resolved;
use racp_proto::ErrorCode;
use racp_proto::permission::{
    DecidedBy, GrantScope, PermissionGrant, PermissionMode, PermissionRule, ToolSummary,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The title pi-host's extension gives its policy request (an `editor` dialog, the call as its
/// prefilled text): the host answers it itself, and nobody sees it.
pub const REQUEST_TITLE: &str = "pi-host.policy.v1";

/// A tool call as the extension hands it over (its `prefill` JSON). The input is summarised
/// there: a write's content never travels, only its size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub tool: String,
    pub tool_call_id: String,
    /// pi's working directory for the call (`ctx.cwd`).
    pub cwd: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub bytes: Option<u64>,
    #[serde(default)]
    pub edits: Option<u64>,
}

/// What kind of tool it is, to the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// pi's read, grep, find, ls.
    Read,
    Write,
    Edit,
    Bash,
    /// Any other tool (an extension's).
    Other,
}

fn class_of(tool: &str) -> Class {
    match tool {
        "read" | "grep" | "find" | "ls" => Class::Read,
        "write" => Class::Write,
        "edit" => Class::Edit,
        "bash" => Class::Bash,
        _ => Class::Other,
    }
}

/// What the policy knows of the session when it judges.
pub struct Context<'a> {
    pub mode: PermissionMode,
    /// The workspace's real path.
    pub workspace: &'a Path,
    pub home: Option<&'a Path>,
    pub denylist: &'a Denylist,
    pub grants: &'a [PermissionGrant],
}

/// The policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    Allow {
        by: DecidedBy,
    },
    Deny {
        by: DecidedBy,
        code: ErrorCode,
        reason: String,
    },
    /// A person decides: an approval asks, `code` is the refusal when the answer is no.
    Ask {
        rule: PermissionRule,
        code: ErrorCode,
        grant: Option<PermissionGrant>,
    },
}

/// Judges one tool call; also returns what it would do, as a person reads it.
pub fn judge(ctx: &Context<'_>, call: &ToolCall) -> (Judgement, ToolSummary) {
    let class = class_of(&call.tool);
    let cwd = paths::normalise(Path::new(&call.cwd));
    // A read tool without a path (grep, find, ls) works in its working directory.
    let raw_path = call
        .path
        .clone()
        .or_else(|| (class == Class::Read).then(|| ".".to_string()));
    let resolved = raw_path.map(|raw| paths::resolve(&raw, &cwd, ctx.home));
    let summary = ToolSummary {
        command: call.command.clone(),
        path: resolved.as_ref().map(|r| r.real.display().to_string()),
        bytes: call.bytes,
        edits: call.edits,
    };
    (decide(ctx, call, class, &cwd, resolved.as_ref()), summary)
}

fn decide(
    ctx: &Context<'_>,
    call: &ToolCall,
    class: Class,
    cwd: &Path,
    resolved: Option<&Resolved>,
) -> Judgement {
    let write = matches!(class, Class::Write | Class::Edit | Class::Other);
    if let Some(resolved) = resolved
        && let Some(what) = denied(ctx.denylist, resolved, write)
    {
        return denylisted(&resolved.named, what);
    }
    if class == Class::Bash
        && let Some((word, what)) = call
            .command
            .as_deref()
            .and_then(|c| bash_denied(ctx, c, cwd))
    {
        return denylisted(&word, what);
    }
    if ctx.mode == PermissionMode::Plan
        && let Some(code) = plan_denial(class)
    {
        return Judgement::Deny {
            by: DecidedBy::Mode,
            code,
            reason: format!(
                "the session is in plan mode, where {} is not allowed; describe the change \
                 instead, or ask the operator to change the mode",
                call.tool
            ),
        };
    }
    if let Some(resolved) = resolved
        && !resolved.inside(ctx.workspace)
    {
        return outside(ctx, call, resolved);
    }
    by_mode(ctx, call, class, resolved)
}

fn denied(list: &Denylist, resolved: &Resolved, write: bool) -> Option<&'static str> {
    list.hit(&resolved.real, write)
        .or_else(|| list.hit(&resolved.named, write))
}

fn denylisted(path: &Path, what: &str) -> Judgement {
    Judgement::Deny {
        by: DecidedBy::Denylist,
        code: ErrorCode::WorkspacePathDenied,
        reason: format!(
            "{} is on pi-host's always-on denylist ({what}); no mode or grant lifts it",
            path.display()
        ),
    }
}

fn plan_denial(class: Class) -> Option<ErrorCode> {
    match class {
        Class::Write => Some(ErrorCode::WriteDisabledInPlan),
        Class::Edit => Some(ErrorCode::EditDisabledInPlan),
        Class::Other => Some(ErrorCode::ToolDisabledInPlan),
        Class::Read | Class::Bash => None,
    }
}

/// A path outside the workspace asks in every mode, unless a grant covers its directory.
fn outside(ctx: &Context<'_>, call: &ToolCall, resolved: &Resolved) -> Judgement {
    if granted_dir(ctx.grants, &call.tool, &resolved.real) {
        return Judgement::Allow {
            by: DecidedBy::Grant,
        };
    }
    Judgement::Ask {
        rule: PermissionRule::OutsideWorkspace,
        code: ErrorCode::PathOutsideWorkspace,
        grant: Some(dir_grant(&call.tool, resolved)),
    }
}

/// The mode's table for a call inside the workspace (docs/protocol.md, "Permissions").
fn by_mode(
    ctx: &Context<'_>,
    call: &ToolCall,
    class: Class,
    resolved: Option<&Resolved>,
) -> Judgement {
    use PermissionMode::*;
    let allow = Judgement::Allow {
        by: DecidedBy::Mode,
    };
    let grant_allows = Judgement::Allow {
        by: DecidedBy::Grant,
    };
    let ask = |rule, grant| Judgement::Ask {
        rule,
        code: ErrorCode::ToolDenied,
        grant,
    };
    match (class, ctx.mode) {
        (Class::Read, _) => allow,
        (Class::Write | Class::Edit, AcceptEdits | Auto) => allow,
        (Class::Bash | Class::Other, Auto) => allow,
        (Class::Write | Class::Edit, _) => match resolved {
            Some(r) if granted_dir(ctx.grants, &call.tool, &r.real) => grant_allows,
            Some(r) => ask(PermissionRule::Mode, Some(dir_grant(&call.tool, r))),
            None => ask(PermissionRule::Mode, None),
        },
        (Class::Bash, _) => {
            let command = call.command.as_deref().unwrap_or("");
            if granted_command(ctx.grants, command) {
                return grant_allows;
            }
            let grant = command_prefix(command).map(|value| PermissionGrant {
                tool: call.tool.clone(),
                scope: GrantScope::CommandPrefix,
                value,
            });
            ask(PermissionRule::Mode, grant)
        }
        (Class::Other, _) => {
            let tool_grant = PermissionGrant {
                tool: call.tool.clone(),
                scope: GrantScope::Tool,
                value: call.tool.clone(),
            };
            if ctx.grants.contains(&tool_grant) {
                return grant_allows;
            }
            ask(PermissionRule::UnknownTool, Some(tool_grant))
        }
    }
}

fn dir_grant(tool: &str, resolved: &Resolved) -> PermissionGrant {
    PermissionGrant {
        tool: tool.to_string(),
        scope: GrantScope::Directory,
        value: resolved.grant_dir().display().to_string(),
    }
}

fn granted_dir(grants: &[PermissionGrant], tool: &str, path: &Path) -> bool {
    grants.iter().any(|g| {
        g.tool == tool && g.scope == GrantScope::Directory && path.starts_with(Path::new(&g.value))
    })
}

/// Characters that chain, substitute or redirect: a command holding one is never covered by
/// a grant for its leading words (`git status; rm -rf ~` is not `git status`).
const SHELL_SPECIAL: &[char] = &[';', '&', '|', '`', '$', '(', ')', '<', '>', '\n', '\r'];

/// The leading words a grant for `command` covers: the program, and its subcommand when the
/// second word is a plain word (`git status`, `npm test`; `ls` for `ls -la`). None for a
/// command that chains, substitutes or redirects.
pub fn command_prefix(command: &str) -> Option<String> {
    if command.contains(SHELL_SPECIAL) {
        return None;
    }
    let words = shell_words::split(command).ok()?;
    let program = words.first()?;
    let plain = |w: &String| {
        w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    match words.get(1) {
        Some(sub) if plain(sub) => Some(format!("{program} {sub}")),
        _ => Some(program.clone()),
    }
}

fn granted_command(grants: &[PermissionGrant], command: &str) -> bool {
    if command.contains(SHELL_SPECIAL) {
        return false;
    }
    let Ok(words) = shell_words::split(command) else {
        return false;
    };
    grants
        .iter()
        .filter(|g| g.tool == "bash" && g.scope == GrantScope::CommandPrefix)
        .any(|g| {
            let prefix: Vec<&str> = g.value.split(' ').collect();
            words.len() >= prefix.len() && words.iter().zip(&prefix).all(|(w, p)| w == p)
        })
}

/// The first word of a shell command that names a denylisted path (best effort: the words as
/// the shell would split them, `~`, `$HOME` and `--opt=` values expanded; the kernel sandbox
/// is the real fence).
fn bash_denied(ctx: &Context<'_>, command: &str, cwd: &Path) -> Option<(PathBuf, &'static str)> {
    let words = shell_words::split(command)
        .unwrap_or_else(|_| command.split_whitespace().map(str::to_string).collect());
    for word in words.iter().flat_map(|w| candidates(w, ctx.home)) {
        let resolved = paths::resolve(&word, cwd, ctx.home);
        if let Some(what) = denied(ctx.denylist, &resolved, true) {
            return Some((resolved.named, what));
        }
    }
    None
}

/// The paths a shell word may name: itself without redirections, the value of `--opt=value`,
/// and each side of a `:` list, with `$HOME` spelled out.
fn candidates(word: &str, home: Option<&Path>) -> Vec<String> {
    let word = word.trim_start_matches(['<', '>', '&', '|', ';', '(']);
    let word = word.trim_end_matches([';', '&', '|', ')']);
    let mut out = vec![word.to_string()];
    if let Some((_, value)) = word.split_once('=') {
        out.push(value.to_string());
    }
    if let Some(home) = home {
        let home = home.display().to_string();
        for spelled in ["${HOME}", "$HOME"] {
            let expanded: Vec<String> = out
                .iter()
                .filter(|w| w.contains(spelled))
                .map(|w| w.replace(spelled, &home))
                .collect();
            out.extend(expanded);
        }
    }
    out.into_iter().filter(|w| !w.is_empty()).collect()
}

#[cfg(test)]
mod tests;
