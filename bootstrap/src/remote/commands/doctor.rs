//! `pi-remote doctor [PROFILE]`: a `connect` profile's remote checked step by step, one line a
//! check (`ok`, `warn` or `problem`, with what to do): SSH and its host key, the remote pi-host
//! and its version against this pi-remote's, the TLS pin against the host's certificate, clock
//! skew, free disk in the install root, the local forward, and the host's agent through it.
//! Exit 0 when every check is ok, [`crate::remote::Exit::Doctor`] otherwise.

use super::background;
use super::remote_admin::{ssh_profile, ssh_to};
use super::{call_resending, connect_profile};
use crate::provision::remote_shell::root_word;
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::profile::{self, Profile, SshOrigin};
use crate::remote::remotes;
use crate::ssh::{SshError, SshSession};
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Clock skew above this many seconds is a warning (pairing tokens and approvals carry
/// deadlines).
pub const MAX_SKEW_SECS: u64 = 60;
/// Less free space than this in the install root's filesystem is a warning.
pub const MIN_FREE_BYTES: u64 = 1 << 30;
/// How long the host has to answer through the forward.
const HOST_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Problem,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Problem => "problem",
        }
    }
}

/// One check's line.
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    pub text: String,
}

fn check(name: &'static str, level: Level, text: impl Into<String>) -> Check {
    Check {
        name,
        level,
        text: text.into(),
    }
}

/// `pi-remote doctor [PROFILE]`: `Err` only when it cannot check at all; problems are the
/// returned flag (true: all ok).
pub async fn doctor(out: &Out, name: &str) -> Result<bool, Failure> {
    let (stored, origin) = ssh_profile(name)?;
    let mut checks = Vec::new();
    match ssh_to(&origin).await {
        Ok(session) => {
            checks.push(check(
                "ssh",
                Level::Ok,
                format!("{} reachable, authenticated", origin.target),
            ));
            checks.push(check("host key", Level::Ok, "known and matching"));
            checks.extend(remote_checks(&session, &origin, &stored).await);
            session.disconnect().await;
        }
        Err(error) => checks.extend(ssh_checks(name, &origin, &error)),
    }
    checks.extend(forward_checks(name, &stored).await);
    print(out, name, &checks);
    Ok(checks.iter().all(|c| c.level == Level::Ok))
}

/// The SSH and host-key lines when SSH failed.
fn ssh_checks(name: &str, origin: &SshOrigin, error: &SshError) -> Vec<Check> {
    let target = &origin.target;
    let said = error.to_string();
    let said = printable(&said, false);
    match error {
        SshError::HostKeyChanged(_) | SshError::HostKeyRevoked { .. } => vec![
            check("ssh", Level::Ok, format!("{target} reachable")),
            check(
                "host key",
                Level::Problem,
                format!(
                    "{said}; if the remote was reinstalled, remove its old key (ssh-keygen -R HOST) and connect again"
                ),
            ),
        ],
        SshError::HostKeyUnknown { .. } | SshError::KnownHosts { .. } => vec![
            check("ssh", Level::Ok, format!("{target} reachable")),
            check(
                "host key",
                Level::Problem,
                format!("{said}; `pi-remote --profile {name} connect {target}` asks to trust it"),
            ),
        ],
        SshError::AuthFailed { .. } | SshError::KeyFile { .. } => vec![
            check(
                "ssh",
                Level::Problem,
                format!("{said}; load the key into ssh-agent or give it with -i to connect"),
            ),
            check("host key", Level::Ok, "known and matching"),
        ],
        _ => vec![
            check(
                "ssh",
                Level::Problem,
                format!("{said}; is {target} up, and does `ssh {target}` work?"),
            ),
            check("host key", Level::Warn, "not checked (no SSH connection)"),
        ],
    }
}

/// The remote's facts in one command: `KEY=VALUE` lines.
fn facts_script(remote_dir: &str) -> String {
    let root = root_word(remote_dir);
    format!(
        r#"R={root}
echo "date=$(date +%s)"
if [ -f "$R/install.sh" ]; then echo "status=$(sh "$R/install.sh" status --root "$R" 2>/dev/null)"; else echo "status=absent"; fi
echo "cert=$(tr -d '\n ' <"$R/state.json" 2>/dev/null | sed -n 's/.*"certSha256":"\([0-9a-fA-F]*\)".*/\1/p')"
echo "free=$(df -Pk "$R" 2>/dev/null | awk 'NR==2 {{print $4}}')"
"#
    )
}

