//! What runs on the remote: the probe, and the install.sh commands, as shell text.
//!
//! The probe is one command so the warm path costs one round trip: it creates the install root
//! (private), and prints `key=value` lines: the root's absolute path, the platform (OS,
//! architecture, C library and its version), the installed version and, when a host runs, its
//! `pi-host status --json`. The C library comes from `getconf GNU_LIBC_VERSION` (glibc), else
//! `ldd --version` (musl prints its name and version there), else the presence of musl's
//! loader (deploy/README.md, "The glibc floor").

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

/// The line the probe part of [`session_script`] ends with.
pub const PROBE_END: &str = "probe-end";

/// The one command a connect runs (docs/architecture.md, "One `pi-remote connect`"): it probes
/// (`key=value` lines, then [`PROBE_END`]), then reads one line from stdin, the bootstrapper's
/// [`Plan`]: nothing (EOF: the warm path), or what to do: install the artifact that follows on
/// stdin (written and hashed in one pass, as it arrives), stop the running host, start,
/// mint a pairing token. Each step prints `stage=NAME` as it begins, so a failure names its
/// stage; results come as `verified=`, `installed=`, `state=` and `pair=` lines.
///
/// `installer` is install.sh's text: it travels inside the command (a quoted here-document),
/// written to disk only when installing, so the upload is the artifact alone.
pub fn session_script(
    remote_dir: &str,
    wanted: &str,
    installer: Option<&str>,
    staging_name: &str,
) -> String {
    // A delimiter the installer's text cannot contain.
    let mut delimiter = format!("PI_HOST_INSTALLER_{staging_name}");
    while installer.is_some_and(|text| text.contains(&delimiter)) {
        delimiter.push('_');
    }
    let write_installer = match installer {
        Some(text) => {
            let newline = if text.ends_with('\n') { "" } else { "\n" };
            format!(
                "write_installer() {{\ncat >\"$1\" <<'{delimiter}'\n{text}{newline}{delimiter}\n}}\n"
            )
        }
        None => "write_installer() { echo 'no installer was sent' >&2; return 1; }\n".into(),
    };
    format!(
        r#"umask 077
R={root}
mkdir -p "$R" && cd "$R" || exit 97
R=$(pwd -P)
echo "root=$R"
echo "os=$(uname -s)"
echo "arch=$(uname -m)"
if [ -L current ]; then echo "current=$(readlink current)"; fi
if [ -f install.sh ]; then echo "installer=yes"; fi
s=
if [ -x current/bin/pi-host ] && [ -S data/admin.sock ]; then
  s=$(current/bin/pi-host --data-dir data status --json 2>/dev/null) && echo "status=$s"
fi
# The C library matters only for an install: not looked at when the wanted version runs.
case $s in *'"version":"{wanted}"'*) ;; *)
  if v=$(getconf GNU_LIBC_VERSION 2>/dev/null) && [ -n "$v" ]; then echo "libc=$v"
  else echo "ldd=$(ldd --version 2>&1 | head -n 2 | tr '\n' ' ')"; fi
  for f in /lib/ld-musl-*.so.1; do [ -e "$f" ] && echo "musl=$f" && break; done ;;
