//! What runs on the remote: the probe, and the install.sh commands, as shell text.
//!
//! The probe is one command so the warm path costs one round trip: it creates the install root
//! (private), and prints `key=value` lines: the root's absolute path, the installed version,
//! whether install.sh is there, the link that puts pi-host on the user's PATH (`cli=`, made
//! where nothing is: deploy/README.md, "The host's own CLI") and, when a host runs, its
//! `pi-host status --json`. Only when
//! an install may follow (`current` is not the wanted version, or install.sh is missing) does
//! it also print the platform (OS, architecture, C library and its version) and the SHA-256
//! tool. The C library comes from `getconf GNU_LIBC_VERSION` (glibc), else `ldd --version`
//! (musl prints its name and version there), else the presence of musl's loader
//! (deploy/README.md, "The glibc floor"). With the platform come the agent's prerequisites: the
//! login shell's `node` (path and `--version`) and a `pi` on its `PATH` or in `~/.local/bin` or
//! `~/.npm-global/bin`; a running host's `status` carries its own agent check instead.

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

/// The shell text of [`session_script`], with comments saying why.
const SESSION_SH: &str = include_str!("session.sh");

/// The one command a connect runs (docs/architecture.md, "One `pi-remote connect`"): it probes
/// (`key=value` lines, then [`PROBE_END`]), then reads one line from stdin, the bootstrapper's
/// [`Plan`]: nothing (EOF: the warm path), or what to do: install the build (install.sh, then
/// the artifact, follow the plan line on stdin; the artifact is written and hashed in one
/// pass, as it arrives), stop the running host, start, mint a pairing token. Each step prints
/// `stage=NAME` as it begins, so a failure names its stage; results come as `verified=`,
/// `installed=`, `state=` and `pair=` lines.
///
/// The text is session.sh after five assignments; comments and indentation are left out, as
/// they would only add bytes to every connect.
pub fn session_script(
    remote_dir: &str,
    wanted: &str,
    staging_name: &str,
    agent_version: &str,
) -> String {
    let mut script = format!(
        "R={} W={} N={} A={} M={}\n",
        root_word(remote_dir),
        sh_quote(wanted),
        sh_quote(staging_name),
        sh_quote(agent_version),
        sh_quote(MARK),
    );
    for line in SESSION_SH.lines().map(str::trim_start) {
        if !line.is_empty() && !line.starts_with('#') {
            script.push_str(line);
            script.push('\n');
        }
    }
    script
}

/// The build a [`Plan`] installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// The artifact's file name and its SHA-256 (from the manifest).
    pub artifact: String,
    pub artifact_sha256: String,
    /// install.sh's SHA-256 (from the manifest) and its size: it comes first on stdin.
    pub installer_sha256: String,
    pub installer_len: u64,
    /// The build's size: the remote reads exactly that much when the agent bundle follows it.
    pub artifact_len: u64,
}

/// What the bootstrapper asks of [`session_script`] after the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Stop the running host first (another version, or a draining one).
    pub stop: bool,
    /// Install the build sent after the plan line.
    pub install: Option<Install>,
    pub start: bool,
    /// Mint a pairing token after the start.
    pub mint: bool,
    pub version: String,
    /// Install the agent (before the build is installed, so a failure changes nothing).
    pub agent: Option<AgentInstall>,
}

