//! The stages after the probe, in the same remote command ([`remote_shell::session_script`]):
//! transfer → verify → install → start (and the pairing token's mint). install.sh and then the
//! build follow the plan line on stdin, only when installing (the warm path sends neither);
//! the build streams into `tee FILE | sha256sum` on the remote, so it is hashed as it arrives,
//! with no second pass. Nothing of the running host or of `current` changes until install.sh
//! switches `current` at its very end.

use super::release::{self, Release};
use super::remote_shell::{self, Install, Plan, Probe};
use super::stage::{Progress, Reporter, Stage};
use super::{StageClock, remote_failed, ssh_failed, stage_failed, version_mismatch};
use crate::ssh::{ExecOutput, RemoteCommand, SshError};
use racp_proto::{AppError, ErrorCode, ErrorSource};
use serde_json::{Value, json};
use std::path::PathBuf;

/// What the rest of the command reported.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// install.sh start's state line.
    pub state: Option<Value>,
    /// `pi-host pair --json`.
    pub minted: Option<Value>,
    /// The link on the user's PATH made after an install (the probe's `cli`).
    pub cli: Option<String>,
}

/// What a connect sends after the plan line, in this order: install.sh (of the size the plan
/// gives), the build, then the agent bundle; the last one sent is read to EOF, the others to
/// the sizes the plan gives. The remote unpacks the bundle as it arrives. Any of them may be
/// left out.
#[derive(Default)]
pub(super) struct Upload {
    installer: Vec<u8>,
    bundle: Option<(PathBuf, u64)>,
    artifact: Option<(PathBuf, u64)>,
    /// What goes up, as the upload's notes name it: pi-host, pi, Node, with their bytes.
    parts: Vec<(String, u64)>,
}

impl Upload {
    /// Reads install.sh and sizes the build, and says so in the plan's terms (the plan carries
    /// install.sh's size: the remote reads exactly that much before the build).
    pub(super) fn prepare(
        release: &Release,
        artifact: &release::Artifact,
    ) -> Result<(Upload, Install), AppError> {
        let unreadable = |e: String| stage_failed(Stage::Transfer, e, json!({}));
        let installer = release.installer_bytes().map_err(unreadable)?;
        let path = release.dir.join(&artifact.file);
        let artifact_len = std::fs::metadata(&path)
            .map_err(|e| unreadable(format!("cannot read {}: {e}", path.display())))?
            .len();
        let install = Install {
            artifact: artifact.file.clone(),
            artifact_sha256: artifact.sha256.clone(),
            installer_sha256: release.manifest.installer.sha256.clone(),
            installer_len: installer.len() as u64,
            artifact_len,
        };
        let name = format!(
            "pi-host {} for {}-{}",
            release.manifest.version, artifact.os, artifact.arch
        );
        let upload = Upload {
            installer,
            bundle: None,
            artifact: Some((path, artifact_len)),
            parts: vec![(name, artifact_len)],
        };
        Ok((upload, install))
    }

    /// Adds the agent bundle, sent last.
    pub(super) fn add_bundle(&mut self, bundle: &super::bundle::Bundle) {
        self.bundle = Some((bundle.path.clone(), bundle.len));
        let pi = format!("pi {} (the agent bundle)", super::bundle::PI_VERSION);
        self.parts.push((pi, bundle.parts.pi_bytes));
        if let Some(node) = bundle.node {
            let node = format!("Node {node} (in the agent bundle)");
            self.parts.push((node, bundle.parts.node_bytes));
        }
    }

    /// The upload's notes: one line per part.
    fn report_parts(&self, reporter: &dyn Reporter) {
        for (name, bytes) in &self.parts {
            reporter.report(Progress::Note {
                stage: Stage::Transfer,
                text: format!("{name}: {}", super::bundle::mb(*bytes)),
            });
        }
    }

    /// The transfer stage's closing note: the total, and what it was made of.
    fn summary(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(name, bytes)| format!("{name} {}", super::bundle::mb(*bytes)))
            .collect();
        format!("{} bytes ({})", self.total(), parts.join(", "))
    }

    fn total(&self) -> u64 {
        let files = [&self.bundle, &self.artifact];
        self.installer.len() as u64
            + files
                .iter()
                .filter_map(|f| f.as_ref())
                .map(|(_, len)| len)
                .sum::<u64>()
    }
}

