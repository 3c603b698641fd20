//! The desktop flow over SSH: resolve → connect → host key → authenticate → probe → transfer →
//! verify → install → start → forward → pair → handshake (docs/architecture.md, "One `pi-remote connect`").
//!
//! A host that already runs the wanted version is reused as is: one probe command, no transfer,
//! no restart. Pairing mints a token over SSH (`pi-host pair --json`, run remotely) and trades it
//! for a device credential through the forward; a stored credential is reused. After that,
//! [`supervisor`] keeps the local port open and reconnects SSH with backoff when the link drops,
//! running the same stages again (fast: the host is found running).

pub mod agent;
pub mod bundle;
mod install;
pub mod release;
pub mod remote_shell;
pub mod stage;
pub mod supervisor;

use crate::ssh::config::{Destination, ResolveOptions};
use crate::ssh::{self, ChangedHostKey, ConnectOptions, ConnectStep, SshError, SshSession};
use racp_proto::client::{ClientOptions, RacpClient};
use racp_proto::fingerprint::CertSha256;
use racp_proto::methods::handshake::PairParams;
use racp_proto::methods::host::HostInfoResult;
use racp_proto::{AppError, Empty, ErrorCode, ErrorSource, Role, calls};
use release::Release;
use remote_shell::{Plan, Probe, Running, sh_quote};
use serde_json::{Value, json};
use stage::{Progress, Reporter, Stage};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A device paired with the remote host: its id, token and roles, and the host certificate it
/// was paired with (the device's credential for that host).
#[derive(Clone, PartialEq, Eq)]
pub struct PairedDevice {
    pub device_id: String,
    pub device_token: String,
    pub roles: Vec<Role>,
    /// The host certificate this credential was paired with (learnt over SSH); `None` for a
    /// profile from before pinning, which is paired again.
    pub cert_sha256: Option<CertSha256>,
}

// Hand-written so the token never reaches a log.
impl std::fmt::Debug for PairedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairedDevice")
            .field("device_id", &self.device_id)
            .field("roles", &self.roles)
            .field("cert_sha256", &self.cert_sha256)
            .finish_non_exhaustive()
    }
}

/// Everything [`connect`] needs.
#[derive(Clone)]
pub struct BootstrapOptions {
    /// `[user@]host[:port]` or a config alias.
    pub target: String,
    pub resolve: ResolveOptions,
    pub ssh: ConnectOptions,
    /// Where deploy/release.sh put the release; needed only to install or upgrade.
    pub release_dir: Option<PathBuf>,
    /// The install root on the remote (default `~/.pi-host`).
    pub remote_dir: String,
    /// The name the host shows for this device.
    pub device_name: String,
    /// The device paired with the host by an earlier connect.
    pub paired_device: Option<PairedDevice>,
    /// The local port of the forward (0: any free one).
    pub local_port: u16,
    /// A port to try first, falling back to `local_port` when it is taken (the port an earlier
    /// connect used, so URLs stored elsewhere stay valid).
    pub preferred_local_port: Option<u16>,
    /// How long opening a forwarded channel may take.
    pub channel_timeout: Duration,
    /// The pi version installed as the host's agent (provision/agent.rs).
    pub agent_version: String,
}

impl BootstrapOptions {
    pub fn new(target: impl Into<String>) -> Self {
        BootstrapOptions {
            target: target.into(),
            resolve: ResolveOptions::default(),
            ssh: ConnectOptions::default(),
            release_dir: None,
            remote_dir: remote_shell::DEFAULT_REMOTE_DIR.into(),
            device_name: "pi-remote".into(),
            paired_device: None,
            local_port: 0,
            preferred_local_port: None,
            channel_timeout: Duration::from_secs(10),
            agent_version: agent::PI_VERSION.into(),
        }
    }
}

/// Sixteen hex digits from the OS's random source: a name no other connect uses (this
/// connect's staging directory on the remote, a bundle being made here).
fn nonce() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A failed stage: HOST_BOOTSTRAP_FAILED with `details.reason` = the stage.
pub fn stage_failed(stage: Stage, message: impl std::fmt::Display, extra: Value) -> AppError {
    let mut details = json!({"reason": stage.as_str()});
    if let (Some(details), Value::Object(extra)) = (details.as_object_mut(), extra) {
        details.extend(extra);
    }
    AppError::new(
        ErrorCode::HostBootstrapFailed,
        format!("{} failed: {message}", stage.label()),
    )
    .with_details(details)
    .with_source(ErrorSource::Bootstrap)
}