esac
SHA=
if command -v sha256sum >/dev/null 2>&1; then SHA=sha256sum
elif command -v shasum >/dev/null 2>&1; then SHA='shasum -a 256'; fi
[ -z "$SHA" ] || echo "sha=$SHA"
echo {probe_end}
{write_installer}IFS= read -r plan || exit 0
set -f
set -- $plan
[ "${{1:-}}" = go ] || exit 0
STOP=$2 INSTALL=$3 START=$4 MINT=$5 V=$6 ART=$7 ASHA=$8 ISHA=$9
if [ "$INSTALL" = 1 ]; then
  D=$R/staging/{staging}
  find "$R/staging" -mindepth 1 -maxdepth 1 -mmin +60 -exec rm -rf {{}} + 2>/dev/null
  mkdir -p "$D" || exit 90
  trap 'rm -rf "$D"' EXIT
  echo stage=transfer
  got=$( (tee "$D/$ART" || echo tee-failed) | $SHA) || exit 91
  echo stage=verify
  echo "verified=$ART ${{got%% *}}"
  [ "${{got%% *}}" = "$ASHA" ] || {{ echo "$ART arrived with another SHA-256 than the manifest's" >&2; exit 92; }}
  write_installer "$D/install.sh" || exit 93
  got=$($SHA <"$D/install.sh") || exit 93
  echo "verified=install.sh ${{got%% *}}"
  [ "${{got%% *}}" = "$ISHA" ] || {{ echo "install.sh arrived with another SHA-256 than the manifest's" >&2; exit 92; }}
  echo stage=install
  out=$(sh "$D/install.sh" install --root "$R" --version "$V" --artifact "$D/$ART") || exit $?
  echo "installed=$(printf '%s\n' "$out" | tail -n 1)"
fi
if [ "$START" = 1 ]; then
  echo stage=start
  if [ "$STOP" = 1 ]; then sh "$R/install.sh" stop --root "$R" >/dev/null || exit $?; fi
  out=$(sh "$R/install.sh" start --reuse --root "$R") || exit $?
  echo "state=$(printf '%s\n' "$out" | tail -n 1)"
fi
if [ "$MINT" = 1 ]; then
  echo stage=pair
  out=$("$R/current/bin/pi-host" --data-dir "$R/data" pair --json --roles owner --ttl 2m) || exit $?
  echo "pair=$(printf '%s' "$out" | tr -d '\n')"
fi
"#,
        root = root_word(remote_dir),
        probe_end = PROBE_END,
        staging = staging_name,
        wanted = wanted,
    )
}

/// What the bootstrapper asks of [`session_script`] after the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Stop the running host first (another version, or a draining one).
    pub stop: bool,
    /// `(artifact file, its SHA-256, install.sh's SHA-256)`: install the artifact sent next.
    pub install: Option<(String, String, String)>,
    pub start: bool,
    /// Mint a pairing token after the start.
    pub mint: bool,
    pub version: String,
}

impl Plan {
    /// The line [`session_script`] reads. Every word is a plain name or hex (checked when the
    /// manifest was loaded), so it splits on spaces as written.
    pub fn line(&self) -> String {
        let flag = |b: bool| if b { "1" } else { "0" };
        let (artifact, sha, installer_sha) = match &self.install {
            Some((a, s, i)) => (a.as_str(), s.as_str(), i.as_str()),
            None => ("-", "-", "-"),
        };
        format!(
            "go {} {} {} {} {} {artifact} {} {}\n",
            flag(self.stop),
            flag(self.install.is_some()),
            flag(self.start),
            flag(self.mint),
            self.version,
            sha.to_ascii_lowercase(),
            installer_sha.to_ascii_lowercase(),
        )
    }
}

/// The remote's C library, as far as the probe could tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Libc {
    /// `glibc`, `musl`, or `unknown`.
    pub family: String,
    /// `2.36`, `1.2.4`; `None` when it could not be read.
    pub version: Option<String>,
}

impl Libc {
    fn unknown() -> Libc {
        Libc {
            family: "unknown".into(),
            version: None,
        }
    }

    /// From `getconf GNU_LIBC_VERSION`: `glibc 2.36`.
    fn from_getconf(text: &str) -> Option<Libc> {
        let mut words = text.split_whitespace();
        let family = words.next()?;
        let version = words.next().filter(|v| is_version(v))?;
        (family == "glibc").then(|| Libc {
            family: "glibc".into(),
            version: Some(version.to_string()),
        })
    }

