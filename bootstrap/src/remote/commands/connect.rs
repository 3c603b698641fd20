//! `pi-remote connect`: provision a host over SSH, forward a local port to it, pair, store the
//! credential in a profile, then keep the forward up (reconnecting) until Ctrl-C.
//!
//! Progress goes to stderr as a progress display, or with `--json` to stdout as one JSON line
//! per event: `{"type":"stage","stage","status":"started"|"done"|"skipped",...}`,
//! `{"type":"progress","stage":"bundle"|"transfer","bytes","total"}`,
//! `{"type":"note","stage","text"}`, `{"type":"ready","url",...}`,
//! `{"type":"reconnecting",...}`, `{"type":"reconnected",...}`, `{"type":"error","error"}`.

use crate::provision::stage::{Progress, Reporter, Stage};
use crate::provision::{self, BootstrapOptions, PairedDevice};
use crate::remote::Failure;
use crate::remote::profile::{self, Profile, SshOrigin};
use crate::remote::remotes;
use crate::ssh::PassphrasePrompt;
use crate::ssh::host_key::{HostKeyPolicy, UnknownHost};
use crate::ssh::prompt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use racp_proto::validate::printable;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to do with a host seen for the first time: trust it with `--accept-new`; ask when a
/// person can answer (a terminal without `--json`, or `SSH_ASKPASS`); else refuse. The progress
/// display is suspended while the question is on the terminal, so nothing draws over it.
pub fn host_key_policy(accept_new: bool, json: bool, display: Arc<Display>) -> HostKeyPolicy {
    let interactive = !json && std::io::stdin().is_terminal();
    if accept_new {
        HostKeyPolicy::AcceptNew
    } else if interactive || std::env::var_os("SSH_ASKPASS").is_some() {
        HostKeyPolicy::Ask(Arc::new(move |unknown: &UnknownHost| {
            display.suspend(|| prompt::ask_yes_no(&format!(
                "The authenticity of host '{}' can't be established.\n{} key fingerprint is {}.\nTrust it and record it in {}? (yes/no) ",
                unknown.host,
                unknown.algorithm,
                unknown.fingerprint,
                unknown.known_hosts.display()
            )))
        }))
    } else {
        HostKeyPolicy::Strict
    }
}

/// Asks for an encrypted key's passphrase (`SSH_ASKPASS` or the terminal), with the progress
/// display suspended.
pub fn passphrase_prompt(display: Arc<Display>) -> PassphrasePrompt {
    Arc::new(move |path: &std::path::Path| display.suspend(|| prompt::ask_key_passphrase(path)))
}

/// `--json`: one line per event on stdout.
pub struct JsonLines;

impl Reporter for JsonLines {
    fn report(&self, progress: Progress) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", progress.to_json());
        let _ = out.flush();
    }
}

/// A spinner per stage and a byte bar for the upload (stderr; hidden when not a terminal).
pub struct Display {
    bar: Mutex<Option<(Stage, ProgressBar)>>,
    /// Where bars draw: stderr, or a test's recorder.
    target: fn() -> ProgressDrawTarget,
}

impl Display {
    pub fn new() -> Self {
        Display::drawing_to(ProgressDrawTarget::stderr)
    }

    fn drawing_to(target: fn() -> ProgressDrawTarget) -> Self {
        Display {
            bar: Mutex::new(None),
            target,
        }
    }

    /// Runs `ask` (a question on the terminal) with the spinner cleared and stopped, and
    /// draws it again afterwards.
    pub fn suspend<R>(&self, ask: impl FnOnce() -> R) -> R {
        let bar = self
            .bar
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().map(|(_, bar)| bar.clone()));
        match bar {
            // The bar's state stays locked while `ask` runs, so its ticker cannot draw.
            Some(bar) => bar.suspend(ask),
            None => ask(),
        }
    }

    fn finish(&self) {
        if let Ok(mut bar) = self.bar.lock()
            && let Some((_, bar)) = bar.take()
        {
            bar.finish_and_clear();
        }
    }

    /// A spinner for `stage`, in place of the last stage's.
    fn spin(&self, stage: Stage) {
        self.finish();
        let bar = ProgressBar::with_draw_target(None, (self.target)());
        bar.set_style(ProgressStyle::default_spinner());
        bar.set_message(stage.label());
        bar.enable_steady_tick(Duration::from_millis(100));
        if let Ok(mut slot) = self.bar.lock() {
            *slot = Some((stage, bar));
        }
    }

    /// A line above the spinner, which keeps spinning below it.
    fn note(&self, text: &str) {
        let line = format!("    {}", printable(text, false));
        match self
            .bar
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().map(|(_, bar)| bar.clone()))
        {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => eprintln!("{line}"),
        }
    }

    /// The spinner becomes a byte bar: `sent` of `total`.
    fn transferred(&self, sent: u64, total: u64) {
        if let Ok(slot) = self.bar.lock()
            && let Some((_, bar)) = slot.as_ref()
        {
            if bar.length() != Some(total) {
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_length(total);
            }
            bar.set_position(sent);
        }
    }
}