fn parse_facts(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

async fn remote_checks(session: &SshSession, origin: &SshOrigin, stored: &Profile) -> Vec<Check> {
    let asked = remotes::now_secs();
    let facts = match session.exec(&facts_script(&origin.remote_dir)).await {
        Ok(output) => parse_facts(&output.stdout_text()),
        Err(error) => {
            return vec![check(
                "pi-host",
                Level::Problem,
                format!("cannot run a command over SSH: {error}"),
            )];
        }
    };
    let answered = remotes::now_secs();
    let mut checks = vec![host_check(origin, facts.get("status"))];
    checks.push(pin_check(stored, facts.get("cert")));
    checks.push(skew_check(asked, answered, facts.get("date")));
    checks.push(disk_check(&origin.remote_dir, facts.get("free")));
    checks
}

fn host_check(origin: &SshOrigin, status: Option<&String>) -> Check {
    let mine = env!("CARGO_PKG_VERSION");
    let again = format!("`pi-remote connect {}` starts it", origin.target);
    let Some(status) = status.filter(|s| s.starts_with("running")) else {
        return match status.map(String::as_str) {
            Some("absent") => check(
                "pi-host",
                Level::Problem,
                format!("not installed under {}; {again}", origin.remote_dir),
            ),
            _ => check("pi-host", Level::Problem, format!("not running; {again}")),
        };
    };
    let version = status
        .split_whitespace()
        .find_map(|w| w.strip_prefix("version="))
        .unwrap_or("?");
    if version == mine {
        check("pi-host", Level::Ok, format!("running, version {version}"))
    } else {
        check(
            "pi-host",
            Level::Warn,
            format!(
                "running version {version}, this pi-remote is {mine}; `pi-remote connect {} --release-dir DIR` upgrades it",
                origin.target
            ),
        )
    }
}

fn pin_check(stored: &Profile, cert: Option<&String>) -> Check {
    let cert = cert.filter(|c| !c.is_empty());
    match (cert, &stored.cert_sha256) {
        (None, _) => check(
            "tls pin",
            Level::Warn,
            "not checked: the host wrote no certificate (is it running?)",
        ),
        (Some(_), None) => check(
            "tls pin",
            Level::Problem,
            "the profile pins no certificate: connect again",
        ),
        (Some(cert), Some(pin)) if cert.eq_ignore_ascii_case(&pin.to_hex()) => {
            check("tls pin", Level::Ok, "matches the host's certificate")
        }
        (Some(_), Some(_)) => check(
            "tls pin",
            Level::Problem,
            "the host's certificate is not the one the profile pins (the host's identity was reset?); `pi-remote connect` checks it over SSH and pairs again",
        ),
    }
}

/// The remote clock against ours; the command ran between `asked` and `answered`.
fn skew_check(asked: u64, answered: u64, date: Option<&String>) -> Check {
    let Some(remote) = date.and_then(|d| d.parse::<u64>().ok()) else {
        return check("clock", Level::Warn, "the remote's `date +%s` gave no time");
    };
    let skew = if remote < asked {
        asked - remote
    } else {
        remote.saturating_sub(answered)
    };
    skew_level(skew)
}

/// Exactly [`MAX_SKEW_SECS`] is still fine.
pub fn skew_level(skew: u64) -> Check {
    if skew <= MAX_SKEW_SECS {
        check("clock", Level::Ok, format!("skew {skew} s"))
    } else {
        check(
            "clock",
            Level::Warn,
            format!(
                "the remote's clock is {skew} s off; deadlines (pairing, approvals) will be off too: enable NTP on the remote (timedatectl set-ntp true)"
            ),
        )
    }
}

fn disk_check(remote_dir: &str, free: Option<&String>) -> Check {
    let Some(kib) = free.and_then(|f| f.parse::<u64>().ok()) else {
        return check(
            "disk",
            Level::Warn,
            format!("cannot tell the free space under {remote_dir}"),
        );
    };
    disk_level(remote_dir, kib.saturating_mul(1024))
}

/// Exactly [`MIN_FREE_BYTES`] free is still fine.
pub fn disk_level(remote_dir: &str, free: u64) -> Check {
    let mib = free >> 20;
    if free >= MIN_FREE_BYTES {
        check(
            "disk",
            Level::Ok,
            format!("{mib} MiB free under {remote_dir}"),
        )
    } else {
        check(
            "disk",
            Level::Warn,
            format!(
                "only {mib} MiB free under {remote_dir}: sessions and logs need room; free some space on the remote"
            ),
        )
    }
}

/// The local forward (a connect holding it, its port accepting) and, through it, the host
/// (pinned TLS, the device credential) and its agent.
async fn forward_checks(name: &str, stored: &Profile) -> Vec<Check> {
    let dir = profile::config_dir().ok();
    let holder = dir.as_ref().and_then(|d| background::running(d, name));
    let origin = stored.ssh.as_ref().map_or("", |o| o.target.as_str());
    let accepts = match port_of(&stored.url) {
        Some(port) => tokio::time::timeout(
            HOST_DEADLINE,
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .is_ok_and(|c| c.is_ok()),
        None => false,
    };
    let forward = match (holder, accepts) {
        (Some(pid), true) => check(
            "forward",
            Level::Ok,
            format!("connect (pid {pid}) holds {}", stored.url),
        ),
        (Some(pid), false) => check(
            "forward",
            Level::Problem,
            format!(
                "connect (pid {pid}) runs but nothing accepts at {}; `pi-remote logs {name} --local` shows why",
                stored.url
            ),
        ),
        (None, _) => check(
            "forward",
            Level::Problem,
            format!(
                "down: no connect of {name:?} runs; `pi-remote --profile {name} connect {origin} --background` keeps it up"
            ),
        ),
    };
    if !accepts {
        return vec![
            forward,
            check("agent", Level::Warn, "not checked: no forward"),
        ];
    }
    vec![forward, agent_check(name, stored).await]
}

/// The agent's line: what the host answers through the forward about its agent.
async fn agent_check(name: &str, stored: &Profile) -> Check {
    let reached = tokio::time::timeout(HOST_DEADLINE, async {
        let client = connect_profile(name, stored, &stored.url).await?;
        Ok::<_, Failure>(call_resending::<calls::HostInfo>(&client, Empty {}).await?)
    })
    .await;
    match reached {
        Ok(Ok(info)) => match (info.agent.version, info.agent.problem) {
            (_, Some(problem)) => check("agent", Level::Problem, printable(&problem, false)),
            (Some(version), None) => check("agent", Level::Ok, version),
            (None, None) => check("agent", Level::Ok, "ready (it reports no version)"),
        },
        Ok(Err(failure)) => check(
            "agent",
            Level::Problem,
            format!("the host did not answer: {}", failure.describe()),
        ),
        Err(_) => check(
            "agent",
            Level::Problem,
            "the host did not answer within 5 s",
        ),
    }
}

/// The port of a `connect` profile's `wss://127.0.0.1:PORT/racp`.
fn port_of(url: &str) -> Option<u16> {
    url.strip_prefix("wss://127.0.0.1:")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

fn print(out: &Out, name: &str, checks: &[Check]) {
    if out.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"check": c.name, "level": c.level.as_str(), "text": c.text}))
            .collect();
        out.json_value(&json!({
            "profile": name,
            "ok": checks.iter().all(|c| c.level == Level::Ok),
            "checks": list,
        }));
        return;
    }
    for c in checks {
        out.line(&format!("{:<8} {:<9} {}", c.level.as_str(), c.name, c.text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_and_disk_at_their_bounds() {
        assert_eq!(skew_level(MAX_SKEW_SECS).level, Level::Ok);
        assert_eq!(skew_level(MAX_SKEW_SECS + 1).level, Level::Warn);
        assert_eq!(disk_level("r", MIN_FREE_BYTES).level, Level::Ok);
        assert_eq!(disk_level("r", MIN_FREE_BYTES - 1).level, Level::Warn);
        // Either side of the call's window counts.
        assert_eq!(skew_check(100, 101, Some(&"40".into())).level, Level::Ok);
        assert_eq!(skew_check(100, 101, Some(&"39".into())).level, Level::Warn);
        assert_eq!(skew_check(100, 101, Some(&"161".into())).level, Level::Ok);
        assert_eq!(skew_check(100, 101, Some(&"162".into())).level, Level::Warn);
    }

    #[test]
    fn facts_are_read_from_key_value_lines() {
        let facts = parse_facts("date=5\nstatus=running pid=1 version=0.1.0 listen=x\nfree=\n");
        assert_eq!(facts["date"], "5");
        assert!(facts["status"].starts_with("running"));
        assert_eq!(facts["free"], "");
    }
}
