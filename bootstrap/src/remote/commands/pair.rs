//! `pi-remote pair`: trade a pairing link for a device credential and store it in a profile.

use super::{Security, open_client};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::pairing::{self, PairingHints, PairingTarget};
use crate::remote::profile::{self, Profile};
use racp_proto::methods::handshake::PairParams;
use racp_proto::{Empty, calls};
use serde_json::json;

pub async fn pair(
    out: &Out,
    profile_name: &str,
    link: &str,
    hints: &PairingHints<'_>,
    name: Option<String>,
    force: bool,
) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    // Before the pairing token is spent: a credential is never replaced by accident (an owner's
    // by an observer's, say, with no way back).
    if !force {
        refuse_to_replace(&dir, profile_name)?;
    }
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
    let device_name = device_name(name);
    let paired = client
        .call::<calls::Pair>(PairParams {
            device_name: device_name.clone(),
        })
        .await?;
    let gateway = answers_host_list(&url, &paired.device_token, security).await;
    let stored = Profile {
        url,
        cert_sha256,
        plain,
        device_id: paired.device_id,
        device_name: Some(device_name),
        device_token: paired.device_token,
        roles: paired.roles,
        ssh: None,
        gateway,
        host: None,
    };
    let file = profile::save(&dir, profile_name, &stored).map_err(Failure::Local)?;
    print_paired(out, profile_name, &stored, &file);
    Ok(())
}

/// What `pair` says once the profile is saved to `file`.
fn print_paired(out: &Out, profile_name: &str, stored: &Profile, file: &std::path::Path) {
    if out.json {
        out.json_value(&json!({
            "deviceId": stored.device_id,
            "roles": stored.roles,
            "profile": profile_name,
            "url": stored.url,
            "certSha256": stored.cert_sha256,
            "gateway": stored.gateway,
        }));
        return;
    }
    out.line(&format!(
        "paired as {} ({}); profile {profile_name:?} saved to {}",
        stored.device_id,
        profile::roles_text(&stored.roles),
        file.display()
    ));
    if stored.gateway {
        out.note(
            "this is a gateway: list its hosts with `pi-remote hosts`, then give --host HOST_ID \
             or choose a default with `pi-remote hosts --use HOST_ID`",
        );
    }
}

/// Whether the paired endpoint is a gateway: a gateway answers `host/list` on its own
/// endpoint, a single pi-host answers METHOD_NOT_FOUND (docs/protocol.md §15). Asked with the
/// new credential, as a pairing connection may call only `hello` and `pair`. When it cannot be
/// told (the link dropped), the profile is taken as a single host's; `hosts --use` corrects it.
async fn answers_host_list(url: &str, device_token: &str, security: Security) -> bool {
    let Ok(client) = open_client(url, device_token, security).await else {
        return false;
    };
    client.call::<calls::HostList>(Empty {}).await.is_ok()
}

/// Refuses when profile `name` exists, naming what it holds and how to go on. A profile without
/// a certificate fingerprint (an older pi-remote's) is replaced: it cannot be used, and pairing
/// again is its documented migration.
fn refuse_to_replace(dir: &std::path::Path, name: &str) -> Result<(), Failure> {
    let file = profile::path(dir, name).map_err(Failure::Local)?;
    if !file.exists() {
        return Ok(());
    }
    let holds = match profile::load(dir, name) {
        Ok(stored) if profile::unpinned_message(name, &stored).is_some() => return Ok(()),
        Ok(stored) => format!(
            "holds the credential of device {} ({}) on {}{}",
            stored.device_id,
            profile::roles_text(&stored.roles),
            stored.url,
            stored
                .ssh
                .as_ref()
                .map(|origin| format!(" (through SSH to {})", origin.target))
                .unwrap_or_default()
        ),
        Err(_) => format!("exists ({})", file.display()),
    };
    Err(Failure::local(format!(
        "the profile {name:?} already {holds}; pair into another profile with --profile NAME, or replace it with --force"
    )))
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
