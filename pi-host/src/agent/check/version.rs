//! Versions: reading `X.Y.Z` out of what a program prints, running `PROGRAM --version` under
//! a deadline with bounded output, and reading an installed pi's from its `package.json`.

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// `major.minor.patch`, compared numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u64, pub u64, pub u64);

impl Version {
    /// The first word of `text` shaped `[v]X.Y.Z` (a suffix after the patch, `-beta.1`, is
    /// ignored): pi prints `0.73.1`, Node `v20.20.2`.
    pub fn parse(text: &str) -> Option<Version> {
        text.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
            .find_map(Version::parse_word)
    }

    fn parse_word(word: &str) -> Option<Version> {
        let word = word.strip_prefix('v').unwrap_or(word);
        let mut parts = word.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?;
        let digits = patch
            .find(|c: char| !c.is_ascii_digit())
            .map_or(patch, |end| &patch[..end]);
        Some(Version(major, minor, digits.parse().ok()?))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The npm package pi is published as: its `package.json` names the version pi prints.
const PI_PACKAGE: &str = "@mariozechner/pi-coding-agent";

/// How many directories above the agent's script its `package.json` may be (`dist/cli.js`).
const PACKAGE_DEPTH: usize = 3;

/// pi's version read from the `package.json` of the npm package its script (symlinks
/// followed) belongs to; `None` when the agent is not an installed pi package, and then the
/// check asks `--version`. Reading a file rather than running `pi --version` keeps the check
/// from loading pi a second time beside the agent it starts (seconds of CPU on a loaded
/// machine, docs/architecture.md, "The agent check"); what pi prints is read from that file.
pub fn of_pi_package(agent: &Path) -> Option<Version> {
    #[derive(serde::Deserialize)]
    struct Package {
        name: String,
        version: String,
    }
    let script = std::fs::canonicalize(agent).ok()?;
    script
        .ancestors()
        .skip(1)
        .take(PACKAGE_DEPTH)
        .find_map(|dir| {
            let text = std::fs::read(dir.join("package.json")).ok()?;
            let package: Package = serde_json::from_slice(&text).ok()?;
            (package.name == PI_PACKAGE).then_some(package.version)
        })
        .and_then(|version| Version::parse(&version))
}

/// What one program printed for `--version`.
const OUTPUT_BOUND: usize = 4096;

/// Runs `launcher... --version` in `cwd` (with `path_first` ahead on its `PATH`) and returns
/// the version it printed on stdout or stderr (pi prints it on stderr). Err: why not, as text
/// for a person.
pub async fn ask(
    launcher: &[String],
    path_first: Option<&Path>,
    cwd: &Path,
    timeout: Duration,
) -> Result<Version, String> {
    let shown = shell_words::join(launcher.iter().chain(["--version".to_string()].iter()));
    let Some((program, args)) = launcher.split_first() else {
        return Err("the agent command is empty".to_string());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .arg("--version")
        .current_dir(cwd)
        .env_remove(racp_server::notify::ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = path_first {
        command.env("PATH", path_with_first(dir));
    }
    let mut child = command
        .spawn()
        .map_err(|err| format!("`{shown}` cannot be run: {err}"))?;
    let pgid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let (out, err, status) = tokio::join!(bounded(stdout), bounded(stderr), child.wait());
        (out, err, status)
    };
    let (out, err, status) = match tokio::time::timeout(timeout, run).await {
        Ok(done) => done,
        Err(_) => {
            if let Some(pgid) = pgid {
                super::super::signal_group(pgid, Signal::SIGKILL);
            }
            return Err(format!(
                "`{shown}` did not answer within {} s",
                timeout.as_secs()
            ));
        }
    };
    let status = status.map_err(|err| format!("`{shown}` failed: {err}"))?;
    let text = format!("{out}\n{err}");
    if !status.success() {
        let said = first_line(&err).or_else(|| first_line(&out));
        return Err(match said {
            Some(line) => format!("`{shown}` failed ({status}): {line}"),
            None => format!("`{shown}` failed ({status})"),
        });
    }
    Version::parse(&text).ok_or_else(|| format!("`{shown}` printed no version"))
}

/// `dir` then the host's own `PATH`.
pub fn path_with_first(dir: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest));
    std::env::join_paths(dirs).unwrap_or(rest)
}

/// The first [`OUTPUT_BOUND`] bytes of a pipe, read to its end (so the program never blocks
/// on a full pipe).
async fn bounded(pipe: Option<impl AsyncRead + Unpin>) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = OUTPUT_BOUND.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// A program's first non-empty line, made printable and cut to 160 characters.
fn first_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    let line: String = line.chars().take(160).collect();
    Some(racp_proto::validate::printable(&line, false).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_as_pi_and_node_print_them() {
        assert_eq!(Version::parse("0.73.1\n"), Some(Version(0, 73, 1)));
        assert_eq!(Version::parse("v20.20.2"), Some(Version(20, 20, 2)));
        assert_eq!(
            Version::parse("pi (stand-in) 1.2.3-beta.4"),
            Some(Version(1, 2, 3))
        );
        assert_eq!(Version::parse("version 7"), None);
        assert_eq!(Version::parse(""), None);
        assert!(Version(20, 6, 0) > Version(20, 5, 99));
        assert!(Version(0, 73, 0) < Version(0, 100, 0));
    }

    #[test]
    fn pis_version_is_read_from_the_package_its_script_belongs_to() {
        #![allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let package = dir
            .path()
            .join("lib/node_modules/@mariozechner/pi-coding-agent");
        std::fs::create_dir_all(package.join("dist")).unwrap();
        let script = package.join("dist/cli.js");
        std::fs::write(&script, "#!/usr/bin/env node\n").unwrap();
        let manifest = |name: &str| format!(r#"{{"name": "{name}", "version": "0.73.1"}}"#);
        std::fs::write(package.join("package.json"), manifest(PI_PACKAGE)).unwrap();
        // npm's bin link: the package is found through it.
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(&script, bin.join("pi")).unwrap();
        assert_eq!(of_pi_package(&bin.join("pi")), Some(Version(0, 73, 1)));
        assert_eq!(of_pi_package(&script), Some(Version(0, 73, 1)));
        // Another package's manifest, or none, says nothing: `--version` is asked then.
        std::fs::write(package.join("package.json"), manifest("other")).unwrap();
        assert_eq!(of_pi_package(&script), None);
        std::fs::remove_file(package.join("package.json")).unwrap();
        assert_eq!(of_pi_package(&script), None);
        assert_eq!(of_pi_package(&dir.path().join("missing")), None);
    }
}