/// Maps an SSH failure during `stage` to its registered code.
fn ssh_failed(stage: Stage, err: SshError) -> AppError {
    let message = err.to_string();
    match err {
        SshError::HostKeyChanged(changed) => {
            let ChangedHostKey {
                host,
                known_hosts,
                line,
                fingerprint,
                algorithm,
                recorded_fingerprint,
                recorded_algorithm,
            } = *changed;
            stage_failed(
                Stage::HostKey,
                message,
                json!({"hostKey": "changed", "host": host, "knownHosts": known_hosts, "line": line, "fingerprint": fingerprint, "algorithm": algorithm, "recordedFingerprint": recorded_fingerprint, "recordedAlgorithm": recorded_algorithm}),
            )
        }
        SshError::HostKeyRevoked {
            host,
            known_hosts,
            line,
            fingerprint,
        } => stage_failed(
            Stage::HostKey,
            message,
            json!({"hostKey": "revoked", "host": host, "knownHosts": known_hosts, "line": line, "fingerprint": fingerprint}),
        ),
        SshError::HostKeyUnknown {
            host,
            known_hosts,
            fingerprint,
        } => stage_failed(
            Stage::HostKey,
            message,
            json!({"hostKey": "unknown", "host": host, "knownHosts": known_hosts, "fingerprint": fingerprint, "hint": "check the fingerprint, then run again with --accept-new"}),
        ),
        SshError::KnownHosts { .. } => stage_failed(Stage::HostKey, message, json!({})),
        SshError::AuthFailed { .. } | SshError::KeyFile { .. } => {
            stage_failed(Stage::Authenticate, message, json!({}))
        }
        SshError::Unreachable { .. } => stage_failed(Stage::Connect, message, json!({})),
        SshError::ChannelOpen {
            target, prohibited, ..
        } => forward_failed(message, &target, prohibited),
        SshError::Timeout(_) | SshError::Protocol(_) | SshError::LocalFile { .. } => {
            stage_failed(stage, message, json!({}))
        }
    }
}

fn forward_failed(message: String, target: &str, prohibited: bool) -> AppError {
    AppError::new(ErrorCode::RemoteForwardFailed, message)
        .with_details(json!({
            "reason": if prohibited { "administratively_prohibited" } else { "connect_failed" },
            "target": target,
            "hint": if prohibited {
                "the remote sshd forbids TCP forwarding: set AllowTcpForwarding yes (or local) in its sshd_config, or PermitOpen to include this target"
            } else {
                "nothing answered at the host's port on the remote; reconnecting starts it again"
            },
        }))
        .with_source(ErrorSource::Bootstrap)
}

/// A failed remote command: its exit code and the tail of its stderr go into the details.
fn remote_failed(stage: Stage, what: &str, output: &ssh::ExecOutput) -> AppError {
    stage_failed(
        stage,
        format!(
            "{what} exited with {} on the remote: {}",
            output
                .status
                .map_or("a signal".to_string(), |s| s.to_string()),
            last_line(&output.stderr_tail()).unwrap_or("no error output")
        ),
        json!({"exitCode": output.status, "stderrTail": output.stderr_tail()}),
    )
}

/// Runs `command` on the remote as part of `stage`: not getting it to run, or its failing
/// (`what` names it in the message), fails the stage.
async fn run_remote(
    session: &SshSession,
    stage: Stage,
    what: &str,
    command: &str,
) -> Result<ssh::ExecOutput, AppError> {
    let output = session
        .exec(command)
        .await
        .map_err(|e| ssh_failed(stage, e))?;
    if !output.success() {
        return Err(remote_failed(stage, what, &output));
    }
    Ok(output)
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

/// Times and reports one stage.
struct StageClock<'a> {
    reporter: &'a dyn Reporter,
    stage: Stage,
    started: Instant,
}

impl<'a> StageClock<'a> {
    fn start(reporter: &'a dyn Reporter, stage: Stage) -> Self {
        reporter.report(Progress::Started(stage));
        StageClock {
            reporter,
            stage,
            started: Instant::now(),
        }
    }

    fn done(self, note: Option<String>) {
        self.reporter.report(Progress::Done {
            stage: self.stage,
            ms: self.started.elapsed().as_millis() as u64,
            note,
        });
    }
}

fn skipped(reporter: &dyn Reporter, stage: Stage, why: &str) {
    reporter.report(Progress::Skipped {
        stage,
        why: why.to_string(),
    });
}

