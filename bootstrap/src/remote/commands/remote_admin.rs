//! The commands that reach a `connect` profile's remote over SSH again, with what `connect` was
//! given (target, ssh config, known_hosts, keys; the host key must be known): `logs` (the
//! host's log, `R/host.log`, or the profile's local background log) and `uninstall` (stops the
//! host, removes what `connect` installed under the install root `R`, its config lines, then
//! the profile). The layout of `R` is deploy/install.sh's.

use super::background;
use crate::provision::remote_shell::{MARK, root_word, sh_quote};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::profile::{self, Profile, SshOrigin};
use crate::remote::remotes;
use crate::ssh::config::{ResolveOptions, resolve};
use crate::ssh::{self, ConnectOptions, SshError, SshSession};
use racp_proto::validate::printable;
use racp_proto::{AppError, ErrorCode, ErrorSource};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What `connect` installed under the install root, as deploy/install.sh lays it out. The
/// root's `config.toml` is the operator's: only the lines `connect` wrote leave it.
pub const INSTALLED: &[&str] = &[
    "versions",
    "current",
    "install.sh",
    "staging",
    "data",
    "state.json",
    "host.log",
    "host.log.1",
    "run.version",
    "install.lock",
    "install.lock.d",
];

/// A stored profile made by `connect`, with its SSH origin.
pub fn ssh_profile(name: &str) -> Result<(Profile, SshOrigin), Failure> {
    let stored = super::load_profile(name)?;
    match stored.ssh.clone() {
        Some(origin) => Ok((stored, origin)),
        None => Err(Failure::Usage(format!(
            "the profile {name:?} was paired with {} directly, not made by `pi-remote connect`: \
             there is no SSH remote to reach",
            stored.url
        ))),
    }
}

/// An SSH error as the failure a person reads (exit 3 unreachable, 4 refused keys or host key).
pub fn ssh_failure(origin: &SshOrigin, error: &SshError) -> AppError {
    ssh_failure_then(
        origin,
        error,
        "`pi-remote doctor` checks the remote step by step",
    )
}

/// [`ssh_failure`] with `what_to_do` after the SSH error.
fn ssh_failure_then(origin: &SshOrigin, error: &SshError, what_to_do: &str) -> AppError {
    let code = match error {
        SshError::Unreachable { .. } | SshError::Timeout(_) | SshError::Protocol(_) => {
            ErrorCode::RemoteConnectionFailed
        }
        _ => ErrorCode::RemoteAuthFailed,
    };
    AppError::new(
        code,
        format!("ssh {}: {error}; {what_to_do}", origin.target),
    )
    .with_source(ErrorSource::Bootstrap)
}

/// Connects over SSH as `connect` did: strict host keys, keys from the agent, askpass or the
/// terminal.
pub async fn ssh_to(origin: &SshOrigin) -> Result<SshSession, SshError> {
    let destination = resolve(
        &origin.target,
        &ResolveOptions {
            config_file: origin.ssh_config.clone(),
            known_hosts: origin.known_hosts.clone(),
            identity_files: origin.identities.clone(),
        },
    )
    .map_err(|reason| SshError::Unreachable {
        target: origin.target.clone(),
        reason,
    })?;
    let options = ConnectOptions {
        passphrase: Some(Arc::new(ssh::prompt::ask_key_passphrase)),
        ..ConnectOptions::default()
    };
    ssh::connect(&destination, &options, |_| {}).await
}

