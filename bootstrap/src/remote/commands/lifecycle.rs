//! `pi-remote use PROFILE` (the default profile) and `pi-remote remotes` (every profile with
//! its state): see [`crate::remote::remotes`] for the files behind them.

use super::background;
use super::{Reach, call_resending, connect_profile, endpoint};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::profile::{self, Profile};
use crate::remote::remotes;
use racp_proto::methods::host::HostInfoResult;
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// How long `remotes` waits for each host's answer.
pub const REACH_DEADLINE: Duration = Duration::from_secs(3);

/// `pi-remote use PROFILE`.
pub fn use_profile(out: &Out, name: &str) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let file = remotes::choose_default(&dir, name).map_err(Failure::Local)?;
    if out.json {
        out.json_value(&json!({"default": name, "file": file}));
    } else {
        out.line(&format!(
            "{name} is now the default profile: commands without --profile use it"
        ));
    }
    Ok(())
}

/// One profile as `remotes` shows it.
struct Row {
    name: String,
    default: bool,
    remote: String,
    /// The pid of the connect holding the forward (SSH profiles only).
    forward: Option<Option<u32>>,
    info: Result<HostInfoResult, String>,
    last_seen: Option<u64>,
}

/// `pi-remote remotes`.
pub async fn remotes(out: &Out, default: &str) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let mut tasks = tokio::task::JoinSet::new();
    for (index, name) in remotes::profile_names(&dir).into_iter().enumerate() {
        let dir = dir.clone();
        let default = name == default;
        tasks.spawn(async move { (index, row(&dir, name, default).await) });
    }
    let mut rows: Vec<(usize, Row)> = tasks.join_all().await;
    rows.sort_by_key(|(index, _)| *index);
    let rows: Vec<Row> = rows.into_iter().map(|(_, row)| row).collect();
    if out.json {
        let list: Vec<Value> = rows.iter().map(row_json).collect();
        out.json_value(&json!({"default": default, "remotes": list}));
    } else if rows.is_empty() {
        out.line("no profiles yet: `pi-remote connect TARGET` or `pi-remote pair LINK` makes one");
    } else {
        print_table(out, &rows);
    }
    Ok(())
}

async fn row(dir: &Path, name: String, default: bool) -> Row {
    let stored = profile::load(dir, &name);
    let (remote, forward) = match &stored {
        Ok(p) => match &p.ssh {
            Some(origin) => (
                format!("ssh {}", origin.target),
                Some(background::running(dir, &name)),
            ),
            None => (p.url.clone(), None),
        },
        Err(_) => ("(unreadable profile)".into(), None),
    };
    let info = match stored {
        Ok(p) => reach(&name, &p).await,
        Err(e) => Err(e),
    };
    Row {
        last_seen: remotes::last_seen(dir, &name),
        name,
        default,
        remote,
        forward,
        info,
    }
}

/// `host/info` within [`REACH_DEADLINE`].
async fn reach(name: &str, stored: &Profile) -> Result<HostInfoResult, String> {
    let url = endpoint(name, stored, None, Reach::Host).unwrap_or_else(|_| stored.url.clone());
    let asked = async {
        let client = connect_profile(name, stored, &url)
            .await
            .map_err(|f| f.describe())?;
        call_resending::<calls::HostInfo>(&client, Empty {})
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(REACH_DEADLINE, asked).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {} s", REACH_DEADLINE.as_secs())),
    }
}

fn sandbox(info: &HostInfoResult) -> String {
    match &info.sandbox {
        Some(s) if s.kind == "none" => "none".into(),
        Some(s) => format!("{} {}", s.kind, s.mode),
        None => "-".into(),
    }
}

fn row_json(row: &Row) -> Value {
    let now = remotes::now_secs();
    json!({
        "profile": row.name,
        "default": row.default,
        "remote": row.remote,
        "forward": row.forward.map(|pid| json!({"running": pid.is_some(), "pid": pid})),
        "reachable": row.info.is_ok(),
        "problem": row.info.as_ref().err(),
        "hostVersion": row.info.as_ref().ok().map(|i| i.host.version.clone()),
        "agentVersion": row.info.as_ref().ok().and_then(|i| i.agent.version.clone()),
        "sandbox": row.info.as_ref().ok().and_then(|i| i.sandbox.clone()),
        "lastSeen": row.last_seen,
        "lastSeenAgo": row.last_seen.map(|t| racp_proto::human::ago(now.saturating_sub(t))),
    })
}

fn print_table(out: &Out, rows: &[Row]) {
    let now = remotes::now_secs();
    let mut table = vec![
        [
            "PROFILE",
            "REMOTE",
            "FORWARD",
            "HOST",
            "PI-HOST",
            "AGENT",
            "SANDBOX",
            "LAST SEEN",
        ]
        .map(str::to_string),
    ];
    for row in rows {
        let info = row.info.as_ref().ok();
        table.push([
            format!("{}{}", row.name, if row.default { " *" } else { "" }),
            row.remote.clone(),
            match row.forward {
                // A foreground connect takes the same lock.
                Some(Some(pid)) => format!("up (pid {pid})"),
                Some(None) => "down".into(),
                None => "-".into(),
            },
            if info.is_some() {
                "reachable"
            } else {
                "unreachable"
            }
            .into(),
            info.map_or("-".into(), |i| i.host.version.clone()),
            info.and_then(|i| i.agent.version.clone())
                .unwrap_or_else(|| "-".into()),
            info.map_or("-".into(), sandbox),
            row.last_seen.map_or("never".into(), |t| {
                racp_proto::human::ago(now.saturating_sub(t))
            }),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for cells in &table {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{:<width$}", printable(cell, false)))
            .collect();
        out.line(line.join("  ").trim_end());
    }
    out.note("* the default profile (`pi-remote use PROFILE` changes it)");
}
