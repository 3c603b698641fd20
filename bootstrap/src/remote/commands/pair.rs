//! `pi-remote pair`: trade a pairing link for a device credential and store it in a profile.

use super::{Security, open_client};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::pairing::{self, PairingHints, PairingTarget};
use crate::remote::profile::{self, Profile};
use racp_proto::calls;
use racp_proto::methods::handshake::PairParams;
use serde_json::json;

pub async fn pair(
    out: &Out,
    profile_name: &str,
    link: &str,
    hints: &PairingHints<'_>,
    name: Option<String>,
) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let link = if link == "-" {
        read_link_from_stdin()?
    } else {
        link.to_string()
    };
    let PairingTarget {
        url,
        token,
        cert_sha256,
    } = pairing::parse(&link, hints).map_err(Failure::Local)?;
    let plain = cert_sha256.is_none();
    // The pairing token is as replayable as a device token: it too goes only to the pinned
    // host. The client says `hello` itself before it reports the connection as up.
    let security = Security {
        pin: cert_sha256,
        plain,
    };
    let client = open_client(&url, &token, security).await?;
    let paired = client
        .call::<calls::Pair>(PairParams {
            device_name: device_name(name),
        })
        .await?;
    let stored = Profile {
        url,
        cert_sha256,
        plain,
        device_id: paired.device_id,
        device_token: paired.device_token,
        roles: paired.roles,
        ssh: None,
    };
    let file = profile::save(&dir, profile_name, &stored).map_err(Failure::Local)?;
    if out.json {
        out.json_value(&json!({
            "deviceId": stored.device_id,
            "roles": stored.roles,
            "profile": profile_name,
            "url": stored.url,
            "certSha256": stored.cert_sha256,
        }));
    } else {
        let roles: Vec<&str> = stored.roles.iter().map(|r| r.as_str()).collect();
        out.line(&format!(
            "paired as {} (roles: {}); profile {profile_name:?} saved to {}",
            stored.device_id,
            roles.join(","),
            file.display()
        ));
    }
    Ok(())
}

/// `pair -`: one line of stdin, which keeps the token out of the process list.
fn read_link_from_stdin() -> Result<String, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::local(format!("cannot read the pairing link from stdin: {e}")))?;
    Ok(line)
}

/// The name the host shows for this device: `name`, else `pi-remote@HOSTNAME`.
pub fn device_name(name: Option<String>) -> String {
    name.or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .map(|h| format!("pi-remote@{h}"))
    })
    .unwrap_or_else(|| "pi-remote".into())
}
