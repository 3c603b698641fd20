//! The transfer, verify and install stages: the release's build and install.sh go into a
//! staging directory of this connect, their SHA-256 sums are checked on the remote against the
//! manifest, and install.sh installs the build. Nothing of the running host or of `current`
//! changes until install.sh switches `current` at its very end.

use super::release::{self, Release};
use super::remote_shell::{self, Probe, sh_quote};
use super::stage::{Progress, Reporter, Stage};
use super::{
    StageClock, last_line, remote_failed, run_remote, ssh_failed, stage_failed, version_mismatch,
};
use crate::ssh::SshSession;
use racp_proto::AppError;
use serde_json::json;

/// transfer → verify → install. Nothing of the running host or of `current` changes until
/// install.sh switches `current` at its very end.
pub(super) async fn install(
    session: &SshSession,
    probe: &mut Probe,
    release: Option<&Release>,
    wanted: &str,
    reporter: &dyn Reporter,
) -> Result<(), AppError> {
    let (release, artifact, sha_command) = installable(probe, release, wanted)?;

    let clock = StageClock::start(reporter, Stage::Transfer);
    let installer = &release.manifest.installer;
    let files = [
        (artifact.file.as_str(), artifact.sha256.as_str()),
        (installer.file.as_str(), installer.sha256.as_str()),
    ];
    let total = upload_size(release, &files)?;
    // Each connect uploads into its own directory, so two desktops installing at once never
    // mix their files (install.sh's lock serializes the installs themselves). Directories left
    // by a connect that died halfway are removed after an hour.
    let run_dir = format!("{}/staging/{}", probe.root, nonce());
    let prepare = format!(
        "mkdir -p {dir} && find {staging} -mindepth 1 -maxdepth 1 -mmin +60 -exec rm -rf {{}} + 2>/dev/null; true",
        dir = sh_quote(&run_dir),
        staging = sh_quote(&format!("{}/staging", probe.root)),
    );
    run_remote(session, Stage::Transfer, "mkdir", &prepare).await?;
    let upload = Upload {
        release,
        artifact,
        files,
        sha_command,
        run_dir,
        total,
    };
    let result = upload_verify_install(session, probe, &upload, wanted, clock, reporter).await;
    let _ = session
        .exec(&format!("rm -rf {}", sh_quote(&upload.run_dir)))
        .await;
    result?;
    probe.installed = Some(wanted.to_string());
    probe.has_installer = true;
    Ok(())
}

/// What an install needs: a release with a build for the remote's platform, and a command on
/// the remote that prints SHA-256 sums.
fn installable<'r>(
    probe: &Probe,
    release: Option<&'r Release>,
    wanted: &str,
) -> Result<(&'r Release, &'r release::Artifact, String), AppError> {
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
            "pi-host {wanted} is not on the remote and no release directory was given (pass --release-dir; deploy/release.sh makes one)"
        )));
    };
    let Some(artifact) = release.artifact_for(&probe.os, &probe.arch) else {
        return Err(unavailable(format!(
            "the release in {} has no build for {platform} (it has {})",
            release.dir.display(),
            release.platforms().join(", ")
        )));
    };
    let Some(sha_command) = probe.sha_command.clone() else {
        return Err(stage_failed(
            Stage::Verify,
            "the remote has neither sha256sum nor shasum",
            json!({}),
        ));
    };
    Ok((release, artifact, sha_command))
}

/// The bytes the upload sends.
fn upload_size(release: &Release, files: &[(&str, &str)]) -> Result<u64, AppError> {
    let mut total = 0;
    for (file, _) in files {
        let path = release.dir.join(file);
        total += std::fs::metadata(&path)
            .map_err(|e| {
                stage_failed(
                    Stage::Transfer,
                    format!("cannot read {}: {e}", path.display()),
                    json!({}),
                )
            })?
            .len();
    }
    Ok(total)
}