impl Plan {
    /// The line [`session_script`] reads. Every word is a plain name, hex or a number (checked
    /// when the manifest was loaded), so it splits on spaces as written.
    pub fn line(&self) -> String {
        let flag = |b: bool| if b { "1" } else { "0" };
        let (artifact, sha, installer_sha, installer_len, artifact_len) = match &self.install {
            Some(i) => (
                i.artifact.as_str(),
                i.artifact_sha256.to_ascii_lowercase(),
                i.installer_sha256.to_ascii_lowercase(),
                i.installer_len,
                i.artifact_len,
            ),
            None => ("-", "-".into(), "-".into(), 0, 0),
        };
        let (agent, agent_version, agent_line) = match &self.agent {
            Some(a) => (
                a.package.as_str(),
                a.version.as_str(),
                printf_word(&a.config_line),
            ),
            None => ("-", "-", "-".into()),
        };
        // The bundle goes last and is read to EOF: its size is not needed there.
        let (source, bundle_sha) = match self.agent.as_ref().map(|a| &a.source) {
            Some(AgentSource::Bundle { sha256, .. }) => ("bundle", sha256.to_ascii_lowercase()),
            Some(AgentSource::Npm) => ("npm", "-".into()),
            None => ("-", "-".into()),
        };
        format!(
            "go {} {} {} {} {} {artifact} {sha} {installer_sha} {installer_len} {agent} {agent_version} {agent_line} {source} {bundle_sha} {artifact_len}\n",
            flag(self.stop),
            flag(self.install.is_some()),
            flag(self.start),
            flag(self.mint),
            self.version,
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

/// What the probe printed about the C library, in order of trust: `getconf`, `ldd`, musl's
/// loader.
#[derive(Default)]
struct LibcClues {
    getconf: Option<Libc>,
    ldd: Option<Libc>,
    musl_loader: bool,
}

impl LibcClues {
    /// Takes a probe line about the C library; `false` for any other line.
    fn read(&mut self, key: &str, value: &str) -> bool {
        match key {
            "libc" => self.getconf = Libc::from_getconf(value),
            "ldd" => self.ldd = Libc::from_ldd(value),
            "musl" => self.musl_loader = true,
            _ => return false,
        }
        true
    }

    fn conclude(self) -> Libc {
        self.getconf.or(self.ldd).unwrap_or_else(|| {
            if self.musl_loader {
                Libc {
                    family: "musl".into(),
                    version: None,
                }
            } else {
                Libc::unknown()
            }
        })
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

/// A path of the install root the probe would not run anything from (session.sh's `unsafe=`
/// line): not the connecting user's, or writable by its group or others, as OpenSSH's
/// StrictModes refuses a `~/.ssh` others could write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsafe {
    /// `not_owned` or `writable_by_others`.
    pub problem: &'static str,
    pub path: String,
}

impl Unsafe {
    /// The refusal in the probe's output, if it printed one.
    pub fn find(output: &str) -> Option<Unsafe> {
        let line = output.lines().find_map(|l| l.strip_prefix("unsafe="))?;
        let (problem, path) = line.split_once(' ')?;
        let problem = match problem {
            "owner" => "not_owned",
            "writable" => "writable_by_others",
            _ => return None,
        };
        let path = match path.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        };
        Some(Unsafe {
            problem,
            path: path.to_string(),
        })
    }

    /// What is wrong, in words, with the fix.
    pub fn message(&self) -> String {
        let (what, fix) = match self.problem {
            "not_owned" => ("is not owned by the user you connect as", "chown"),
            _ => ("is writable by its group or by others", "chmod go-w"),
        };
        format!(
            "{} {what}, so another user could put a program there that would run as you; \
             nothing was run from it: fix it on the remote ({fix} it) or pick another --remote-dir",
            self.path
        )
    }
}

/// What the probe found.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub root: String,
    /// `uname -s` and `uname -m`; empty when the wanted version is installed (no install will
    /// need them, so the probe does not spend an exec on them).
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
    /// The login shell's Node (looked at with the platform only).
    pub node: Option<RemoteNode>,
    /// A pi on the login shell's `PATH` or in the user's install places (with the platform only).
    pub pi: Option<String>,
    /// The `agent` line of the remote's config.toml.
    pub agent_config: AgentConfig,
    /// The pi version wanted, when it is installed in pi-host's own directory.
    pub agent_installed: Option<String>,
    /// The npm beside the login shell's Node, or on its `PATH` (with the platform only).
    pub npm: Option<String>,
    /// The link on the user's PATH that runs this root's pi-host (`~/.local/bin/pi-host`).
    pub cli: Option<String>,
}

/// A Node on the remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    pub path: String,
    /// `20.20.2` (its `--version` without the `v`); None when it did not run.
    pub version: Option<String>,
}

/// The oldest Node pi runs on (its `engines.node`).
pub const MIN_NODE_VERSION: &str = "20.6.0";

impl RemoteNode {
    /// Whether pi can run on it.
    pub fn is_enough(&self) -> bool {
        self.version
            .as_deref()
            .is_some_and(|v| version_cmp(v, MIN_NODE_VERSION) != std::cmp::Ordering::Less)
    }
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
        let mut libc = LibcClues::default();
        for line in output.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if !libc.read(key, value) {
                probe.read(key, value);
            }
        }
        probe.libc = libc.conclude();
        if probe.root.is_empty() {
            return Err(format!("the probe printed no root: {output:?}"));
        }
        Ok(probe)
    }

    /// One `key=value` line of the probe (other than the C library's).
    fn read(&mut self, key: &str, value: &str) {
        match key {
            "root" => self.root = value.to_string(),
            "os" => self.os = value.to_string(),
            "arch" => self.arch = value.to_string(),
            "current" => {
                self.installed = value
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .map(str::to_string)
                    .filter(|v| !v.is_empty())
            }
            "installer" => self.has_installer = value == "yes",
            "status" => self.status = serde_json::from_str(value).ok(),
            "sha" => self.sha_command = Some(value.to_string()),
            "nodebin" => {
                self.node = Some(RemoteNode {
                    path: value.to_string(),
                    version: None,
                })
            }
            "node" => {
                let version = value.trim().trim_start_matches('v');
                if let Some(node) = self.node.as_mut()
                    && is_version(version)
                {
                    node.version = Some(version.to_string());
                }
            }
            "pi" => self.pi = Some(value.to_string()),
            "npmbin" => self.npm = Some(value.to_string()),
            "agentconf" => {
                self.agent_config = std::mem::take(&mut self.agent_config).with_line(value)
            }
            "agentv" => self.agent_installed = Some(value.to_string()),
            "cli" => self.cli = Some(value.to_string()),
            _ => {}
        }
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

    /// The running host's own agent check (`status`'s `agent`).
    pub fn host_agent(&self) -> Option<racp_proto::methods::host::AgentStatus> {
        let agent = self.status.as_ref()?.get("agent")?;
        serde_json::from_value(agent.clone()).ok()
    }

    /// What the probe says of the agent, for the probe stage's note: the running host's check,
    /// else the Node and pi found (`node 20.20.2, pi /usr/local/bin/pi`, `no node, no pi`).
    pub fn agent_note(&self) -> String {
        if let Some(agent) = self.host_agent() {
            let state = serde_json::to_value(agent.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            return match agent.version {
                Some(version) => format!("agent {state} {version}"),
                None => format!("agent {state}"),
            };
        }
        if self.os.is_empty() {
            return String::new();
        }
        let node = match &self.node {
            Some(RemoteNode {
                version: Some(version),
                ..
            }) => format!("node {version}"),
            Some(RemoteNode { path, .. }) => format!("node {path} (does not run)"),
            None => "no node".to_string(),
        };
        let pi = match &self.pi {
            Some(path) => format!("pi {path}"),
            None => "no pi".to_string(),
        };
        format!("{node}, {pi}")
    }

    pub fn root_word(&self) -> String {
        sh_quote(&self.root)
    }

    /// How a person on the remote runs its pi-host: the link on their PATH, else the full
    /// path (either finds the data directory by itself: deploy/README.md, "The host's own CLI").
    pub fn host_cli(&self) -> String {
        self.cli
            .clone()
            .unwrap_or_else(|| format!("{}/current/bin/pi-host", self.root))
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

/// Ends the `agent` line a connect writes into the remote's config.toml.
pub const MARK: &str = "# written by pi-remote connect";

/// What the remote's config.toml says of the agent (the probe's `agentconf=` lines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AgentConfig {
    /// No `agent` line: the host's default applies.
    #[default]
    None,
    /// The line a connect wrote.
    Ours(String),
    /// The operator's own `agent` line.
    Operator(String),
}

impl AgentConfig {
    /// Folds in one `agent = ...` line of the config.
    pub fn with_line(self, line: &str) -> AgentConfig {
        match self {
            AgentConfig::Operator(_) => self,
            _ if line.trim_end().ends_with(MARK) => AgentConfig::Ours(line.to_string()),
            _ => AgentConfig::Operator(line.to_string()),
        }
    }

    /// The config's `agent` line, whoever wrote it.
    pub fn line(&self) -> Option<&str> {
        match self {
            AgentConfig::None => None,
            AgentConfig::Ours(line) | AgentConfig::Operator(line) => Some(line),
        }
    }
}

/// An agent install, as the plan line carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInstall {
    pub package: String,
    pub version: String,
    /// The config.toml line naming it.
    pub config_line: String,
    /// Where it comes from: the remote's npm, or a bundle sent after install.sh.
    pub source: AgentSource,
}

/// How the remote gets pi (provision/agent.rs decides).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AgentSource {
    /// `npm install` on the remote (or the copy it has, when that runs).
    #[default]
    Npm,
    /// The bundle of [`super::bundle`], `len` bytes with SHA-256 `sha256`, on stdin after
    /// install.sh and before the build.
    Bundle { len: u64, sha256: String },
}