/// Sends the plan (and the upload, when installing) to the command the probe ran in, and
/// follows the stages it reports. On failure the error names the stage that was running.
pub(super) async fn carry_out(
    mut remote: RemoteCommand,
    plan: &Plan,
    upload: Option<&Upload>,
    reporter: &dyn Reporter,
) -> Result<Outcome, AppError> {
    let mut report = Report::start(reporter, upload);
    if let Err(err) = send(&mut remote, plan, upload, reporter).await {
        return Err(match err {
            // The remote ended early: its output says why.
            SshError::Protocol(_) => {
                let output = remote.finish().await.unwrap_or_default();
                let what = match upload {
                    Some(_) => "the upload",
                    None => "the remote command",
                };
                remote_failed(report.stage, what, &output)
            }
            other => ssh_failed(report.stage, other),
        });
    }
    remote
        .eof()
        .await
        .map_err(|e| ssh_failed(report.stage, e))?;
    while let Some(line) = remote.next_line().await {
        report.read(&line);
    }
    let output = remote
        .finish()
        .await
        .map_err(|e| ssh_failed(report.stage, e))?;
    if !output.success() {
        return Err(failed(report.stage, &output, plan, &report.verified));
    }
    if let Some(clock) = report.clock.take() {
        clock.done(report.note);
    }
    Ok(report.outcome)
}

/// What the remote command has reported so far: the stage it is in (timed), the sums it
/// verified, and its results.
struct Report<'a> {
    reporter: &'a dyn Reporter,
    upload: Option<&'a Upload>,
    stage: Stage,
    clock: Option<StageClock<'a>>,
    /// The note the running stage ends with.
    note: Option<String>,
    verified: Vec<(String, String)>,
    outcome: Outcome,
}

impl<'a> Report<'a> {
    /// The transfer when there is an upload (it starts now), else the start.
    fn start(reporter: &'a dyn Reporter, upload: Option<&'a Upload>) -> Self {
        let (stage, clock) = match upload {
            Some(_) => (
                Stage::Transfer,
                Some(StageClock::start(reporter, Stage::Transfer)),
            ),
            None => (Stage::Start, None),
        };
        Report {
            reporter,
            upload,
            stage,
            clock,
            note: None,
            verified: Vec::new(),
            outcome: Outcome::default(),
        }
    }

    /// One `key=value` line of the command's output.
    fn read(&mut self, line: &str) {
        let Some((key, value)) = line.split_once('=') else {
            return;
        };
        match key {
            "stage" => {
                if let Some(next) = stage_named(value) {
                    self.enter(next);
                }
            }
            "verified" => {
                if let Some((file, sum)) = value.split_once(' ') {
                    self.verified.push((file.to_string(), sum.to_string()));
                }
            }
            "installed" | "agent" => self.note = Some(value.to_string()),
            "state" => {
                self.outcome.state = serde_json::from_str(value).ok();
                self.note = self
                    .outcome
                    .state
                    .as_ref()
                    .and_then(|state| state["listen"].as_str())
                    .map(|listen| format!("listening on {listen}"));
            }
            "pair" => self.outcome.minted = serde_json::from_str(value).ok(),
            "cli" => self.outcome.cli = Some(value.to_string()),
            _ => {}
        }
    }

    /// The command went on to `next`: the running stage is done.
    fn enter(&mut self, next: Stage) {
        let done_note = match (self.stage, self.upload) {
            (Stage::Transfer, Some(upload)) => Some(upload.summary()),
            _ => self.note.take(),
        };
        if let Some(clock) = self.clock.take() {
            clock.done(done_note);
        }
        self.stage = next;
        // The pair stage is reported when the token is traded, through the forward.
        if next != Stage::Pair {
            self.clock = Some(StageClock::start(self.reporter, next));
        }
    }
}

/// The stage a `stage=NAME` line begins (the transfer is under way before any line).
fn stage_named(name: &str) -> Option<Stage> {
    match name {
        "verify" => Some(Stage::Verify),
        "agent" => Some(Stage::Agent),
        "install" => Some(Stage::Install),
        "start" => Some(Stage::Start),
        "pair" => Some(Stage::Pair),
        _ => None,
    }
}

