//! `pi-remote`'s commands, one module per group; `src/bin/pi-remote.rs` parses the command line
//! and calls them. What they share: opening a client from a profile, resending safe calls.

mod approvals;
pub mod attach;
pub mod background;
pub mod connect;
pub mod devices;
pub mod doctor;
pub mod files;
pub mod history;
pub mod hosts;
pub mod lifecycle;
pub mod models;
pub mod pair;
pub mod remote_admin;
pub mod sessions;
pub mod shell;
pub mod status;
pub mod turns;

use crate::remote::profile::{self, Profile, SshOrigin};
use crate::remote::{Exit, Failure, exit_for};
use racp_proto::client::{ClientOptions, RacpClient};
use racp_proto::fingerprint::CertSha256;
use racp_proto::{AppError, ErrorCode, ErrorSource, RacpMethod};

/// How the endpoint proves it is the host: the pinned certificate, or nothing (`--plain`).
#[derive(Clone, Copy)]
pub(crate) struct Security {
    pub pin: Option<CertSha256>,
    pub plain: bool,
}

pub(crate) async fn open_client(
    url: &str,
    token: &str,
    security: Security,
) -> Result<RacpClient, AppError> {
    let mut options = ClientOptions::new(url, token);
    options.pinned_sha256 = security.pin;
    options.allow_plain_ws = security.plain;
    options.client_name = "pi-remote".into();
    options.client_version = env!("CARGO_PKG_VERSION").into();
    RacpClient::connect(options).await
}

/// What a command reaches through a gateway profile: the gateway itself (pairing, devices,
/// `host/list`) or one of its hosts (sessions, turns, approvals, models).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Gateway,
    Host,
}

/// A client for what the command reaches, using the profile's credential: the paired host, or
/// for a gateway profile the gateway or the host `host` names (else the profile's default).
pub async fn open_profile(
    profile_name: &str,
    host: Option<&str>,
    reach: Reach,
) -> Result<RacpClient, Failure> {
    let stored = load_profile(profile_name)?;
    let url = endpoint(profile_name, &stored, host, reach)?;
    connect_profile(profile_name, &stored, &url).await
}

/// The URL a command connects to. A gateway serves one host at `<url>/hosts/<hostId>`
/// (docs/protocol.md §15); a call that needs a host, without one, is a usage error naming the
/// way to choose one, and so is `--host` with a profile of a single host.
pub fn endpoint(
    profile_name: &str,
    stored: &Profile,
    host: Option<&str>,
    reach: Reach,
) -> Result<String, Failure> {
    if !stored.gateway {
        return match host {
            Some(_) => Err(Failure::Usage(format!(
                "--host chooses a host behind a gateway, and the profile {profile_name:?} is paired \
                 with a single host ({}); leave --host out",
                stored.url
            ))),
            None => Ok(stored.url.clone()),
        };
    }
    if reach == Reach::Gateway {
        return Ok(stored.url.clone());
    }
    let Some(host) = host.or(stored.host.as_deref()) else {
        return Err(Failure::Usage(format!(
            "the profile {profile_name:?} is paired with a gateway, and this command needs one of \
             its hosts: list them with `pi-remote hosts`, then give `--host HOST_ID` or choose a \
             default with `pi-remote hosts --use HOST_ID`"
        )));
    };
    if !racp_proto::gateway::valid_host_id(host) {
        return Err(Failure::Usage(format!(
            "{host:?} is not a host id (`pi-remote hosts` lists them, e.g. host_…)"
        )));
    }
    Ok(host_url(&stored.url, host))
}

/// A gateway's URL for one of its hosts.
pub fn host_url(gateway_url: &str, host_id: &str) -> String {
    format!("{}/hosts/{host_id}", gateway_url.trim_end_matches('/'))
}

/// Reads a stored profile.
pub fn load_profile(profile_name: &str) -> Result<Profile, Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    profile::load(&dir, profile_name).map_err(Failure::Local)
}

/// Connects to `url` (the profile's, or one of its gateway's hosts) with a loaded profile's
/// credential.
pub async fn connect_profile(
    profile_name: &str,
    stored: &Profile,
    url: &str,
) -> Result<RacpClient, Failure> {
    // Before any connection: a token is only sent to an endpoint that can prove it is the host.
    if let Some(message) = profile::unpinned_message(profile_name, stored) {
        return Err(Failure::PairAgain(message));
    }
    let security = Security {
        pin: stored.cert_sha256,
        plain: stored.plain,
    };
    let client = open_client(url, &stored.device_token, security)
        .await
        .map_err(|error| match &stored.ssh {
            Some(origin) => Failure::App(with_ssh_advice(error, profile_name, origin)),
            None => Failure::App(error),
        })?;
    // For `remotes`: when the profile last reached its host.
    crate::remote::remotes::touch_seen(profile_name);
    Ok(client)
}