/// `text` as a printf(1) format that prints it: letters and digits as they are, every other
/// byte as a `\ooo` escape, so the whole is one shell word without quotes or `%`.
pub fn printf_word(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("\\{b:03o}")
            }
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

    /// The login shells a remote may have (bash, dash, busybox ash), as far as this machine
    /// has them (scripts/test installs dash and busybox).
    fn shells() -> Vec<Vec<&'static str>> {
        [
            vec!["sh"],
            vec!["bash"],
            vec!["dash"],
            vec!["busybox", "sh"],
        ]
        .into_iter()
        .filter(|shell| {
            std::process::Command::new(shell[0])
                .args(&shell[1..])
                .args(["-c", "true"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        ring::digest::digest(&ring::digest::SHA256, bytes)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Runs the session script under `shell` in `root`: the probe's lines, then (when given) the
    /// plan line and `input` written in `pieces`-byte writes with pauses, so the remote's reads
    /// come up short; then EOF. Returns the probe, the rest of stdout and the exit status.
    fn run_session(
        shell: &[&str],
        root: &std::path::Path,
        plan: Option<&Plan>,
        input: &[u8],
        pieces: usize,
    ) -> (String, String, Option<i32>) {
        // A home of nobody's: the probe links pi-host into `~/.local/bin`, never the tester's.
        let home = [("HOME", root.join("no-home").into_os_string())];
        run_session_in(shell, root, &home, plan, input, pieces)
    }

    /// [`run_session`] with `env` set (`HOME`, `PATH`).
    fn run_session_in(
        shell: &[&str],
        root: &std::path::Path,
        env: &[(&str, std::ffi::OsString)],
        plan: Option<&Plan>,
        input: &[u8],
        pieces: usize,
    ) -> (String, String, Option<i32>) {
        use std::io::{BufRead, Read, Write};
        let script = session_script(root.to_str().unwrap(), "9.9.9", "n1", "0.73.1");
        let mut command = std::process::Command::new(shell[0]);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = command
            .args(&shell[1..])
            .arg("-c")
            .arg(&script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut probe = String::new();
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "{shell:?}: {probe}"
            );
            if line.trim_end() == PROBE_END {
                break;
            }
            probe.push_str(&line);
        }
        if let Some(plan) = plan {
            stdin.write_all(plan.line().as_bytes()).unwrap();
            for (i, piece) in input.chunks(pieces).enumerate() {
                // A remote that has given up makes the rest fail to write: its status says why.
                if stdin.write_all(piece).and_then(|()| stdin.flush()).is_err() {
                    break;
                }
                if i < 8 {
                    std::thread::sleep(std::time::Duration::from_millis(15));
                }
            }
        }
        drop(stdin);
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        (probe, rest, child.wait().unwrap().code())
    }

    fn home_env(home: &std::path::Path) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![("HOME", home.into())]
    }

    /// A stand-in install.sh (`install --root R --version V --artifact PATH`): keeps the build
    /// it was given, so the split of stdin can be checked.
    const STAND_IN_INSTALLER: &[u8] =
        b"#!/bin/sh\ncp \"$7\" \"$3/received\" || exit 1\necho \"pi-host $5 installed\"\n";

    fn install_plan(artifact: &[u8], installer: &[u8], installer_sha256: String) -> Plan {
        Plan {
            install: Some(Install {
                artifact: "pi-host.tar.gz".into(),
                artifact_sha256: sha256_hex(artifact),
                installer_sha256,
                installer_len: installer.len() as u64,
                artifact_len: artifact.len() as u64,
            }),
            version: "9.9.9".into(),
            ..Plan::default()
        }
    }

    #[test]
    fn install_sh_and_the_build_are_split_on_stdin_at_install_sh_s_size() {
        let artifact: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut input = STAND_IN_INSTALLER.to_vec();
        input.extend_from_slice(&artifact);
        let plan = install_plan(
            &artifact,
            STAND_IN_INSTALLER,
            sha256_hex(STAND_IN_INSTALLER),
        );
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            // A path with a space, as in a home with spaces.
            let root = dir.path().join("pi host");
            let (probe, rest, status) = run_session(&shell, &root, Some(&plan), &input, 7);
            assert_eq!(status, Some(0), "{shell:?}: {probe}{rest}");
            let probe = Probe::parse(&probe).unwrap();
            assert_eq!(probe.root, root.to_str().unwrap());
            assert!(
                !probe.os.is_empty() && probe.sha_command.is_some(),
                "{probe:?}"
            );
            assert!(
                rest.contains(&format!(
                    "verified=pi-host.tar.gz {}\n",
                    sha256_hex(&artifact)
                )),
                "{shell:?}: {rest}"
            );
            let installer_sha = sha256_hex(STAND_IN_INSTALLER);
            assert!(rest.contains(&format!("verified=install.sh {installer_sha}\n")));
            assert!(rest.contains("stage=install\ninstalled=pi-host 9.9.9 installed\n"));
            assert!(std::fs::read(root.join("received")).unwrap() == artifact);
            // The staging directory goes with the command.
            assert!(!root.join("staging/n1").exists());
        }
    }

    #[test]
    fn an_install_sh_that_does_not_match_the_manifest_never_runs() {
        let artifact = b"the build".to_vec();
        let mut input = STAND_IN_INSTALLER.to_vec();
        input.extend_from_slice(&artifact);
        let plan = install_plan(&artifact, STAND_IN_INSTALLER, "00".repeat(32));
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let (_, rest, status) = run_session(&shell, dir.path(), Some(&plan), &input, 4096);
            assert_eq!(status, Some(92), "{shell:?}: {rest}");
            assert!(rest.contains("stage=verify\n") && !rest.contains("stage=install"));
            assert!(!dir.path().join("received").exists());
        }
    }

    #[test]
    fn the_cold_probe_reports_the_remote_s_node_and_a_pi_already_there() {
        let node = std::process::Command::new("node")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .trim_start_matches('v')
                    .to_string()
            });
        let pi_on_path = std::process::Command::new("sh")
            .args(["-c", "command -v pi"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let home = dir.path().join("home");
            let root = home.join(".pi-host");
            let (probe, _, status) = run_session_in(&shell, &root, &home_env(&home), None, &[], 1);
            assert_eq!(status, Some(0), "{shell:?}: {probe}");
            let parsed = Probe::parse(&probe).unwrap();
            assert_eq!(
                parsed.node.as_ref().and_then(|n| n.version.clone()),
                node,
                "{shell:?}: {probe}"
            );
            assert_eq!(parsed.pi, pi_on_path, "{shell:?}: {probe}");
            if pi_on_path.is_some() {
                continue; // it wins over the user's install places
            }
            let pi = home.join(".npm-global/bin/pi");
            std::fs::create_dir_all(pi.parent().unwrap()).unwrap();
            std::fs::write(&pi, "#!/usr/bin/env node\n").unwrap();
            std::fs::set_permissions(&pi, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            let (probe, _, _) = run_session_in(&shell, &root, &home_env(&home), None, &[], 1);
            let parsed = Probe::parse(&probe).unwrap();
            assert_eq!(parsed.pi.as_deref(), pi.to_str(), "{shell:?}: {probe}");
            assert!(
                parsed
                    .agent_note()
                    .ends_with(&format!(", pi {}", pi.display()))
            );
        }
    }

    #[test]
    fn the_probe_puts_pi_host_on_the_path_but_never_over_the_user_s_own() {
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let home = dir.path().join("home");
            let root = home.join(".pi-host");
            let bin = root.join("versions/9.9.9/bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("pi-host"), "#!/bin/sh\n").unwrap();
            std::os::unix::fs::symlink("versions/9.9.9", root.join("current")).unwrap();
            let installed = format!("{}/current/bin/pi-host", root.display());
            let link = home.join(".local/bin/pi-host");
            let probe_with = |path: Option<&std::ffi::OsStr>| {
                let mut env = home_env(&home);
                env.extend(path.map(|p| ("PATH", p.to_os_string())));
                let (probe, _, status) = run_session_in(&shell, &root, &env, None, &[], 1);
                assert_eq!(status, Some(0), "{shell:?}: {probe}");
                Probe::parse(&probe).unwrap()
            };
            // No ~/.local/bin and not on PATH: nothing made; the full path is the way.
            let parsed = probe_with(None);
            assert_eq!(parsed.cli, None, "{shell:?}");
            assert_eq!(parsed.host_cli(), installed);
            assert!(!home.join(".local").exists(), "{shell:?}");
            // On PATH though missing: made, linked, reported.
            let path = format!(
                "{}:{}",
                link.parent().unwrap().display(),
                std::env::var("PATH").unwrap()
            );
            let parsed = probe_with(Some(path.as_ref()));
            assert_eq!(parsed.cli.as_deref(), link.to_str(), "{shell:?}");
            assert_eq!(
                std::fs::read_link(&link).unwrap().to_str(),
                Some(installed.as_str())
            );
            // Warm, with the link there: reported again.
            assert_eq!(
                probe_with(None).host_cli(),
                link.to_str().unwrap(),
                "{shell:?}"
            );
            // A dangling link is replaced; the user's own pi-host is left alone.
            std::fs::remove_file(&link).unwrap();
            std::os::unix::fs::symlink("/nonexistent/pi-host", &link).unwrap();
            assert_eq!(probe_with(None).cli.as_deref(), link.to_str(), "{shell:?}");
            std::fs::remove_file(&link).unwrap();
            std::fs::write(&link, "#!/bin/sh\necho mine\n").unwrap();
            let parsed = probe_with(None);
            assert_eq!(parsed.cli, None, "{shell:?}");
            assert_eq!(parsed.host_cli(), installed);
            assert_eq!(
                std::fs::read_to_string(&link).unwrap(),
                "#!/bin/sh\necho mine\n"
            );
        }
    }

    #[test]
    fn the_agent_is_read_from_the_probe_or_the_running_host_s_check() {
        let base = "root=/r\nos=Linux\narch=x86_64\n";
        let probe = |extra: &str| Probe::parse(&format!("{base}{extra}")).unwrap();
        let none = probe("");
        assert_eq!((none.node.clone(), none.pi.clone()), (None, None));
        assert_eq!(none.agent_note(), "no node, no pi");
        let old = probe("nodebin=/usr/bin/node\nnode=v18.19.0\n");
        let node = old.node.clone().unwrap();
        assert_eq!(node.version.as_deref(), Some("18.19.0"));
        assert!(!node.is_enough());
        let good = probe("nodebin=/opt/n/bin/node\nnode=v20.6.0\npi=/home/u/.local/bin/pi\n");
        assert!(good.node.as_ref().unwrap().is_enough());
        assert_eq!(good.agent_note(), "node 20.6.0, pi /home/u/.local/bin/pi");
        let broken = probe("nodebin=/usr/bin/node\nnode=\n");
        assert_eq!(
            broken.agent_note(),
            "node /usr/bin/node (does not run), no pi"
        );
        let status = serde_json::json!({"host": {"version": "0.1.0", "id": "h"}, "listen": "127.0.0.1:1", "agent": {"state": "missing", "problem": "not found"}});
        let running = Probe::parse(&format!("root=/r\nstatus={status}\n")).unwrap();
        assert_eq!(
            running.host_agent().map(|a| a.state),
            Some(racp_proto::methods::host::AgentState::Missing)
        );
        assert_eq!(running.agent_note(), "agent missing");
        assert_eq!(Probe::parse("root=/r\n").unwrap().agent_note(), "");
    }

    /// A stand-in npm: `install ... --prefix P ... PKG@V` makes `P/bin/pi`, a pi that says it
    /// is V; a version with `missing` in it is not found, as npm says for one.
    const STAND_IN_NPM: &str = "#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in --prefix) p=$2; shift ;; *@*) spec=$1 ;; esac; shift; done\nv=${spec##*@}\ncase $v in *missing*) echo \"npm error 404 No match found for version $v\" >&2; exit 1 ;; esac\nmkdir -p \"$p/bin\" && printf '#!/bin/sh\\necho %s >&2\\n' \"$v\" >\"$p/bin/pi\" && chmod 755 \"$p/bin/pi\"\n";

    /// `commands` (name, script) in `dir/bin`, and a `PATH` with that directory first.
    fn stand_ins(
        dir: &std::path::Path,
        commands: &[(&str, &str)],
    ) -> (std::path::PathBuf, [(&'static str, std::ffi::OsString); 1]) {
        let bin = dir.join("bin");
        std::fs::create_dir(&bin).unwrap();
        for (name, text) in commands {
            std::fs::write(bin.join(name), text).unwrap();
            std::fs::set_permissions(
                bin.join(name),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
        }
        let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )))
        .unwrap();
        (bin, [("PATH", path)])
    }

    fn agent_plan(root: &std::path::Path, version: &str) -> Plan {
        Plan {
            agent: Some(AgentInstall {
                package: crate::provision::agent::PI_PACKAGE.into(),
                version: version.into(),
                config_line: crate::provision::agent::config_line(root.to_str().unwrap(), version),
                source: AgentSource::Npm,
            }),
            version: "9.9.9".into(),
            ..Plan::default()
        }
    }

    /// A gzipped tar of `files` (path, content, mode), as a bundle is laid out.
    fn tar_gz(files: &[(&str, &str, u32)]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        for (path, text, mode) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(*mode))
                .unwrap();
        }
        let out = std::process::Command::new("tar")
            .args(["-czf", "-", "-C"])
            .arg(dir.path())
            .args(
                ["bin", "lib"]
                    .iter()
                    .filter(|d| dir.path().join(d).exists()),
            )
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
    }

    #[test]
    fn a_bundle_is_checked_unpacked_and_run_with_its_own_node_or_the_remote_s() {
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let (bin, env) = stand_ins(dir.path(), &[("node", "#!/bin/sh\necho v20.20.2\n")]);
            let root = dir.path().join("pi host");
            std::fs::create_dir(&root).unwrap();
            let pi = ("bin/pi", "#!/bin/sh\necho 0.73.1 >&2\n", 0o755);
            // pi's version is read from its package.json, as npm lays it out (tab-indented).
            let package = (
                "lib/node_modules/@mariozechner/pi-coding-agent/package.json",
                "{\n\t\"name\": \"@mariozechner/pi-coding-agent\",\n\t\"version\": \"0.73.1\",\n\t\"engines\": {\"node\": \">=20.6.0\"}\n}\n",
                0o644,
            );
            let with_bundle = |version: &str, bundle: &[u8], sha256: String| {
                let mut plan = agent_plan(&root, version);
                if let Some(agent) = plan.agent.as_mut() {
                    agent.source = AgentSource::Bundle {
                        len: bundle.len() as u64,
                        sha256,
                    };
                }
                run_session_in(&shell, &root, &env, Some(&plan), bundle, 7)
            };
            let installed = root.join("data/agent/versions/0.73.1/bin");

            // Damaged on the way: nothing is unpacked.
            let bundle = tar_gz(&[pi, package]);
            let (_, rest, status) = with_bundle("0.73.1", &bundle, sha256_hex(b"other"));
            assert_eq!(status, Some(92), "{shell:?}: {rest}");
            assert!(!installed.exists());
            assert!(!root.join("config.toml").exists());
            let staged =
                || std::fs::read_dir(root.join("data/agent/versions")).map_or(0, |d| d.count());
            assert_eq!(staged(), 0, "what was unpacked on the way is removed");

            // Bytes that are not a gzipped tar, sent whole: refused after the check.
            let garbage = b"not a bundle".to_vec();
            let (_, rest, status) = with_bundle("0.73.1", &garbage, sha256_hex(&garbage));
            assert_eq!(status, Some(86), "{shell:?}: {rest}");
            assert!(!installed.exists());
            assert_eq!(staged(), 0);

            // Without Node: the remote's is linked beside pi.
            let (_, rest, status) = with_bundle("0.73.1", &bundle, sha256_hex(&bundle));
            assert_eq!(status, Some(0), "{shell:?}: {rest}");
            assert!(
                rest.contains(&format!("verified=agent.tar.gz {}\n", sha256_hex(&bundle))),
                "{rest}"
            );
            assert!(rest.contains("agent=pi 0.73.1\n"), "{rest}");
            assert_eq!(
                std::fs::read_link(installed.join("node")).unwrap(),
                bin.join("node")
            );
            let config = std::fs::read_to_string(root.join("config.toml")).unwrap();
            assert!(
                config.contains("data/agent/versions/0.73.1/bin/pi"),
                "{config}"
            );

            // With Node: its own stays, and a pi that says another version is not taken.
            std::fs::remove_dir_all(root.join("data/agent")).unwrap();
            let bundle = tar_gz(&[
                pi,
                package,
                ("bin/node", "#!/bin/sh\necho v20.20.2\n", 0o755),
            ]);
            let (_, rest, status) = with_bundle("0.73.1", &bundle, sha256_hex(&bundle));
            assert_eq!(status, Some(0), "{shell:?}: {rest}");
            assert!(
                std::fs::symlink_metadata(installed.join("node"))
                    .unwrap()
                    .is_file()
            );
            let (_, rest, status) = with_bundle("0.74.0", &bundle, sha256_hex(&bundle));
            assert_eq!(status, Some(84), "{shell:?}: {rest}");
            assert!(!root.join("data/agent/versions/0.74.0").exists());
            assert!(installed.join("pi").exists(), "the agent before stays");

            // A Node that does not run here: refused, nothing installed.
            let broken = tar_gz(&[pi, package, ("bin/node", "#!/bin/sh\nexit 127\n", 0o755)]);
            std::fs::remove_dir_all(root.join("data/agent/versions/0.73.1")).unwrap();
            let (_, rest, status) = with_bundle("0.73.1", &broken, sha256_hex(&broken));
            assert_eq!(status, Some(84), "{shell:?}: {rest}");
            assert!(!installed.exists());
        }
    }

    #[test]
    fn the_agent_is_installed_with_npm_named_in_the_config_and_a_failure_changes_nothing() {
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let (bin, env) = stand_ins(
                dir.path(),
                &[
                    ("npm", STAND_IN_NPM),
                    ("node", "#!/bin/sh\necho v20.20.2\n"),
                ],
            );
            let root = dir.path().join("pi host");
            std::fs::create_dir(&root).unwrap();
            let config = root.join("config.toml");
            std::fs::write(&config, "roots = [\"/w\"]\n").unwrap();
            let versions = root.join("data/agent/versions");
            let listed = || {
                let mut names: Vec<String> = std::fs::read_dir(&versions)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                names.sort();
                names
            };
            let run = |version: &str| {
                let plan = agent_plan(&root, version);
                let (probe, rest, status) =
                    run_session_in(&shell, &root, &env, Some(&plan), &[], 1);
                let probe = Probe::parse(&probe).unwrap();
                (probe, rest, status, plan.agent.unwrap().config_line)
            };

            let (probe, rest, status, line) = run("0.73.1");
            assert_eq!(status, Some(0), "{shell:?}: {rest}");
            assert_eq!(probe.npm.as_deref(), bin.join("npm").to_str(), "{probe:?}");
            assert!(rest.contains("stage=agent\nagent=pi 0.73.1\n"), "{rest}");
            assert_eq!(
                std::fs::read_to_string(&config).unwrap(),
                format!("{line}\nroots = [\"/w\"]\n")
            );
            let installed = versions.join("0.73.1/bin");
            assert_eq!(
                std::fs::read_link(installed.join("node")).unwrap(),
                bin.join("node")
            );
            assert_eq!(listed(), ["0.73.1"]);

            // npm cannot install it: the agent, its config line and the versions stay.
            let before = std::fs::read_to_string(&config).unwrap();
            let (_, rest, status, _) = run("0.74.0-missing");
            assert_eq!(status, Some(82), "{shell:?}: {rest}");
            assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
            assert_eq!(listed(), ["0.73.1"], "no staging left behind");

            // Upgrades keep the version before (a host may still run it), and only it.
            let (_, rest, status, line) = run("0.74.0");
            assert_eq!(status, Some(0), "{shell:?}: {rest}");
            assert_eq!(
                std::fs::read_to_string(&config).unwrap(),
                format!("{line}\nroots = [\"/w\"]\n")
            );
            assert_eq!(listed(), ["0.73.1", "0.74.0"]);
            let (_, _, status, _) = run("0.75.0");
            assert_eq!(status, Some(0));
            assert_eq!(listed(), ["0.74.0", "0.75.0"]);
        }
    }

    #[test]
    fn the_warm_probe_leaves_out_the_platform_and_ends_at_eof() {
        for shell in shells() {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("pi host");
            std::fs::create_dir_all(root.join("versions/9.9.9")).unwrap();
            std::os::unix::fs::symlink("versions/9.9.9", root.join("current")).unwrap();
            let (probe, rest, status) = run_session(&shell, &root, None, &[], 1);
            assert_eq!(status, Some(0), "{shell:?}: {probe}{rest}");
            // install.sh missing: an install may follow, so the platform is there.
            assert!(probe.contains("\nos="), "{shell:?}: {probe}");
            std::fs::write(root.join("install.sh"), STAND_IN_INSTALLER).unwrap();
            // pi-host's own agent missing: it may be installed, so the platform is there.
            let (probe, _, _) = run_session(&shell, &root, None, &[], 1);
            assert!(probe.contains("\nos="), "{shell:?}: {probe}");
            let pi = root.join("data/agent/versions/0.73.1/bin/pi");
            std::fs::create_dir_all(pi.parent().unwrap()).unwrap();
            std::fs::write(&pi, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&pi, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            let line = crate::provision::agent::config_line(root.to_str().unwrap(), "0.73.1");
            std::fs::write(root.join("config.toml"), format!("roots = []\n{line}\n")).unwrap();
            let (probe, rest, status) = run_session(&shell, &root, None, &[], 1);
            assert_eq!((status, rest.as_str()), (Some(0), ""), "{shell:?}");
            let parsed = Probe::parse(&probe).unwrap();
            assert_eq!(parsed.installed.as_deref(), Some("9.9.9"));
            assert!(parsed.has_installer);
            assert_eq!(parsed.agent_config, AgentConfig::Ours(line));
            assert_eq!(parsed.agent_installed.as_deref(), Some("0.73.1"));
            assert!(!probe.contains("os=") && !probe.contains("sha="), "{probe}");
            // The operator's own agent, and no pi of ours: nothing to install either.
            std::fs::remove_file(&pi).unwrap();
            std::fs::write(root.join("config.toml"), "agent = \"/opt/a\"\n").unwrap();
            let (probe, _, _) = run_session(&shell, &root, None, &[], 1);
            let parsed = Probe::parse(&probe).unwrap();
            assert_eq!(
                parsed.agent_config,
                AgentConfig::Operator("agent = \"/opt/a\"".into())
            );
            assert!(!probe.contains("os="), "{probe}");
        }
    }
}
