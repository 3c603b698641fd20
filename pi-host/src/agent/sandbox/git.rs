//! The workspace's `.git/hooks` and `.git/config` read-only for the agent: git runs a hook, and
//! reads `core.hooksPath`, `core.fsmonitor` or an alias from the config, later, as the user and
//! outside any sandbox, so a write there is code that runs unasked. Landlock cannot take a right
//! back beneath a directory it grants (and git itself writes in `.git`), so the launcher gives the
//! agent a mount namespace of its own in which those two are read-only bind mounts of
//! themselves. It needs unprivileged user namespaces; where the kernel refuses them the agent
//! runs without this, which `host/info` does not claim (docs/reliability.md §4.19).

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{getgid, getuid};
use std::path::{Path, PathBuf};

/// The paths under `.git` of `workspace` the agent may not change.
fn guarded(workspace: &Path) -> Vec<PathBuf> {
    let git = workspace.join(".git");
    if !git.is_dir() {
        return Vec::new();
    }
    ["hooks", "config"]
        .iter()
        .map(|name| git.join(name))
        .filter(|path| path.exists())
        .collect()
}

/// Makes `workspace`'s git hooks and config read-only for this process and what it starts;
/// `Ok(false)` when there is nothing to guard.
pub fn guard(workspace: &Path) -> Result<bool, String> {
    let paths = guarded(workspace);
    if paths.is_empty() {
        return Ok(false);
    }
    let (uid, gid) = (getuid(), getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("no user namespace for the git guard: {e}"))?;
    // The same user inside as outside, so files keep their owner.
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| format!("cannot write {file}: {e}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))?;
    let none: Option<&str> = None;
    for path in &paths {
        mount(Some(path), path, none, MsFlags::MS_BIND, none)
            .and_then(|()| {
                let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
                mount(none, path, none, flags, none)
            })
            .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))?;
    }
    Ok(true)
}