impl Default for Display {
    fn default() -> Self {
        Display::new()
    }
}

impl Reporter for Display {
    fn report(&self, progress: Progress) {
        match progress {
            Progress::Started(stage) => self.spin(stage),
            Progress::Bytes { done, total, .. } => self.transferred(done, total),
            Progress::Note { text, .. } => self.note(&text),
            Progress::Done { stage, ms, note } => {
                self.finish();
                let note = note
                    .map(|n| format!(": {}", printable(&n, false)))
                    .unwrap_or_default();
                eprintln!("  ✓ {} ({ms} ms){note}", stage.label());
            }
            Progress::Skipped { stage, why } => {
                eprintln!("  - {}: skipped, {}", stage.label(), printable(&why, false));
            }
            Progress::Ready(summary) => {
                self.finish();
                print_ready(&summary);
                print_placed(&summary);
            }
            Progress::Reconnecting {
                attempt,
                delay_ms,
                error,
            } => {
                self.finish();
                eprintln!(
                    "  ! the SSH link is down ({}); reconnecting in {delay_ms} ms (attempt {attempt})",
                    printable(error.message(), false)
                );
            }
            Progress::Reconnected { remote_port, ms } => {
                eprintln!("  ✓ reconnected after {ms} ms (remote port {remote_port})");
            }
            Progress::Failed(_) => self.finish(),
        }
    }
}

/// The connected line, from the connect's summary, and what is wrong with the host's agent.
fn print_ready(summary: &serde_json::Value) {
    let agent = &summary["agent"];
    let with_agent = match (agent["state"].as_str(), agent["version"].as_str()) {
        (Some("ready"), Some(version)) => {
            format!(" with agent {}", printable(version, false))
        }
        _ => String::new(),
    };
    // Only a connect that keeps the forward has one for Ctrl-C to stop.
    let held = if summary["once"] == true {
        "checked; --once keeps no forward"
    } else {
        "Ctrl-C stops the forward"
    };
    eprintln!(
        "Connected to pi-host {}{with_agent} at {} ({held})",
        printable(summary["hostVersion"].as_str().unwrap_or("?"), false),
        printable(summary["url"].as_str().unwrap_or("?"), false),
    );
    // The host runs, but turns would fail: say so now, with the host's fix.
    if let Some(state) = agent["state"].as_str().filter(|s| *s != "ready") {
        eprintln!(
            "  ! the host's agent is {state}: {}",
            printable(agent["problem"].as_str().unwrap_or("?"), false)
        );
    }
}

/// What is where on the remote: pi-host, its data and config, the agent and its Node.
fn print_placed(summary: &serde_json::Value) {
    let placed = &summary["where"];
    let text =
        |value: &serde_json::Value| printable(value.as_str().unwrap_or("?"), false).into_owned();
    eprintln!(
        "  pi-host {}: {} (data {}, config {})",
        text(&summary["hostVersion"]),
        text(&placed["hostBinary"]),
        text(&placed["dataDir"]),
        text(&placed["config"]),
    );
    let agent = &summary["agent"];
    if let Some(path) = agent["path"].as_str() {
        let node = match (
            agent["runtime"]["version"].as_str(),
            agent["runtime"]["path"].as_str(),
        ) {
            (Some(version), Some(node)) => format!(
                " with Node {} at {}",
                printable(version, false),
                printable(node, false)
            ),
            _ => String::new(),
        };
        eprintln!(
            "  agent: pi {} at {}{node}",
            text(&agent["version"]),
            printable(path, false)
        );
    }
    if let Some(line) = placed["configLine"].as_str() {
        eprintln!("  config line: {}", printable(line, false));
    }
    if let Some(cli) = summary["hostCli"].as_str() {
        let cli = printable(cli, false);
        eprintln!("  on the remote, the host's own CLI: {cli} (e.g. `{cli} status`)");
    }
}

/// What the command line gives `connect`.
pub struct ConnectArgs {
    pub options: BootstrapOptions,
    pub profile: String,
    /// Provision, pair and check, then stop (no forward kept).
    pub once: bool,
    pub json: bool,
    /// The progress display without `--json` (the SSH questions suspend it).
    pub display: Arc<Display>,
    /// Where progress goes instead of the display or JSON lines, when set.
    pub reporter: Option<Arc<dyn Reporter>>,
}