/// An SSH session with a running host behind it.
pub(crate) struct Link {
    pub session: Arc<SshSession>,
    pub remote_port: u16,
    pub probe: Probe,
    /// The running host's certificate fingerprint, from its status or state file: read over
    /// SSH, whose host key was checked, so it is the one to pin (never what the forward's
    /// local port presents).
    pub cert_sha256: CertSha256,
}

/// What the stages up to `start` did.
#[derive(Debug, Clone, Default)]
struct Work {
    transferred: bool,
    installed: bool,
    started: bool,
    /// The agent was installed or its config line written (provision/agent.rs).
    agent: bool,
    /// A pairing token minted in the same remote command (`pi-host pair --json`).
    minted: Option<Value>,
    /// The config.toml line this connect wrote for the agent.
    config_line: Option<String>,
}

/// resolve → … → start: an SSH session and the port of a host of the wanted version. One
/// remote command does it all ([`remote_shell::session_script`]): it probes, and then, as the
/// bootstrapper decides from the probe, takes the build on stdin and installs, starts and mints
/// a pairing token (`mint`: when there is no stored credential to reuse).
async fn establish(
    options: &BootstrapOptions,
    reporter: &dyn Reporter,
    mint: bool,
) -> Result<(Link, Work, String), AppError> {
    let (destination, release, wanted) = resolve_stage(options, reporter)?;
    let session = Arc::new(ssh_connect(&destination, options, reporter).await?);
    let on_session = |npm_failed| {
        provision(
            &session,
            options,
            release.as_ref(),
            &wanted,
            reporter,
            mint,
            npm_failed,
        )
    };
    match on_session(false).await {
        // The remote's npm could not install pi (no registry, say): again with a bundle, on the
        // same SSH session. Nothing of the host or its agent changed.
        Err(error) if agent::npm_failed(&error) && options.agent_version == agent::PI_VERSION => {
            tracing::info!(
                error = error.message(),
                "the remote's npm failed; sending a bundle"
            );
            reporter.report(Progress::Note {
                stage: Stage::Agent,
                text: format!(
                    "the remote's npm could not install pi ({}); falling back to a bundle made on this machine",
                    error.message()
                ),
            });
            on_session(true).await
        }
        other => other,
    }
}

/// [`establish`] once the SSH session is up: the probe, and everything it calls for.
/// `npm_failed`: an earlier try found that the remote's npm cannot install pi.
async fn provision(
    session: &Arc<SshSession>,
    options: &BootstrapOptions,
    release: Option<&Release>,
    wanted: &str,
    reporter: &dyn Reporter,
    mint: bool,
    npm_failed: bool,
) -> Result<(Link, Work, String), AppError> {
    let wanted = wanted.to_string();
    let script = remote_shell::session_script(
        &options.remote_dir,
        &wanted,
        &nonce(),
        &options.agent_version,
    );
    let (remote, probe, running) = probe_stage(session, &script, reporter).await?;
    let planned = plan_agent(&probe, running.as_ref(), options, npm_failed, reporter).await;
    let (agent, bundle) = match planned {
        Ok(planned) => planned,
        Err(err) => {
            let _ = remote.finish().await;
            return Err(err);
        }
    };
    if let Some(running) = running
        .as_ref()
        .filter(|r| r.version == wanted && !r.draining && agent.is_none())
    {
        let work = Work {
            minted: finish_warm(remote, mint, &wanted, reporter).await?,
            ..Work::default()
        };
        let link = warm_link(session.clone(), probe, running, &wanted, reporter)?;
        return Ok((link, work, wanted));
    }
    // A new agent (or its config line) is taken up by a restart: the running host drains
    // first (install.sh stop sends SIGTERM).
    let plan = Plan {
        stop: running.is_some(),
        start: true,
        mint,
        version: wanted.clone(),
        agent,
        ..Plan::default()
    };
    let (link, work) = install_and_start(
        session,
        remote,
        probe,
        plan,
        release,
        bundle.as_ref(),
        reporter,
    )
    .await?;
    Ok((link, work, wanted))
}

/// The warm path's end of the remote command: a plan that only mints the pairing token (when
/// `mint`), else EOF. Returns the token minted.
async fn finish_warm(
    remote: ssh::RemoteCommand,
    mint: bool,
    wanted: &str,
    reporter: &dyn Reporter,
) -> Result<Option<Value>, AppError> {
    if !mint {
        // EOF instead of a plan: the command ends on its own, and nothing it prints now
        // matters, so the connect goes on without waiting for it.
        tokio::spawn(remote.finish());
        return Ok(None);
    }
    let plan = Plan {
        mint: true,
        version: wanted.to_string(),
        ..Plan::default()
    };
    let outcome = install::carry_out(remote, &plan, None, reporter).await?;
    Ok(outcome.minted)
}

