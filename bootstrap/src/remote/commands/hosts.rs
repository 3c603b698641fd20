//! `pi-remote hosts [--use HOST_ID]`: the hosts behind a gateway this device may reach
//! (`host/list` at the gateway's own endpoint), and the profile's default host.

use super::{Reach, call_resending, connect_profile, endpoint, load_profile};
use crate::remote::Failure;
use crate::remote::out::{Out, aligned, enum_name, now_ms};
use crate::remote::profile;
use racp_proto::human::moment;
use racp_proto::methods::host::HostEntry;
use racp_proto::{Empty, calls};
use serde_json::json;

/// Lists the hosts; with `use_host`, makes that one (which must be listed) the profile's default.
pub async fn hosts(out: &Out, profile_name: &str, use_host: Option<String>) -> Result<(), Failure> {
    let mut stored = load_profile(profile_name)?;
    let url = endpoint(profile_name, &stored, None, Reach::Gateway)?;
    let client = connect_profile(profile_name, &stored, &url).await?;
    let listed = call_resending::<calls::HostList>(&client, Empty {}).await?;
    if let Some(chosen) = use_host {
        if !listed.hosts.iter().any(|entry| entry.host.id == chosen) {
            let known: Vec<&str> = listed.hosts.iter().map(|e| e.host.id.as_str()).collect();
            return Err(Failure::local(format!(
                "this device may reach no host {chosen:?} through the gateway; it may reach: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        // A profile paired before gateways were recognised learns it here.
        stored.gateway = true;
        stored.host = Some(chosen);
        let dir = profile::config_dir().map_err(Failure::Local)?;
        profile::save(&dir, profile_name, &stored).map_err(Failure::Local)?;
    }
    let default = stored.host.as_deref();
    if out.json {
        out.json_value(&json!({"hosts": listed.hosts, "defaultHost": default}));
        return Ok(());
    }
    if listed.hosts.is_empty() {
        out.note("this device may reach no host through the gateway");
    } else {
        for line in table(&listed.hosts, default, now_ms()) {
            out.line(&line);
        }
    }
    if let Some(host) = default {
        out.note(&format!(
            "commands without --host go to {host} (pi-remote hosts --use HOST_ID changes it)"
        ));
    } else {
        out.note(
            "choose one with --host HOST_ID, or make it the default: pi-remote hosts --use HOST_ID",
        );
    }
    Ok(())
}

/// One header line, then one line per host; the default is marked with `*`.
fn table(hosts: &[HostEntry], default: Option<&str>, now: u64) -> Vec<String> {
    let rows: Vec<[String; 6]> = hosts
        .iter()
        .map(|entry| {
            let mark = if default == Some(entry.host.id.as_str()) {
                "*"
            } else {
                " "
            };
            [
                format!("{mark} {}", entry.host.id),
                entry.hostname.clone(),
                entry.host.version.clone(),
                enum_name(&entry.status),
                entry
                    .last_seen_at
                    .map_or_else(|| "never".to_string(), |at| moment(at, now)),
                entry.sessions.to_string(),
            ]
        })
        .collect();
    let header = [
        "  HOST",
        "HOSTNAME",
        "VERSION",
        "STATUS",
        "LAST HEARD",
        "SESSIONS",
    ];
    aligned(header, &rows)
}

#[cfg(test)]
mod tests {
    use super::table;
    use racp_proto::methods::handshake::HostIdentity;
    use racp_proto::methods::host::{HostEntry, HostStatus};

    fn entry(id: &str, status: HostStatus, last_seen_at: Option<u64>) -> HostEntry {
        HostEntry {
            host: HostIdentity {
                version: "0.1.0".into(),
                id: id.into(),
            },
            hostname: format!("{id}.lan"),
            status,
            last_seen_at,
            sessions: 2,
            path: format!("/racp/hosts/{id}"),
        }
    }

    #[test]
    fn hosts_read_as_a_table_with_times_for_people() {
        // 2026-12-02 16:30:00 UTC.
        let now = 1_796_229_000_000;
        let hosts = [
            entry("host_a", HostStatus::Online, Some(now - 1_000)),
            entry("host_bb", HostStatus::Offline, None),
        ];
        let lines = table(&hosts, Some("host_bb"), now);
        assert_eq!(
            lines,
            [
                "  HOST     HOSTNAME     VERSION  STATUS   LAST HEARD           SESSIONS",
                "  host_a   host_a.lan   0.1.0    online   1 s ago (16:29 UTC)  2",
                "* host_bb  host_bb.lan  0.1.0    offline  never                2",
            ]
        );
    }
}