pub async fn run(mut args: ConnectArgs) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let target = args.options.target.clone();
    let reused = reuse_credential(&dir, &mut args)?;
    let reporter: Arc<dyn Reporter> = match args.reporter.take() {
        // `--background`'s child (background.rs).
        Some(reporter) => reporter,
        None if args.json => Arc::new(JsonLines),
        None => args.display.clone(),
    };
    let remote_dir = args.options.remote_dir.clone();
    let resolve = args.options.resolve.clone();
    let mut device_name = args.options.device_name.clone();
    let connection = match provision::connect(args.options, reporter.clone()).await {
        Ok(connection) => connection,
        Err(error) => {
            reporter.report(Progress::Failed(error.clone()));
            return Err(Failure::App(error));
        }
    };
    // A reused credential keeps the name it was paired under.
    if let Some((device_id, Some(name))) = reused
        && device_id == connection.device.device_id
    {
        device_name = name;
    }
    let origin = SshOrigin {
        target,
        remote_dir,
        host_id: connection.host_id.clone(),
        ssh_config: resolve.config_file.map(remotes::absolute),
        known_hosts: resolve.known_hosts.map(remotes::absolute),
        identities: resolve
            .identity_files
            .into_iter()
            .map(remotes::absolute)
            .collect(),
    };
    let saved = profile_of(&connection, device_name, origin);
    profile::save(&dir, &args.profile, &saved).map_err(Failure::Local)?;
    crate::remote::remotes::touch_seen(&args.profile);
    let mut summary = connection.summary.clone();
    summary["profile"] = args.profile.clone().into();
    summary["once"] = args.once.into();
    reporter.report(Progress::Ready(summary));
    let mut forward = connection.forward;
    if args.once {
        forward.stop().await;
        return Ok(());
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            forward.stop().await;
            Ok(())
        }
        error = forward.failed() => Err(Failure::App(error)),
    }
}

/// The profile a connect stores: the device's credential for the host, and where it came from.
fn profile_of(
    connection: &provision::Connection,
    device_name: String,
    origin: SshOrigin,
) -> Profile {
    Profile {
        url: connection.url.clone(),
        cert_sha256: connection.device.cert_sha256,
        plain: false,
        device_id: connection.device.device_id.clone(),
        device_name: Some(device_name),
        device_token: connection.device.device_token.clone(),
        roles: connection.device.roles.clone(),
        ssh: Some(origin),
        gateway: false,
        host: None,
    }
}

/// A profile from an earlier `connect` to the same target and install root lends its
/// credential (and its local port); a profile paired with anything else is left alone. Returns
/// the lent credential's device id and name.
fn reuse_credential(
    dir: &Path,
    args: &mut ConnectArgs,
) -> Result<Option<(String, Option<String>)>, Failure> {
    let stored = match profile::load(dir, &args.profile) {
        Ok(stored) => stored,
        Err(_)
            if !profile::path(dir, &args.profile)
                .map_err(Failure::Local)?
                .exists() =>
        {
            return Ok(None);
        }
        Err(message) => return Err(Failure::Local(message)),
    };
    match &stored.ssh {
        Some(origin)
            if origin.target == args.options.target
                && origin.remote_dir == args.options.remote_dir =>
        {
            // A credential without a pin (an older profile) is paired again over SSH.
            args.options.paired_device = Some(PairedDevice {
                device_id: stored.device_id.clone(),
                device_token: stored.device_token.clone(),
                roles: stored.roles.clone(),
                cert_sha256: stored.cert_sha256,
            });
            if args.options.local_port == 0 {
                args.options.preferred_local_port = port_of(&stored.url);
            }
            Ok(Some((stored.device_id.clone(), stored.device_name.clone())))
        }
        _ => Err(Failure::Local(format!(
            "the profile {:?} is already paired with {}; pass --profile NAME to keep a profile per host",
            args.profile,
            stored
                .ssh
                .as_ref()
                .map_or(stored.url.clone(), |o| o.target.clone())
        ))),
    }
}

fn port_of(url: &str) -> Option<u16> {
    let rest = url
        .strip_prefix("wss://127.0.0.1:")
        .or_else(|| url.strip_prefix("ws://127.0.0.1:"))?;
    rest.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::TermLike;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// What the spinner drew: a count of writes.
    static DRAWN: AtomicUsize = AtomicUsize::new(0);

    #[derive(Debug)]
    struct Recorder;

    impl TermLike for Recorder {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, _: &str) -> std::io::Result<()> {
            DRAWN.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn write_str(&self, _: &str) -> std::io::Result<()> {
            DRAWN.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn recorder() -> ProgressDrawTarget {
        ProgressDrawTarget::term_like(Box::new(Recorder))
    }

    /// Waits until the spinner has drawn more than `count` times.
    fn drawn_beyond(count: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if DRAWN.load(Ordering::SeqCst) > count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn the_spinner_does_not_draw_while_a_question_is_asked() {
        let display = Display::drawing_to(recorder);
        display.report(Progress::Started(Stage::HostKey));
        assert!(drawn_beyond(1), "the spinner never ticked");
        let (during, after_question) = display.suspend(|| {
            let at_start = DRAWN.load(Ordering::SeqCst);
            // Several ticks' worth (the spinner ticks every 100 ms) of a person reading.
            std::thread::sleep(Duration::from_millis(500));
            (
                DRAWN.load(Ordering::SeqCst) - at_start,
                DRAWN.load(Ordering::SeqCst),
            )
        });
        assert_eq!(during, 0, "the spinner drew over the question");
        // It comes back afterwards.
        assert!(drawn_beyond(after_question), "the spinner did not resume");
        display.finish();
    }
}