/// The cold path: `plan` (the build, when the wanted version is not installed) carried out by
/// the remote command, up to a started host; an upgraded host that does not start is rolled
/// back.
async fn install_and_start(
    session: &Arc<SshSession>,
    remote: ssh::RemoteCommand,
    mut probe: Probe,
    mut plan: Plan,
    release: Option<&Release>,
    bundle: Option<&bundle::Bundle>,
    reporter: &dyn Reporter,
) -> Result<(Link, Work), AppError> {
    let wanted = plan.version.clone();
    let previous = probe.installed.clone();
    let (install, upload) = match plan_upload(&probe, release, &wanted, bundle, reporter) {
        Ok(planned) => planned,
        Err(err) => {
            let _ = remote.finish().await;
            return Err(err);
        }
    };
    let mut work = Work {
        transferred: upload.is_some(),
        installed: install.is_some(),
        agent: plan.agent.is_some(),
        config_line: plan.agent.as_ref().map(|a| a.config_line.clone()),
        ..Work::default()
    };
    plan.install = install;

    // Only a version this connect installed is rolled back, and only to another one.
    let rollback_to = previous.filter(|p| work.installed && *p != wanted);
    let carried_out = install::carry_out(remote, &plan, upload.as_ref(), reporter).await;
    if work.installed {
        probe.installed = Some(wanted.clone());
        probe.has_installer = true;
    }
    let outcome = match carried_out {
        Ok(outcome) => outcome,
        Err(error) => {
            let failed_start = error.details().is_some_and(|d| d["reason"] == "start");
            return Err(match rollback_to.filter(|_| failed_start) {
                Some(previous) => roll_back(session, &probe, &previous, error).await,
                None => error,
            });
        }
    };
    let state = outcome.state.ok_or_else(|| {
        stage_failed(Stage::Start, "install.sh start printed no state", json!({}))
    })?;
    let (remote_port, cert_sha256) = parse_state(&state)?;
    work.started = true;
    work.minted = outcome.minted;
    probe.cli = outcome.cli.or(probe.cli);
    let link = Link {
        session: session.clone(),
        remote_port,
        probe,
        cert_sha256,
    };
    Ok((link, work))
}

/// What is sent after the plan line: the build (unless the wanted version is installed) and
/// the agent bundle, if any. Checked before anything is uploaded: a platform the release cannot
/// run on, no release, no SHA-256 tool.
fn plan_upload(
    probe: &Probe,
    release: Option<&Release>,
    wanted: &str,
    bundle: Option<&bundle::Bundle>,
    reporter: &dyn Reporter,
) -> Result<(Option<remote_shell::Install>, Option<install::Upload>), AppError> {
    let (install, mut upload) = if probe.installed.as_deref() == Some(wanted) && probe.has_installer
    {
        for stage in [Stage::Transfer, Stage::Verify, Stage::Install] {
            skipped(reporter, stage, &format!("pi-host {wanted} is installed"));
        }
        (None, None)
    } else {
        let (release, chosen) = install::installable(probe, release, wanted)?;
        let (upload, install) = install::Upload::prepare(release, chosen)?;
        (Some(install), Some(upload))
    };
    if let Some(bundle) = bundle {
        upload
            .get_or_insert_with(install::Upload::default)
            .add_bundle(bundle);
    }
    Ok((install, upload))
}

/// What the plan does about the agent: nothing (the stage is skipped), or pi installed from the
/// source the probe calls for, with the bundle to send when that source is one.
async fn plan_agent(
    probe: &Probe,
    running: Option<&Running>,
    options: &BootstrapOptions,
    npm_failed: bool,
    reporter: &dyn Reporter,
) -> Result<(Option<remote_shell::AgentInstall>, Option<bundle::Bundle>), AppError> {
    let mut install = match agent::decide(probe, running, &options.agent_version) {
        agent::AgentWork::Keep(why) => {
            skipped(reporter, Stage::Agent, &why);
            return Ok((None, None));
        }
        agent::AgentWork::Install(install) => install,
    };
    let bundle = match agent::source(probe, &install.version, npm_failed, bundle::is_cached)? {
        agent::Source::Npm => {
            reporter.report(Progress::Note {
                stage: Stage::Agent,
                text: format!(
                    "the remote's npm installs pi {} with {} (from its cache, else the registry)",
                    install.version,
                    agent::found_node(probe)
                ),
            });
            None
        }
        agent::Source::Bundle(spec) => {
            Some(bundle::ensure(&install.version, spec, reporter).await?)
        }
    };
    if let Some(made) = &bundle {
        install.source = remote_shell::AgentSource::Bundle {
            len: made.len,
            sha256: made.sha256.clone(),
        };
    }
    Ok((Some(install), bundle))
}