    /// From the first two lines of `ldd --version`: glibc's `ldd (Debian GLIBC 2.36-9) 2.36`,
    /// musl's `musl libc (x86_64) Version 1.2.4`.
    fn from_ldd(text: &str) -> Option<Libc> {
        let lower = text.to_ascii_lowercase();
        let words: Vec<&str> = text.split_whitespace().collect();
        if lower.contains("musl") {
            let version = words
                .windows(2)
                .find(|w| w[0].eq_ignore_ascii_case("version"))
                .map(|w| w[1].to_string())
                .filter(|v| is_version(v));
            return Some(Libc {
                family: "musl".into(),
                version,
            });
        }
        if lower.contains("glibc") || lower.contains("gnu libc") {
            // The first line ends with the version; the second is the copyright.
            let first_line = words
                .iter()
                .position(|w| w.eq_ignore_ascii_case("copyright"))
                .unwrap_or(words.len());
            let version = words[..first_line]
                .iter()
                .rev()
                .find(|w| is_version(w))
                .map(|w| w.to_string());
            return Some(Libc {
                family: "glibc".into(),
                version,
            });
        }
        None
    }

    /// `glibc 2.36`, `musl`, `unknown`.
    pub fn describe(&self) -> String {
        match &self.version {
            Some(version) => format!("{} {version}", self.family),
            None => self.family.clone(),
        }
    }
}

/// `2.17`, `1.2.4`: digits and dots, starting and ending with a digit.
fn is_version(text: &str) -> bool {
    !text.is_empty()
        && text.starts_with(|c: char| c.is_ascii_digit())
        && text.ends_with(|c: char| c.is_ascii_digit())
        && text.contains('.')
        && text.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// Compares dotted versions numerically (`2.9` < `2.17`).
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    let (a, b) = (parts(a), parts(b));
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).copied().unwrap_or(0),
            b.get(i).copied().unwrap_or(0),
        );
        match x.cmp(&y) {
            std::cmp::Ordering::Equal => continue,
            other => return other,
        }
    }
    std::cmp::Ordering::Equal
}

/// What the probe found.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub root: String,
    pub os: String,
    pub arch: String,
    /// The C library (only looked at on Linux: other systems have one of their own).
    pub libc: Libc,
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
        let (mut getconf, mut ldd, mut musl_loader) = (None, None, false);
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
                "libc" => getconf = Libc::from_getconf(value),
                "ldd" => ldd = Libc::from_ldd(value),
                "musl" => musl_loader = true,
                _ => {}
            }
        }
        probe.libc = getconf.or(ldd).unwrap_or_else(|| {
            if musl_loader {
                Libc {
                    family: "musl".into(),
                    version: None,
                }
            } else {
                Libc::unknown()
            }
        });
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
    fn the_c_library_is_read_from_getconf_ldd_or_the_musl_loader() {
        let base = "root=/r\nos=Linux\narch=x86_64\n";
        let libc = |extra: &str| Probe::parse(&format!("{base}{extra}")).unwrap().libc;
        assert_eq!(libc("libc=glibc 2.36\n").describe(), "glibc 2.36");
        assert_eq!(
            libc("ldd=ldd (Debian GLIBC 2.31-13+deb11u5) 2.31 Copyright (C) 2020 Free Software Foundation, Inc. \n").describe(),
            "glibc 2.31"
        );
        assert_eq!(
            libc("ldd=ldd (GNU libc) 2.17 Copyright (C) 2012 Free Software Foundation, Inc. \n")
                .describe(),
            "glibc 2.17"
        );
        assert_eq!(
            libc("ldd=musl libc (x86_64) Version 1.2.4 \nmusl=/lib/ld-musl-x86_64.so.1\n")
                .describe(),
            "musl 1.2.4"
        );
        assert_eq!(
            libc("ldd=sh: ldd: not found \nmusl=/lib/ld-musl-x86_64.so.1\n").describe(),
            "musl"
        );
        assert_eq!(libc("ldd=sh: ldd: not found \n").describe(), "unknown");
        assert_eq!(version_cmp("2.9", "2.17"), std::cmp::Ordering::Less);
        assert_eq!(version_cmp("2.17", "2.17.0"), std::cmp::Ordering::Equal);
        assert_eq!(version_cmp("2.36", "2.17"), std::cmp::Ordering::Greater);
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
