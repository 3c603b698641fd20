//! `pi-remote devices` and `pi-remote revoke` (owner only).

use crate::remote::Failure;
use crate::remote::out::Out;
use racp_proto::client::RacpClient;
use racp_proto::methods::host::DeviceRevokeParams;
use racp_proto::validate::printable;
use racp_proto::{Empty, calls};
use serde_json::json;

/// Lists paired devices: `ID  NAME  ROLES[  (this device)]`.
pub async fn list(out: &Out, client: &RacpClient) -> Result<(), Failure> {
    let list = client.call::<calls::DeviceList>(Empty {}).await?;
    if out.json {
        out.json_value(&list);
    } else {
        for d in &list.devices {
            let roles: Vec<&str> = d.roles.iter().map(|r| r.as_str()).collect();
            let current = if d.current { "\t(this device)" } else { "" };
            out.line(&format!(
                "{}\t{}\t{}{current}",
                printable(&d.device_id, false),
                printable(&d.name, false),
                roles.join(",")
            ));
        }
    }
    Ok(())
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