/// The resolve stage: the SSH destination from the ssh config, the release (the directory
/// given, else one of this version found beside pi-remote, [`release::search_path`]) and the
/// version wanted: the release's, else this build's.
fn resolve_stage(
    options: &BootstrapOptions,
    reporter: &dyn Reporter,
) -> Result<(Destination, Option<Release>, String), AppError> {
    let clock = StageClock::start(reporter, Stage::Resolve);
    let destination = crate::ssh::config::resolve(&options.target, &options.resolve)
        .map_err(|e| stage_failed(Stage::Resolve, e, json!({})))?;
    let release = match &options.release_dir {
        Some(dir) => {
            Some(Release::load(dir).map_err(|e| stage_failed(Stage::Resolve, e, json!({})))?)
        }
        None => release::discover(env!("CARGO_PKG_VERSION")),
    };
    let wanted = release.as_ref().map_or_else(
        || env!("CARGO_PKG_VERSION").to_string(),
        |r| r.manifest.version.clone(),
    );
    let from = match &release {
        Some(release) => format!("; release {} in {}", wanted, release.dir.display()),
        None => String::new(),
    };
    clock.done(Some(format!("{}{from}", destination.display())));
    Ok((destination, release, wanted))
}

/// The probe stage: the session command starts and prints what it found (the platform, the
/// installed version and the running host, if any), then waits for the plan.
async fn probe_stage(
    session: &SshSession,
    script: &str,
    reporter: &dyn Reporter,
) -> Result<(ssh::RemoteCommand, Probe, Option<Running>), AppError> {
    let clock = StageClock::start(reporter, Stage::Probe);
    let mut remote = session
        .start(script)
        .await
        .map_err(|e| ssh_failed(Stage::Probe, e))?;
    let mut text = String::new();
    loop {
        match remote.next_line().await {
            Some(line) if line == remote_shell::PROBE_END => break,
            Some(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            None => {
                // It ended before the probe was through: its exit status and stderr say why,
                // or its refusal of an install root others could write.
                let output = remote
                    .finish()
                    .await
                    .map_err(|e| ssh_failed(Stage::Probe, e))?;
                if let Some(found) = remote_shell::Unsafe::find(&text) {
                    return Err(unsafe_root(&found));
                }
                return Err(remote_failed(Stage::Probe, "the probe", &output));
            }
        }
    }
    let probe = match Probe::parse(&text) {
        Ok(probe) => probe,
        Err(e) => {
            let _ = remote.finish().await;
            return Err(stage_failed(Stage::Probe, e, json!({})));
        }
    };
    let running = probe.running();
    // The platform is left out when the wanted version is installed.
    let platform = if probe.os.is_empty() {
        String::new()
    } else {
        format!("{} {} {}, ", probe.os, probe.arch, probe.libc.describe())
    };
    let agent = match probe.agent_note() {
        note if note.is_empty() => note,
        note => format!(", {note}"),
    };
    clock.done(Some(format!(
        "{platform}installed {}, running {}{agent}",
        probe.installed.as_deref().unwrap_or("none"),
        running
            .as_ref()
            .map_or("none".to_string(), |r| r.version.clone())
    )));
    Ok((remote, probe, running))
}

/// HOST_BOOTSTRAP_FAILED `unsafe_remote_dir`: the install root (or what `current` leads to)
/// is another user's or writable by others, so nothing was run from it.
fn unsafe_root(found: &remote_shell::Unsafe) -> AppError {
    stage_failed(
        Stage::Probe,
        found.message(),
        json!({"reason": "unsafe_remote_dir", "path": found.path, "problem": found.problem}),
    )
}

/// The warm path: the wanted version already runs, so transfer to start are skipped.
fn warm_link(
    session: Arc<SshSession>,
    probe: Probe,
    running: &Running,
    wanted: &str,
    reporter: &dyn Reporter,
) -> Result<Link, AppError> {
    for stage in [Stage::Transfer, Stage::Verify, Stage::Install, Stage::Start] {
        skipped(reporter, stage, &format!("pi-host {wanted} is running"));
    }
    let cert_sha256 = running.cert_sha256.ok_or_else(|| {
        stage_failed(
            Stage::Probe,
            "the running pi-host reports no certificate fingerprint (certSha256); it must serve TLS",
            json!({}),
        )
    })?;
    Ok(Link {
        session,
        remote_port: running.port,
        probe,
        cert_sha256,
    })
}

/// The new version installed but does not start: put the old one back, so the remote keeps a
/// working host. The start failure is returned, saying whether the old version runs again.
async fn roll_back(
    session: &SshSession,
    probe: &Probe,
    previous: &str,
    error: AppError,
) -> AppError {
    let rollback = format!(
        "{} --version {}",
        probe.installer("install"),
        sh_quote(previous)
    );
    let restored = match session.exec(&rollback).await {
        Ok(output) if output.success() => start_host(session, probe).await.is_ok(),
        _ => false,
    };
    let mut details = error.details().cloned().unwrap_or_else(|| json!({}));
    details["rolledBackTo"] = previous.into();
    details["rollbackSucceeded"] = restored.into();
    let message = format!(
        "{}; {}",
        error.message(),
        if restored {
            format!("pi-host {previous} was restored and runs")
        } else {
            format!("restoring pi-host {previous} failed too")
        }
    );
    AppError::new(error.code(), message)
        .with_details(details)
        .with_source(ErrorSource::Bootstrap)
}

/// `install.sh start`: the host's port on the remote and its certificate fingerprint, from the
/// state it wrote.
async fn start_host(session: &SshSession, probe: &Probe) -> Result<(u16, CertSha256), AppError> {
    let output = run_remote(
        session,
        Stage::Start,
        "install.sh start",
        &probe.installer("start --reuse"),
    )
    .await?;
    let state: Value = last_line(&output.stdout_text())
        .and_then(|line| serde_json::from_str(line).ok())
        .ok_or_else(|| {
            stage_failed(
                Stage::Start,
                "install.sh start printed no state",
                json!({"stdout": output.stdout_text(), "stderrTail": output.stderr_tail()}),
            )
        })?;
    parse_state(&state)
}

/// The host's port on the remote and its certificate fingerprint, from the state install.sh
/// start printed.
fn parse_state(state: &Value) -> Result<(u16, CertSha256), AppError> {
    let port = state["listen"]
        .as_str()
        .and_then(|l| l.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
        .ok_or_else(|| {
            stage_failed(
                Stage::Start,
                format!("the state has no listen address: {state}"),
                json!({}),
            )
        })?;
    let cert_sha256 = state["certSha256"]
        .as_str()
        .and_then(CertSha256::parse)
        .ok_or_else(|| {
            stage_failed(
                Stage::Start,
                format!("the state has no certificate fingerprint (certSha256): {state}"),
                json!({}),
            )
        })?;
    Ok((port, cert_sha256))
}

async fn ssh_connect(
    destination: &Destination,
    options: &BootstrapOptions,
    reporter: &dyn Reporter,
) -> Result<SshSession, AppError> {
    let mut step = Stage::Connect;
    let mut clock = Some(StageClock::start(reporter, Stage::Connect));
    let result = ssh::connect(destination, &options.ssh, |next| {
        let next = match next {
            ConnectStep::Connect => return,
            ConnectStep::HostKey => Stage::HostKey,
            ConnectStep::Authenticate => Stage::Authenticate,
        };
        if let Some(clock) = clock.take() {
            clock.done(None);
        }
        step = next;
        clock = Some(StageClock::start(reporter, next));
    })
    .await;
    match result {
        Ok(session) => {
            if let Some(clock) = clock.take() {
                clock.done(Some(destination.user.clone()));
            }
            Ok(session)
        }
        Err(err) => Err(ssh_failed(step, err)),
    }
}

fn version_mismatch(
    message: String,
    wanted: &str,
    found: Option<&str>,
    platform: &str,
) -> AppError {
    AppError::new(ErrorCode::HostVersionMismatch, message)
        .with_details(json!({"wanted": wanted, "found": found, "platform": platform}))
        .with_source(ErrorSource::Bootstrap)
}

/// A connected remote host: the forward's local URL and the device paired with it.
pub struct Connection {
    /// `wss://127.0.0.1:PORT/racp`.
    pub url: String,
    pub device: PairedDevice,
    pub host_version: String,
    pub host_id: String,
    /// What this connect did, for reports: `{transferred, installed, started, paired, ...}`.
    pub summary: Value,
    pub forward: supervisor::Forward,
}

/// The whole flow; the forward keeps running (and reconnecting) until the connection is
/// dropped or [`supervisor::Forward::stop`] is called.
pub async fn connect(
    options: BootstrapOptions,
    reporter: Arc<dyn Reporter>,
) -> Result<Connection, AppError> {
    let started = Instant::now();
    // Without a stored credential the token is minted in the connect's one remote command.
    let mint = options.paired_device.is_none();
    let (link, mut work, wanted) = establish(&options, reporter.as_ref(), mint).await?;
    let pin = link.cert_sha256;
    let placed = Placed::of(&link, work.config_line.take());

    let clock = StageClock::start(reporter.as_ref(), Stage::Forward);
    let forward = supervisor::Forward::open(&options, link, reporter.clone()).await?;
    let url = forward.url();
    clock.done(Some(url.clone()));

    let host = ForwardedHost {
        forward: &forward,
        url: &url,
        options: &options,
        reporter: reporter.as_ref(),
    };
    let (device, paired) = host.paired_device(pin, work.minted.take()).await?;
    let (device, paired, info) = host.handshake(device, paired, pin, &wanted).await?;

    let summary = json!({
        "url": url,
        "hostVersion": info.host.version,
        "hostId": info.host.id,
        "agent": info.agent,
        "remotePort": forward.remote_port(),
        "remoteRoot": forward.remote_root(),
        "hostCli": forward.host_cli(),
        "certSha256": device.cert_sha256,
        "transferred": work.transferred,
        "installed": work.installed,
        "started": work.started,
        "agentInstalled": work.agent,
        "paired": paired,
        "where": placed,
        "ms": started.elapsed().as_millis() as u64,
    });
    Ok(Connection {
        url,
        device,
        host_version: info.host.version,
        host_id: info.host.id,
        summary,
        forward,
    })
}

/// Where things are on the remote, for the connect's closing summary.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Placed {
    root: String,
    host_binary: String,
    data_dir: String,
    config: String,
    /// The config's `agent` line: the one this connect wrote, else the one it found.
    config_line: Option<String>,
}

impl Placed {
    fn of(link: &Link, written: Option<String>) -> Placed {
        let root = link.probe.root.clone();
        Placed {
            host_binary: format!("{root}/current/bin/pi-host"),
            data_dir: format!("{root}/data"),
            config: format!("{root}/config.toml"),
            config_line: written.or_else(|| link.probe.agent_config.line().map(str::to_string)),
            root,
        }
    }
}

/// The host through the forward, for the pair and handshake stages.
struct ForwardedHost<'a> {
    forward: &'a supervisor::Forward,
    url: &'a str,
    options: &'a BootstrapOptions,
    reporter: &'a dyn Reporter,
}