/// The error for a command that failed during `stage`.
fn failed(
    stage: Stage,
    output: &ExecOutput,
    plan: &Plan,
    verified: &[(String, String)],
) -> AppError {
    if stage == Stage::Verify {
        let mut expected_sums: Vec<(&str, &str)> = Vec::new();
        if let Some(install) = &plan.install {
            expected_sums.push((install.artifact.as_str(), &install.artifact_sha256));
            expected_sums.push(("install.sh", &install.installer_sha256));
        }
        if let Some(remote_shell::AgentSource::Bundle { sha256, .. }) =
            plan.agent.as_ref().map(|a| &a.source)
        {
            expected_sums.push(("agent.tar.gz", sha256));
        }
        for (file, expected) in expected_sums {
            let actual = verified
                .iter()
                .find(|(f, _)| f == file)
                .map(|(_, sum)| sum.as_str());
            if actual.is_some_and(|a| !a.eq_ignore_ascii_case(expected)) {
                return stage_failed(
                    Stage::Verify,
                    format!(
                        "{file} arrived with SHA-256 {} but the manifest says {expected}; nothing was installed",
                        actual.unwrap_or("(none)")
                    ),
                    // stderr says why, when the remote knows (a write that failed: disk full).
                    json!({"file": file, "expected": expected, "actual": actual, "stderrTail": output.stderr_tail()}),
                );
            }
        }
    }
    let what = match stage {
        Stage::Transfer => "the upload",
        Stage::Verify => "the SHA-256 check",
        Stage::Agent => "the agent install",
        Stage::Install => "install.sh install",
        Stage::Start => "install.sh start",
        Stage::Pair => "pi-host pair",
        _ => "the remote command",
    };
    remote_failed(stage, what, output)
}

/// What the session script reads from stdin: the plan line, then, when installing, install.sh
/// and the build.
async fn send(
    remote: &mut RemoteCommand,
    plan: &Plan,
    upload: Option<&Upload>,
    reporter: &dyn Reporter,
) -> Result<(), SshError> {
    let mut head = plan.line().into_bytes();
    let Some(upload) = upload else {
        return remote.send(&head).await;
    };
    upload.report_parts(reporter);
    // One packet for both: install.sh is small, and the remote reads it right after the plan.
    head.extend_from_slice(&upload.installer);
    remote.send(&head).await?;
    let (mut before, total) = (upload.installer.len() as u64, upload.total());
    reporter.report(Progress::Bytes {
        stage: Stage::Transfer,
        done: before,
        total,
    });
    for (path, len) in [&upload.artifact, &upload.bundle].into_iter().flatten() {
        let mut on_progress = |sent: u64| {
            reporter.report(Progress::Bytes {
                stage: Stage::Transfer,
                done: before + sent,
                total,
            })
        };
        remote.send_file(path, &mut on_progress).await?;
        before += len;
    }
    Ok(())
}

/// What an install needs: a release with a build for the remote's platform, and a command on
/// the remote that prints SHA-256 sums.
pub(super) fn installable<'r>(
    probe: &Probe,
    release: Option<&'r Release>,
    wanted: &str,
) -> Result<(&'r Release, &'r release::Artifact), AppError> {
    if probe.os.is_empty() || probe.arch.is_empty() {
        // The probe leaves the platform out only when the wanted version is installed, and
        // then nothing is installed: a probe that disagrees is a broken one.
        return Err(stage_failed(
            Stage::Probe,
            "the probe printed no OS or architecture",
            json!({}),
        ));
    }
    let platform = format!(
        "{}-{}",
        release::normalize_os(&probe.os),
        release::normalize_arch(&probe.arch)
    );
    // With another version installed, not getting the wanted one is a version mismatch.
    let unavailable = |message: String| match &probe.installed {
        Some(installed) => version_mismatch(message, wanted, Some(installed), &platform),
        None => stage_failed(Stage::Transfer, message, json!({"platform": platform})),
    };
    let Some(release) = release else {
        return Err(unavailable(format!(
            "pi-host {wanted} is not on the remote and no release of it was found (looked in {}); make a desktop distribution with deploy/dist.sh, or pass --release-dir DIR (deploy/release.sh --out DIR makes one)",
            release::searched()
        )));
    };
    let artifact = supported(probe, release)?;
    if probe.sha_command.is_none() {
        return Err(stage_failed(
            Stage::Verify,
            "the remote has neither sha256sum nor shasum",
            json!({}),
        ));
    }
    Ok((release, artifact))
}

