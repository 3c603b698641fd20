//! `pi-remote status`: what a profile holds (host URL, pinned certificate, device, roles) and
//! what the host says about itself (`host/info`). The profile's part is printed even when the
//! host cannot be reached; the command then fails as any other would (exit 3, 4, ...).

use super::{Reach, call_resending, connect_profile, endpoint, load_profile};
use crate::remote::Failure;
use crate::remote::out::Out;
use crate::remote::profile::{self, Profile};
use racp_proto::client::RacpClient;
use racp_proto::methods::host::HostInfoResult;
use racp_proto::validate::printable;
use racp_proto::{Empty, Role, calls};
use serde_json::{Value, json};

pub async fn status(out: &Out, profile_name: &str, host: Option<&str>) -> Result<(), Failure> {
    let mut stored = load_profile(profile_name)?;
    // A gateway profile reports on the host `--host` (or its default) names, if any.
    let url = match endpoint(profile_name, &stored, host, Reach::Host) {
        Ok(url) => Some(url),
        Err(Failure::Usage(_)) if stored.gateway && host.is_none() => None,
        Err(failure) => return Err(failure),
    };
    if let Some(chosen) = host {
        stored.host = Some(chosen.to_string());
    }
    let host = match &url {
        Some(url) => match connect_profile(profile_name, &stored, url).await {
            Ok(client) => host_facts(&client, &stored).await,
            Err(failure) => Err(failure),
        },
        None => Err(Failure::Usage(String::new())),
    };
    let (info, device_name) = match &host {
        Ok((info, name)) => (Some(info), name.clone().or(stored.device_name.clone())),
        Err(_) => (None, stored.device_name.clone()),
    };
    if out.json {
        out.json_value(&status_json(profile_name, &stored, device_name, info));
    } else {
        for (label, value) in status_lines(profile_name, &stored, device_name, info) {
            out.line(&format!("{label:<8} {}", printable(&value, false)));
        }
    }
    match (host, url) {
        (Ok(_), _) | (Err(_), None) => Ok(()),
        (Err(failure), Some(_)) => Err(failure),
    }
}

/// `host/info`, and for an owner the device's current name from `device/list`.
async fn host_facts(
    client: &RacpClient,
    stored: &Profile,
) -> Result<(HostInfoResult, Option<String>), Failure> {
    let info = call_resending::<calls::HostInfo>(client, Empty {}).await?;
    let name = if stored.roles.contains(&Role::Owner) {
        call_resending::<calls::DeviceList>(client, Empty {})
            .await?
            .devices
            .into_iter()
            .find(|d| d.current)
            .map(|d| d.name)
    } else {
        None
    };
    Ok((info, name))
}

fn status_json(
    profile_name: &str,
    stored: &Profile,
    device_name: Option<String>,
    info: Option<&HostInfoResult>,
) -> Value {
    json!({
        "profile": profile_name,
        "url": stored.url,
        "certSha256": stored.cert_sha256,
        "plain": stored.plain,
        "deviceId": stored.device_id,
        "deviceName": device_name,
        "roles": stored.roles,
        "ssh": stored.ssh,
        "gateway": stored.gateway,
        "hostId": stored.host,
        "host": info.map(|info| json!({
            "version": info.host.version,
            "id": info.host.id,
            "hostname": info.hostname,
            "os": info.os,
            "arch": info.arch,
            "startedAt": info.started_at,
            "sandbox": info.sandbox,
        })),
    })
}

fn status_lines(
    profile_name: &str,
    stored: &Profile,
    device_name: Option<String>,
    info: Option<&HostInfoResult>,
) -> Vec<(&'static str, String)> {
    let mut lines = vec![
        ("profile", profile_name.to_string()),
        ("url", stored.url.clone()),
    ];
    lines.push((
        "cert",
        match (&stored.cert_sha256, stored.plain) {
            (Some(pin), _) => format!("sha256:{}", pin.to_hex()),
            (None, true) => "none (plain ws://, --plain)".into(),
            (None, false) => "none: pair again".into(),
        },
    ));
    let name = device_name
        .map(|name| format!(" ({name})"))
        .unwrap_or_default();
    lines.push(("device", format!("{}{name}", stored.device_id)));
    lines.push(("roles", profile::role_names(&stored.roles)));
    if let Some(origin) = &stored.ssh {
        lines.push((
            "ssh",
            format!("{} (install root {})", origin.target, origin.remote_dir),
        ));
    }
    if stored.gateway {
        lines.push((
            "gateway",
            match &stored.host {
                Some(host) => format!("yes; host {host}"),
                None => "yes; no host chosen: `pi-remote hosts`, then --host HOST_ID or `pi-remote hosts --use HOST_ID`".into(),
            },
        ));
    }
    lines.push((
        "host",
        match info {
            Some(info) => format!(
                "pi-host {} on {} ({}/{}), id {}",
                info.host.version, info.hostname, info.os, info.arch, info.host.id
            ),
            None if stored.gateway && stored.host.is_none() => "none chosen".into(),
            // Why is the failure printed after these lines.
            None => "not reached".into(),
        },
    ));
    if let Some(sandbox) = info.and_then(|info| info.sandbox.as_ref()) {
        lines.push(("sandbox", sandbox_text(sandbox)));
    }
    lines
}

/// `landlock (ABI 7), workspace-write`, or `none: REASON`: where the host's agents run.
fn sandbox_text(sandbox: &racp_proto::methods::host::SandboxInfo) -> String {
    match (sandbox.abi, &sandbox.unavailable) {
        (Some(abi), _) => format!("{} (ABI {abi}), {}", sandbox.kind, sandbox.mode),
        (None, Some(reason)) => format!("none: {reason}"),
        (None, None) => "none".into(),
    }
}
