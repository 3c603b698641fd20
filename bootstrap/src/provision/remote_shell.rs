//! What runs on the remote: the probe, and the install.sh commands, as shell text.
//!
//! The probe is one command so the warm path costs one round trip: it creates the install root
//! (private), and prints `key=value` lines: the root's absolute path, the platform, the
//! installed version and, when a host runs, its `pi-host status --json`.

use serde_json::Value;

/// Quotes a string for a POSIX shell.
pub fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The install root as a shell word: `~/x` becomes `"$HOME"/'x'`, so it is expanded remotely.
pub fn root_word(remote_dir: &str) -> String {
    match remote_dir.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", sh_quote(rest)),
        None if remote_dir == "~" => "\"$HOME\"".into(),
        None => sh_quote(remote_dir),
    }
}

/// The default install root on the remote.
pub const DEFAULT_REMOTE_DIR: &str = "~/.pi-host";

pub fn probe_script(remote_dir: &str) -> String {
    format!(
        r#"umask 077
R={root}
mkdir -p "$R" && cd "$R" || exit 97
echo "root=$(pwd -P)"
echo "os=$(uname -s)"
echo "arch=$(uname -m)"
if [ -L current ]; then echo "current=$(readlink current)"; fi
if [ -f install.sh ]; then echo "installer=yes"; fi
if [ -x current/bin/pi-host ] && [ -S data/admin.sock ]; then
  s=$(current/bin/pi-host --data-dir data status --json 2>/dev/null) && echo "status=$s"
fi
if command -v sha256sum >/dev/null 2>&1; then echo "sha=sha256sum"
elif command -v shasum >/dev/null 2>&1; then echo "sha=shasum -a 256"; fi
"#,
        root = root_word(remote_dir)
    )
}

/// What the probe found.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub root: String,
    pub os: String,
    pub arch: String,
    /// The version `current` points at.
    pub installed: Option<String>,
    pub has_installer: bool,
    /// The running host's `status --json`.
    pub status: Option<Value>,
    /// The command that prints SHA-256 sums.
    pub sha_command: Option<String>,
}

/// The running host, when it answered `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub version: String,
    pub port: u16,
    pub draining: bool,
    /// Its certificate fingerprint (`certSha256` of `status --json`).
    pub cert_sha256: Option<racp_proto::fingerprint::CertSha256>,
}

impl Probe {
    pub fn parse(output: &str) -> Result<Probe, String> {
        let mut probe = Probe::default();
        for line in output.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            match key {
                "root" => probe.root = value.to_string(),
                "os" => probe.os = value.to_string(),
                "arch" => probe.arch = value.to_string(),
                "current" => {
                    probe.installed = value
                        .trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .map(str::to_string)
                        .filter(|v| !v.is_empty())
                }
                "installer" => probe.has_installer = value == "yes",
                "status" => probe.status = serde_json::from_str(value).ok(),
                "sha" => probe.sha_command = Some(value.to_string()),
                _ => {}
            }
        }
        if probe.root.is_empty() || probe.os.is_empty() || probe.arch.is_empty() {
            return Err(format!(
                "the probe printed no root, OS or architecture: {output:?}"
            ));
        }
        Ok(probe)
    }

    pub fn running(&self) -> Option<Running> {
        let status = self.status.as_ref()?;
        let version = status["host"]["version"].as_str()?.to_string();
        let listen: std::net::SocketAddr = status["listen"].as_str()?.parse().ok()?;
        Some(Running {
            version,
            port: listen.port(),
            draining: status["draining"] == true,
            cert_sha256: status["certSha256"]
                .as_str()
                .and_then(racp_proto::fingerprint::CertSha256::parse),
        })
    }

    pub fn root_word(&self) -> String {
        sh_quote(&self.root)
    }

    /// `R/current/bin/pi-host --data-dir R/data`.
    pub fn pi_host(&self) -> String {
        format!(
            "{} --data-dir {}",
            sh_quote(&format!("{}/current/bin/pi-host", self.root)),
            sh_quote(&format!("{}/data", self.root))
        )
    }

    /// Runs the installed install.sh (the one the last successful install left in the root).
    pub fn installer(&self, subcommand: &str) -> String {
        format!(
            "sh {} {subcommand} --root {}",
            sh_quote(&format!("{}/install.sh", self.root)),
            self.root_word()
        )
    }
}

/// Reads `sha256sum` output: `HEX  NAME` lines.
pub fn parse_sums(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let hash = parts.next()?.to_ascii_lowercase();
            let name = parts.next()?.trim_start_matches('*');
            let name = name.rsplit('/').next().unwrap_or(name).to_string();
            Some((hash, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_expands_only_home() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        assert_eq!(root_word("~/.pi-host"), r#""$HOME"/'.pi-host'"#);
        assert_eq!(root_word("/srv/x y"), "'/srv/x y'");
        assert_eq!(root_word("~/$(reboot)"), r#""$HOME"/'$(reboot)'"#);
    }

    #[test]
    fn the_probe_output_is_read_with_and_without_a_running_host() {
        let cold = "root=/home/u/.pi-host\nos=Linux\narch=x86_64\nsha=sha256sum\n";
        let probe = Probe::parse(cold).unwrap();
        assert_eq!(probe.installed, None);
        assert_eq!(probe.running(), None);
        assert_eq!(
            probe.pi_host(),
            "'/home/u/.pi-host/current/bin/pi-host' --data-dir '/home/u/.pi-host/data'"
        );

        let warm = format!(
            "{cold}current=versions/0.1.0\ninstaller=yes\nstatus={}\n",
            serde_json::json!({"host": {"version": "0.1.0", "id": "h"}, "listen": "127.0.0.1:41234", "draining": false, "certSha256": "ab".repeat(32)})
        );
        let probe = Probe::parse(&warm).unwrap();
        assert_eq!(probe.installed.as_deref(), Some("0.1.0"));
        assert!(probe.has_installer);
        assert_eq!(
            probe.running(),
            Some(Running {
                version: "0.1.0".into(),
                port: 41234,
                draining: false,
                cert_sha256: racp_proto::fingerprint::CertSha256::parse(&"ab".repeat(32)),
            })
        );
        assert!(Probe::parse("garbage").is_err());
    }

    #[test]
    fn sums_are_read_from_sha256sum_and_shasum_output() {
        let sums = parse_sums("ABCD  /r/staging/a.tar.gz.part\nef01 *install.sh.part\n");
        assert_eq!(
            sums,
            vec![
                ("abcd".to_string(), "a.tar.gz.part".to_string()),
                ("ef01".to_string(), "install.sh.part".to_string())
            ]
        );
    }
}