/// The release's build for the remote, checked before anything is uploaded: the remote's OS and
/// architecture must have one, and a Linux build linked against glibc needs a glibc at least as
/// new as the one it was built for (musl cannot load it). A C library the probe could not
/// identify is let through: install.sh runs the binary before switching to it.
pub(super) fn supported<'r>(
    probe: &Probe,
    release: &'r Release,
) -> Result<&'r release::Artifact, AppError> {
    let found = json!({
        "os": probe.os,
        "arch": probe.arch,
        "libc": probe.libc.family,
        "libcVersion": probe.libc.version,
    });
    let remote = format!("{} {} with {}", probe.os, probe.arch, probe.libc.describe());
    let Some(artifact) = release.artifact_for(&probe.os, &probe.arch) else {
        let platforms = release.platforms();
        return Err(unsupported_platform(
            format!(
                "the remote is {remote}; the release in {} has builds for {} only",
                release.dir.display(),
                platforms.join(", ")
            ),
            found,
            json!({"platforms": platforms}),
        ));
    };
    let linux = release::normalize_os(&probe.os) == "linux";
    let Some(min) = artifact.glibc.as_deref().filter(|_| linux) else {
        return Ok(artifact);
    };
    let needed = json!({"platforms": [format!("{}-{}", artifact.os, artifact.arch)], "libc": "glibc", "glibcMin": min});
    let too_old = match (probe.libc.family.as_str(), probe.libc.version.as_deref()) {
        ("musl", _) => true,
        ("glibc", Some(version)) => remote_shell::version_cmp(version, min).is_lt(),
        _ => false,
    };
    if too_old {
        return Err(unsupported_platform(
            format!("the remote is {remote}; this release's build needs glibc {min} or newer"),
            found,
            needed,
        ));
    }
    Ok(artifact)
}

/// HOST_BOOTSTRAP_FAILED with `details.reason: "unsupported_platform"`: what the remote is and
/// what the release needs (docs/error-codes.md).
fn unsupported_platform(message: String, found: Value, needed: Value) -> AppError {
    AppError::new(
        ErrorCode::HostBootstrapFailed,
        format!("unsupported platform: {message}; nothing was uploaded"),
    )
    .with_details(json!({
        "reason": "unsupported_platform",
        "found": found,
        "needed": needed,
        "hint": "run pi-host on a machine the release has a build for (deploy/README.md, \"The glibc floor\")",
    }))
    .with_source(ErrorSource::Bootstrap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::release::{Artifact, FileEntry, Manifest};

    fn release(glibc: Option<&str>) -> Release {
        Release {
            dir: "/release".into(),
            manifest: Manifest {
                version: "1.0.0".into(),
                artifacts: vec![Artifact {
                    os: "linux".into(),
                    arch: "x86_64".into(),
                    file: "pi-host-1.0.0-linux-x86_64.tar.gz".into(),
                    sha256: "00".into(),
                    glibc: glibc.map(str::to_string),
                }],
                installer: FileEntry {
                    file: "install.sh".into(),
                    sha256: "00".into(),
                },
            },
        }
    }

    fn probe(arch: &str, libc: &str) -> Probe {
        Probe::parse(&format!("root=/r\nos=Linux\narch={arch}\n{libc}\n")).unwrap()
    }

    #[test]
    fn only_a_remote_the_build_runs_on_is_supported() {
        let release = release(Some("2.17"));
        for ok in [
            "libc=glibc 2.17",
            "libc=glibc 2.36",
            "ldd=sh: ldd: not found",
        ] {
            assert!(supported(&probe("x86_64", ok), &release).is_ok(), "{ok}");
        }
        let refused = |arch: &str, libc: &str| {
            let error = supported(&probe(arch, libc), &release).unwrap_err();
            assert_eq!(error.code(), ErrorCode::HostBootstrapFailed);
            error.details().unwrap().clone()
        };
        let old = refused("x86_64", "libc=glibc 2.12");
        assert_eq!(old["reason"], "unsupported_platform");
        assert_eq!(old["found"]["libcVersion"], "2.12");
        assert_eq!(old["needed"]["glibcMin"], "2.17");
        let musl = refused("x86_64", "ldd=musl libc (x86_64) Version 1.2.4");
        assert_eq!(musl["found"]["libc"], "musl");
        let arm = refused("aarch64", "libc=glibc 2.36");
        assert_eq!(arm["found"]["arch"], "aarch64");
        assert_eq!(arm["needed"]["platforms"], json!(["linux-x86_64"]));
        // A manifest from before the floor was recorded: any glibc goes.
        assert!(
            supported(
                &probe("x86_64", "libc=glibc 2.12"),
                &release_without_floor()
            )
            .is_ok()
        );
    }

    fn release_without_floor() -> Release {
        release(None)
    }
}
