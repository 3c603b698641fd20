//! `pi-remote devices` and `pi-remote revoke` (owner only).

use crate::remote::Failure;
use crate::remote::out::{Out, aligned, now_ms};
use racp_proto::client::RacpClient;
use racp_proto::human::moment;
use racp_proto::methods::host::{DeviceInfo, DeviceRevokeParams};
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};
use serde_json::json;

/// Lists paired devices as aligned columns: name, id, roles, last seen and paired (as moments),
/// this device marked.
pub async fn list(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::DeviceList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
    } else {
        for line in device_table(&list.devices, now_ms()) {
            out.line(&line);
        }
    }
    Ok(())
}

fn device_table(devices: &[DeviceInfo], now: u64) -> Vec<String> {
    let rows: Vec<[String; 6]> = devices
        .iter()
        .map(|d| {
            let roles: Vec<&str> = d.roles.iter().map(|r| r.as_str()).collect();
            [
                printable(&d.name, false).into_owned(),
                printable(&d.device_id, false).into_owned(),
                roles.join(","),
                d.last_seen_at
                    .map_or_else(|| "never".into(), |at| moment(at, now)),
                moment(d.created_at, now),
                if d.current { "(this device)" } else { "" }.into(),
            ]
        })
        .collect();
    aligned(
        ["NAME", "DEVICE", "ROLES", "LAST SEEN", "PAIRED", ""],
        &rows,
    )
}

pub async fn revoke(out: &Out, client: &RacpClient, device: String) -> Result<(), Failure> {
    client
        .call::<calls::DeviceRevoke>(DeviceRevokeParams {
            device_id: device.clone(),
        })
        .await?;
    if out.json {
        out.json_value(&json!({"deviceId": device, "revoked": true}));
    } else {
        out.line(&format!("revoked {device}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use racp_proto::Role;

    #[test]
    fn devices_read_as_aligned_columns_with_moments() {
        let now = 1_796_169_600_000; // 2026-12-02 00:00 UTC
        let device = |name: &str, id: &str, seen: Option<u64>, current: bool| DeviceInfo {
            device_id: id.into(),
            name: name.into(),
            roles: vec![Role::Owner],
            created_at: now - 2 * 86_400_000,
            last_seen_at: seen,
            current,
        };
        let lines = device_table(
            &[
                device("desk", "dev_a1", Some(now - 60_000), true),
                device("phone", "dev_b2", None, false),
            ],
            now,
        );
        assert_eq!(
            lines,
            [
                "NAME   DEVICE  ROLES  LAST SEEN                         PAIRED",
                "desk   dev_a1  owner  1 min ago (2026-12-01 23:59 UTC)  2 days ago (2026-11-30 00:00 UTC)  (this device)",
                "phone  dev_b2  owner  never                             2 days ago (2026-11-30 00:00 UTC)",
            ]
        );
    }
}