impl ForwardedHost<'_> {
    /// The pair stage: the stored device, or one paired now (`true`).
    async fn paired_device(
        &self,
        pin: CertSha256,
        minted: Option<Value>,
    ) -> Result<(PairedDevice, bool), AppError> {
        match self.options.paired_device.clone() {
            // Reused only when paired with the certificate the host shows over SSH now.
            Some(device) if device.cert_sha256 == Some(pin) => {
                skipped(self.reporter, Stage::Pair, "a stored credential is reused");
                Ok((device, false))
            }
            // The host's identity was reset (new data directory) or the profile predates
            // pinning: SSH is the trusted path, so pair again through it; the stored token is
            // never sent to an endpoint with another certificate.
            Some(_) | None => Ok((self.pair(minted).await?, true)),
        }
    }

    /// The handshake stage: hello and `host/info` with the credential, which the host may no
    /// longer know (then it pairs again, once); the host must run the wanted version.
    async fn handshake(
        &self,
        device: PairedDevice,
        mut paired: bool,
        pin: CertSha256,
        wanted: &str,
    ) -> Result<(PairedDevice, bool, HostInfoResult), AppError> {
        let pin = device.cert_sha256.unwrap_or(pin);
        let clock = StageClock::start(self.reporter, Stage::Handshake);
        let (client, device) = match open_client(self.url, &device.device_token, pin).await {
            Ok(client) => (client, device),
            Err(err) if !paired && err.code() == ErrorCode::RemoteAuthFailed => {
                // The host no longer knows this device (reinstalled, revoked): pair again
                // over SSH.
                paired = true;
                let device = self.pair(None).await?;
                let pin = device.cert_sha256.unwrap_or(pin);
                let client = open_client(self.url, &device.device_token, pin).await?;
                (client, device)
            }
            Err(err) => return Err(err),
        };
        let info = client.call::<calls::HostInfo>(Empty {}).await?;
        if info.host.version != wanted {
            return Err(version_mismatch(
                format!(
                    "the remote host answers as pi-host {} but {wanted} was wanted",
                    info.host.version
                ),
                wanted,
                Some(&info.host.version),
                &format!("{}-{}", info.os, info.arch),
            ));
        }
        clock.done(Some(format!("pi-host {}", info.host.version)));
        Ok((device, paired, info))
    }

    /// Mints a pairing token over SSH and trades it for a device credential through the forward.
    /// `minted`: a token the connect's remote command minted already; else one is minted now.
    async fn pair(&self, minted: Option<Value>) -> Result<PairedDevice, AppError> {
        let clock = StageClock::start(self.reporter, Stage::Pair);
        let minted = match minted {
            Some(minted) => minted,
            None => {
                let (session, probe) = self.forward.current_link().await?;
                // The token travels inside the SSH channel only; it never appears in argv or
                // on screen.
                let output = run_remote(
                    &session,
                    Stage::Pair,
                    "pi-host pair",
                    &format!("{} pair --json --roles owner --ttl 2m", probe.pi_host()),
                )
                .await?;
                serde_json::from_str(output.stdout_text().trim()).map_err(|e| {
                    stage_failed(
                        Stage::Pair,
                        format!("pi-host pair printed no JSON: {e}"),
                        json!({}),
                    )
                })?
            }
        };
        let token = minted["token"]
            .as_str()
            .ok_or_else(|| stage_failed(Stage::Pair, "pi-host pair printed no token", json!({})))?;
        // The fingerprint came with the token over SSH: pin it for the trade through the forward.
        let pin = minted["certSha256"]
            .as_str()
            .and_then(CertSha256::parse)
            .ok_or_else(|| {
                stage_failed(
                    Stage::Pair,
                    "pi-host pair printed no certificate fingerprint (certSha256)",
                    json!({}),
                )
            })?;
        let client = open_client(self.url, token, pin).await?;
        let paired = client
            .call::<calls::Pair>(PairParams {
                device_name: self.options.device_name.clone(),
            })
            .await?;
        clock.done(Some(paired.device_id.clone()));
        Ok(PairedDevice {
            device_id: paired.device_id,
            device_token: paired.device_token,
            roles: paired.roles,
            cert_sha256: Some(pin),
        })
    }
}