/// Sixteen hex digits from the OS's random source.
fn nonce() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A release's build and its install.sh on their way to a staging directory on the remote.
struct Upload<'a> {
    release: &'a Release,
    artifact: &'a release::Artifact,
    /// `(file, SHA-256 in the manifest)`: the build, then install.sh.
    files: [(&'a str, &'a str); 2],
    /// The remote's command that prints SHA-256 sums.
    sha_command: String,
    /// This connect's staging directory on the remote.
    run_dir: String,
    /// The bytes to send.
    total: u64,
}

impl Upload<'_> {
    /// Where `file` goes on the remote, as a shell word.
    fn remote_path(&self, file: &str) -> String {
        sh_quote(&format!("{}/{file}", self.run_dir))
    }
}

/// The rest of the transfer stage (its clock is running), then verify and install.
async fn upload_verify_install(
    session: &SshSession,
    probe: &Probe,
    upload: &Upload<'_>,
    wanted: &str,
    clock: StageClock<'_>,
    reporter: &dyn Reporter,
) -> Result<(), AppError> {
    send_files(session, upload, reporter).await?;
    clock.done(Some(format!("{} bytes", upload.total)));

    let clock = StageClock::start(reporter, Stage::Verify);
    verify_sums(session, upload).await?;
    clock.done(None);

    let clock = StageClock::start(reporter, Stage::Install);
    let command = format!(
        "sh {} install --root {} --version {} --artifact {}",
        upload.remote_path(&upload.release.manifest.installer.file),
        probe.root_word(),
        sh_quote(wanted),
        upload.remote_path(&upload.artifact.file)
    );
    let output = run_remote(session, Stage::Install, "install.sh", &command).await?;
    clock.done(last_line(&output.stdout_text()).map(str::to_string));
    Ok(())
}

/// Sends the files (`cat > FILE` over SSH), reporting the bytes sent.
async fn send_files(
    session: &SshSession,
    upload: &Upload<'_>,
    reporter: &dyn Reporter,
) -> Result<(), AppError> {
    let release = upload.release;
    let mut sent_before = 0;
    for (file, _) in upload.files {
        let mut on_progress = |sent: u64| {
            reporter.report(Progress::Transfer {
                sent: sent_before + sent,
                total: upload.total,
            })
        };
        let output = session
            .exec_with_input(
                &format!("cat > {}", upload.remote_path(file)),
                Some(&release.dir.join(file)),
                &mut on_progress,
            )
            .await
            .map_err(|e| ssh_failed(Stage::Transfer, e))?;
        if !output.success() {
            return Err(remote_failed(Stage::Transfer, "the upload", &output));
        }
        sent_before += std::fs::metadata(release.dir.join(file))
            .map(|m| m.len())
            .unwrap_or(0);
    }
    Ok(())
}

/// Checks each file's SHA-256 on the remote against the manifest.
async fn verify_sums(session: &SshSession, upload: &Upload<'_>) -> Result<(), AppError> {
    let sha_command = upload.sha_command.as_str();
    let paths: Vec<String> = upload
        .files
        .iter()
        .map(|(f, _)| upload.remote_path(f))
        .collect();
    let output = run_remote(
        session,
        Stage::Verify,
        sha_command,
        &format!("{sha_command} {}", paths.join(" ")),
    )
    .await?;
    let sums = remote_shell::parse_sums(&output.stdout_text());
    for (file, expected) in upload.files {
        let actual = sums
            .iter()
            .find(|(_, name)| name == file)
            .map(|(hash, _)| hash.as_str());
        if actual != Some(&expected.to_ascii_lowercase()) {
            return Err(stage_failed(
                Stage::Verify,
                format!(
                    "{file} arrived with SHA-256 {} but the manifest says {expected}; nothing was installed",
                    actual.unwrap_or("(none)")
                ),
                json!({"file": file, "expected": expected, "actual": actual}),
            ));
        }
    }
    Ok(())
}