/// `pi-remote logs [PROFILE] [-f] [--local] [--lines N]`.
pub async fn logs(
    out: &Out,
    name: &str,
    follow: bool,
    local: bool,
    lines: u32,
) -> Result<(), Failure> {
    if local {
        let dir = profile::config_dir().map_err(Failure::Local)?;
        return local_log(out, &remotes::log_file(&dir, name), follow, lines).await;
    }
    let (_, origin) = ssh_profile(name)?;
    let session = ssh_to(&origin)
        .await
        .map_err(|e| Failure::App(ssh_failure(&origin, &e)))?;
    let log = format!("{}/host.log", root_word(&origin.remote_dir));
    let command = format!(
        "if [ -f {log} ]; then exec tail -n {lines}{} {log}; else echo \"no log at $(echo {log}) (is pi-host installed there?)\" >&2; exit 1; fi",
        if follow { " -F" } else { "" }
    );
    let mut remote = session
        .start(&command)
        .await
        .map_err(|e| Failure::App(ssh_failure(&origin, &e)))?;
    let printed = async {
        while let Some(line) = remote.next_line().await {
            out.line(&line);
            remote.forget_read();
        }
        remote.finish().await
    };
    tokio::select! {
        ended = printed => match ended {
            Ok(output) if output.success() => Ok(()),
            Ok(output) => Err(Failure::local(format!(
                "reading the host's log failed: {}",
                printable(&output.stderr_tail(), false)
            ))),
            Err(e) => Err(Failure::App(ssh_failure(&origin, &e))),
        },
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// The local background log: its last lines, then (with `follow`) what is appended, until
/// Ctrl-C.
async fn local_log(out: &Out, path: &Path, follow: bool, lines: u32) -> Result<(), Failure> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !follow => {
            return Err(Failure::local(format!(
                "no background log at {} (`pi-remote connect --background` writes it)",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(Failure::local(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    };
    let all = String::from_utf8_lossy(&text);
    let kept: Vec<&str> = all.lines().collect();
    for line in &kept[kept.len().saturating_sub(lines as usize)..] {
        out.line(line);
    }
    if !follow {
        return Ok(());
    }
    let mut offset = text.len() as u64;
    let following = async {
        loop {
            // A file that is appended to, polled: nothing here to wake us on a write.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok(text) = std::fs::read(path) else {
                continue;
            };
            let len = text.len() as u64;
            if len < offset {
                offset = 0;
            }
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(text.len());
            out.text(&String::from_utf8_lossy(&text[start..]));
            offset = len;
        }
    };
    tokio::select! {
        () = following => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// The remote part of `uninstall`: stop the host, remove what `connect` installed (with its
/// `~/.local/bin/pi-host` link, when it still leads to this root) and the config lines it wrote, then the root if nothing else is left in it. Prints `removed PATH`
/// for each, `kept PATH` for the root when the user's files remain.
fn uninstall_script(remote_dir: &str) -> String {
    let root = root_word(remote_dir);
    let items = INSTALLED
        .iter()
        .map(|item| sh_quote(item))
        .collect::<Vec<_>>()
        .join(" ");
    let mark = sh_quote(&format!("{MARK}[[:space:]]*$"));
    format!(
        r#"R={root}
if [ ! -d "$R" ]; then echo "absent $R"; exit 0; fi
R=$(cd "$R" && pwd -P) || exit 1
if [ -f "$R/install.sh" ]; then sh "$R/install.sh" stop --root "$R" >/dev/null 2>&1 || echo "warning: install.sh stop failed" >&2; fi
unit="${{XDG_CONFIG_HOME:-${{HOME:-/nonexistent}}/.config}}/systemd/user/pi-host-$(printf '%s' "$R" | cksum | cut -d' ' -f1).service"
if [ -f "$unit" ]; then
    rm -f "$unit" && echo "removed $unit"
    systemctl --user daemon-reload >/dev/null 2>&1 || true
fi
L="${{HOME:-/nonexistent}}/.local/bin/pi-host"
if [ -L "$L" ] && [ "$(readlink "$L")" = "$R/current/bin/pi-host" ]; then rm -f "$L" && echo "removed $L"; fi
for item in {items}; do
    if [ -e "$R/$item" ] || [ -L "$R/$item" ]; then rm -rf "$R/$item" && echo "removed $R/$item"; fi
done
c="$R/config.toml"
if [ -f "$c" ] && grep -q {mark} "$c"; then
    grep -v {mark} "$c" >"$c.tmp.$$" || true
    if grep -q '[^[:space:]]' "$c.tmp.$$"; then
        cat "$c.tmp.$$" >"$c" && rm -f "$c.tmp.$$" && echo "removed connect's lines from $c"
    else
        rm -f "$c.tmp.$$" "$c" && echo "removed $c"
    fi
fi
if rmdir "$R" 2>/dev/null; then echo "removed $R"; else echo "kept $R"; fi
"#
    )
}

/// `pi-remote uninstall PROFILE [--yes] [--local-only]`. When SSH cannot reach the remote,
/// nothing is removed unless the person chooses the desktop's side alone: `--local-only`, or
/// "yes" when asked at a terminal (without `--yes`).
pub async fn uninstall(out: &Out, name: &str, yes: bool, local_only: bool) -> Result<(), Failure> {
    let (stored, origin) = ssh_profile(name)?;
    let dir = profile::config_dir().map_err(Failure::Local)?;
    if local_only {
        return desktop_only(out, &dir, name, (&origin, &stored)).await;
    }
    confirm(name, &origin, yes)?;
    let session = match ssh_to(&origin).await {
        Ok(session) => session,
        Err(e) => return not_reached(out, &dir, name, (&origin, &stored), (&e, yes)).await,
    };
    // Stopped before the host, which its forward would otherwise start again; and only once
    // the remote is reached, so that a refused uninstall leaves everything as it was.
    let mut removed: Vec<String> = Vec::new();
    if let Some(pid) = background::stop(&dir, name).await? {
        removed.push(format!("stopped the background connect (pid {pid})"));
    }
    let output = session
        .exec(&uninstall_script(&origin.remote_dir))
        .await
        .map_err(|e| Failure::App(ssh_failure(&origin, &e)))?;
    session.disconnect().await;
    if !output.success() {
        return Err(Failure::local(format!(
            "removing pi-host from {} failed: {}",
            origin.target,
            printable(&output.stderr_tail(), false)
        )));
    }
    removed.extend(
        output
            .stdout_text()
            .lines()
            .map(|l| format!("{}: {l}", origin.target)),
    );
    removed.extend(remove_local(&dir, name));
    report(out, name, &removed, None);
    Ok(())
}

/// SSH did not reach the remote: nothing is removed, and the failure names `--local-only`;
/// at a terminal without `--yes`, the person is asked whether to remove the desktop's side
/// alone instead.
async fn not_reached(
    out: &Out,
    dir: &Path,
    name: &str,
    (origin, stored): (&SshOrigin, &Profile),
    (error, yes): (&SshError, bool),
) -> Result<(), Failure> {
    let asking = !yes && std::io::stdin().is_terminal();
    let failure = unreachable(name, origin, error, asking);
    if !asking {
        return Err(Failure::App(failure));
    }
    out.note(&format!("pi-remote: {}", failure.message()));
    let question = format!(
        "Remove only this desktop's side of {name:?} (the profile with its device token and pin, the background connect's files)? (yes/no) "
    );
    if !ssh::prompt::ask_yes_no(&question) {
        return Err(Failure::App(unreachable(name, origin, error, false)));
    }
    desktop_only(out, dir, name, (origin, stored)).await
}

/// Asks before removing pi-host from the remote, unless `yes`; without a terminal to ask at,
/// `--yes` is needed (exit 64).
fn confirm(name: &str, origin: &SshOrigin, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Usage(format!(
            "uninstall removes pi-host and its data from {}: give --yes to do it without a terminal to ask at",
            origin.target
        )));
    }
    let question = format!(
        "Stop pi-host on {} and remove {} (its sessions and data; your own files there stay), then the profile {name:?}? (yes/no) ",
        origin.target, origin.remote_dir
    );
    if !ssh::prompt::ask_yes_no(&question) {
        return Err(Failure::local("nothing was removed"));
    }
    Ok(())
}

/// Uninstall's failure when SSH cannot reach the remote (exit 3, or 4 for refused keys): it
/// names `--local-only` unless the person is about to be asked instead.
fn unreachable(name: &str, origin: &SshOrigin, error: &SshError, asking: bool) -> AppError {
    let what_to_do = if asking {
        "nothing was removed from it".to_string()
    } else {
        format!(
            "nothing was removed. If the remote is gone for good, `pi-remote uninstall {name} --local-only` \
             removes only this desktop's side (the profile with its device token and pin, the background \
             connect's files) and names what stays on the remote"
        )
    };
    ssh_failure_then(origin, error, &what_to_do)
}

/// The desktop's side of a profile alone: the background connect, the profile (its device
/// token and certificate pin) and the files beside it. The network is not touched; what
/// `connect` put on the remote is named, to be removed there by hand.
async fn desktop_only(
    out: &Out,
    dir: &Path,
    name: &str,
    (origin, stored): (&SshOrigin, &Profile),
) -> Result<(), Failure> {
    let mut removed = Vec::new();
    if let Some(pid) = background::stop(dir, name).await? {
        removed.push(format!("stopped the background connect (pid {pid})"));
    }
    removed.extend(remove_local(dir, name));
    let left = left_on_remote(origin, &stored.device_id);
    report(out, name, &removed, Some((&origin.target, &left)));
    Ok(())
}

/// What `connect` put on the remote and an uninstall that did not reach it leaves there
/// (uninstall_script's list, as far as the desktop knows it).
fn left_on_remote(origin: &SshOrigin, device_id: &str) -> Vec<String> {
    let root = &origin.remote_dir;
    vec![
        format!(
            "{root}: the install root (pi-host, its sessions and data, the agent; connect's lines in config.toml)"
        ),
        "~/.config/systemd/user/pi-host-*.service: the user unit, if pi-host ran as one".into(),
        "~/.local/bin/pi-host: the link to it".into(),
        format!(
            "device {device_id}: still paired with that host (`pi-host revoke {device_id}` there)"
        ),
        format!(
            "to remove them there: `sh {root}/install.sh stop --root {root}`, then delete what is listed"
        ),
    ]
}

/// The profile and what pi-remote kept beside it.
fn remove_local(dir: &Path, name: &str) -> Vec<String> {
    let mut removed = Vec::new();
    let mut files = vec![
        remotes::log_file(dir, name),
        remotes::lock_file(dir, name),
        dir.join("seen").join(name),
    ];
    if let Ok(path) = profile::path(dir, name) {
        files.insert(0, path);
    }
    for file in files {
        if std::fs::remove_file(&file).is_ok() {
            removed.push(format!("removed {}", file.display()));
        }
    }
    if remotes::chosen_default(dir).as_deref() == Some(name)
        && std::fs::remove_file(remotes::default_file(dir)).is_ok()
    {
        removed.push(format!(
            "removed {} (no default profile now: `pi-remote use PROFILE`)",
            remotes::default_file(dir).display()
        ));
    }
    removed
}

/// What was removed, and (`left`: the remote's target and lines) what stays on a remote that
/// was not reached.
fn report(out: &Out, name: &str, removed: &[String], left: Option<(&str, &[String])>) {
    if out.json {
        let mut report = serde_json::json!({"profile": name, "removed": removed});
        if let Some((target, left)) = left {
            report["leftOnRemote"] = serde_json::json!({"target": target, "items": left});
        }
        out.json_value(&report);
        return;
    }
    for line in removed {
        out.line(line);
    }
    if let Some((target, left)) = left {
        out.line(&format!("left on {target} (not contacted):"));
        for line in left {
            out.line(&format!("  {line}"));
        }
    }
}