/// A client through the forward that sends its token only to the host with certificate `pin`.
async fn open_client(url: &str, token: &str, pin: CertSha256) -> Result<RacpClient, AppError> {
    let mut options = ClientOptions::new(url, token);
    options.pinned_sha256 = Some(pin);
    options.client_name = "pi-remote".into();
    options.call_timeout = Duration::from_secs(30);
    RacpClient::connect(options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_stage_names_itself_in_details_reason() {
        for stage in Stage::ALL {
            let error = stage_failed(stage, "boom", json!({"stderrTail": "x"}));
            assert_eq!(error.code(), ErrorCode::HostBootstrapFailed);
            let details = error.details().unwrap();
            assert_eq!(details["reason"], stage.as_str());
            assert_eq!(details["stderrTail"], "x");
        }
    }

    #[test]
    fn local_file_and_key_file_failures_name_the_right_stage() {
        let unreadable = SshError::LocalFile {
            path: "/release/x.tar.gz".into(),
            reason: "permission denied".into(),
        };
        let error = ssh_failed(Stage::Transfer, unreadable);
        assert_eq!(error.details().unwrap()["reason"], "transfer");
        let bad_key = SshError::KeyFile {
            path: "/keys/id".into(),
            reason: "wrong passphrase (three tries)".into(),
        };
        let error = ssh_failed(Stage::Connect, bad_key);
        assert_eq!(error.details().unwrap()["reason"], "authenticate");
        assert!(error.message().contains("/keys/id"));
    }

    #[test]
    fn a_prohibited_channel_is_a_forward_failure_with_a_hint() {
        let error = ssh_failed(
            Stage::Forward,
            SshError::ChannelOpen {
                target: "127.0.0.1:1".into(),
                reason: "administratively prohibited".into(),
                prohibited: true,
            },
        );
        assert_eq!(error.code(), ErrorCode::RemoteForwardFailed);
        assert_eq!(
            error.details().unwrap()["reason"],
            "administratively_prohibited"
        );
        assert!(
            error.details().unwrap()["hint"]
                .as_str()
                .unwrap()
                .contains("AllowTcpForwarding")
        );
    }
}