/// A connection error of a profile made by `connect`, with the `connect` command that mends it.
fn with_ssh_advice(error: AppError, profile_name: &str, origin: &SshOrigin) -> AppError {
    let target = &origin.target;
    let (advice, keep_details) = if exit_for(error.code()) == Exit::Unreachable {
        // An SSH profile's URL is a local forward that lives only while `connect` runs.
        (
            format!(
                "this profile reaches {target} through an SSH forward: run `pi-remote --profile {profile_name} connect {target}` (it keeps the forward up)"
            ),
            false,
        )
    } else if error.code() == ErrorCode::HostIdentityMismatch {
        // Over SSH the host's identity can be checked again on a channel already trusted.
        (
            format!(
                "this profile reaches {target} through SSH: `pi-remote --profile {profile_name} connect {target}` checks the host's certificate over SSH and pairs again if it changed"
            ),
            true,
        )
    } else {
        return error;
    };
    let mut advised = AppError::new(error.code(), format!("{}; {advice}", error.message()))
        .with_source(ErrorSource::Client);
    if keep_details && let Some(details) = error.details() {
        advised = advised.with_details(details.clone());
    }
    advised
}

/// Calls a method that is safe to resend, resending it after a dropped link.
pub(crate) async fn call_resending<M: RacpMethod>(
    client: &RacpClient,
    params: M::Params,
) -> Result<M::Result, AppError>
where
    M::Params: Clone,
{
    let mut client = client.clone();
    let mut attempts = 0;
    loop {
        match client.call::<M>(params.clone()).await {
            Err(e) if e.code() == ErrorCode::HostDisconnected && attempts < 5 => {
                attempts += 1;
                client.wait_connected().await?;
            }
            other => return other,
        }
    }
}

/// A subscription's channel closed under us: the client is gone.
pub(crate) fn client_stopped() -> AppError {
    AppError::new(ErrorCode::HostDisconnected, "the client stopped")
        .with_source(ErrorSource::Client)
}

/// A refused remote path, with what the person likely meant: a path under this machine's home
/// (`~/x` unquoted, which the shell here expanded) is not the remote's, and a relative one is
/// nobody's. The host resolves `~/...` to its own user's home (docs/protocol.md §7.8, §7.9).
/// `flag` is how the path was given (`--workspace `, or nothing for an argument).
pub(crate) fn hint_remote_home(error: AppError, flag: &str, path: &str) -> AppError {
    hint_remote_home_of(error, flag, path, std::env::var("HOME").ok().as_deref())
}

fn hint_remote_home_of(
    error: AppError,
    flag: &str,
    path: &str,
    local_home: Option<&str>,
) -> AppError {
    let code = error.code();
    let under_local_home = local_home
        .filter(|h| h.len() > 1)
        .and_then(|home| path.strip_prefix(home.trim_end_matches('/')))
        .filter(|rest| rest.is_empty() || rest.starts_with('/'));
    let hint = match (code, under_local_home) {
        (ErrorCode::RemotePathForbidden | ErrorCode::RemotePathNotFound, Some(rest)) => format!(
            " ({path} is under this machine's home, which the shell here put in place of \
             `~`; for the remote user's home, quote it: {flag}'~{rest}')"
        ),
        (ErrorCode::InvalidParams, _) if !path.starts_with('/') => {
            " (a path on the remote: absolute, or '~/...' for the remote user's home)".into()
        }
        _ => return error,
    };
    let mut hinted = AppError::new(code, format!("{}{hint}", error.message()));
    if let Some(details) = error.details() {
        hinted = hinted.with_details(details.clone());
    }
    hinted.with_source(error.origin())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_path_under_this_machine_s_home_hints_at_quoting_tilde() {
        let refused = AppError::new(ErrorCode::RemotePathForbidden, "outside the roots");
        let hinted = hint_remote_home_of(
            refused.clone(),
            "--workspace ",
            "/home/me/src/x",
            Some("/home/me"),
        );
        assert!(
            hinted
                .message()
                .ends_with("quote it: --workspace '~/src/x')"),
            "{}",
            hinted.message()
        );
        // Only under this home, on a path boundary; other refusals pass unchanged.
        let other = hint_remote_home_of(refused.clone(), "", "/home/meg/x", Some("/home/me"));
        assert_eq!(other.message(), "outside the roots");
        // As an argument (cat), the quoted path alone.
        let cat = hint_remote_home_of(refused.clone(), "", "/home/me/notes.md", Some("/home/me"));
        assert!(
            cat.message().ends_with("quote it: '~/notes.md')"),
            "{}",
            cat.message()
        );
        let busy = AppError::new(ErrorCode::AgentBusy, "busy");
        assert_eq!(
            hint_remote_home_of(busy, "", "/home/me/x", Some("/home/me")).message(),
            "busy"
        );
        let relative = AppError::new(
            ErrorCode::InvalidParams,
            "params.workspace: must be an absolute path",
        );
        assert!(
            hint_remote_home_of(relative, "", "src/x", Some("/home/me"))
                .message()
                .ends_with("absolute, or '~/...' for the remote user's home)")
        );
    }
}
