//! Profiles: one paired host per file, `<config dir>/profiles/<name>.json`.
//!
//! The config directory is `$PI_REMOTE_CONFIG_DIR` if set, else `$XDG_CONFIG_HOME/pi-remote`,
//! else `~/.config/pi-remote`. A profile holds a device token, so directories are created 0700
//! and a profile file is written to a fresh temporary file created with mode 0600 (never widened
//! and then narrowed) and renamed into place.

use racp_proto::Role;
use racp_proto::fingerprint::CertSha256;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The profile used when neither `--profile`, `PI_REMOTE_PROFILE` nor `pi-remote use` names
/// one (see [`crate::remote::remotes::resolve_profile`]).
pub const DEFAULT_PROFILE: &str = "default";

/// A stored device credential.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// The endpoint, e.g. `wss://127.0.0.1:7878/racp`.
    pub url: String,
    /// The SHA-256 of the host's TLS certificate, pinned at pairing: every connection checks
    /// it before sending the token (docs/protocol.md §2.4). A profile without it was stored by
    /// an older pi-remote and is refused until paired again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_sha256: Option<CertSha256>,
    /// Paired over a plain `racp://` link with `--plain` (a host run with `--plain`): the token
    /// goes over `ws://` unverified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain: bool,
    pub device_id: String,
    /// The name the device was paired under (what `devices` shows); absent in profiles stored
    /// by an older pi-remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// Secret bearer token.
    pub device_token: String,
    pub roles: Vec<Role>,
    /// Set by `pi-remote connect`: the host is reached through an SSH forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshOrigin>,
    /// The endpoint is a gateway's (it answered `host/list` at pairing): session, turn and
    /// approval calls go to one of its hosts, `<url>/hosts/<hostId>`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway: bool,
    /// A gateway profile's default host (`pi-remote hosts --use HOST_ID`), used without `--host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Where an SSH-provisioned host lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshOrigin {
    /// What was given to `connect` (`[user@]host[:port]` or an ssh config alias).
    pub target: String,
    pub remote_dir: String,
    pub host_id: String,
    /// The ssh config file `connect` was given (`-F`), for the commands that go over SSH again
    /// (`logs`, `uninstall`, `doctor`, `connect --background`). Absent: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_config: Option<PathBuf>,
    /// The known_hosts file `connect` was given (`--known-hosts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// The keys `connect` was given (`-i`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<PathBuf>,
}

// Hand-written so the token never reaches a log or a panic message.
impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profile")
            .field("url", &self.url)
            .field("cert_sha256", &self.cert_sha256)
            .field("plain", &self.plain)
            .field("device_id", &self.device_id)
            .field("device_name", &self.device_name)
            .field("device_token", &"<secret>")
            .field("roles", &self.roles)
            .field("ssh", &self.ssh)
            .field("gateway", &self.gateway)
            .field("host", &self.host)
            .finish()
    }
}

/// Roles for a person: `owner` or `operator, observer`.
pub fn role_names(roles: &[Role]) -> String {
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    names.join(", ")
}

/// Roles with their label: `role: owner` or `roles: operator, observer`.
pub fn roles_text(roles: &[Role]) -> String {
    let label = if roles.len() == 1 { "role" } else { "roles" };
    format!("{label}: {}", role_names(roles))
}

/// The config directory, from the environment.
pub fn config_dir() -> Result<PathBuf, String> {
    crate::dirs::user_dir(Some("PI_REMOTE_CONFIG_DIR"), "XDG_CONFIG_HOME", ".config")
        .ok_or_else(|| "cannot find a config directory: set PI_REMOTE_CONFIG_DIR or HOME".into())
}

/// Checks a profile name: 1–64 of `A-Z a-z 0-9 _ - .`, not starting with a dot.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid profile name {name:?}: use 1-64 letters, digits, '_', '-' or '.'"
        ))
    }
}

/// The file of profile `name` under `dir`.
pub fn path(dir: &Path, name: &str) -> Result<PathBuf, String> {
    check_name(name)?;
    Ok(dir.join("profiles").join(format!("{name}.json")))
}

/// Reads profile `name`.
pub fn load(dir: &Path, name: &str) -> Result<Profile, String> {
    let file = path(dir, name)?;
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "no profile {name:?} (looked for {}); pair first: pi-remote pair 'racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN'",
                file.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    serde_json::from_str(&text).map_err(|e| format!("{} is not a profile: {e}", file.display()))
}

/// Why a stored profile cannot be used as is: it has no certificate fingerprint to pin (an
/// older pi-remote stored it). Re-pairing is the migration; nothing is sent meanwhile.
pub fn unpinned_message(name: &str, profile: &Profile) -> Option<String> {
    if profile.cert_sha256.is_some() || profile.plain {
        return None;
    }
    let how = match &profile.ssh {
        Some(origin) => format!("pi-remote --profile {name} connect {}", origin.target),
        None => format!(
            "pi-remote --profile {name} pair 'racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN' (from `pi-host pair` on the host)"
        ),
    };
    Some(format!(
        "the profile {name:?} has no certificate fingerprint for its host (it was stored by an \
         older pi-remote), so nothing could prove that {} is the host; its token was not sent. \
         Pair again: {how}",
        profile.url
    ))
}

/// Writes profile `name` (replacing an older one) and returns its path.
pub fn save(dir: &Path, name: &str, profile: &Profile) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let file = path(dir, name)?;
    let profiles = dir.join("profiles");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&profiles)
        .map_err(|e| format!("cannot create {}: {e}", profiles.display()))?;
    let text = serde_json::to_string_pretty(profile)
        .map_err(|e| format!("cannot encode the profile: {e}"))?;
    let temp = profiles.join(format!(".{name}.json.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, &file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("cannot write {}: {e}", file.display()));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn profile() -> Profile {
        Profile {
            url: "wss://127.0.0.1:1/racp".into(),
            cert_sha256: CertSha256::parse(&"ab".repeat(32)),
            plain: false,
            device_id: "dev_1".into(),
            device_name: Some("laptop".into()),
            device_token: "pdt_secret".into(),
            roles: vec![Role::Owner],
            ssh: None,
            gateway: false,
            host: None,
        }
    }

    #[test]
    fn saves_private_files_and_reads_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cfg");
        let file = save(&config, "default", &profile()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&config.join("profiles")), 0o700);
        assert_eq!(load(&config, "default").unwrap(), profile());
        // Replacing keeps the mode.
        save(&config, "default", &profile()).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert!(load(&config, "other").unwrap_err().contains("pair first"));
    }

    #[test]
    fn names_cannot_escape_the_directory() {
        assert!(check_name("work-laptop_2").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_profile_from_an_older_version_loads_but_is_flagged_unpinned() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("old.json"),
            r#"{"url":"ws://127.0.0.1:1/racp","deviceId":"dev_1","deviceToken":"pdt_x","roles":["owner"]}"#,
        )
        .unwrap();
        let old = load(dir.path(), "old").unwrap();
        assert!(
            unpinned_message("old", &old)
                .unwrap()
                .contains("Pair again")
        );
        assert!(unpinned_message("default", &profile()).is_none());
        let text = serde_json::to_value(profile()).unwrap();
        assert_eq!(text["certSha256"], "ab".repeat(32));
        assert!(text.get("plain").is_none());
    }

    #[test]
    fn debug_hides_the_token() {
        assert!(!format!("{:?}", profile()).contains("pdt_secret"));
    }
}
